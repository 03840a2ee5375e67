//! Weight offloading when the links are slow (issue 48, Deliver 5): on tiny instances,
//! the true optimum (a brute force over schedules, `pebble_solve::weights::brute`, which
//! shares nothing with Algorithm 2 or the MILP but the instance's arrays), beside the MILP
//! bound (`weight-offload-bound`) and Algorithm 1 + 2 (`weight-offload`, the best of
//! Greedy and Greedy*), at three link speeds: a weight's transfer against an op's time.
//!
//! ```sh
//! cargo run --release -p pebble-ilp --example weights_low_bandwidth
//! ```
//!
//! Each level: 100 seeded instances (seed 48) of 2 layers (3 at the fast level), memory
//! between the least that runs (each op beside its own layer's weights) and all of them.
//! It prints, per level, how often the optimum needs idle time, the greedy's gap to the
//! optimum (mean, largest, how often it is optimal) and the bound's (mean, largest, how
//! often it is tight); instances whose optimum is past `Σu + SLACK` are counted apart.
//! Then the same for the ordered bound (`pebble_ilp::weight_order_bound`, which orders
//! each link's transfers around the ops that wait for them; it asserts it stays below the
//! optimum too), the better of the two bounds, how far it is above the MILP's (a share of
//! the optimum), and the greedy's gap to it: what the greedy's gap is known to be at most
//! where no optimum is known.

use pebble_ilp::weight_bound::{weight_offload_bound, WeightBoundOptions};
use pebble_ilp::weight_order_bound::{ordered_bound, OrderedBoundOptions};
use pebble_sim::Machine;
use pebble_solve::weights::brute::Instance;
use pebble_solve::weights::schedule::greedy_schedules;
use pebble_solve::weights::selection::{select, SelectionOptions};
use pebble_solve::weights::{Accounting, WeightChain};
use pebble_testkit::Rng;

/// The most idle time searched above `Σu` (the brute force is exponential in it).
const SLACK: u64 = 12;

/// A link speed: a weight's transfer time and an op's, in time units.
struct Level {
    name: &'static str,
    transfer: (u64, u64),
    op: (u64, u64),
    layers: usize,
}

const LEVELS: [Level; 3] = [
    Level { name: "fast links: transfer 1-2, op 1-3", transfer: (1, 3), op: (1, 4), layers: 3 },
    Level { name: "even: transfer 2-3, op 1-2", transfer: (2, 4), op: (1, 3), layers: 2 },
    Level { name: "slow links: transfer 3-5, op 1-2", transfer: (3, 6), op: (1, 3), layers: 2 },
];

fn instance(rng: &mut Rng, level: &Level) -> Instance {
    let l = level.layers;
    let beta = rng.range(1, 3);
    let w = (0..l).map(|_| beta * rng.range(level.transfer.0, level.transfer.1)).collect::<Vec<u64>>();
    let a = (0..=l).map(|_| rng.range(0, 3)).collect::<Vec<u64>>();
    let uf: Vec<u64> = (0..l).map(|_| rng.range(level.op.0, level.op.1)).collect();
    let ub = uf.iter().map(|f| f + rng.range(0, 2)).collect();
    let mut inst = Instance { w, a, uf, ub, beta, memory: 0 };
    // Eq. (1) less the layer's own weights: F_i holds a^0 … a^i, B_i also δw_i.
    let acts = |i: usize| inst.a[..=i].iter().sum::<u64>();
    let run: Vec<(usize, u64)> = (1..=l).flat_map(|i| [(i, acts(i)), (i, acts(i) + inst.w[i - 1])]).collect();
    let total: u64 = inst.w.iter().sum();
    let alone = run.iter().map(|&(i, m)| m + inst.w[i - 1]).max().unwrap();
    let full = run.iter().map(|&(_, m)| m + total).max().unwrap();
    inst.memory = alone + (full - alone) * rng.range(0, 8) / 10;
    inst
}

fn chain(inst: &Instance) -> WeightChain {
    let f = |v: &[u64]| v.iter().map(|&x| x as f64).collect();
    WeightChain::new(inst.w.clone(), inst.a.clone(), f(&inst.uf), f(&inst.ub)).unwrap()
}

