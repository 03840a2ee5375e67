//! The two heuristics of Shilova's thesis §4.3 that combine offloading with
//! rematerialization (research digest §5.8): `autocapper` (with its inner [`capper`]) and
//! `opportunist`. Neither is bound by pofo's Assumptions 4 and neither claims optimality;
//! both return schedules that [`crate::plan`] scores with the simulator, on the chain view.
//!
//! Stages, tensors and modes are pebble's (Table 2.1 with 0-based stages: stage `i` maps
//! `a_i` to `a_{i+1}`, the loss is stage `L`); offloads are [`Transfer`]s placed in a
//! sequence of compute ops, and every prefetch is placed by [`transfer_schedule`] (before
//! the first compute op after the offload that reads the tensor, as late as the nominal
//! timeline allows, then later while the simulator finds it over the budget).
//!
//! # capper(M′) and autocapper
//!
//! [`capper`]`(M′)`, for the budget `M` and a limit `M′ ≥ M`:
//!
//! 1. the compute ops of Rotor's persistent DP for `M′` ([`crate::remat::rotor`]; fails if it has
//!    none);
//! 2. repeat: place the prefetches of the offloads chosen so far each right before its
//!    reader (the placement that holds the least memory, a *probe*) and simulate under
//!    `M` (compute ops wait for in-flight offloads to release memory, O.3). If it fits,
//!    stop: the result is [`transfer_schedule`]'s placement of the same offloads (the
//!    probe itself if that one fails). Otherwise the first op over `M` is the *peak*: the
//!    compute op `k` that exceeds it (or, for a prefetch, the compute op it feeds). Among
//!    the activations resident on the device before op `k` — `Activation(i)` or
//!    `Saved(i)`, by a replay of Table 2.1 over the compute ops — take the lowest `i`
//!    whose offload can lower the memory at `k`: not empty, not offloaded yet, and not
//!    read between its producer and `k` (op `k` included). Offload it whole, issued
//!    right after the op that produced it (`Transfer.at` = that op's index + 1; `a_0`,
//!    resident from the start, at 0);
//! 3. if no activation qualifies, capper(M′) fails.
//!
//! Each instance of a tensor (a tensor between its producer and its release) is offloaded
//! at most once, so the loop ends. The peak is taken under the budget (the first op the
//! simulator cannot fit even after waiting for the releases already scheduled) rather
//! than from an unbounded replay: an unbounded replay counts in-flight offloads at their
//! full size and would keep offloading what the device only waits for.
//!
//! `autocapper` runs capper for the 40 limits `M′_k = M + (M^high − M)·k/39`,
//! `k = 0..39`, `M^high` store-all's simulated peak, simulates each result under `M` on
//! the options' machine, and keeps the fastest (ties: the smaller `M′`). Hence:
//!
//! * `M′_0 = M`: Rotor's schedule for `M` fits `M` as it is, so capper(M) *is* Rotor's
//!   schedule, and autocapper is never slower than `rotor`, and feasible wherever it is;
//! * `M′_39 = M^high`: Rotor's ops are store-all's, every `ā_ℓ` stays resident until
//!   `B_ℓ`, and capper offloads `ā_0, ā_1, …` in index order (empty ones skipped) until
//!   the probe fits, with `Transfer.at = ℓ`: GREEDY's offload order and issue points;
//!   it stops at the shortest prefix that fits, where GREEDY stops at the first whose
//!   size reaches `Q = M_peak − M` (no shorter prefix fits: Proposition 2). When GREEDY's
//!   prefix fits the probe, the two schedules are the same, and autocapper is no slower
//!   than `offload-greedy`;
//! * with `M ≥ M^high` it returns store-all, nothing moved.
//!
//! The limits are independent: they run on as many threads as the machine has, each with
//! Rotor's DP single-threaded, and their results are taken in the limits' order, so the
//! answer does not depend on the threads. It reports progress as `("autocapper", k, 40)`,
//! `k` the share of the limits done. Its cost is that of 40 Rotor DPs (three quarters of
//! it on ResNet-1001's chain at 500×500) and of the capper loops, one simulation per
//! offload (the rest): 36 s on two cores for ResNet-1001 at 500×500 and 40% of its
//! activation memory (65 s with the limits one after the other, each DP on both cores).
//!
//! # opportunist
//!
//! Keeps the host link busy during the forward pass. Walking the stages `s = 0, 1, …`
//! with a nominal clock (forward times back to back, no stalls) and the link's nominal
//! end (`options.machine.d2h`, one transfer at a time):
//!
//! 1. if the rest of the chain, stages `s..L` with the loss, *fits in memory* (its
//!    store-all schedule, simulated with `a_s` as it is held and the static bytes, fits
//!    `M`: exactly when Rotor's DP answers it without any recomputation), stop: the rest
//!    runs store-all;
//! 2. else, if the link is idle at the nominal start of stage `s` (always at `s = 0`),
//!    run `F_s^all` and offload its input (`Activation(s)`; when the input is `ā_s`, the
//!    previous `F^all`'s output, it is already on its way) right before it and its output
//!    `ā_{s+1}` right after it;
//! 3. else run `F_s^∅`.
//!
//! At `s = L` only the loss is left; if it does not fit with its input, opportunist is
//! infeasible. The `F^∅` between two consecutive `F^all` at `p < q` (or between the last
//! `F^all` and the store-all rest) form a group `p+1 ..= q−1`, possibly empty. The first
//! stage of a group reads `a_{p+1}` out of `ā_{p+1}`, which `F^∅` keeps (Table 2.1:
//! `F^∅` releases its input only when it is a bare `Activation`), so `F^∅` is valid
//! there and the group's input survives for its backward; every later stage of the group
//! reads (and releases) the bare `Activation` its predecessor produced.
//!
//! The backward runs the rest's store-all backward, then, from the last group to the
//! first, each group's reversal followed by `B_p` of the `F^all` before it. A group
//! `a ..= b` is reversed by Rotor's persistent DP on a chain of its own (stage `j` is
//! stage `a + j`, the ops shifted back): stages `a..b−1`, and stage `b` folded into that
//! chain's loss (`F_b^all` then `B_b`, whose time is `u_{F_b} + u_{B_b}` and whose
//! temporary memory covers `ā_{b+1}`, `δ_{b+1}` and both ops' temporaries); the part of
//! `ā_a` beyond `a_a`, held throughout, is static, and `δ_{b+1}`, held until `B_b`, is
//! added to every forward's temporary memory (exact before `B_b`, an overestimate for
//! the recomputations after it). A one-stage group is `F_a^all B_a`.
//! Nothing offloaded is counted there: [`transfer_schedule`] brings `ā_{p+1}` back before
//! the group and `a_p` before `B_p`, and fails (then opportunist is `Infeasible`) if no
//! placement fits `M`.
//!
//! *Readings.* The digest says "until the rest of the sequence fits in memory": this
//! module reads it as "fits without rematerialization". Reading it as "Rotor finds any
//! schedule for the rest" would stop at `s = 0` whenever Rotor is feasible, making
//! opportunist Rotor itself wherever Rotor works, which contradicts the thesis's finding
//! that it is slightly better than rematerialization and sometimes infeasible at low
//! memory. The check is made before every stage, not only where an `F^all` would run, so
//! opportunist stops recomputing as soon as it can. The thesis's "F^∅ for the next
//! layers" is taken literally, the first of a group included (see above).

