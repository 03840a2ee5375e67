//! The H-ILP (`pebble_ilp::hilp`) against an exhaustive search over the same space, and
//! each constraint family on a hand-made case.
//!
//! The oracle, [`brute`], is a dynamic program over the H-ILP's stages: stage `t` runs
//! cNode `t` in one of its options and any earlier forward cNode again, in index order,
//! each in one of its options; after a stage every tensor it touched is either kept into
//! the next stage or freed right after its last use in the stage (an untouched tensor
//! stays); a phantom lives from its forward to its backward, one option at a time. The
//! memory of a node is what the H-ILP's rows (3.27)–(3.33) count: what is resident, what
//! it creates, its phantom and its option's overhead; its frees count until it ends,
//! except, with correction terms (3.34), at a substep after an input's last use. It was
//! written from the module's documentation, not from its code.

use std::collections::HashMap;

use pebble_ilp::hgraph::{HGraph, HKind, HNode, HOption, Substep};
use pebble_ilp::hilp::{solve, solve_from, HSolution};
use pebble_ilp::{Budgets, GridAnswers, IlpError};
use pebble_testkit::Rng;

/// Who makes each aNode (one producer: a forward, the loss or a backward).
fn producer(h: &HGraph, d: usize) -> usize {
    h.nodes.iter().position(|n| n.outputs.contains(&d)).expect("every aNode has a producer here")
}

fn is_forward(n: &HNode) -> bool {
    matches!(n.kind, HKind::Forward { .. })
}

fn backward_of(h: &HGraph, f: usize) -> Option<usize> {
    let HKind::Forward { pair } = h.nodes[f].kind else { return None };
    h.nodes.iter().position(|n| n.kind == HKind::Backward { pair })
}

fn forward_of(h: &HGraph, b: usize) -> usize {
    let HKind::Backward { pair } = h.nodes[b].kind else { panic!("not a backward") };
    h.nodes.iter().position(|n| n.kind == HKind::Forward { pair }).expect("paired")
}

/// Whether option `o` of forward `f` leaves a phantom its backward needs.
fn phantom(h: &HGraph, f: usize, o: usize) -> u64 {
    match backward_of(h, f) {
        Some(b) if o < h.nodes[b].options.len() => h.nodes[f].options[o].phantom,
        _ => 0,
    }
}

/// What the search reads of the graph, computed once.
struct Info {
    producer: Vec<usize>,
    /// Made by a node that runs once (a gradient): its lifetime is fixed.
    fixed: Vec<bool>,
    last_reader: Vec<Option<usize>>,
    /// The last stage in which each forward may usefully run again: after it, nobody reads
    /// its outputs and its backward is done.
    useful_until: Vec<usize>,
    /// The last stage in which each aNode may be read (a forward reader may run again).
    read_until: Vec<Option<usize>>,
}

impl Info {
    fn new(h: &HGraph) -> Info {
        let n = h.nodes.len();
        let na = h.sizes.len();
        let producer: Vec<usize> = (0..na).map(|d| producer(h, d)).collect();
        let fixed = (0..na).map(|d| !is_forward(&h.nodes[producer[d]])).collect();
        let reads = |k: usize, d: usize| {
            h.nodes[k].inputs.contains(&d) || h.nodes[k].options.iter().any(|o| o.reads.contains(&d))
        };
        let last_reader = (0..na).map(|d| (0..n).filter(|&k| reads(k, d)).max()).collect();
        let mut useful_until: Vec<usize> = (0..n).collect();
        for k in (0..n).rev() {
            if !is_forward(&h.nodes[k]) {
                continue;
            }
            let mut l = backward_of(h, k).unwrap_or(k);
            for &d in &h.nodes[k].outputs {
                for u in (0..n).filter(|&u| reads(u, d)) {
                    l = l.max(useful_until[u]);
                }
            }
            useful_until[k] = l;
        }
        let read_until = (0..na).map(|d| (0..n).filter(|&k| reads(k, d)).map(|k| useful_until[k]).max()).collect();
        Info { producer, fixed, last_reader, useful_until, read_until }
    }
}

/// A state between stages: the recomputable tensors present, and each forward's kept
/// phantom option.
#[derive(Clone, PartialEq, Eq, Hash)]
struct State {
    present: u64,
    phantom: Vec<Option<usize>>,
}

