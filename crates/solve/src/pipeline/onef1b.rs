//! 1F1B\*(T) (Shilova, Alg. 6): the memory-optimal 1-periodic pattern of period `T` for a
//! contiguous partition, and the search for the smallest `T` whose pattern fits the
//! memory (Alg. 7, done exactly: the pattern only changes where `T` crosses a sum of
//! consecutive stage loads, so those sums are the only candidates).
//!
//! Communications are stages of their own (the `2P−1` transformation, §4.x): the link
//! after a stage is a pseudo-stage whose forward carries `a_j` and whose backward
//! carries `δ_j`. Groups are built greedily from the last stage, each as long as its
//! load fits in `T`; a stage of group `g` holds `g` activations. The pattern is the
//! digest's constructive form (§3.2): forwards back to back, each group's backwards
//! back to back after its last forward, times wrapped into `[0, T)` with the index shift
//! lowered by one per wrap, shifts normalized so that `B` of the first stage has 0.

use pebble_schedule::{Op, Pass, PipeStage, Schedule};

pub use super::partition::balanced_bounds;
use super::{contiguous_stages, try_schedule, PipeError, PipeProblem, PipeRegistration, PipeSolution, PipeSolver};

/// One resource of the `2P−1` sequence: a compute stage or a link.
#[derive(Debug, Clone, Copy)]
struct Resource {
    uf: f64,
    ub: f64,
    /// The pipeline stage, or `None` for a link.
    stage: Option<usize>,
}

fn resources(problem: &PipeProblem<'_>, stages: &[PipeStage]) -> Vec<Resource> {
    let l = problem.layers;
    let mut out = Vec::new();
    for (s, st) in stages.iter().enumerate() {
        let uf = (st.first..=st.last).map(|i| l.uf[i]).sum();
        let ub = (st.first..=st.last).map(|i| l.ub[i]).sum();
        out.push(Resource { uf, ub, stage: Some(s) });
        let c = problem.comm(st.last) / 2.0;
        if s + 1 < stages.len() && stages[s + 1].device != st.device && c > 0.0 {
            out.push(Resource { uf: c, ub: c, stage: None });
        }
    }
    out
}

/// The load-only period of a placement: the load of its busiest device or link.
pub fn load_period(problem: &PipeProblem<'_>, stages: &[PipeStage]) -> f64 {
    let devices = stages.iter().map(|s| s.device + 1).max().unwrap_or(0);
    let mut load = vec![0.0; devices];
    let mut links = std::collections::HashMap::<(usize, usize), f64>::new();
    for (s, st) in stages.iter().enumerate() {
        load[st.device] += problem.layers.load(st.first, st.last);
        if let Some(next) = stages.get(s + 1) {
            if next.device != st.device {
                let key = (st.device.min(next.device), st.device.max(next.device));
                *links.entry(key).or_default() += problem.comm(st.last);
            }
        }
    }
    load.into_iter().chain(links.into_values()).fold(0.0, f64::max)
}

/// The group of each resource for period `t` (1 = the group of the last stage).
fn groups(res: &[Resource], t: f64) -> Vec<usize> {
    let mut g = vec![0; res.len()];
    let (mut group, mut load) = (1, 0.0);
    for r in (0..res.len()).rev() {
        let u = res[r].uf + res[r].ub;
        if load > 0.0 && load + u > t * (1.0 + 1e-12) {
            group += 1;
            load = 0.0;
        }
        load += u;
        g[r] = group;
    }
    g
}

/// The number of activations each stage of `bounds` holds under 1F1B\*(`t`): its group.
pub fn activations_held(problem: &PipeProblem<'_>, bounds: &[usize], t: f64) -> Vec<usize> {
    let res = resources(problem, &contiguous_stages(bounds));
    let g = groups(&res, t);
    res.iter().zip(g).filter(|(r, _)| r.stage.is_some()).map(|(_, g)| g).collect()
}

/// The smallest period any pattern of `bounds` can have: its largest stage or link load.
pub fn min_period(problem: &PipeProblem<'_>, bounds: &[usize]) -> f64 {
    load_period(problem, &contiguous_stages(bounds))
}

