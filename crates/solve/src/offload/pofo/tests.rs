use pebble_testkit::{random_chain, ChainSpec, Rng};

use super::*;
use crate::offload::OffChain;
use crate::plan;

mod brute;

/// The recursion as it was first written (no pruning, `F^ck`'s terms summed at every
/// state, the schedule's transitions recomputed), kept to check the pruned DP against.
mod reference {
    use pebble_graph::Chain;
    use pebble_schedule::{ForwardMode, Op, Tensor};
    use rustc_hash::FxHashMap;

    use super::super::{slot_size, wait, Found, Sized, Transfer, INF};
    use crate::Slots;

    /// The first rounding, through `round`.
    fn up(v: f64) -> i64 {
        if v <= 0.5 {
            0
        } else {
            v.round() as i64
        }
    }

    #[derive(Debug, Clone, Copy)]
    enum Back {
        Base,
        All,
        Ck(usize),
    }

    #[derive(Debug, Clone, Copy)]
    enum Fwd {
        Loss,
        All { off: bool },
        Ck { j: usize, off: bool },
    }

    type BackMemo = FxHashMap<(u32, u32, i64, i64), (f64, Back)>;
    type FwdMemo = FxHashMap<(u32, bool, i64, i64, i64), (f64, Fwd)>;

    struct Pofo<'a> {
        c: &'a Sized,
        back: BackMemo,
        fwd: FwdMemo,
    }

    impl Pofo<'_> {
        fn back(&mut self, s: usize, t: usize, m: i64, delta: i64) -> f64 {
            let key = (s as u32, t as u32, m, delta);
            if let Some(&(v, _)) = self.back.get(&key) {
                return v;
            }
            let (v, choice) = self.back_compute(s, t, m, delta);
            self.back.insert(key, (v, choice));
            v
        }

        fn back_compute(&mut self, s: usize, t: usize, m: i64, delta: i64) -> (f64, Back) {
            let c = self.c;
            let bp = c.beta_pre;
            let free = (m - delta) as f64;
            let all_f = c.all_f(s, t);
            let b = c.b(s);
            let m_all = all_f.max(b);
            if s == t {
                if m < m_all {
                    return (INF, Back::Base);
                }
                let e = (all_f as f64 - c.btime[s] * bp - free).max(b as f64 - free);
                return (c.ftime[s] + c.btime[s] + wait(e, bp), Back::Base);
            }
            let mut best = (INF, Back::Base);
            if m >= m_all {
                let eb = (b as f64 - free).max(0.0);
                let d1 = up(delta as f64 - c.btime[s] * bp - eb);
                let inner = self.back(s + 1, t, m - c.xbar[s + 1], d1);
                if inner < INF {
                    let d2 = (d1 as f64 - inner * bp).max(0.0);
                    let ef = (all_f as f64 - (m as f64 - d2)).max(0.0);
                    best = (c.ftime[s] + inner + c.btime[s] + wait(ef + eb, bp), Back::All);
                }
            }
            let grad = c.x[t + 1];
            let m_none = (s..=t).map(|h| c.none_f(s, h, grad)).max().unwrap_or(0);
            if m >= m_none {
                for j in s + 1..=t {
                    let left = self.back(s, j - 1, m, delta);
                    if left == INF {
                        continue;
                    }
                    let d2 = up(delta as f64 - left * bp);
                    let right = self.back(j, t, m - c.x[j], d2);
                    if right == INF {
                        continue;
                    }
                    let d3 = (d2 as f64 - right * bp).max(0.0);
                    let mut worst = f64::NEG_INFINITY;
                    let mut after = 0.0;
                    for k in (s..j).rev() {
                        worst = worst.max(c.none_f(s, k, grad) as f64 - bp * after);
                        after += c.ftime[k];
                    }
                    let ef = (worst - (m as f64 - d3)).max(0.0);
                    let v = after + right + left + wait(ef, bp);
                    if v < best.0 {
                        best = (v, Back::Ck(j));
                    }
                }
            }
            best
        }

        /// The input of stage `s`: `ā_s` (`x`) or `a_s`.
        fn input(&self, s: usize, x: bool) -> i64 {
            if x {
                self.c.xbar[s]
            } else {
                self.c.x[s]
            }
        }

        fn fwd(&mut self, s: usize, x: bool, a: i64, df: i64, db: i64) -> f64 {
            let key = (s as u32, x, a, df, db);
            if let Some(&(v, _)) = self.fwd.get(&key) {
                return v;
            }
            let (v, choice) = self.fwd_compute(s, x, a, df, db);
            self.fwd.insert(key, (v, choice));
            v
        }

        /// Table 4.1: the state after a step that lets the links move `dfm` and `dbm`.
        fn next(a: i64, df: i64, db: i64, input: i64, dfm: f64, dbm: f64, off: bool) -> (i64, i64, i64) {
            if off {
                (a, up(df as f64 + input as f64 - dfm), up(db as f64 - dbm) + input)
            } else {
                (a + input, up(df as f64 - dfm), up(db as f64 - dbm))
            }
        }

        fn fwd_compute(&mut self, s: usize, x: bool, a: i64, df: i64, db: i64) -> (f64, Fwd) {
            let c = self.c;
            let (bo, bp, mm) = (c.beta_off, c.beta_pre, c.memory);
            let input = self.input(s, x);
            let (mf, mb) = (a + df + input, a + db + input);
            let room = mm - a;
            if s == c.l {
                let b = c.b(s);
                if b + input > room {
                    return (INF, Fwd::Loss);
                }
                let ef = (mf - mm).max(0) as f64;
                let eb = (b - (mm - mb)).max(0) as f64;
                let left_f = (df as f64 - ef).max(0.0);
                let left_b = (db as f64 - c.btime[s] * bp - eb).max(0.0);
                return (c.btime[s] + wait(ef, bo) + wait(eb, bp) + wait(left_f, bo) + wait(left_b, bp), Fwd::Loss);
            }
            let can_off = input > 0 && bo > 0.0 && bp > 0.0;
            let mut best = (INF, Fwd::Loss);
            // F_s^all first.
            let all_f = c.xbar[s + 1] + c.ftmp[s];
            let b = c.b(s);
            if all_f + input <= room && b + input <= room {
                let ef = (all_f - (mm - mf)).max(0) as f64;
                let eb = (b - (mm - mb)).max(0) as f64;
                let (dfm, dbm) = (c.ftime[s] * bo + ef, c.btime[s] * bp + eb);
                let here = c.ftime[s] + c.btime[s] + wait(ef, bo) + wait(eb, bp);
                for off in [false, true] {
                    if off && !can_off {
                        continue;
                    }
                    let (a2, df2, db2) = Self::next(a, df, db, input, dfm, dbm, off);
                    let v = here + self.fwd(s + 1, true, a2, df2, db2);
                    if v < best.0 {
                        best = (v, Fwd::All { off });
                    }
                }
            }
            // F_s^ck first, a_j kept (up to j = L, as rotor: the loss then reads a_L alone).
            let mut fwd_time = 0.0;
            let mut worst = f64::NEG_INFINITY;
            let mut fits_keep = true;
            let mut fits_off = true;
            for j in s + 1..=c.l {
                let k = j - 1;
                let need = c.none_f(s, k, 0);
                worst = worst.max(need as f64 - bo * fwd_time);
                fwd_time += c.ftime[k];
                fits_keep &= need + input <= room;
                fits_off &= if k == s { need + input <= room } else { need <= room };
                if !fits_keep && !fits_off {
                    break;
                }
                let seg = self.back(s, j - 1, room - input, db);
                if seg == INF {
                    continue;
                }
                let ef = (worst - (mm - mf) as f64).max(0.0);
                let (dfm, dbm) = (fwd_time * bo + ef, seg * bp);
                let here = fwd_time + wait(ef, bo) + seg;
                for off in [false, true] {
                    if !(if off { can_off && fits_off } else { fits_keep }) {
                        continue;
                    }
                    let (a2, df2, db2) = Self::next(a, df, db, input, dfm, dbm, off);
                    let v = here + self.fwd(j, false, a2, df2, db2);
                    if v < best.0 {
                        best = (v, Fwd::Ck { j, off });
                    }
                }
            }
            best
        }

        // ----- the schedule ---------------------------------------------------------------

        fn emit_back(&self, s: usize, t: usize, m: i64, delta: i64, ops: &mut Vec<Op>) {
            let c = self.c;
            let bp = c.beta_pre;
            let (_, choice) = self.back[&(s as u32, t as u32, m, delta)];
            match choice {
                Back::Base => {
                    ops.push(Op::Forward { stage: s, mode: ForwardMode::KeepAll });
                    ops.push(Op::Backward { stage: s });
                }
                Back::All => {
                    let eb = (c.b(s) as f64 - (m - delta) as f64).max(0.0);
                    let d1 = up(delta as f64 - c.btime[s] * bp - eb);
                    ops.push(Op::Forward { stage: s, mode: ForwardMode::KeepAll });
                    self.emit_back(s + 1, t, m - c.xbar[s + 1], d1, ops);
                    ops.push(Op::Backward { stage: s });
                }
                Back::Ck(j) => {
                    let left = self.back[&(s as u32, (j - 1) as u32, m, delta)].0;
                    let d2 = up(delta as f64 - left * bp);
                    ops.push(Op::Forward { stage: s, mode: ForwardMode::Checkpoint });
                    ops.extend((s + 1..j).map(|h| Op::Forward { stage: h, mode: ForwardMode::Discard }));
                    self.emit_back(j, t, m - c.x[j], d2, ops);
                    self.emit_back(s, j - 1, m, delta, ops);
                }
            }
        }

        fn emit_fwd(&self, s: usize, x: bool, a: i64, df: i64, db: i64, out: &mut Found) {
            let c = self.c;
            let (bo, bp, mm) = (c.beta_off, c.beta_pre, c.memory);
            let input = self.input(s, x);
            let (mf, mb) = (a + df + input, a + db + input);
            let tensor = if x && s > 0 { Tensor::Saved(s) } else { Tensor::Activation(s) };
            let (_, choice) = self.fwd[&(s as u32, x, a, df, db)];
            match choice {
                Fwd::Loss => out.compute.push(Op::Backward { stage: s }),
                Fwd::All { off } => {
                    let all_f = c.xbar[s + 1] + c.ftmp[s];
                    let ef = (all_f - (mm - mf)).max(0) as f64;
                    let eb = (c.b(s) - (mm - mb)).max(0) as f64;
                    let (a2, df2, db2) = Self::next(a, df, db, input, c.ftime[s] * bo + ef, c.btime[s] * bp + eb, off);
                    if off {
                        out.offloads.push(Transfer { at: out.compute.len(), tensor, fraction: 1.0 });
                    }
                    out.compute.push(Op::Forward { stage: s, mode: ForwardMode::KeepAll });
                    self.emit_fwd(s + 1, true, a2, df2, db2, out);
                    out.compute.push(Op::Backward { stage: s });
                }
                Fwd::Ck { j, off } => {
                    let mut fwd_time = 0.0;
                    let mut worst = f64::NEG_INFINITY;
                    for k in s..j {
                        worst = worst.max(c.none_f(s, k, 0) as f64 - bo * fwd_time);
                        fwd_time += c.ftime[k];
                    }
                    let seg = self.back[&(s as u32, (j - 1) as u32, mm - a - input, db)].0;
                    let ef = (worst - (mm - mf) as f64).max(0.0);
                    let (a2, df2, db2) = Self::next(a, df, db, input, fwd_time * bo + ef, seg * bp, off);
                    if off {
                        out.offloads.push(Transfer { at: out.compute.len(), tensor, fraction: 1.0 });
                    }
                    out.compute.push(Op::Forward { stage: s, mode: ForwardMode::Checkpoint });
                    out.compute.extend((s + 1..j).map(|h| Op::Forward { stage: h, mode: ForwardMode::Discard }));
                    self.emit_fwd(j, false, a2, df2, db2, out);
                    self.emit_back(s, j - 1, mm - a - input, db, &mut out.compute);
                }
            }
        }
    }

    /// [`super::super::dp`], the first formulation.
    pub fn dp(chain: &Chain, budget: u64, slots: Slots, beta_off: f64, beta_pre: f64) -> Option<Found> {
        let memory = budget.checked_sub(chain.static_bytes)?;
        let slot = slot_size(memory, slots);
        let c = Sized::new(chain, memory, slot, beta_off, beta_pre);
        let mut p = Pofo { c: &c, back: FxHashMap::default(), fwd: FxHashMap::default() };
        let value = p.fwd(0, false, 0, 0, 0);
        if value == INF {
            return None;
        }
        let mut found = Found { value, compute: Vec::new(), offloads: Vec::new() };
        p.emit_fwd(0, false, 0, 0, 0, &mut found);
        Some(found)
    }
}