/// The least total time of an H-ILP schedule of `h` within `budget` (and `save` right
/// after the loss), by exhaustive search; `None` if there is none.
fn brute(h: &HGraph, budget: u64, save: Option<u64>) -> Option<f64> {
    let n = h.nodes.len();
    assert!(h.sizes.len() <= 64);
    let start = State { present: 0, phantom: vec![None; n] };
    let mut memo = HashMap::new();
    let info = Info::new(h);
    best(h, &info, budget, save, 0, &start, &mut memo)
}

fn best(
    h: &HGraph,
    info: &Info,
    budget: u64,
    save: Option<u64>,
    t: usize,
    state: &State,
    memo: &mut HashMap<(usize, State), Option<f64>>,
) -> Option<f64> {
    let n = h.nodes.len();
    if t == n {
        return (state.present == 0 && state.phantom.iter().all(Option::is_none)).then_some(0.0);
    }
    if let Some(&v) = memo.get(&(t, state.clone())) {
        return v;
    }
    // Every choice of reruns (forward k < t: not at all, or in one of its options) and of
    // node t's option.
    let mut choices: Vec<Vec<(usize, usize)>> = vec![Vec::new()];
    for k in 0..t {
        if !is_forward(&h.nodes[k]) || info.useful_until[k] < t {
            continue;
        }
        let mut next = Vec::new();
        for c in &choices {
            next.push(c.clone());
            for o in 0..h.nodes[k].options.len() {
                let mut c = c.clone();
                c.push((k, o));
                next.push(c);
            }
        }
        choices = next;
    }
    let mut result: Option<f64> = None;
    for c in &choices {
        for o in 0..h.nodes[t].options.len() {
            let mut runs = c.clone();
            runs.push((t, o));
            for (cost, next) in stage(h, info, budget, save, t, state, &runs) {
                if let Some(rest) = best(h, info, budget, save, t + 1, &next, memo) {
                    let total = cost + rest;
                    if result.is_none_or(|r| total < r) {
                        result = Some(total);
                    }
                }
            }
        }
    }
    memo.insert((t, state.clone()), result);
    result
}