use pebble_graph::Chain;
use pebble_schedule::lower::{self, Ids};
use pebble_schedule::{ForwardMode, Op, Schedule, Tensor, View};
use pebble_sim::{SimConfig, SimError};

use super::{assemble, prefetch_deadlines, reads, transfer_schedule, Transfer};
use crate::{Problem, SolveError, SolveOptions, Solver};

/// How many limits `M′` autocapper tries.
pub const AUTOCAPPER_STEPS: usize = 40;

fn infeasible(budget: u64, reason: impl Into<String>) -> SolveError {
    SolveError::Infeasible { budget, reason: reason.into() }
}

/// Store-all's simulated peak (`M^high`), everything counted.
fn store_all_peak(chain: &Chain) -> u64 {
    let s = Schedule::new(View::Chain, crate::baseline::store_all_ops(chain.len()));
    pebble_sim::simulate_chain(chain, &s, &SimConfig::default()).map(|r| r.peak_bytes).unwrap_or(u64::MAX)
}

/// Whether the static memory and `a_0` alone fit.
fn inputs_fit(chain: &Chain, budget: u64) -> Result<(), SolveError> {
    if u128::from(chain.static_bytes) + u128::from(chain.x[0]) > u128::from(budget) {
        return Err(infeasible(
            budget,
            format!("the static memory ({}) and a_0 ({}) alone exceed it", chain.static_bytes, chain.x[0]),
        ));
    }
    Ok(())
}

