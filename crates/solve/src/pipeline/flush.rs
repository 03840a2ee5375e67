//! The schedules users run today, each one training step over `m` micro-batches ending
//! with a flush (one weight version, synchronous semantics).
//!
//! Each is a published per-device order of passes, written here as in its source and
//! left to the simulator to time (ASAP: each device runs its passes in the order listed,
//! each as soon as its inputs are there):
//!
//! * [`one_f_one_b`] (`1f1b` with `--microbatches`): PipeDream-Flush, Megatron-LM's
//!   non-interleaved schedule (Narayanan et al., SC'21, §2.2.1).
//! * `gpipe`: all forwards, then all backwards (Huang et al., NeurIPS 2019).
//! * `interleaved-1f1b`: Megatron-LM's interleaved schedule with `v` model chunks per
//!   device (Narayanan et al., SC'21, §2.2.2).
//! * `zb-h1`: Zero Bubble's handcrafted ZB-H1, the backward split into `I` (their `B`)
//!   and `W` (Qi et al., ICLR 2024, §3.1).
//! * `zb-v`: Zero Bubble's ZB-V, two chunks per device in a V (Qi et al., §6).
//!
//! The solvers take `problem.microbatches`, or when it is `None` the most micro-batches
//! up to `2P` whose schedule fits the memory (`2P` is enough for every device to reach
//! its steady state: 1F1B's warm-up is at most `P − 1`, ZB-V's `2P − 1`; fewer in flight
//! take less memory, at a larger bubble). Their partition is the contiguous one with the smallest
//! largest stage load (or link time between two devices): `gpipe` and `zb-h1` take
//! [`balanced_bounds`](super::onef1b::balanced_bounds) (at most `P` stages, one per
//! device, as `1f1b` does), `interleaved-1f1b` and `zb-v` the exact partition into `v·P`
//! (or `2P`) stages of [`balanced_partition`]. The schedule is then simulated; if no
//! micro-batch count fits the memory the solver answers [`PipeError::Infeasible`] with
//! the peak and the limit (the partition is not searched further).

use pebble_schedule::{Op, Pass, PipeStage, Schedule};
use pebble_sim::{simulate_pipeline, PipeConfig};

use super::partition::balanced_bounds;
use super::{contiguous_stages, PipeError, PipeProblem, PipeRegistration, PipeSolution, PipeSolver};

/// One pass a device runs: `(stage, micro-batch, pass)`.
type Step = (usize, usize, Pass);

/// The most micro-batches per step the flushed solvers use: `problem.microbatches`, or `2P`.
pub fn microbatches(problem: &PipeProblem<'_>) -> usize {
    problem.microbatches.unwrap_or(2 * problem.devices.max(1))
}

/// The contiguous partition of the layers into exactly `count` stages, stage `s` on
/// device `device_of(s)`, with the smallest largest load: each stage's `U(i, j)` and, at
/// each cut between two devices, the link's `C(j)` ([`PipeProblem::comm`]). `None` if
/// there are fewer layers than stages. Returns each stage's last layer.
pub fn balanced_partition(
    problem: &PipeProblem<'_>,
    count: usize,
    device_of: impl Fn(usize) -> usize,
) -> Option<Vec<usize>> {
    let l = problem.layers;
    let n = l.len();
    if count == 0 || n < count {
        return None;
    }
    let prefix = l.load_prefix();
    let load = |i: usize, j: usize| prefix[j + 1] - prefix[i];
    // a[s][j]: layers 0..=j on stages 0..=s; arg[s][j]: the last layer of stage s − 1.
    let mut a = vec![vec![f64::INFINITY; n]; count];
    let mut arg = vec![vec![usize::MAX; n]; count];
    for (j, a0) in a[0].iter_mut().enumerate() {
        *a0 = load(0, j);
    }
    for s in 1..count {
        let link = device_of(s - 1) != device_of(s);
        for j in s..n {
            for i in (s - 1)..j {
                let comm = if link { problem.comm(i) } else { 0.0 };
                let v = a[s - 1][i].max(comm).max(load(i + 1, j));
                if v < a[s][j] {
                    a[s][j] = v;
                    arg[s][j] = i;
                }
            }
        }
    }
    let mut bounds = vec![n - 1];
    let mut j = n - 1;
    for s in (1..count).rev() {
        j = arg[s][j];
        bounds.push(j);
    }
    bounds.reverse();
    Some(bounds)
}