fn opts(beta: f64, slots: Slots) -> SolveOptions {
    SolveOptions { machine: pebble_machine::Machine::default().with_bandwidth(beta), slots, ..SolveOptions::default() }
}

/// Random chains and budgets from rotor's least feasible budget to store-all's peak.
fn instances(seed: u64, count: usize) -> Vec<(Chain, u64)> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    while out.len() < count {
        let l = rng.range(2, 7) as usize;
        let chain = random_chain(&mut rng, l);
        let high = OffChain::new(&chain, u64::MAX).unwrap().peak() as u64 + chain.static_bytes;
        let low = chain.static_bytes + chain.x[0];
        out.push((chain, low + rng.range(0, high - low)));
    }
    out
}

/// The pruned DP finds the first formulation's value, bit for bit, and its schedule,
/// on random chains of up to 24 stages (some with zero sizes and times), on coarse and
/// fine grids, slow and fast links.
#[test]
fn the_pruned_dp_is_the_first_formulation() {
    let mut rng = Rng::new(25);
    let (mut found, mut none) = (0, 0);
    for case in 0..240 {
        let l = rng.range(2, if case % 4 == 0 { 24 } else { 10 }) as usize;
        // Zero sizes and times one time in five.
        let chain = if case % 5 == 1 { ChainSpec::SPARSE.chain(&mut rng, l) } else { random_chain(&mut rng, l) };
        let c = OffChain::new(&chain, u64::MAX).unwrap();
        let (low, high) = (c.least_memory() as u64, c.peak() as u64);
        let budget = chain.static_bytes + low + rng.range(0, high.saturating_sub(low));
        let slots = [Slots::Count(8), Slots::Count(20), Slots::Count(50), Slots::Exact][case % 4];
        let slots = if l > 12 && slots == Slots::Exact { Slots::Count(30) } else { slots };
        let beta = [1e-3, 0.5, 2.0, 8.0, 1e3][rng.range(0, 4) as usize];
        let (bo, bp) = if case % 3 == 0 { (beta, 2.0 * beta) } else { (beta, beta) };
        let fast = dp(&chain, budget, slots, bo, bp);
        let slow = reference::dp(&chain, budget, slots, bo, bp);
        match (fast, slow) {
            (Some(f), Some(r)) => {
                found += 1;
                assert!(
                    f.value == r.value,
                    "{} at {budget}, {slots:?}, β {bo}/{bp}: {} vs {}",
                    chain.to_json(),
                    f.value,
                    r.value
                );
                assert_eq!(f.compute, r.compute, "{} at {budget}", chain.to_json());
                assert_eq!(f.offloads, r.offloads, "{} at {budget}", chain.to_json());
            }
            (None, None) => none += 1,
            (f, r) => {
                panic!("{} at {budget}: {:?} vs {:?}", chain.to_json(), f.map(|f| f.value), r.map(|r| r.value))
            }
        }
    }
    assert!(found > 180, "{found} solved, {none} infeasible");
}