/// 1F1B\*(`t`) on the contiguous partition `bounds` (each stage's last layer, one stage
/// per device), or `None` if `t` is below a stage's or link's load.
pub fn one_f_one_b_star(problem: &PipeProblem<'_>, bounds: &[usize], t: f64) -> Option<Schedule> {
    pattern(problem, &contiguous_stages(bounds), t)
}

/// 1F1B\*(`t`)'s construction on any placement of the stages: each stage (and each link
/// between stages on different devices) one resource of the chain, grouped and timed as
/// Alg. 6 does, each device running its stages' passes in the order of their times in
/// the pattern. On a contiguous placement this is 1F1B\*; where a device holds several
/// stages (MadPipe's special device) their passes may overlap in the pattern, and the
/// simulator serializes them in that order, which always runs (the order follows the
/// pattern's times, a topological order), at a period that may exceed `t`. `None` if `t`
/// is below one stage's or link's load.
pub fn pattern(problem: &PipeProblem<'_>, stages: &[PipeStage], t: f64) -> Option<Schedule> {
    let res = resources(problem, stages);
    if t <= 0.0 || res.iter().any(|r| r.uf + r.ub > t * (1.0 + 1e-12)) {
        return None;
    }
    let g = groups(&res, t);
    let big_g = g[0] as i64;
    // Raw forward starts, back to back.
    let mut tf = vec![0.0; res.len()];
    for r in 1..res.len() {
        tf[r] = tf[r - 1] + res[r - 1].uf;
    }
    // Raw backward starts: after the group's last forward, in reverse.
    let mut tb = vec![0.0; res.len()];
    let mut r = res.len();
    while r > 0 {
        let j = r - 1;
        let mut i = j;
        while i > 0 && g[i - 1] == g[j] {
            i -= 1;
        }
        let mut clock = tf[j] + res[j].uf;
        for m in (i..=j).rev() {
            tb[m] = clock;
            clock += res[m].ub;
        }
        r = i;
    }
    let wrap = |time: f64, shift: i64| {
        let q = (time / t + 1e-9).floor();
        ((time - q * t).max(0.0), shift - q as i64)
    };
    let mut timed: Vec<(f64, usize, Op)> = Vec::new();
    let mut b0 = None;
    let mut stage_before = 0;
    for (m, res_m) in res.iter().enumerate() {
        let (f_at, f_shift) = wrap(tf[m], big_g - 1);
        let (b_at, b_shift) = wrap(tb[m], big_g - g[m] as i64);
        let Some(stage) = res_m.stage else {
            // A link: its forward slot carries the activation of the stage before, its
            // backward slot the gradient of the stage after.
            let (s, next) = (stage_before, stage_before + 1);
            let (from, to) = (stages[s].device, stages[next].device);
            timed.push((f_at, 0, Op::Send { from, to, stage: s, micro: f_shift, grad: false }));
            timed.push((b_at, 1, Op::Send { from: to, to: from, stage: next, micro: b_shift, grad: true }));
            continue;
        };
        stage_before = stage;
        if stage == 0 {
            b0 = Some(b_shift);
        }
        let device = stages[stage].device;
        timed.push((f_at, 0, Op::Run { device, stage, micro: f_shift, pass: Pass::F }));
        timed.push((b_at, 1, Op::Run { device, stage, micro: b_shift, pass: Pass::B }));
    }
    let offset = b0.unwrap_or(0);
    timed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let ops = timed
        .into_iter()
        .map(|(_, _, op)| match op {
            Op::Run { device, stage, micro, pass } => Op::Run { device, stage, micro: micro - offset, pass },
            Op::Send { from, to, stage, micro, grad } => Op::Send { from, to, stage, micro: micro - offset, grad },
            other => other,
        })
        .collect();
    Some(Schedule::pipeline(problem.devices, 1, stages.to_vec(), ops).repeated().with_sends())
}

/// The periods at which 1F1B\*'s groups change on `bounds`: every sum of consecutive
/// stage and link loads at or above the largest one, ascending.
pub fn candidate_periods(problem: &PipeProblem<'_>, bounds: &[usize]) -> Vec<f64> {
    candidates(problem, &contiguous_stages(bounds))
}

