//! The Ch. 6 MILP itself (see the parent module's doc): [`solve_pattern`] builds it one
//! constraint family at a time, in the thesis's order, solves it, and reads the pattern
//! off the solution.

use std::collections::{BTreeMap, HashMap};

use highs::Col;
use pebble_schedule::Pass;
use pebble_solve::pipeline::PipeProblem;

use super::{IlpPattern, Timed, Transfer, GAP, INSTANT};
use crate::milp::{Bin, Lin, Milp, Outcome};
use crate::IlpError;

const INF: f64 = f64::INFINITY;

/// `1 − b`.
fn not(b: Bin) -> Lin {
    let mut e = Lin::constant(1.0);
    e.add_bin(b, -1.0);
    e
}

fn lin(b: Bin) -> Lin {
    let mut e = Lin::default();
    e.add_bin(b, 1.0);
    e
}

fn is_zero(e: &Lin) -> bool {
    e.is_constant() && e.constant < 0.5
}

/// Two operations `a`, `b` (start column, duration) that must not overlap, nor span more
/// than `T`, when `same` (a 0/1 expression) is 1: (6.5)–(6.7) and (6.20), or
/// (6.14)–(6.16) and (6.21). Returns the order, `w_{ab}` (1: `a` ends before `b` starts);
/// `w_{ba} = same − w_{ab}`.
fn disjoint(m: &mut Milp, k: f64, t: Col, a: (Col, f64), b: (Col, f64), same: &Lin) -> Lin {
    if is_zero(same) {
        return Lin::default();
    }
    let w = m.binary(0.0, f64::NAN);
    if !same.is_constant() {
        let mut e = Lin::default();
        e.add_col(w, 1.0).add_lin(same, -1.0);
        m.row(-INF, &e, 0.0);
    }
    // w = 1: τ_b ≥ τ_a + d_a.
    let mut e = Lin::constant(2.0 * k - a.1);
    e.add_col(b.0, 1.0).add_col(a.0, -1.0).add_lin(same, -k).add_col(w, -k);
    m.row(0.0, &e, INF);
    // w = 0: τ_a ≥ τ_b + d_b.
    let mut e = Lin::constant(k - b.1);
    e.add_col(a.0, 1.0).add_col(b.0, -1.0).add_lin(same, -k).add_col(w, k);
    m.row(0.0, &e, INF);
    // The span of both within T.
    for (x, y) in [(a, b), (b, a)] {
        let mut e = Lin::constant(k - x.1);
        e.add_col(t, 1.0).add_col(x.0, -1.0).add_col(y.0, 1.0).add_lin(same, -k);
        m.row(0.0, &e, INF);
    }
    let mut out = Lin::default();
    out.add_col(w, 1.0);
    out
}

/// A 0/1 quantity bounded below by each of `lower` and above by each of `upper` (all
/// over 0/1 columns): a constant when they all are, else a binary column with those rows.
fn bounded(m: &mut Milp, lower: &[Lin], upper: &[Lin]) -> Lin {
    if lower.iter().chain(upper).all(Lin::is_constant) {
        let lo = lower.iter().map(|e| e.constant).fold(0.0, f64::max);
        return Lin::constant(if lo > 0.5 { 1.0 } else { 0.0 });
    }
    let z = m.binary(0.0, f64::NAN);
    for e in lower {
        let mut r = Lin::default();
        r.add_col(z, 1.0).add_lin(e, -1.0);
        m.row(0.0, &r, INF);
    }
    for e in upper {
        let mut r = Lin::default();
        r.add_col(z, 1.0).add_lin(e, -1.0);
        m.row(-INF, &r, 0.0);
    }
    lin(Bin::Var(z))
}