/// Algorithm 1, then Algorithm 2 at every cut, with and without the discount: the best
/// period it plans, `None` where it finds none.
fn greedy(inst: &Instance) -> Option<f64> {
    let wc = chain(inst);
    let machine = Machine::default().with_bandwidth(inst.beta as f64);
    [true, false]
        .into_iter()
        .filter_map(|discount| {
            let options = SelectionOptions { discount, ..SelectionOptions::default() };
            let chosen: Vec<_> = select(&wc, inst.memory, options).ok()?.into_iter().map(|s| s.choice).collect();
            greedy_schedules(&wc, &chosen, inst.memory, &machine, discount, usize::MAX).first().map(|p| p.0)
        })
        .reduce(f64::min)
}

/// What one level found.
#[derive(Default)]
struct Tally {
    known: usize,
    beyond: usize,
    idle: usize,
    greedy_none: usize,
    greedy_optimal: usize,
    greedy_gaps: Vec<f64>,
    bound_tight: usize,
    bound_gaps: Vec<f64>,
    ordered_tight: usize,
    ordered_gaps: Vec<f64>,
    /// The better of the two bounds.
    best_gaps: Vec<f64>,
    /// How much the better bound is above the MILP's, as a share of the optimum.
    gains: Vec<f64>,
    /// Greedy's gap to the better bound, where it plans.
    greedy_to_bound: Vec<f64>,
}

fn stats(v: &[f64]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let max = v.iter().copied().fold(0.0, f64::max);
    format!("mean {:.1}%, largest {:.1}%", 100.0 * mean, 100.0 * max)
}

fn main() {
    let mut rng = Rng::new(48);
    let options =
        WeightBoundOptions { accounting: Accounting::Consistent, printed_sign_6: false, time_limit: Some(60.0) };
    let ordered = OrderedBoundOptions { integral_ops: usize::MAX, ..OrderedBoundOptions::default() };
    for level in &LEVELS {
        let mut t = Tally::default();
        for _ in 0..100 {
            let inst = instance(&mut rng, level);
            let sum: u64 = inst.uf.iter().chain(&inst.ub).sum();
            let Some(opt) = inst.optimum(sum + SLACK) else {
                t.beyond += 1;
                continue;
            };
            let opt = opt as f64;
            t.known += 1;
            t.idle += usize::from(opt > sum as f64);
            match greedy(&inst) {
                Some(g) => {
                    assert!(g >= opt - 1e-9, "greedy {g} below the optimum {opt}: {inst:?}");
                    t.greedy_optimal += usize::from(g <= opt + 1e-9);
                    t.greedy_gaps.push(g / opt - 1.0);
                }
                None => t.greedy_none += 1,
            }
            let b =
                weight_offload_bound(&chain(&inst), inst.memory, inst.beta as f64, &options).expect("the MILP runs");
            assert!(b.time <= opt + 1e-6, "bound {} above the optimum {opt}: {inst:?}", b.time);
            t.bound_tight += usize::from(b.time >= opt - 1e-6);
            t.bound_gaps.push(1.0 - b.time / opt);
            let o = ordered_bound(&chain(&inst), inst.memory, inst.beta as f64, inst.beta as f64, &ordered)
                .expect("the ordered bound runs");
            assert!(o.time <= opt + 1e-6, "ordered bound {} above the optimum {opt}: {inst:?}", o.time);
            t.ordered_tight += usize::from(o.time >= opt * (1.0 - 1e-6));
            t.ordered_gaps.push(1.0 - o.time / opt);
            let best = o.time.max(b.time);
            t.best_gaps.push(1.0 - best / opt);
            t.gains.push((best - b.time) / opt);
            if let Some(g) = greedy(&inst) {
                t.greedy_to_bound.push(g / best - 1.0);
            }
        }
        println!("{}:", level.name);
        println!("  optimum known on {} (needs idle time on {}), past Σu + {SLACK} on {}", t.known, t.idle, t.beyond);
        println!(
            "  greedy: optimal on {}, no plan on {}; above the optimum {}",
            t.greedy_optimal,
            t.greedy_none,
            stats(&t.greedy_gaps)
        );
        println!("  bound: tight on {}; below the optimum {}", t.bound_tight, stats(&t.bound_gaps));
        println!("  ordered bound: tight on {}; below the optimum {}", t.ordered_tight, stats(&t.ordered_gaps));
        println!("  better of the two: below the optimum {}; above the MILP {}", stats(&t.best_gaps), stats(&t.gains));
        println!("  greedy above the better bound: {}", stats(&t.greedy_to_bound));
    }
}
