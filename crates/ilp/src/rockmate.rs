//! `rockmate`: Zhao's Rockmate (thesis ch. 2; research digest §2.3–§2.9).
//!
//! 1. **Blocks** ([`sequential_blocks`]): the forward graph is cut wherever a single
//!    activation crosses, and each block becomes a standalone piece ([`SubGraph`]) with a
//!    stand-in loss. Identical blocks (same ops, sizes, times and wiring) are solved once.
//! 2. **rk-Checkmate** ([`hilp::solve`] on the block's bottom H-graph, with a save budget):
//!    per unique block, over a grid of `(M_peak, M_save)` budgets (default 10 × 10, 6 × 6
//!    beyond [`MEDIUM_BLOCK`] nodes, 3 × 3 beyond [`LARGE_BLOCK`]):
//!    `M_peak` evenly spaced from the least any single node needs to the block's
//!    store-all peak, `M_save` from what must be resident at the loss (the block's
//!    outputs and the gradients that come back) to `M_peak`. Each solution is an
//!    *option*: a forward part (before the stand-in loss) and a backward part (after).
//!    Identical solutions are merged, infeasible budgets give none.
//! 3. **rk-Rotor** ([`pebble_solve::remat::rk_rotor`]): the DP over the blocks, each with its
//!    options and the fast forward `F⁰` (every node without grad), within the budget left
//!    after static memory and inputs.
//! 4. The DP's sequence is expanded into compute nodes; frees come from liveness; the
//!    simulator scores the schedule. Should it exceed the budget (the DP rounds sizes
//!    up, so only through a modelling gap), the DP runs again on a smaller budget.
//!
//! Steps 1 and 2 do not depend on the budget: [`Solver::prepare`] does them once (a
//! [`Prepared`]) for every budget the caller asks for (`pebble plan`'s bisection, a
//! sweep), and reports each unique block solved to [`SolveOptions::progress`].
//!
//! Each option records what rk-Rotor needs, measured by replaying it on its block (the
//! simulator's count, [`Liveness::replay`]): forward and backward time, the peak of
//! each part, and what the forward part leaves for the backward.

use std::collections::HashMap;
use std::time::Instant;

use pebble_graph::{ComputeKind, TrainingGraph};
use pebble_schedule::{Schedule, View};
use pebble_solve::remat::rk_rotor::{self, BlockOption, FastForward, RkBlock, RkChain, RkLoss, RkOp};
use pebble_solve::{Problem, Progress, Slots, SolveError, SolveOptions, Solver};

use crate::hgraph::HGraph;
use crate::hilp;
use crate::sequence::{Liveness, Step};
use crate::subgraph::{sequential_blocks, SubGraph};
use crate::IlpError;

/// Rockmate (see the module docs).
pub struct Rockmate;

/// The default `(#M_peak, #M_save)` grid (the thesis' experiments: 10 × 10).
pub const GRID: (usize, usize) = (10, 10);

/// Each rk-Checkmate ILP's time limit when the user sets none, in seconds.
pub const DEFAULT_ILP_LIMIT: f64 = 20.0;

/// Blocks with more compute nodes than this get at most a 6 × 6 grid (the thesis, Fig.
/// 2.5: "(6,6) should allow RK-CHECKMATE to find fine-grained options"): a ResNet
/// bottleneck block (27 nodes) solves 36 ILPs instead of 100.
pub const MEDIUM_BLOCK: usize = 24;
/// Blocks with more compute nodes than this get a 3 × 3 grid.
pub const LARGE_BLOCK: usize = 50;
/// Blocks with more compute nodes than this get no ILP: store-all and the fast forward.
pub const MAX_ILP_NODES: usize = 160;

impl Solver for Rockmate {
    fn name(&self) -> &'static str {
        "rockmate"
    }

    fn description(&self) -> &'static str {
        "Rockmate (Zhao 2023): rk-Checkmate ILP options per unique block (10×10 budgets), combined by the rk-Rotor DP"
    }

    fn views(&self) -> &'static [View] {
        &[View::Graph]
    }

    /// Cuts the graph into blocks and builds every unique block's options (the minutes),
    /// for rk-Rotor to combine at each budget (the milliseconds).
    fn prepare<'a>(
        &'a self,
        problem: Problem<'a>,
        options: &'a SolveOptions,
    ) -> Result<Box<dyn pebble_solve::Prepared + 'a>, SolveError> {
        let g = problem.graph_for("rockmate")?;
        crate::require_forward_links(g, "rockmate")?;
        let failed = |e: IlpError| Box::new(crate::Failed { solver: "rockmate", reason: e.to_string() });
        let cut = match Cut::new(g) {
            Ok(cut) => cut,
            Err(e) => return Ok(failed(e)),
        };
        // Before the options, which would take minutes for nothing.
        if let Some(e) = too_many_blocks(cut.blocks.len()) {
            return Err(e);
        }
        Ok(match cut.prepare(g, GRID, options.time_limit, &options.progress, 2) {
            Ok(prepared) => Box::new(crate::Ready { solver: "rockmate", prepared, options }),
            Err(e) => failed(e),
        })
    }
}

