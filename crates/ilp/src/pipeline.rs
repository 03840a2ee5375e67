//! The Ch. 6 ILP of Shilova's thesis for `PIPE_{S¹ & A}` (digest `seed001-part3.md`
//! §3.4): one MILP that chooses a general (non-contiguous) allocation of the layers to
//! the devices and a 1-periodic pattern of period `T`, under the memory of each device,
//! and minimizes `T`; and MadPipe's phase 2 (§3.7), the same ILP on phase 1's stage chain
//! with the allocation fixed. Solvers `pipeline-ilp` and `madpipe`.
//!
//! # Indexing: `L` layers, the loss folded into the last
//!
//! [`Layers`] fold the loss into layer `L` (its forward and backward are in `u_F`, `u_B`
//! of the last layer), so there is no loss task: with 0-based layers `0..L`, the tasks
//! are `T_t = F_t` for `t < L` and `T_t = B_{2L−1−t}` for `t ≥ L` (`2L` tasks, `F_{L−1}`
//! and `B_{L−1}` consecutive and colocated as the thesis's `F_{L+1}`, `B_{L+1}` are), and
//! `2L − 1` communications, `T^c_c` carrying the output of `T_c` to `T_{c+1}`: the
//! activation of boundary `c` for `c < L − 1`, nothing for `c = L − 1` (the loss never
//! leaves its device), the gradient of boundary `2L − 2 − c` for `c ≥ L`. A
//! communication of boundary `j` takes `boundary[j] / β + latency`
//! ([`PipeProblem::comm`] is both directions together).
//!
//! # The errata, decided (digest §3.4.4, §3.4.5, §6.4)
//!
//! 1. **Transitivity (6.1) for every pivot**: `z_{b,c} ≥ z_{a,b} + z_{a,c} − 1` for the
//!    three pivots of each triple. Since (6.4) colocates `F_ℓ` and `B_ℓ`, `z` between two
//!    tasks is `z` between their layers: the columns are one `y_{ℓ,ℓ'}` per pair of
//!    layers (an exact substitution of (6.4) that divides the transitivity rows by 8),
//!    and (6.2)–(6.3) count the classes on layers.
//! 2. **`w_{ℓℓ'} + w_{ℓ'ℓ} = z_{ℓℓ'}` explicitly**: one order column per unordered pair,
//!    `w_{ℓ'ℓ}` written as `z_{ℓℓ'} − w_{ℓℓ'}` (the equality substituted), so a
//!    zero-duration task still has exactly one order with each colocated task.
//! 3. **`2L − 1` communications** (the thesis's `2L + 1` for `L + 1` layers), with
//!    durations `d̃` (not `d`).
//! 4. **Ranges stop at the last communication**: (6.23)–(6.30) for `c ≤ 2L − 2`.
//! 5. **(6.33) sums over `ℓ'` only**.
//! 6. **Zero-cost colocated communications**: the duration of `T^c_c` is
//!    `d̃_c·(1 − z_{c,c+1})`, linear since `d̃_c` is a constant, in (6.18) and
//!    (6.23)–(6.30); two communications exclude each other only when both travel on the
//!    same link (`z̃ = 1` implies both travel, so (6.14)–(6.15) keep the constant `d̃`).
//! 7. **A safe big-M**: times are scaled so that the sequential period
//!    `T_seq = Σ d + Σ d̃` is 1; `T ≤ T_seq` is added (no optimum is lost: for a fixed
//!    allocation the sequential pattern, one micro-batch at a time, holds the least memory
//!    at every task, so any allocation with a feasible pattern has one of period at most
//!    `T_seq`) and `K = 2·T_seq ≥ T + max d`.
//!
//! Further choices, to hold the ILP to the simulator (`pebble_sim::pipeline`), which
//! counts memory as [`Layers`] do:
//!
//! * **Memory** of the device of task `x` at the start of `x` (the only instants where
//!   it grows): the static bytes of its layers, `layers.static_bytes(ℓ, ℓ, versions)` with
//!   `versions = weight_versions.unwrap_or(2)` (the thesis's `C·W`, (6.33)); a buffer of
//!   `a_j` and one of `δ_j` (`2·boundary[j]`) for each boundary `j` that crosses from or
//!   to the device ((6.34)–(6.35), Lemma 19); the activations, `stored[ℓ]` per micro-batch
//!   in flight as in Lemma 18: `σ_{x,ℓ} + [x = F_ℓ] + w_{F_ℓ,x} − w_{B_ℓ,x}` copies, where
//!   `σ` is (6.31)–(6.32)'s count at the start of the period (`Σ (v + v' + ṽ + ṽ')` over
//!   the communications from `F_ℓ` to `B_ℓ`, Lemma 17) and `[x = F_ℓ]` counts what `F_ℓ`
//!   allocates as it starts; and the temporary of `x` (`ftmp` or `btmp`). `stored[ℓ]`
//!   already holds the layer's input, so Lemma 18's working `a_{ℓ−1} + a_ℓ` and the direct
//!   dependencies `M^{DIR}` ((6.22), the `o` columns) are not separate terms: the
//!   simulator has no such memory, and the ILP counts exactly what it counts. Memory rows
//!   are scaled by `1/M`.
//! * **Cuts** (valid, for the LP relaxation): `T` at least each device's load, each
//!   link's load, the largest task and `Σ d / P`; `v' ≤ v`.
//! * **Zero durations** (a free backward, a layer of no cost): in the ILP every task lasts
//!   at least `10⁻⁷·T_seq`. Otherwise tasks that share a start leave `w` free to order
//!   them against their dependencies (a backward listed before the backward it waits
//!   for, a cycle through two devices at one instant), which the simulator reads as a
//!   deadlock. With positive durations the order of the tasks is that of their starts;
//!   the schedule runs the real durations in that order, no slower; `T` is at most
//!   `2L·10⁻⁷·T_seq` above the optimum of the unperturbed ILP. Free communications stay
//!   free (no chain of dependencies links two of them without a task in between).
//! * **Extraction**: devices are the classes of `y` (numbered by first layer, or the fixed
//!   allocation's); shifts are Lemma 17's sums of `v` (normalized so that `B_1` has 0; a
//!   communication's is its producer's less `v + v'`); each device runs its tasks in the
//!   ILP's order (the rank from `w`), each link its transfers in the pattern's order (the
//!   rank from `w̃`, `τ̃` between two free ones), both written out, since the simulator
//!   runs a periodic schedule's sends on each link in the order listed; each layer is its
//!   own [`PipeStage`] (merging a device's consecutive layers would run their passes as
//!   one op, which the pattern may not). The simulator runs every lane in the pattern's
//!   order as soon as possible, so its period is at most `T` (up to tolerance), and its
//!   memory is the ILP's (it depends only on each device's order and the shifts). Should
//!   HiGHS's tolerances put the simulated peak a few bytes over `M`, the ILP is solved
//!   again that much tighter (up to 3 times within the time limit).
//!
//! HiGHS runs under [`PipeProblem::time_limit`]; when it stops there with an incumbent,
//! the incumbent's pattern is returned (the thesis kept CPLEX's incumbents after its 1 h
//! limit too): [`IlpPattern::optimal`] says which. Beyond [`MAX_LAYERS`] layers (stages,
//! for MadPipe) the ILP is refused: its `O(L²)` big-M disjunctions and `O(L³)`
//! transitivity rows do not solve in useful time (a dozen layers already leave HiGHS an
//! incumbent well above its bound after a minute).
//!
//! # MadPipe's phase 2 (digest §3.7, erratum 15 decided: the allocation is fixed)
//!
//! Each phase-1 stage is one layer of a shorter chain ([`stage_chain`]): `u_F = Σ u_F`,
//! `u_B = Σ u_B` (erratum 9), the boundary of its last layer, `stored_bytes` of the stage
//! (the thesis's `ā`), weights, gradients and states summed, the largest temporaries;
//! every `z` is a constant (`Bin::One` / `Bin::Zero`) from phase 1's devices. The
//! solver reports phase 1's period as the expected one (the dashed line); its schedule
//! is phase 2's (the solid line). 1F1B\*'s construction on the same placement
//! ([`madpipe::schedule_placement`]) runs too, and the faster of the two in simulation is
//! kept: it covers a time limit of 0 (`pebble reproduce ch7` without `--ilp`), a stage
//! chain beyond [`MAX_LAYERS`], and an ILP stopped without an incumbent.