/// Bytes of a chain tensor ([`lower::tensor_bytes`]).
fn size(chain: &Chain, t: Tensor) -> u64 {
    lower::tensor_bytes(chain, t)
}

// ----- capper -----------------------------------------------------------------------

/// The schedule of `compute` with `offloads`, each prefetch issued right before the first
/// compute op after its offload that reads the tensor (the least memory any placement
/// holds; the reader waits for it).
fn probe(chain: &Chain, compute: &[Op], offloads: &[Transfer]) -> Schedule {
    let pre = prefetch_deadlines(chain, compute, offloads);
    let issue: Vec<usize> = pre.iter().map(|&(_, deadline)| deadline).collect();
    assemble(compute, offloads, &pre, &issue)
}

/// The activations (`Activation(i)`, `Saved(i)`) resident before compute op `k`, each with
/// the index of the op that produced it (`None`: `a_0`, resident from the start), as
/// [`lower`] lowers the compute ops alone.
fn resident_before(chain: &Chain, compute: &[Op], k: usize) -> Vec<(Tensor, Option<usize>)> {
    let ids = Ids::of_chain(chain);
    let program = lower::lower_chain(&compute[..k], ids, false, &[], 1);
    let mut live: Vec<(Tensor, Option<usize>)> = vec![(Tensor::Activation(0), None)];
    for (j, step) in program.steps.iter().enumerate() {
        for &c in &step.creates {
            let t = ids.tensor(c);
            live.retain(|&(u, _)| u != t);
            live.push((t, Some(j)));
        }
        for &f in &step.frees {
            let t = ids.tensor(f);
            live.retain(|&(u, _)| u != t);
        }
    }
    // The heuristics offload activations and saved sets only.
    live.retain(|&(t, _)| matches!(t, Tensor::Activation(_) | Tensor::Saved(_)));
    live
}

/// The lowest-indexed activation resident before compute op `k` whose offload, issued
/// right after its producer, lowers the memory at `k` (see the module docs).
fn lowest_to_offload(chain: &Chain, compute: &[Op], offloads: &[Transfer], k: usize) -> Option<Transfer> {
    let l = chain.len();
    let index = |t: Tensor| match t {
        Tensor::Activation(i) => (i, 1),
        Tensor::Saved(i) => (i, 0),
        _ => (usize::MAX, 2),
    };
    resident_before(chain, compute, k)
        .into_iter()
        .filter(|&(t, _)| size(chain, t) > 0)
        .map(|(tensor, producer)| Transfer { at: producer.map_or(0, |p| p + 1), tensor, fraction: 1.0 })
        .filter(|o| !offloads.iter().any(|d| d.tensor == o.tensor && d.at == o.at))
        .filter(|o| !reads(&compute[k], o.tensor, l) && !(o.at + 1..k).any(|j| reads(&compute[j], o.tensor, l)))
        .min_by_key(|o| index(o.tensor))
}

/// capper(M′) (Shilova §4.3; see the module docs): Rotor's schedule for the limit `cap`,
/// with offloads added one at a time, the lowest-indexed activation resident at the first
/// op over `budget` each time, until it fits `budget`. `Infeasible` if Rotor finds nothing
/// within `cap` or nothing is left to offload.
pub fn capper(chain: &Chain, budget: u64, cap: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
    capper_plan(chain, budget, cap, options).map(|(schedule, _)| schedule)
}

/// [`capper`] with the offloads it chose.
fn capper_plan(
    chain: &Chain,
    budget: u64,
    cap: u64,
    options: &SolveOptions,
) -> Result<(Schedule, Vec<Transfer>), SolveError> {
    capper_with(chain, budget, cap, options, None)
}

