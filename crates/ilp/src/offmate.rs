//! OffMate (Zhao's thesis, Ch. 4; digest `seed002.md` §4) on pebble's chain view: one
//! MILP over rematerialization, activation offloading, weight and optimizer-state
//! offloading, and the optimizer step on the host CPU; then whole tensors (Algorithm 8),
//! then the simulator.
//!
//! # The step model (§4.3)
//!
//! A chain of `L` stages (the blocks) runs in `T = 2L` steps, cyclically: step `i < L` is
//! `F_i`, step `2L − 1 − i` is `B_i` (the loss is folded into `B_{L−1}`'s step). A step
//! lasts the longest of four activities: the device's compute, each link's transfers, and
//! the host CPU's optimizer steps.
//!
//! # The options per block (§4.4), in chain terms
//!
//! * [`BlockOption::Keep`] ("PyTorch"): `F_i^all`, then `B_i`;
//! * [`BlockOption::Recompute`] ("recompute all"): `F_i^ck`, then `F_i^all` and `B_i`;
//! * [`BlockOption::Offload`] ("selective + offload", with the chain's one saved set as
//!   the selection): `F_i^all`, the saved set `ā_{i+1}` offloaded while `F_{i+1}` runs
//!   and prefetched during the step before `B_{i+1}` (which reads `a_{i+1}`).
//!
//! # The MILP (4.1–4.23), as built here
//!
//! Per stage `i` (its weights are one parameter group `w`: `w[i]` bytes, `g[i]` trainable
//! bytes, `o[i]` bytes of optimizer state): `Comp_i^o ∈ {0,1}` (4.1); `X_i ∈ {0,1}`, the
//! stage updated on the CPU (the thesis's `X_w` is a fraction; pebble's simulator updates a
//! stage whole, so it is a binary here); and per step `t` the fractions `Sto`, `Ofl`, `Prf`
//! of the weights and `StoO`, `OflO`, `PrfO` of the state (4.3), and `Opt`, the part of
//! the stage's update the CPU does in step `t` (4.4). Constraints (4.5)–(4.13) as printed,
//! with three changes that make the plan one the simulator runs:
//!
//! * an offload in step `t` frees memory from step `t + 1` on (the thesis frees it within
//!   `t`), and nothing is offloaded during the backward that updates it (the host copy
//!   would be stale);
//! * a CPU-updated stage's gradient (`g[i]` bytes) leaves in the step after `B_i`, the CPU
//!   works from the step after that, and none of the weights comes back before the update
//!   is done in proportion (4.13);
//! * activation transfers of the offload option load the links in (4.21)/(4.22) (the
//!   thesis hides them in the option's time).
//!
//! Memory (4.14)–(4.17) counts the weights and states present or arriving, the gradients
//! of the stage in backward (and in flight to the host), and the activations each option
//! holds at that step, in the chain's accounting; host memory (4.18) counts what the plan
//! puts there. The objective is `Σ_t Time_t` plus a tie-break of 1% of the transfer times.
//!
//! # Post-processing (§4.6)
//!
//! Algorithm 8 with one tensor per group: a stage's weights (or state) are on the device
//! in the steps where the MILP keeps all of them, and away in the others (so memory never
//! exceeds the MILP's). Each absence starts with an offload (or a drop, when the host copy
//! is current) and ends with a prefetch issued one step ahead. The schedule is periodic;
//! the simulator judges it, and [`Offmate`] returns the fastest of a few candidates (the
//! MILP at the budget and at tightened budgets, Rotor's plans on the same chain, and the
//! practice baselines' fixed policies) that the simulator accepts.

use highs::Col;
use pebble_graph::Chain;
use pebble_schedule::{ForwardMode, Op, Schedule, Tensor, View};
use pebble_sim::Machine;
use pebble_solve::baseline::zero::require_optimizer_fields;
use pebble_solve::{Problem, SolveError, SolveOptions, Solver};

use crate::milp::{Lin, Milp, Outcome};
use crate::IlpError;

/// How a block keeps what its backward needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockOption {
    /// Keep the saved set on the device (`F_all`).
    Keep,
    /// Keep only the input, recompute the block before its backward (`F_ck`, then `F_all`).
    Recompute,
    /// Keep the saved set on the host: offload it after the forward, prefetch it back.
    Offload,
}

impl BlockOption {
    /// All options, in the order of the MILP's columns.
    pub const ALL: [BlockOption; 3] = [BlockOption::Keep, BlockOption::Recompute, BlockOption::Offload];
}

/// What the MILP may use: every technique by default; switching some off gives the
/// thesis's ablations (Table 4.2) and the rematerialization-only plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OffmateOptions {
    /// Offload activations (the third block option).
    pub activation_offload: bool,
    /// Offload weights (and optimizer states).
    pub weight_offload: bool,
    /// Update on the host CPU.
    pub cpu_optimizer: bool,
    /// Recompute (the second block option).
    pub recompute: bool,
    /// HiGHS's time limit, seconds.
    pub time_limit: Option<f64>,
    /// The host's management time per step, `H` in (4.23) (the thesis measured 50 ms of
    /// Python; pebble's planner has no interpreter in the loop, so 0 by default).
    pub management: f64,
}

impl Default for OffmateOptions {
    fn default() -> Self {
        OffmateOptions {
            activation_offload: true,
            weight_offload: true,
            cpu_optimizer: true,
            recompute: true,
            time_limit: Some(300.0),
            management: 0.0,
        }
    }
}