impl crate::Schedules for Prepared<'_> {
    fn schedule(&self, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        Prepared::schedule(self, budget, options)
    }
}

/// What the progress callback is told while the unique blocks are solved.
pub const PROGRESS: &str = "Rockmate: solving unique blocks";

inventory::submit!(pebble_solve::Registration(&Rockmate));

/// One option of a block, in the block's local compute ids.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockPlan {
    /// The forward part.
    pub forward: Vec<Step>,
    /// The backward part.
    pub backward: Vec<Step>,
    /// What rk-Rotor reads.
    pub stats: BlockOption,
}

/// A unique block's options.
#[derive(Debug, Clone)]
pub struct BlockOptions {
    /// Its fast forward (`F⁰`).
    pub f0: FastForward,
    /// Its options.
    pub options: Vec<BlockPlan>,
    /// ILPs answered (solved, or settled by another's answer: [`crate::GridAnswers`]), and
    /// how many of them to optimality.
    pub solved: (usize, usize),
}

/// A graph cut into blocks, each unique block's options built: everything but the DP,
/// which [`Prepared::schedule`] runs at each budget. [`Rockmate`]'s
/// [`Solver::prepare`] builds one; nothing outlives it.
pub struct Prepared<'g> {
    g: &'g TrainingGraph,
    /// The blocks.
    pub blocks: Vec<SubGraph>,
    /// For each block, its class (index into `classes`).
    pub class_of: Vec<usize>,
    /// Each class's options.
    pub classes: Vec<BlockOptions>,
    /// Seconds spent cutting the graph and building the options.
    pub seconds: f64,
}

/// A graph cut into blocks, identical blocks in one class: the options are still to build.
struct Cut {
    started: Instant,
    blocks: Vec<SubGraph>,
    class_of: Vec<usize>,
    /// The first block of each class.
    representatives: Vec<usize>,
}

impl Cut {
    fn new(g: &TrainingGraph) -> Result<Cut, IlpError> {
        let started = Instant::now();
        g.validate().map_err(|e| IlpError::InvalidGraph(e.to_string()))?;
        let blocks: Vec<SubGraph> =
            sequential_blocks(g).iter().map(|b| SubGraph::extract(g, b)).collect::<Result<_, _>>()?;
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut class_of = Vec::with_capacity(blocks.len());
        let mut representatives = Vec::new();
        for (i, b) in blocks.iter().enumerate() {
            let next = seen.len();
            let c = *seen.entry(b.signature()).or_insert(next);
            if c == representatives.len() {
                representatives.push(i);
            }
            class_of.push(c);
        }
        Ok(Cut { started, blocks, class_of, representatives })
    }

    /// Builds each class's options, reporting each class solved to `progress`.
    fn prepare<'g>(
        self,
        g: &'g TrainingGraph,
        grid: (usize, usize),
        time_limit: Option<f64>,
        progress: &Progress,
        threads: usize,
    ) -> Result<Prepared<'g>, IlpError> {
        let limit = time_limit.unwrap_or(DEFAULT_ILP_LIMIT);
        let total = self.representatives.len();
        progress.report(PROGRESS, 0, total);
        let classes = self
            .representatives
            .iter()
            .enumerate()
            .map(|(done, &i)| {
                let o = block_options(&self.blocks[i], grid, limit, threads);
                progress.report(PROGRESS, done + 1, total);
                o
            })
            .collect::<Result<Vec<_>, _>>()?;
        let Cut { started, blocks, class_of, .. } = self;
        Ok(Prepared { g, blocks, class_of, classes, seconds: started.elapsed().as_secs_f64() })
    }
}

