//! MadPipe's phase 1 (Shilova, Ch. 7 §7.1): the allocation, by dynamic programming.
//!
//! `P−1` *normal* devices get one contiguous stage each; one *special* device may hold
//! any number of stages. For a target period `T̂`, the DP walks the chain from its end:
//! `T(j, p, t_P, m_P, V)` is the best period for layers `1..j` on `p` normal devices and
//! the special one, which already carries load `t_P` and memory `m_P`, when at least `V`
//! separates the end of `F_j` from the start of `B_j`. A stage `i..j` holds
//! `g = ⌈(V + U(i,j)) / T̂⌉` activations (its 1F1B\* group) on a normal device and, as an
//! underestimate, `g − 1` on the special one; `V' = (V ⊕ U(i,j)) ⊕ C(i−1)`, where `⊕`
//! starts a new group when a sum crosses a multiple of `T̂`. `t_P`, `m_P` and `V` are
//! discretized on 101, 11 and 51 values (§7.3.1; the thesis does not say which way they
//! round): `t_P` up (the conservative side: a period is never underestimated by the
//! grid), `V` down (it is a lower bound), and `m_P` to the nearest value. `m_P` is an
//! estimate already (the special device's activations are underestimated on purpose,
//! and phase 2 finds what really fits); rounded up on 11 values it loses the thesis's
//! own example (T4: 1 + 2 of a memory of 3 becomes 1.2 + 2, over it). Alg. 8 then
//! searches `T̂`.
//!
//! Phase 2, which schedules the allocation with the Ch. 6 ILP, is in `pebble-ilp`.

use pebble_schedule::PipeStage;
use rustc_hash::FxHashMap;

use super::PipeProblem;

/// A MadPipe allocation: stages in chain order, each on a normal device or the special one.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// `(first, last, special)` for each stage, in chain order (0-based layers).
    pub stages: Vec<(usize, usize, bool)>,
    /// The period phase 1 expects: `max(DP(T̂), T̂)` (the thesis's dashed line).
    pub expected_period: f64,
    /// The target `T̂` it was found at.
    pub target: f64,
}

impl Allocation {
    /// The stages with their devices: normal stages on devices `0, 1, …` in chain order,
    /// the special stages all on the device after them.
    pub fn pipe_stages(&self) -> Vec<PipeStage> {
        let special = self.stages.iter().filter(|s| !s.2).count();
        let mut next = 0;
        self.stages
            .iter()
            .map(|&(first, last, is_special)| {
                let device = if is_special {
                    special
                } else {
                    next += 1;
                    next - 1
                };
                PipeStage { first, last, device }
            })
            .collect()
    }

    /// The devices it uses.
    pub fn devices(&self) -> usize {
        let normal = self.stages.iter().filter(|s| !s.2).count();
        normal + usize::from(self.stages.iter().any(|s| s.2))
    }
}

/// The discretization: how many values each continuous state variable takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    /// `t_P`: the special device's load, on `[0, U(1,L)]`.
    pub load: usize,
    /// `m_P`: the special device's memory, on `[0, M]`.
    pub memory: usize,
    /// `V`: the delay between `F_j` and `B_j`, on `[0, U(1,L) + Σ C]`.
    pub delay: usize,
}

impl Default for Grid {
    /// The thesis's 101, 11 and 51 values.
    fn default() -> Grid {
        Grid { load: 101, memory: 11, delay: 51 }
    }
}

/// A DP state on the grid: `(j, p, t_P, m_P, V)`.
type State = (u32, u32, u32, u32, u32);
/// A state's value, the first layer of its last stage, and whether that stage is special.
type Choice = (f64, u32, bool);
/// Stages `(first, last, special)`, in chain order.
pub type Stages = Vec<(usize, usize, bool)>;

struct Dp<'p, 'a> {
    problem: &'p PipeProblem<'a>,
    t_hat: f64,
    prefix: Vec<f64>,
    load_step: f64,
    mem_step: f64,
    delay_step: f64,
    memo: FxHashMap<State, Choice>,
}

impl Dp<'_, '_> {
    fn load(&self, i: usize, j: usize) -> f64 {
        self.prefix[j + 1] - self.prefix[i]
    }

