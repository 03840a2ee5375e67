//! Fuzzes the command line (issue 47): every command, `pipeline --run` and `maxbatch
//! --run` included, spawned with random combinations of its flags and values: sizes of
//! 0, -1, 10^12 and 2^64, unknown names, non-numbers, files of the wrong kind, mutated
//! files (`fuzz/mod.rs`), missing files and directories, outputs that exist.
//!
//! The property, every run: it exits 0, 1 (no schedule fits, or the schedule is invalid:
//! the README's exit codes; any other error with exit 1 is a fault) or 2 (bad input, with
//! a message), never 101 (a panic) nor by a signal (an abort, which an allocation beyond
//! [`MEMORY_KIB`] of address space becomes), within [`TIMEOUT`]. The models are small and
//! the slow solvers (the MILPs) left out, so that a run that takes longer is a runaway.
//! `reproduce` always finds its outputs already in `--out-dir` (and no `--force`): a valid
//! combination is refused there instead of running a whole experiment.
//!
//! CI runs [`CI_CASES`] runs (9 s in a debug build on a 2-core machine);
//! `PEBBLE_FUZZ_CASES=N` runs more, `PEBBLE_FUZZ_SEED=S` starts at case `S`, and
//! `PEBBLE_FUZZ_VERBOSE=1` prints each run with the first line it wrote.

mod fuzz;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fuzz::seeds::{corpus, Corpus, Kind, MODELS};
use fuzz::Rng;

/// Runs in CI.
const CI_CASES: usize = 400;
/// A run that takes longer is a runaway.
const TIMEOUT: Duration = Duration::from_secs(20);
/// Address space of one run (`ulimit -v`): an allocation beyond aborts it.
const MEMORY_KIB: u64 = 4 << 20;

/// Sizes: small ones that keep a run quick, and (after `|`, see [`Gen::pick`]) the absurd.
const SIZES: &[&str] =
    &["1", "2", "3", "4", "8", "|", "0", "-1", "1000000000000", "18446744073709551616", "abc", "", "2.5"];
const BUDGETS: &[&str] = &[
    "50%",
    "100%",
    "80%",
    "20%",
    "4GiB",
    "32",
    "1KB",
    "|",
    "0%",
    "150%",
    "-5%",
    "1e308",
    "1PB",
    "inf",
    "nan",
    "abc",
    "0",
    "1",
    "99999999999999999999",
    "100000%",
];
const FLOATS: &[&str] = &["1e-9", "12e9", "12GB", "1", "0.5", "|", "0", "-1", "1e308", "inf", "nan", "abc", ""];
const SOLVERS: &[&str] = &[
    "rotor",
    "pofo",
    "offload-dp",
    "offload-greedy",
    "opportunist",
    "sequential",
    "chen-sqrt",
    "revolve",
    "revolve-optimal",
    "recompute-all",
    "store-all",
    "weight-offload",
    "weight-offload-noreuse",
    "zero-offload",
    "zero-infinity",
    "paged-adam",
    "l2l",
    "dtr",
    "dtr-eq",
    "delta",
    "lru",
    "largest",
    "knapsack",
    "pytorch-mincut",
    "offload-bound",
    "autocapper",
    "|",
    "rotr",
    "",
    "ROTOR",
    "hiremate-nope",
];
const POLICIES: &[&str] = &["delta", "dtr", "lru", "largest", "|", "rotor", "nope", ""];
const PIPE_SOLVERS: &[&str] =
    &["1f1b", "gpipe", "zb-h1", "zb-v", "interleaved-1f1b", "pipedream", "madpipe", "|", "1f1", "", "rotor"];
const PROFILES: &[&str] = &["v100", "a100", "h100", "rtx3060", "|", "tpu9", ""];
const NAMES: &[&str] = &["mlp", "gpt", "resnet", "|", "nosuch", "", "resnet50x"];

/// One run's arguments, built from a case's RNG.
struct Gen<'a> {
    rng: Rng,
    corpus: &'a Corpus,
    /// Where this case writes its files.
    dir: PathBuf,
    files: usize,
}

