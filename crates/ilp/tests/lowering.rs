//! The one lowering of schedules ([`pebble_schedule::lower`]) against the simulator: every
//! registered solver's plans, chain and graph, on shared fixtures at several budgets, lower
//! with no refused op and no missing read; and on a machine whose links and CPU take no
//! time (so that nothing waits), the simulator's peak equals the memory the program itself
//! accounts, step by step in program order: what each step creates, frees and moves, at
//! the sizes [`lower::tensor_bytes`] (a data node's `size`) gives. The accounting here
//! shares no code with the simulator's event engine, which times the same program: it
//! checks the engine's memory against the program, and the program's steps against what a
//! valid plan must be (nothing refused, nothing read that is not there).

use pebble_graph::{Chain, TrainingGraph};
// Linked for its registrations (the ILP solvers), as the CLI links it.
use pebble_ilp as _;
use pebble_schedule::lower::{self, Action, ChainProgram, GraphAction, GraphProgram, Ids};
use pebble_schedule::placement::{self, StageStart};
use pebble_schedule::{Schedule, View};
use pebble_sim::SimConfig;
use pebble_sim::{Link, Machine};
use pebble_solve::baseline::store_all::store_all_schedule;
use pebble_solve::{registry, simulate, Problem, SolveError, SolveOptions};
use pebble_testkit::{gpt, hand_chain, random_chain, siamese, tiny_graph, weighty_chain, ChainSpec, GraphSpec, Rng};

fn fixtures() -> Vec<(&'static str, Chain)> {
    let mut rng = Rng::new(0x10_3e4);
    let mut homogeneous = Chain::homogeneous(6, 1.0, 2.0, 4);
    homogeneous.static_bytes = 5;
    vec![
        ("hand", hand_chain()),
        ("homogeneous-6", homogeneous),
        ("random-7", random_chain(&mut rng, 7)),
        ("sparse-5", ChainSpec::SPARSE.chain(&mut rng, 5)),
        ("gpt-1 (chain)", gpt(1, 16, 8).chain),
        ("weighty-5", weighty_chain(&mut rng, 5)),
    ]
}

/// A machine whose transfers and CPU updates end when they start (in floating point,
/// past time 0).
fn instant() -> Machine {
    let link = Link { bandwidth: f64::MAX, latency: 0.0 };
    Machine { d2h: link, h2d: link, cpu_optimizer_rate: f64::MAX, host_memory: u64::MAX, ..Machine::default() }
}

/// Device bytes of `size` moved by `fraction` (the simulator's rounding).
fn part(size: u64, fraction: f64) -> u64 {
    ((size as f64) * fraction).round().min(size as f64) as u64
}

/// A tensor's device copy: the fraction of it there, and its bytes.
#[derive(Clone, Copy, Default)]
struct Copy {
    frac: f64,
    bytes: u64,
}

/// The program's own account of device memory, in program order with every transfer
/// instant: each compute step's creates and temporary on top of what is resident, then
/// its frees; an offload's device copy goes at once, or after the last step that reads
/// it; a prefetch takes its bytes when issued.
struct Account<'a> {
    chain: &'a Chain,
    ids: Ids,
    dev: Vec<Copy>,
    level: u64,
    peak: u64,
    /// `(release after this step, tensor, bytes)`: offloaded copies later steps read.
    held: Vec<(usize, usize, u64)>,
}

