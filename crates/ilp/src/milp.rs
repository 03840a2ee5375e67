//! A thin layer over the `highs` crate, shared by the ILP solvers.
//!
//! Schedule ILPs fix many of their 0/1 quantities before any solve (a node cannot run
//! before its stage, a backward node runs exactly in its own), so a [`Bin`] is either a
//! constant or a binary column, and a [`Lin`] is a linear expression with a constant
//! term. [`Milp::row`] moves the constant to the bounds and merges repeated columns
//! (HiGHS rejects a matrix with a column twice in one row). [`Milp::solve`] runs HiGHS
//! under an optional time limit and tells an optimal solution from an incumbent found
//! before the limit; it never panics on a status HiGHS returns.

use std::time::Instant;

use highs::{Col, HighsModelStatus, HighsSolutionStatus, RowProblem, Sense};

use crate::IlpError;

/// A 0/1 quantity: a constant, or a binary column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bin {
    /// Always 0.
    Zero,
    /// Always 1.
    One,
    /// A binary column.
    Var(Col),
}

impl Bin {
    /// Whether it may be 1.
    pub fn possible(self) -> bool {
        self != Bin::Zero
    }

    /// Its value in a column assignment (a binary column counts as 1 above one half).
    pub fn value(self, cols: &[f64]) -> bool {
        match self {
            Bin::Zero => false,
            Bin::One => true,
            Bin::Var(c) => cols.get(c.index()).is_some_and(|&v| v > 0.5),
        }
    }
}

/// A linear expression `constant + Σ coef · column`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Lin {
    /// The constant term.
    pub constant: f64,
    /// The column terms (a column may repeat; [`Milp::row`] merges them).
    pub terms: Vec<(Col, f64)>,
}

impl Lin {
    /// The constant `c`.
    pub fn constant(c: f64) -> Lin {
        Lin { constant: c, terms: Vec::new() }
    }

    /// Adds `coef · b`.
    pub fn add_bin(&mut self, b: Bin, coef: f64) -> &mut Lin {
        match b {
            Bin::Zero => {}
            Bin::One => self.constant += coef,
            Bin::Var(c) => self.terms.push((c, coef)),
        }
        self
    }

    /// Adds `coef · column`.
    pub fn add_col(&mut self, col: Col, coef: f64) -> &mut Lin {
        self.terms.push((col, coef));
        self
    }

    /// Adds `coef · e`.
    pub fn add_lin(&mut self, e: &Lin, coef: f64) -> &mut Lin {
        self.constant += coef * e.constant;
        self.terms.extend(e.terms.iter().map(|&(c, v)| (c, coef * v)));
        self
    }

    /// Whether it has no column term.
    pub fn is_constant(&self) -> bool {
        self.terms.iter().all(|&(_, c)| c == 0.0)
    }

    /// Its largest value when every column is a binary (columns with a positive
    /// coefficient at 1).
    pub fn max_binary(&self) -> f64 {
        self.constant + self.terms.iter().map(|&(_, c)| c.max(0.0)).sum::<f64>()
    }

    /// Its value in a column assignment.
    pub fn eval(&self, cols: &[f64]) -> f64 {
        self.constant + self.terms.iter().map(|&(c, k)| k * cols.get(c.index()).copied().unwrap_or(0.0)).sum::<f64>()
    }
}

/// Where a solve ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Proved optimal (within the gap tolerances): the column values.
    Optimal(Vec<f64>),
    /// Stopped (time limit, …) with a feasible incumbent: its column values, why, and
    /// HiGHS's dual bound (no solution's objective is below it; `-∞` if it has none).
    Incumbent(Vec<f64>, String, f64),
}

/// A MILP under construction: columns first (rows may follow each column they use).
pub struct Milp {
    problem: RowProblem,
    /// Column values of a known solution, for a warm start (`NaN` where unknown).
    start: Vec<f64>,
    /// Whether a start with unknown values is still passed on ([`Milp::partial_start`]).
    partial: bool,
}

impl Default for Milp {
    fn default() -> Self {
        Milp::new()
    }
}

impl Milp {
    /// An empty problem.
    pub fn new() -> Milp {
        Milp { problem: RowProblem::default(), start: Vec::new(), partial: false }
    }

    /// Number of columns.
    pub fn num_cols(&self) -> usize {
        self.problem.num_cols()
    }

    /// Number of rows.
    pub fn num_rows(&self) -> usize {
        self.problem.num_rows()
    }

    /// A binary column with objective coefficient `cost` and warm-start value `start`.
    pub fn binary(&mut self, cost: f64, start: f64) -> Col {
        self.start.push(start);
        self.problem.add_integer_column(cost, 0.0..=1.0)
    }

    /// A continuous column in `[lo, hi]` (infinite bounds allowed) with warm-start value `start`.
    pub fn continuous(&mut self, cost: f64, lo: f64, hi: f64, start: f64) -> Col {
        self.start.push(start);
        self.problem.add_column(cost, lo..=hi)
    }

    /// The warm-start value of a column.
    pub fn start_value(&self, col: Col) -> f64 {
        self.start.get(col.index()).copied().unwrap_or(f64::NAN)
    }

    /// The warm-start values, one per column.
    pub fn start_values(&self) -> &[f64] {
        &self.start
    }

    /// Replaces the warm start by a partial one: `values` per column, `NaN` where unknown.
    /// HiGHS fixes the integer columns it is given and completes the rest with a small
    /// sub-MIP (`mip_max_start_nodes`) before its search; it drops the start if that
    /// fails.
    pub fn partial_start(&mut self, values: Vec<f64>) {
        assert_eq!(values.len(), self.num_cols(), "one start value per column");
        self.start = values;
        self.partial = true;
    }

