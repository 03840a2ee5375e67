//! The weight-offloading solvers: `weight-offload` (Algorithms 1 and 2),
//! `weight-offload-noreuse` (the paper's Greedy*) and `l2l`. Each returns a periodic
//! schedule, the best the simulator finds among the cuts the scheduler planned.

use pebble_schedule::Schedule;

use super::schedule::{greedy_schedules, l2l_schedule};
use super::selection::{select, SelectionOptions};
use super::WeightChain;
use crate::{Problem, SolveError, SolveOptions, Solver};

/// How many of the scheduler's best-planned cuts the simulator judges.
const JUDGED: usize = 8;

/// The fastest of `candidates` that the simulator runs within `budget`.
fn best_simulated(
    chain: &pebble_graph::Chain,
    candidates: Vec<Schedule>,
    budget: u64,
    options: &SolveOptions,
    solver: &str,
) -> Result<Schedule, SolveError> {
    crate::fastest_within(crate::Problem::Chain(chain), candidates, budget, options)
        .map(|s| s.with_solver(solver))
        .map_err(|last| SolveError::Infeasible {
            budget,
            reason: match last {
                Some(e) => format!("no cut of the weight schedule runs within the budget ({e})"),
                None => "no cut of the weight schedule fits the budget".into(),
            },
        })
}

/// Weight buffers kept free by the selection, as tried: Algorithm 1 makes every
/// operation fit, but a prefetch overlapping the operation before its consumer needs
/// room beside it; selecting within `M − r·max|w|` leaves that room (our addition; `r =
/// 0` is the paper's selection).
const RESERVES: [u64; 3] = [0, 1, 2];

fn greedy(
    problem: Problem<'_>,
    budget: u64,
    options: &SolveOptions,
    discount: bool,
    name: &'static str,
) -> Result<Schedule, SolveError> {
    let chain = problem.chain_for(name)?;
    let wc = WeightChain::from_chain(chain)?;
    let largest = wc.w.iter().copied().max().unwrap_or(0);
    let mut candidates = Vec::new();
    let mut first_error = None;
    for r in RESERVES {
        let Some(memory) = budget.checked_sub(r * largest) else { continue };
        match select(&wc, memory, SelectionOptions { discount, ..SelectionOptions::default() }) {
            Ok(selected) => {
                let chosen: Vec<_> = selected.into_iter().map(|s| s.choice).collect();
                let found = greedy_schedules(&wc, &chosen, budget, &options.machine, discount, JUDGED);
                candidates.extend(found.into_iter().map(|(_, s)| s));
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if candidates.is_empty() {
        if let Some(e) = first_error {
            return Err(e);
        }
    }
    best_simulated(chain, candidates, budget, options, name)
}

/// `weight-offload`: Algorithm 1's selection with the discount, Algorithm 2's cyclic
/// schedule at every cut (Beaumont, Eyraud-Dubois, Shilova, Zhao 2022, §5).
pub struct WeightOffload;

impl Solver for WeightOffload {
    fn name(&self) -> &'static str {
        "weight-offload"
    }

    fn description(&self) -> &'static str {
        "weight offloading: greedy selection and cyclic scheduling (Beaumont et al. 2022)"
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        greedy(problem, budget, options, true, self.name())
    }
}

/// `weight-offload-noreuse`: the paper's Greedy* (Table 1), which offloads a weight every
/// time it leaves the device: no discount in the selection, no upload, no drop.
pub struct WeightOffloadNoReuse;

impl Solver for WeightOffloadNoReuse {
    fn name(&self) -> &'static str {
        "weight-offload-noreuse"
    }

    fn description(&self) -> &'static str {
        "weight offloading without reuse of host copies (Greedy*, Beaumont et al. 2022)"
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        greedy(problem, budget, options, false, self.name())
    }
}

/// `l2l`: the layer-to-layer baseline (Pudipeddi et al. 2020) as Beaumont et al. 2022
/// model it: every layer's weights on a host parameter server, only the running layer's
/// on the device, each fetched synchronously before its forward and its backward.
pub struct L2l;

impl Solver for L2l {
    fn name(&self) -> &'static str {
        "l2l"
    }

    fn description(&self) -> &'static str {
        "L2L: only the running layer's weights on the device (Pudipeddi et al. 2020)"
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let chain = problem.chain_for(self.name())?;
        let wc = WeightChain::from_chain(chain)?;
        best_simulated(chain, vec![l2l_schedule(&wc)], budget, options, self.name())
    }
}