impl Account<'_> {
    fn size(&self, id: usize) -> u64 {
        lower::tensor_bytes(self.chain, self.ids.tensor(id))
    }
    fn create(&mut self, id: usize) {
        let size = self.size(id);
        self.dev[id] = Copy { frac: 1.0, bytes: size };
        self.level += size;
    }
    fn drop(&mut self, id: usize) {
        self.level -= std::mem::take(&mut self.dev[id]).bytes;
        let mut freed = 0;
        self.held.retain(|&(_, t, bytes)| {
            t != id || {
                freed += bytes;
                false
            }
        });
        self.level -= freed;
    }
    fn compute(&mut self, step: &lower::Step, tmp: u64) {
        let made: u64 = step.creates.iter().map(|&c| self.size(c)).sum();
        self.peak = self.peak.max(self.level + made + tmp);
        step.creates.iter().for_each(|&c| self.create(c));
        step.frees.iter().for_each(|&f| self.drop(f));
    }
    fn offload(&mut self, id: usize, fraction: f64, hold: Option<usize>) {
        let c = self.dev[id];
        let rest = c.frac - fraction;
        let bytes = if rest <= 1e-9 { c.bytes } else { part(self.size(id), fraction).min(c.bytes) };
        self.dev[id] = Copy { frac: rest.max(0.0), bytes: c.bytes - bytes };
        match hold {
            Some(h) => self.held.push((h, id, bytes)),
            None => self.level -= bytes,
        }
    }
    fn prefetch(&mut self, id: usize, fraction: f64) {
        let (size, c) = (self.size(id), self.dev[id]);
        let frac = c.frac + fraction;
        let bytes = if frac >= 1.0 - 1e-9 { size - c.bytes } else { part(size, fraction).min(size - c.bytes) };
        self.dev[id] = Copy { frac: frac.min(1.0), bytes: c.bytes + bytes };
        self.level += bytes;
        self.peak = self.peak.max(self.level);
    }
    fn after(&mut self, g: usize) {
        let mut freed = 0;
        self.held.retain(|&(h, _, bytes)| {
            h != g || {
                freed += bytes;
                false
            }
        });
        self.level -= freed;
    }
}

fn program_peak(chain: &Chain, schedule: &Schedule, program: &ChainProgram) -> u64 {
    let ids = program.ids;
    let named = |id: usize| ids.of(ids.tensor(id)).is_some();
    let starts = placement::starts(schedule, chain.len());
    let mut acc = Account { chain, ids, dev: vec![Copy::default(); ids.count()], level: 0, peak: 0, held: Vec::new() };
    let statics: u64 = (0..ids.count()).filter(|&id| ids.is_static(id) && named(id)).map(|id| acc.size(id)).sum();
    acc.level = chain.static_bytes - statics;
    acc.create(ids.act(0));
    for id in (0..ids.count()).filter(|&id| named(id)) {
        if let Some((kind, i)) = ids.static_of(id) {
            let s = starts.get(i).copied().unwrap_or(StageStart::DEVICE);
            if [s.weight, s.grad, s.state][kind].device {
                acc.create(id);
            }
        }
    }
    acc.peak = acc.level;
    let fused = placement::names_statics(schedule);
    for (g, step) in program.steps.iter().enumerate() {
        if g > 0 && step.op == 0 {
            // The next batch: δ_0 goes, a new a_0 comes.
            acc.drop(ids.grad(0));
            acc.create(ids.act(0));
            acc.peak = acc.peak.max(acc.level);
        }
        match step.action {
            Action::Forward { stage, .. } => acc.compute(step, chain.ftmp[stage]),
            // A schedule naming the statics updates inside its backwards (utmp after btmp).
            Action::Backward { stage, .. } if fused && !step.updates.is_empty() => {
                acc.compute(step, chain.fused_btmp(stage))
            }
            Action::Backward { stage, .. } => acc.compute(step, chain.btmp[stage]),
            Action::Loss { .. } => acc.compute(step, chain.btmp[chain.len()]),
            Action::Free { tensor, .. } => acc.drop(tensor),
            Action::Offload { upload: true, .. } | Action::CpuUpdate { .. } => {}
            Action::Offload { tensor, fraction, hold_until, .. } => acc.offload(tensor, fraction, hold_until),
            Action::Prefetch { tensor, fraction } => acc.prefetch(tensor, fraction),
        }
        acc.after(g);
    }
    acc.peak
}

fn transfers(schedule: &Schedule) -> bool {
    schedule
        .ops
        .iter()
        .any(|op| matches!(op, pebble_schedule::Op::Offload { .. } | pebble_schedule::Op::Prefetch { .. }))
}