    /// `C` of the boundary before layer `i` (0-based); `C(0) = 0`.
    fn comm_before(&self, i: usize) -> f64 {
        if i == 0 {
            0.0
        } else {
            self.problem.comm(i - 1)
        }
    }

    /// `𝓜(i, j, g)`: [`PipeProblem::stage_memory`].
    fn memory(&self, i: usize, j: usize, g: u64) -> u64 {
        self.problem.stage_memory(i, j, g)
    }

    fn group(&self, v: f64, u: f64) -> u64 {
        (((v + u) / self.t_hat) - 1e-9).ceil().max(1.0) as u64
    }

    fn oplus(&self, x: f64, y: f64) -> f64 {
        let c = |v: f64| ((v / self.t_hat) - 1e-9).ceil();
        if c(x) == c(x + y) {
            x + y
        } else {
            self.t_hat * c(x) + y
        }
    }

    fn nearest(v: f64, step: f64) -> u32 {
        if step <= 0.0 {
            0
        } else {
            (v / step).round().max(0.0) as u32
        }
    }

    fn up(v: f64, step: f64) -> u32 {
        if step <= 0.0 {
            0
        } else {
            ((v / step) - 1e-9).ceil().max(0.0) as u32
        }
    }

    fn down(v: f64, step: f64) -> u32 {
        if step <= 0.0 {
            0
        } else {
            ((v / step) + 1e-9).floor().max(0.0) as u32
        }
    }

    /// `T(j, p, t_P, m_P, V)` on grid indices; `j` counts layers (`0` = none left).
    fn solve(&mut self, j: usize, p: usize, t: u32, m: u32, v: u32) -> f64 {
        if j == 0 {
            return t as f64 * self.load_step;
        }
        let key = (j as u32, p as u32, t, m, v);
        if let Some(&(value, _, _)) = self.memo.get(&key) {
            return value;
        }
        let (tp, mp, vv) = (t as f64 * self.load_step, m as f64 * self.mem_step, v as f64 * self.delay_step);
        let memory = self.problem.memory;
        let fits = |bytes: f64| memory.is_none_or(|cap| bytes <= cap as f64 * (1.0 + 1e-12));
        let mut best = (f64::INFINITY, 0u32, false);
        let last = j - 1;
        if p == 0 {
            let g = self.group(vv, self.load(0, last));
            let mem = mp + self.memory(0, last, g - 1) as f64;
            if fits(mem) {
                best = (self.load(0, last) + tp, 0, true);
            }
        } else {
            for first in (0..=last).rev() {
                let u = self.load(first, last);
                // Both choices cost at least the stage's load, which only grows from here.
                if u >= best.0 {
                    break;
                }
                let c = self.comm_before(first);
                let g = self.group(vv, u);
                let next_v = Self::down(self.oplus(self.oplus(vv, u), c), self.delay_step);
                if fits(self.memory(first, last, g) as f64) {
                    let rest = if first == 0 { tp } else { self.solve(first, p - 1, t, m, next_v) };
                    let value = u.max(c).max(rest);
                    if value < best.0 {
                        best = (value, first as u32, false);
                    }
                }
                let tp2 = tp + u;
                let mp2 = mp + if memory.is_some() { self.memory(first, last, g - 1) as f64 } else { 0.0 };
                if fits(mp2) {
                    let (t2, m2) = (Self::up(tp2, self.load_step), Self::nearest(mp2, self.mem_step));
                    let rest =
                        if first == 0 { t2 as f64 * self.load_step } else { self.solve(first, p, t2, m2, next_v) };
                    let value = (t2 as f64 * self.load_step).max(c).max(rest);
                    if value < best.0 {
                        best = (value, first as u32, true);
                    }
                }
            }
        }
        self.memo.insert(key, best);
        best.0
    }

