use super::*;
use pebble_testkit::Rng;

fn opt(fwd_time: f64, bwd_time: f64, fwd_peak: u64, keep: u64, bwd_peak: u64) -> BlockOption {
    BlockOption { fwd_time, bwd_time, fwd_peak, keep, bwd_peak }
}

/// Research digest §8.3 A, adapted to pebble's semantics (here `a_s` and `δ_t` are counted
/// in `m`, Case 2 reserves `x_in[s]`, and the loss has a time and a peak).
///
/// Two identical blocks, `x_in = 1` (so `a_0 = a_1 = a_2 = 1`), `delta_out = 1`:
/// * `F^0`: time 1, peak 2 (`a_s + a_{s+1}`);
/// * `o1`: times 1 + 2, `fwd_peak` 5 (1 + 3 internals + 1), `keep` 4, `bwd_peak` 6 (4 + 1 + 1);
/// * `o2`: times 1 + 2.4, `fwd_peak` 3 (1 + 1 + 1), `keep` 2, `bwd_peak` 4 (2 + 1 + 1);
/// * loss: time 0.5, peak 2 (`a_2 + δ_2`).
///
/// By hand (`d(1) = 1`, `d(2) = 0`):
/// * `Opt(2,2,m) = 0.5` iff `m ≥ 2`; `Opt(1,1,m) = 0`.
/// * `Opt(1,2,m)`: only Case 1 (no `1 < i < 2`). `o1` needs `m ≥ max(5, 6, 4)` and
///   `m − 4 ≥ 2`: `m ≥ 6`, 3.5. `o2` needs `m ≥ 4` and `m − 2 ≥ 2`: `m ≥ 4`, 3.9.
///   So 3.5 (`m ≥ 6`), 3.9 (`4 ≤ m < 6`), else ∞.
/// * `Opt(0,1,m)`: Case 1 only. `o1`: `5 + 1 ≤ m`, `6 ≤ m`: 3 for `m ≥ 6`; `o2`: `3 + 1 ≤ m`,
///   `4 ≤ m`: 3.4 for `m ≥ 4`.
/// * `Opt(0,2,m)`: Case 1 `o1` (`m ≥ 6`): 3 + `Opt(1,2,m−4)`: 3 + 3.9 = 6.9 for `m ∈ [8,10)`,
///   3 + 3.5 = 6.5 for `m ≥ 10`. Case 1 `o2` (`m ≥ 4`): 3.4 + `Opt(1,2,m−2)`: 7.3 for
///   `m ∈ [6,8)`, 6.9 for `m ≥ 8`. Case 2, `i = 1` (`f0 peak 2 ≤ m`): 1 + `Opt(1,2,m−1)` +
///   `Opt(0,1,m)`: `m = 5`: 1 + 3.9 + 3.4 = 8.3; `m = 6`: 1 + 3.9 + 3 = 7.9; `m ≥ 7`:
///   1 + 3.5 + 3 = 7.5; `m ≤ 4`: ∞ (`Opt(1,2,3)` = ∞).
/// * Hence `Opt(0,2,m)`: `m ≥ 10`: 6.5 (o1, o1); `m = 8, 9`: 6.9 (a tie); `m = 7`: 7.3
///   (o2, o2; Case 2 gives 7.5); `m = 6`: 7.3; `m = 5`: 8.3 (Case 2:
///   `F^0_0`, block 1 with o2, block 0 with o2); `m ≤ 4`: ∞.
fn digest_a() -> RkChain {
    let block = RkBlock {
        x_in: 1,
        delta_out: 1,
        f0: FastForward { time: 1.0, peak: 2 },
        options: vec![opt(1.0, 2.0, 5, 4, 6), opt(1.0, 2.4, 3, 2, 4)],
    };
    RkChain { blocks: vec![block.clone(), block], loss: RkLoss { time: 0.5, peak: 2 } }
}