use pebble_graph::Layers;
use pebble_schedule::{Op, Pass, PipeStage, Schedule};
use pebble_sim::{simulate_pipeline, PipeReport, SimError};
use pebble_solve::pipeline::madpipe::{self, Allocation, Grid};
use pebble_solve::pipeline::{PipeError, PipeProblem, PipeRegistration, PipeSolution, PipeSolver};

use crate::IlpError;

mod pattern;
pub use pattern::solve_pattern;

/// The most layers (or MadPipe stages) the ILP takes.
pub const MAX_LAYERS: usize = 24;

/// HiGHS's relative gap: small, so that "optimal" is the optimum for the tests' oracle.
const GAP: f64 = 1e-6;

/// The shortest task, as a fraction of the sequential period (see the module doc: zero
/// durations); a hundred times HiGHS's feasibility tolerance, set to 1e-9.
const INSTANT: f64 = 1e-7;

/// When one pass runs in the pattern.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timed {
    /// Its start in the pattern (seconds; may be negative: devices are not aligned).
    pub start: f64,
    /// Its index shift: in period `j` it runs micro-batch `j + shift`.
    pub shift: i64,
}

/// The ILP's 1-periodic pattern.
#[derive(Debug, Clone, PartialEq)]
pub struct IlpPattern {
    /// The period `T` in seconds.
    pub period: f64,
    /// Whether HiGHS proved it optimal (within a relative gap of 1e-6); `false`: the
    /// incumbent when the time limit stopped it.
    pub optimal: bool,
    /// HiGHS's lower bound on `T` (equal to `period` when optimal).
    pub bound: f64,
    /// The device of each layer (of the chain the ILP was given).
    pub device: Vec<usize>,
    /// Each layer's forward.
    pub forward: Vec<Timed>,
    /// Each layer's backward.
    pub backward: Vec<Timed>,
    /// What each device runs, in order: `(layer, pass)`.
    pub order: Vec<Vec<(usize, Pass)>>,
    /// What each link (a pair of devices, the lower first) carries, in order.
    pub links: Vec<((usize, usize), Vec<Transfer>)>,
}