/// Runs `runs` (in index order) as stage `t` from `state`: for each choice of which
/// touched tensors to keep, the stage's time and the next state, if it fits.
fn stage(
    h: &HGraph,
    info: &Info,
    budget: u64,
    save: Option<u64>,
    t: usize,
    state: &State,
    runs: &[(usize, usize)],
) -> Vec<(f64, State)> {
    let n = h.nodes.len();
    let na = h.sizes.len();
    // Gradients (made by nodes that run once) live from their producer to their last
    // reader, whatever the schedule.
    let fixed = |d: usize| info.fixed[d];
    let last_reader = |d: usize| info.last_reader[d];
    let producer = |_: &HGraph, d: usize| info.producer[d];
    let fixed_present = |d: usize| info.producer[d] < t && last_reader(d).is_none_or(|e| t <= e);
    let touches = |k: usize, d: usize, o: usize| {
        h.nodes[k].inputs.contains(&d) || h.nodes[k].outputs.contains(&d) || h.nodes[k].options[o].reads.contains(&d)
    };
    let touched: Vec<usize> = (0..na).filter(|&d| !fixed(d) && runs.iter().any(|&(k, o)| touches(k, d, o))).collect();
    // Keeping a tensor nobody reads after this stage only costs memory.
    let keepable: Vec<usize> = touched.iter().copied().filter(|&d| info.read_until[d].is_some_and(|r| r > t)).collect();
    let mut out = Vec::new();
    'keep: for mask in 0..(1u64 << keepable.len()) {
        let keep = |d: usize| keepable.iter().position(|&x| x == d).is_some_and(|i| mask >> i & 1 == 1);
        let last_touch = |d: usize| runs.iter().filter(|&&(k, o)| touches(k, d, o)).map(|&(k, _)| k).max();
        let mut alive = state.present;
        let mut u: u64 = (0..na).filter(|&d| alive >> d & 1 == 1).map(|d| h.sizes[d]).sum::<u64>()
            + (0..na).filter(|&d| fixed(d) && fixed_present(d)).map(|d| h.sizes[d]).sum::<u64>()
            + (0..n).filter_map(|f| state.phantom[f].map(|o| phantom(h, f, o))).sum::<u64>();
        let mut cost = 0.0;
        for &(k, o) in runs {
            let node = &h.nodes[k];
            let opt = &node.options[o];
            cost += opt.time;
            // Dependencies: each recomputable input present.
            for &d in node.inputs.iter().chain(&opt.reads) {
                if !fixed(d) && alive >> d & 1 == 0 && !node.outputs.contains(&d) {
                    continue 'keep;
                }
            }
            let mut peak = u;
            for &d in &node.outputs {
                if fixed(d) {
                    if producer(h, d) == k && t == k {
                        peak += h.sizes[d];
                    }
                } else if alive >> d & 1 == 0 {
                    peak += h.sizes[d];
                    alive |= 1 << d;
                }
            }
            if is_forward(node) {
                peak += phantom(h, k, o);
            }
            // What k frees after it runs.
            let mut freed: Vec<usize> = touched
                .iter()
                .copied()
                .filter(|&d| last_touch(d) == Some(k) && alive >> d & 1 == 1 && !keep(d))
                .collect();
            freed.extend((0..na).filter(|&d| fixed(d) && last_reader(d) == Some(k) && t == k));
            // Its option's overhead, or with correction terms each substep's, less what
            // it has done with and frees.
            let fits = if opt.substeps.is_empty() {
                peak + opt.overhead <= budget
            } else {
                opt.substeps.iter().all(|s| {
                    let early: u64 = s.dead.iter().filter(|d| freed.contains(d)).map(|&d| h.sizes[d]).sum();
                    peak as i64 + s.overhead - early as i64 <= budget as i64
                })
            };
            if !fits {
                continue 'keep;
            }
            let mut after = peak;
            for &d in &freed {
                after -= h.sizes[d];
                alive &= !(1 << d);
            }
            if let HKind::Backward { .. } = node.kind {
                let f = forward_of(h, k);
                for o2 in 0..node.options.len() {
                    let p = phantom(h, f, o2);
                    let ran = runs.contains(&(f, o2));
                    after -= p * (u64::from(ran) + u64::from(state.phantom[f] == Some(o2)));
                }
            }
            u = after;
            if node.kind == HKind::Loss && save.is_some_and(|s| u > s) {
                continue 'keep;
            }
        }
        // Phantoms into the next stage.
        let mut phantom_next = vec![None; n];
        for f in (0..n).filter(|&f| is_forward(&h.nodes[f])) {
            let Some(b) = backward_of(h, f) else { continue };
            let mut kept = Vec::new();
            for o in 0..h.nodes[b].options.len() {
                if phantom(h, f, o) == 0 {
                    continue;
                }
                let s = i64::from(state.phantom[f] == Some(o));
                let fo = i64::from(runs.contains(&(f, o)));
                let bo = i64::from(runs.contains(&(b, o)));
                if bo > s + fo {
                    continue 'keep;
                }
                if s + fo - bo > 0 {
                    if t + 1 > b {
                        continue 'keep;
                    }
                    kept.push(o);
                }
            }
            if kept.len() > 1 {
                continue 'keep;
            }
            phantom_next[f] = kept.first().copied();
        }
        // A backward whose phantom option is zero needs nothing; one with a phantom needs
        // it kept or made in this stage (checked above).
        out.push((cost, State { present: alive, phantom: phantom_next }));
    }
    out
}

/// The total time of an H-ILP solution.
fn time_of(h: &HGraph, sol: &HSolution) -> f64 {
    sol.seq.iter().map(|&(k, o)| h.nodes[k].options[o].time).sum()
}

/// Every aNode and every cNode's largest phantom and overhead at once: no budget above
/// it binds, so the sweeps over budgets stop there.
fn most_memory(h: &HGraph) -> u64 {
    h.sizes.iter().sum::<u64>()
        + h.nodes.iter().map(|n| n.options.iter().map(|o| o.phantom + o.overhead).max().unwrap_or(0)).sum::<u64>()
}

fn option(time: f64, overhead: u64, phantom: u64, reads: Vec<usize>) -> HOption {
    HOption { time, overhead, phantom, reads, substeps: Vec::new() }
}