/// β → 0: no transfer pays, and pofo is rotor (§10.5, and C_Δ(·, 0) = C_MP).
#[test]
fn without_bandwidth_pofo_is_rotor() {
    let mut compared = 0;
    for (chain, budget) in instances(21, 150) {
        let rotor = crate::remat::rotor::persistent(&chain, budget, Slots::Exact).ok().map(|(v, _)| v);
        let pofo = dp(&chain, budget, Slots::Exact, 1e-12, 1e-12).map(|f| f.value);
        match (rotor, pofo) {
            (Some(r), Some(p)) => {
                compared += 1;
                assert!((r - p).abs() <= 1e-9 * r, "{}: rotor {r}, pofo {p}", chain.to_json());
            }
            // Only offloading makes it fit, at a cost of the order of 1/β.
            (None, None) => {}
            (None, Some(p)) if p > 1e9 => {}
            (r, p) => panic!("{}: rotor {r:?}, pofo {p:?} at {budget}", chain.to_json()),
        }
    }
    assert!(compared > 30, "{compared}");
}

/// β → ∞: transfers are free, so pofo is Σu wherever every op fits with its input alone.
#[test]
fn with_infinite_bandwidth_pofo_is_the_compute_time() {
    for (chain, _) in instances(22, 60) {
        let c = OffChain::new(&chain, u64::MAX).unwrap();
        let alone = c.least_memory() as u64;
        let found = dp(&chain, alone + chain.static_bytes, Slots::Exact, 1e15, 1e15).expect("every op fits");
        assert!((found.value - c.compute_time()).abs() < 1e-6, "{} vs {}", found.value, c.compute_time());
    }
}