/// Rockmate's preparation of `g` when the graph has at least two sequential blocks (and
/// fewer than rk-Rotor takes), for HiRemate to start from: `None` where Rockmate has
/// nothing to offer or its preparation fails. Reports each unique block solved to
/// `progress`, as `rockmate` does, and solves `threads` ILPs at a time.
pub(crate) fn incumbent<'g>(
    g: &'g TrainingGraph,
    time_limit: Option<f64>,
    progress: &Progress,
    threads: usize,
) -> Option<Prepared<'g>> {
    let cut = Cut::new(g).ok()?;
    if cut.blocks.len() < 2 || too_many_blocks(cut.blocks.len()).is_some() {
        return None;
    }
    cut.prepare(g, GRID, time_limit, progress, threads).ok()
}

/// rk-Rotor's choice codes hold fewer than [`rk_rotor::MAX_BLOCKS`] blocks.
fn too_many_blocks(blocks: usize) -> Option<SolveError> {
    (blocks >= rk_rotor::MAX_BLOCKS).then(|| SolveError::TooLarge {
        solver: "rockmate",
        why: format!("{blocks} sequential blocks (rk-Rotor takes fewer than {})", rk_rotor::MAX_BLOCKS),
    })
}

impl<'g> Prepared<'g> {
    /// Cuts `g` into blocks and builds every unique block's options over a
    /// `(#M_peak, #M_save)` grid, each ILP under `time_limit` seconds (default
    /// [`DEFAULT_ILP_LIMIT`]).
    pub fn new(g: &'g TrainingGraph, grid: (usize, usize), time_limit: Option<f64>) -> Result<Prepared<'g>, IlpError> {
        Prepared::with_progress(g, grid, time_limit, &Progress::none())
    }

    /// [`Prepared::new`], reporting to `progress` as each unique block is solved
    /// ([`PROGRESS`], done, total).
    pub fn with_progress(
        g: &'g TrainingGraph,
        grid: (usize, usize),
        time_limit: Option<f64>,
        progress: &Progress,
    ) -> Result<Prepared<'g>, IlpError> {
        Cut::new(g)?.prepare(g, grid, time_limit, progress, 2)
    }

    /// rk-Rotor's chain.
    pub fn chain(&self) -> RkChain {
        let g = self.g;
        let blocks = self
            .blocks
            .iter()
            .zip(&self.class_of)
            .map(|(b, &c)| {
                let class = &self.classes[c];
                RkBlock {
                    x_in: bytes(&b.graph, &b.inputs),
                    delta_out: bytes(&b.graph, &b.grads_in),
                    f0: class.f0,
                    options: class.options.iter().map(|o| o.stats).collect(),
                }
            })
            .collect();
        let l = g.loss().expect("validated");
        let node = &g.compute[l];
        let live = Liveness::new(g);
        let peak: u64 =
            node.inputs.iter().chain(&node.outputs).filter(|&&d| live.tracked(d)).map(|&d| g.data[d].size).sum::<u64>()
                + node.tmp;
        RkChain { blocks, loss: RkLoss { time: node.time, peak } }
    }

    /// Bytes resident for the whole step whatever the schedule: static memory and inputs.
    pub fn fixed(&self) -> u64 {
        self.g.fixed_bytes()
    }

    /// The compute sequence of rk-Rotor's plan.
    fn expand(&self, ops: &[RkOp]) -> Vec<Step> {
        let mut seq = Vec::new();
        let global = |b: &SubGraph, steps: &[Step], seq: &mut Vec<Step>| {
            for &(k, ng) in steps {
                seq.push((b.compute[k].expect("a block's own node"), ng));
            }
        };
        for op in ops {
            match *op {
                RkOp::FastForward(s) => {
                    let b = &self.blocks[s];
                    for k in 0..b.loss {
                        seq.push((b.compute[k].expect("forward"), true));
                    }
                }
                RkOp::Forward { block, option } => {
                    let plan = &self.classes[self.class_of[block]].options[option];
                    global(&self.blocks[block], &plan.forward, &mut seq);
                }
                RkOp::Backward { block, option } => {
                    let plan = &self.classes[self.class_of[block]].options[option];
                    global(&self.blocks[block], &plan.backward, &mut seq);
                }
                RkOp::Loss => seq.push((self.g.loss().expect("validated"), false)),
            }
        }
        seq
    }