/// A random chain of `pairs` forward/backward pairs as an H-graph: forward `i` reads
/// `a_{i−1}` and makes `a_i`; the loss reads the last `a` and makes `g_pairs`; backward `i`
/// reads `g_{i+1}`, makes `g_i` and, per option, reads some of `a_{i−1}`, `a_i`. Each pair
/// has one to three options (the forward also a fast forward: no phantom, no grad).
fn random_hgraph(rng: &mut Rng, pairs: usize) -> HGraph {
    // aNodes: a_0..a_{p−1}, then g_0..g_p.
    let a = |i: usize| i;
    let g = |i: usize| pairs + i;
    let mut sizes: Vec<u64> = (0..pairs).map(|_| rng.range(1, 6)).collect();
    sizes.extend((0..=pairs).map(|_| rng.range(1, 4)));
    let mut nodes = Vec::new();
    let mut backward_options = Vec::new();
    for i in 0..pairs {
        let count = rng.range(1, 3) as usize;
        let mut fwd = Vec::new();
        let mut bwd = Vec::new();
        for _ in 0..count {
            fwd.push(option(rng.range(1, 6) as f64, rng.range(0, 3), rng.range(0, 5), Vec::new()));
            let mut reads = Vec::new();
            if i > 0 && rng.one_in(2) {
                reads.push(a(i - 1));
            }
            if rng.one_in(2) {
                reads.push(a(i));
            }
            bwd.push(option(rng.range(1, 6) as f64, rng.range(0, 3), 0, reads));
        }
        // The fast forward: cheaper, no phantom.
        let ff_time = fwd.iter().map(|o| o.time).fold(f64::INFINITY, f64::min) - 0.5;
        fwd.push(option(ff_time.max(0.5), rng.range(0, 2), 0, Vec::new()));
        nodes.push(HNode {
            kind: HKind::Forward { pair: i },
            inputs: if i > 0 { vec![a(i - 1)] } else { Vec::new() },
            outputs: vec![a(i)],
            options: fwd,
        });
        backward_options.push(bwd);
    }
    nodes.push(HNode {
        kind: HKind::Loss,
        inputs: vec![a(pairs - 1)],
        outputs: vec![g(pairs)],
        options: vec![option(1.0, rng.range(0, 2), 0, Vec::new())],
    });
    for i in (0..pairs).rev() {
        nodes.push(HNode {
            kind: HKind::Backward { pair: i },
            inputs: vec![g(i + 1)],
            outputs: vec![g(i)],
            options: backward_options[i].clone(),
        });
    }
    HGraph { nodes, sizes }
}

/// The H-ILP's optimum equals the exhaustive search's on random chains of 2 and 3 pairs,
/// at every budget from below the least feasible one to store-all, with and without a
/// save budget; where the search finds nothing, the H-ILP says infeasible.
#[test]
fn the_h_ilp_matches_exhaustive_search_on_small_clusters() {
    let mut rng = Rng::new(15);
    let mut compared = 0;
    let mut infeasible = 0;
    let mut recomputing = 0;
    let started = std::time::Instant::now();
    let (mut t_brute, mut t_ilp) = (0.0, 0.0);
    for case in 0..16 {
        let pairs = if case % 4 == 3 { 3 } else { 2 };
        let h = random_hgraph(&mut rng, pairs);
        let total = most_memory(&h);
        let store_all_time: f64 = h.nodes.iter().map(|n| n.options[0].time).sum();
        for budget in (1..=total).step_by(2) {
            for save in [None, Some(budget / 2)] {
                let t0 = std::time::Instant::now();
                let want = brute(&h, budget, save);
                t_brute += t0.elapsed().as_secs_f64();
                let t0 = std::time::Instant::now();
                let got = solve(&h, budget, save, Some(30.0));
                t_ilp += t0.elapsed().as_secs_f64();
                match (want, &got) {
                    (None, Err(IlpError::Infeasible)) => infeasible += 1,
                    (Some(w), Ok(sol)) => {
                        assert!(sol.optimal, "case {case}, budget {budget}: not solved to optimality");
                        assert!(sol.peak <= budget && save.is_none_or(|s| sol.save <= s), "case {case}: {sol:?}");
                        let g = time_of(&h, sol);
                        assert!(
                            (g - w).abs() < 1e-6,
                            "case {case}, budget {budget}, save {save:?}: the H-ILP's optimum {g} against the \
                             exhaustive search's {w}\n{h:#?}\n{:?}",
                            sol.seq
                        );
                        compared += 1;
                        recomputing += usize::from(w < store_all_time - 1e-9 || w > store_all_time + 1e-9);
                    }
                    _ => panic!("case {case}, budget {budget}, save {save:?}: search {want:?}, H-ILP {got:?}\n{h:#?}"),
                }
            }
        }
    }
    eprintln!(
        "{:.1} s: brute {t_brute:.1} s, ILP {t_ilp:.1} s; {compared} compared, {infeasible} infeasible, {recomputing} recomputing",
        started.elapsed().as_secs_f64()
    );
    // The sweep reaches every regime: infeasible, recomputation, store-all.
    assert!(compared > 200 && infeasible > 100 && recomputing > 100, "{compared} {infeasible} {recomputing}");
}