/// [`capper_plan`] with Rotor's DP on `threads` workers (see [`crate::remat::rotor::persistent_with`]).
fn capper_with(
    chain: &Chain,
    budget: u64,
    cap: u64,
    options: &SolveOptions,
    threads: Option<usize>,
) -> Result<(Schedule, Vec<Transfer>), SolveError> {
    inputs_fit(chain, budget)?;
    let (_, compute) =
        crate::remat::rotor::persistent_with(chain, cap.max(budget), options.slots, threads, &crate::Progress::none())?;
    let config = SimConfig { budget: Some(budget), ..options.sim_config() };
    let mut offloads: Vec<Transfer> = Vec::new();
    loop {
        let schedule = probe(chain, &compute, &offloads);
        let op = match pebble_sim::simulate_chain(chain, &schedule, &config) {
            Ok(_) => {
                let placed = transfer_schedule(chain, &compute, &offloads, budget, &options.sim_config());
                return Ok((placed.unwrap_or(schedule), offloads));
            }
            Err(SimError::BudgetExceeded { op, .. }) => op,
            Err(e) => return Err(infeasible(budget, format!("capper({cap}): the schedule is invalid: {e}"))),
        };
        // The compute op at the peak: the op itself, or the one a prefetch feeds.
        let k = schedule.ops[..op.min(schedule.ops.len())].iter().filter(|o| o.is_compute()).count();
        let next = if k < compute.len() { lowest_to_offload(chain, &compute, &offloads, k) } else { None };
        let Some(next) = next else {
            return Err(infeasible(
                budget,
                format!("capper({cap}): nothing left to offload at compute op {k} after {} offloads", offloads.len()),
            ));
        };
        let pos = offloads.iter().position(|o| o.at > next.at).unwrap_or(offloads.len());
        offloads.insert(pos, next);
    }
}

/// The `k`-th of autocapper's limits, `k = 0..AUTOCAPPER_STEPS`: `M` to `M^high` evenly.
fn limit(budget: u64, high: u64, k: usize) -> u64 {
    let span = u128::from(high.saturating_sub(budget));
    let step = span * k as u128 / (AUTOCAPPER_STEPS as u128 - 1);
    budget.saturating_add(step as u64)
}

/// AUTOCAPPER (Shilova §4.3): the fastest of capper(M′) for 40 limits `M′` from the budget
/// to store-all's peak.
pub struct Autocapper;

impl Solver for Autocapper {
    fn name(&self) -> &'static str {
        "autocapper"
    }

    fn description(&self) -> &'static str {
        "offloading and recomputation: the fastest of capper(M′), Rotor at M′ with offloads at its peaks, \
         for 40 M′ (Shilova §4.3)"
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let chain = problem.chain_for(self.name())?;
        inputs_fit(chain, budget)?;
        let high = store_all_peak(chain);
        if budget >= high {
            return Ok(Schedule::new(View::Chain, crate::baseline::store_all_ops(chain.len())));
        }
        let checked = SimConfig { budget: Some(budget), ..options.sim_config() };
        let mut caps: Vec<u64> = (0..AUTOCAPPER_STEPS).map(|k| limit(budget, high, k)).collect();
        caps.dedup();
        // Each limit on its own (Rotor's DP single-threaded), several at a time; the results
        // are taken in the limits' order, so the answer does not depend on the workers.
        let n = caps.len();
        let results = in_parallel(
            n,
            |k| {
                capper_with(chain, budget, caps[k], options, Some(1)).map(|(s, _)| {
                    let time = pebble_sim::simulate_chain(chain, &s, &checked).ok().map(|r| r.makespan);
                    (time, s)
                })
            },
            |done| options.progress.report("autocapper", AUTOCAPPER_STEPS * done / n, AUTOCAPPER_STEPS),
        );
        let mut best: Option<(f64, Schedule)> = None;
        let mut other: Option<SolveError> = None;
        for found in results {
            match found {
                Ok((Some(time), s)) => {
                    if best.as_ref().is_none_or(|(t, _)| time < *t) {
                        best = Some((time, s));
                    }
                }
                Ok((None, _)) | Err(SolveError::Infeasible { .. }) => {}
                Err(e) => other = other.or(Some(e)),
            }
        }
        match (best, other) {
            (Some((_, s)), _) => Ok(s),
            (None, Some(e)) => Err(e),
            (None, None) => Err(infeasible(
                budget,
                format!("capper finds no schedule for any of {AUTOCAPPER_STEPS} limits from {budget} to {high} bytes"),
            )),
        }
    }
}

/// `work(k)` for `k = 0..n` on as many threads as the machine has (at most `n`), each
/// taking the next `k` when it is done; the results in the order of `k`. `report`
/// receives how many have ended, as each ends.
fn in_parallel<T: Send>(n: usize, work: impl Fn(usize) -> T + Sync, report: impl Fn(usize) + Sync) -> Vec<T> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let threads = std::thread::available_parallelism().map_or(1, |p| p.get()).clamp(1, n.max(1));
    let (next, ended) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let found: Vec<Vec<(usize, T)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        if k >= n {
                            return mine;
                        }
                        mine.push((k, work(k)));
                        report(ended.fetch_add(1, Ordering::Relaxed) + 1);
                    }
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
    });
    let mut slots: Vec<Option<T>> = (0..n).map(|_| None).collect();
    for (k, value) in found.into_iter().flatten() {
        slots[k] = Some(value);
    }
    slots.into_iter().map(|v| v.expect("every k ran")).collect()
}

