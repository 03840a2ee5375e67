//! The H-ILP (Zhao, §3.4; with one option per node and a save budget it is
//! rk-Checkmate, §2.4): which cNode runs, in which option, in which stage, on an
//! [`HGraph`].
//!
//! # Variables (all binary)
//!
//! Stage `t` computes cNode `t` for the first time; forward cNodes before it may run
//! again. `Comp[t,k,o]`: node `k` runs with option `o` in stage `t` (`sumComp[t,k]`, their
//! sum, is rk-Checkmate's `R + R'`). Backward nodes and the loss run once, in their own
//! stage (a gradient would accumulate twice otherwise). For an aNode `d`:
//!
//! * made by one forward node `p` (an activation): `P[t,d]`, present before stage `t`;
//!   `C[t,d]`, created by `p` in stage `t`; `D[t,k,d]`, deleted right after node `k` (`p`
//!   or a reader of `d`) in stage `t`;
//! * made by nodes that run once (a gradient, perhaps accumulated by several): its
//!   lifetime is fixed, from its first producer to its last producer or reader (kept to
//!   the end if nobody reads it: an output of the graph).
//!
//! `Sp[t,j,o]`: the phantom of pair `j`, option `o`, is kept before stage `t`.
//!
//! # Constraints (the thesis' numbers; the errata of the research digest §7 applied)
//!
//! * (3.4)/(2.3) nothing before its stage; (3.9)/(2.5) node `t` runs in stage `t`;
//!   (3.10)/(2.6) the loss once; (3.15) one option at a time.
//! * (3.13)/(2.8) a reader runs only if each input is present or made earlier in the stage:
//!   `sumComp[t,k] ≤ sumComp[t,p] + P[t,d]`; (3.14) the same for an option's own reads.
//! * (3.16)–(3.19)/(2.9)–(2.10) phantoms: one option kept at a time, made only by the
//!   forward with that option, dropped only by the backward, which needs it.
//! * (3.20)–(3.24)/(2.11)–(2.17) liveness: `A[t,k,d] = P[t,d] + C[t,d]·[k ≥ p] −
//!   Σ_{k' ≤ k} D[t,k',d] ∈ [0, 1]`, `A ≥ sumComp − D` after the producer, `C ≤ sumComp`,
//!   and `P[t+1,d] = A` after `d`'s last event in stage `t`.
//! * (3.25)–(3.26)/(2.16) `D[t,k,d] = 1` iff `k` runs, `d` is not kept into stage `t+1`,
//!   and no later reader of `d` runs in stage `t` (`P[t+1,d]`, not the printed `P[t+1,k]`;
//!   a backward that reads `d` only in some options reads it only when it runs in one);
//!   linearized with `κ = 2 + #later readers`, plus one row per hazard (tighter).
//! * (3.27)–(3.33)/(2.18) memory: along each stage, `U` = what is resident after node
//!   `k`'s frees; while `k` runs, `U[k−1]` + what it allocates (created aNodes, its
//!   phantom) + its option's overhead ≤ budget. A backward's phantom counts while it
//!   runs (the simulator frees saved tensors after the backward, not before).
//! * (2.19) with a save budget: `U` right after the loss, in its stage, ≤ `M_save`.
//!
//! * (3.34) correction terms: a cluster option with [`Substep`](crate::hgraph::Substep)s is held substep by
//!   substep instead of by its largest overhead: inputs that no later substep reads and
//!   that the cNode deletes (`D[t,k,d]`, or a gradient's fixed end) no longer count, as
//!   the schedule frees them after their last reader. HiRemate gives them to the top
//!   level's ILP only, as the thesis does.
//!
//! The objective is `Σ time[k,o] · Comp[t,k,o]`. The solution is a sequence of
//! `(node, option)`; the schedule's frees come from liveness (`sequence.rs`).

use crate::hgraph::{HGraph, HKind};
use crate::milp::{Bin, Lin, Milp, Outcome};
use crate::sequence::Step;
use crate::IlpError;

/// What one H-ILP solve returns.
#[derive(Debug, Clone, PartialEq)]
pub struct HSolution {
    /// `(node, option)` in execution order.
    pub seq: Vec<(usize, usize)>,
    /// Whether HiGHS proved it optimal (else: the best found before the time limit).
    pub optimal: bool,
    /// The most memory it holds in any stage, as the peak rows count it (bytes, rounded
    /// up): every peak budget of at least `peak` holds it.
    pub peak: u64,
    /// What it holds right after the loss, as the save row counts it (bytes, rounded up):
    /// every save budget of at least `save` holds it.
    pub save: u64,
}