/// The memory a solution reports holds it: at exactly that peak and save budget the
/// H-ILP is still feasible, and no slower.
#[test]
fn a_solution_reports_the_memory_it_uses() {
    let mut rng = Rng::new(16);
    let mut below_budget = 0;
    for case in 0..8 {
        let h = random_hgraph(&mut rng, 2);
        let total = most_memory(&h);
        for budget in (1..=total).step_by(3) {
            let Ok(sol) = solve(&h, budget, None, Some(30.0)) else { continue };
            let again = solve(&h, sol.peak, Some(sol.save), Some(30.0));
            let again = again.unwrap_or_else(|e| panic!("case {case}, budget {budget}: {e} at its own memory"));
            assert!((time_of(&h, &again) - time_of(&h, &sol)).abs() < 1e-6, "case {case}, budget {budget}");
            below_budget += usize::from(sol.peak < budget);
        }
    }
    // Not the budget echoed back.
    assert!(below_budget > 10, "{below_budget}");
}

/// [`GridAnswers`] over a grid of peak and save budgets: each point's answer is the
/// exhaustive search's optimum (or infeasibility), though fewer ILPs are solved than
/// there are points.
#[test]
fn grid_answers_match_exhaustive_search_with_fewer_ilps() {
    let mut rng = Rng::new(17);
    let (mut points, mut ilps) = (0, 0);
    for case in 0..8 {
        let h = random_hgraph(&mut rng, 2);
        let total = most_memory(&h);
        let grid: Vec<Budgets> =
            (1..=total).step_by(2).flat_map(|p| [(p, None), (p, Some(p / 2)), (p, Some(p / 4))]).collect();
        let mut answers = GridAnswers::new(2);
        let got = answers.solve(&grid, |(p, s)| Some(solve(&h, p, s, Some(30.0))));
        assert_eq!(got.len(), grid.len());
        for (&(p, s), answer) in grid.iter().zip(&got) {
            match (brute(&h, p, s), answer) {
                (None, Err(IlpError::Infeasible)) => {}
                (Some(w), Ok(sol)) => assert!((time_of(&h, sol) - w).abs() < 1e-6, "case {case}, ({p}, {s:?})"),
                (want, got) => panic!("case {case}, ({p}, {s:?}): search {want:?}, grid {got:?}"),
            }
        }
        points += grid.len();
        ilps += answers.solved;
    }
    assert!(ilps * 2 < points, "{ilps} ILPs for {points} points");
}

/// `random_hgraph` with correction terms (3.34) on about half of the options that read
/// an input: a substep after it (its input dead, when the node frees it) and one before.
fn random_hgraph_with_substeps(rng: &mut Rng, pairs: usize) -> HGraph {
    let mut h = random_hgraph(rng, pairs);
    for node in &mut h.nodes {
        let inputs = node.inputs.clone();
        for opt in &mut node.options {
            let candidates: Vec<usize> = inputs.iter().chain(&opt.reads).copied().collect();
            if candidates.is_empty() || rng.one_in(2) {
                continue;
            }
            let dead: Vec<usize> = candidates.iter().copied().filter(|_| !rng.one_in(3)).collect();
            let late = rng.range(0, 6) as i64;
            let early = rng.range(0, 3) as i64 - 1;
            opt.substeps = vec![Substep { overhead: early, dead: Vec::new() }, Substep { overhead: late, dead }];
            opt.overhead = late.max(early).max(0) as u64;
        }
    }
    h
}