/// The stages of `bounds`, stage `s` on device `device_of(s)`.
fn placed(bounds: &[usize], device_of: impl Fn(usize) -> usize) -> Vec<PipeStage> {
    let mut stages = contiguous_stages(bounds);
    for (s, st) in stages.iter_mut().enumerate() {
        st.device = device_of(s);
    }
    stages
}

/// The flushed schedule running `programs[d]` on device `d`, with its sends, checked by
/// the simulator and against the memory.
fn build(
    problem: &PipeProblem<'_>,
    solver: &'static str,
    stages: Vec<PipeStage>,
    m: usize,
    programs: Vec<Vec<Step>>,
) -> Result<Schedule, PipeError> {
    // The devices' programs side by side, position by position (only each device's own
    // order matters; this one reads well in a listing).
    let longest = programs.iter().map(Vec::len).max().unwrap_or(0);
    let mut ops = Vec::with_capacity(programs.iter().map(Vec::len).sum());
    for k in 0..longest {
        for program in &programs {
            if let Some(&(stage, micro, pass)) = program.get(k) {
                ops.push(Op::Run { device: stages[stage].device, stage, micro: micro as i64, pass });
            }
        }
    }
    let schedule = Schedule::pipeline(problem.devices, m, stages, ops).with_sends();
    let config = PipeConfig { memory: None, ..problem.sim_config() };
    let report =
        simulate_pipeline(problem.layers, &schedule, &config).map_err(|error| PipeError::Invalid { solver, error })?;
    if let Some(limit) = problem.memory {
        if let Some((d, &peak)) = report.peak_bytes_per_device.iter().enumerate().max_by_key(|&(_, &b)| b) {
            if peak > limit {
                return Err(PipeError::Infeasible {
                    solver,
                    why: format!(
                        "its peak is {peak} bytes (device {d}), over the memory of {limit} bytes \
                         ({m} micro-batches on the balanced partition)"
                    ),
                });
            }
        }
    }
    Ok(schedule)
}