    /// The schedule within `budget` bytes.
    pub fn schedule(&self, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        if let Some(e) = too_many_blocks(self.blocks.len()) {
            return Err(e);
        }
        // Store-all runs every node once: when it fits, nothing is faster (and rk-Rotor's
        // rounding of sizes up to slots could miss it).
        let store_all = pebble_solve::baseline::store_all::graph_store_all(self.g);
        if pebble_sim::simulate_graph(self.g, &store_all, &options.sim_config()).is_ok_and(|r| r.peak_bytes <= budget) {
            return Ok(store_all.with_optimal(true));
        }
        let chain = self.chain();
        let slots = match options.slots {
            Slots::Count(s) => Some(s),
            Slots::Exact => None,
        };
        crate::sequence_within_budget(self.g, budget, options, |memory| {
            let cells = rk_rotor::table_cells(&chain, memory, slots);
            if cells > rk_rotor::MAX_TABLE_CELLS {
                return Err(SolveError::TooLarge {
                    solver: "rockmate",
                    why: format!("rk-Rotor's table would have {cells} cells; use fewer slots (--slots)"),
                });
            }
            let sol = rk_rotor::rk_rotor(&chain, memory, slots).ok_or_else(|| SolveError::Infeasible {
                budget,
                reason: format!(
                    "rk-Rotor finds no sequence of the {} blocks' options in {memory} bytes ({} bytes are fixed: \
                     static memory and inputs)",
                    self.blocks.len(),
                    self.fixed()
                ),
            })?;
            Ok(self.expand(&sol.ops))
        })
        .map(|s| s.with_optimal(self.classes.iter().all(|c| c.solved.0 == c.solved.1)))
    }
}

fn bytes(g: &TrainingGraph, ids: &[usize]) -> u64 {
    ids.iter().map(|&d| g.data[d].size).sum()
}

/// The `(#M_peak, #M_save)` grid a block of `nodes` compute nodes gets when `grid` is
/// asked for: coarser beyond [`MEDIUM_BLOCK`] and
/// [`LARGE_BLOCK`] nodes, none beyond [`MAX_ILP_NODES`].
pub fn grid_for(nodes: usize, grid: (usize, usize)) -> (usize, usize) {
    if nodes > MAX_ILP_NODES {
        (0, 0)
    } else if nodes > LARGE_BLOCK {
        (grid.0.min(3), grid.1.min(3))
    } else if nodes > MEDIUM_BLOCK {
        (grid.0.min(6), grid.1.min(6))
    } else {
        grid
    }
}

/// The options of one block: rk-Checkmate over the budget grid, `threads` ILPs at a time
/// ([`crate::GridAnswers`]).
pub fn block_options(b: &SubGraph, grid: (usize, usize), limit: f64, threads: usize) -> Result<BlockOptions, IlpError> {
    let g = &b.graph;
    let (h, _) = HGraph::bottom(g)?;
    let live = Liveness::new(g);
    let n = g.compute.len();
    let loss = b.loss;
    let x_in = bytes(g, &b.inputs);
    let out_bytes = bytes(g, &b.outputs);
    // Store-all: the top of the M_peak range.
    let all: Vec<Step> = (0..n).map(|k| (k, false)).collect();
    let max_peak = live.replay(&all).iter().map(|p| p.0).max().unwrap_or(0);
    // The least any node needs alone: its inputs, outputs and temporary memory.
    let min_peak = g
        .compute
        .iter()
        .map(|c| {
            c.inputs.iter().chain(&c.outputs).filter(|&&d| live.tracked(d)).map(|&d| g.data[d].size).sum::<u64>()
                + c.tmp
        })
        .max()
        .unwrap_or(0);
    let min_save = out_bytes + bytes(g, &b.grads_in);
    // rk-Checkmate's time grows fast with the block (a Transformer's decoder is one
    // block of the sequential cut): a coarser grid for large blocks, and only the
    // store-all option beyond [`MAX_ILP_NODES`] nodes (HiRemate is the answer there).
    let budgets = crate::budget_grid(min_peak, max_peak, min_save, grid_for(n, grid));
    let results =
        crate::GridAnswers::new(threads).solve(&budgets, |(peak, save)| Some(hilp::solve(&h, peak, save, Some(limit))));
    let forward_once = |sol: &hilp::HSolution| {
        sol.seq.iter().map(|&(k, o)| (k, g.compute[k].kind == ComputeKind::Forward && o == 1)).collect()
    };
    let (found, solved) = hilp::distinct_options(results, loss, forward_once)?;
    let mut options: Vec<BlockPlan> = found
        .into_iter()
        .map(|(forward, backward)| {
            let stats = option_stats(b, &live, &forward, &backward, x_in);
            BlockPlan { forward, backward, stats }
        })
        .collect();
    if options.is_empty() {
        // Store-all: the ILP's solution at the top of the grid, always feasible.
        let forward: Vec<Step> = (0..loss).map(|k| (k, false)).collect();
        let backward: Vec<Step> = (loss + 1..n).map(|k| (k, false)).collect();
        let stats = option_stats(b, &live, &forward, &backward, x_in);
        options.push(BlockPlan { forward, backward, stats });
    }
    // F⁰: every forward node without grad.
    let mut ff: Vec<Step> = (0..loss).map(|k| (k, true)).collect();
    ff.push((loss, false));
    let replay = live.replay(&ff);
    let f0 = FastForward {
        time: (0..loss).map(|k| g.compute[k].time).sum(),
        peak: x_in + replay[..loss].iter().map(|p| p.0).max().unwrap_or(0),
    };
    Ok(BlockOptions { f0, options, solved })
}