inventory::submit!(crate::Registration(&WeightOffload));
inventory::submit!(crate::Registration(&WeightOffloadNoReuse));
inventory::submit!(crate::Registration(&L2l));

#[cfg(test)]
mod tests {
    use pebble_graph::Chain;
    use pebble_machine::Machine;
    use pebble_schedule::{ForwardMode, Op};
    use pebble_sim::{simulate_chain, SimConfig};
    use pebble_testkit::{weighty_chain, Rng};

    use super::*;

    fn store_all(l: usize) -> Schedule {
        let mut ops: Vec<Op> = (0..l).map(|s| Op::Forward { stage: s, mode: ForwardMode::KeepAll }).collect();
        ops.extend((0..=l).rev().map(|s| Op::Backward { stage: s }));
        Schedule::new(pebble_schedule::View::Chain, ops)
    }

    fn opts(bandwidth: f64) -> SolveOptions {
        SolveOptions { machine: Machine::default().with_bandwidth(bandwidth), ..SolveOptions::default() }
    }

    #[test]
    fn the_instance_counts_memory_as_the_simulator_does() {
        let mut rng = Rng::new(12);
        for _ in 0..30 {
            let l = rng.range(1, 8) as usize;
            let mut chain = weighty_chain(&mut rng, l);
            chain.static_bytes += rng.range(0, 10);
            let wc = WeightChain::from_chain(&chain).unwrap();
            let most = wc.ops().into_iter().map(|o| wc.op_memory(o, super::super::Accounting::Consistent)).max();
            let expected = wc.total_weights() + most.unwrap();
            for s in [store_all(l), store_all(l).repeated()] {
                let r = simulate_chain(&chain, &s, &SimConfig::default()).unwrap();
                assert_eq!(r.peak_bytes, expected, "{chain:?}");
            }
        }
    }

    #[test]
    fn without_memory_pressure_nothing_moves() {
        let mut rng = Rng::new(5);
        let chain = weighty_chain(&mut rng, 6);
        let peak = simulate_chain(&chain, &store_all(6), &SimConfig::default()).unwrap().peak_bytes;
        let s = crate::plan(&WeightOffload, Problem::Chain(&chain), peak, &opts(10.0)).unwrap().schedule;
        assert!(s.ops.iter().all(|o| o.is_compute()), "{}", s.to_notation());
        let r = simulate_chain(&chain, &s, &SimConfig::on(Machine::default().with_bandwidth(10.0))).unwrap();
        let wc = WeightChain::from_chain(&chain).unwrap();
        assert_eq!(r.makespan, wc.compute_time());
    }

    /// L2L's closed form on a homogeneous chain: every forward and backward waits for its
    /// layer's weights, `|w|/β` each, and the offloads hide behind the compute.
    #[test]
    fn l2l_pays_two_transfers_per_layer() {
        let mut chain = Chain::homogeneous(4, 1.0, 2.0, 1);
        chain.w = Some(vec![10; 4]);
        chain.static_bytes = 40;
        let o = opts(10.0);
        let s = crate::plan(&L2l, Problem::Chain(&chain), 1000, &o).unwrap().schedule;
        let r = simulate_chain(&chain, &s, &o.sim_config()).unwrap();
        assert_eq!(r.compute_time, 14.0);
        // Eight prefetches in the way, and the offload of w_1 after B_1 before the next
        // period's first prefetch can start.
        assert!((r.makespan - (14.0 + 8.0 + 1.0)).abs() < 1e-9, "{}", r.makespan);
        // One layer's weights at a time, two while one leaves and the next arrives.
        let wc = WeightChain::from_chain(&chain).unwrap();
        let most = wc.ops().into_iter().map(|o| wc.op_memory(o, super::super::Accounting::Consistent)).max().unwrap();
        assert!(r.peak_bytes > most + 10 && r.peak_bytes <= most + 20, "{} vs {most}", r.peak_bytes);
    }