/// The schedule of the most micro-batches that fits: `problem.microbatches` alone when it
/// is given; otherwise each count from `2P` down (only those `allowed` says), the first
/// whose peak fits the memory. Fewer micro-batches in flight take less memory and leave a
/// larger bubble: under a tight memory this is how a user of these schedules fits, at
/// the same micro-batch size.
fn most_microbatches(
    problem: &PipeProblem<'_>,
    allowed: impl Fn(usize) -> bool,
    build: impl Fn(usize) -> Result<Schedule, PipeError>,
) -> Result<PipeSolution, PipeError> {
    if let Some(m) = problem.microbatches {
        return build(m).map(Into::into);
    }
    let mut last = None;
    for m in (1..=microbatches(problem)).rev().filter(|&m| allowed(m)) {
        match build(m) {
            Ok(s) => return Ok(s.into()),
            Err(e @ PipeError::Infeasible { .. }) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or(PipeError::Unsupported { solver: "flush", why: "no micro-batch count to try".into() }))
}

/// A schedule of one stage per device on the balanced contiguous partition, each device's
/// passes from `order(stages, m)`, with the most micro-batches that fit.
fn on_balanced_bounds(
    problem: &PipeProblem<'_>,
    solver: &'static str,
    order: fn(usize, usize) -> Vec<Vec<Step>>,
) -> Result<PipeSolution, PipeError> {
    check_m(solver, microbatches(problem))?;
    let bounds = balanced_bounds(problem);
    most_microbatches(
        problem,
        |_| true,
        |m| build(problem, solver, contiguous_stages(&bounds), m, order(bounds.len(), m)),
    )
}

fn check_m(solver: &'static str, m: usize) -> Result<(), PipeError> {
    if m == 0 {
        return Err(PipeError::Unsupported { solver, why: "needs at least one micro-batch".into() });
    }
    Ok(())
}

/// Device `i`'s passes under 1F1B with a flush, `p` stages, `m` micro-batches: `min(p −
/// i − 1, m)` warm-up forwards, then one forward and one backward alternately, then the
/// cool-down backwards (Megatron-LM's `forward_backward_pipelining_without_interleaving`).
fn one_f_one_b_order(p: usize, m: usize) -> Vec<Vec<Step>> {
    (0..p)
        .map(|i| {
            let warmup = (p - i - 1).min(m);
            let mut ops: Vec<Step> = (0..warmup).map(|u| (i, u, Pass::F)).collect();
            for k in 0..m - warmup {
                ops.push((i, k + warmup, Pass::F));
                ops.push((i, k, Pass::B));
            }
            ops.extend((m - warmup..m).map(|u| (i, u, Pass::B)));
            ops
        })
        .collect()
}

/// GPipe's order: every forward, then every backward, in micro-batch order (as
/// PyTorch's `ScheduleGPipe` runs them).
fn gpipe_order(p: usize, m: usize) -> Vec<Vec<Step>> {
    (0..p).map(|i| (0..m).map(|u| (i, u, Pass::F)).chain((0..m).map(|u| (i, u, Pass::B))).collect()).collect()
}

/// Megatron-LM's interleaved order (`forward_backward_pipelining_with_interleaving`,
/// also PyTorch's `ScheduleInterleaved1F1B`): `v` chunks per device, chunk `c` of device
/// `i` being stage `c·p + i`. The `k`-th forward of a device runs chunk `(k mod pv) / p`,
/// the `k`-th backward chunk `v − 1 − (k mod pv) / p`, each on its chunk's next
/// micro-batch; device `i` runs `(p − i − 1)·2 + (v − 1)·p` warm-up forwards (all `m·v`
/// when `m = p`, as Megatron does; at most `m·v`), then one forward and one backward
/// alternately, then the cool-down backwards. `m` must be a multiple of `p`.
fn interleaved_order(p: usize, v: usize, m: usize) -> Vec<Vec<Step>> {
    let total = m * v;
    (0..p)
        .map(|i| {
            let warmup = if m == p { total } else { ((p - i - 1) * 2 + (v - 1) * p).min(total) };
            let chunk_f = |k: usize| (k % (p * v)) / p;
            let chunk_b = |k: usize| v - 1 - (k % (p * v)) / p;
            let (mut next_f, mut next_b) = (vec![0usize; v], vec![0usize; v]);
            let mut ops = Vec::with_capacity(2 * total);
            let mut forward = |k: usize, ops: &mut Vec<Step>| {
                let c = chunk_f(k);
                ops.push((c * p + i, next_f[c], Pass::F));
                next_f[c] += 1;
            };
            let mut backward = |k: usize, ops: &mut Vec<Step>| {
                let c = chunk_b(k);
                ops.push((c * p + i, next_b[c], Pass::B));
                next_b[c] += 1;
            };
            for k in 0..warmup {
                forward(k, &mut ops);
            }
            for k in 0..total - warmup {
                forward(k + warmup, &mut ops);
                backward(k, &mut ops);
            }
            for k in total - warmup..total {
                backward(k, &mut ops);
            }
            ops
        })
        .collect()
}

/// ZB-H1 (Qi et al., ICLR 2024, §3.1, Fig. 3), as PyTorch builds it
/// (`ScheduleInterleavedZeroBubble` with one stage per rank: `_get_1f1b_rank_ops` with
/// `enable_zero_bubble`): 1F1B's `min(p − i − 1, m)` warm-up forwards, then `F` and `I`
/// alternately, device `i` starting its `W`s (oldest first, one after each `I`) only
/// after its first `i` steady-state rounds; the `W`s left run at the end. Device `i`
/// thus holds up to `min(p, m)` micro-batches, 1F1B's peak on device 0.
fn zb_h1_order(p: usize, m: usize) -> Vec<Vec<Step>> {
    (0..p)
        .map(|i| {
            let warmup = (p - i - 1).min(m);
            let mut ops: Vec<Step> = (0..warmup).map(|u| (i, u, Pass::F)).collect();
            let (mut backwards, mut weights) = (0usize, 0usize);
            for op in warmup..m + warmup {
                if op < m {
                    ops.push((i, op, Pass::F));
                }
                ops.push((i, backwards, Pass::I));
                backwards += 1;
                if op - warmup >= i {
                    ops.push((i, weights, Pass::W));
                    weights += 1;
                }
            }
            ops.extend((weights..m).map(|u| (i, u, Pass::W)));
            ops
        })
        .collect()
}

/// ZB-V (Qi et al., ICLR 2024, §6, Fig. 8), as PyTorch's `ScheduleZBVZeroBubble` builds
/// it: device `i` holds stages `i` (chunk 0) and `2p − 1 − i` (chunk 1). Warm-up:
/// `2(p − i) − 1` forwards of chunk 0, then `i` pairs (chunk 1, chunk 0), then `p − i`
/// rounds of chunk 1's `F I W`; steady state: rounds of chunk 0's `F I W` (its `F`
/// while any is left) and chunk 1's `F I W`; cool-down: `i` pairs of `I`s (chunk 0,
/// chunk 1), `p − i` rounds of chunk 0's `I W`, then the `W`s left, chunk 1's first.
/// It is built for `max(2p − 1, m)` micro-batches and the passes of those past `m`
/// dropped, as PyTorch does.
fn zb_v_order(p: usize, m: usize) -> Vec<Vec<Step>> {
    let n = m.max(2 * p - 1);
    (0..p)
        .map(|i| {
            let (s0, s1) = (i, 2 * p - 1 - i);
            let mut ops: Vec<Step> = Vec::new();
            let (mut f0, mut f1, mut b0, mut b1) = (0, 0, 0, 0);
            for _ in 0..2 * (p - i) - 1 {
                ops.push((s0, f0, Pass::F));
                f0 += 1;
            }
            for _ in 0..i {
                ops.push((s1, f1, Pass::F));
                f1 += 1;
                ops.push((s0, f0, Pass::F));
                f0 += 1;
            }
            for _ in 0..p - i {
                ops.push((s1, f1, Pass::F));
                f1 += 1;
                ops.push((s1, b1, Pass::I));
                ops.push((s1, b1, Pass::W));
                b1 += 1;
            }
            while f1 < f0 || f0 < n {
                if f0 < n {
                    ops.push((s0, f0, Pass::F));
                    f0 += 1;
                }
                ops.push((s0, b0, Pass::I));
                ops.push((s0, b0, Pass::W));
                b0 += 1;
                ops.push((s1, f1, Pass::F));
                f1 += 1;
                ops.push((s1, b1, Pass::I));
                ops.push((s1, b1, Pass::W));
                b1 += 1;
            }
            let (mut w0, mut w1) = (b0, b1);
            for _ in 0..i {
                ops.push((s0, b0, Pass::I));
                b0 += 1;
                ops.push((s1, b1, Pass::I));
                b1 += 1;
            }
            for _ in 0..p - i {
                ops.push((s0, b0, Pass::I));
                b0 += 1;
                ops.push((s0, w0, Pass::W));
                w0 += 1;
            }
            ops.extend((w1..b1).map(|u| (s1, u, Pass::W)));
            w1 = b1;
            ops.extend((w0..b0).map(|u| (s0, u, Pass::W)));
            debug_assert!(f0 == n && b0 == n && f1 == n && b1 == n && w1 == n);
            ops.retain(|&(_, u, _)| u < m);
            ops
        })
        .collect()
}

/// Synchronous 1F1B with a flush every `m` micro-batches on the contiguous partition
/// `bounds` (stage `s` on device `s`): PipeDream-Flush (Narayanan et al., "Memory-Efficient
/// Pipeline-Parallel DNN Training", ICML 2021), Megatron-LM's non-interleaved schedule
/// (Narayanan et al., SC'21, §2.2.1). With `p` stages, device `i` runs `min(p − i − 1,
/// m)` warm-up forwards, then one forward and one backward alternately, then the
/// cool-down backwards: it holds at most `min(p − i, m)` micro-batches, and its bubble is
/// `(p − 1)/m` on balanced stages.
pub fn one_f_one_b(problem: &PipeProblem<'_>, bounds: &[usize], m: usize) -> Result<Schedule, PipeError> {
    check_m("1f1b", m)?;
    build(problem, "1f1b", contiguous_stages(bounds), m, one_f_one_b_order(bounds.len(), m))
}

/// `gpipe`: GPipe (Huang et al., "GPipe: Efficient Training of Giant Neural Networks
/// using Pipeline Parallelism", NeurIPS 2019, §2.2, Fig. 2c): each device runs all `m`
/// forwards, then all `m` backwards. Every device holds all `m` micro-batches; the
/// bubble is `(p − 1)/m` on balanced stages. The balanced contiguous partition, one stage
/// per device.
pub struct GPipe;

impl PipeSolver for GPipe {
    fn name(&self) -> &'static str {
        "gpipe"
    }
    fn description(&self) -> &'static str {
        "GPipe: all forwards then all backwards, flush every m micro-batches (Huang et al. 2019), \
         balanced contiguous partition"
    }
    fn solve(&self, problem: &PipeProblem<'_>) -> Result<PipeSolution, PipeError> {
        on_balanced_bounds(problem, self.name(), gpipe_order)
    }
}