inventory::submit!(crate::Registration(&Autocapper));

// ----- opportunist ------------------------------------------------------------------

/// Stages `r..L` of `chain` and its loss as a chain of their own (stage `j` is stage
/// `r + j`), with `extra` more static bytes. Needs `r < L`.
fn suffix_chain(chain: &Chain, r: usize, extra: u64) -> Chain {
    let mut xbar = chain.xbar[r..].to_vec();
    xbar[0] = chain.x[r];
    Chain {
        name: None,
        ftime: chain.ftime[r..].to_vec(),
        btime: chain.btime[r..].to_vec(),
        x: chain.x[r..].to_vec(),
        xbar,
        ftmp: chain.ftmp[r..].to_vec(),
        btmp: chain.btmp[r..].to_vec(),
        w: None,
        g: None,
        o: None,
        utmp: None,
        static_bytes: chain.static_bytes.saturating_add(extra),
    }
}

/// The group `a ..= b` (`a < b < L`) as a chain of its own, for its reversal: stages
/// `a..b` are its stages `0..b−a`, stage `b` (`F_b^all` then `B_b`) is its loss. `ā_a`'s
/// part beyond `a_a`, resident throughout, is static; `δ_{b+1}`, resident until `B_b`,
/// is added to every forward's temporary memory and to the loss's.
fn group_chain(chain: &Chain, a: usize, b: usize) -> Chain {
    let delta = chain.x[b + 1];
    let mut xbar = chain.xbar[a..=b].to_vec();
    xbar[0] = chain.x[a];
    let mut btime = chain.btime[a..b].to_vec();
    btime.push(chain.ftime[b] + chain.btime[b]);
    let mut btmp = chain.btmp[a..b].to_vec();
    // Beside a_b and δ_b (the loss's input and output): F_b^all holds δ_{b+1}, ā_{b+1} and
    // its temporary memory (but not δ_b); B_b holds δ_{b+1}, ā_{b+1} and its own.
    let held = delta.saturating_add(chain.xbar[b + 1]);
    btmp.push(held.saturating_add(chain.ftmp[b]).saturating_sub(chain.x[b]).max(held.saturating_add(chain.btmp[b])));
    Chain {
        name: None,
        ftime: chain.ftime[a..b].to_vec(),
        btime,
        x: chain.x[a..=b].to_vec(),
        xbar,
        ftmp: chain.ftmp[a..b].iter().map(|&t| t.saturating_add(delta)).collect(),
        btmp,
        w: None,
        g: None,
        o: None,
        utmp: None,
        static_bytes: chain.static_bytes.saturating_add(chain.xbar[a].saturating_sub(chain.x[a])),
    }
}

/// The compute ops reversing group `a ..= b` (`a ≥ 1`, its input held in `ā_a`, `δ_{b+1}`
/// resident): Rotor's persistent DP on [`group_chain`], shifted back.
fn reverse_group(
    chain: &Chain,
    a: usize,
    b: usize,
    budget: u64,
    options: &SolveOptions,
) -> Result<Vec<Op>, SolveError> {
    if a == b {
        return Ok(vec![Op::Forward { stage: a, mode: ForwardMode::KeepAll }, Op::Backward { stage: a }]);
    }
    let sub = group_chain(chain, a, b);
    let (_, ops) = crate::remat::rotor::persistent(&sub, budget, options.slots).map_err(|e| match e {
        SolveError::Infeasible { reason, .. } => {
            infeasible(budget, format!("opportunist: Rotor cannot reverse the group of stages {a}..={b}: {reason}"))
        }
        e => e,
    })?;
    let loss = b - a;
    let mut out = Vec::with_capacity(ops.len() + 1);
    for op in ops {
        match op {
            Op::Forward { stage, mode } => out.push(Op::Forward { stage: a + stage, mode }),
            Op::Backward { stage } if stage == loss => {
                out.push(Op::Forward { stage: b, mode: ForwardMode::KeepAll });
                out.push(Op::Backward { stage: b });
            }
            Op::Backward { stage } => out.push(Op::Backward { stage: a + stage }),
            other => out.push(other),
        }
    }
    Ok(out)
}