/// With correction terms, the H-ILP's optimum still equals the exhaustive search's, and
/// they let some budgets fit, or run faster, than the largest overhead would.
#[test]
fn correction_terms_match_exhaustive_search() {
    let mut rng = Rng::new(334);
    let (mut compared, mut gained) = (0, 0);
    for case in 0..10 {
        let pairs = if case % 5 == 4 { 3 } else { 2 };
        let h = random_hgraph_with_substeps(&mut rng, pairs);
        let mut without = h.clone();
        for opt in without.nodes.iter_mut().flat_map(|n| n.options.iter_mut()) {
            opt.substeps.clear();
        }
        let total = most_memory(&h);
        for budget in (1..=total).step_by(2) {
            let want = brute(&h, budget, None);
            let got = solve(&h, budget, None, Some(30.0));
            match (want, &got) {
                (None, Err(IlpError::Infeasible)) => {}
                (Some(w), Ok(sol)) => {
                    assert!(sol.optimal);
                    let g = time_of(&h, sol);
                    assert!((g - w).abs() < 1e-6, "case {case}, budget {budget}: H-ILP {g}, search {w}\n{h:#?}");
                    compared += 1;
                    let before = brute(&without, budget, None);
                    assert!(before.is_none_or(|b| b >= w - 1e-9), "case {case}, budget {budget}: slower with them");
                    gained += usize::from(before.is_none_or(|b| b > w + 1e-9));
                }
                _ => panic!("case {case}, budget {budget}: search {want:?}, H-ILP {got:?}\n{h:#?}"),
            }
        }
    }
    eprintln!("{compared} compared, {gained} gained");
    assert!(compared > 60 && gained > 5, "{compared} compared, {gained} gained");
}

/// F0 → F1 → loss → B1 → B0 with one option each (no phantoms): a0 (size 4), a1 (2),
/// the loss's gradient g2 (1), g1 (1), g0 (1). B0 reads a0 (its input); B1 reads a1.
fn chain_of_two(b0_reads_a0: bool) -> HGraph {
    let fwd = |t: f64| vec![option(t, 0, 0, Vec::new())];
    HGraph {
        nodes: vec![
            HNode { kind: HKind::Forward { pair: 0 }, inputs: vec![], outputs: vec![0], options: fwd(3.0) },
            HNode { kind: HKind::Forward { pair: 1 }, inputs: vec![0], outputs: vec![1], options: fwd(1.0) },
            HNode { kind: HKind::Loss, inputs: vec![1], outputs: vec![4], options: fwd(1.0) },
            HNode { kind: HKind::Backward { pair: 1 }, inputs: vec![4, 1], outputs: vec![3], options: fwd(1.0) },
            HNode {
                kind: HKind::Backward { pair: 0 },
                inputs: if b0_reads_a0 { vec![3, 0] } else { vec![3] },
                outputs: vec![2],
                options: fwd(1.0),
            },
        ],
        sizes: vec![4, 2, 1, 1, 1],
    }
}