/// A communication of the pattern: the activation or the gradient of a boundary.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transfer {
    /// The boundary: the one after layer `boundary` (of the chain the ILP was given).
    pub boundary: usize,
    /// The gradient `δ` (backward), not the activation `a`.
    pub grad: bool,
    /// Its start in the pattern (seconds).
    pub start: f64,
    /// Its index shift.
    pub shift: i64,
}

impl IlpPattern {
    /// The pipeline schedule of this pattern: layer `k` of the ILP's chain is the
    /// pipeline stage `ranges[k]` (`first..=last` of the real layers), on its device;
    /// `devices` devices; one period, each run and each send on micro-batch `shift`, each
    /// device's runs and each link's sends in the pattern's order (a periodic pattern's
    /// link runs its sends in the order listed).
    pub fn schedule(&self, ranges: &[(usize, usize)], devices: usize) -> Schedule {
        let stages: Vec<PipeStage> = ranges
            .iter()
            .zip(&self.device)
            .map(|(&(first, last), &device)| PipeStage { first, last, device })
            .collect();
        // All ops in one list by pattern time, each device's and each link's in its order.
        let mut keyed: Vec<(f64, usize, usize, Op)> = Vec::new();
        for (device, list) in self.order.iter().enumerate() {
            let mut clock = f64::NEG_INFINITY;
            for (pos, &(stage, pass)) in list.iter().enumerate() {
                let timed = if pass == Pass::F { self.forward[stage] } else { self.backward[stage] };
                clock = clock.max(timed.start);
                keyed.push((clock, device, pos, Op::Run { device, stage, micro: timed.shift, pass }));
            }
        }
        for (i, (_, list)) in self.links.iter().enumerate() {
            let mut clock = f64::NEG_INFINITY;
            for (pos, tr) in list.iter().enumerate() {
                clock = clock.max(tr.start);
                let (j, next) = (tr.boundary, tr.boundary + 1);
                let op = if tr.grad {
                    Op::Send { from: self.device[next], to: self.device[j], stage: next, micro: tr.shift, grad: true }
                } else {
                    Op::Send { from: self.device[j], to: self.device[next], stage: j, micro: tr.shift, grad: false }
                };
                keyed.push((clock, self.order.len() + i, pos, op));
            }
        }
        keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        let ops = keyed.into_iter().map(|k| k.3).collect();
        Schedule::pipeline(devices, 1, stages, ops).repeated().with_sends()
    }
}