impl Gen<'_> {
    /// A value: the ones before `|` (valid) three times in four, else one after it.
    fn pick(&mut self, items: &[&str]) -> String {
        let (good, bad) = match items.iter().position(|&v| v == "|") {
            Some(i) => (&items[..i], &items[i + 1..]),
            None => (items, items),
        };
        let from = if self.rng.one_in(4) { bad } else { good };
        self.rng.pick(from).to_string()
    }

    /// A file for a flag that reads `kind`: a seed, a mutated seed, a file of another
    /// kind, or no file at all.
    fn file(&mut self, kind: Kind, family: Option<usize>) -> String {
        let seeds: Vec<_> =
            self.corpus.seeds.iter().filter(|s| s.kind == kind && (family.is_none() || s.family == family)).collect();
        let seeds = if seeds.is_empty() { self.corpus.of(kind) } else { seeds };
        match self.rng.below(10) {
            0..=3 => self.rng.pick(&seeds).path.to_string_lossy().into_owned(),
            4..=6 => {
                let seed = self.rng.pick(&seeds);
                let bytes = self.mutated(kind, &seed.bytes);
                self.write(&bytes)
            }
            7 => {
                let other = self.rng.pick(&self.corpus.seeds);
                other.path.to_string_lossy().into_owned()
            }
            8 => self.dir.join("missing.json").to_string_lossy().into_owned(),
            _ => self.pick(&[".", "/dev/null", "", "/proc/self/mem"]),
        }
    }

    fn mutated(&mut self, kind: Kind, bytes: &[u8]) -> Vec<u8> {
        let mut out = bytes.to_vec();
        for _ in 0..1 + self.rng.below(3) {
            if kind == Kind::Onnx {
                out = fuzz::proto::mutate(&mut self.rng, &out, &[]);
            } else if let (Ok(mut v), false) = (serde_json::from_slice::<serde_json::Value>(&out), self.rng.one_in(4)) {
                let donor = v.clone();
                fuzz::mutate_json(&mut self.rng, &mut v, &donor, &[], 2000);
                out = fuzz::json_text(&mut self.rng, &v).into_bytes();
            } else {
                fuzz::mutate_bytes(&mut self.rng, &mut out, bytes);
            }
        }
        out
    }

    fn write(&mut self, bytes: &[u8]) -> String {
        self.files += 1;
        let path = self.dir.join(format!("in{}", self.files));
        std::fs::write(&path, bytes).expect("scratch space");
        path.to_string_lossy().into_owned()
    }

    /// An output path: new, existing, or somewhere it cannot be written.
    fn output(&mut self, ext: &str) -> String {
        match self.rng.below(6) {
            0..=2 => self.dir.join(format!("out{}.{ext}", self.rng.below(1000))).to_string_lossy().into_owned(),
            3 => self.write(b"exists"),
            4 => self.dir.to_string_lossy().into_owned(),
            _ => self.pick(&["/proc/nope/out", "", "/dev/null"]),
        }
    }

    /// Adds `flag` (and a value from `values`) with probability `1/n`.
    fn maybe(&mut self, args: &mut Vec<String>, n: usize, flag: &str, values: &[&str]) {
        if self.rng.one_in(n) {
            args.push(flag.to_string());
            if !values.is_empty() {
                args.push(self.pick(values));
            }
        }
    }

    /// A small zoo model's flags, some replaced by other values.
    fn model(&mut self) -> (Vec<String>, usize) {
        let m = self.rng.below(MODELS.len());
        let mut args: Vec<String> = MODELS[m].1.iter().map(|s| s.to_string()).collect();
        for i in (1..args.len()).step_by(2) {
            if self.rng.one_in(6) {
                args[i] = if i == 1 { self.pick(NAMES) } else { self.pick(SIZES) };
            }
        }
        (args, m + 1)
    }

    /// The model options beyond the sizes.
    fn model_opts(&mut self, args: &mut Vec<String>) {
        self.maybe(args, 8, "--dtype", &["f32", "bf16", "|", "fp8"]);
        self.maybe(args, 8, "--optimizer", &["sgd", "momentum", "adam", "adamw", "|", "lion"]);
        self.maybe(args, 10, "--master-weights", &[]);
        self.maybe(args, 10, "--trainable", &["0.5", "1", "1e-300", "|", "0", "-0.5", "2", "nan"]);
        self.maybe(args, 15, "--seq", SIZES);
        self.maybe(args, 15, "--image", SIZES);
        if self.rng.one_in(8) {
            args.push("--profile".into());
            let p = if self.rng.one_in(2) { self.pick(PROFILES) } else { self.file(Kind::Profile, None) };
            args.push(p);
        }
    }

    /// A source: a small model, a chain, graph or ONNX file, none, or two. Its family
    /// (0: the toy chain) says which schedules were planned for it.
    fn source(&mut self, files: bool) -> (Vec<String>, Option<usize>) {
        let (mut args, family) = match self.rng.below(if files { 11 } else { 8 }) {
            // Now and then no source, or two.
            _ if self.rng.one_in(30) => (vec![], None),
            _ if self.rng.one_in(30) => {
                (vec!["--chain".into(), self.file(Kind::Chain, None), "--model".into(), "mlp".into()], None)
            }
            0..=6 => {
                let (a, f) = self.model();
                (a, Some(f))
            }
            7 => (vec!["--onnx".into(), self.file(Kind::Onnx, None)], None),
            8 => (vec!["--chain".into(), self.file(Kind::Chain, Some(0))], Some(0)),
            9 => {
                let f = 1 + self.rng.below(MODELS.len());
                (vec!["--chain".into(), self.file(Kind::Chain, Some(f))], Some(f))
            }
            _ => {
                let f = 1 + self.rng.below(MODELS.len());
                (vec!["--graph".into(), self.file(Kind::Graph, Some(f))], Some(f))
            }
        };
        self.model_opts(&mut args);
        (args, family)
    }

    fn budget(&mut self, args: &mut Vec<String>, required: bool) {
        let n = if required { 1 } else { 3 };
        match self.rng.below(8) {
            0..=3 => self.maybe(args, n, "--activation-budget", BUDGETS),
            4..=6 => self.maybe(args, n, "--budget", BUDGETS),
            _ => {
                self.maybe(args, 2, "--budget", BUDGETS);
                self.maybe(args, 2, "--activation-budget", BUDGETS);
            }
        }
    }

    fn solve_args(&mut self, args: &mut Vec<String>) {
        // Not `exact`, nor a count beyond the budget's bytes (the same): on a model in bytes
        // the DPs then work on millions of slots, for minutes.
        self.maybe(args, 8, "--slots", &["1", "50", "500", "|", "0", "-1", "18446744073709551616", "abc"]);
        self.maybe(args, 8, "--time-limit", &["1", "1e-9", "|", "0", "-1", "inf", "nan", "abc"]);
        self.maybe(args, 8, "--bandwidth", FLOATS);
    }
}