/// `interleaved-1f1b`: Megatron-LM's interleaved 1F1B (Narayanan et al., "Efficient
/// Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC'21,
/// §2.2.2, Fig. 4): the chain cut into `v·p` contiguous stages (`v` =
/// `problem.virtual_stages`), stage `c` on device `c mod p`, in Megatron's order (see
/// the warm-up and chunk rules on the order's builder). `m` must be a multiple of `p`,
/// as in the paper and Megatron. The bubble is `(p − 1)/(v·m)` on balanced stages. With
/// `v = 1` it is [`one_f_one_b`].
pub struct Interleaved1F1B;

impl PipeSolver for Interleaved1F1B {
    fn name(&self) -> &'static str {
        "interleaved-1f1b"
    }
    fn description(&self) -> &'static str {
        "Megatron-LM's interleaved 1F1B: v chunks per device, stage c on device c mod P, \
         flush every m micro-batches (Narayanan et al. SC'21)"
    }
    fn solve(&self, problem: &PipeProblem<'_>) -> Result<PipeSolution, PipeError> {
        let unsupported = |why: String| PipeError::Unsupported { solver: "interleaved-1f1b", why };
        let (p, v, m) = (problem.devices.max(1), problem.virtual_stages, microbatches(problem));
        check_m(self.name(), m)?;
        if v == 0 {
            return Err(unsupported("needs at least one virtual stage per device".into()));
        }
        if problem.microbatches.is_some() && m % p != 0 {
            return Err(unsupported(format!(
                "the micro-batch count ({m}) must be a multiple of the device count ({p})"
            )));
        }
        let device_of = |s: usize| s % p;
        let bounds = balanced_partition(problem, v * p, device_of).ok_or_else(|| {
            unsupported(format!("{} layers cannot make {} stages ({v} per device)", problem.layers.len(), v * p))
        })?;
        most_microbatches(
            problem,
            |m| m % p == 0,
            |m| {
                let order = if v == 1 { one_f_one_b_order(p, m) } else { interleaved_order(p, v, m) };
                build(problem, self.name(), placed(&bounds, device_of), m, order)
            },
        )
    }
}