#[test]
fn digest_a_by_hand() {
    let chain = digest_a();
    let expect = [
        (4, None),
        (5, Some(8.3)),
        (6, Some(7.3)),
        (7, Some(7.3)),
        (8, Some(6.9)),
        (9, Some(6.9)),
        (10, Some(6.5)),
        (50, Some(6.5)),
    ];
    for (m, want) in expect {
        let got = rk_rotor(&chain, m, None);
        match (want, &got) {
            (None, None) => {}
            (Some(w), Some(sol)) => {
                assert!((sol.time - w).abs() < 1e-12, "m = {m}: {} ≠ {w}", sol.time);
                let (t, peak) = evaluate(&chain, &sol.ops).unwrap();
                assert!((t - w).abs() < 1e-12 && peak <= m, "m = {m}: evaluate gives {t}, {peak}");
            }
            _ => panic!("m = {m}: expected {want:?}, got {got:?}"),
        }
    }
    use RkOp::*;
    let ops = rk_rotor(&chain, 5, None).unwrap().ops;
    let want = [
        FastForward(0),
        Forward { block: 1, option: 1 },
        Loss,
        Backward { block: 1, option: 1 },
        Forward { block: 0, option: 1 },
        Backward { block: 0, option: 1 },
    ];
    assert_eq!(ops, want);
    // The replay by hand: FF(0) 2; Forward 1 a_0 + 3 = 4; loss a_0 + keep 2 + 2 = 5;
    // Backward 1 a_0 + 4 = 5; Forward 0 δ_1 + 3 = 4 (a_1 freed at once); Backward 0 4.
    assert_eq!(evaluate(&chain, &want), Ok((8.3, 5)));
    assert_eq!(
        rk_rotor(&chain, 10, None).unwrap().ops,
        [
            Forward { block: 0, option: 0 },
            Forward { block: 1, option: 0 },
            Loss,
            Backward { block: 1, option: 0 },
            Backward { block: 0, option: 0 }
        ]
    );
}

#[test]
fn evaluate_rejects_malformed() {
    use RkOp::*;
    let chain = digest_a();
    let f = |b, o| Forward { block: b, option: o };
    let bw = |b, o| Backward { block: b, option: o };
    let bad: [&[RkOp]; 8] = [
        &[f(0, 0), f(1, 0), bw(1, 0), bw(0, 0)],                       // no loss
        &[f(0, 0), f(1, 0), Loss, bw(0, 0), bw(1, 0)],                 // wrong order
        &[f(0, 0), f(1, 0), Loss, bw(1, 1), bw(0, 0)],                 // wrong option
        &[f(0, 0), f(1, 0), Loss, Loss, bw(1, 0), bw(0, 0)],           // loss twice
        &[f(1, 0), Loss, bw(1, 0), f(0, 0), bw(0, 0)],                 // a_1 never computed
        &[f(0, 0), f(1, 0), FastForward(0), Loss, bw(1, 0), bw(0, 0)], // loss not fed
        &[f(0, 0), f(1, 0), Loss, bw(1, 0), bw(0, 0), f(0, 0)],        // op after the end
        &[f(0, 0), f(1, 0), Loss, bw(1, 0), f(0, 1), bw(0, 0)],        // intervening Forward
    ];
    for ops in bad {
        assert!(evaluate(&chain, ops).is_err(), "{ops:?}");
    }
    // A FastForward between a Forward and its Backward is allowed, and a recomputed a_s
    // does not replace the one the Forward saved (both are resident then).
    let ok = [f(0, 1), f(1, 1), Loss, bw(1, 1), FastForward(0), bw(0, 1)];
    // Forward 0: 3; Forward 1: keep0 2 + 3 = 5; loss: keep0 2 + keep1 2 + 2 = 6;
    // Backward 1: keep0 2 + 4 = 6; FF(0): keep0 2 (a_0 included in f0.peak) − 1 + δ_1 1 + 2 = 4;
    // its a_1 is never read. Backward 0: 4.
    assert_eq!(evaluate(&chain, &ok), Ok((1.0 + 1.0 + 0.5 + 2.4 + 1.0 + 2.4, 6)));
}