/// How an aNode lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    /// Made by one recomputable forward node.
    Variable { producer: usize, s_last: usize },
    /// Made by nodes that run once: present before stages `first < t ≤ end`, freed after
    /// node `end` in stage `end` (never, if `end` is `None`).
    Fixed { first: usize, end: Option<usize> },
    /// Never made (nobody in this graph produces it): treated as absent.
    Unused,
}

struct Model {
    n: usize,
    once: Vec<bool>,
    last: Vec<usize>,
    life: Vec<Life>,
    /// Readers of each aNode (node inputs and option reads), sorted.
    users: Vec<Vec<usize>>,
    /// For each pair (indexed by the forward node): its backward node.
    backward_of: Vec<Option<usize>>,
}

impl Model {
    fn new(h: &HGraph) -> Result<Model, IlpError> {
        let n = h.nodes.len();
        let na = h.sizes.len();
        let bad = |why: String| IlpError::InvalidGraph(why);
        let once: Vec<bool> = h.nodes.iter().map(|x| !matches!(x.kind, HKind::Forward { .. })).collect();
        let mut producers: Vec<Vec<usize>> = vec![Vec::new(); na];
        let mut users: Vec<Vec<usize>> = vec![Vec::new(); na];
        let mut forward_of_pair = std::collections::HashMap::new();
        let mut backward_of = vec![None; n];
        for (k, node) in h.nodes.iter().enumerate() {
            if node.options.is_empty() {
                return Err(bad(format!("cNode {k} has no option")));
            }
            for &d in &node.outputs {
                if d >= na {
                    return Err(bad(format!("cNode {k} writes aNode {d} of {na}")));
                }
                if producers[d].last() != Some(&k) {
                    producers[d].push(k);
                }
            }
            let reads = node.inputs.iter().chain(node.options.iter().flat_map(|o| o.reads.iter()));
            for &d in reads {
                if d >= na {
                    return Err(bad(format!("cNode {k} reads aNode {d} of {na}")));
                }
                // A node that reads what it writes accumulates into it (or, for a
                // cluster, one of its ops reads what another made): not a use.
                if !node.outputs.contains(&d) {
                    users[d].push(k);
                }
            }
            match node.kind {
                HKind::Forward { pair } => {
                    forward_of_pair.insert(pair, k);
                }
                HKind::Backward { pair } => {
                    let f = *forward_of_pair
                        .get(&pair)
                        .ok_or_else(|| bad(format!("backward cNode {k} comes before its forward (pair {pair})")))?;
                    if h.nodes[k].options.len() > h.nodes[f].options.len() {
                        return Err(bad(format!("backward cNode {k} has more options than its forward {f}")));
                    }
                    backward_of[f] = Some(k);
                }
                HKind::Loss => {}
            }
        }
        for u in &mut users {
            u.sort_unstable();
            u.dedup();
        }
        if h.nodes.iter().filter(|x| x.kind == HKind::Loss).count() != 1 {
            return Err(bad("an H-graph needs exactly one loss node".into()));
        }
        // The last stage in which a forward node may usefully run.
        let mut last: Vec<usize> = (0..n).collect();
        for k in (0..n).rev() {
            if once[k] {
                continue;
            }
            let mut l = k;
            for &d in &h.nodes[k].outputs {
                for &u in &users[d] {
                    l = l.max(last[u]);
                }
            }
            if let Some(b) = backward_of[k] {
                l = l.max(b);
            }
            last[k] = l;
        }
        let mut life = vec![Life::Unused; na];
        for d in 0..na {
            let p = &producers[d];
            if p.is_empty() {
                continue;
            }
            if p.len() == 1 && !once[p[0]] {
                let s_last = users[d].iter().map(|&u| last[u]).max().unwrap_or(0);
                life[d] = Life::Variable { producer: p[0], s_last };
            } else if p.iter().all(|&k| once[k]) {
                if let Some(&u) = users[d].iter().find(|&&u| !once[u]) {
                    return Err(bad(format!("aNode {d}, made by backward nodes, is read by forward cNode {u}")));
                }
                if let Some(&u) = users[d].iter().find(|&&u| u < p[0]) {
                    return Err(bad(format!("aNode {d} is read by cNode {u} before it is made")));
                }
                let end = users[d].last().map(|&u| u.max(*p.last().expect("nonempty")));
                life[d] = Life::Fixed { first: p[0], end };
            } else {
                return Err(bad(format!("aNode {d} has several producers, some of them recomputable")));
            }
        }
        Ok(Model { n, once, last, life, users, backward_of })
    }

    fn may_run(&self, t: usize, k: usize) -> bool {
        k == t || (k < t && !self.once[k] && t <= self.last[k])
    }
}