impl OffmateOptions {
    /// Rematerialization only: no transfer, no CPU update (Rockmate's plan on these blocks).
    pub fn remat_only() -> OffmateOptions {
        OffmateOptions { activation_offload: false, weight_offload: false, cpu_optimizer: false, ..Self::default() }
    }
}

/// The MILP's plan, before post-processing.
#[derive(Debug, Clone, PartialEq)]
pub struct OffmatePlan {
    /// The option of each block.
    pub options: Vec<BlockOption>,
    /// The stages updated on the CPU.
    pub cpu: Vec<bool>,
    /// `Sto[i][t]`: the fraction of stage `i`'s weights on the device in step `t`.
    pub weights: Vec<Vec<f64>>,
    /// `StoO[i][t]`: the fraction of its optimizer state on the device in step `t`.
    pub states: Vec<Vec<f64>>,
    /// The MILP's step time, `Σ_t Time_t` (not the simulator's).
    pub objective: f64,
    /// Whether HiGHS proved it optimal (within [`MIP_GAP`]).
    pub optimal: bool,
    /// HiGHS's lower bound on the MILP's objective.
    pub lower_bound: f64,
}

/// The sizes OffMate needs from a chain: weights, gradients and states per stage.
struct Groups<'c> {
    w: &'c [u64],
    g: &'c [u64],
    o: &'c [u64],
}

fn groups<'c>(chain: &'c Chain, solver: &'static str) -> Result<Groups<'c>, SolveError> {
    require_optimizer_fields(chain, solver)?;
    let field = |v: &'c Option<Vec<u64>>| v.as_deref().unwrap_or_default();
    Ok(Groups { w: field(&chain.w), g: field(&chain.g), o: field(&chain.o) })
}

/// Step indices: `F_i` is step `i`, `B_i` step `2L − 1 − i`.
#[derive(Debug, Clone, Copy)]
struct Steps {
    l: usize,
}

impl Steps {
    fn n(self) -> usize {
        2 * self.l
    }
    fn fwd(self, i: usize) -> usize {
        i
    }
    fn bwd(self, i: usize) -> usize {
        2 * self.l - 1 - i
    }
    /// The step `p` steps after `from`, cyclically.
    fn after(self, from: usize, p: usize) -> usize {
        (from + p) % self.n()
    }
    /// How many steps after `from` step `t` comes, cyclically.
    fn position(self, from: usize, t: usize) -> usize {
        (t + self.n() - from) % self.n()
    }
    /// How many steps after `B_i` `F_i` comes: the window of stage `i`'s CPU update.
    fn window(self, i: usize) -> usize {
        self.position(self.bwd(i), self.fwd(i))
    }
    /// The block whose forward or backward step `t` is, and whether it is a backward.
    fn block(self, t: usize) -> (usize, bool) {
        if t < self.l {
            (t, false)
        } else {
            (2 * self.l - 1 - t, true)
        }
    }
}

/// Whether block `i` may take `option`: offloading needs a step between the forward that
/// follows and the backward that reads it back (`i + 2 < L`).
fn allowed(option: BlockOption, i: usize, l: usize, opts: &OffmateOptions) -> bool {
    match option {
        BlockOption::Keep => true,
        BlockOption::Recompute => opts.recompute,
        BlockOption::Offload => opts.activation_offload && i + 2 < l,
    }
}

/// The activation memory block `i` holds in step `t` under `option`, beside what its own
/// compute allocates (see [`own_memory`]).
fn held(chain: &Chain, steps: Steps, i: usize, option: BlockOption, t: usize) -> u64 {
    let (j, backward) = steps.block(t);
    let (x, xbar) = (&chain.x, &chain.xbar);
    if !backward {
        if i >= j {
            return 0;
        }
        return match option {
            BlockOption::Keep => xbar[i + 1],
            BlockOption::Recompute => x[i + 1],
            // In flight while F_{i+1} reads it, gone after.
            BlockOption::Offload if j == i + 1 => xbar[i + 1],
            BlockOption::Offload => 0,
        };
    }
    // Backward of block j: blocks below j still hold theirs.
    if i >= j {
        return 0;
    }
    match option {
        BlockOption::Keep => xbar[i + 1],
        BlockOption::Recompute => x[i + 1],
        // Back for B_{i+1} (j = i + 1), arriving during B_{i+2} (j = i + 2).
        BlockOption::Offload if j == i + 1 || j == i + 2 => xbar[i + 1],
        BlockOption::Offload => 0,
    }
}

/// What block `j`'s own compute in step `t` allocates (its output, gradients and
/// temporaries), in the simulator's accounting.
fn own_memory(chain: &Chain, steps: Steps, option: BlockOption, t: usize) -> u64 {
    let (j, backward) = steps.block(t);
    let l = steps.l;
    let (x, xbar) = (&chain.x, &chain.xbar);
    if !backward {
        let out = if option == BlockOption::Recompute { x[j + 1] } else { xbar[j + 1] };
        return out + chain.ftmp[j];
    }
    // B_j reads ā_{j+1} (and δ_{j+1}), allocates δ_j and its temporaries; a recompute
    // first allocates ā_{j+1} beside its temporaries.
    let mut m = xbar[j + 1] + x[j + 1] + x[j] + chain.fused_btmp(j);
    if option == BlockOption::Recompute {
        m = m.max(xbar[j + 1] + x[j + 1] + chain.ftmp[j]);
    }
    if j + 1 == l {
        // The loss: a_L (inside ā_L) read, δ_L allocated beside its temporaries.
        m = m.max(xbar[l] + x[l] + chain.btmp[l]);
    }
    m
}

