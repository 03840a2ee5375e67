//! Exhaustive search over offload sets, the weight-offloading solvers' oracle on small
//! chains: every set of choices `(k, d)`, each scheduled by Algorithm 2 at every cut,
//! with and without reusing host copies, judged by the simulator. The best period found
//! bounds the optimum from above (among the schedules Algorithm 2 builds); the MILP
//! bounds it from below, so where the two meet, both are the optimum.
//!
//! It schedules with Algorithm 2 itself, so it cannot judge Algorithm 2; the oracle
//! independent of it is [`super::brute`].

use pebble_graph::Chain;
use pebble_schedule::Schedule;
use pebble_sim::{simulate_chain, SimConfig};

use super::schedule::greedy_schedules;
use super::selection::Choice;
use super::WeightChain;
use crate::{SolveError, SolveOptions};

/// The most layers searched: `4^L` sets.
pub const MAX_LAYERS: usize = 6;

/// The fastest periodic schedule over every offload set within `budget`, with its
/// simulated period; `None` if no set gives one that runs within the budget.
pub fn exhaustive(chain: &Chain, budget: u64, options: &SolveOptions) -> Result<Option<(f64, Schedule)>, SolveError> {
    let wc = WeightChain::from_chain(chain)?;
    let l = wc.len();
    if l > MAX_LAYERS {
        let why = format!("the exhaustive search takes at most {MAX_LAYERS} layers, the chain has {l}");
        return Err(SolveError::Unsupported { solver: "weight-offload", why });
    }
    let config = SimConfig { budget: Some(budget), ..options.sim_config() };
    let mut best: Option<(f64, Schedule)> = None;
    for mask in 0..(1usize << (2 * l)) {
        let chosen: Vec<Choice> = (0..2 * l)
            .filter(|b| mask >> b & 1 == 1)
            .map(|b| Choice { layer: b / 2 + 1, after_forward: b % 2 == 0 })
            .collect();
        if chosen.iter().any(|c| wc.weight(c.layer) == 0) {
            continue;
        }
        for discount in [true, false] {
            for (_, s) in greedy_schedules(&wc, &chosen, budget, &options.machine, discount, usize::MAX) {
                if let Ok(r) = simulate_chain(chain, &s, &config) {
                    if best.as_ref().is_none_or(|b| r.makespan < b.0) {
                        best = Some((r.makespan, s));
                    }
                }
            }
        }
    }
    Ok(best)
}