/// A random chain whose sizes are consistent with their definitions (`keep` within
/// `fwd_peak` beside `a_{s+1}`, `bwd_peak` at least `keep + δ_{s+1} + δ_s`, `F^0` no slower
/// and no larger than an option's forward, …). Times are
/// small integers, so sums are exact.
fn random_chain(rng: &mut Rng, l: usize, max_opts: u64, scale: u64) -> RkChain {
    let a: Vec<u64> = (0..=l).map(|_| rng.range(1, 4) * scale).collect();
    let delta: Vec<u64> = (0..=l).map(|_| rng.range(1, 4) * scale).collect(); // delta[s] = |δ_s|
    let blocks = (0..l)
        .map(|s| {
            // F^0 is no slower and no larger than any option's forward.
            let f0 = FastForward { time: rng.range(1, 3) as f64, peak: a[s] + a[s + 1] + rng.range(0, 2) * scale };
            let n = rng.range(1, max_opts);
            let options = (0..n)
                .map(|_| {
                    let internals = rng.range(0, 5) * scale;
                    let saved = rng.range(0, internals / scale) * scale;
                    let keep = a[s] + saved;
                    opt(
                        f0.time + rng.range(0, 1) as f64,
                        rng.range(1, 5) as f64,
                        (a[s] + internals + a[s + 1] + rng.range(0, 2) * scale).max(f0.peak),
                        keep,
                        keep + delta[s + 1] + delta[s] + rng.range(0, 3) * scale,
                    )
                })
                .collect();
            RkBlock { x_in: a[s], delta_out: delta[s + 1], f0, options }
        })
        .collect();
    RkChain { blocks, loss: RkLoss { time: rng.range(0, 2) as f64, peak: a[l] + delta[l] + rng.range(0, 2) * scale } }
}

/// Whether `a_j` is held: not at all, for the next op only (which must read it), or until
/// the backward of block `j`.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Held {
    No,
    Next,
    Persistent,
}

/// Enumerates op sequences one op at a time (no Case 1 / Case 2 recursion), in the class the
/// DP optimizes over: *persistent* sequences, where every `a_j` a forward produces is either
/// read by the very next op (a `FastForward(j)`, or the loss for `a_L`) and then dropped, or
/// held until the backward of block `j` (never recomputed meanwhile); every saved set is
/// used by its backward; the loss directly follows a `Forward` of block `L − 1`; nothing is
/// forwarded whose output no later op can use; each block is forwarded at most `cap` times;
/// and *nested*: a block `s` is forwarded only when no `a_j` (`j > s`) and no saved set of a
/// block `j > s` is held (so a sub-chain's backward completes before the blocks before it
/// run again).
struct Enumerate<'a> {
    chain: &'a RkChain,
    cap: usize,
    held: Vec<Held>,
    saved: Vec<Option<usize>>,
    forwards: Vec<usize>,
    loss_done: bool,
    /// Blocks `nb..L` are done (their backward ran).
    nb: usize,
    seq: Vec<RkOp>,
    out: Vec<Vec<RkOp>>,
}