/// The compute time of block `j`'s step `t` under `option`.
fn compute_time(chain: &Chain, steps: Steps, option: BlockOption, t: usize) -> f64 {
    let (j, backward) = steps.block(t);
    if !backward {
        return chain.ftime[j];
    }
    let mut c = chain.btime[j];
    if option == BlockOption::Recompute {
        c += chain.ftime[j];
    }
    if j + 1 == steps.l {
        c += chain.btime[steps.l];
    }
    c
}

/// HiGHS's relative gap: a plan within 1% of the best is good enough for a step model
/// that is itself an approximation of the simulator's.
pub const MIP_GAP: f64 = 1e-2;

/// Solves the O-ILP for `chain` within `budget` bytes of device memory on `machine`. The
/// constraint families go in the order below: HiGHS's search can depend on the order of
/// the rows and columns.
pub fn offmate_plan(
    chain: &Chain,
    budget: u64,
    machine: &Machine,
    opts: &OffmateOptions,
) -> Result<OffmatePlan, SolveError> {
    let grp = groups(chain, "offmate")?;
    let mut ilp = OIlp::new(chain, grp, budget, machine, opts);
    ilp.block_options();
    ilp.cpu_update_columns();
    ilp.step_columns();
    for i in 0..chain.len() {
        ilp.presence(i);
        ilp.offloaded(i);
        ilp.update(i);
    }
    for t in 0..ilp.steps.n() {
        ilp.step(t);
    }
    ilp.host_memory();
    ilp.solve()
}

/// One parameter group's fractions (4.3), per stage and step: `Sto`, on the device;
/// `Ofl`, offloaded in the step; `Prf`, prefetched in the step.
#[derive(Default)]
struct Fractions {
    sto: Vec<Vec<Col>>,
    ofl: Vec<Vec<Col>>,
    prf: Vec<Vec<Col>>,
}

/// What a step asks of each resource: device memory (in units), and the seconds of
/// compute, of transfers to the host and of transfers from it.
struct Loads {
    mem: Lin,
    compute: Lin,
    out: Lin,
    inc: Lin,
}

/// The O-ILP of [`offmate_plan`] under construction: the model, its columns, and the
/// units. Each method adds one constraint family, or the columns the next ones use.
struct OIlp<'c> {
    chain: &'c Chain,
    grp: Groups<'c>,
    machine: &'c Machine,
    opts: &'c OffmateOptions,
    budget: u64,
    steps: Steps,
    /// Bytes in multiples of the largest weight group, state or saved set (HiGHS wants
    /// coefficients near 1); times in seconds as they are.
    unit: f64,
    /// Link bandwidths, in units per second.
    d2h: f64,
    h2d: f64,
    /// The static bytes no group names.
    unnamed: u64,
    m: Milp,
    /// `Comp_i^o`, per block and [`BlockOption::ALL`] (`None`: not allowed).
    comp: Vec<Vec<Option<Col>>>,
    /// `X_i`: the CPU updates stage `i` (`None`: it may not).
    x_cpu: Vec<Option<Col>>,
    /// `Time_t`.
    time: Vec<Col>,
    weights: Fractions,
    states: Fractions,
    /// `Opt[i][t]`: the part of stage `i`'s update the CPU does in step `t` (4.4).
    opt: Vec<Vec<Col>>,
}

/// The weight of the transfer times in the objective, a tie-break.
const TIEBREAK: f64 = 0.01;

/// Running sums in the order of the steps from `b` on: `cum[p] = Σ_{q ≤ p} v[at(q)]`
/// (one column and one row each, where the sums written out would make the matrix dense).
fn running(m: &mut Milp, steps: Steps, v: &[Col], b: usize) -> Vec<Col> {
    let n = steps.n();
    let mut cum: Vec<Col> = Vec::with_capacity(n);
    for p in 0..n {
        let c = m.continuous(0.0, 0.0, f64::INFINITY, 0.0);
        let mut e = Lin::default();
        e.add_col(c, 1.0).add_col(v[steps.after(b, p)], -1.0);
        if p > 0 {
            e.add_col(cum[p - 1], -1.0);
        }
        m.row(0.0, &e, 0.0);
        cum.push(c);
    }
    cum
}

impl<'c> OIlp<'c> {
    fn new(chain: &'c Chain, grp: Groups<'c>, budget: u64, machine: &'c Machine, opts: &'c OffmateOptions) -> Self {
        let unit = grp.w.iter().chain(grp.o).chain(&chain.xbar).copied().max().unwrap_or(1).max(1) as f64;
        let named: u64 = grp.w.iter().chain(grp.g).chain(grp.o).sum();
        OIlp {
            chain,
            machine,
            opts,
            budget,
            steps: Steps { l: chain.len() },
            unit,
            d2h: machine.d2h.bandwidth / unit,
            h2d: machine.h2d.bandwidth / unit,
            unnamed: chain.static_bytes.saturating_sub(named),
            grp,
            m: Milp::new(),
            comp: Vec::new(),
            x_cpu: Vec::new(),
            time: Vec::new(),
            weights: Fractions::default(),
            states: Fractions::default(),
            opt: Vec::new(),
        }
    }

    /// `b` bytes in units.
    fn size(&self, b: u64) -> f64 {
        b as f64 / self.unit
    }