/// The store-all compute ops of stages `s..L` and the loss, if they fit `budget` with
/// `a_s` held in `ā_s` (`saved`) or alone, and the static bytes.
fn rest_fits(chain: &Chain, s: usize, saved: bool, budget: u64) -> Option<Vec<Op>> {
    let l = chain.len();
    let input = if saved { chain.xbar[s] } else { chain.x[s] };
    if s == l {
        let need =
            u128::from(chain.static_bytes) + u128::from(input) + u128::from(chain.x[l]) + u128::from(chain.btmp[l]);
        return (need <= u128::from(budget)).then(|| vec![Op::Backward { stage: l }]);
    }
    let sub = suffix_chain(chain, s, input.saturating_sub(chain.x[s]));
    let (_, ops) = crate::discretize::store_all_if_it_fits(&sub, budget)?;
    Some(
        ops.into_iter()
            .map(|op| match op {
                Op::Forward { stage, mode } => Op::Forward { stage: s + stage, mode },
                Op::Backward { stage } => Op::Backward { stage: s + stage },
                other => other,
            })
            .collect(),
    )
}

/// OPPORTUNIST's compute ops and offloads (see the module docs).
fn opportunist_plan(
    chain: &Chain,
    budget: u64,
    options: &SolveOptions,
) -> Result<(Vec<Op>, Vec<Transfer>), SolveError> {
    inputs_fit(chain, budget)?;
    let l = chain.len();
    let d2h = options.machine.d2h;
    let mut compute: Vec<Op> = Vec::new();
    let mut offloads: Vec<Transfer> = Vec::new();
    let mut keep_all: Vec<usize> = Vec::new();
    let (mut clock, mut link) = (0.0f64, 0.0f64);
    let offload = |offloads: &mut Vec<Transfer>, at: usize, tensor: Tensor, issued: f64, link: &mut f64| {
        let bytes = size(chain, tensor);
        if bytes > 0 {
            offloads.push(Transfer { at, tensor, fraction: 1.0 });
            *link = link.max(issued) + d2h.transfer_time(bytes as f64);
        }
    };
    let mut s = 0;
    let rest = loop {
        let saved = s > 0 && keep_all.last() == Some(&(s - 1));
        if let Some(rest) = rest_fits(chain, s, saved, budget) {
            break rest;
        }
        if s == l {
            return Err(infeasible(
                budget,
                "opportunist: the loss does not fit with its input, the static memory and δ_L".to_string(),
            ));
        }
        if clock >= link {
            if !saved {
                offload(&mut offloads, compute.len(), Tensor::Activation(s), clock, &mut link);
            }
            compute.push(Op::Forward { stage: s, mode: ForwardMode::KeepAll });
            clock += chain.ftime[s];
            offload(&mut offloads, compute.len(), Tensor::Saved(s + 1), clock, &mut link);
            keep_all.push(s);
        } else {
            compute.push(Op::Forward { stage: s, mode: ForwardMode::Discard });
            clock += chain.ftime[s];
        }
        s += 1;
    };
    compute.extend(rest);
    // From the last group to the first: its reversal, then the backward of the F^all before it.
    for (g, &p) in keep_all.iter().enumerate().rev() {
        let end = keep_all.get(g + 1).copied().unwrap_or(s);
        if p + 1 < end {
            compute.extend(reverse_group(chain, p + 1, end - 1, budget, options)?);
        }
        compute.push(Op::Backward { stage: p });
    }
    Ok((compute, offloads))
}

/// OPPORTUNIST (Shilova §4.3): `F^all` with its input and output offloaded whenever the
/// link is idle, `F^∅` meanwhile, until the rest fits store-all; each group of `F^∅`
/// reversed by Rotor's persistent DP.
pub struct Opportunist;

impl Solver for Opportunist {
    fn name(&self) -> &'static str {
        "opportunist"
    }

    fn description(&self) -> &'static str {
        "offloading and recomputation: F_all with offloads whenever the link is idle, F_∅ groups reversed \
         by Rotor (Shilova §4.3)"
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let chain = problem.chain_for(self.name())?;
        let (compute, offloads) = opportunist_plan(chain, budget, options)?;
        transfer_schedule(chain, &compute, &offloads, budget, &options.sim_config())
            .map_err(|e| infeasible(budget, format!("opportunist: the schedule does not fit: {e}")))
    }
}