/// pofo's DP finds the optimum of its own model (issue 47: its value, not the solver's
/// best of its candidates). On 36 chains of 2 to 5 stages, each at five budgets (just
/// below the least any offloading schedule needs, each op alone with its input; that
/// least; and 20, 50, 80% of the way to keep-all's peak), on links of 1, 2 and 8 bytes per
/// time unit both ways and of 1 down and 4 up (whole numbers, as the stage times are:
/// every quantity the recursion rounds is then a whole byte), with exact sizes: the DP's
/// value is the least time over every decision tree of Theorem 12's recursion, each
/// timed on its own ([`brute::Model`], written from the module docs and sharing no code
/// with the DP: no `Sized`, no memo, no pruning), and the DP finds nothing exactly where
/// no tree fits (0.3 s in a debug build, 364,172 trees). Its value is also at most
/// rotor's persistent optimum (another DP, for `C_Δ(·, 0)`), and strictly below it in
/// more than half the cases, where the links make room.
#[test]
fn the_dp_is_the_brute_force_optimum_of_its_model() {
    let mut rng = Rng::new(23);
    let (mut equal, mut infeasible, mut below_rotor, mut trees) = (0, 0, 0, 0);
    for k in 0..36 {
        let chain = random_chain(&mut rng, 2 + k % 4);
        let c = OffChain::new(&chain, u64::MAX).unwrap();
        let (low, high) = (c.least_memory() as u64, c.peak() as u64);
        for share in [-0.01, 0.0, 0.2, 0.5, 0.8] {
            let budget = chain.static_bytes + (low as f64 + (high - low) as f64 * share) as u64;
            for (off, pre) in [(1.0, 1.0), (2.0, 2.0), (8.0, 8.0), (1.0, 4.0)] {
                let who = format!("{} at {budget}, β {off}/{pre}", chain.to_json());
                let brute = brute::Model::new(&chain, budget, off, pre).optimum();
                let found = dp(&chain, budget, Slots::Exact, off, pre);
                match (found, brute) {
                    (Some(f), Some((b, n))) => {
                        assert!((f.value - b).abs() <= 1e-9 * b, "DP {} vs brute force {b}: {who}", f.value);
                        equal += 1;
                        trees += n;
                        if let Ok((r, _)) = crate::remat::rotor::persistent(&chain, budget, Slots::Exact) {
                            assert!(f.value <= r * (1.0 + 1e-9), "DP {} > rotor {r}: {who}", f.value);
                            below_rotor += usize::from(f.value < r * (1.0 - 1e-9));
                        }
                    }
                    (None, None) => infeasible += 1,
                    (f, b) => panic!("DP {:?} vs brute force {b:?}: {who}", f.map(|f| f.value)),
                }
            }
        }
    }
    println!("{equal} equal ({trees} trees), {infeasible} infeasible, {below_rotor} below rotor");
    assert!(
        equal >= 600 && infeasible >= 30 && below_rotor >= 300,
        "{equal} equal, {infeasible} infeasible, {below_rotor} below rotor"
    );
}

