//! Fuzzes every file reader in process (issue 47): chain, training graph, schedule
//! (formats 1 and 2), pipeline schedule, machine profile and ONNX. Each case takes a
//! valid file (`fuzz/seeds.rs`: most of them written by `pebble` itself), mutates it
//! (bytes flipped, truncated, spliced; JSON numbers set to 0, -1, 1e308, 2^64 or NaN,
//! types changed, fields dropped or added, arrays grown to thousands, values nested
//! thousands deep; protobuf fields changed anywhere in the tree) and reads it as the
//! CLI does, then checks what it read as the CLI would: a schedule simulated on its
//! chain or graph (`pebble simulate`), a chain or graph through store-all, its
//! partition, its pipeline layers and its seed's schedules, a profile's machine
//! costing a small model, an ONNX network built into a model.
//!
//! The property, every case: no panic; an error has a message; and the peak of the heap
//! bytes the case allocates (this thread's, read by the counting allocator below) stays
//! within [`BOUND_FIXED`] + [`BOUND_PER_BYTE`] × the input's length. An allocation that
//! would take the case beyond [`HARD_CAP`] aborts the binary, naming the case.
//!
//! CI runs [`CI_CASES`] cases (6 s in a debug build on a 2-core machine). The long run:
//! `PEBBLE_FUZZ_CASES=1000000 cargo test -p pebble-cli --test fuzz_readers -- --nocapture`
//! (docs/benchmarks.md, "Fuzzing the readers and the command line"); `PEBBLE_FUZZ_SEED=N`
//! with `PEBBLE_FUZZ_CASES=1` replays case `N`, whose input a failure also leaves in the
//! scratch directory it names.

mod fuzz;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fuzz::seeds::{corpus, Corpus, Kind, Seed};
use fuzz::{json_text, mutate_bytes, mutate_json, Rng};
use pebble_graph::{partition, Chain, Layers, TrainingGraph};
use pebble_schedule::{Schedule, View};
use pebble_sim::{PipeConfig, SimConfig};
use pebble_solve::{baseline::store_all::simulate_store_all, Problem};
use serde_json::Value;

/// Cases of the bounded run in CI.
const CI_CASES: usize = 20_000;
/// The heap a case may take whatever its input: the simulator's and the model builder's
/// working space on the seeds' small problems.
const BOUND_FIXED: i64 = 64 << 20;
/// And per byte of input: a JSON value read into `serde_json::Value` and then into the
/// reader's own types takes a few tens of bytes per byte of text.
const BOUND_PER_BYTE: i64 = 256;
/// The longest input: a schedule of 10^4 ops, a chain of 10^4 stages.
const MAX_INPUT: usize = 2 << 20;
/// Beyond this a case aborts the process before the allocation is made.
const HARD_CAP: i64 = 2 << 30;

// ---------------------------------------------------------------------------------------
// The counting allocator: per thread, armed around one case.

struct Counting;