/// The arguments of one run of `command`.
fn arguments(g: &mut Gen, command: &str) -> Vec<String> {
    let mut args = vec![command.to_string()];
    match command {
        "models" => g.maybe(&mut args, 2, "--json", &[]),
        "info" | "graph" => {
            let (source, _) = g.source(false);
            args.extend(source);
            if command == "graph" {
                g.maybe(&mut args, 2, "--view", &["chain", "graph", "pipeline"]);
                if g.rng.one_in(2) {
                    args.extend(["-o".into(), g.output("json")]);
                }
                g.maybe(&mut args, 4, "--force", &[]);
            } else {
                g.maybe(&mut args, 2, "--json", &[]);
            }
        }
        "plan" => {
            args.extend(g.source(true).0);
            g.budget(&mut args, true);
            g.maybe(&mut args, 1, "--solver", SOLVERS);
            g.solve_args(&mut args);
            if g.rng.one_in(3) {
                args.extend(["-o".into(), g.output("json")]);
            }
            if g.rng.one_in(4) {
                args.extend(["--timeline".into(), g.output("svg")]);
            }
            g.maybe(&mut args, 4, "--force", &[]);
            g.maybe(&mut args, 2, "--json", &[]);
        }
        "simulate" => {
            let (source, family) = g.source(true);
            let kind = if g.rng.one_in(3) { Kind::Pipeline } else { Kind::Schedule };
            let schedule = g.file(kind, family);
            args.extend(["--schedule".into(), schedule]);
            args.extend(source);
            g.maybe(&mut args, 5, "--view", &["chain", "graph", "pipeline"]);
            g.budget(&mut args, false);
            g.maybe(&mut args, 5, "--bandwidth", FLOATS);
            if g.rng.one_in(4) {
                args.extend(["--timeline".into(), g.output("svg")]);
            }
            g.maybe(&mut args, 2, "--json", &[]);
        }
        "sweep" => {
            args.extend(g.source(true).0);
            let list: Vec<String> = (0..1 + g.rng.below(3)).map(|_| g.pick(SOLVERS)).collect();
            // Without MadPipe: its ILP takes its minute at each of the ten points.
            let pipes: Vec<String> =
                (0..1 + g.rng.below(3)).map(|_| g.pick(PIPE_SOLVERS)).filter(|s| s != "madpipe").collect();
            let devices = g.rng.one_in(3);
            args.extend(["--solvers".into(), if devices { pipes.join(",") } else { list.join(",") }]);
            if devices {
                args.extend(["--devices".into(), g.pick(SIZES)]);
            }
            g.maybe(&mut args, 3, "--points", &["1", "2", "3", "|", "0", "1001", "-1", "abc"]);
            if g.rng.one_in(4) {
                args.extend(["--svg".into(), g.output("svg")]);
            }
            g.solve_args(&mut args);
            g.maybe(&mut args, 2, "--json", &[]);
        }
        "maxbatch" => {
            // The batch is what it searches: `--batch` only now and then.
            let (model, _) = g.model();
            let keep_batch = g.rng.one_in(6);
            args.extend(model.chunks(2).filter(|p| keep_batch || p[0] != "--batch").flatten().cloned());
            g.model_opts(&mut args);
            g.maybe(&mut args, 1, "--memory", &["1MB", "64MB", "1GB", "80GB", "|", "0", "-1", "50%", "1PB", "abc"]);
            match g.rng.below(5) {
                0 => {}
                1 => args.extend(["--policy".into(), g.pick(POLICIES)]),
                2 => args.extend(["--solver".into(), g.pick(SOLVERS), "--policy".into(), g.pick(POLICIES)]),
                _ => args.extend(["--solver".into(), g.pick(SOLVERS)]),
            }
            // `--run` trains for real at each batch it tries: a few small ones.
            if g.rng.one_in(4) {
                args.extend(["--run".into(), "--max".into(), g.pick(&["1", "4", "8", "|", "0", "-1", "abc"])]);
            } else {
                g.maybe(&mut args, 3, "--max", &["1", "4", "64", "|", "0", "-1", "1000000000000", "abc"]);
            }
            g.solve_args(&mut args);
            g.maybe(&mut args, 2, "--json", &[]);
        }
        "train" | "profile" | "bench" => run_args(g, command, &mut args),
        "reproduce" => {
            args.push(g.pick(&["ch4", "weights", "offmate", "ch7", "hiremate", "delta", "|", "ch5", ""]));
            g.maybe(&mut args, 3, "--models", &["resnet50", "mlp,gpt", "|", "nosuch", "", ",,"]);
            g.maybe(&mut args, 3, "--batch", SIZES);
            g.maybe(&mut args, 3, "--image", SIZES);
            g.maybe(&mut args, 3, "--profile", PROFILES);
            g.maybe(&mut args, 3, "--quick", &[]);
            g.maybe(&mut args, 4, "--ilp", &[]);
            // Every experiment's report exists here: a valid run stops before any work.
            args.extend(["--out-dir".into(), g.corpus.dir.join("reproduce").to_string_lossy().into_owned()]);
        }
        _ => pipeline_args(g, &mut args),
    }
    args
}