/// What [`sweep`] saw: plans checked, how many had transfers, the solvers with no plan,
/// and every failure.
#[derive(Default)]
struct Tally {
    plans: usize,
    with_transfers: usize,
    idle: Vec<&'static str>,
    failures: Vec<String>,
}

/// Every registered solver of `view` on each fixture (but those `skip` names) at each
/// share of store-all's peak: `own_peak` lowers its plan and gives the program's own
/// peak (or why it does not lower), which must equal the simulator's on instant links.
fn sweep<'p>(
    view: View,
    fixtures: &[(&'static str, Problem<'p>)],
    shares: &[f64],
    skip: impl Fn(&str, &str) -> bool,
    own_peak: impl Fn(Problem<'p>, &Schedule) -> Result<u64, String>,
) -> Tally {
    let options = SolveOptions { time_limit: Some(10.0), ..SolveOptions::default() };
    let config = SimConfig { machine: instant(), ..SimConfig::default() };
    let mut t = Tally::default();
    for solver in registry().into_iter().filter(|s| s.views().contains(&view)) {
        let mut exercised = false;
        for &(name, problem) in fixtures.iter().filter(|(name, _)| !skip(solver.name(), name)) {
            let sa = simulate(problem, &store_all_schedule(problem), &SimConfig::default()).expect("store-all");
            let prepared = match solver.prepare(problem, &options) {
                Ok(p) => p,
                Err(
                    SolveError::NotApplicable { .. } | SolveError::TooLarge { .. } | SolveError::Unsupported { .. },
                ) => continue,
                Err(e) => panic!("{} on {name}: {e}", solver.name()),
            };
            for share in shares {
                let budget = (sa.peak_bytes as f64 * share) as u64;
                let Ok(schedule) = prepared.solve(budget) else { continue };
                let at = format!("{} on {name} at {budget}", solver.name());
                let own = match own_peak(problem, &schedule) {
                    Ok(own) => own,
                    Err(e) => {
                        t.failures.push(format!("{at}: {e}"));
                        continue;
                    }
                };
                match simulate(problem, &schedule, &config) {
                    Ok(r) if r.peak_bytes == own => {}
                    Ok(r) => {
                        t.failures.push(format!("{at}: the program accounts {own}, the simulator {}", r.peak_bytes))
                    }
                    Err(e) => {
                        t.failures.push(format!("{at}: the simulator with instant links rejects it: {e}"));
                        continue;
                    }
                }
                t.plans += 1;
                t.with_transfers += usize::from(transfers(&schedule));
                exercised = true;
            }
        }
        if !exercised {
            t.idle.push(solver.name());
        }
    }
    eprintln!("{:?}: {} plans, {} with transfers", view, t.plans, t.with_transfers);
    assert!(t.failures.is_empty(), "{} failures:\n{}", t.failures.len(), t.failures.join("\n"));
    assert!(t.idle.is_empty(), "{view:?} solvers with no plan on any fixture: {:?}", t.idle);
    t
}

#[test]
fn every_chain_solvers_plans_lower_and_the_program_accounts_the_simulators_peak() {
    let chains = fixtures();
    let problems: Vec<_> = chains.iter().map(|(name, c)| (*name, Problem::Chain(c))).collect();
    let t = sweep(
        View::Chain,
        &problems,
        &[1.0, 0.8, 0.6, 0.45],
        |_, _| false,
        |problem, schedule| {
            let Problem::Chain(chain) = problem else { unreachable!("chain fixtures") };
            let periods = if schedule.periodic { pebble_sim::PERIODS } else { 1 };
            let starts = placement::starts(schedule, chain.len());
            let program = lower::lower_chain(&schedule.ops, Ids::of_chain(chain), schedule.periodic, &starts, periods);
            if let Some((k, why)) = &program.refused {
                return Err(format!("op {k} refused: {why}"));
            }
            if let Some(s) = program.steps.iter().find(|s| s.missing.is_some()) {
                return Err(format!("op {} reads {:?}, not on the device", s.op, s.missing));
            }
            Ok(program_peak(chain, schedule, &program))
        },
    );
    assert!(t.plans >= 100 && t.with_transfers >= 20, "{} plans, {} with transfers", t.plans, t.with_transfers);
}