thread_local! {
    // Const-initialized and without destructors: reading them never allocates.
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

/// The seed of the case running, for the abort message.
static CASE: AtomicU64 = AtomicU64::new(0);

/// Writes `text` and `n` to standard error without allocating.
fn say(text: &str, n: u64, then: &str) {
    use std::io::Write;
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut v = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let mut err = std::io::stderr();
    let _ = err.write_all(text.as_bytes());
    let _ = err.write_all(&digits[i..]);
    let _ = err.write_all(then.as_bytes());
}

fn grew(size: usize) -> bool {
    if !ARMED.try_with(Cell::get).unwrap_or(false) {
        return true;
    }
    let now = LIVE.with(|l| {
        l.set(l.get() + size as i64);
        l.get()
    });
    PEAK.with(|p| p.set(p.get().max(now)));
    if now > HARD_CAP {
        ARMED.with(|a| a.set(false));
        say("\nfuzz_readers: case ", CASE.load(Ordering::Relaxed), " allocates beyond the hard cap (replay it with ");
        say("PEBBLE_FUZZ_CASES=1 PEBBLE_FUZZ_SEED=", CASE.load(Ordering::Relaxed), "); one allocation of ");
        say("", size as u64, " bytes\n");
        return false;
    }
    true
}

fn shrank(size: usize) {
    if ARMED.try_with(Cell::get).unwrap_or(false) {
        LIVE.with(|l| l.set(l.get() - size as i64));
    }
}

// SAFETY: every call forwards to `System` with the caller's layout; the counters do not
// touch the memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !grew(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !grew(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded as is.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        shrank(layout.size());
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() && !grew(new_size - layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded as is.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() && new_size > layout.size() {
            shrank(new_size - layout.size());
        } else if !p.is_null() && new_size < layout.size() {
            shrank(layout.size() - new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f` with this thread's allocations counted: its result and the peak of live
/// bytes above where it started.
fn counted<T>(f: impl FnOnce() -> T) -> (T, i64) {
    LIVE.with(|l| l.set(0));
    PEAK.with(|p| p.set(0));
    ARMED.with(|a| a.set(true));
    let out = f();
    ARMED.with(|a| a.set(false));
    (out, PEAK.with(Cell::get))
}

// ---------------------------------------------------------------------------------------
// The readers, as the CLI calls them, and what it does next with what they read.

/// What the cases check a read file against: each family's chain, graph, layers and
/// first schedules, read from the seeds.
struct Checks {
    chains: Vec<Chain>,
    graphs: Vec<Option<TrainingGraph>>,
    chain_schedules: Vec<Option<Schedule>>,
    graph_schedules: Vec<Option<Schedule>>,
    pipelines: Vec<Option<Schedule>>,
}

impl Checks {
    fn new(corpus: &Corpus) -> Checks {
        let read = |p: &std::path::Path| std::fs::read_to_string(p).expect("a seed");
        let first = |f: usize, kind: Kind, view: View| {
            corpus
                .seeds
                .iter()
                .filter(|s| s.kind == kind && s.family == Some(f))
                .map(|s| Schedule::from_json(&String::from_utf8_lossy(&s.bytes)).expect("a seed schedule reads"))
                .find(|s| s.view == view)
        };
        let n = corpus.families.len();
        Checks {
            chains: corpus.families.iter().map(|f| Chain::from_json(&read(&f.chain)).expect("a seed chain")).collect(),
            graphs: corpus
                .families
                .iter()
                .map(|f| f.graph.as_ref().map(|g| TrainingGraph::from_json(&read(g)).expect("a seed graph")))
                .collect(),
            chain_schedules: (0..n).map(|f| first(f, Kind::Schedule, View::Chain)).collect(),
            graph_schedules: (0..n).map(|f| first(f, Kind::Schedule, View::Graph)).collect(),
            pipelines: (0..n).map(|f| first(f, Kind::Pipeline, View::Pipeline)).collect(),
        }
    }
}

/// What a step gave: `Ok(Some)` its value, `Ok(None)` an error with a message, `Err` an
/// error without one.
fn step<T, E: std::fmt::Display>(result: Result<T, E>, what: &str) -> Result<Option<T>, String> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.to_string().trim().is_empty() => Err(format!("{what}: an error without a message")),
        Err(_) => Ok(None),
    }
}

fn pipe_config() -> PipeConfig {
    PipeConfig::new(12e9, None)
}

/// A chain as `--chain` gives it: store-all (every command's reference), its layers,
/// the seed's schedules on it (`simulate --schedule`). Whether all ran without error.
fn check_chain(chain: &Chain, f: usize, checks: &Checks) -> Result<bool, String> {
    let config = SimConfig::default();
    let mut clean = step(simulate_store_all(Problem::Chain(chain), &config), "store-all on the chain")?.is_some();
    let layers = Layers::from_chain(chain);
    if let Some(s) = &checks.chain_schedules[f] {
        clean &= step(pebble_sim::simulate_chain(chain, s, &config), "the seed's schedule on the chain")?.is_some();
    }
    if let Some(s) = &checks.pipelines[f] {
        let r = pebble_sim::simulate_pipeline(&layers, s, &pipe_config());
        clean &= step(r, "the seed's pipeline on the chain")?.is_some();
    }
    Ok(clean)
}

fn read_chain(text: &str, f: usize, checks: &Checks) -> Result<bool, String> {
    match step(Chain::from_json(text), "Chain::from_json")? {
        Some(chain) => check_chain(&chain, f, checks),
        None => Ok(false),
    }
}

fn read_graph(text: &str, f: usize, checks: &Checks) -> Result<bool, String> {
    let Some(graph) = step(TrainingGraph::from_json(text), "TrainingGraph::from_json")? else {
        return Ok(false);
    };
    let config = SimConfig::default();
    let mut clean = step(simulate_store_all(Problem::Graph(&graph), &config), "store-all on the graph")?.is_some();
    if let Some(s) = &checks.graph_schedules[f] {
        clean &= step(pebble_sim::simulate_graph(&graph, s, &config), "the seed's schedule on the graph")?.is_some();
    }
    // `--graph` seen as a chain (chain solvers, `pipeline`).
    match step(partition::to_chain(&graph), "partition::to_chain")? {
        Some(chain) => Ok(check_chain(&chain, f, checks)? && clean),
        None => Ok(false),
    }
}

/// `simulate --schedule F` with the family's chain, graph or layers.
fn read_schedule(text: &str, f: usize, checks: &Checks) -> Result<bool, String> {
    let Some(s) = step(Schedule::from_json(text), "Schedule::from_json")? else {
        return Ok(false);
    };
    let _ = s.moves();
    let config = SimConfig::default();
    let simulated = match s.view {
        View::Chain => step(pebble_sim::simulate_chain(&checks.chains[f], &s, &config), "simulate_chain")?.is_some(),
        View::Graph => match &checks.graphs[f] {
            Some(g) => step(pebble_sim::simulate_graph(g, &s, &config), "simulate_graph")?.is_some(),
            None => false,
        },
        View::Pipeline => {
            let layers = Layers::from_chain(&checks.chains[f]);
            step(pebble_sim::simulate_pipeline(&layers, &s, &pipe_config()), "simulate_pipeline")?.is_some()
        }
    };
    Ok(simulated)
}

/// `--profile FILE`: the profile costs a small model, whose store-all runs on its machine.
fn read_profile(text: &str) -> Result<bool, String> {
    let Some(profile) = step(pebble_machine::Profile::from_json(text), "Profile::from_json")? else {
        return Ok(false);
    };
    let machine = profile.machine;
    let options = pebble_zoo::ModelOptions {
        batch: Some(2),
        layers: Some(2),
        width: Some(8),
        profile,
        ..pebble_zoo::ModelOptions::default()
    };
    let Some(model) = step(pebble_zoo::build("mlp", &options), "an mlp costed on the profile")? else {
        return Ok(false);
    };
    let r = simulate_store_all(Problem::Graph(&model.graph), &SimConfig::on(machine));
    Ok(step(r, "store-all on the profile's machine")?.is_some())
}

/// `--onnx FILE`: imported and built into a model as `source::import_onnx` does.
fn read_onnx(bytes: &[u8], batch: Option<usize>) -> Result<bool, String> {
    let import = pebble_onnx::ImportOptions { batch, dtype: pebble_zoo::DType::F32 };
    let Some(network) = step(pebble_onnx::import_bytes(bytes, "fuzz", &import), "import_bytes")? else {
        return Ok(false);
    };
    let options = pebble_zoo::ModelOptions { batch: import.batch, ..pebble_zoo::ModelOptions::default() };
    let Some(model) = step(pebble_onnx::imported_model(network, "fuzz", &options), "imported_model")? else {
        return Ok(false);
    };
    let r = simulate_store_all(Problem::Chain(&model.chain), &SimConfig::default());
    Ok(step(r, "store-all on the imported chain")?.is_some())
}

// ---------------------------------------------------------------------------------------
// The cases.

/// One mutated input: its kind, its seed's family, its bytes.
struct Case {
    kind: Kind,
    family: usize,
    bytes: Vec<u8>,
}

/// The seeds of one JSON kind, parsed, and the names they hold.
type JsonSeeds<'a> = (Kind, Vec<(&'a Seed, Value)>, Vec<String>);

/// The parsed JSON seeds of each kind and their dictionary of names.
struct Pool<'a> {
    corpus: &'a Corpus,
    json: Vec<JsonSeeds<'a>>,
    onnx_names: Vec<Vec<u8>>,
}

impl<'a> Pool<'a> {
    fn new(corpus: &'a Corpus) -> Pool<'a> {
        let json = fuzz::seeds::KINDS
            .iter()
            .filter(|&&k| k != Kind::Onnx)
            .map(|&k| {
                let seeds: Vec<(&Seed, Value)> = corpus
                    .of(k)
                    .into_iter()
                    .map(|s| (s, serde_json::from_slice(&s.bytes).expect("a seed is JSON")))
                    .collect();
                let dict = fuzz::dictionary(seeds.iter().map(|(_, v)| v));
                (k, seeds, dict)
            })
            .collect();
        let mut onnx_names = Vec::new();
        corpus.of(Kind::Onnx).iter().for_each(|s| fuzz::proto::strings(&s.bytes, &mut onnx_names));
        Pool { corpus, json, onnx_names }
    }

    /// The case of `seed`: a seed file of a kind drawn at random, mutated 1 to 4 times,
    /// at most [`MAX_INPUT`] bytes long (a longer one is drawn again).
    fn case(&self, seed: u64) -> Case {
        let mut rng = Rng::new(seed);
        loop {
            let case = self.draw(&mut rng);
            if case.bytes.len() <= MAX_INPUT {
                return case;
            }
        }
    }

    fn draw(&self, rng: &mut Rng) -> Case {
        let kind = *rng.pick(&fuzz::seeds::KINDS);
        let donor = &rng.pick(&self.corpus.seeds).bytes;
        let rounds = 1 + rng.below(4);
        if kind == Kind::Onnx {
            let seeds = self.corpus.of(Kind::Onnx);
            let mut bytes = rng.pick(&seeds).bytes.clone();
            for _ in 0..rounds {
                if rng.one_in(4) {
                    mutate_bytes(rng, &mut bytes, donor);
                } else {
                    bytes = fuzz::proto::mutate(rng, &bytes, &self.onnx_names);
                }
            }
            return Case { kind, family: 0, bytes };
        }
        let (_, seeds, dict) = self.json.iter().find(|(k, ..)| *k == kind).expect("every JSON kind");
        let (seed_file, value) = rng.pick(seeds);
        let family = seed_file.family.unwrap_or(0);
        let mut bytes = if rng.one_in(4) {
            seed_file.bytes.clone()
        } else {
            let mut v = value.clone();
            let same_kind = &rng.pick(seeds).1;
            // Now and then an array of thousands (10^5 ops, 10^4 stages).
            let grow = if rng.one_in(40) { 20_000 } else { 64 };
            for _ in 0..rounds {
                mutate_json(rng, &mut v, same_kind, dict, grow);
            }
            json_text(rng, &v).into_bytes()
        };
        if rng.one_in(3) {
            for _ in 0..1 + rng.below(3) {
                mutate_bytes(rng, &mut bytes, donor);
            }
        }
        Case { kind, family, bytes }
    }
}

/// Reads one case: whether it read and checked without error; `Err` says what broke.
fn read(case: &Case, checks: &Checks, seed: u64) -> Result<bool, String> {
    let text = String::from_utf8_lossy(&case.bytes);
    match case.kind {
        Kind::Chain => read_chain(&text, case.family, checks),
        Kind::Graph => read_graph(&text, case.family, checks),
        Kind::Schedule | Kind::Pipeline => read_schedule(&text, case.family, checks),
        Kind::Profile => read_profile(&text),
        Kind::Onnx => read_onnx(&case.bytes, [None, Some(2), Some(1 << 20)][seed as usize % 3]),
    }
}

thread_local! {
    static PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Runs `cases` cases from `first`; returns the failures, each written to the scratch
/// directory for a look.
fn run(corpus: &Corpus, first: u64, cases: usize) -> (Vec<String>, Stats) {
    let checks = Checks::new(corpus);
    let pool = Pool::new(corpus);
    let mut failures = Vec::new();
    let mut stats = Stats::default();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        // The workspace's frames of the backtrace: where in pebble it broke.
        let trace = std::backtrace::Backtrace::force_capture().to_string();
        let ours: Vec<&str> =
            trace.lines().map(str::trim).filter(|l| l.starts_with("at ") && l.contains("/crates/")).take(6).collect();
        PANIC.with(|p| *p.borrow_mut() = Some(format!("{info}\n      {}", ours.join("\n      "))));
    }));
    let start = Instant::now();
    for seed in first..first + cases as u64 {
        let t = Instant::now();
        let case = pool.case(seed);
        stats.mutating += t.elapsed();
        CASE.store(seed, Ordering::Relaxed);
        let t = Instant::now();
        let (result, peak) = counted(|| catch_unwind(AssertUnwindSafe(|| read(&case, &checks, seed))));
        let took = t.elapsed();
        let bound = BOUND_FIXED + BOUND_PER_BYTE * case.bytes.len() as i64;
        let read = matches!(result, Ok(Ok(true)));
        let fault = match result.map(|r| r.map(|_| ())) {
            Ok(Ok(())) if peak > bound => Some(format!("allocated {peak} bytes, over the bound {bound}")),
            Ok(Ok(())) => None,
            Ok(Err(why)) => Some(why),
            Err(_) => Some(format!("panicked: {}", PANIC.with(|p| p.borrow_mut().take()).unwrap_or_default())),
        };
        stats.record(case.kind, read, took, peak, case.bytes.len());
        if let Some(why) = fault {
            let path = corpus.dir.join(format!("failure-{seed}.bin"));
            std::fs::write(&path, &case.bytes).expect("scratch space");
            failures.push(format!("case {seed} ({:?}, {}): {why}", case.kind, path.display()));
        }
    }
    stats.wall = start.elapsed();
    std::panic::set_hook(hook);
    (failures, stats)
}

/// What the run did, per kind.
#[derive(Default)]
struct Stats {
    wall: Duration,
    mutating: Duration,
    per_kind: Vec<KindStats>,
}

/// Cases of one kind: how many, how many read without error, the slowest, the largest
/// peak, the longest input.
struct KindStats {
    kind: Kind,
    cases: usize,
    read: usize,
    slowest: Duration,
    peak: i64,
    longest: usize,
}

impl Stats {
    fn record(&mut self, kind: Kind, read: bool, took: Duration, peak: i64, len: usize) {
        let at = match self.per_kind.iter().position(|k| k.kind == kind) {
            Some(at) => at,
            None => {
                self.per_kind.push(KindStats { kind, cases: 0, read: 0, slowest: took, peak, longest: len });
                self.per_kind.len() - 1
            }
        };
        let k = &mut self.per_kind[at];
        k.cases += 1;
        k.read += usize::from(read);
        k.slowest = k.slowest.max(took);
        k.peak = k.peak.max(peak);
        k.longest = k.longest.max(len);
    }
}

#[test]
fn every_reader_survives_mutated_files() {
    let corpus = corpus("readers");
    let cases = fuzz::cases(CI_CASES);
    let first = fuzz::first_seed(0);
    let (failures, stats) = run(&corpus, first, cases);
    eprintln!(
        "fuzz_readers: {cases} cases from seed {first} in {:.1} s ({:.1} s of it mutating)",
        stats.wall.as_secs_f64(),
        stats.mutating.as_secs_f64()
    );
    for k in &stats.per_kind {
        eprintln!(
            "  {:?}: {} cases, {} read and checked without error, slowest {:.1} ms, peak {:.1} MiB, longest input {} bytes",
            k.kind,
            k.cases,
            k.read,
            k.slowest.as_secs_f64() * 1e3,
            k.peak as f64 / (1 << 20) as f64,
            k.longest
        );
    }
    assert!(failures.is_empty(), "{} of {cases} cases failed:\n{}", failures.len(), failures.join("\n"));
    let _ = std::fs::remove_dir_all(&corpus.dir);
}

/// The property can fail: the counting allocator sees a case's allocations, and a panic
/// inside a read is caught.
#[test]
fn the_harness_sees_allocations_and_panics() {
    let (len, peak) = counted(|| vec![1u8; 100 << 20].len());
    assert!(peak >= len as i64 && peak < BOUND_FIXED + (100 << 20), "peak {peak} for {len} bytes");
    let ((), peak) = counted(|| drop(Vec::<u64>::with_capacity(1000)));
    assert_eq!(peak, 8000);
    let caught = catch_unwind(|| Chain::from_json("{}").map(|c| c.len()).unwrap_or_else(|e| panic!("planted: {e}")));
    let payload = caught.expect_err("a panic");
    let message = payload.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.starts_with("planted: ") && message.len() > "planted: ".len(), "{message}");
}