/// `train`, `profile` and `bench`: a small zoo model run on the CPU.
fn run_args(g: &mut Gen, command: &str, args: &mut Vec<String>) {
    let (model, _) = g.model();
    args.extend(model);
    g.maybe(args, 6, "--device", &["cpu", "v100", "|", "cuda", "tpu", ""]);
    g.maybe(args, 6, "--profile", PROFILES);
    g.maybe(args, 6, "--seed", &["0", "1", "|", "-1", "18446744073709551616"]);
    match command {
        "train" => {
            g.budget(args, true);
            match g.rng.below(4) {
                0 => args.extend(["--policy".into(), g.pick(POLICIES)]),
                1 => {}
                _ => args.extend(["--solver".into(), g.pick(SOLVERS)]),
            }
            g.maybe(args, 2, "--steps", &["1", "2", "|", "0", "-1", "10000000", "abc"]);
            g.maybe(args, 4, "--optimizer", &["sgd", "adam", "adamw", "momentum"]);
            g.maybe(args, 4, "--lr", FLOATS);
            g.maybe(args, 4, "--costs", &["analytic", "profiled", "steps", "|", "measured"]);
            g.solve_args(args);
            g.maybe(args, 2, "--json", &[]);
        }
        "profile" => {
            g.maybe(args, 3, "--view", &["chain", "graph", "pipeline"]);
            g.maybe(args, 4, "--optimizer", &["sgd", "adam", "momentum", "|", "lion"]);
            if g.rng.one_in(2) {
                args.extend(["-o".into(), g.output("json")]);
            }
            g.maybe(args, 4, "--force", &[]);
        }
        _ => {
            g.maybe(args, 2, "--steps", &["1", "2", "|", "0", "-1", "100000", "abc"]);
            g.maybe(args, 2, "--json", &[]);
        }
    }
}