/// The ILP on `problem.layers` (`fixed`: the device of each layer, MadPipe's phase 2),
/// with each device's memory lowered by `slack` bytes. The constraint families go in
/// the order below: HiGHS's search can depend on the order of the rows.
pub fn solve_pattern(problem: &PipeProblem<'_>, fixed: Option<&[usize]>, slack: u64) -> Result<IlpPattern, IlpError> {
    let n = problem.layers.len();
    if n == 0 {
        return Err(IlpError::InvalidGraph("no layers".into()));
    }
    if let Some(f) = fixed {
        if f.len() != n {
            return Err(IlpError::InvalidGraph(format!("{} devices fixed for {n} layers", f.len())));
        }
    }
    let mut ilp = PatternIlp::new(problem, fixed);
    ilp.within_period();
    ilp.colocation();
    match fixed {
        None => {
            ilp.transitivity();
            ilp.device_count();
        }
        Some(f) => fixed_fits(f, ilp.devices)?,
    }
    ilp.device_load_cut();
    ilp.computations();
    ilp.communications();
    ilp.same_link();
    ilp.link_load_cut();
    ilp.transfers();
    ilp.index_shifts();
    if let Some(memory) = problem.memory {
        ilp.memory(memory.checked_sub(slack).ok_or(IlpError::Infeasible)? as f64)?;
    }
    ilp.solve()
}

/// A fixed allocation (MadPipe's phase 2) uses at most `devices` devices.
fn fixed_fits(fixed: &[usize], devices: usize) -> Result<(), IlpError> {
    let mut used: Vec<usize> = fixed.to_vec();
    used.sort_unstable();
    used.dedup();
    if used.len() > devices {
        return Err(IlpError::InvalidGraph(format!(
            "the fixed allocation uses {} devices, {devices} exist",
            used.len()
        )));
    }
    Ok(())
}

/// The indexing of the module doc: `2L` tasks and `2L − 1` communications on `L` layers.
#[derive(Debug, Clone, Copy)]
struct Tasks {
    /// The layers `L`.
    n: usize,
}

impl Tasks {
    fn tasks(self) -> usize {
        2 * self.n
    }
    fn comms(self) -> usize {
        2 * self.n - 1
    }
    /// The layer of task `t`.
    fn layer(self, t: usize) -> usize {
        if t < self.n {
            t
        } else {
            2 * self.n - 1 - t
        }
    }
    /// The task `F_ℓ`.
    fn f(self, l: usize) -> usize {
        l
    }
    /// The task `B_ℓ`.
    fn b(self, l: usize) -> usize {
        2 * self.n - 1 - l
    }
    /// The boundary communication `c` carries (`L − 1`: the loss's, which never travels).
    fn boundary(self, c: usize) -> usize {
        if c < self.n {
            c
        } else {
            2 * self.n - 2 - c
        }
    }
}

/// The ILP of [`solve_pattern`] under construction: the model, its columns, and what its
/// constraint families share. Each method adds one family (or a cut), and fills the
/// columns it makes for those that follow; times are scaled so that `T_seq` is 1.
struct PatternIlp<'p> {
    problem: &'p PipeProblem<'p>,
    fixed: Option<&'p [usize]>,
    ix: Tasks,
    /// `P`, at least 1.
    devices: usize,
    m: Milp,
    /// `1 / T_seq` (1 when it is 0): seconds times `scale` are the ILP's times.
    scale: f64,
    /// Each task's duration `d` (at least [`INSTANT`]).
    d: Vec<f64>,
    /// Each communication's duration `d̃` when it travels.
    dc: Vec<f64>,
    /// `Σ d + Σ d̃`: `T`'s upper bound.
    horizon: f64,
    /// The big-M `K = 2·horizon`.
    k: f64,
    /// The period `T`.
    t: Col,
    /// Each task's start `τ`.
    tau: Vec<Col>,
    /// `z` on layers, `y[ℓ][ℓ']` (symmetric, 1 on the diagonal).
    y: Vec<Vec<Bin>>,
    /// `w[a][b]` for tasks `a < b`: `a` ends before `b` starts.
    w: Vec<Vec<Lin>>,
    /// Each communication's duration `d̃_c·(1 − z_{c,c+1})`.
    dur_c: Vec<Lin>,
    /// Each communication's start `τ̃`.
    tau_c: Vec<Col>,
    /// The boundaries whose communications may share a link (none when all are free).
    links: Vec<usize>,
    /// `z̃` per pair of boundaries of `links`: both travel on the same link.
    zt: HashMap<(usize, usize), Lin>,
    /// `w̃` per pair of travelling communications `c < c'`, not both free: `c` first.
    wt: HashMap<(usize, usize), Lin>,
    /// Each communication's index-shift columns `[v, v', ṽ, ṽ']`.
    shifts: Vec<[Col; 4]>,
}