    /// Every weight schedule runs in the simulator within its budget, and no faster than
    /// its compute; offloading with the discount is never slower than L2L here.
    #[test]
    fn every_weight_schedule_passes_the_simulator() {
        let mut rng = Rng::new(2022);
        let (mut solved, mut tight) = (0, 0);
        for case in 0..40 {
            let l = rng.range(2, 9) as usize;
            let chain = weighty_chain(&mut rng, l);
            let wc = WeightChain::from_chain(&chain).unwrap();
            let full = simulate_chain(&chain, &store_all(l), &SimConfig::default()).unwrap().peak_bytes;
            let alone = wc
                .ops()
                .into_iter()
                .map(|o| wc.op_memory(o, super::super::Accounting::Consistent) + wc.weight(o.layer()))
                .max()
                .unwrap();
            let budget = alone + (full - alone) * rng.range(0, 10) / 10;
            let o = opts([2.0, 10.0, 50.0][case % 3]);
            let config = SimConfig { budget: Some(budget), ..o.sim_config() };
            let mut times = Vec::new();
            for solver in [&WeightOffload as &dyn Solver, &WeightOffloadNoReuse, &L2l] {
                match crate::plan(solver, Problem::Chain(&chain), budget, &o) {
                    Ok(plan) => {
                        let s = plan.schedule;
                        assert!(s.periodic);
                        let r = simulate_chain(&chain, &s, &config)
                            .unwrap_or_else(|e| panic!("{} at {budget}: {e}\n{}", solver.name(), s.to_notation()));
                        assert!(r.peak_bytes <= budget);
                        assert!(r.makespan >= wc.compute_time() - 1e-9);
                        times.push(r.makespan);
                        solved += 1;
                        tight += usize::from(budget < full);
                    }
                    Err(crate::PlanError::Solve(SolveError::Infeasible { .. })) => times.push(f64::INFINITY),
                    Err(e) => panic!("{}: {e}", solver.name()),
                }
            }
            assert!(times[0] <= times[2] + 1e-9, "weight-offload {} vs l2l {} at {budget}", times[0], times[2]);
        }
        assert!(solved >= 60 && tight >= 40, "{solved} solved, {tight} under store-all's peak");
    }
}

#[cfg(test)]
mod planned {
    use pebble_machine::Machine;
    use pebble_sim::{simulate_chain, SimConfig};
    use pebble_testkit::{weighty_chain, Rng};

    use super::super::schedule::greedy_schedules;
    use super::super::selection::{select, SelectionOptions};
    use super::*;

    /// The scheduler's own period bounds the simulator's, and is most often equal to it,
    /// for every cut it plans that the simulator runs: the two share the issue rule
    /// (transfers between compute ops) and the memory model; the scheduler's window (links
    /// idle when `B_L` starts, the cut's prefetches after the forward pass) is the
    /// stricter.
    #[test]
    fn the_planned_period_is_the_simulated_one() {
        let mut rng = Rng::new(31);
        let (mut checked, mut differ) = (0, Vec::new());
        for case in 0..30 {
            let l = rng.range(3, 12) as usize;
            let chain = weighty_chain(&mut rng, l);
            let wc = WeightChain::from_chain(&chain).unwrap();
            let full = wc.total_weights() + wc.mb.iter().chain(&wc.mf).max().unwrap();
            let budget = full * rng.range(60, 95) / 100;
            let beta = [5.0, 20.0, 80.0][case % 3];
            let machine = Machine::default().with_bandwidth(beta);
            let config = SimConfig { budget: Some(budget), ..SimConfig::on(machine) };
            let Ok(selected) = select(&wc, budget, SelectionOptions::default()) else { continue };
            let chosen: Vec<_> = selected.into_iter().map(|s| s.choice).collect();
            for (planned, s) in greedy_schedules(&wc, &chosen, budget, &machine, true, 4) {
                if let Ok(r) = simulate_chain(&chain, &s, &config) {
                    checked += 1;
                    assert!(
                        r.makespan <= planned * (1.0 + 1e-9),
                        "case {case}: sim {} above planned {planned}",
                        r.makespan
                    );
                    if r.makespan < planned * (1.0 - 1e-9) {
                        differ.push((case, planned, r.makespan));
                    }
                }
            }
        }
        assert!(checked >= 30, "{checked}");
        assert!(differ.len() * 5 <= checked, "{} of {checked} below plan: {differ:?}", differ.len());
    }
}