    /// The stages of the best solution from a state, in chain order.
    fn back_track(
        &mut self,
        mut j: usize,
        mut p: usize,
        mut t: u32,
        mut m: u32,
        mut v: u32,
    ) -> Vec<(usize, usize, bool)> {
        let mut out = Vec::new();
        while j > 0 {
            self.solve(j, p, t, m, v);
            let (_, first, special) = self.memo[&(j as u32, p as u32, t, m, v)];
            let (first, last) = (first as usize, j - 1);
            out.push((first, last, special));
            let u = self.load(first, last);
            let (tp, mp, vv) = (t as f64 * self.load_step, m as f64 * self.mem_step, v as f64 * self.delay_step);
            let g = self.group(vv, u);
            v = Self::down(self.oplus(self.oplus(vv, u), self.comm_before(first)), self.delay_step);
            if special {
                t = Self::up(tp + u, self.load_step);
                if self.problem.memory.is_some() {
                    m = Self::nearest(mp + self.memory(first, last, g - 1) as f64, self.mem_step);
                }
            } else {
                p -= 1;
            }
            j = first;
        }
        out.reverse();
        out
    }
}

/// Schedules a placement without an ILP: 1F1B\*'s construction on its stage chain
/// ([`super::onef1b::pattern`]) at each period where its groups change, keeping the
/// pattern of smallest simulated period that fits the memory. A fast stand-in for phase 2
/// (exact on contiguous placements, where it is Alg. 7), and a fallback when the ILP finds
/// nothing in its time limit. `None` if no pattern fits.
pub fn schedule_placement(problem: &PipeProblem<'_>, stages: &[PipeStage]) -> Option<(pebble_schedule::Schedule, f64)> {
    let mut candidates = super::onef1b::candidates(problem, stages);
    // At most 256 candidates, evenly spread, the smallest and the largest kept.
    if candidates.len() > 256 {
        let n = candidates.len();
        candidates = (0..256).map(|i| candidates[i * (n - 1) / 255]).collect();
        candidates.dedup();
    }
    let mut best: Option<(pebble_schedule::Schedule, f64)> = None;
    for t in candidates {
        if best.as_ref().is_some_and(|b| t >= b.1 * 2.0) {
            break;
        }
        let Some(s) = super::onef1b::pattern(problem, stages, t) else { continue };
        if let Some(r) = super::try_schedule(problem, &s) {
            if best.as_ref().is_none_or(|b| r.period < b.1 - 1e-12) {
                best = Some((s, r.period));
            }
        }
    }
    best
}

/// MadPipe with its phase 2 done by [`schedule_placement`] instead of the ILP: phase 1's
/// allocations (Alg. 8 with the thesis's grid) and the contiguous ones of its class, each
/// scheduled by 1F1B\*'s construction on its stage chain, the fastest kept.
/// `expected_period` is phase 1's (the dashed line).
pub fn without_ilp(problem: &PipeProblem<'_>) -> Result<super::PipeSolution, super::PipeError> {
    let infeasible = |why: &str| super::PipeError::Infeasible { solver: "madpipe", why: why.into() };
    let mut allocations = candidates(problem, 10, Grid::default());
    let first = allocations.first().cloned().ok_or_else(|| infeasible("phase 1 finds no allocation that fits"))?;
    allocations.extend(contiguous_candidates(problem));
    let (schedule, _, _) = best_placement(problem, &allocations).ok_or_else(|| {
        infeasible("phase 1's allocations fit no schedule (the special device's memory was underestimated)")
    })?;
    Ok(super::PipeSolution { schedule, expected_period: Some(first.expected_period) })
}

/// [`without_ilp`] as a solver named `madpipe`, for a caller that does not link
/// `pebble-ilp` (whose `madpipe`, the one registered, adds the ILP). Not registered.
pub struct WithoutIlp;

impl super::PipeSolver for WithoutIlp {
    fn name(&self) -> &'static str {
        "madpipe"
    }
    fn description(&self) -> &'static str {
        "MadPipe, phase 2 by 1F1B*'s construction only (no ILP)"
    }
    fn solve(&self, problem: &PipeProblem<'_>) -> Result<super::PipeSolution, super::PipeError> {
        without_ilp(problem)
    }
}