impl<'p> PatternIlp<'p> {
    /// The scaled durations, and the columns `T` and `τ` (`τ_0 = 0`), with the cut `T`
    /// at least the largest task and `Σ d / P`, and `T ≤ T_seq` (erratum 7).
    fn new(problem: &'p PipeProblem<'p>, fixed: Option<&'p [usize]>) -> PatternIlp<'p> {
        let layers = problem.layers;
        let ix = Tasks { n: layers.len() };
        let n = ix.n;
        let comm_time = |j: usize| {
            if j + 1 >= n {
                0.0
            } else if problem.bandwidth.is_infinite() {
                problem.latency
            } else {
                layers.boundary[j] as f64 / problem.bandwidth + problem.latency
            }
        };
        let raw_d: Vec<f64> =
            (0..ix.tasks()).map(|t| if t < n { layers.uf[t] } else { layers.ub[ix.layer(t)] }).collect();
        let raw_dc: Vec<f64> = (0..ix.comms()).map(|c| comm_time(ix.boundary(c))).collect();
        let seq: f64 = raw_d.iter().sum::<f64>() + raw_dc.iter().sum::<f64>();
        let scale = if seq > 0.0 { 1.0 / seq } else { 1.0 };
        // A task lasts at least INSTANT (see the module doc: zero durations).
        let d: Vec<f64> = raw_d.iter().map(|x| (x * scale).max(INSTANT)).collect();
        let dc: Vec<f64> = raw_dc.iter().map(|x| x * scale).collect();
        let horizon = d.iter().sum::<f64>() + dc.iter().sum::<f64>();

        let mut m = Milp::new();
        let devices = problem.devices.max(1);
        let lo = d.iter().copied().fold(d.iter().sum::<f64>() / devices as f64, f64::max).min(horizon);
        let t = m.continuous(1.0, lo, horizon, f64::NAN);
        let tau: Vec<Col> = (0..ix.tasks())
            .map(|x| {
                if x == 0 {
                    m.continuous(0.0, 0.0, 0.0, f64::NAN)
                } else {
                    m.continuous(0.0, -d[x], horizon - d[x], f64::NAN)
                }
            })
            .collect();
        PatternIlp {
            problem,
            fixed,
            ix,
            devices,
            m,
            scale,
            d,
            dc,
            horizon,
            k: 2.0 * horizon,
            t,
            tau,
            y: Vec::new(),
            w: Vec::new(),
            dur_c: Vec::new(),
            tau_c: Vec::new(),
            links: Vec::new(),
            zt: HashMap::new(),
            wt: HashMap::new(),
            shifts: Vec::new(),
        }
    }

    /// (6.17): every task ends within the period, `τ_x + d_x ≤ T`.
    fn within_period(&mut self) {
        for x in 1..self.ix.tasks() {
            let mut e = Lin::constant(self.d[x]);
            e.add_col(self.tau[x], 1.0).add_col(self.t, -1.0);
            self.m.row(-INF, &e, 0.0); // (6.17)
        }
    }

    /// (6.4) substituted (erratum 1): `z` on layers, one column per pair of layers, or
    /// constants from a fixed allocation.
    fn colocation(&mut self) {
        let n = self.ix.n;
        let mut y = vec![vec![Bin::One; n]; n];
        for a in 0..n {
            for b in a + 1..n {
                let v = match self.fixed {
                    Some(f) if f[a] == f[b] => Bin::One,
                    Some(_) => Bin::Zero,
                    None => Bin::Var(self.m.binary(0.0, f64::NAN)),
                };
                y[a][b] = v;
                y[b][a] = v;
            }
        }
        self.y = y;
    }

    /// (6.1) for every pivot (erratum 1): `z_{q,r} ≥ z_{p,q} + z_{p,r} − 1`.
    fn transitivity(&mut self) {
        let (n, y) = (self.ix.n, &self.y);
        for a in 0..n {
            for b in a + 1..n {
                for c in b + 1..n {
                    for (p, q, r) in [(a, b, c), (b, a, c), (c, a, b)] {
                        // z_{q,r} ≥ z_{p,q} + z_{p,r} − 1
                        let mut e = Lin::constant(1.0);
                        e.add_bin(y[q][r], 1.0).add_bin(y[p][q], -1.0).add_bin(y[p][r], -1.0);
                        self.m.row(0.0, &e, INF);
                    }
                }
            }
        }
    }

    /// (6.2)–(6.3) on layers: `f_ℓ ≥ 1 − Σ_{ℓ'<ℓ} z_{ℓℓ'}` marks the first layer of each
    /// class, and `Σ f ≤ P` (`f_1 = 1`).
    fn device_count(&mut self) {
        let mut count = Lin::constant(1.0);
        for a in 1..self.ix.n {
            let f = self.m.continuous(0.0, 0.0, 1.0, f64::NAN);
            let mut e = Lin::default();
            e.add_col(f, 1.0);
            for b in 0..a {
                e.add_bin(self.y[a][b], 1.0);
            }
            self.m.row(1.0, &e, INF);
            count.add_col(f, 1.0);
        }
        self.m.row(-INF, &count, self.devices as f64);
    }

    /// Cut: `T` at least each device's load.
    fn device_load_cut(&mut self) {
        let ix = self.ix;
        for a in 0..ix.n {
            let mut e = Lin::default();
            e.add_col(self.t, -1.0);
            for b in 0..ix.n {
                e.add_bin(self.y[a][b], self.d[ix.f(b)] + self.d[ix.b(b)]);
            }
            self.m.row(-INF, &e, 0.0);
        }
    }

    /// (6.5)–(6.7), (6.20): two colocated tasks neither overlap nor span more than `T`;
    /// `w` orders them.
    fn computations(&mut self) {
        let ix = self.ix;
        let mut w: Vec<Vec<Lin>> = vec![vec![Lin::default(); ix.tasks()]; ix.tasks()];
        for (a, row) in w.iter_mut().enumerate() {
            for (b, w_ab) in row.iter_mut().enumerate().skip(a + 1) {
                let same = lin(self.y[ix.layer(a)][ix.layer(b)]);
                *w_ab =
                    disjoint(&mut self.m, self.k, self.t, (self.tau[a], self.d[a]), (self.tau[b], self.d[b]), &same);
            }
        }
        self.w = w;
    }

    /// `w_{ab}`: task `a` before task `b`; `w_{ba} = z_{ab} − w_{ab}` (erratum 2).
    fn before(&self, a: usize, b: usize) -> Lin {
        if a == b {
            Lin::default()
        } else if a < b {
            self.w[a][b].clone()
        } else {
            let mut e = lin(self.y[self.ix.layer(a)][self.ix.layer(b)]);
            e.add_lin(&self.w[b][a], -1.0);
            e
        }
    }

    /// `1 − z_{j,j+1}`: whether communication `c` (of boundary `j`) travels.
    fn travels(&self, c: usize) -> Lin {
        let j = self.ix.boundary(c);
        if j + 1 >= self.ix.n {
            Lin::default()
        } else {
            not(self.y[j][j + 1])
        }
    }

    /// (6.18) with erratum 6: each communication lasts `d̃_c·(1 − z_{c,c+1})` and runs
    /// within the period from its start `τ̃_c`.
    fn communications(&mut self) {
        let comms = self.ix.comms();
        self.dur_c = (0..comms)
            .map(|c| {
                let mut e = Lin::default();
                e.add_lin(&self.travels(c), self.dc[c]);
                e
            })
            .collect();
        self.tau_c = (0..comms).map(|c| self.m.continuous(0.0, -self.dc[c], self.horizon, f64::NAN)).collect();
        for c in 0..comms {
            // (6.18)
            let mut e = self.dur_c[c].clone();
            e.add_col(self.tau_c[c], 1.0);
            self.m.row(0.0, &e, INF);
            e.add_col(self.t, -1.0);
            self.m.row(-INF, &e, 0.0);
        }
    }

    /// (6.8)–(6.13): `z̃` per pair of boundaries, whether both travel on the same link
    /// (both directions of each share it); none when every communication is free (their
    /// order on a link is then any order of their starts).
    fn same_link(&mut self) {
        let n = self.ix.n;
        self.links = if (0..n.saturating_sub(1)).any(|j| self.dc[j] > 0.0) { (0..n - 1).collect() } else { Vec::new() };
        let y = |a: usize, b: usize| self.y[a][b];
        for (i, &j) in self.links.iter().enumerate() {
            self.zt.insert((j, j), not(y(j, j + 1)));
            for &j2 in &self.links[i + 1..] {
                let cross = |p: usize, q: usize, r: usize, s: usize| {
                    let mut e = Lin::constant(-1.0);
                    e.add_bin(y(p, q), 1.0).add_bin(y(r, s), 1.0).add_bin(y(j, j + 1), -1.0);
                    e
                };
                let lower = [cross(j, j2, j + 1, j2 + 1), cross(j, j2 + 1, j + 1, j2)];
                let sum = |a: Bin, b: Bin| {
                    let mut e = lin(a);
                    e.add_bin(b, 1.0);
                    e
                };
                let upper = [
                    not(y(j, j + 1)),
                    not(y(j2, j2 + 1)),
                    sum(y(j, j2), y(j + 1, j2)),
                    sum(y(j, j2 + 1), y(j + 1, j2 + 1)),
                ];
                let z = bounded(&mut self.m, &lower, &upper);
                self.zt.insert((j, j2), z.clone());
                self.zt.insert((j2, j), z);
            }
        }
    }

    /// Cut: `T` at least each link's load.
    fn link_load_cut(&mut self) {
        for &j in &self.links {
            let mut e = Lin::default();
            e.add_col(self.t, -1.0);
            for &j2 in &self.links {
                e.add_lin(&self.zt[&(j, j2)], 2.0 * self.dc[j2]);
            }
            self.m.row(-INF, &e, 0.0);
        }
    }

    /// (6.14)–(6.16), (6.21): two communications on the same link neither overlap nor span
    /// more than `T` (with the constant `d̃`: `z̃ = 1` implies both travel); `w̃` orders
    /// them. Two free ones need none.
    fn transfers(&mut self) {
        let ix = self.ix;
        let travelling: Vec<usize> = (0..ix.comms()).filter(|&c| self.links.contains(&ix.boundary(c))).collect();
        for (i, &c) in travelling.iter().enumerate() {
            for &c2 in &travelling[i + 1..] {
                if self.dc[c] == 0.0 && self.dc[c2] == 0.0 {
                    continue;
                }
                let same = self.zt[&(ix.boundary(c), ix.boundary(c2))].clone();
                let (a, b) = ((self.tau_c[c], self.dc[c]), (self.tau_c[c2], self.dc[c2]));
                let w = disjoint(&mut self.m, self.k, self.t, a, b, &same);
                self.wt.insert((c, c2), w);
            }
        }
    }

    /// (6.23)–(6.30): the index shifts `v`, `v'` (the communication after its producer
    /// ends, within the period or the next) and `ṽ`, `ṽ'` (its consumer after it), with
    /// the cuts `v' ≤ v`, `ṽ' ≤ ṽ`.
    fn index_shifts(&mut self) {
        let (tau, d, tau_c, dur_c, t, k) = (&self.tau, &self.d, &self.tau_c, &self.dur_c, self.t, self.k);
        let m = &mut self.m;
        for c in 0..self.ix.comms() {
            let cols = [(); 4].map(|_| m.binary(0.0, f64::NAN));
            let [v, v2, vt, vt2] = cols;
            let row = |m: &mut Milp, e: Lin| m.row(0.0, &e, INF);
            let end = |e: &mut Lin| {
                e.add_col(tau[c], 1.0).constant += d[c];
            };
            let cend = |e: &mut Lin| {
                e.add_col(tau_c[c], 1.0).add_lin(&dur_c[c], 1.0);
            };
            // (6.23) τ + d − τ̃ + K(1 − v) ≥ 0
            let mut e = Lin::constant(k);
            end(&mut e);
            e.add_col(tau_c[c], -1.0).add_col(v, -k);
            row(m, e);
            // (6.24) τ̃ − τ − d + K v ≥ 0
            let mut e = Lin::default();
            e.add_col(tau_c[c], 1.0).add_col(tau[c], -1.0).add_col(v, k).constant -= d[c];
            row(m, e);
            // (6.25) τ̃ + d̃ − τ_{c+1} + K(1 − ṽ) ≥ 0
            let mut e = Lin::constant(k);
            cend(&mut e);
            e.add_col(tau[c + 1], -1.0).add_col(vt, -k);
            row(m, e);
            // (6.26) τ_{c+1} − τ̃ − d̃ + K ṽ ≥ 0
            let mut e = Lin::default();
            e.add_col(tau[c + 1], 1.0).add_col(tau_c[c], -1.0).add_lin(&dur_c[c], -1.0).add_col(vt, k);
            row(m, e);
            // (6.27) τ + d − τ̃ − T + 2K(1 − v') ≥ 0
            let mut e = Lin::constant(2.0 * k);
            end(&mut e);
            e.add_col(tau_c[c], -1.0).add_col(t, -1.0).add_col(v2, -2.0 * k);
            row(m, e);
            // (6.28) τ̃ + T − τ − d + 2K v' ≥ 0
            let mut e = Lin::default();
            e.add_col(tau_c[c], 1.0).add_col(t, 1.0).add_col(tau[c], -1.0).add_col(v2, 2.0 * k).constant -= d[c];
            row(m, e);
            // (6.29) τ̃ + d̃ − τ_{c+1} − T + 2K(1 − ṽ') ≥ 0
            let mut e = Lin::constant(2.0 * k);
            cend(&mut e);
            e.add_col(tau[c + 1], -1.0).add_col(t, -1.0).add_col(vt2, -2.0 * k);
            row(m, e);
            // (6.30) τ_{c+1} + T − τ̃ − d̃ + 2K ṽ' ≥ 0
            let mut e = Lin::default();
            e.add_col(tau[c + 1], 1.0).add_col(t, 1.0).add_col(tau_c[c], -1.0).add_lin(&dur_c[c], -1.0);
            e.add_col(vt2, 2.0 * k);
            row(m, e);
            // v' ≤ v, ṽ' ≤ ṽ
            for (small, big) in [(v2, v), (vt2, vt)] {
                let mut e = Lin::default();
                e.add_col(small, 1.0).add_col(big, -1.0);
                m.row(-INF, &e, 0.0);
            }
            self.shifts.push(cols);
        }
    }

    /// Σ over communications c in `range` of v + v' + ṽ + ṽ'.
    fn shift_sum(&self, range: std::ops::Range<usize>) -> Lin {
        let mut e = Lin::default();
        for c in range {
            for col in self.shifts[c] {
                e.add_col(col, 1.0);
            }
        }
        e
    }

    /// Memory (6.31)–(6.36), as the simulator counts it: on the device of each task, at its
    /// start, at most `cap` bytes (rows scaled by `1/M`). Errs when a constant row breaks.
    fn memory(&mut self, cap: f64) -> Result<(), IlpError> {
        let ix = self.ix;
        let layers = self.problem.layers;
        let row_scale = 1.0 / cap.max(1.0);
        let versions = self.problem.weight_versions.unwrap_or(2);
        let statics: Vec<f64> = (0..ix.n).map(|l| layers.static_bytes(l, l, versions) as f64).collect();
        for a in 0..ix.n {
            let base = self.device_base(a, &statics);
            let sigma = self.in_flight(a);
            for x in [ix.f(a), ix.b(a)] {
                let mut e = base.clone();
                for (l, s) in sigma.iter().enumerate() {
                    let Some(s) = s else { continue };
                    let stored = layers.stored[l] as f64;
                    e.add_lin(s, stored)
                        .add_lin(&self.before(ix.f(l), x), stored)
                        .add_lin(&self.before(ix.b(l), x), -stored);
                }
                if x == ix.f(a) {
                    e.constant += layers.stored[a] as f64 + layers.ftmp[a] as f64;
                } else {
                    e.constant += layers.btmp[a] as f64;
                }
                let mut scaled = Lin::default();
                scaled.add_lin(&e, row_scale);
                if scaled.is_constant() {
                    if !Milp::holds(-INF, &scaled, cap * row_scale) {
                        return Err(IlpError::Infeasible);
                    }
                } else {
                    self.m.row(-INF, &scaled, cap * row_scale);
                }
            }
        }
        Ok(())
    }

    /// (6.33)–(6.35): what the device of layer `a` holds whatever runs, its layers' static
    /// bytes (`statics`) and the buffers for each boundary that crosses from or to it.
    fn device_base(&mut self, a: usize, statics: &[f64]) -> Lin {
        let layers = self.problem.layers;
        let y = |p: usize, q: usize| self.y[p][q];
        let mut base = Lin::default();
        for (b, &bytes) in statics.iter().enumerate() {
            base.add_bin(y(a, b), bytes);
        }
        // Buffers (6.34)–(6.35) for each boundary that crosses from or to a's device.
        for j in 0..self.ix.n.saturating_sub(1) {
            let bytes = 2 * layers.boundary[j];
            if bytes == 0 {
                continue;
            }
            let diff = |p: Bin, q: Bin| {
                let mut e = lin(p);
                e.add_bin(q, -1.0);
                e
            };
            let lower = [diff(y(a, j), y(a, j + 1)), diff(y(a, j + 1), y(a, j))];
            let buffer = if lower.iter().all(Lin::is_constant) {
                Lin::constant(lower.iter().map(|e| e.constant).fold(0.0, f64::max))
            } else {
                let b = self.m.continuous(0.0, 0.0, 1.0, f64::NAN);
                for e in &lower {
                    let mut r = Lin::default();
                    r.add_col(b, 1.0).add_lin(e, -1.0);
                    self.m.row(0.0, &r, INF);
                }
                let mut e = Lin::default();
                e.add_col(b, 1.0);
                e
            };
            base.add_lin(&buffer, bytes as f64);
        }
        base
    }

    /// (6.31)–(6.32): `σ_{a,ℓ}`, the activations of layer `ℓ` held at the start of the
    /// period (Lemma 17's count), where `ℓ` may be on `a`'s device (`None` elsewhere, and
    /// where the layer stores nothing).
    fn in_flight(&mut self, a: usize) -> Vec<Option<Lin>> {
        let ix = self.ix;
        let mut sigma: Vec<Option<Lin>> = vec![None; ix.n];
        for (l, slot) in sigma.iter_mut().enumerate() {
            if self.problem.layers.stored[l] == 0 || self.y[a][l] == Bin::Zero {
                continue;
            }
            let count = self.shift_sum(ix.f(l)..ix.b(l));
            *slot = Some(match self.y[a][l] {
                Bin::Var(z) => {
                    let big = 4.0 * (ix.b(l) - ix.f(l)) as f64;
                    let s = self.m.continuous(0.0, 0.0, big, f64::NAN);
                    let mut e = Lin::default();
                    e.add_col(s, 1.0).add_col(z, -big);
                    self.m.row(-INF, &e, 0.0); // (6.31)
                    let mut e = Lin::constant(big);
                    e.add_col(s, 1.0).add_lin(&count, -1.0).add_col(z, -big);
                    self.m.row(0.0, &e, INF); // (6.32)
                    let mut e = Lin::default();
                    e.add_col(s, 1.0);
                    e
                }
                _ => count,
            });
        }
        sigma
    }

    /// Solves under the problem's time limit, and reads the pattern off the solution (see
    /// the module doc: extraction).
    fn solve(mut self) -> Result<IlpPattern, IlpError> {
        let options = [
            ("mip_rel_gap", GAP),
            ("mip_abs_gap", 1e-9),
            ("mip_feasibility_tolerance", 1e-9),
            ("primal_feasibility_tolerance", 1e-9),
        ];
        let solved = std::mem::take(&mut self.m).solve(Some(self.problem.time_limit), false, &options)?;
        let (cols, optimal, bound) = match solved {
            Outcome::Optimal(x) => {
                let b = x[self.t.index()];
                (x, true, b)
            }
            Outcome::Incumbent(x, _, dual) => (x, false, dual),
        };
        let ix = self.ix;
        let device = self.allocation(&cols);
        let shift_of = |c: usize| self.shifts[c].iter().filter(|&&col| cols[col.index()] > 0.5).count() as i64;
        let mut h = vec![0i64; ix.tasks()];
        for x in (0..ix.tasks() - 1).rev() {
            h[x] = h[x + 1] + shift_of(x);
        }
        let timed = |x: usize| Timed { start: cols[self.tau[x].index()] / self.scale, shift: h[x] };
        Ok(IlpPattern {
            period: cols[self.t.index()] / self.scale,
            optimal,
            bound: bound / self.scale,
            forward: (0..ix.n).map(|l| timed(ix.f(l))).collect(),
            backward: (0..ix.n).map(|l| timed(ix.b(l))).collect(),
            order: self.device_orders(&cols, &device),
            links: self.link_orders(&cols, &device, &h),
            device,
        })
    }

    /// The device of each layer: the fixed allocation's, or the classes of `y` numbered by
    /// first layer.
    fn allocation(&self, cols: &[f64]) -> Vec<usize> {
        if let Some(f) = self.fixed {
            return f.to_vec();
        }
        let n = self.ix.n;
        let mut dev = vec![usize::MAX; n];
        let mut next = 0;
        for a in 0..n {
            if let Some(b) = (0..a).find(|&b| self.y[b][a].value(cols)) {
                dev[a] = dev[b];
            } else {
                dev[a] = next;
                next += 1;
            }
        }
        dev
    }

    /// The communications that travel, each link's in the pattern's order (the rank from
    /// w̃, then τ̃), with their shifts (`h`: each task's).
    fn link_orders(&self, cols: &[f64], device: &[usize], h: &[i64]) -> Vec<((usize, usize), Vec<Transfer>)> {
        let (ix, n) = (self.ix, self.ix.n);
        type Ranked = (i64, f64, usize); // (rank, start, communication)
        let mut by_link: BTreeMap<(usize, usize), Vec<Ranked>> = Default::default();
        for (c, col) in self.tau_c.iter().enumerate() {
            let j = ix.boundary(c);
            if j + 1 >= n || device[j] == device[j + 1] {
                continue;
            }
            let link = (device[j].min(device[j + 1]), device[j].max(device[j + 1]));
            by_link.entry(link).or_default().push((0, cols[col.index()] / self.scale, c));
        }
        let first_two = |c: usize| self.shifts[c][..2].iter().filter(|&&col| cols[col.index()] > 0.5).count() as i64;
        by_link
            .into_iter()
            .map(|(link, mut list)| {
                let cs: Vec<usize> = list.iter().map(|e| e.2).collect();
                for e in &mut list {
                    let c = e.2;
                    let rank: f64 = cs
                        .iter()
                        .filter(|&&o| o != c)
                        .map(|&o| {
                            let (a, b) = (o.min(c), o.max(c));
                            let Some(w_ab) = self.wt.get(&(a, b)) else {
                                // Two free communications: by start, then along the chain.
                                let at = |x: usize| cols[self.tau_c[x].index()];
                                return if (at(o), o) < (at(c), c) { 1.0 } else { 0.0 };
                            };
                            let w_ab = w_ab.eval(cols);
                            if o < c {
                                w_ab
                            } else {
                                self.zt[&(ix.boundary(a), ix.boundary(b))].eval(cols) - w_ab
                            }
                        })
                        .sum();
                    e.0 = rank.round() as i64;
                }
                list.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
                let transfers = list
                    .into_iter()
                    .map(|(_, start, c)| Transfer {
                        boundary: ix.boundary(c),
                        grad: c >= n,
                        start,
                        shift: h[c] - first_two(c),
                    })
                    .collect();
                (link, transfers)
            })
            .collect()
    }

    /// What each device runs, in the ILP's order (the rank from `w`, then the start).
    fn device_orders(&self, cols: &[f64], device: &[usize]) -> Vec<Vec<(usize, Pass)>> {
        let ix = self.ix;
        let start = |x: usize| cols[self.tau[x].index()] / self.scale;
        let used = device.iter().map(|&d| d + 1).max().unwrap_or(0);
        let mut order: Vec<Vec<(usize, Pass)>> = vec![Vec::new(); used];
        for (dev, list) in order.iter_mut().enumerate() {
            let mut mine: Vec<(i64, f64, usize)> = (0..ix.tasks())
                .filter(|&x| device[ix.layer(x)] == dev)
                .map(|x| {
                    let rank: f64 = (0..ix.tasks())
                        .filter(|&o| o != x && device[ix.layer(o)] == dev)
                        .map(|o| self.before(o, x).eval(cols))
                        .sum();
                    (rank.round() as i64, start(x), x)
                })
                .collect();
            mine.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
            *list = mine.into_iter().map(|(_, _, x)| (ix.layer(x), if x < ix.n { Pass::F } else { Pass::B })).collect();
        }
        order
    }
}