    /// Adds the row `lo ≤ e ≤ hi` (infinite bounds allowed). A constant row is dropped
    /// (the caller checks constant rows itself; see [`Milp::holds`]).
    pub fn row(&mut self, lo: f64, e: &Lin, hi: f64) {
        let mut terms = e.terms.clone();
        terms.sort_by_key(|&(c, _)| c.index());
        let mut merged: Vec<(Col, f64)> = Vec::with_capacity(terms.len());
        for (c, k) in terms {
            match merged.last_mut() {
                Some((last, sum)) if *last == c => *sum += k,
                _ => merged.push((c, k)),
            }
        }
        merged.retain(|&(_, k)| k != 0.0);
        if merged.is_empty() {
            return;
        }
        self.problem.add_row(lo - e.constant..=hi - e.constant, merged);
    }

    /// Whether a constant expression satisfies `lo ≤ e ≤ hi` (with a small tolerance).
    pub fn holds(lo: f64, e: &Lin, hi: f64) -> bool {
        let tol = 1e-9 * (1.0 + e.constant.abs());
        e.constant >= lo - tol && e.constant <= hi + tol
    }

    /// Minimizes the objective with HiGHS. `time_limit` in seconds, and no later than the
    /// thread's deadline (`pebble_solve::deadline`); `warm` passes the
    /// warm-start values (HiGHS ignores them if they are infeasible or incomplete).
    /// `options` are extra HiGHS options (name, value).
    pub fn solve(self, time_limit: Option<f64>, warm: bool, options: &[(&str, f64)]) -> Result<Outcome, IlpError> {
        let started = Instant::now();
        if self.num_cols() == 0 {
            // Nothing to choose (HiGHS calls an empty model `ModelEmpty`); constant rows
            // were checked by the caller.
            return Ok(Outcome::Optimal(Vec::new()));
        }
        let highs_err = |what: &'static str, status: String| IlpError::Highs { what, status };
        let mut model =
            self.problem.try_optimise(Sense::Minimise).map_err(|s| highs_err("load the model", format!("{s:?}")))?;
        if let Some(limit) = pebble_solve::deadline::left(time_limit) {
            model
                .try_set_option("time_limit", limit.max(0.0))
                .map_err(|e| highs_err("set time_limit", e.to_string()))?;
        }
        for &(name, value) in options {
            model.try_set_option(name, value).map_err(|e| highs_err("set an option", format!("{name}: {e}")))?;
        }
        if warm && (self.partial || self.start.iter().all(|v| v.is_finite())) {
            // Best effort: HiGHS checks the start itself and drops it if it is infeasible.
            // An unknown value is HiGHS's `kHighsUndefined`, which is +∞.
            let start: Vec<f64> = self.start.iter().map(|&v| if v.is_finite() { v } else { f64::INFINITY }).collect();
            let _ = model.try_set_solution(Some(&start), None, None, None);
        }
        let solved = model.try_solve().map_err(|s| highs_err("solve the model", format!("{s:?}")))?;
        let status = solved.status();
        let feasible = solved.primal_solution_status() == HighsSolutionStatus::Feasible;
        match status {
            HighsModelStatus::Optimal => Ok(Outcome::Optimal(solved.get_solution().columns().to_vec())),
            HighsModelStatus::Infeasible => Err(IlpError::Infeasible),
            _ if feasible => {
                let dual = solved.double_info_value(c"mip_dual_bound").unwrap_or(f64::NEG_INFINITY);
                Ok(Outcome::Incumbent(solved.get_solution().columns().to_vec(), format!("{status:?}"), dual))
            }
            HighsModelStatus::UnboundedOrInfeasible => Err(IlpError::Infeasible),
            _ => Err(IlpError::NoSolution { status: format!("{status:?}"), seconds: started.elapsed().as_secs_f64() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_binary_program() {
        // min -x - 2y - z  s.t.  x + y ≤ 1 (as 1 + x + y ≤ 2), y + z ≤ 1: y = 1 or x = z = 1.
        let mut m = Milp::new();
        let x = m.binary(-1.0, 0.0);
        let y = m.binary(-2.5, 0.0);
        let z = m.binary(-1.0, 0.0);
        let mut e = Lin::constant(1.0);
        e.add_bin(Bin::Var(x), 1.0).add_bin(Bin::Var(y), 0.5).add_bin(Bin::Var(y), 0.5);
        m.row(f64::NEG_INFINITY, &e, 2.0);
        let mut f = Lin::default();
        f.add_col(y, 1.0).add_col(z, 1.0);
        m.row(f64::NEG_INFINITY, &f, 1.0);
        match m.solve(Some(10.0), true, &[]).unwrap() {
            Outcome::Optimal(cols) => {
                assert_eq!([Bin::Var(x), Bin::Var(y), Bin::Var(z)].map(|b| b.value(&cols)), [false, true, false]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_infeasible_program() {
        let mut m = Milp::new();
        let x = m.binary(1.0, 0.0);
        let mut e = Lin::default();
        e.add_col(x, 1.0);
        m.row(2.0, &e, f64::INFINITY);
        assert_eq!(m.solve(None, false, &[]), Err(IlpError::Infeasible));
        assert!(Milp::holds(0.0, &Lin::constant(1.0), 1.0));
        assert!(!Milp::holds(0.0, &Lin::constant(1.5), 1.0));
    }
}