impl Enumerate<'_> {
    fn all(chain: &RkChain, cap: usize) -> Vec<Vec<RkOp>> {
        let l = chain.blocks.len();
        let mut held = vec![Held::No; l + 1];
        held[0] = Held::Persistent;
        let mut e = Enumerate {
            chain,
            cap,
            held,
            saved: vec![None; l],
            forwards: vec![0; l],
            loss_done: false,
            nb: l,
            seq: vec![],
            out: vec![],
        };
        e.go();
        e.out
    }

    fn with<F: FnOnce(&mut Self)>(&mut self, op: RkOp, f: F) {
        self.seq.push(op);
        f(self);
        self.seq.pop();
    }

    fn go(&mut self) {
        let l = self.chain.blocks.len();
        if self.nb == 0 && self.loss_done {
            self.out.push(self.seq.clone());
            return;
        }
        // An a_j held for the next op only.
        if let Some(j) = (0..=l).find(|&j| self.held[j] == Held::Next) {
            if j == l {
                self.held[l] = Held::No;
                self.loss_done = true;
                self.with(RkOp::Loss, |e| e.go());
                self.loss_done = false;
                self.held[l] = Held::Next;
            } else {
                self.fast_forward(j);
            }
            return;
        }
        for s in 0..self.nb {
            // Nested: a block is forwarded only when nothing beyond it is held.
            let beyond =
                self.held[s + 1..].iter().any(|&h| h != Held::No) || self.saved[s + 1..].iter().any(Option::is_some);
            if self.held[s] == Held::Persistent && !beyond {
                self.fast_forward(s);
                self.forward(s);
            }
        }
        let b = self.nb.wrapping_sub(1);
        if self.loss_done && self.held[b] == Held::Persistent {
            if let Some(o) = self.saved[b] {
                self.saved[b] = None;
                self.held[b] = Held::No;
                self.nb -= 1;
                self.with(RkOp::Backward { block: b, option: o }, |e| e.go());
                self.nb += 1;
                self.held[b] = Held::Persistent;
                self.saved[b] = Some(o);
            }
        }
    }

    fn fast_forward(&mut self, s: usize) {
        let l = self.chain.blocks.len();
        // Its output a_{s+1} must be of use (s + 1 < nb; a_L only through a Forward), absent,
        // and block s must not hold a saved set (its a_{s+1} was then held persistently).
        if s + 1 >= self.nb || s + 1 == l || self.held[s + 1] != Held::No || self.saved[s].is_some() {
            return;
        }
        if self.forwards[s] == self.cap {
            return;
        }
        let before = self.held[s];
        if before == Held::Next {
            self.held[s] = Held::No;
        }
        self.forwards[s] += 1;
        for h in [Held::Next, Held::Persistent] {
            self.held[s + 1] = h;
            self.with(RkOp::FastForward(s), |e| e.go());
        }
        self.held[s + 1] = Held::No;
        self.forwards[s] -= 1;
        self.held[s] = before;
    }

    fn forward(&mut self, s: usize) {
        let l = self.chain.blocks.len();
        if self.saved[s].is_some() || self.forwards[s] == self.cap || (s + 1 == l && self.loss_done) {
            return;
        }
        // a_{s+1}: for the loss (s + 1 = L), dead (s + 1 = nb < L: δ_{s+1} exists), or held.
        let out = if s + 1 == l {
            Held::Next
        } else if s + 1 == self.nb {
            Held::No
        } else if self.held[s + 1] == Held::No {
            Held::Persistent
        } else {
            return;
        };
        self.forwards[s] += 1;
        self.held[s + 1] = out;
        for o in 0..self.chain.blocks[s].options.len() {
            self.saved[s] = Some(o);
            self.with(RkOp::Forward { block: s, option: o }, |e| e.go());
        }
        self.saved[s] = None;
        self.held[s + 1] = Held::No;
        self.forwards[s] -= 1;
    }
}

fn store_all_peak(chain: &RkChain) -> u64 {
    let l = chain.blocks.len();
    let mut ops: Vec<RkOp> = (0..l).map(|s| RkOp::Forward { block: s, option: 0 }).collect();
    ops.push(RkOp::Loss);
    ops.extend((0..l).rev().map(|s| RkOp::Backward { block: s, option: 0 }));
    evaluate(chain, &ops).unwrap().1
}