    /// (4.1): one option per block, among those allowed.
    fn block_options(&mut self) {
        let (l, opts) = (self.steps.l, self.opts);
        let m = &mut self.m;
        self.comp = (0..l)
            .map(|i| {
                BlockOption::ALL
                    .iter()
                    .map(|&o| {
                        allowed(o, i, l, opts).then(|| m.binary(0.0, if o == BlockOption::Keep { 1.0 } else { 0.0 }))
                    })
                    .collect()
            })
            .collect();
        for row in &self.comp {
            let mut e = Lin::default();
            for c in row.iter().flatten() {
                e.add_col(*c, 1.0);
            }
            self.m.row(1.0, &e, 1.0);
        }
    }

    /// `X_i`: the CPU updates stage `i`. Not for a stage whose update window has no step:
    /// the gradient leaves in the step after `B_i` and the update runs after that, before
    /// `F_i`.
    fn cpu_update_columns(&mut self) {
        let (steps, opts, g) = (self.steps, self.opts, self.grp.g);
        let m = &mut self.m;
        self.x_cpu = (0..steps.l)
            .map(|i| (opts.cpu_optimizer && g[i] > 0 && steps.window(i) >= 3).then(|| m.binary(0.0, 0.0)))
            .collect();
    }

    /// `Time_t`, and (4.3)–(4.4): the fractions of each stage's weights and state on the
    /// device, offloaded and prefetched in each step, and of its update on the CPU,
    /// bounded by what the options allow (nothing offloaded during the backward that
    /// updates it; the CPU from two steps after `B_i` to the step before `F_i`).
    fn step_columns(&mut self) {
        let (steps, l, n) = (self.steps, self.steps.l, self.steps.n());
        let (grp, machine, unit) = (&self.grp, self.machine, self.unit);
        let m = &mut self.m;
        self.time = (0..n).map(|_| m.continuous(1.0, 0.0, f64::INFINITY, 0.0)).collect();
        let frac = |m: &mut Milp, lo: f64, hi: f64, cost: f64| m.continuous(cost, lo, hi, 0.0);
        let size = |b: u64| b as f64 / unit;
        let (w, s) = (&mut self.weights, &mut self.states);
        for v in [&mut w.sto, &mut w.ofl, &mut w.prf, &mut s.sto, &mut s.ofl, &mut s.prf, &mut self.opt] {
            *v = vec![vec![]; l];
        }
        for i in 0..l {
            let movable = self.opts.weight_offload && grp.w[i] > 0;
            for t in 0..n {
                let used = t == steps.fwd(i) || t == steps.bwd(i);
                let lo = if used || !movable { 1.0 } else { 0.0 };
                w.sto[i].push(frac(m, lo, 1.0, 0.0));
                let can_move = movable && t != steps.bwd(i);
                let cost = TIEBREAK * size(grp.w[i]);
                w.ofl[i].push(frac(m, 0.0, if can_move { 1.0 } else { 0.0 }, cost / machine.d2h.bandwidth * unit));
                w.prf[i].push(frac(m, 0.0, if movable { 1.0 } else { 0.0 }, cost / machine.h2d.bandwidth * unit));
                let state_movable = self.opts.weight_offload && grp.o[i] > 0;
                s.sto[i].push(frac(m, if state_movable || self.x_cpu[i].is_some() { 0.0 } else { 1.0 }, 1.0, 0.0));
                let cost_o = TIEBREAK * size(grp.o[i]);
                let hi = if state_movable && t != steps.bwd(i) { 1.0 } else { 0.0 };
                s.ofl[i].push(frac(m, 0.0, hi, cost_o / machine.d2h.bandwidth * unit));
                let hi = if state_movable { 1.0 } else { 0.0 };
                s.prf[i].push(frac(m, 0.0, hi, cost_o / machine.h2d.bandwidth * unit));
                // The CPU works from two steps after B_i (the gradient's offload between) to
                // the step before F_i.
                let p = steps.position(steps.bwd(i), t);
                let open = self.x_cpu[i].is_some() && p >= 2 && p < steps.window(i);
                self.opt[i].push(frac(m, 0.0, if open { 1.0 } else { 0.0 }, 0.0));
            }
        }
    }

    /// (4.9)/(4.10): stage `i`'s weights and state on the device grow only through
    /// prefetch (cyclically).
    fn presence(&mut self, i: usize) {
        let (steps, n) = (self.steps, self.steps.n());
        let at = |p: usize| steps.after(steps.bwd(i), p);
        for p in 0..n {
            for g in [&self.weights, &self.states] {
                let mut e = Lin::default();
                e.add_col(g.sto[i][at(p + 1)], 1.0).add_col(g.sto[i][at(p)], -1.0).add_col(g.prf[i][at(p)], -1.0);
                self.m.row(-f64::INFINITY, &e, 0.0);
            }
        }
    }

    /// (4.7)/(4.8): each part of stage `i`'s weights and state on the device, offloaded
    /// since `B_i`, or (CPU) away; offloaded at most once.
    fn offloaded(&mut self, i: usize) {
        let (steps, n, b) = (self.steps, self.steps.n(), self.steps.bwd(i));
        let at = |p: usize| steps.after(b, p);
        for g in [&self.weights, &self.states] {
            let cum = running(&mut self.m, steps, &g.ofl[i], b);
            for p in 1..n {
                let mut e = Lin::default();
                e.add_col(g.sto[i][at(p)], 1.0).add_col(cum[p - 1], 1.0);
                if let Some(x) = self.x_cpu[i] {
                    e.add_col(x, 1.0);
                }
                self.m.row(1.0, &e, f64::INFINITY);
            }
            self.m.row(-f64::INFINITY, &Lin { constant: 0.0, terms: vec![(cum[n - 1], 1.0)] }, 1.0);
        }
    }