/// Columns of the model.
struct Vars {
    /// `comp[t][k]`: per option, for nodes that may run in stage `t`.
    comp: Vec<Vec<Vec<Bin>>>,
    /// `p[t][d]`.
    p: Vec<Vec<Bin>>,
    /// `sp[t][k][o]` for forward node `k` (empty when the pair keeps nothing).
    sp: Vec<Vec<Vec<Bin>>>,
}

impl Vars {
    /// `Comp[t,k,o]` (`Zero` where node `k` may not run in option `o` in stage `t`).
    fn comp(&self, t: usize, k: usize, o: usize) -> Bin {
        self.comp[t][k].get(o).copied().unwrap_or(Bin::Zero)
    }

    /// `Sp[t,k,o]` (`Zero` where the phantom is not kept).
    fn sp(&self, t: usize, k: usize, o: usize) -> Bin {
        self.sp[t][k].get(o).copied().unwrap_or(Bin::Zero)
    }

    fn sum_comp(&self, t: usize, k: usize) -> Lin {
        let mut e = Lin::default();
        for &b in &self.comp[t][k] {
            e.add_bin(b, 1.0);
        }
        e
    }
}

/// The `Comp` columns' values of the sequence `seq` (`NaN` for every other column), or
/// `None` if `seq` is not a sequence of stages: stage `t` runs nodes `k ≤ t` in
/// increasing order and ends with node `t`, each in an option it may run in there.
fn comp_values(vars: &Vars, cols: usize, seq: &[(usize, usize)]) -> Option<Vec<f64>> {
    let mut values = vec![f64::NAN; cols];
    for b in vars.comp.iter().flatten().flatten() {
        if let Bin::Var(c) = b {
            values[c.index()] = 0.0;
        }
    }
    let (mut t, mut last) = (0, None);
    for &(k, o) in seq {
        if k > t || last.is_some_and(|l| k <= l) {
            return None;
        }
        match vars.comp.get(t)?.get(k)?.get(o)? {
            Bin::Var(c) => values[c.index()] = 1.0,
            Bin::One => {}
            Bin::Zero => return None,
        }
        last = Some(k);
        if k == t {
            t += 1;
            last = None;
        }
    }
    (t == vars.comp.len()).then_some(values)
}

/// An option's steps before the loss and after it.
pub(crate) type ForwardBackward = (Vec<Step>, Vec<Step>);

/// A grid of H-ILP answers, read as Rockmate and HiRemate read them: each solution's
/// steps (`steps` turns its sequence into them) split at the `loss` into a (forward,
/// backward) option, each option once, in the grid's order. Also returns how many ILPs
/// were solved and how many proved optimal: an infeasible point is skipped; one stopped
/// before any solution counts as solved, not optimal.
pub(crate) fn distinct_options(
    results: Vec<Result<HSolution, IlpError>>,
    loss: usize,
    steps: impl Fn(&HSolution) -> Vec<Step>,
) -> Result<(Vec<ForwardBackward>, (usize, usize)), IlpError> {
    let mut options: Vec<ForwardBackward> = Vec::new();
    let mut solved = (0, 0);
    for r in results {
        let sol = match r {
            Ok(s) => s,
            Err(IlpError::Infeasible) => continue,
            Err(IlpError::NoSolution { .. }) => {
                solved.0 += 1;
                continue;
            }
            Err(e) => return Err(e),
        };
        solved.0 += 1;
        solved.1 += usize::from(sol.optimal);
        let steps = steps(&sol);
        let Some(at) = steps.iter().position(|&(k, _)| k == loss) else { continue };
        let option = (steps[..at].to_vec(), steps[at + 1..].to_vec());
        if !options.contains(&option) {
            options.push(option);
        }
    }
    Ok((options, solved))
}

/// Solves the H-ILP on `h` within `budget` bytes (everything the H-graph allocates),
/// and, with `save`, at most that many bytes resident right after the loss.
pub fn solve(h: &HGraph, budget: u64, save: Option<u64>, time_limit: Option<f64>) -> Result<HSolution, IlpError> {
    solve_from(h, budget, save, time_limit, None)
}