/// MadPipe-DP(`T̂`): the best allocation's period and stages for the target `t_hat`, or
/// `None` if none fits.
pub fn dp(problem: &PipeProblem<'_>, t_hat: f64, grid: Grid) -> Option<(f64, Stages)> {
    let l = problem.layers;
    let n = l.len();
    let prefix = l.load_prefix();
    let total = prefix[n];
    let comms: f64 = (0..n).map(|j| problem.comm(j)).sum();
    let mut dp = Dp {
        problem,
        t_hat,
        prefix,
        load_step: total / (grid.load.max(2) - 1) as f64,
        mem_step: problem.memory.map_or(0.0, |m| m as f64 / (grid.memory.max(2) - 1) as f64),
        delay_step: (total + comms) / (grid.delay.max(2) - 1) as f64,
        memo: FxHashMap::default(),
    };
    let normal = problem.devices.saturating_sub(1);
    let value = dp.solve(n, normal, 0, 0, 0);
    if value.is_infinite() {
        return None;
    }
    Some((value, dp.back_track(n, normal, 0, 0, 0)))
}

/// Alg. 8: the search on `T̂` (`iterations` steps; the thesis uses 10), returning the
/// allocation with the smallest `max(DP(T̂), T̂)`.
pub fn phase1(problem: &PipeProblem<'_>, iterations: usize, grid: Grid) -> Option<Allocation> {
    candidates(problem, iterations, grid).into_iter().next()
}

/// Every distinct allocation Alg. 8's search met, the one it returns first, the others
/// by their expected period. Phase 1's estimates are estimates (the special device's
/// memory on purpose, every value on a grid), so phase 2 may find a later one faster.
pub fn candidates(problem: &PipeProblem<'_>, iterations: usize, grid: Grid) -> Vec<Allocation> {
    let l = problem.layers;
    let total = l.total_load();
    let comms: f64 = (0..l.len()).map(|j| problem.comm(j)).sum();
    let (mut lo, mut hi) = (total / problem.devices.max(1) as f64, total + comms);
    let mut t_hat = lo;
    let mut found: Vec<Allocation> = Vec::new();
    for _ in 0..iterations.max(1) {
        let (value, stages) = match dp(problem, t_hat, grid) {
            Some(x) => x,
            None => (f64::INFINITY, Vec::new()),
        };
        let expected = value.max(t_hat);
        if !stages.is_empty() {
            match found.iter_mut().find(|a| a.stages == stages) {
                Some(a) if expected < a.expected_period => {
                    *a = Allocation { stages, expected_period: expected, target: t_hat }
                }
                Some(_) => {}
                None => found.push(Allocation { stages, expected_period: expected, target: t_hat }),
            }
        }
        lo = lo.max(value.min(t_hat));
        hi = hi.min(expected);
        t_hat = (lo + hi) / 2.0;
    }
    // Stable: at equal expected periods the first met stays first.
    found.sort_by(|a, b| a.expected_period.total_cmp(&b.expected_period));
    found
}

/// The contiguous allocations of PipeDream's DP (with its memory filter and without),
/// written in MadPipe's class (the last stage on the special device, holding that one
/// stage): phase 1's DP can express them, but its estimates may rank them below an
/// allocation that runs slower, so phase 2 schedules them too.
pub fn contiguous_candidates(problem: &PipeProblem<'_>) -> Vec<Allocation> {
    let mut out: Vec<Allocation> = Vec::new();
    for filter in [true, false] {
        if let Some((bounds, period)) = super::partition::partition(problem, filter) {
            let stages = in_class(problem, &bounds);
            if !out.iter().any(|a| a.stages == stages) {
                out.push(Allocation { stages, expected_period: period, target: period });
            }
        }
    }
    // The least memory per device: where the allocations above ask too much, it may be
    // the only one that fits (issue 48: ResNet-50 on 8 devices of 6 GB).
    if let Some(bounds) = super::partition::least_memory(problem) {
        let stages = in_class(problem, &bounds);
        if !out.iter().any(|a| a.stages == stages) {
            let period = super::partition::period(problem, &bounds);
            out.push(Allocation { stages, expected_period: period, target: period });
        }
    }
    out
}

/// A contiguous partition (each stage's last layer) in MadPipe's class: the last stage on
/// the special device when there is one stage per device.
fn in_class(problem: &PipeProblem<'_>, bounds: &[usize]) -> Vec<(usize, usize, bool)> {
    let mut first = 0;
    bounds
        .iter()
        .enumerate()
        .map(|(i, &last)| {
            let s = (first, last, i + 1 == bounds.len() && bounds.len() == problem.devices);
            first = last + 1;
            s
        })
        .collect()
}