/// The DP's own schedule (not the special cases) passes the simulator, close to the
/// DP's value: whole transfers and prefetches issued between ops cost a little; not
/// synchronising at the loss (OR.3) gains a little.
#[test]
fn the_dps_schedule_passes_the_simulator() {
    let (mut checked, mut total_gap) = (0, 0.0);
    for (chain, budget) in instances(24, 120) {
        let Some(f) = dp(&chain, budget, Slots::Exact, 2.0, 2.0) else { continue };
        let config = pebble_sim::SimConfig::on(pebble_machine::Machine::default().with_bandwidth(2.0));
        let s = transfer_schedule(&chain, &f.compute, &f.offloads, budget, &config).unwrap();
        let r =
            pebble_sim::simulate_chain(&chain, &s, &pebble_sim::SimConfig { budget: Some(budget), ..config }).unwrap();
        let gap = r.makespan / f.value - 1.0;
        assert!(gap.abs() < 0.5, "simulated {} against the DP's {}", r.makespan, f.value);
        total_gap += gap;
        checked += 1;
    }
    assert!(checked > 50, "{checked}");
    assert!(total_gap / (checked as f64) < 0.15, "mean gap {}", total_gap / checked as f64);
}

/// Above 2¹⁵ slots (exact sizes in bytes) the DP's tables do not fit and it finds nothing:
/// pofo returns a special case's plan saying whose it is (issue 47), and its own plan
/// (the hand chain at its own scale) says nothing.
#[test]
fn a_plan_kept_from_a_special_case_says_whose() {
    let small = pebble_testkit::hand_chain();
    let budget = small.static_bytes + 30;
    let o = opts(4.0, Slots::Exact);
    assert!(dp(&small, budget, Slots::Exact, 4.0, 4.0).is_some());
    let own = plan(&PofoSolver, Problem::Chain(&small), budget, &o).expect("a plan");
    assert_eq!(own.schedule.kept_from, None, "the DP's plan wins on the hand chain");
    let scale = 10_000;
    let mut big = small.clone();
    for v in [&mut big.x, &mut big.xbar, &mut big.ftmp, &mut big.btmp] {
        v.iter_mut().for_each(|b| *b *= scale);
    }
    big.static_bytes *= scale;
    let budget = budget * scale;
    assert!(dp(&big, budget, Slots::Exact, 4.0 * scale as f64, 4.0 * scale as f64).is_none(), "over 2^15 slots");
    let o = opts(4.0 * scale as f64, Slots::Exact);
    let kept = plan(&PofoSolver, Problem::Chain(&big), budget, &o).expect("a special case's plan");
    let from = kept.schedule.kept_from.as_deref();
    assert!(matches!(from, Some("rotor" | "offload-dp")), "{from:?}");
    assert_eq!(kept.schedule.solver.as_deref(), Some("pofo"));
}