    /// (4.6): the device update needs the whole state; a CPU-updated state stays on the
    /// host, the CPU does all of the update, and (4.13) none of the weights is on the
    /// device or arriving before the update is done, in proportion.
    fn update(&mut self, i: usize) {
        let (steps, n, b) = (self.steps, self.steps.n(), self.steps.bwd(i));
        let at = |p: usize| steps.after(b, p);
        let (w, s) = (&self.weights, &self.states);
        let Some(x) = self.x_cpu[i] else {
            self.m.row(1.0, &Lin { constant: 0.0, terms: vec![(s.sto[i][b], 1.0)] }, 1.0);
            return;
        };
        // StoO + PrfO ≤ 1 − X.
        for t in 0..n {
            let mut e = Lin::default();
            e.add_col(s.sto[i][t], 1.0).add_col(s.prf[i][t], 1.0).add_col(x, 1.0);
            self.m.row(-f64::INFINITY, &e, 1.0);
        }
        let mut e = Lin::default();
        e.add_col(s.sto[i][b], 1.0).add_col(x, 1.0);
        self.m.row(1.0, &e, 1.0);
        // X_i = Σ Opt.
        let cum = running(&mut self.m, steps, &self.opt[i], b);
        let mut e = Lin::default();
        e.add_col(cum[n - 1], 1.0).add_col(x, -1.0);
        self.m.row(0.0, &e, 0.0);
        // (4.13): Sto + Prf ≤ 1 − X + Σ_{q<p} Opt.
        for p in 1..n {
            let mut e = Lin::default();
            e.add_col(w.sto[i][at(p)], 1.0).add_col(w.prf[i][at(p)], 1.0).add_col(x, 1.0).add_col(cum[p - 1], -1.0);
            self.m.row(-f64::INFINITY, &e, 1.0);
        }
    }

    /// What step `t` asks of each resource: the memory each block's option holds and
    /// its own compute allocates, the weights and states present or arriving, the
    /// gradient of the stage in backward (and in flight to the host); the compute of the
    /// block (with its device update unless the CPU does it); and each link's transfers,
    /// the offload option's activations included.
    fn loads(&self, t: usize) -> Loads {
        let (chain, grp, steps) = (self.chain, &self.grp, self.steps);
        let (j, backward) = steps.block(t);
        let mut mem = Lin::constant(self.size(self.unnamed + chain.x[0]));
        let mut compute = Lin::default();
        let mut out = Lin::default();
        let mut inc = Lin::default();
        for i in 0..steps.l {
            for (k, &o) in BlockOption::ALL.iter().enumerate() {
                let Some(c) = self.comp[i][k] else { continue };
                let mut bytes = held(chain, steps, i, o, t);
                if i == j {
                    bytes += own_memory(chain, steps, o, t);
                    compute.add_col(c, compute_time(chain, steps, o, t));
                }
                mem.add_col(c, self.size(bytes));
                if o == BlockOption::Offload {
                    if t == steps.fwd(i + 1) {
                        out.add_col(c, self.size(chain.xbar[i + 1]) / self.d2h);
                    }
                    if t == steps.bwd(i + 2) {
                        inc.add_col(c, self.size(chain.xbar[i + 1]) / self.h2d);
                    }
                }
            }
            let (w, s) = (&self.weights, &self.states);
            let (wi, oi) = (self.size(grp.w[i]), self.size(grp.o[i]));
            mem.add_col(w.sto[i][t], wi).add_col(w.prf[i][t], wi);
            mem.add_col(s.sto[i][t], oi).add_col(s.prf[i][t], oi);
            out.add_col(w.ofl[i][t], wi / self.d2h).add_col(s.ofl[i][t], oi / self.d2h);
            inc.add_col(w.prf[i][t], wi / self.h2d).add_col(s.prf[i][t], oi / self.h2d);
        }
        if backward {
            // The stage's gradient, and its device update unless the CPU does it.
            mem.constant += self.size(grp.g[j]);
            if let Some(rate) = self.machine.gpu_optimizer_rate.map(|r| r / self.unit) {
                compute.constant += self.size(grp.g[j]) / rate;
                if let Some(x) = self.x_cpu[j] {
                    compute.add_col(x, -self.size(grp.g[j]) / rate);
                }
            }
        }
        // A CPU-updated gradient in flight to the host in the step after its backward.
        for (i, x) in self.x_cpu.iter().enumerate() {
            if let Some(x) = *x {
                if t == steps.after(steps.bwd(i), 1) {
                    mem.add_col(x, self.size(grp.g[i]));
                    out.add_col(x, self.size(grp.g[i]) / self.d2h);
                }
            }
        }
        Loads { mem, compute, out, inc }
    }

    /// Step `t`: (4.17) its memory within the budget, and (4.19)–(4.23) its time, at
    /// least the compute, each link's transfers ((4.21)/(4.22)) and the CPU's updates
    /// with the host's management time `H` (4.23).
    fn step(&mut self, t: usize) {
        let Loads { mem, compute, out, inc } = self.loads(t);
        self.m.row(-f64::INFINITY, &mem, self.size(self.budget));
        for e in [&compute, &out, &inc] {
            let mut r = e.clone();
            r.add_col(self.time[t], -1.0);
            self.m.row(-f64::INFINITY, &r, 0.0);
        }
        let cpu_rate = self.machine.cpu_optimizer_rate / self.unit;
        let mut cpu = Lin::constant(self.opts.management);
        for (row, &g) in self.opt.iter().zip(self.grp.g) {
            cpu.add_col(row[t], self.size(g) / cpu_rate);
        }
        cpu.add_col(self.time[t], -1.0);
        self.m.row(-f64::INFINITY, &cpu, 0.0);
    }