/// The H-ILP's time at `budget` (and `save`), checked against the exhaustive search.
fn both(h: &HGraph, budget: u64, save: Option<u64>) -> Option<(f64, Vec<(usize, usize)>)> {
    let ilp = match solve(h, budget, save, None) {
        Ok(sol) => Some((time_of(h, &sol), sol.seq)),
        Err(IlpError::Infeasible) => None,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(ilp.as_ref().map(|x| x.0), brute(h, budget, save), "budget {budget}, save {save:?}");
    ilp
}

/// Memory (3.27)–(3.33) and dependencies (3.13). Store-all peaks at B1 (a0 + a1 + g2 +
/// its output g1 = 8: a node's frees count until it ends); at 7 and 6, a0 goes after F1
/// and F0 runs again before B0, which reads it (+3); at 5 nothing fits (F1 needs a0 and
/// a1).
#[test]
fn memory_and_dependencies_on_a_hand_made_chain() {
    let h = chain_of_two(true);
    assert_eq!(both(&h, 8, None), Some((7.0, vec![(0, 0), (1, 0), (2, 0), (3, 0), (4, 0)])));
    for budget in [6, 7] {
        assert_eq!(both(&h, budget, None), Some((10.0, vec![(0, 0), (1, 0), (2, 0), (3, 0), (0, 0), (4, 0)])));
    }
    assert_eq!(both(&h, 5, None), None);
    // A backward that does not read a0 lets it go after F1: 6 with no rerun.
    let h = chain_of_two(false);
    assert_eq!(both(&h, 6, None).map(|x| x.0), Some(7.0));
}

/// The save budget (2.19): what is resident right after the loss. Store-all keeps a0, a1
/// and g2 there (7); at 3, a0 is dropped (+3, F0 again before B0); at 1, a1 as well (F0
/// and F1 again before B1, +4, a0 then kept for B0); at 0 nothing fits (g2 is 1).
#[test]
fn the_save_budget_bounds_what_the_loss_leaves() {
    let h = chain_of_two(true);
    assert_eq!(both(&h, 8, Some(7)).map(|x| x.0), Some(7.0));
    assert_eq!(both(&h, 8, Some(3)).map(|x| x.0), Some(10.0));
    assert_eq!(both(&h, 8, Some(1)).map(|x| x.0), Some(11.0));
    assert_eq!(both(&h, 8, Some(0)), None);
}

/// Phantoms and options (3.15)–(3.19): one pair with a big, fast option 0 (phantom 6,
/// backward 1) and a small, slow one 1 (phantom 1, backward 4), and a fast forward 2.
/// The backward runs in the option its forward kept, and only then.
#[test]
fn a_backward_runs_in_the_option_its_forward_kept() {
    let h = HGraph {
        nodes: vec![
            HNode {
                kind: HKind::Forward { pair: 0 },
                inputs: vec![],
                outputs: vec![0],
                options: vec![option(2.0, 0, 6, vec![]), option(2.0, 0, 1, vec![]), option(1.0, 0, 0, vec![])],
            },
            HNode { kind: HKind::Loss, inputs: vec![0], outputs: vec![1], options: vec![option(1.0, 0, 0, vec![])] },
            HNode {
                kind: HKind::Backward { pair: 0 },
                inputs: vec![1],
                outputs: vec![2],
                options: vec![option(1.0, 0, 0, vec![]), option(4.0, 0, 0, vec![])],
            },
        ],
        sizes: vec![1, 1, 1],
    };
    // Option 0 peaks at 8 (phantom 6, g and the backward's output): 2 + 1 + 1.
    assert_eq!(both(&h, 8, None), Some((4.0, vec![(0, 0), (1, 0), (2, 0)])));
    // At 7, option 1 on both sides (2 + 1 + 4) beats a fast forward and option 0 again in
    // the backward's stage (1 + 1 + 2 + 1 = 5, but g, a and phantom 6 make 8).
    assert_eq!(both(&h, 7, None), Some((7.0, vec![(0, 1), (1, 0), (2, 1)])));
}

/// A MILP stopped by its time limit returns its incumbent marked not optimal: store-all's
/// warm start on a GPT layer's H-graph, with no time to prove anything.
#[test]
fn a_time_limited_answer_is_not_called_optimal() {
    let g = pebble_testkit::gpt(1, 16, 8).graph;
    let (h, _) = HGraph::bottom(&g).unwrap();
    let all: u64 = h.sizes.iter().sum::<u64>() * 4;
    let sol = solve(&h, all, None, Some(0.0)).unwrap();
    assert!(!sol.optimal);
    assert!(solve(&h, all, None, None).unwrap().optimal);
}

/// A start is taken: on a GPT layer's H-graph at budgets store-all does not fit, with
/// half a second to search, HiGHS started from the optimal sequence returns it, where
/// started from store-all (which does not fit) it returns something slower or nothing
/// (on this machine: nothing, at both budgets). A sequence that is not one of stages is
/// ignored.
#[test]
fn a_start_sequence_is_where_highs_begins() {
    const LIMIT: f64 = 0.5;
    let g = pebble_testkit::gpt(1, 16, 8).graph;
    let (h, _) = HGraph::bottom(&g).unwrap();
    let free = solve(&h, most_memory(&h), None, None).unwrap();
    let mut started_better = 0;
    for share in [0.92, 0.96] {
        let budget = (free.peak as f64 * share) as u64;
        let best = solve(&h, budget, None, None).unwrap();
        assert!(best.optimal && best.peak <= budget);
        let from = solve_from(&h, budget, None, Some(LIMIT), Some(&best.seq)).unwrap();
        assert!((time_of(&h, &from) - time_of(&h, &best)).abs() < 1e-9, "at {share}: {from:?} against {best:?}");
        assert!(from.peak <= budget);
        let cold = solve(&h, budget, None, Some(LIMIT));
        started_better += usize::from(match cold {
            Ok(cold) => time_of(&h, &cold) > time_of(&h, &best) + 1e-9,
            Err(e) => matches!(e, IlpError::NoSolution { .. }),
        });
        // Out of order: not a sequence of stages, so no start; the answer is still right.
        let mut shuffled = best.seq.clone();
        shuffled.reverse();
        let again = solve_from(&h, budget, None, None, Some(&shuffled)).unwrap();
        assert!((time_of(&h, &again) - time_of(&h, &best)).abs() < 1e-9);
    }
    assert!(started_better > 0, "store-all's start did as well everywhere: the test shows nothing");
}