inventory::submit!(crate::Registration(&Opportunist));

#[cfg(test)]
mod tests {
    use pebble_machine::Machine;
    use pebble_testkit::{random_chain, Rng};

    use super::*;
    use crate::offload::OffloadGreedy;
    use crate::remat::rotor::Rotor;
    use crate::{plan, PlanError, Slots};

    fn options(beta: f64) -> SolveOptions {
        SolveOptions { machine: Machine::default().with_bandwidth(beta), ..SolveOptions::default() }
    }

    /// Random chains with a budget between the least that Rotor or offloading alone needs
    /// and store-all's peak.
    fn instances(seed: u64, count: usize) -> Vec<(Chain, u64, f64)> {
        let mut rng = Rng::new(seed);
        let mut out = Vec::new();
        while out.len() < count {
            let l = rng.range(2, 7) as usize;
            let chain = random_chain(&mut rng, l);
            let c = super::super::OffChain::new(&chain, u64::MAX).unwrap();
            let peak = store_all_peak(&chain);
            let rotor_least =
                crate::min_feasible_budget(&Rotor, Problem::Chain(&chain), &SolveOptions::default()).unwrap().unwrap();
            let least = (c.least_memory() as u64 + chain.static_bytes).min(rotor_least);
            if least >= peak {
                continue;
            }
            let budget = least + rng.range(0, peak - least);
            let beta = [0.5, 2.0, 8.0][rng.range(0, 2) as usize];
            out.push((chain, budget, beta));
        }
        out
    }

    fn makespan(solver: &dyn Solver, chain: &Chain, budget: u64, beta: f64) -> Option<f64> {
        match plan(solver, Problem::Chain(chain), budget, &options(beta)) {
            Ok(p) => {
                assert!(p.report.peak_bytes <= budget, "{}: peak {} > {budget}", solver.name(), p.report.peak_bytes);
                Some(p.report.makespan)
            }
            Err(PlanError::Solve(SolveError::Infeasible { .. })) => None,
            Err(e) => panic!("{}: {e}", solver.name()),
        }
    }

    #[test]
    fn every_schedule_fits_and_autocapper_is_never_slower_than_rotor() {
        const N: usize = 60;
        let (mut auto, mut opp, mut below_rotor, mut below_greedy) = (0, 0, 0, 0);
        let (mut opp_faster, mut opp_slower) = (0, 0);
        let mut count = 0;
        for (chain, budget, beta) in instances(21, N) {
            count += 1;
            let a = makespan(&Autocapper, &chain, budget, beta);
            let o = makespan(&Opportunist, &chain, budget, beta);
            let r = makespan(&Rotor, &chain, budget, beta);
            if let (Some(a), Some(g)) = (a, makespan(&OffloadGreedy, &chain, budget, beta)) {
                assert!(a <= g * (1.0 + 1e-12), "{chain:?} at {budget}, β = {beta}: autocapper {a} > GREEDY {g}");
                below_greedy += (a < g * (1.0 - 1e-9)) as usize;
            }
            if let (Some(o), Some(r)) = (o, r) {
                opp_faster += (o < r * (1.0 - 1e-9)) as usize;
                opp_slower += (o > r * (1.0 + 1e-9)) as usize;
            }
            auto += a.is_some() as usize;
            opp += o.is_some() as usize;
            match (r, a) {
                (Some(r), Some(a)) => {
                    assert!(a <= r * (1.0 + 1e-12), "{chain:?} at {budget}, β = {beta}: autocapper {a} > rotor {r}");
                    below_rotor += (a < r * (1.0 - 1e-9)) as usize;
                }
                (Some(r), None) => panic!("{chain:?} at {budget}: rotor takes {r}, autocapper finds nothing"),
                _ => {}
            }
        }
        eprintln!(
            "{count} instances: autocapper {auto}, opportunist {opp}; autocapper faster than rotor {below_rotor}, \
             than GREEDY {below_greedy}; opportunist faster than rotor {opp_faster}, slower {opp_slower}"
        );
        assert!(auto >= 55, "autocapper solved only {auto}");
        assert!(below_rotor >= 10, "autocapper beat rotor only {below_rotor} times");
        assert!(opp >= 20, "opportunist solved only {opp}");
    }