/// Phase 2 without an ILP over a set of allocations (phase 1's [`candidates`], and the
/// [`contiguous_candidates`]): the fastest schedule [`schedule_placement`] finds for any
/// of them, with its simulated period and the allocation's index.
pub fn best_placement(
    problem: &PipeProblem<'_>,
    allocations: &[Allocation],
) -> Option<(pebble_schedule::Schedule, f64, usize)> {
    let mut best: Option<(pebble_schedule::Schedule, f64, usize)> = None;
    for (i, a) in allocations.iter().enumerate() {
        if let Some((s, period)) = schedule_placement(problem, &a.pipe_stages()) {
            if best.as_ref().is_none_or(|b| period < b.1 - 1e-12) {
                best = Some((s, period, i));
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use pebble_graph::Layers;

    fn thesis(costs: &[f64], weights: &[u64], devices: usize, memory: Option<u64>) -> (Layers, usize, Option<u64>) {
        (Layers::from_costs(costs).with_weights(weights.to_vec()), devices, memory)
    }

    fn run(l: &Layers, devices: usize, memory: Option<u64>) -> Allocation {
        phase1(&PipeProblem::thesis(l, devices, memory), 10, Grid::default()).expect("an allocation")
    }

    #[test]
    fn d3_t1_puts_the_ends_on_the_special_device() {
        let (l, p, m) = thesis(&[1.0, 2.0, 1.0], &[0, 0, 0], 2, None);
        let a = run(&l, p, m);
        assert!((a.expected_period - 2.0).abs() < 1e-9, "{a:?}");
        assert_eq!(a.stages, vec![(0, 0, true), (1, 1, false), (2, 2, true)]);
    }

    #[test]
    fn d4_t2_fits_where_no_contiguous_allocation_does() {
        let (l, p, m) = thesis(&[1.0, 2.0, 1.0], &[1, 2, 1], 2, Some(2));
        let a = run(&l, p, m);
        assert!((a.expected_period - 2.0).abs() < 1e-9, "{a:?}");
        assert_eq!(a.stages, vec![(0, 0, true), (1, 1, false), (2, 2, true)]);
    }

    #[test]
    fn d5_t4_one_special_device_gets_four() {
        let (l, p, m) = thesis(&[1.0, 1.0, 1.0, 3.0, 2.0, 2.0, 2.0], &[2, 2, 2, 3, 1, 1, 1], 5, Some(3));
        let a = run(&l, p, m);
        assert!((a.expected_period - 4.0).abs() < 1e-9, "{a:?}");
        let special: Vec<_> = a.stages.iter().filter(|s| s.2).map(|s| (s.0, s.1)).collect();
        let load: f64 = special.iter().map(|&(i, j)| l.load(i, j)).sum();
        assert!(load <= 4.0 + 1e-9);
    }

    #[test]
    fn d6_phase_one_underestimates_the_special_device() {
        // L = 2, u_F = u_B = 1, a_0 = 1 (what layer 1 keeps), the rest 0; P = 2, M = 1.
        let l = Layers::new(vec![1.0; 2], vec![1.0; 2], vec![1, 0], vec![0, 0], vec![0, 0]);
        let a = run(&l, 2, Some(1));
        assert!((a.expected_period - 2.0).abs() < 1e-9, "{a:?}");
        assert_eq!(a.stages, vec![(0, 0, true), (1, 1, false)]);
        // The valid schedule holds a_0 once: the chain runs sequentially, period 4.
        let p = PipeProblem::thesis(&l, 2, Some(1));
        let (_, period) = schedule_placement(&p, &a.pipe_stages()).unwrap();
        assert!((period - 4.0).abs() < 1e-9, "period {period}");
    }

    #[test]
    fn d5_the_placement_is_scheduled_at_its_load() {
        let (l, p, m) = thesis(&[1.0, 1.0, 1.0, 3.0, 2.0, 2.0, 2.0], &[2, 2, 2, 3, 1, 1, 1], 5, Some(3));
        let a = run(&l, p, m);
        let problem = PipeProblem::thesis(&l, p, m);
        let (_, period) = schedule_placement(&problem, &a.pipe_stages()).unwrap();
        assert!((period - 4.0).abs() < 1e-9, "period {period}");
    }
}