#[test]
fn matches_brute_force_on_small_chains() {
    let mut rng = Rng::new(0x5eed_0002);
    let (mut cases, mut feasible, mut sequences) = (0, 0, 0);
    for case in 0..400 {
        let l = 1 + case % 4;
        let chain = random_chain(&mut rng, l, 3, 1);
        let seqs = Enumerate::all(&chain, l.max(3));
        sequences += seqs.len();
        let scored: Vec<(f64, u64)> = seqs.iter().map(|ops| evaluate(&chain, ops).unwrap()).collect();
        let top = store_all_peak(&chain).max(scored.iter().map(|p| p.1).max().unwrap()) + 1;
        for m in 0..=top {
            let best = scored.iter().filter(|p| p.1 <= m).map(|p| p.0).fold(f64::INFINITY, f64::min);
            let got = rk_rotor(&chain, m, None);
            match &got {
                None => assert!(best.is_infinite(), "case {case}, m = {m}: brute force {best}, DP none\n{chain:?}"),
                Some(sol) => {
                    assert_eq!(sol.time, best, "case {case}, m = {m}: DP {:?}\n{chain:?}", sol.ops);
                    let (t, peak) = evaluate(&chain, &sol.ops).unwrap();
                    assert!(t == sol.time && peak <= m);
                    feasible += 1;
                }
            }
            cases += 1;
        }
    }
    eprintln!("{cases} cases, {feasible} feasible, {sequences} sequences");
    assert!(cases > 3000 && feasible > 1000, "{cases} cases, {feasible} feasible, {sequences} sequences");
}

#[test]
fn own_plans_replay_within_budget() {
    let mut rng = Rng::new(0x5eed_0003);
    let mut feasible = 0;
    for case in 0..300 {
        let l = 1 + case % 12;
        let scale = rng.range(1, 1_000_000);
        let chain = random_chain(&mut rng, l, 6, scale);
        let all = store_all_peak(&chain);
        let memory = rng.range(all / 4, all + all / 8);
        let slots = if case % 5 == 4 { None } else { Some(50) };
        let Some(sol) = rk_rotor(&chain, memory, slots) else { continue };
        let (t, peak) = evaluate(&chain, &sol.ops).unwrap_or_else(|e| panic!("case {case}: {e}\n{:?}", sol.ops));
        assert!((t - sol.time).abs() <= 1e-9 * t.abs().max(1.0), "case {case}: {t} vs {}", sol.time);
        assert!(peak <= memory, "case {case}: peak {peak} > {memory}");
        feasible += 1;
    }
    assert!(feasible > 150, "{feasible}");
}

#[test]
fn slots_never_beat_exact_and_more_memory_never_costs_more() {
    let mut rng = Rng::new(0x5eed_0004);
    for case in 0..200 {
        let l = 1 + case % 8;
        let chain = random_chain(&mut rng, l, 4, 1);
        let top = store_all_peak(&chain) + 2;
        let mut last = f64::INFINITY;
        for m in 0..=top {
            let exact = rk_rotor(&chain, m, None).map_or(f64::INFINITY, |s| s.time);
            assert!(exact <= last, "case {case}, m = {m}: {exact} > {last} at m − 1");
            last = exact;
            let slotted = rk_rotor(&chain, m, Some(7)).map_or(f64::INFINITY, |s| s.time);
            assert!(slotted >= exact, "case {case}, m = {m}: slots {slotted} < exact {exact}");
        }
        let unlimited = rk_rotor(&chain, 10_000, None).unwrap().time;
        assert!(unlimited <= last, "case {case}");
        assert_eq!(unlimited, rk_rotor(&chain, u32::MAX as u64, Some(500)).unwrap().time, "case {case}");
    }
}

#[test]
fn empty_chain_is_the_loss() {
    let chain = RkChain { blocks: vec![], loss: RkLoss { time: 2.0, peak: 7 } };
    assert_eq!(rk_rotor(&chain, 6, None), None);
    let sol = rk_rotor(&chain, 7, None).unwrap();
    assert_eq!((sol.ops.as_slice(), sol.time), ([RkOp::Loss].as_slice(), 2.0));
    assert_eq!(evaluate(&chain, &sol.ops), Ok((2.0, 7)));
}