    /// capper(M) is Rotor's schedule for M, offloading nothing: on the 30 instances of
    /// seed 22, every one where Rotor has a schedule, at least 20 of them (25 today).
    #[test]
    fn capper_at_the_budget_is_rotor() {
        let mut checked = 0;
        for (chain, budget, beta) in instances(22, 30) {
            let Ok((_, ops)) = crate::remat::rotor::persistent(&chain, budget, Slots::Count(500)) else { continue };
            let (s, offloads) = capper_plan(&chain, budget, budget, &options(beta)).unwrap();
            assert!(offloads.is_empty());
            assert_eq!(s.ops, ops);
            checked += 1;
        }
        eprintln!("capper(M) = rotor on {checked} instances");
        assert!(checked >= 20, "only {checked} instances where rotor has a schedule");
    }

    /// At M^high Rotor keeps everything, and capper offloads a prefix of `ā_0, ā_1, …`
    /// (empty ones skipped), each issued right after its producer: GREEDY's shape, at
    /// least GREEDY's set (Proposition 2), and GREEDY's time when it is GREEDY's set.
    #[test]
    fn capper_at_store_all_peak_offloads_like_greedy() {
        let (mut same, mut checked) = (0, 0);
        for (chain, budget, beta) in instances(23, 60) {
            let high = store_all_peak(&chain);
            let Ok((s, offloads)) = capper_plan(&chain, budget, high, &options(beta)) else { continue };
            checked += 1;
            let c = super::super::OffChain::new(&chain, budget).unwrap();
            let want: Vec<Transfer> = (0..c.n)
                .filter(|&ell| c.abar[ell] > 0)
                .take(offloads.len())
                .map(|ell| Transfer { at: ell, tensor: super::super::saved(ell), fraction: 1.0 })
                .collect();
            assert_eq!(offloads, want, "{chain:?} at {budget}");
            let greedy = super::super::greedy_offloads(&c, false);
            assert!(greedy.len() <= offloads.len(), "{chain:?} at {budget}: fewer than GREEDY's");
            if greedy.len() == offloads.len() {
                let g = makespan(&OffloadGreedy, &chain, budget, beta).expect("GREEDY's set fits");
                let r = pebble_sim::simulate_chain(
                    &chain,
                    &s,
                    &SimConfig { budget: Some(budget), ..options(beta).sim_config() },
                )
                .unwrap();
                assert_eq!(r.makespan, g);
                same += 1;
            }
        }
        eprintln!("capper(M^high): {checked} solved, {same} with GREEDY's set");
        assert!(checked >= 30 && same >= 20, "{checked} solved, {same} like GREEDY");
    }

    #[test]
    fn with_store_all_memory_both_keep_everything() {
        for (chain, _, beta) in instances(24, 20) {
            let high = store_all_peak(&chain);
            for budget in [high, high + 7] {
                for solver in [&Autocapper as &dyn Solver, &Opportunist] {
                    let p = plan(solver, Problem::Chain(&chain), budget, &options(beta)).unwrap();
                    assert_eq!(p.report.makespan, chain.ideal_time(), "{}", solver.name());
                    assert_eq!(p.report.d2h_busy, 0.0, "{}", solver.name());
                }
            }
        }
    }

    /// A zoo ResNet (18 stages) at 50% of its activation memory, on the V100 profile's link.
    #[test]
    fn zoo_resnet_at_half_its_activation_memory() {
        let model = pebble_zoo::ModelOptions {
            batch: Some(4),
            image: Some(64),
            layers: Some(3),
            width: Some(8),
            ..Default::default()
        };
        let chain = pebble_zoo::build("resnet", &model).expect("model").chain;
        let options = SolveOptions { machine: model.profile.machine, ..SolveOptions::default() };
        let high = store_all_peak(&chain);
        let budget = chain.static_bytes + (high - chain.static_bytes) / 2;
        let rotor = plan(&Rotor, Problem::Chain(&chain), budget, &options).expect("rotor");
        for solver in [&Autocapper as &dyn Solver, &Opportunist] {
            let p = plan(solver, Problem::Chain(&chain), budget, &options).unwrap_or_else(|e| panic!("{e}"));
            eprintln!(
                "{}: {:.6} s (rotor {:.6} s, store-all {:.6} s), solved in {:.3} s",
                solver.name(),
                p.report.makespan,
                rotor.report.makespan,
                chain.ideal_time(),
                p.solve_seconds
            );
            assert!(p.report.peak_bytes <= budget);
            assert!(p.report.d2h_busy > 0.0, "{} offloads", solver.name());
        }
    }
}