/// `pipeline`, with `--run` half the time.
fn pipeline_args(g: &mut Gen, args: &mut Vec<String>) {
    args.extend(g.source(true).0);
    g.maybe(args, 1, "--solver", PIPE_SOLVERS);
    g.maybe(args, 2, "--devices", SIZES);
    g.maybe(args, 3, "--memory", &["inf", "1GB", "1MB", "unlimited", "|", "0", "-1", "1PB", "abc"]);
    g.maybe(args, 4, "--bandwidth", FLOATS);
    g.maybe(args, 3, "--microbatches", &["1", "2", "3", "4", "4096", "|", "0", "-1", "4097", "5000", "1000000000000"]);
    g.maybe(args, 5, "--virtual-stages", &["1", "2", "3", "64", "|", "0", "65", "-1"]);
    g.maybe(args, 5, "--weight-versions", &["1", "2", "|", "0", "4097", "-1"]);
    g.maybe(args, 5, "--time-limit", &["1", "60", "|", "0", "-1", "nan", "inf"]);
    if g.rng.one_in(5) {
        args.extend(["--gantt".into(), g.output("svg")]);
    }
    if g.rng.one_in(4) {
        args.extend(["--export".into(), g.pick(&["pebble", "torch", "|", "csv"])]);
        if g.rng.one_in(2) {
            args.extend(["-o".into(), g.output("json")]);
        }
    }
    g.maybe(args, 5, "--force", &[]);
    g.maybe(args, 2, "--run", &[]);
    g.maybe(args, 2, "--json", &[]);
}

const COMMANDS: &[&str] = &[
    "models",
    "info",
    "graph",
    "plan",
    "plan",
    "simulate",
    "simulate",
    "sweep",
    "maxbatch",
    "train",
    "profile",
    "bench",
    "reproduce",
    "pipeline",
    "pipeline",
];

/// What one run did.
struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
    timed_out: bool,
}

/// Runs `pebble args` within the address-space limit and the timeout.
fn spawn(args: &[String], dir: &Path) -> Outcome {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {MEMORY_KIB}; exec \"$0\" \"$@\""))
        .arg(fuzz::seeds::pebble_bin())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sh runs");
    let start = Instant::now();
    let read = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("piped")));
    let stderr = read(Box::new(child.stderr.take().expect("piped")));
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().expect("the child can be waited for") {
            break status;
        }
        if start.elapsed() > TIMEOUT {
            let _ = child.kill();
            timed_out = true;
            break child.wait().expect("the child can be waited for");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let took = start.elapsed();
    let (stdout, stderr) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
    Outcome { code: status.code(), stdout, stderr, took, timed_out }
}

/// Why the outcome breaks the property, if it does.
fn fault(o: &Outcome) -> Option<String> {
    let last = |s: &str| s.lines().rev().take(12).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    if o.timed_out {
        return Some(format!("still running after {} s: a runaway", TIMEOUT.as_secs()));
    }
    if o.stderr.contains("panicked") {
        return Some(format!("panicked:\n{}", last(&o.stderr)));
    }
    match o.code {
        None => Some(format!("killed by a signal (an abort, or beyond {MEMORY_KIB} KiB):\n{}", last(&o.stderr))),
        Some(0) => None,
        // `--json` says why on standard output (`"feasible": false`, `"valid": false`).
        Some(1) if o.stderr.trim().is_empty() && !o.stdout.contains("false") => Some("failed without a message".into()),
        Some(2) if o.stderr.trim().is_empty() => Some("bad input without a message".into()),
        // Exit 1 is a verdict (no schedule fits, printed without `error:`; the schedule is
        // invalid); any other error there is bad input that should exit 2, or a failure
        // of pebble's own.
        Some(1) if o.stderr.contains("error:") && !o.stderr.contains("error: invalid schedule") => {
            Some(format!("exit 1 with an error that is no verdict:\n{}", last(&o.stderr)))
        }
        Some(1 | 2) => None,
        Some(c) => Some(format!("exit code {c}:\n{}", last(&o.stderr))),
    }
}