fn option_stats(b: &SubGraph, live: &Liveness<'_>, forward: &[Step], backward: &[Step], x_in: u64) -> BlockOption {
    let g = &b.graph;
    let mut seq = forward.to_vec();
    seq.push((b.loss, false));
    seq.extend_from_slice(backward);
    let replay = live.replay(&seq);
    let nf = forward.len();
    let time = |steps: &[Step]| steps.iter().map(|&(k, _)| g.compute[k].time).sum::<f64>();
    let fwd_peak = x_in + replay[..nf].iter().map(|p| p.0).max().unwrap_or(0);
    let after_forward = if nf == 0 { 0 } else { replay[nf - 1].1 };
    let out_bytes = bytes(g, &b.outputs);
    let read_by_backward = |ids: &[usize]| -> u64 {
        ids.iter()
            .filter(|&&d| backward.iter().any(|&(k, _)| g.compute[k].inputs.contains(&d)))
            .map(|&d| g.data[d].size)
            .sum()
    };
    // The block's input stays for the backward only if the backward reads it; its output
    // is the next block's input, kept by the DP's sub-problem unless the backward reads it.
    let input_kept = read_by_backward(&b.inputs);
    let keep = after_forward.saturating_sub(out_bytes) + read_by_backward(&b.outputs) + input_kept;
    let bwd_peak = input_kept + replay[nf + 1..].iter().map(|p| p.0).max().unwrap_or(0);
    BlockOption { fwd_time: time(forward), bwd_time: time(backward), fwd_peak, keep, bwd_peak }
}

/// rk-Checkmate on the whole graph (one block): the H-ILP with fast-forward options and
/// no save budget. Exact for the graph's list order, and as slow as Checkmate on big
/// graphs; Rockmate runs it per block instead.
pub struct RkCheckmate;

impl Solver for RkCheckmate {
    fn name(&self) -> &'static str {
        "rk-checkmate"
    }

    fn description(&self) -> &'static str {
        "rk-Checkmate's ILP (Zhao §2.4) on the whole graph: Checkmate plus fast forwards and temporary memory"
    }

    fn views(&self) -> &'static [View] {
        &[View::Graph]
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let g = problem.graph_for("rk-checkmate")?;
        let infeasible = |reason: String| SolveError::Infeasible { budget, reason };
        g.validate().map_err(|e| infeasible(e.to_string()))?;
        let (h, _) = HGraph::bottom(g).map_err(|e| infeasible(e.to_string()))?;
        let mut optimal = true;
        let schedule = crate::sequence_within_budget(g, budget, options, |memory| {
            let sol = match hilp::solve(&h, memory, None, options.time_limit) {
                Ok(sol) => sol,
                Err(IlpError::Infeasible) => return Err(infeasible("the rk-Checkmate ILP has no solution".into())),
                Err(e @ IlpError::NoSolution { .. }) => {
                    return Err(SolveError::TooLarge { solver: "rk-checkmate", why: e.to_string() })
                }
                Err(e) => return Err(infeasible(e.to_string())),
            };
            optimal = sol.optimal;
            Ok(sol.seq.iter().map(|&(k, o)| (k, g.compute[k].kind == ComputeKind::Forward && o == 1)).collect())
        })?;
        Ok(schedule.with_optimal(optimal))
    }
}

inventory::submit!(pebble_solve::Registration(&RkCheckmate));