fn graph_fixtures() -> Vec<(&'static str, TrainingGraph)> {
    vec![
        ("tiny", tiny_graph()),
        ("siamese-3", siamese(3)),
        ("layered-6", GraphSpec::random(&mut Rng::new(6), 6).build()),
        ("gpt-1", gpt(1, 16, 8).graph),
    ]
}

/// A graph program's own peak, as [`program_peak`] counts a chain's: an offloaded data
/// node's device copy goes at once, or after the last compute step that reads it before
/// it is prefetched, created again or freed.
fn graph_program_peak(graph: &TrainingGraph, program: &GraphProgram) -> u64 {
    let steps = &program.steps;
    let size = |d: usize| graph.data[d].size;
    let mut dev: Vec<u64> =
        graph.data.iter().enumerate().map(|(d, n)| if lower::fixed(graph, d) { n.size } else { 0 }).collect();
    let mut level: u64 = dev.iter().sum();
    let mut peak = level;
    // (release after this step, data node, bytes) of offloaded copies later steps read.
    let mut held: Vec<(usize, usize, u64)> = Vec::new();
    let last_read = |k: usize, d: usize| {
        let mut last = None;
        for (j, s) in steps.iter().enumerate().skip(k + 1) {
            if s.reads.contains(&d) {
                last = Some(j);
            }
            let moved =
                matches!(s.action, GraphAction::Prefetch { data, .. } | GraphAction::Free { data } if data == d);
            if moved || s.creates.contains(&d) {
                break;
            }
        }
        last
    };
    for (k, s) in steps.iter().enumerate() {
        match s.action {
            GraphAction::Compute { node, .. } => {
                let made: u64 = s.creates.iter().map(|&d| size(d)).sum();
                peak = peak.max(level + made + graph.compute[node].tmp);
                for &d in &s.creates {
                    dev[d] = size(d);
                }
                level += made;
            }
            GraphAction::Free { data } => {
                level -= std::mem::take(&mut dev[data]);
                let mut freed = 0;
                held.retain(|&(_, d, bytes)| {
                    d != data || {
                        freed += bytes;
                        false
                    }
                });
                level -= freed;
            }
            GraphAction::Offload { data, fraction } => {
                assert_eq!(fraction, 1.0, "graph plans move whole data nodes");
                let bytes = std::mem::take(&mut dev[data]);
                match last_read(k, data) {
                    Some(j) => held.push((j, data, bytes)),
                    None => level -= bytes,
                }
            }
            GraphAction::Prefetch { data, .. } => {
                dev[data] = size(data);
                level += size(data);
                peak = peak.max(level);
            }
        }
        let mut freed = 0;
        held.retain(|&(j, _, bytes)| {
            j != k || {
                freed += bytes;
                false
            }
        });
        level -= freed;
    }
    peak
}

/// The MILP solvers (and `auto`, which runs them): only on the small graphs.
const MILP: [&str; 5] = ["auto", "checkmate", "hiremate", "rk-checkmate", "rockmate"];

#[test]
fn every_graph_solvers_plans_lower_and_the_program_accounts_the_simulators_peak() {
    let graphs = graph_fixtures();
    let problems: Vec<_> = graphs.iter().map(|(name, g)| (*name, Problem::Graph(g))).collect();
    let skip = |solver: &str, fixture: &str| MILP.contains(&solver) && fixture == "gpt-1";
    let t = sweep(View::Graph, &problems, &[1.0, 0.7, 0.5], skip, |problem, schedule| {
        let Problem::Graph(graph) = problem else { unreachable!("graph fixtures") };
        let program = lower::lower_graph(graph, &schedule.ops);
        if let Some((k, why)) = &program.refused {
            return Err(format!("op {k} refused: {why}"));
        }
        if let Some(s) = program.steps.iter().find(|s| s.fault.is_some()) {
            return Err(format!("op {} cannot run: {:?}", s.op, s.fault));
        }
        Ok(graph_program_peak(graph, &program))
    });
    assert!(t.plans >= 40, "{} graph plans", t.plans);
}