/// A schedule from the ILP, with its pattern and the simulator's report.
#[derive(Debug, Clone)]
pub struct IlpPlan {
    /// The schedule.
    pub schedule: Schedule,
    /// The ILP's pattern (on the layers, or on MadPipe's stages); `None` when MadPipe's
    /// phase 2 kept 1F1B\*'s construction.
    pub pattern: Option<IlpPattern>,
    /// The simulator's report on the schedule, under the problem's memory.
    pub report: PipeReport,
    /// MadPipe's phase-1 allocation, for `madpipe`.
    pub allocation: Option<Allocation>,
}

fn failed(solver: &'static str, what: &str, e: IlpError) -> PipeError {
    let why = match e {
        IlpError::Infeasible => format!("{what}: the ILP is infeasible (no 1-periodic pattern fits the memory)"),
        other => format!("{what}: {other}"),
    };
    PipeError::Infeasible { solver, why }
}

/// Solves the ILP (`fixed` devices, or free) on `chain`, builds the schedule of the
/// pipeline stages `ranges` on `problem`'s layers, and simulates it; tightens the memory
/// by what the simulator finds above it, up to 3 more times within the time limit.
fn plan(
    solver: &'static str,
    what: &str,
    problem: &PipeProblem<'_>,
    chain: &PipeProblem<'_>,
    ranges: &[(usize, usize)],
    fixed: Option<&[usize]>,
) -> Result<(Schedule, IlpPattern, PipeReport), PipeError> {
    let config = problem.sim_config();
    let started = std::time::Instant::now();
    let mut slack = 0u64;
    for _ in 0..=crate::RETRIES {
        // Retries share the time limit (each gets at least a second).
        let left = (chain.time_limit - started.elapsed().as_secs_f64()).max(chain.time_limit.min(1.0));
        let chain = PipeProblem { time_limit: left, ..*chain };
        let pattern = solve_pattern(&chain, fixed, slack).map_err(|e| failed(solver, what, e))?;
        let schedule = pattern.schedule(ranges, problem.devices);
        match simulate_pipeline(problem.layers, &schedule, &config) {
            Ok(report) => return Ok((schedule, pattern, report)),
            Err(SimError::BudgetExceeded { bytes, budget, .. }) if bytes > budget => slack += bytes - budget,
            Err(error) => return Err(PipeError::Invalid { solver, error }),
        }
    }
    Err(PipeError::Infeasible {
        solver,
        why: format!("{what}: the patterns exceed the memory in simulation even {slack} bytes below it"),
    })
}