/// A faster link never makes pofo slower (issue 48): on ResNet-50 at 500×500, batch 16,
/// `v100`, 3.38 GB, the DP's plan for 36 GB/s stalled 40 ms on its transfers (+21.5%,
/// so pofo fell back to rotor's +16.8%), where its plan for 24 GB/s runs at +9.6% on
/// either link. Solved again for slower links, it now runs at +9.1% at 36 GB/s.
#[test]
fn a_faster_link_never_makes_pofo_slower() {
    let options = pebble_zoo::ModelOptions {
        batch: Some(16),
        image: Some(500),
        profile: pebble_machine::Profile::lookup("v100").expect("v100"),
        ..Default::default()
    };
    let chain = pebble_zoo::build("resnet50", &options).expect("resnet50").chain;
    let machine = options.profile.machine;
    let run = |beta: f64| {
        let o = SolveOptions { machine: machine.with_bandwidth(beta), ..SolveOptions::default() };
        plan(&PofoSolver, Problem::Chain(&chain), 3_380_921_536, &o).expect("a plan").report.makespan
    };
    let store_all = crate::plan(
        crate::solver("store-all").expect("store-all"),
        Problem::Chain(&chain),
        u64::MAX,
        &SolveOptions { machine, ..SolveOptions::default() },
    )
    .expect("store-all")
    .report
    .makespan;
    let (at24, at36) = (run(24e9), run(36e9));
    assert!(at36 <= at24 + 1e-12, "36 GB/s: {at36} s, 24 GB/s: {at24} s");
    assert!(at36 / store_all - 1.0 < 0.095, "+{:.1}% at 36 GB/s", 100.0 * (at36 / store_all - 1.0));
}