/// [`candidate_periods`] of any placement: the sums of consecutive stage and link loads
/// at or above its load-only period.
pub fn candidates(problem: &PipeProblem<'_>, stages: &[PipeStage]) -> Vec<f64> {
    let res = resources(problem, stages);
    let lo = load_period(problem, stages);
    let mut c = vec![lo];
    for i in 0..res.len() {
        let mut sum = 0.0;
        for r in &res[i..] {
            sum += r.uf + r.ub;
            if sum >= lo {
                c.push(sum);
            }
        }
    }
    c.sort_by(f64::total_cmp);
    c.dedup_by(|a, b| (*a - *b).abs() <= 1e-12 * b.abs().max(1.0));
    c
}

/// Alg. 7, exactly: 1F1B\*(`T`) for the smallest candidate `T` whose pattern passes the
/// simulator within the memory, with its simulated period; `None` if none fits.
pub fn best_schedule(problem: &PipeProblem<'_>, bounds: &[usize]) -> Option<(Schedule, f64)> {
    candidate_periods(problem, bounds).into_iter().find_map(|t| {
        let s = one_f_one_b_star(problem, bounds, t)?;
        let report = try_schedule(problem, &s)?;
        Some((s, report.period))
    })
}

/// Alg. 7 as the thesis writes it: `iterations` bisection steps between `U(1,L)/P` and
/// `U(1,L)`, keeping the upper end; returns that `T` (slightly above the exact one).
pub fn bisect_period(problem: &PipeProblem<'_>, bounds: &[usize], iterations: usize) -> Option<f64> {
    let total = problem.layers.total_load() + (0..problem.layers.len()).map(|j| problem.comm(j)).sum::<f64>();
    let (mut lo, mut hi) = (problem.layers.total_load() / problem.devices as f64, total);
    let fits = |t: f64| one_f_one_b_star(problem, bounds, t).and_then(|s| try_schedule(problem, &s)).is_some();
    if !fits(hi) {
        return None;
    }
    for _ in 0..iterations {
        let mid = (lo + hi) / 2.0;
        if fits(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

/// `1f1b`: 1F1B\*(T) with the search on `T` (Alg. 6 and 7) on the balanced contiguous
/// partition; with a micro-batch count, the synchronous 1F1B with a flush instead.
pub struct OneFOneB;

impl PipeSolver for OneFOneB {
    fn name(&self) -> &'static str {
        "1f1b"
    }
    fn description(&self) -> &'static str {
        "1F1B*(T) on the balanced contiguous partition, smallest T that fits (Shilova Alg. 6-7); \
         with --microbatches m, 1F1B with a flush every m (PipeDream-Flush, Narayanan et al. 2021)"
    }
    fn solve(&self, problem: &PipeProblem<'_>) -> Result<PipeSolution, PipeError> {
        let bounds = balanced_bounds(problem);
        if let Some(m) = problem.microbatches {
            return super::flush::one_f_one_b(problem, &bounds, m).map(PipeSolution::from);
        }
        match best_schedule(problem, &bounds) {
            Some((s, _)) => Ok(s.into()),
            None => Err(PipeError::Infeasible {
                solver: self.name(),
                why: "no 1F1B* pattern of the balanced partition fits, even with one activation per stage".into(),
            }),
        }
    }
}

inventory::submit!(PipeRegistration(&OneFOneB));

#[cfg(test)]
mod tests {
    use super::*;
    use pebble_graph::Layers;
    use pebble_sim::simulate_pipeline;

    /// D1 and D2: three stages, (u_F, u_B) = (1,2), (1,1), (1,1).
    fn d1(stored: [u64; 3]) -> Layers {
        Layers::new(vec![1.0; 3], vec![2.0, 1.0, 1.0], stored.to_vec(), vec![0; 3], vec![0; 3])
    }

    #[test]
    fn d1_groups_follow_the_period() {
        let l = d1([0; 3]);
        let p = PipeProblem::new(&l, 3, None, f64::INFINITY);
        let b = [0, 1, 2];
        assert_eq!(activations_held(&p, &b, 3.0), vec![3, 2, 1]);
        assert_eq!(activations_held(&p, &b, 3.5), vec![3, 2, 1]);
        assert_eq!(activations_held(&p, &b, 4.0), vec![2, 1, 1]);
        assert_eq!(activations_held(&p, &b, 6.9), vec![2, 1, 1]);
        assert_eq!(activations_held(&p, &b, 7.0), vec![1, 1, 1]);
        assert!(one_f_one_b_star(&p, &b, 2.9).is_none());
    }

    #[test]
    fn d1_pattern_at_period_four() {
        let l = d1([0; 3]);
        let p = PipeProblem::new(&l, 3, None, f64::INFINITY);
        let s = one_f_one_b_star(&p, &[0, 1, 2], 4.0).unwrap();
        let runs: Vec<_> = s
            .ops
            .iter()
            .filter_map(|o| match *o {
                Op::Run { stage, micro, pass, .. } => Some((stage, pass, micro)),
                _ => None,
            })
            .collect();
        // F starts (0,1,2) with shift 1; B starts (1,0,3) with shifts (0,0,1): in time
        // order (a forward first at a tie), F0 and B1 (at 0), F1 and B0 (1), F2 (2), B2 (3).
        assert_eq!(
            runs,
            vec![(0, Pass::F, 1), (1, Pass::B, 0), (1, Pass::F, 1), (0, Pass::B, 0), (2, Pass::F, 1), (2, Pass::B, 1)]
        );
    }

    #[test]
    fn d2_the_smallest_period_that_fits() {
        let l = d1([10, 5, 1]);
        for (m, t, peaks) in [(30, 3.0, vec![30, 10, 1]), (20, 4.0, vec![20, 5, 1]), (10, 7.0, vec![10, 5, 1])] {
            let p = PipeProblem::new(&l, 3, Some(m), f64::INFINITY);
            let (s, period) = best_schedule(&p, &[0, 1, 2]).unwrap();
            assert!((period - t).abs() < 1e-9, "M = {m}: period {period}, expected {t}");
            let r = simulate_pipeline(&l, &s, &p.sim_config()).unwrap();
            assert_eq!(r.peak_bytes_per_device, peaks, "M = {m}");
            let bisected = bisect_period(&p, &[0, 1, 2], 30).unwrap();
            assert!(bisected >= t - 1e-9 && bisected < t + 1e-6, "M = {m}: bisection {bisected}");
        }
        let p = PipeProblem::new(&l, 3, Some(9), f64::INFINITY);
        assert!(best_schedule(&p, &[0, 1, 2]).is_none());
    }

    #[test]
    fn t6_one_f_one_b_holds_p_minus_i_activations() {
        // Balanced stages, T = one stage's load: every group a single stage.
        for p_count in 2..=6 {
            let l = Layers::new(
                vec![1.0; p_count],
                vec![2.0; p_count],
                vec![1; p_count],
                vec![0; p_count],
                vec![0; p_count],
            );
            let p = PipeProblem::new(&l, p_count, None, f64::INFINITY);
            let bounds: Vec<usize> = (0..p_count).collect();
            let s = one_f_one_b_star(&p, &bounds, 3.0).unwrap();
            let r = simulate_pipeline(&l, &s, &p.sim_config()).unwrap();
            let expected: Vec<u64> = (0..p_count).map(|i| (p_count - i) as u64).collect();
            assert_eq!(r.peak_bytes_per_device, expected);
            assert!((r.period - 3.0).abs() < 1e-9, "period {}", r.period);
            assert!(r.bubble.abs() < 1e-9);
        }
    }

    #[test]
    fn links_are_stages_of_their_own() {
        // Two stages of load 2, a boundary of 1 byte at 1 byte/s: C = 2, so 3 resources
        // of load 2; T = 2 puts each in its own group.
        let l = Layers::new(vec![1.0; 2], vec![1.0; 2], vec![1; 2], vec![1, 0], vec![0; 2]);
        let p = PipeProblem::new(&l, 2, None, 1.0);
        assert_eq!(activations_held(&p, &[0, 1], 2.0), vec![3, 1]);
        let s = one_f_one_b_star(&p, &[0, 1], 2.0).unwrap();
        let r = simulate_pipeline(&l, &s, &p.sim_config()).unwrap();
        assert!((r.period - 2.0).abs() < 1e-9, "period {}", r.period);
        // 3 activations, plus a buffer of a and one of δ on each side.
        assert_eq!(r.peak_bytes_per_device, vec![3 + 2, 1 + 2]);
    }
}