/// `zb-h1`: Zero Bubble's ZB-H1 (Qi, Wan, Huang, Lin, "Zero Bubble (Almost) Pipeline
/// Parallelism", ICLR 2024, §3.1, Fig. 3 top): the backward split into `I` (the input
/// gradient, their `B`) and `W` (the weight gradient); 1F1B's warm-up, with device `i`
/// deferring its `W`s by `i` rounds into the cool-down bubble, following PyTorch's
/// construction (`ScheduleInterleavedZeroBubble` with one stage per rank). The peak over
/// devices is 1F1B's (`min(p, m)` micro-batches), and the bubble `(p − 1)/(3m)` when
/// `F`, `I` and `W` take equal times. The balanced contiguous partition, one stage per
/// device; a stage with no weights runs a `W` of no time.
pub struct ZbH1;

impl PipeSolver for ZbH1 {
    fn name(&self) -> &'static str {
        "zb-h1"
    }
    fn description(&self) -> &'static str {
        "Zero Bubble's handcrafted ZB-H1: backward split into I and W, 1F1B's peak memory, \
         flush every m micro-batches (Qi et al. ICLR 2024)"
    }
    fn solve(&self, problem: &PipeProblem<'_>) -> Result<PipeSolution, PipeError> {
        on_balanced_bounds(problem, self.name(), zb_h1_order)
    }
}

/// `zb-v`: Zero Bubble's ZB-V (Qi et al., ICLR 2024, §6, Fig. 8): `2p` contiguous
/// stages in a V, stage `c` on device `c` for `c < p` and on device `2p − 1 − c`
/// otherwise (device `p − 1` holds the middle two, so one forward never leaves it, nor
/// one gradient), the backward split into `I` and `W`, in the order of PyTorch's
/// `ScheduleZBVZeroBubble`. Its largest peak is 1F1B's. The paper reports a (near) zero
/// bubble when `F`, `I` and `W` take equal times; a flushed step still pays the fill
/// (device `p − 1` waits `p − 1` chunk forwards), so on balanced stages its bubble is
/// `(p − 1)/(6m)`, half of ZB-H1's, for `m ≥ 2p − 1` (the count PyTorch builds it for);
/// it beats ZB-H1 for `m > p` and only ties it at `m = p`.
pub struct ZbV;