#[test]
fn every_command_survives_random_flags() {
    let corpus = corpus("flags");
    let out = corpus.dir.join("reproduce");
    std::fs::create_dir_all(&out).expect("scratch space");
    for report in ["ch4.json", "weights-table1.json", "offmate.json", "ch7.json", "hiremate.json", "delta.json"] {
        std::fs::write(out.join(report), "{}").expect("scratch space");
    }
    let cases = fuzz::cases(CI_CASES);
    let first = fuzz::first_seed(0);
    // Each run and the first line it wrote to standard error.
    let verbose = std::env::var_os("PEBBLE_FUZZ_VERBOSE").is_some();
    let start = Instant::now();
    let mut failures = Vec::new();
    let (mut codes, mut slowest) = ([0usize; 3], (Duration::ZERO, String::new()));
    for seed in first..first + cases as u64 {
        let dir = corpus.dir.join(format!("case{seed}"));
        std::fs::create_dir_all(&dir).expect("scratch space");
        let mut g = Gen { rng: Rng::new(seed), corpus: &corpus, dir: dir.clone(), files: 0 };
        let command = *g.rng.pick(COMMANDS);
        let args = arguments(&mut g, command);
        let o = spawn(&args, &dir);
        if verbose {
            let first = o.stderr.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            eprintln!("{seed}: {:?} {:.2} s: pebble {}\n    {first}", o.code, o.took.as_secs_f64(), args.join(" "));
        }
        if let Some(c @ 0..=2) = o.code {
            codes[c as usize] += 1;
        }
        if o.took > slowest.0 {
            slowest = (o.took, args.join(" "));
        }
        match fault(&o) {
            Some(why) => failures.push(format!("case {seed}: pebble {}\n  {why}", args.join(" "))),
            None => {
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
    eprintln!(
        "fuzz_flags: {cases} runs from seed {first} in {:.1} s: {} exited 0, {} exited 1, {} exited 2; slowest {:.2} s: pebble {}",
        start.elapsed().as_secs_f64(),
        codes[0],
        codes[1],
        codes[2],
        slowest.0.as_secs_f64(),
        slowest.1
    );
    assert!(failures.is_empty(), "{} of {cases} runs failed:\n{}", failures.len(), failures.join("\n"));
    let _ = std::fs::remove_dir_all(&corpus.dir);
}

/// Writes a file of the case directory.
fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("scratch space");
    path.to_string_lossy().into_owned()
}

/// A periodic pipeline schedule of one stage on the toy chain's four layers, 4096
/// micro-batches a period, two ops shifted ±4096 periods: every shift in range, 2.7·10^8
/// instances to unroll.
fn far_shifts() -> String {
    let k = 4096i64;
    let mut ops: Vec<serde_json::Value> = (0..k)
        .flat_map(|r| {
            ["F", "B"].map(|p| serde_json::json!({"op": "run", "device": 0, "stage": 0, "micro": r, "pass": p}))
        })
        .collect();
    ops[0]["micro"] = (k * 4096).into();
    ops[3]["micro"] = (1 - k * 4096).into();
    serde_json::json!({
        "version": 2, "view": "pipeline", "ops": ops, "periodic": true, "devices": 1, "microbatches": k,
        "stages": [{"first": 0, "last": 3, "device": 0}]
    })
    .to_string()
}

/// Each run the fuzzing found crashing, running on or exiting with the wrong code, now
/// refused with a message naming the flag or field.
#[test]
fn what_the_fuzzing_found_fails_cleanly() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fuzz-found-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch space");
    let toy = fuzz::seeds::root().join("crates/cli/tests/fixtures/chain.json").to_string_lossy().into_owned();
    let far = write(&dir, "far.json", &far_shifts());
    let devices = write(
        &dir,
        "devices.json",
        r#"{"version": 2, "view": "pipeline", "devices": 2000006, "microbatches": 1, "periodic": false,
            "stages": [{"first": 0, "last": 3, "device": 0}],
            "ops": [{"op": "run", "device": 0, "stage": 0, "micro": 0, "pass": "F"},
                    {"op": "run", "device": 0, "stage": 0, "micro": 0, "pass": "B"}]}"#,
    );
    let graph = write(
        &dir,
        "stage.json",
        r#"{"name":"mlp","compute":[
            {"name":"fc0","kind":"forward","time":5e-06,"tmp":0,"inputs":[0,4,7],"outputs":[2],"op":"linear","stage":18446744073709551615},
            {"name":"loss","kind":"loss","time":1e-05,"tmp":40,"inputs":[2,1],"outputs":[3],"op":"cross_entropy"},
            {"name":"fc0.bwd","kind":"backward","time":5e-06,"tmp":0,"inputs":[3,0,4,7],"outputs":[5,8],"op":"linear","forward":0,"stage":0}],
            "data":[{"name":"x","kind":"input","size":3136},{"name":"labels","kind":"input","size":4},
            {"name":"fc0","kind":"activation","size":40},{"name":"fc0.grad","kind":"gradient","size":40},
            {"name":"fc0.weight","kind":"parameter","size":31360},{"name":"fc0.weight.grad","kind":"param_grad","size":31360},
            {"name":"fc0.weight.adam","kind":"optimizer_state","size":62720},{"name":"fc0.bias","kind":"parameter","size":40},
            {"name":"fc0.bias.grad","kind":"param_grad","size":40},{"name":"fc0.bias.adam","kind":"optimizer_state","size":80}]}"#,
    );
    let out = dir.join("out").to_string_lossy().into_owned();
    let mlp = "--model mlp --layers 3 --width 16 --batch 2";
    // (arguments, exit code, in the message; what it did before)
    let cases: Vec<(String, i32, &str)> = vec![
        // A panic (101): MadPipe's activation count times a layer's bytes overflowed.
        (
            format!("pipeline {mlp} --solver madpipe --memory 1MB --bandwidth 1e-9 --microbatches 4096"),
            2,
            "--bandwidth",
        ),
        // An abort allocating 10^12 devices' problem.
        (format!("sweep {mlp} --solvers 1f1b --devices 1000000000000"), 2, "--devices"),
        // Exit 1, as if pebble failed.
        (format!("sweep {mlp} --solvers 1f1b,zb-v --devices 8 --points 3"), 2, "3 layers cannot make 16 stages"),
        (format!("pipeline {mlp} --solver zb-h1 --run"), 2, "--solver zb-h1: --run cannot run its schedules"),
        (format!("pipeline {mlp} --image 2 --solver 1f1b --run"), 2, "--model: model `mlp`: option `--image`"),
        ("pipeline --model nosuch --solver 1f1b --run".into(), 2, "--model: unknown model `nosuch`"),
        // Ignored.
        (format!("sweep {mlp} --solvers 1f1b --devices 2 --slots 5"), 2, "--slots"),
        (format!("reproduce weights --batch 0 --out-dir {out}"), 2, "--batch: `reproduce weights` runs a fixed grid"),
        (format!("reproduce hiremate --ilp --out-dir {out}"), 2, "--ilp"),
        // Ran on for good, the host link throttled to 1 byte per second.
        (format!("maxbatch {mlp} --memory 1MB --solver rotor --max 4 --run --bandwidth 1"), 2, "--bandwidth"),
        (format!("train {mlp} --budget 100% --solver rotor --bandwidth 1e5 --steps 1"), 2, "--bandwidth"),
        // An abort out of memory unrolling 2.7·10^8 instances; the simulator's verdict now.
        (format!("simulate --schedule {far} --chain {toy}"), 1, "the schedule unrolls to 32776 periods"),
        // 80 MB for 2·10^6 devices.
        (format!("simulate --schedule {devices} --chain {toy}"), 2, "field `devices`: 2000006 devices: at most 1024"),
        // An abort sizing a chain of 2^64 stages.
        (format!("plan --graph {graph} --solver rotor --budget 100%"), 2, "field `compute[0].stage`"),
    ];
    let mut failures = Vec::new();
    for (args, code, part) in &cases {
        let args: Vec<String> = args.split_whitespace().map(String::from).collect();
        let o = spawn(&args, &dir);
        if o.code != Some(*code) || !o.stderr.contains(part) {
            failures.push(format!(
                "pebble {}: expected exit {code} saying `{part}`, got {:?}:\n{}",
                args.join(" "),
                o.code,
                o.stderr
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
}