/// [`solve`], with HiGHS started from `start`, a sequence of `(node, option)` as
/// [`HSolution::seq`] gives it: which node runs in which option in each stage. Only the
/// `Comp` columns are given; HiGHS completes the rest, and drops the start if it breaks a
/// row (a budget it does not fit, an option `h` does not have). Without a start, or with
/// one that cannot be read as stages, it is store-all's, as in [`solve`].
pub fn solve_from(
    h: &HGraph,
    budget: u64,
    save: Option<u64>,
    time_limit: Option<f64>,
    start: Option<&[(usize, usize)]>,
) -> Result<HSolution, IlpError> {
    let mut ilp = HIlp::new(h, budget, save)?;
    ilp.comp_columns();
    ilp.presence_columns();
    ilp.phantom_columns();
    for t in 0..ilp.model.n {
        let active: Vec<usize> = (0..=t).filter(|&k| ilp.model.may_run(t, k)).collect();
        ilp.dependencies(t, &active)?;
        ilp.phantoms(t);
        let events = ilp.liveness(t);
        ilp.memory(t, &active, &events);
    }
    ilp.solve(time_limit, start)
}

/// The liveness columns of one stage: per aNode, its `C` (`Zero` where it is not made
/// there) and its `D` after each node that touches it.
struct Events {
    create: Vec<Bin>,
    delete: Vec<Vec<(usize, Bin)>>,
}

/// The H-ILP under construction: the model, its columns, and the rows the budgets bound.
/// Each method adds one constraint family; [`solve_from`] calls them in the order of the
/// rows (HiGHS's search can depend on it).
struct HIlp<'h> {
    h: &'h HGraph,
    model: Model,
    milp: Milp,
    vars: Vars,
    /// The memory unit (bytes): sizes are divided by it.
    mu: f64,
    /// The budget, in `mu`.
    cap: f64,
    /// The time unit: the longest option's time.
    tu: f64,
    save: Option<u64>,
    loss: usize,
    /// Whether a constant row breaks: the ILP has no solution.
    structural: bool,
    /// The rows the budgets bound, kept to tell how much of them the solution uses.
    peak_rows: Vec<Lin>,
    save_row: Lin,
    /// Debugging aid: with PEBBLE_TRACE_ILP set, every row store-all's start values break
    /// is printed with its tag. Without a budget, none should be: that found the bug of a
    /// cluster reading what it writes.
    trace: bool,
}