impl PipeSolver for ZbV {
    fn name(&self) -> &'static str {
        "zb-v"
    }
    fn description(&self) -> &'static str {
        "Zero Bubble's ZB-V: 2 chunks per device in a V, backward split into I and W, \
         flush every m micro-batches (Qi et al. ICLR 2024)"
    }
    fn solve(&self, problem: &PipeProblem<'_>) -> Result<PipeSolution, PipeError> {
        let (p, m) = (problem.devices.max(1), microbatches(problem));
        check_m(self.name(), m)?;
        let device_of = move |s: usize| if s < p { s } else { 2 * p - 1 - s };
        let bounds = balanced_partition(problem, 2 * p, device_of).ok_or_else(|| PipeError::Unsupported {
            solver: "zb-v",
            why: format!("{} layers cannot make {} stages (2 per device)", problem.layers.len(), 2 * p),
        })?;
        most_microbatches(
            problem,
            |_| true,
            |m| build(problem, self.name(), placed(&bounds, device_of), m, zb_v_order(p, m)),
        )
    }
}

/// The solvers of this module: each plans a flushed step (and `1f1b` does too when given
/// `--microbatches`).
pub const NAMES: [&str; 4] = ["gpipe", "interleaved-1f1b", "zb-h1", "zb-v"];

inventory::submit!(PipeRegistration(&GPipe));
inventory::submit!(PipeRegistration(&Interleaved1F1B));
inventory::submit!(PipeRegistration(&ZbH1));
inventory::submit!(PipeRegistration(&ZbV));

#[cfg(test)]
mod tests {
    use super::*;
    use pebble_graph::Layers;
    use pebble_sim::PipeReport;

    /// `l` balanced layers: `F = 1`, `B = 2` of which `W = 1` (so `I = 1`), one stored
    /// unit each, no boundary, no weights.
    fn balanced(l: usize) -> Layers {
        let mut layers = Layers::new(vec![1.0; l], vec![2.0; l], vec![1; l], vec![0; l], vec![0; l]);
        layers.uw = vec![1.0; l];
        layers
    }