    /// (4.18): host memory: what is offloaded, the CPU-updated states and gradients.
    fn host_memory(&mut self) {
        let (chain, grp) = (self.chain, &self.grp);
        let (w, s) = (&self.weights, &self.states);
        let mut host = Lin::default();
        for i in 0..self.steps.l {
            for t in 0..self.steps.n() {
                host.add_col(w.ofl[i][t], self.size(grp.w[i])).add_col(s.ofl[i][t], self.size(grp.o[i]));
            }
            if let Some(x) = self.x_cpu[i] {
                host.add_col(x, self.size(grp.w[i] + grp.o[i] + grp.g[i]));
            }
            for (k, &o) in BlockOption::ALL.iter().enumerate() {
                if let (BlockOption::Offload, Some(c)) = (o, self.comp[i][k]) {
                    host.add_col(c, self.size(chain.xbar[i + 1]));
                }
            }
        }
        self.m.row(-f64::INFINITY, &host, self.machine.host_memory as f64 / self.unit);
    }

    /// Solves under the options' time limit, and reads the plan off the solution.
    fn solve(self) -> Result<OffmatePlan, SolveError> {
        let infeasible = |reason: String| SolveError::Infeasible { budget: self.budget, reason };
        let (cols, optimal): (Vec<f64>, Option<f64>) =
            match self.m.solve(self.opts.time_limit, true, &[("mip_rel_gap", MIP_GAP)]) {
                Ok(Outcome::Optimal(x)) => (x, None),
                Ok(Outcome::Incumbent(x, _, dual)) => (x, Some(dual)),
                Err(IlpError::Infeasible) => {
                    return Err(infeasible(
                        "OffMate's MILP has no solution: with the techniques allowed, some step does not fit".into(),
                    ))
                }
                Err(e) => return Err(infeasible(format!("OffMate's MILP: {e}"))),
            };
        let v = |c: Col| cols[c.index()];
        let options = self
            .comp
            .iter()
            .map(|row| {
                let k = (0..3).max_by(|&a, &b| {
                    let val = |k: usize| row[k].map_or(-1.0, v);
                    val(a).total_cmp(&val(b))
                });
                BlockOption::ALL[k.unwrap_or(0)]
            })
            .collect();
        Ok(OffmatePlan {
            options,
            cpu: self.x_cpu.iter().map(|x| x.is_some_and(|x| v(x) > 0.5)).collect(),
            weights: self.weights.sto.iter().map(|r| r.iter().map(|&c| v(c)).collect()).collect(),
            states: self.states.sto.iter().map(|r| r.iter().map(|&c| v(c)).collect()).collect(),
            objective: self.time.iter().map(|&c| v(c)).sum(),
            optimal: optimal.is_none(),
            lower_bound: optimal.unwrap_or(f64::NAN),
        })
    }
}

/// Where a weight or state is, step by step, after Algorithm 8 with one tensor: on the
/// device only where the MILP keeps all of it.
fn whole(fractions: &[f64]) -> Vec<bool> {
    fractions.iter().map(|&f| f >= 1.0 - 1e-6).collect()
}

/// The transfers and frees of one weight or state, into `before[t]` (the ops issued at
/// the start of step `t`, before its compute): its residency per step is `present`, it is
/// read at the `uses` steps and updated in place on the device by the step `update` (its
/// host copy is stale from then until an offload, unless `host_valid`: a CPU-updated
/// stage's weights, whose host copy the CPU keeps current).
fn place_transfers(
    before: &mut [Vec<Op>],
    steps: Steps,
    tensor: Tensor,
    present: &[bool],
    uses: &[usize],
    update: usize,
    mut host_valid: bool,
) {
    let n = steps.n();
    let at = |p: usize| steps.after(update, p);
    let mut p = 1;
    while p < n {
        if present[at(p)] {
            p += 1;
            continue;
        }
        // An absence [p, q): leave at its start, come back one step before its end.
        let mut q = p;
        while q < n && !present[at(q)] {
            q += 1;
        }
        if host_valid {
            before[at(p)].push(Op::Free { tensor });
        } else {
            // Offload during the step before the absence; during the step after the update
            // if that is the absence itself (the update must come first).
            let issue = if p >= 2 { at(p - 1) } else { at(p) };
            before[issue].push(Op::Offload { tensor, fraction: 1.0 });
            if issue != at(p) && uses.contains(&issue) {
                // Read while it leaves: an upload, dropped once the read is done.
                before[at(p)].push(Op::Free { tensor });
            }
            host_valid = true;
        }
        if q < n {
            before[at(q - 1)].push(Op::Prefetch { tensor, fraction: 1.0 });
        } else {
            // Away until the update step: back during the step before it.
            before[at(n - 1)].push(Op::Prefetch { tensor, fraction: 1.0 });
        }
        p = q;
    }
}