/// `pipeline-ilp`: the Ch. 6 ILP on the layers, its schedule and the simulator's report.
pub fn solve(problem: &PipeProblem<'_>) -> Result<IlpPlan, PipeError> {
    const NAME: &str = "pipeline-ilp";
    let layers = problem.layers;
    layers.validate().map_err(|why| PipeError::Unsupported { solver: NAME, why })?;
    if layers.len() > MAX_LAYERS {
        return Err(PipeError::Unsupported {
            solver: NAME,
            why: format!("{} layers: the ILP takes at most {MAX_LAYERS} (try `madpipe`)", layers.len()),
        });
    }
    if problem.devices == 0 {
        return Err(PipeError::Unsupported { solver: NAME, why: "no devices".into() });
    }
    let ranges: Vec<(usize, usize)> = (0..layers.len()).map(|l| (l, l)).collect();
    let (schedule, pattern, report) = plan(NAME, "the Ch. 6 ILP", problem, problem, &ranges, None)?;
    Ok(IlpPlan { schedule, pattern: Some(pattern), report, allocation: None })
}

/// MadPipe's stage chain: each stage of `ranges` one layer, with the stage's times,
/// stored bytes, weights, gradients and states summed, its largest temporaries, and the
/// boundary after its last layer.
pub fn stage_chain(layers: &Layers, ranges: &[(usize, usize)]) -> Layers {
    let sum_f = |v: &[f64]| ranges.iter().map(|&(i, j)| v[i..=j].iter().sum()).collect::<Vec<f64>>();
    let sum_u = |v: &[u64]| ranges.iter().map(|&(i, j)| v[i..=j].iter().sum()).collect::<Vec<u64>>();
    let max_u = |v: &[u64]| ranges.iter().map(|&(i, j)| v[i..=j].iter().copied().max().unwrap_or(0)).collect();
    Layers {
        uf: sum_f(&layers.uf),
        ub: sum_f(&layers.ub),
        uw: sum_f(&layers.uw),
        stored: sum_u(&layers.stored),
        boundary: ranges.iter().map(|&(_, j)| layers.boundary[j]).collect(),
        input: layers.input,
        weights: sum_u(&layers.weights),
        grads: sum_u(&layers.grads),
        states: sum_u(&layers.states),
        shared: layers.shared,
        ftmp: max_u(&layers.ftmp),
        btmp: max_u(&layers.btmp),
    }
}