    fn problem(layers: &Layers, p: usize, m: usize) -> PipeProblem<'_> {
        let mut pr = PipeProblem::new(layers, p, None, f64::INFINITY);
        pr.microbatches = Some(m);
        pr
    }

    fn run(name: &str, layers: &Layers, p: usize, m: usize) -> (Schedule, PipeReport) {
        let pr = problem(layers, p, m);
        let plan = super::super::plan_pipeline(super::super::pipe_solver(name).unwrap(), &pr)
            .unwrap_or_else(|e| panic!("{name}, p = {p}, m = {m}: {e}"));
        (plan.schedule, plan.report)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9
    }

    const CASES: [(usize, usize); 5] = [(2, 4), (2, 8), (4, 4), (4, 8), (3, 6)];

    #[test]
    fn gpipe_and_one_f_one_b_bubble_is_p_minus_one_over_m() {
        for (p, m) in CASES {
            let l = balanced(p);
            for name in ["gpipe", "1f1b"] {
                let (_, r) = run(name, &l, p, m);
                let expected = (p as f64 - 1.0) / m as f64;
                assert!(
                    close(r.bubble, expected),
                    "{name}, p = {p}, m = {m}: bubble {}, expected {expected}",
                    r.bubble
                );
                assert!(close(r.step_time.unwrap(), 3.0 * (m + p - 1) as f64), "{name}: {:?}", r.step_time);
            }
        }
    }

    #[test]
    fn interleaved_bubble_is_p_minus_one_over_v_m() {
        for (p, m) in CASES {
            for v in [2, 3] {
                let l = balanced(v * p);
                let mut pr = problem(&l, p, m);
                pr.virtual_stages = v;
                let plan = super::super::plan_pipeline(&Interleaved1F1B, &pr).unwrap();
                let expected = (p as f64 - 1.0) / (v * m) as f64;
                assert!(
                    close(plan.report.bubble, expected),
                    "p = {p}, v = {v}, m = {m}: bubble {}, expected {expected}",
                    plan.report.bubble
                );
                assert_eq!(plan.schedule.stages.len(), v * p);
                assert!(plan.schedule.stages.iter().enumerate().all(|(c, s)| s.device == c % p));
            }
        }
    }

    #[test]
    fn interleaved_needs_m_a_multiple_of_p() {
        let l = balanced(8);
        let pr = problem(&l, 4, 6);
        assert!(matches!(Interleaved1F1B.solve(&pr), Err(PipeError::Unsupported { .. })));
        let pr = problem(&l, 8, 8);
        assert!(matches!(Interleaved1F1B.solve(&pr), Err(PipeError::Unsupported { .. })), "16 stages of 8 layers");
    }

    #[test]
    fn zb_h1_bubble_is_a_third_of_one_f_one_b() {
        for (p, m) in CASES {
            let l = balanced(p);
            let (_, r) = run("zb-h1", &l, p, m);
            let expected = (p as f64 - 1.0) / (3 * m) as f64;
            assert!(close(r.bubble, expected), "p = {p}, m = {m}: bubble {}, expected {expected}", r.bubble);
        }
    }

    /// ZB-V on `2p` balanced layers (each chunk half a ZB-H1 stage: `F = I = W`).
    ///
    /// The paper reports ZB-V's bubble as (near) zero when `F`, `B` and `W` take equal
    /// times. A flushed step cannot reach zero: device `p − 1` waits `p − 1` chunk
    /// forwards for its first input, and since every device is busy `6m` chunk times
    /// the bubble is at least `(p − 1)/(6m)` (half of ZB-H1's). PyTorch's order reaches
    /// that floor exactly once `m ≥ 2p − 1` (the count it is built for), and beats ZB-H1
    /// whenever `m > p`; at `m = p` it only ties ZB-H1, below that it is worse (its
    /// warm-up is padded for `2p − 1` micro-batches).
    #[test]
    fn zb_v_reaches_the_fill_floor_and_beats_zb_h1() {
        for (p, m) in [(2, 3), (2, 4), (2, 8), (3, 6), (4, 7), (4, 8), (4, 16)] {
            let (s, r) = run("zb-v", &balanced(2 * p), p, m);
            let (_, h1) = run("zb-h1", &balanced(p), p, m);
            let floor = (p as f64 - 1.0) / (6 * m) as f64;
            assert!(close(r.bubble, floor), "p = {p}, m = {m}: bubble {}, expected {floor}", r.bubble);
            assert!(r.bubble < h1.bubble - 1e-9, "p = {p}, m = {m}: zb-v {} vs zb-h1 {}", r.bubble, h1.bubble);
            // The V: device i holds stages i and 2p − 1 − i.
            for (c, st) in s.stages.iter().enumerate() {
                assert_eq!(st.device, if c < p { c } else { 2 * p - 1 - c });
            }
        }
        // p < m < 2p − 1: below ZB-H1, above the floor.
        for (p, m) in [(4, 5), (6, 8)] {
            let (_, r) = run("zb-v", &balanced(2 * p), p, m);
            let (_, h1) = run("zb-h1", &balanced(p), p, m);
            let floor = (p as f64 - 1.0) / (6 * m) as f64;
            assert!(r.bubble > floor + 1e-9 && r.bubble < h1.bubble - 1e-9, "p = {p}, m = {m}: {}", r.bubble);
        }
        // m = p: a tie with ZB-H1, (p − 1)/(3m).
        for p in [2, 4] {
            let (_, r) = run("zb-v", &balanced(2 * p), p, p);
            assert!(close(r.bubble, (p as f64 - 1.0) / (3 * p) as f64), "p = m = {p}: {}", r.bubble);
        }
    }

    #[test]
    fn peaks() {
        for (p, m) in CASES.into_iter().chain([(4, 2), (4, 3), (4, 16)]) {
            let l = balanced(p);
            let (_, one) = run("1f1b", &l, p, m);
            let expected: Vec<u64> = (0..p).map(|i| (p - i).min(m) as u64).collect();
            assert_eq!(one.peak_bytes_per_device, expected, "1f1b, p = {p}, m = {m}");
            let (_, g) = run("gpipe", &l, p, m);
            assert_eq!(g.peak_bytes_per_device, vec![m as u64; p], "gpipe, p = {p}, m = {m}");
            // ZB-H1: device i defers its Ws by i rounds, so every device holds min(p, m),
            // the peak of 1F1B's device 0: the largest peak is 1F1B's.
            let (_, h1) = run("zb-h1", &l, p, m);
            assert_eq!(h1.peak_bytes_per_device, vec![p.min(m) as u64; p], "zb-h1, p = {p}, m = {m}");
            let max = |r: &PipeReport| r.peak_bytes_per_device.iter().copied().max().unwrap();
            assert_eq!(max(&h1), max(&one));
            // ZB-V on 2p chunks of one unit each (a 1F1B stage is two chunks): its largest
            // peak is 1F1B's, 2·min(p, m) units.
            let (_, v) = run("zb-v", &balanced(2 * p), p, m);
            assert_eq!(max(&v), 2 * max(&one), "zb-v, p = {p}, m = {m}: {:?}", v.peak_bytes_per_device);
        }
    }

    /// Interleaving holds more: device i of Megatron's order keeps its warm-up forwards.
    #[test]
    fn interleaved_peaks_follow_the_warm_up() {
        let (p, v, m) = (4, 2, 8);
        let l = balanced(v * p);
        let mut pr = problem(&l, p, m);
        pr.virtual_stages = v;
        let plan = super::super::plan_pipeline(&Interleaved1F1B, &pr).unwrap();
        // Warm-up (p − i − 1)·2 + (v − 1)·p, plus the steady state's first forward.
        let expected: Vec<u64> = (0..p).map(|i| ((p - i - 1) * 2 + (v - 1) * p + 1) as u64).collect();
        assert_eq!(plan.report.peak_bytes_per_device, expected);
    }

    #[test]
    fn every_schedule_passes_the_simulator() {
        // Unbalanced layers, a real link, weights: the orders stay valid.
        let l = {
            let n = 12;
            let mut l = Layers::new(
                (0..n).map(|i| 1.0 + (i % 3) as f64).collect(),
                (0..n).map(|i| 2.0 + (i % 5) as f64 * 0.5).collect(),
                (0..n).map(|i| 10 + i as u64).collect(),
                vec![4; n],
                vec![3; n],
            );
            l.uw = l.ub.iter().enumerate().map(|(i, b)| if i % 4 == 0 { 0.0 } else { b / 2.0 }).collect();
            l
        };
        for p in 1..=4 {
            for m in [1, 2, 3, 4, 5, 8] {
                let mut pr = PipeProblem::new(&l, p, None, 8.0);
                pr.microbatches = Some(m);
                for name in NAMES.into_iter().chain(["1f1b"]) {
                    let solver = super::super::pipe_solver(name).unwrap();
                    match super::super::plan_pipeline(solver, &pr) {
                        Ok(plan) => {
                            assert!(!plan.schedule.periodic);
                            assert_eq!(plan.schedule.microbatches, Some(m));
                        }
                        Err(PipeError::Unsupported { .. }) if name == "interleaved-1f1b" && m % p != 0 => {}
                        Err(e) => panic!("{name}, p = {p}, m = {m}: {e}"),
                    }
                }
            }
        }
    }

    #[test]
    fn over_memory_is_infeasible_with_the_peak() {
        let l = balanced(4);
        let mut pr = problem(&l, 4, 8);
        pr.memory = Some(3);
        let e = GPipe.solve(&pr).unwrap_err();
        assert!(matches!(e, PipeError::Infeasible { .. }), "{e}");
        assert!(e.to_string().contains("8 bytes") && e.to_string().contains("3 bytes"), "{e}");
        // 1F1B holds 4 on device 0; with 4 bytes it fits.
        pr.memory = Some(4);
        assert!(one_f_one_b(&pr, &[0, 1, 2, 3], 8).is_ok());
    }

    #[test]
    fn default_microbatches_are_two_per_device() {
        let l = balanced(4);
        let pr = PipeProblem::new(&l, 4, None, f64::INFINITY);
        assert_eq!(microbatches(&pr), 8);
        assert_eq!(GPipe.solve(&pr).unwrap().schedule.microbatches, Some(8));
    }

    #[test]
    fn one_f_one_b_order_is_megatrons() {
        // p = 3, m = 4, device 0: 2 warm-up forwards, F2 B0 F3 B1, then B2 B3.
        let o = one_f_one_b_order(3, 4);
        let pass = |d: usize| o[d].iter().map(|&(_, u, p)| format!("{p:?}{u}")).collect::<Vec<_>>().join(" ");
        assert_eq!(pass(0), "F0 F1 F2 B0 F3 B1 B2 B3");
        assert_eq!(pass(2), "F0 B0 F1 B1 F2 B2 F3 B3");
        let z = zb_h1_order(3, 4);
        let pass = |d: usize| z[d].iter().map(|&(_, u, p)| format!("{p:?}{u}")).collect::<Vec<_>>().join(" ");
        assert_eq!(pass(0), "F0 F1 F2 I0 W0 F3 I1 W1 I2 W2 I3 W3");
        assert_eq!(pass(2), "F0 I0 F1 I1 F2 I2 W0 F3 I3 W1 W2 W3");
    }

    #[test]
    fn balanced_partition_is_exact() {
        let l = Layers::from_costs(&[1.0, 1.0, 1.0, 1.0, 4.0, 1.0, 1.0]);
        let pr = PipeProblem::new(&l, 2, None, f64::INFINITY);
        assert_eq!(balanced_partition(&pr, 3, |s| s % 2), Some(vec![3, 4, 6]));
        assert_eq!(balanced_partition(&pr, 8, |s| s), None);
    }
}