/// Turns a plan into a periodic schedule (§4.6).
pub fn offmate_schedule(chain: &Chain, plan: &OffmatePlan) -> Schedule {
    let l = chain.len();
    let steps = Steps { l };
    let n = steps.n();
    let mut before: Vec<Vec<Op>> = vec![Vec::new(); n];
    for i in 0..l {
        let (f, b) = (steps.fwd(i), steps.bwd(i));
        if plan.options[i] == BlockOption::Offload {
            before[steps.fwd(i + 1)].push(Op::Offload { tensor: Tensor::Saved(i + 1), fraction: 1.0 });
            before[steps.bwd(i + 2)].push(Op::Prefetch { tensor: Tensor::Saved(i + 1), fraction: 1.0 });
        }
        let after_b = steps.after(b, 1);
        let mut present = whole(&plan.weights[i]);
        if plan.cpu[i] {
            before[after_b].push(Op::Offload { tensor: Tensor::WeightGrad(i), fraction: 1.0 });
            before[after_b].push(Op::CpuUpdate { stage: i });
            before[after_b].push(Op::Free { tensor: Tensor::Weight(i) });
            // Away from the drop to the first step the MILP brings it back in.
            let back = (1..n).find(|&p| present[steps.after(b, p)]).unwrap_or(n - 1);
            let tensor = Tensor::Weight(i);
            before[steps.after(b, back - 1)].push(Op::Prefetch { tensor, fraction: 1.0 });
            // Later absences (between F_i and B_i): the host copy is current.
            for p in 1..back {
                present[steps.after(b, p)] = true;
            }
            place_transfers(&mut before, steps, tensor, &present, &[f, b], b, true);
        } else {
            before[after_b].push(Op::Free { tensor: Tensor::WeightGrad(i) });
            place_transfers(&mut before, steps, Tensor::Weight(i), &present, &[f, b], b, false);
            let states = whole(&plan.states[i]);
            place_transfers(&mut before, steps, Tensor::OptState(i), &states, &[b], b, false);
        }
    }
    let mut ops = Vec::new();
    for (t, mut step_ops) in before.into_iter().enumerate() {
        // Frees first (they make room), then offloads, then prefetches.
        step_ops.sort_by_key(|op| match op {
            Op::Free { .. } => 0,
            Op::Offload { .. } | Op::CpuUpdate { .. } => 1,
            _ => 2,
        });
        ops.extend(step_ops);
        let (j, backward) = steps.block(t);
        let o = plan.options[j];
        if !backward {
            let mode = if o == BlockOption::Recompute { ForwardMode::Checkpoint } else { ForwardMode::KeepAll };
            ops.push(Op::Forward { stage: j, mode });
        } else {
            if j + 1 == l && o != BlockOption::Recompute {
                ops.push(Op::Backward { stage: l });
            }
            if o == BlockOption::Recompute {
                if j + 1 == l {
                    ops.push(Op::Backward { stage: l });
                }
                ops.push(Op::Forward { stage: j, mode: ForwardMode::KeepAll });
            }
            ops.push(Op::Backward { stage: j });
        }
    }
    Schedule::new(View::Chain, ops).repeated().with_solver("offmate")
}

/// The `offmate` solver: the O-ILP at the budget, Algorithm 8, and the simulator; if the
/// simulator refuses the schedule (the step model is an approximation), the MILP again at a
/// tightened budget. Where recomputation is allowed, Rotor's plans on the same chain (the
/// optimal rematerialization of these blocks, Rockmate's plan on a chain whose blocks have
/// one option each; [`rotor_freeing_gradients`] with OffMate's accounting of the weight
/// gradients) are candidates too, and the simulator keeps the fastest: the O-ILP runs
/// each block's forward at most twice (Assumption 3), where Rotor recomputes a block from
/// any checkpoint, so with the weights on the device Rotor's plan can be the faster.
/// Where offloading is allowed, so are the practice baselines' plans (`paged-adam`,
/// `zero-offload`, `zero-infinity`), so that `offmate` fits wherever they do.
pub struct Offmate;

/// Other solvers' plans for `chain`, as OffMate's candidates, each naming its solver
/// ([`Schedule::kept_from`]), where `opts` allows every technique it uses:
///
/// * with recomputation: Rotor's own plan, and [`rotor_freeing_gradients`];
/// * with weight (and state) offloading and recomputation: `paged-adam`'s; with the CPU
///   optimizer too, `zero-offload`'s and `zero-infinity`'s. Their fixed policies free
///   each layer's weights or state right after use, where the O-ILP's steps are whole
///   blocks and an offload frees its memory only in the step after its own, so with a
///   few large layers a policy can fit where the O-ILP cannot.
fn kept_plans(chain: &Chain, budget: u64, options: &SolveOptions, opts: &OffmateOptions) -> Vec<Schedule> {
    use pebble_solve::baseline::{paged_adam::PagedAdam, zero};
    let problem = Problem::Chain(chain);
    let mut plans: Vec<(&str, Schedule)> = Vec::new();
    if opts.recompute {
        let rotor = pebble_solve::remat::rotor::Rotor.solve(problem, budget, options).ok();
        plans.extend(rotor.into_iter().chain(rotor_freeing_gradients(chain, budget, options)).map(|s| ("rotor", s)));
    }
    if opts.recompute && opts.weight_offload {
        let mut policies: Vec<&dyn Solver> = vec![&PagedAdam];
        if opts.cpu_optimizer {
            policies.extend([&zero::ZeroOffload as &dyn Solver, &zero::ZeroInfinity]);
        }
        for policy in policies {
            plans.extend(policy.solve(problem, budget, options).ok().map(|s| (policy.name(), s)));
        }
    }
    plans.into_iter().map(|(from, s)| Schedule { kept_from: Some(from.into()), ..s.with_solver("offmate") }).collect()
}