/// `madpipe`: phase 1 ([`madpipe::phase1`], 10 steps of Alg. 8 on the thesis's grid),
/// then phase 2: the ILP on its stage chain with each stage's device fixed, under
/// [`PipeProblem::time_limit`], and 1F1B\*'s construction on that placement, on every
/// other allocation Alg. 8 met and on the contiguous allocations of MadPipe's class
/// (PipeDream's DP's: [`madpipe::best_placement`]), keeping the schedule of smallest
/// simulated period (the ILP's on a tie). MadPipe's class contains PipeDream's
/// allocations, and with them in phase 2 it is never slower than `pipedream`. With no time (`time_limit <= 0`) or more than [`MAX_LAYERS`]
/// stages, the construction alone; when the ILP finds nothing in its time, the
/// construction; when neither schedules the placement, `Infeasible`.
pub fn madpipe(problem: &PipeProblem<'_>) -> Result<IlpPlan, PipeError> {
    const NAME: &str = "madpipe";
    problem.layers.validate().map_err(|why| PipeError::Unsupported { solver: NAME, why })?;
    if problem.devices == 0 {
        return Err(PipeError::Unsupported { solver: NAME, why: "no devices".into() });
    }
    let allocations = madpipe::candidates(problem, 10, Grid::default());
    let allocation = allocations.first().cloned().ok_or_else(|| PipeError::Infeasible {
        solver: NAME,
        why: "phase 1 (MadPipe-DP) finds no allocation whose memory estimate fits".into(),
    })?;
    let stages = allocation.pipe_stages();
    let ranges: Vec<(usize, usize)> = stages.iter().map(|s| (s.first, s.last)).collect();
    let ilp = if problem.time_limit > 0.0 && stages.len() <= MAX_LAYERS {
        let fixed: Vec<usize> = stages.iter().map(|s| s.device).collect();
        let chain_layers = stage_chain(problem.layers, &ranges);
        let chain = PipeProblem { layers: &chain_layers, ..*problem };
        let what = format!("phase 2 (the Ch. 6 ILP on phase 1's {} stages, allocation fixed)", ranges.len());
        match plan(NAME, &what, problem, &chain, &ranges, Some(&fixed)) {
            Ok(x) => Some(Ok(x)),
            Err(e @ PipeError::Invalid { .. }) => return Err(e),
            Err(e) => Some(Err(e)),
        }
    } else {
        None
    };
    // Without the ILP: 1F1B*'s construction on every allocation phase 1 met, and on the
    // contiguous ones of MadPipe's class.
    let mut allocations = allocations;
    allocations.extend(madpipe::contiguous_candidates(problem));
    let construction = madpipe::best_placement(problem, &allocations)
        .and_then(|(s, _, _)| simulate_pipeline(problem.layers, &s, &problem.sim_config()).ok().map(|r| (s, r)));
    let allocation = Some(allocation);
    match (ilp, construction) {
        (Some(Ok((schedule, pattern, report))), c) if c.as_ref().is_none_or(|c| report.period <= c.1.period) => {
            Ok(IlpPlan { schedule, pattern: Some(pattern), report, allocation })
        }
        (_, Some((schedule, report))) => Ok(IlpPlan { schedule, pattern: None, report, allocation }),
        (Some(Err(e)), None) => Err(e),
        (_, None) => Err(PipeError::Infeasible {
            solver: NAME,
            why: "phase 2: no 1-periodic schedule of phase 1's allocation fits (its special device's memory \
                  was underestimated)"
                .into(),
        }),
    }
}

/// `pipeline-ilp`: Shilova's Ch. 6 ILP, allocation and 1-periodic pattern together.
pub struct PipelineIlp;

impl PipeSolver for PipelineIlp {
    fn name(&self) -> &'static str {
        "pipeline-ilp"
    }
    fn description(&self) -> &'static str {
        "the Ch. 6 ILP: a general allocation and a 1-periodic pattern of least period under the memory \
         (Shilova 2021, Part III), by HiGHS under the time limit (the incumbent when it stops there); \
         at most 24 layers"
    }
    fn solve(&self, problem: &PipeProblem<'_>) -> Result<PipeSolution, PipeError> {
        let plan = solve(problem)?;
        Ok(PipeSolution { schedule: plan.schedule, expected_period: plan.pattern.map(|p| p.period) })
    }
}

/// `madpipe`: MadPipe's phase 1 (the DP allocation) and phase 2 (the Ch. 6 ILP on its
/// stages, allocation fixed).
pub struct MadPipe;

impl PipeSolver for MadPipe {
    fn name(&self) -> &'static str {
        "madpipe"
    }
    fn description(&self) -> &'static str {
        "MadPipe (Shilova 2021, Ch. 7): the DP allocation with one special device (phase 1, its period \
         the expected one), scheduled by the Ch. 6 ILP with the allocation fixed (phase 2, by HiGHS under \
         the time limit, the incumbent when it stops there) or by 1F1B*'s construction where that runs faster"
    }
    fn solve(&self, problem: &PipeProblem<'_>) -> Result<PipeSolution, PipeError> {
        let plan = madpipe(problem)?;
        let expected = plan.allocation.as_ref().map(|a| a.expected_period);
        Ok(PipeSolution { schedule: plan.schedule, expected_period: expected })
    }
}

inventory::submit!(PipeRegistration(&PipelineIlp));
inventory::submit!(PipeRegistration(&MadPipe));