impl<'h> HIlp<'h> {
    fn new(h: &'h HGraph, budget: u64, save: Option<u64>) -> Result<HIlp<'h>, IlpError> {
        let model = Model::new(h)?;
        let largest = h.sizes.iter().copied().max().unwrap_or(0);
        let mu = (budget.max(largest) as f64 / 1e4).max(1.0);
        let tu = h.nodes.iter().flat_map(|x| x.options.iter().map(|o| o.time)).fold(0.0, f64::max);
        let vars = Vars {
            comp: Vec::with_capacity(model.n),
            p: Vec::with_capacity(model.n + 1),
            sp: Vec::with_capacity(model.n + 1),
        };
        Ok(HIlp {
            h,
            model,
            milp: Milp::new(),
            vars,
            mu,
            cap: budget as f64 / mu,
            tu: if tu > 0.0 { tu } else { 1.0 },
            save,
            loss: h.loss().expect("checked"),
            structural: false,
            peak_rows: Vec::new(),
            save_row: Lin::default(),
            trace: std::env::var_os("PEBBLE_TRACE_ILP").is_some(),
        })
    }

    /// `b` bytes in the memory unit.
    fn mem(&self, b: u64) -> f64 {
        b as f64 / self.mu
    }

    /// Adds `lo ≤ e ≤ hi`, or checks it when `e` is constant.
    fn row(&mut self, tag: u32, lo: f64, e: &Lin, hi: f64) {
        let value = e.eval(self.milp.start_values());
        if self.trace && !Milp::holds(lo, &Lin::constant(value), hi) {
            eprintln!("store-all breaks row #{tag}: {lo} <= {value} <= {hi}");
        }
        if e.is_constant() {
            self.structural |= !Milp::holds(lo, e, hi);
        } else {
            self.milp.row(lo, e, hi);
        }
    }

    /// `Comp[t,k,o]` for the nodes that may run in stage `t` (3.4)/(2.3), node `t` in its
    /// stage (3.9)/(2.5), the loss and the backward nodes there only (3.10)/(2.6), one
    /// option at a time (3.15).
    fn comp_columns(&mut self) {
        let (h, n) = (self.h, self.model.n);
        for t in 0..n {
            let mut per_node = vec![Vec::new(); n];
            for (k, slot) in per_node.iter_mut().enumerate().take(t + 1) {
                if !self.model.may_run(t, k) {
                    continue;
                }
                let opts = &h.nodes[k].options;
                if k == t && opts.len() == 1 {
                    *slot = vec![Bin::One];
                    continue;
                }
                *slot = opts
                    .iter()
                    .enumerate()
                    .map(|(o, opt)| {
                        Bin::Var(self.milp.binary(opt.time / self.tu, f64::from(u8::from(k == t && o == 0))))
                    })
                    .collect();
                let mut e = Lin::default();
                for &b in slot.iter() {
                    e.add_bin(b, 1.0);
                }
                let lo = if k == t { 1.0 } else { f64::NEG_INFINITY };
                self.row(247, lo, &e, 1.0);
            }
            self.vars.comp.push(per_node);
        }
    }

    /// `P[t,d]` (n + 1 stages: `P[n] = 0`): a column while an activation may be present
    /// between its producer and its last reader, a constant for a gradient's fixed life.
    fn presence_columns(&mut self) {
        let (n, na) = (self.model.n, self.h.sizes.len());
        for t in 0..=n {
            let mut v = vec![Bin::Zero; na];
            for (d, slot) in v.iter_mut().enumerate() {
                *slot = match self.model.life[d] {
                    Life::Variable { producer, s_last } if t > producer && t <= s_last && t < n => {
                        let last_user = self.model.users[d].last().copied().unwrap_or(0);
                        Bin::Var(self.milp.binary(0.0, f64::from(u8::from(t <= last_user))))
                    }
                    Life::Fixed { first, end } if t > first && end.is_none_or(|e| t <= e) => Bin::One,
                    _ => Bin::Zero,
                };
            }
            self.vars.p.push(v);
        }
    }

    /// `Sp[t,k,o]` between a pair's forward and its backward, and (3.16)/(2.9): one option's
    /// phantom kept at a time.
    fn phantom_columns(&mut self) {
        let n = self.model.n;
        for t in 0..=n {
            let mut v = vec![Vec::new(); n];
            for (k, slot) in v.iter_mut().enumerate() {
                let Some(b) = self.model.backward_of[k] else { continue };
                if t <= k || t > b {
                    continue;
                }
                let nb = self.h.nodes[b].options.len();
                *slot = (0..nb)
                    .map(|o| {
                        if self.h.nodes[k].options[o].phantom > 0 {
                            Bin::Var(self.milp.binary(0.0, f64::from(u8::from(o == 0))))
                        } else {
                            Bin::Zero
                        }
                    })
                    .collect();
                let mut e = Lin::default();
                for &x in slot.iter() {
                    e.add_bin(x, 1.0);
                }
                self.row(281, f64::NEG_INFINITY, &e, 1.0);
            }
            self.vars.sp.push(v);
        }
    }

    /// Whether node `u` reads `d` in stage `t`: it runs, in any option if `d` is one of its
    /// inputs, else in one of the options that read it.
    fn reads(&self, t: usize, u: usize, d: usize) -> Lin {
        if self.h.nodes[u].inputs.contains(&d) {
            return self.vars.sum_comp(t, u);
        }
        let mut e = Lin::default();
        for (o, opt) in self.h.nodes[u].options.iter().enumerate() {
            if opt.reads.contains(&d) {
                e.add_bin(self.vars.comp(t, u, o), 1.0);
            }
        }
        e
    }

    /// (3.13)/(2.8), (3.14): in stage `t`, a node runs (in an option) only if each input
    /// (each read of the option) is present or made earlier in the stage.
    fn dependencies(&mut self, t: usize, active: &[usize]) -> Result<(), IlpError> {
        let h = self.h;
        for &k in active {
            let node = &h.nodes[k];
            for &d in &node.inputs {
                if let Life::Variable { producer, .. } = self.model.life[d] {
                    let mut e = self.vars.sum_comp(t, k);
                    e.add_lin(&self.vars.sum_comp(t, producer), -1.0).add_bin(self.vars.p[t][d], -1.0);
                    self.row(297, f64::NEG_INFINITY, &e, 0.0);
                } else if self.model.life[d] == Life::Unused {
                    return Err(IlpError::InvalidGraph(format!("cNode {k} reads aNode {d}, which nobody makes")));
                }
            }
            for (o, opt) in node.options.iter().enumerate() {
                for &d in &opt.reads {
                    if let Life::Variable { producer, .. } = self.model.life[d] {
                        let mut e = Lin::default();
                        e.add_bin(self.vars.comp(t, k, o), 1.0)
                            .add_lin(&self.vars.sum_comp(t, producer), -1.0)
                            .add_bin(self.vars.p[t][d], -1.0);
                        self.row(309, f64::NEG_INFINITY, &e, 0.0);
                    }
                }
            }
        }
        Ok(())
    }

    /// (3.17)–(3.19)/(2.10): a phantom is made only by the forward in its option, dropped
    /// only by the backward, which needs it.
    fn phantoms(&mut self, t: usize) {
        let h = self.h;
        for k in 0..self.model.n {
            let Some(b) = self.model.backward_of[k] else { continue };
            for o in 0..h.nodes[b].options.len() {
                if h.nodes[k].options[o].phantom == 0 {
                    continue;
                }
                let now = self.vars.sp(t, k, o);
                let next = self.vars.sp(t + 1, k, o);
                let f = self.vars.comp(t, k, o);
                let bw = self.vars.comp(t, b, o);
                // Sp[t+1] ≤ Sp[t] + Comp_F;  Sp[t+1] ≥ Sp[t] + Comp_F − Comp_B;  Comp_B ≤ Sp[t] + Comp_F.
                let mut e = Lin::default();
                e.add_bin(next, 1.0).add_bin(now, -1.0).add_bin(f, -1.0);
                self.row(328, f64::NEG_INFINITY, &e, 0.0);
                let mut e = Lin::default();
                e.add_bin(next, 1.0).add_bin(now, -1.0).add_bin(f, -1.0).add_bin(bw, 1.0);
                self.row(331, 0.0, &e, f64::INFINITY);
                let mut e = Lin::default();
                e.add_bin(bw, 1.0).add_bin(now, -1.0).add_bin(f, -1.0);
                self.row(334, f64::NEG_INFINITY, &e, 0.0);
            }
        }
    }

    /// (3.20)–(3.26)/(2.11)–(2.17): the liveness of the variable aNodes in stage `t`:
    /// creation, deletion, alive counts, persistence into stage `t + 1`.
    fn liveness(&mut self, t: usize) -> Events {
        let na = self.h.sizes.len();
        let mut events = Events { create: vec![Bin::Zero; na], delete: vec![Vec::new(); na] };
        for d in 0..na {
            let Life::Variable { producer, .. } = self.model.life[d] else { continue };
            let touching: Vec<usize> = std::iter::once(producer)
                .chain(self.model.users[d].iter().copied())
                .filter(|&k| k <= t && self.model.may_run(t, k))
                .collect();
            let next = self.vars.p[t + 1][d];
            if touching.is_empty() {
                // P[t+1] = P[t].
                let mut e = Lin::default();
                e.add_bin(next, 1.0).add_bin(self.vars.p[t][d], -1.0);
                self.row(351, 0.0, &e, 0.0);
                continue;
            }
            let made_here = touching[0] == producer;
            if made_here {
                let c = Bin::Var(self.milp.binary(0.0, f64::from(u8::from(t == producer))));
                events.create[d] = c;
                let mut e = Lin::default();
                e.add_bin(c, 1.0).add_lin(&self.vars.sum_comp(t, producer), -1.0);
                self.row(360, f64::NEG_INFINITY, &e, 0.0);
            }
            let mut alive = Lin::default();
            alive.add_bin(self.vars.p[t][d], 1.0);
            for (i, &k) in touching.iter().enumerate() {
                // Node k touches d: it made it, or runs in an option that reads it.
                let sc = if k == producer { self.vars.sum_comp(t, k) } else { self.reads(t, k, d) };
                let later: Vec<usize> = touching[i + 1..].iter().copied().filter(|&u| u != producer).collect();
                let del = self.deletion(t, k, d, producer, &sc, &later);
                events.delete[d].push((k, del));
                if k == producer {
                    alive.add_bin(events.create[d], 1.0);
                    // A ≥ sumComp − D right after the producer.
                    let mut e = alive.clone();
                    e.add_lin(&sc, -1.0);
                    self.row(409, 0.0, &e, f64::INFINITY);
                }
                alive.add_bin(del, -1.0);
                self.row(412, 0.0, &alive, 1.0);
            }
            // P[t+1] = A after the last event.
            let mut e = alive.clone();
            e.add_bin(next, -1.0);
            self.row(417, 0.0, &e, 0.0);
        }
        events
    }

    /// (3.25)–(3.26)/(2.16): `D[t,k,d] = 1` iff `k` runs (`sc`), `d` (made by `producer`)
    /// is not kept into stage `t + 1`, and none of the `later` readers of `d` in the stage
    /// reads it; linearized with `κ = 2 + #later readers`, plus one row per hazard.
    fn deletion(&mut self, t: usize, k: usize, d: usize, producer: usize, sc: &Lin, later: &[usize]) -> Bin {
        let next = self.vars.p[t + 1][d];
        // h = (1 − sc_k) + P[t+1] + Σ_later reads_u(d): a later node holds `d` only
        // if it runs in an option that reads it.
        let mut haz = Lin::constant(1.0);
        haz.add_lin(sc, -1.0).add_bin(next, 1.0);
        for &u in later {
            haz.add_lin(&self.reads(t, u, d), 1.0);
        }
        if haz.is_constant() {
            return if haz.constant.abs() < 0.5 { Bin::One } else { Bin::Zero };
        }
        let last_event = self.model.users[d].last().copied().unwrap_or(producer).max(producer);
        let dcol = self.milp.binary(0.0, f64::from(u8::from(k == t && k == last_event)));
        let kappa = haz.max_binary();
        let mut lo = haz.clone();
        lo.add_col(dcol, 1.0);
        self.row(384, 1.0, &lo, f64::INFINITY);
        let mut hi = haz.clone();
        hi.add_col(dcol, kappa);
        self.row(387, f64::NEG_INFINITY, &hi, kappa);
        // One row per hazard (valid, and far tighter in the relaxation):
        // D ≤ sc_k, D ≤ 1 − P[t+1], D ≤ 1 − sc_u.
        let mut e = Lin::default();
        e.add_col(dcol, 1.0).add_lin(sc, -1.0);
        self.row(392, f64::NEG_INFINITY, &e, 0.0);
        let mut e = Lin::default();
        e.add_col(dcol, 1.0).add_bin(next, 1.0);
        self.row(395, f64::NEG_INFINITY, &e, 1.0);
        for &u in later {
            let mut e = Lin::default();
            e.add_col(dcol, 1.0).add_lin(&self.reads(t, u, d), 1.0);
            self.row(399, f64::NEG_INFINITY, &e, 1.0);
        }
        Bin::Var(dcol)
    }

    /// (3.27)–(3.34)/(2.18)–(2.19): memory along stage `t`. `U` starts with what is
    /// present (`P`, `Sp`) and, after each active node, is what remains after its frees.
    fn memory(&mut self, t: usize, active: &[usize], events: &Events) {
        let h = self.h;
        let mut u = Lin::default();
        for d in 0..h.sizes.len() {
            u.add_bin(self.vars.p[t][d], self.mem(h.sizes[d]));
        }
        for k in 0..self.model.n {
            for o in 0..self.vars.sp[t][k].len() {
                u.add_bin(self.vars.sp(t, k, o), self.mem(h.nodes[k].options[o].phantom));
            }
        }
        for &k in active {
            let peak = self.while_running(t, k, u, events);
            self.peak(t, k, &peak);
            self.correction_terms(t, k, &peak, events);
            u = self.after_frees(t, k, peak, events);
        }
    }

    /// What is resident while node `k` runs in stage `t`: `U[k−1]` (`u`), the aNodes it
    /// creates, and its forward option's phantom.
    fn while_running(&self, t: usize, k: usize, u: Lin, events: &Events) -> Lin {
        let h = self.h;
        let node = &h.nodes[k];
        let mut peak = u;
        for &d in &node.outputs {
            match self.model.life[d] {
                Life::Variable { producer, .. } if producer == k => {
                    peak.add_bin(events.create[d], self.mem(h.sizes[d]));
                }
                Life::Fixed { first, .. } if first == k && t == k => {
                    peak.add_bin(Bin::One, self.mem(h.sizes[d]));
                }
                _ => {}
            }
        }
        if let HKind::Forward { .. } = node.kind {
            for (o, opt) in node.options.iter().enumerate() {
                if opt.phantom > 0 && self.model.backward_of[k].is_some_and(|b| o < h.nodes[b].options.len()) {
                    peak.add_bin(self.vars.comp(t, k, o), self.mem(opt.phantom));
                }
            }
        }
        peak
    }

    /// What node `k` deletes after it runs in stage `t`: its D column for `d`, if any.
    fn deleted_after(&self, t: usize, k: usize, d: usize, events: &Events) -> Option<Bin> {
        match self.model.life[d] {
            Life::Variable { .. } => events.delete[d].iter().find(|(kk, _)| *kk == k).map(|&(_, b)| b),
            Life::Fixed { end: Some(e), .. } if e == k && t == k => Some(Bin::One),
            _ => None,
        }
    }

    /// (3.33): the peak while node `k` runs, with its option's overhead, within the budget.
    /// An option with correction terms is held by its substeps instead: its outputs and
    /// phantom may never be resident beside all of its inputs, so the row leaves it the
    /// slack its substeps allow at most (they imply the row).
    fn peak(&mut self, t: usize, k: usize, peak: &Lin) {
        let h = self.h;
        let mut with_tmp = peak.clone();
        for (o, opt) in h.nodes[k].options.iter().enumerate() {
            if opt.substeps.is_empty() {
                with_tmp.add_bin(self.vars.comp(t, k, o), self.mem(opt.overhead));
            } else {
                let slack = opt
                    .substeps
                    .iter()
                    .map(|s| s.dead.iter().map(|&d| h.sizes[d] as i64).sum::<i64>() - s.overhead)
                    .min()
                    .unwrap_or(0)
                    .max(0);
                with_tmp.add_bin(self.vars.comp(t, k, o), -(slack as f64) / self.mu);
            }
        }
        self.row(454, f64::NEG_INFINITY, &with_tmp, self.cap);
        self.peak_rows.push(with_tmp);
    }

    /// (3.34): substep `i` of option `o`, less the inputs no later substep reads, when `k`
    /// deletes them.
    fn correction_terms(&mut self, t: usize, k: usize, peak: &Lin, events: &Events) {
        let h = self.h;
        for (o, opt) in h.nodes[k].options.iter().enumerate() {
            for step in &opt.substeps {
                let mut e = peak.clone();
                e.add_bin(self.vars.comp(t, k, o), step.overhead as f64 / self.mu);
                for &d in &step.dead {
                    if let Some(del) = self.deleted_after(t, k, d, events) {
                        e.add_bin(del, -self.mem(h.sizes[d]));
                    }
                }
                self.row(473, f64::NEG_INFINITY, &e, self.cap);
                self.peak_rows.push(e);
            }
        }
    }

    /// `U[k]`: what remains after node `k`'s frees (a backward drops its phantom), as one
    /// column when the sum is long; and, right after the loss, (2.19) the save budget.
    fn after_frees(&mut self, t: usize, k: usize, peak: Lin, events: &Events) -> Lin {
        let h = self.h;
        let node = &h.nodes[k];
        let mut after = peak;
        for d in 0..h.sizes.len() {
            if let Some(del) = self.deleted_after(t, k, d, events) {
                after.add_bin(del, -self.mem(h.sizes[d]));
            }
        }
        if let HKind::Backward { .. } = node.kind {
            // The phantom this backward drops: Comp_F + Sp[t] − Sp[t+1], per option.
            let f = (0..self.model.n).find(|&f| self.model.backward_of[f] == Some(k)).expect("paired");
            for o in 0..node.options.len() {
                let p = self.mem(h.nodes[f].options[o].phantom);
                if p > 0.0 {
                    after
                        .add_bin(self.vars.comp(t, f, o), -p)
                        .add_bin(self.vars.sp(t, f, o), -p)
                        .add_bin(self.vars.sp(t + 1, f, o), p);
                }
            }
        }
        if after.terms.len() > 8 {
            let col = self.milp.continuous(0.0, f64::NEG_INFINITY, f64::INFINITY, after.eval(self.milp.start_values()));
            let mut def = after.clone();
            def.add_col(col, -1.0);
            self.row(484, 0.0, &def, 0.0);
            after = Lin::default();
            after.add_col(col, 1.0);
        }
        if k == self.loss && t == self.loss {
            if let Some(s) = self.save {
                self.row(490, f64::NEG_INFINITY, &after, self.mem(s));
            }
            self.save_row = after.clone();
        }
        after
    }

    /// Solves, HiGHS started from `start` (else store-all's values), and reads the
    /// sequence and the peak and save the solution uses.
    fn solve(mut self, time_limit: Option<f64>, start: Option<&[(usize, usize)]>) -> Result<HSolution, IlpError> {
        if self.structural {
            return Err(IlpError::Infeasible);
        }
        // The start values are store-all's (each node once, in its own stage, option 0, every
        // tensor kept to its last reader): HiGHS takes them when they fit the budget. A start
        // sequence given replaces them.
        if let Some(values) = start.and_then(|seq| comp_values(&self.vars, self.milp.num_cols(), seq)) {
            self.milp.partial_start(values);
        }
        let options = [("mip_rel_gap", 1e-4), ("mip_abs_gap", 1e-6)];
        let (values, optimal) = match self.milp.solve(time_limit, true, &options)? {
            Outcome::Optimal(v) => (v, true),
            Outcome::Incumbent(v, ..) => (v, false),
        };
        let mut seq = Vec::new();
        for t in 0..self.model.n {
            for k in 0..=t {
                if let Some(o) = self.vars.comp[t][k].iter().position(|b| b.value(&values)) {
                    seq.push((k, o));
                }
            }
        }
        // In bytes, rounded up: a budget at least this large holds the solution.
        let bytes = |v: f64| (v.max(0.0) * self.mu).ceil() as u64;
        let peak = bytes(self.peak_rows.iter().map(|e| e.eval(&values)).fold(0.0, f64::max));
        let save = bytes(self.save_row.eval(&values));
        Ok(HSolution { seq, optimal, peak, save })
    }
}