/// Rotor's plan with OffMate's accounting of the weight gradients: each stage's gradient
/// lives only through the backward that computes it and updates the stage on the device,
/// and is freed right after, as in OffMate's own schedules. Rotor plans on
/// [`gradients_as_temporaries`]; the schedule, [`freeing_gradients`], frees each
/// gradient after its backward. `None` where Rotor has no plan or the chain has no
/// gradients `g`. The simulator judges it on `chain` itself.
pub fn rotor_freeing_gradients(chain: &Chain, budget: u64, options: &SolveOptions) -> Option<Schedule> {
    let freed = gradients_as_temporaries(chain)?;
    let plan = pebble_solve::remat::rotor::Rotor.solve(Problem::Chain(&freed), budget, options).ok()?;
    Some(freeing_gradients(chain, plan.ops))
}

/// `chain` with each stage's weight gradient counted as a temporary of its backward
/// (`btmp[i] + g[i]`, the update fused into it) instead of static memory, for a chain
/// solver to plan OffMate's accounting; `None` where the chain has no gradients `g`.
pub fn gradients_as_temporaries(chain: &Chain) -> Option<Chain> {
    let g = chain.g.as_ref()?;
    let mut freed = Chain { static_bytes: chain.static_bytes.saturating_sub(g.iter().sum()), g: None, ..chain.clone() };
    for (i, g) in g.iter().enumerate() {
        freed.btmp[i] = chain.fused_btmp(i).saturating_add(*g);
    }
    Some(freed)
}

/// A plan of [`gradients_as_temporaries`] as a periodic schedule of `chain`: each
/// backward followed by the free of its stage's weight gradient.
pub fn freeing_gradients(chain: &Chain, plan: Vec<Op>) -> Schedule {
    let mut ops = Vec::with_capacity(plan.len() + chain.len());
    for op in plan {
        let free = match op {
            Op::Backward { stage } if stage < chain.len() => Some(Op::Free { tensor: Tensor::WeightGrad(stage) }),
            _ => None,
        };
        ops.push(op);
        ops.extend(free);
    }
    Schedule::new(View::Chain, ops).repeated()
}

/// Budgets the MILP is tried at in turn, as fractions of the budget: Algorithm 8 rounds
/// memory down, but the simulator's transfers start later than the step model's, so a
/// little headroom may be needed.
const TIGHTEN: [f64; 3] = [1.0, 0.95, 0.85];

impl Offmate {
    /// Plans with `opts` (the ablations of Table 4.2 switch techniques off): the fastest of
    /// the O-ILP's plan and the other solvers' plans `opts` allows (Rotor's where
    /// `opts.recompute`, the practice baselines' where their techniques are allowed too),
    /// a kept plan saying whose it is ([`Schedule::kept_from`]). Without offloading
    /// ([`OffmateOptions::remat_only`]) this is Rotor's time with OffMate's accounting,
    /// which is Rockmate's DP on these blocks, never slower than any combination of the
    /// block options (`tests/offmate.rs`).
    pub fn solve_with(
        chain: &Chain,
        budget: u64,
        options: &SolveOptions,
        opts: &OffmateOptions,
    ) -> Result<Schedule, SolveError> {
        let own = Self::milp_schedule(chain, budget, options, opts);
        if matches!(own, Err(ref e) if !matches!(e, SolveError::Infeasible { .. })) {
            return own;
        }
        let kept = kept_plans(chain, budget, options, opts);
        if kept.is_empty() {
            return own;
        }
        let candidates = own.as_ref().ok().cloned().into_iter().chain(kept);
        pebble_solve::fastest_within(Problem::Chain(chain), candidates, budget, options).or(own)
    }

    /// The O-ILP's plan alone, at the budget or a tightened one.
    fn milp_schedule(
        chain: &Chain,
        budget: u64,
        options: &SolveOptions,
        opts: &OffmateOptions,
    ) -> Result<Schedule, SolveError> {
        let opts = OffmateOptions { time_limit: options.time_limit.or(opts.time_limit), ..*opts };
        let mut last = None;
        for (k, f) in TIGHTEN.iter().enumerate() {
            options.progress.report("OffMate: solving the MILP", k, TIGHTEN.len());
            let plan = match offmate_plan(chain, (budget as f64 * f) as u64, &options.machine, &opts) {
                Ok(plan) => plan,
                Err(e) => {
                    last = Some(e);
                    break;
                }
            };
            match pebble_solve::fastest_within(Problem::Chain(chain), [offmate_schedule(chain, &plan)], budget, options)
            {
                Ok(s) => {
                    options.progress.report("OffMate: solving the MILP", TIGHTEN.len(), TIGHTEN.len());
                    return Ok(s);
                }
                Err(e) => {
                    last = Some(SolveError::Infeasible {
                        budget,
                        reason: format!(
                            "OffMate's schedule does not run within the budget{}",
                            e.map(|e| format!(": {e}")).unwrap_or_default()
                        ),
                    })
                }
            }
        }
        Err(last.unwrap_or(SolveError::Infeasible { budget, reason: "no plan".into() }))
    }
}

impl Solver for Offmate {
    fn name(&self) -> &'static str {
        "offmate"
    }

    fn description(&self) -> &'static str {
        "OffMate (Zhao Ch. 4): one MILP over recomputation, activation, weight and optimizer-state offloading and \
         the CPU optimizer step, on the chain's blocks; periodic"
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let chain = problem.chain_for("offmate")?;
        Offmate::solve_with(chain, budget, options, &OffmateOptions::default())
    }
}

inventory::submit!(pebble_solve::Registration(&Offmate));