/// A plan the DP's space lacks (module docs, "Limits"): `F^0` through the loss, then the
/// block again with its option. One block, `a_0 = a_1 = δ_0 = δ_1 = 1`; option: `fwd_peak`
/// 4 (2 internals), `keep` 3, `bwd_peak` 5; `F^0` peak 2; loss peak 3.
/// The DP (Case 1 only) needs `keep + loss.peak = 6`. `FF(0), Loss, Forward, Backward`
/// peaks at `max(2, a_0 + 3, δ_1 + 4, 5) = 5` and takes `1 + 0 + 1 + 1 = 3`.
#[test]
fn loss_recomputation_is_outside_the_dp() {
    let chain = RkChain {
        blocks: vec![RkBlock {
            x_in: 1,
            delta_out: 1,
            f0: FastForward { time: 1.0, peak: 2 },
            options: vec![opt(1.0, 1.0, 4, 3, 5)],
        }],
        loss: RkLoss { time: 0.0, peak: 3 },
    };
    assert_eq!(rk_rotor(&chain, 5, None), None);
    assert_eq!(rk_rotor(&chain, 6, None).map(|s| s.time), Some(2.0));
    let ops = [
        RkOp::FastForward(0),
        RkOp::Loss,
        RkOp::Forward { block: 0, option: 0 },
        RkOp::Backward { block: 0, option: 0 },
    ];
    assert_eq!(evaluate(&chain, &ops), Ok((3.0, 5)));
}

/// Rockmate's DP on a chain's own blocks ([`RkChain::from_chain`]: one option each) is
/// Rotor's. On small random chains, at budgets from a little below recompute-all's peak
/// to store-all's, wherever rk-Rotor has a plan, written as chain ops ([`chain_ops`]) it
/// passes the simulator within the budget in the DP's time, and that time is Rotor's
/// (exact sizes both). Where only Rotor has a plan, it is the one kind of plan rk-Rotor
/// leaves out (the module's "Limits"): block `L − 1` run without its graph just before
/// the loss, and recomputed after it.
#[test]
fn on_a_chains_blocks_rk_rotor_is_rotor() {
    use crate::oracle::brute::tests::{budgets, check, same};
    use crate::remat::rotor::persistent;
    use crate::Slots;
    let mut rng = Rng::new(0x70c_4a7e);
    let (mut equal, mut neither, mut only_rotor) = (0, 0, 0);
    for k in 0..300 {
        let l = 1 + k % 7;
        let chain = if k % 3 == 2 {
            pebble_testkit::random_chain(&mut rng, l)
        } else {
            pebble_testkit::small_chain(&mut rng, l, k % 2 == 0)
        };
        let blocks = RkChain::from_chain(&chain);
        for budget in budgets(&chain) {
            let who = format!("{chain:?} at {budget}");
            let rotor = persistent(&chain, budget, Slots::Exact).ok();
            let memory = budget.saturating_sub(chain.static_bytes);
            let rk = rk_rotor(&blocks, memory, Some(memory.max(1) as usize));
            match (rotor, rk) {
                (Some((time, _)), Some(rk)) => {
                    check(&chain, budget, &chain_ops(&rk.ops), rk.time, "rk-rotor");
                    assert!(same(time, rk.time), "rotor {time} ≠ rk-rotor {}: {who}", rk.time);
                    equal += 1;
                }
                (None, None) => neither += 1,
                (Some((_, ops)), None) => {
                    let through_the_loss = ops.windows(2).any(|w| {
                        matches!(w, [Op::Forward { stage, mode }, Op::Backward { stage: b }]
                            if *stage + 1 == l && *b == l && *mode != ForwardMode::KeepAll)
                    });
                    assert!(through_the_loss, "only Rotor has a plan, not of the kind rk-Rotor leaves out: {who}");
                    only_rotor += 1;
                }
                (None, Some(_)) => panic!("only rk-Rotor has a plan: {who}"),
            }
        }
    }
    eprintln!("{equal} budgets with equal times, {only_rotor} with Rotor's plan alone, {neither} with none");
    assert!(equal > 1500 && neither > 300 && only_rotor <= 20, "{equal}, {only_rotor}, {neither}");
}
