//! `hiremate`: Zhao's HiRemate (thesis ch. 3; research digest §3).
//!
//! 1. **Partition.** Where the forward graph has single-activation cuts (Rockmate's
//!    sequential blocks), each block of several ops is a cluster, and consecutive blocks
//!    are grouped until the top has at most `M^t` (30) parts; a graph without such cuts
//!    (or with a block of more than `M^l` ops) is H-Partitioned
//!    ([`pebble_graph::h_partition`], Alg. 7) into clusters of at most `M^l` (20) parts.
//!    Where the blocks exist, the graph is also H-Partitioned as a whole, in a second
//!    thread, and each budget keeps the faster of the two plans: the blocks suit a
//!    Transformer's layers (GPT-2 large +3.2% against +16.6%), H-Partition a CNN's
//!    modules (SqueezeNet +5.8% against +8.3%). Identical clusters share their solutions.
//! 2. **Bottom-up**, each cluster (children first) becomes an [`HGraph`]: one forward and
//!    one backward cNode per part (an op, or a sub-cluster whose options were found
//!    before), the cluster's loss between them, and as aNodes only the tensors that cross
//!    parts; what a sub-cluster keeps inside is its option's phantom. The H-ILP solves it
//!    over Rockmate's `(M_peak, M_save)` grid (10 × 10; beyond
//!    [`crate::rockmate::MEDIUM_BLOCK`] cNodes, where 100 ILPs take minutes per cluster
//!    on Inception, 8 peak budgets, then 3 save budgets at each while the preparation's
//!    time for save axes lasts, [`HiremateConfig::save_axes`]); each distinct solution
//!    is an option of the cluster:
//!    its forward part, its backward part, their times, and the memory they need above
//!    what they allocate (measured by replaying them on the cluster). A fast forward
//!    (every op without grad, nothing kept) is always one more forward option.
//! 3. **Option selection** (§3.4.5): a parent keeps at most [`MAX_OPTIONS`] options of all
//!    its parts together: first the options no other beats on time, phantom and overheads
//!    ([`Selection::Pareto`]), then an even share per part, each picked by the spread
//!    greedy on their phantoms (largest, smallest, then the middle of the widest gap, …).
//! 4. The top cluster is solved once, at the user's budget; its solution is expanded
//!    into ops (Lemma 3.2.1: sub-schedules never free their cluster's interface), frees
//!    come from liveness, and the simulator scores the schedule.
//! 5. **Rockmate's plan as the incumbent.** Where the graph is a sequence of Rockmate's
//!    blocks of at most `M^l` ops, Rockmate is prepared too
//!    ([`HiremateConfig::rockmate_incumbent`]), and at each budget the faster plan
//!    passes: HiRemate can express every Rockmate plan, so it is never slower than
//!    Rockmate there, even where its top H-ILP finds nothing in its time limit (ResNet-50
//!    at the edge of 80 GB). This is the schedule-level form of a MIP start: a start
//!    inside the top H-ILP would need Rockmate's blocks and options mapped onto
//!    HiRemate's clusters and theirs.
//! 6. **PyTorch's min-cut plan as a second incumbent**, on every graph
//!    ([`HiremateConfig::mincut_incumbent`]): `pytorch-mincut` plans in a fraction of a
//!    second, and where a tensor is read by many clusters (the encoder's output, by every
//!    decoder layer) its cut saves it once, where HiRemate's clusters each decide alone.
//! 7. **Checkmate's warm start as a third incumbent**, on every graph
//!    ([`HiremateConfig::start_incumbent`]): DTR's plan or recompute-all, in Checkmate's
//!    stages and pruned, in tenths of a second. At tight budgets the top H-ILP may find
//!    nothing in its time limit where neither Rockmate's nor the min cut's plan fits
//!    (transformers' GPT-2 at 60% of its activations, with 2 s ILPs). It is tried only
//!    there, before Rockmate's lazy preparation (below): elsewhere HiRemate's own plans
//!    are better, and the start's cost is not paid.
//!
//! Why not the thesis's choices (8 peak budgets, options shared in proportion to their
//! count, `N_o = 60`, H-Partition alone): on GPT-2 they left the attention half of each
//! layer one option at the top, so HiRemate recomputed whole half-layers where Rockmate
//! recomputes the attention alone (+12.3% against +5.7% on GPT-2 small at half the
//! activations). [`HiremateConfig`] keeps each choice switchable; `pebble reproduce
//! hiremate` measures each alone (docs/benchmarks.md).
//!
//! Solving a cluster's ILPs and the top ILP use `--time-limit` each (default
//! [`DEFAULT_ILP_LIMIT`] s, the top six times that); a time-limited solve keeps its best
//! solution, and the schedule says so ([`Schedule::optimal`]).
//!
//! Steps 1 to 3 below the top do not depend on the budget: [`Solver::prepare`] does them
//! once (a [`Prepared`]) for every budget the caller asks for, and reports each cluster
//! solved to [`SolveOptions::progress`].

use std::collections::HashMap;
use std::sync::OnceLock;

use pebble_graph::{
    h_partition, identical_clusters, Cluster, ComputeKind, DataKind, HPartitionConfig, Hierarchy, Part, TrainingGraph,
};
use pebble_schedule::{Schedule, View};
use pebble_solve::deadline::within;
use pebble_solve::{Problem, Progress, SolveError, SolveOptions, Solver};

use crate::hgraph::{op_options, HGraph, HKind, HNode, HOption, Substep};
use crate::hilp;
use crate::sequence::{Liveness, Step};
use crate::subgraph::SubGraph;
use crate::IlpError;

mod selection;
use selection::select_options;
pub use selection::spread;

/// HiRemate (see the module docs), with its knobs.
pub struct Hiremate {
    /// What it runs with; `hiremate` is [`HiremateConfig::DEFAULT`].
    pub config: HiremateConfig,
}

/// Options a parent keeps over all its parts (the thesis' `N_o`).
pub const MAX_OPTIONS: usize = 400;

/// HiRemate's knobs: the partition, each cluster's budget grid, option selection and
/// time limit. [`HiremateConfig::default`] is what `hiremate` runs; the other values
/// exist to measure each choice alone (`pebble reproduce hiremate`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HiremateConfig {
    /// H-Partition's `M^l`, `M^t` and α.
    pub partition: HPartitionConfig,
    /// Whether a graph with single-activation cuts is first cut there (Rockmate's
    /// blocks), each block then partitioned alone.
    pub blocks_first: bool,
    /// With `blocks_first`, also partition the graph with H-Partition alone (in a second
    /// thread) and keep, at each budget, whichever plan the simulator runs faster: the
    /// blocks suit a Transformer's layers, H-Partition's scored groups a CNN's modules.
    pub also_h_partition: bool,
    /// Where the graph is a sequence of Rockmate's blocks of at most `M^l` ops each (a
    /// Transformer's or a ResNet's layers), also prepare Rockmate and keep its plan at a
    /// budget where it runs faster: the incumbent HiRemate starts from, as every Rockmate
    /// plan is one HiRemate can express. On ResNet-50 at batch 4718 (a100) the top H-ILP
    /// finds no plan in its time limit, where Rockmate's fits. Graphs with larger blocks
    /// (Inception's modules, a U-Net's skip connections) are left out: there Rockmate's
    /// preparation takes minutes, and HiRemate is ahead of it.
    pub rockmate_incumbent: bool,
    /// On every graph, also keep PyTorch's min-cut plan (`pytorch-mincut`, a fraction of
    /// a second) at a budget where it runs faster. HiRemate's clusters, solved bottom-up,
    /// each decide alone what to keep of a tensor many of them read, where the min cut
    /// saves it once: on the encoder-decoder Transformer, whose every decoder layer
    /// reads the encoder's output, the min cut's plan is the faster (docs/benchmarks.md).
    /// Eager's store-all is kept too: where it fits, nothing is faster.
    pub mincut_incumbent: bool,
    /// On every graph, where the top H-ILP finds nothing in its time limit and no other
    /// incumbent fits, try Checkmate's warm start ([`crate::checkmate::start_schedule`]:
    /// DTR's plan or recompute-all, in Checkmate's stages, its reruns pruned; tenths of a
    /// second) before Rockmate's lazy preparation (minutes): transformers' GPT-2 at 60% of
    /// its activations, nothing in 2 s; the start runs at +7.6%.
    pub start_incumbent: bool,
    /// `(#M_peak, #M_save)` budgets per cluster; `#M_save = 1` solves at peak budgets
    /// only (no save budget).
    pub grid: (usize, usize),
    /// The same for clusters of more than [`crate::rockmate::MEDIUM_BLOCK`] cNodes.
    pub coarse_grid: (usize, usize),
    /// The time the save axes of such clusters may take together, in ILP time limits;
    /// a cluster's is charged per copy (identical clusters share their options), and
    /// once it is spent the remaining save ILPs are skipped. A save axis gives a cluster
    /// its cheap-recompute options (drop the large cheap outputs, keep the rest: the
    /// 24+24 Transformer +5.6% against +12.9% without), but costs 3 to 15 times its
    /// peak axis, and its parent's ILPs grow with the options (DenseNet-121 and
    /// Inception-v3 past 10 minutes with no limit). Clusters are solved children first,
    /// so the budget goes to the first ones. 24 limits (four minutes at the default 10 s):
    /// at 6 the first few clusters of Inception-v3 and DenseNet-121 spent it all, for no
    /// gain; at 24 their own plans gain 0.8 and 0.4 points, in under 8 minutes
    /// (docs/benchmarks.md, "Four minutes of save axes").
    pub save_axes: f64,
    /// The thesis' `N_o`.
    pub max_options: usize,
    /// How a parent picks its parts' options when they exceed `max_options`.
    pub selection: Selection,
    /// Each ILP's time limit when the user sets none, in seconds.
    pub time_limit: f64,
    /// Whether the top H-ILP holds its clusters' options substep by substep, with the
    /// correction terms (3.34), or by their largest overhead. Off in `hiremate`: on the
    /// models measured they never bind at the optimum (a cluster's inputs are read by its
    /// residual sum or by its backward, so the ILP keeps them), and their rows cost the
    /// top MILP incumbents when it stops at its time limit (docs/benchmarks.md).
    pub correction_terms: bool,
}

/// How a parent keeps at most `N_o` of its parts' options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// The thesis: spread on the phantom alone.
    Phantom,
    /// Drop the options another beats on time, phantom and both overheads first, then
    /// spread on the phantom.
    Pareto,
}

impl Default for HiremateConfig {
    fn default() -> Self {
        HiremateConfig::DEFAULT
    }
}

impl Hiremate {
    /// `hiremate`, as registered.
    pub const DEFAULT: Hiremate = Hiremate { config: HiremateConfig::DEFAULT };
}

impl HiremateConfig {
    /// What `hiremate` runs.
    pub const DEFAULT: HiremateConfig = HiremateConfig {
        partition: HPartitionConfig::DEFAULT,
        blocks_first: true,
        also_h_partition: true,
        rockmate_incumbent: true,
        mincut_incumbent: true,
        start_incumbent: true,
        grid: (10, 10),
        coarse_grid: (8, 4),
        save_axes: 24.0,
        max_options: MAX_OPTIONS,
        selection: Selection::Pareto,
        time_limit: DEFAULT_ILP_LIMIT,
        correction_terms: false,
    };

    /// What `hiremate` ran before issue 15: 8 peak budgets per cluster, no save budget,
    /// the thesis' selection with `N_o = 60`, H-Partition alone.
    pub const BEFORE_ISSUE_15: HiremateConfig = HiremateConfig {
        grid: (8, 1),
        coarse_grid: (8, 1),
        selection: Selection::Phantom,
        blocks_first: false,
        also_h_partition: false,
        rockmate_incumbent: false,
        mincut_incumbent: false,
        start_incumbent: false,
        max_options: 60,
        ..HiremateConfig::DEFAULT
    };
}
/// Each ILP's time limit when the user sets none, in seconds.
pub const DEFAULT_ILP_LIMIT: f64 = 10.0;

impl Solver for Hiremate {
    fn name(&self) -> &'static str {
        "hiremate"
    }

    fn description(&self) -> &'static str {
        "HiRemate (Zhao 2024): H-Partition into nested clusters, H-ILP options bottom-up, any graph; \
         never slower than PyTorch's min-cut plan, nor, on a sequence of small blocks, than Rockmate's"
    }

    fn views(&self) -> &'static [View] {
        &[View::Graph]
    }

    /// Partitions the graph and builds the options of every cluster below the top (the
    /// minutes), for the top H-ILP to solve at each budget.
    fn prepare<'a>(
        &'a self,
        problem: Problem<'a>,
        options: &'a SolveOptions,
    ) -> Result<Box<dyn pebble_solve::Prepared + 'a>, SolveError> {
        let g = problem.graph_for("hiremate")?;
        crate::require_forward_links(g, "hiremate")?;
        let cfg = &self.config;
        // An invalid graph goes the one-partition way, whose preparation reports it.
        let valid = g.validate().is_ok();
        let sequential = valid && blocks_partition(g, &cfg.partition).is_some();
        let both = cfg.blocks_first && cfg.also_h_partition && sequential;
        let alone = HiremateConfig { blocks_first: false, ..*cfg };
        let with_rockmate = cfg.rockmate_incumbent && sequential;
        // The preparations run side by side, each on a thread of its own; alone, one
        // solves two ILPs at a time (this machine class has two cores).
        let threads = if both || with_rockmate { 1 } else { 2 };
        let deadline = pebble_solve::deadline::current();
        let (first, whole, incumbent) = std::thread::scope(|s| {
            let whole = both.then(|| {
                s.spawn(|| within(deadline, || Prepared::build(g, &alone, options.time_limit, &Progress::none(), 1)))
            });
            let incumbent = with_rockmate.then(|| {
                s.spawn(|| within(deadline, || crate::rockmate::incumbent(g, options.time_limit, &options.progress, 1)))
            });
            let first = Prepared::build(g, cfg, options.time_limit, &options.progress, threads);
            let whole = whole.map(|w| w.join().expect("H-Partition's preparation does not panic"));
            let incumbent = incumbent.and_then(|r| r.join().expect("Rockmate's preparation does not panic"));
            (first, whole, incumbent)
        });
        let mut plans: Vec<(Option<&'static str>, Box<dyn crate::Schedules + 'a>)> = Vec::new();
        let mut error = None;
        for prepared in std::iter::once(first).chain(whole) {
            match prepared {
                Ok(p) => plans.push((None, Box::new(p))),
                Err(e) => error = error.or(Some(e)),
            }
        }
        if let Some(rockmate) = incumbent {
            plans.push((Some("rockmate"), Box::new(rockmate)));
        }
        if cfg.mincut_incumbent && valid {
            // PyTorch's own plans: its min cut, and eager's store-all, the fastest of all
            // wherever it fits (where the top H-ILP, stopped at its time limit, may
            // not have reached it).
            let eager: [&'static dyn Solver; 2] =
                [&pebble_solve::baseline::mincut::PytorchMincut, &pebble_solve::baseline::store_all::StoreAll];
            for solver in eager {
                let prepared = solver.prepare(problem, options)?;
                plans.push((Some(prepared.solver()), Box::new(prepared)));
            }
        }
        if plans.is_empty() {
            let reason = error.expect("a preparation failed").to_string();
            return Ok(Box::new(crate::Failed { solver: "hiremate", reason }));
        }
        // Rockmate's blocks larger than `M^l` (GPT-2's first layer and the next one's
        // attention, where its mask crosses both): Rockmate is prepared only if HiRemate's
        // own top H-ILP finds nothing in its time limit and no other incumbent fits.
        let rockmate =
            (cfg.rockmate_incumbent && valid && !sequential).then(|| LazyRockmate { g, prepared: OnceLock::new() });
        let start = cfg.start_incumbent && valid;
        let prepared = Fastest { problem, plans, start, rockmate };
        Ok(Box::new(crate::Ready { solver: "hiremate", prepared, options }))
    }
}

impl crate::Schedules for Prepared<'_> {
    fn schedule(&self, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        Prepared::schedule(self, budget, options)
    }
}

/// Several preparations of one graph (Rockmate's blocks first, H-Partition alone,
/// Rockmate's own plan, PyTorch's min cut): at each budget, the schedule the simulator
/// runs fastest. Each plan is named by the solver it comes from, `None` for HiRemate's
/// own, and a schedule kept from another solver says so ([`Schedule::kept_from`]). Where
/// HiRemate's own top H-ILP stops at its time limit with nothing and no incumbent fits,
/// Checkmate's warm start is tried (tenths of a second), then Rockmate's plan is the last
/// resort (`rockmate`, prepared then, once: minutes).
struct Fastest<'g> {
    problem: Problem<'g>,
    plans: Vec<(Option<&'static str>, Box<dyn crate::Schedules + 'g>)>,
    /// Whether Checkmate's start is tried ([`HiremateConfig::start_incumbent`]).
    start: bool,
    rockmate: Option<LazyRockmate<'g>>,
}

/// Rockmate's preparation, made the first time it is needed (`None` where Rockmate has
/// nothing to offer: fewer than two blocks, or its preparation failed).
struct LazyRockmate<'g> {
    g: &'g TrainingGraph,
    prepared: OnceLock<Option<crate::rockmate::Prepared<'g>>>,
}

impl crate::Schedules for Fastest<'_> {
    fn schedule(&self, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let mut candidates = Vec::new();
        let mut failure = None;
        for (from, plan) in &self.plans {
            match plan.schedule(budget, options) {
                Ok(s) => candidates.push(Schedule { kept_from: from.map(str::to_string), ..s }),
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        let first = candidates.first().cloned();
        match pebble_solve::fastest_within(self.problem, candidates, budget, options) {
            Ok(s) => return Ok(s),
            // None passes the simulator: hand one on, for `plan` to report.
            Err(Some(_)) => return Ok(first.expect("a simulated candidate")),
            Err(None) => {}
        }
        let failure = failure.expect("each plan answers");
        let SolveError::TooLarge { why, .. } = &failure else { return Err(failure) };
        // The top H-ILP stopped at its time limit without a plan: none exists if some node
        // alone needs more than the budget.
        let graph = if let Problem::Graph(g) = self.problem { Some(g) } else { None };
        if let Some(reason) = graph.and_then(|g| crate::checkmate::below_every_plan(g, budget)) {
            return Err(SolveError::Infeasible { budget, reason });
        }
        let start = graph.filter(|_| self.start).and_then(|g| crate::checkmate::start_schedule(g, budget));
        if let Some(s) = start {
            let s = Schedule { kept_from: Some("checkmate".into()), ..s };
            if let Ok(s) = pebble_solve::fastest_within(self.problem, [s], budget, options) {
                return Ok(s);
            }
        }
        if let Some(lazy) = &self.rockmate {
            let prepared = lazy
                .prepared
                .get_or_init(|| crate::rockmate::incumbent(lazy.g, options.time_limit, &options.progress, 2));
            if let Some(Ok(s)) = prepared.as_ref().map(|p| crate::Schedules::schedule(p, budget, options)) {
                let s = Schedule { kept_from: Some("rockmate".into()), ..s };
                if let Ok(s) = pebble_solve::fastest_within(self.problem, [s], budget, options) {
                    return Ok(s);
                }
            }
        }
        let lazy = self.start.then_some("checkmate").into_iter().chain(self.rockmate.as_ref().map(|_| "rockmate"));
        let kept: Vec<&str> = self.plans.iter().filter_map(|(from, _)| *from).chain(lazy).collect();
        let none = if kept.is_empty() {
            String::from("and it keeps no incumbent")
        } else {
            format!("and no incumbent ({}) fits in {budget} bytes", kept.join(", "))
        };
        Err(SolveError::TooLarge {
            solver: "hiremate",
            why: format!("its top H-ILP hit its time limit without a plan ({why}), {none}"),
        })
    }
}

/// What the progress callback is told while the clusters are solved.
pub const PROGRESS: &str = "HiRemate: solving clusters";

inventory::submit!(pebble_solve::Registration(&Hiremate::DEFAULT));

/// One option of a cluster, in its local compute ids.
#[derive(Debug, Clone, PartialEq)]
struct ClusterOption {
    forward: Vec<Step>,
    backward: Vec<Step>,
    fwd_time: f64,
    bwd_time: f64,
    /// Above the outputs and the phantom, during the forward part.
    fwd_overhead: u64,
    /// Above what is resident before the backward part and what it allocates.
    bwd_overhead: u64,
    phantom: u64,
    /// Local data ids of the interface activations the backward part reads.
    reads: Vec<usize>,
    /// The correction terms of the forward and backward parts, in local data ids.
    fwd_substeps: Vec<Substep>,
    bwd_substeps: Vec<Substep>,
}

/// A cluster's options, and its fast forward.
#[derive(Debug, Clone)]
struct ClusterOptions {
    options: Vec<ClusterOption>,
    ff_time: f64,
    ff_overhead: u64,
    ff_substeps: Vec<Substep>,
}

/// A graph partitioned, every non-top cluster's options built: everything but the top
/// H-ILP, which [`Prepared::schedule`] solves at each budget. [`Hiremate`]'s
/// [`Solver::prepare`] builds one; nothing outlives it.
pub struct Prepared<'g> {
    g: &'g TrainingGraph,
    /// The partition.
    pub h: Hierarchy,
    rep: Vec<usize>,
    subs: Vec<SubGraph>,
    options: Vec<Option<ClusterOptions>>,
    limit: f64,
    cfg: HiremateConfig,
    /// How many of a cluster's ILPs are solved at a time.
    threads: usize,
    /// Cluster ILPs answered (solved, or settled by another's answer: [`crate::GridAnswers`]),
    /// and how many of them to optimality.
    pub solved: (usize, usize),
    /// The top plans returned so far, to start later top H-ILPs from.
    top_plans: std::sync::Mutex<Vec<TopPlan>>,
}

impl<'g> Prepared<'g> {
    /// Partitions `g` and builds the options of every cluster below the top, each ILP
    /// under `time_limit` seconds (default [`DEFAULT_ILP_LIMIT`]).
    pub fn new(g: &'g TrainingGraph, cfg: &HiremateConfig, time_limit: Option<f64>) -> Result<Prepared<'g>, IlpError> {
        Prepared::with_progress(g, cfg, time_limit, &Progress::none())
    }

    /// [`Prepared::new`], reporting to `progress` as each cluster is solved ([`PROGRESS`],
    /// done, total).
    pub fn with_progress(
        g: &'g TrainingGraph,
        cfg: &HiremateConfig,
        time_limit: Option<f64>,
        progress: &Progress,
    ) -> Result<Prepared<'g>, IlpError> {
        Prepared::build(g, cfg, time_limit, progress, 2)
    }

    /// [`Prepared::with_progress`], solving `threads` ILPs of a cluster at a time.
    fn build(
        g: &'g TrainingGraph,
        cfg: &HiremateConfig,
        time_limit: Option<f64>,
        progress: &Progress,
        threads: usize,
    ) -> Result<Prepared<'g>, IlpError> {
        g.validate().map_err(|e| IlpError::InvalidGraph(e.to_string()))?;
        let limit = time_limit.unwrap_or(cfg.time_limit);
        let blocks = if cfg.blocks_first { blocks_partition(g, &cfg.partition) } else { None };
        let h = match blocks {
            Some(h) => h,
            None => h_partition(g, &cfg.partition).map_err(|e| IlpError::InvalidGraph(e.to_string()))?,
        };
        let rep = identical_clusters(g, &h);
        let subs = h.clusters.iter().map(|c| SubGraph::extract(g, &c.ops)).collect::<Result<Vec<_>, _>>()?;
        let mut p = Prepared {
            g,
            options: vec![None; h.clusters.len()],
            h,
            rep,
            subs,
            limit,
            cfg: *cfg,
            threads,
            solved: (0, 0),
            top_plans: std::sync::Mutex::new(Vec::new()),
        };
        let todo: Vec<usize> = (0..p.h.clusters.len()).filter(|&c| c != p.h.top && p.rep[c] == c).collect();
        progress.report(PROGRESS, 0, todo.len());
        let mut save_axes_left = cfg.save_axes * limit;
        for (done, &c) in todo.iter().enumerate() {
            let (options, solved) = p.cluster_options(c, &mut save_axes_left)?;
            p.options[c] = Some(options);
            p.solved = (p.solved.0 + solved.0, p.solved.1 + solved.1);
            progress.report(PROGRESS, done + 1, todo.len());
        }
        Ok(p)
    }

    /// The options of cluster `c`'s class.
    fn options_of(&self, c: usize) -> &ClusterOptions {
        self.options[self.rep[c]].as_ref().expect("children are solved before parents")
    }

    /// Cluster `c` as an H-graph, and how to expand its cNodes' options into local steps:
    /// a forward cNode per part, the cluster's loss, then a backward cNode per part (the
    /// last part first).
    fn hgraph(&self, c: usize) -> Result<(HGraph, Vec<Expand>), IlpError> {
        let local = LocalCluster::new(&self.h, c, &self.subs[c]);
        let parts = &local.cluster.parts;
        let mut nodes = Vec::new();
        let mut expand = Vec::new();
        for (p, part) in parts.iter().enumerate() {
            let (node, e) = match *part {
                Part::Op(_) => local.op_forward(p),
                Part::Cluster(cc) => self.cluster_forward(&local, p, cc),
            };
            nodes.push(node);
            expand.push(e);
        }
        let (node, e) = local.loss();
        nodes.push(node);
        expand.push(e);
        for p in (0..parts.len()).rev() {
            let ls: Vec<usize> = local.bwd_nodes(p).collect();
            if ls.is_empty() {
                continue;
            }
            let (node, e) = match parts[p] {
                Part::Op(_) => local.op_backward(p, ls[0]),
                Part::Cluster(cc) => self.cluster_backward(&local, p, cc, &ls),
            };
            nodes.push(node);
            expand.push(e);
        }
        Ok((HGraph { nodes, sizes: local.sizes }, expand))
    }

    /// The forward cNode of part `p`, the sub-cluster `cc`: one option per option of
    /// `cc`, and its fast forward.
    fn cluster_forward(&self, local: &LocalCluster<'_>, p: usize, cc: usize) -> (HNode, Expand) {
        let (sub, lg) = (local.sub, &local.sub.graph);
        let co = self.options_of(cc);
        let child = &self.subs[cc];
        let substeps = |steps: &[Substep]| self.substeps_in(child, sub, &local.anode, steps);
        let ls: Vec<usize> = local.fwd_nodes(p).collect();
        let outputs = local.an(ls.iter().flat_map(|&l| lg.compute[l].outputs.iter()));
        // What one op of the part makes and another reads is not an input.
        let mut inputs = local.an(ls.iter().flat_map(|&l| lg.compute[l].inputs.iter()));
        inputs.retain(|d| !outputs.contains(d));
        let mut options: Vec<HOption> = co
            .options
            .iter()
            .map(|o| HOption {
                time: o.fwd_time,
                overhead: o.fwd_overhead,
                phantom: o.phantom,
                reads: Vec::new(),
                substeps: substeps(&o.fwd_substeps),
            })
            .collect();
        options.push(HOption {
            time: co.ff_time,
            overhead: co.ff_overhead,
            phantom: 0,
            reads: Vec::new(),
            substeps: substeps(&co.ff_substeps),
        });
        let node = HNode { kind: HKind::Forward { pair: p }, inputs, outputs, options };
        (node, Expand::Cluster { child: cc, forward: true, map: self.local_map(child, &local.global_to_local) })
    }

    /// The backward cNode of part `p`, the sub-cluster `cc` (its local backward nodes
    /// `ls`): one option per option of `cc`.
    fn cluster_backward(&self, local: &LocalCluster<'_>, p: usize, cc: usize, ls: &[usize]) -> (HNode, Expand) {
        let (sub, lg) = (local.sub, &local.sub.graph);
        let co = self.options_of(cc);
        let child = &self.subs[cc];
        let substeps = |steps: &[Substep]| self.substeps_in(child, sub, &local.anode, steps);
        // Always read: the gradients that come back; per option: interface
        // activations its backward part reads.
        let grads: Vec<usize> = child.grads_in.iter().map(|&d| child.data[d]).collect();
        let to_local = |gd: usize| sub.data.iter().position(|&x| x == gd);
        let outputs = local.an(ls.iter().flat_map(|&l| lg.compute[l].outputs.iter()));
        let mut inputs = local.an(grads.iter().filter_map(|&gd| to_local(gd)).collect::<Vec<_>>().iter());
        inputs.retain(|d| !outputs.contains(d));
        let options = co
            .options
            .iter()
            .map(|o| HOption {
                time: o.bwd_time,
                overhead: o.bwd_overhead,
                phantom: 0,
                substeps: substeps(&o.bwd_substeps),
                reads: local.an(o.reads.iter().filter_map(|&cd| to_local(child.data[cd])).collect::<Vec<_>>().iter()),
            })
            .collect();
        let node = HNode { kind: HKind::Backward { pair: p }, inputs, outputs, options };
        (node, Expand::Cluster { child: cc, forward: false, map: self.local_map(child, &local.global_to_local) })
    }

    /// A child cluster's correction terms in the parent's aNode ids (`anode`, indexed by
    /// the parent's local data ids), when the parent is the top. An input that is no
    /// aNode of the parent is not freed by its H-ILP, so it leaves the dead sets.
    fn substeps_in(&self, child: &SubGraph, parent: &SubGraph, anode: &[usize], steps: &[Substep]) -> Vec<Substep> {
        // As the thesis: at the top level only, where the plan is made; below, they
        // would only grow every cluster's ILPs.
        if !self.cfg.correction_terms || !std::ptr::eq(parent, &self.subs[self.h.top]) {
            return Vec::new();
        }
        let to_anode = |cd: usize| {
            let global = child.data[cd];
            parent.data.iter().position(|&x| x == global).map(|l| anode[l]).filter(|&a| a != usize::MAX)
        };
        let mapped: Vec<Substep> = steps
            .iter()
            .map(|s| Substep { overhead: s.overhead, dead: s.dead.iter().filter_map(|&cd| to_anode(cd)).collect() })
            .collect();
        if mapped.iter().all(|s| s.dead.is_empty()) {
            Vec::new()
        } else {
            mapped
        }
    }

    /// Maps a child's local compute ids (through its class representative's) to this
    /// cluster's local ids.
    fn local_map(&self, child: &SubGraph, global_to_local: &HashMap<usize, usize>) -> Vec<usize> {
        child.compute.iter().map(|k| k.and_then(|k| global_to_local.get(&k).copied()).unwrap_or(usize::MAX)).collect()
    }

    /// Expands an H-ILP solution into local steps.
    fn steps(&self, remap: &[Vec<usize>], expand: &[Expand], seq: &[(usize, usize)]) -> Vec<Step> {
        let mut out = Vec::new();
        for &(k, o) in seq {
            let o = remap[k][o];
            match &expand[k] {
                Expand::OpForward(l) => out.push((*l, o == 1)),
                Expand::OpBackward(l) | Expand::Loss(l) => out.push((*l, false)),
                Expand::Cluster { child, forward, map } => {
                    let co = self.options_of(*child);
                    let steps: Vec<Step> = if *forward && o == co.options.len() {
                        (0..self.subs[*child].loss).map(|l| (l, true)).collect()
                    } else if *forward {
                        co.options[o].forward.clone()
                    } else {
                        co.options[o].backward.clone()
                    };
                    out.extend(steps.into_iter().map(|(l, ng)| (map[l], ng)));
                }
            }
        }
        out
    }

    /// Solves cluster `c` over the budget grid: its options, and how many ILPs were
    /// solved and how many of them to optimality.
    fn cluster_options(
        &self,
        c: usize,
        save_axes_left: &mut f64,
    ) -> Result<(ClusterOptions, (usize, usize)), IlpError> {
        let (h, expand) = self.hgraph(c)?;
        let (h, remap) = select_options(h, &self.cfg);
        let sub = &self.subs[c];
        let lg = &sub.graph;
        let live = Liveness::new(lg);
        let all: Vec<Step> = (0..lg.compute.len()).map(|k| (k, false)).collect();
        let max_peak = live.replay(&all).iter().map(|p| p.0).max().unwrap_or(0);
        let min_peak = min_need(&h);
        let size = |ids: &[usize]| ids.iter().map(|&d| lg.data[d].size).sum::<u64>();
        let min_save = size(&sub.outputs) + size(&sub.grads_in);
        // The H-ILP's time grows fast with its cNodes: the coarse grid beyond Rockmate's
        // medium block.
        let coarse = h.nodes.len() > crate::rockmate::MEDIUM_BLOCK;
        let grid = if coarse { self.cfg.coarse_grid } else { self.cfg.grid };
        let limit = self.limit;
        let solve = |(m, save): crate::Budgets| hilp::solve(&h, m, save, Some(limit));
        let budgets = |grid| crate::budget_grid(min_peak, max_peak, min_save, grid);
        let mut answers = crate::GridAnswers::new(self.threads);
        let mut results = answers.solve(&budgets(if coarse { (grid.0, 1) } else { grid }), |b| Some(solve(b)));
        if coarse && grid.1 > 1 {
            // The save axis, while the preparation's time for save axes lasts (charged
            // per copy: identical clusters share the options); once it is spent, the
            // ILPs left are skipped. Points the peak axis's answers settle cost nothing.
            let saves: Vec<_> = budgets(grid).into_iter().filter(|&(m, s)| s.is_some_and(|s| s < m)).collect();
            let copies = self.rep.iter().filter(|&&r| r == c).count() as f64;
            let (start, left) = (std::time::Instant::now(), *save_axes_left * copies);
            let within = |b: crate::Budgets| (start.elapsed().as_secs_f64() < left).then(|| solve(b));
            results.extend(answers.solve(&saves, within));
            *save_axes_left -= start.elapsed().as_secs_f64() / copies;
        }
        let (found, solved) = hilp::distinct_options(results, sub.loss, |sol| self.steps(&remap, &expand, &sol.seq))?;
        let mut options: Vec<ClusterOption> = found.into_iter().map(|(f, b)| option_of(sub, &live, f, b)).collect();
        if options.is_empty() {
            // Store-all always exists.
            let forward: Vec<Step> = (0..sub.loss).map(|k| (k, false)).collect();
            let backward: Vec<Step> = (sub.loss + 1..lg.compute.len()).map(|k| (k, false)).collect();
            options.push(option_of(sub, &live, forward, backward));
        }
        let mut ff: Vec<Step> = (0..sub.loss).map(|k| (k, true)).collect();
        ff.push((sub.loss, false));
        let r = live.replay(&ff);
        let outs: u64 = sub.outputs.iter().map(|&d| lg.data[d].size).sum();
        let ff_peak = r[..sub.loss].iter().map(|p| p.0).max().unwrap_or(0);
        let options = ClusterOptions {
            options,
            ff_time: (0..sub.loss).map(|k| lg.compute[k].time).sum(),
            ff_overhead: ff_peak.saturating_sub(outs),
            ff_substeps: substeps_of(sub, &ff[..sub.loss], &r[..sub.loss], outs),
        };
        Ok((options, solved))
    }

    /// Bytes resident whatever the schedule: static memory and inputs.
    pub fn fixed(&self) -> u64 {
        self.g.fixed_bytes()
    }

    /// Solves the top cluster within `budget` bytes.
    pub fn schedule(&self, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let infeasible = |reason: String| SolveError::Infeasible { budget, reason };
        let top = self.h.top;
        let (h, expand) = self.hgraph(top).map_err(|e| infeasible(e.to_string()))?;
        let (h, remap) = select_options(h, &self.cfg);
        let sub = &self.subs[top];
        let mut top_optimal = true;
        let mut last = None;
        let schedule = crate::sequence_within_budget(self.g, budget, options, |memory| {
            let limit = options.time_limit.unwrap_or(self.limit * 6.0);
            let start = self.top_start(budget, memory);
            let solved = hilp::solve_from(&h, memory, None, Some(limit), start.as_deref());
            let sol = match solved {
                Ok(s) => {
                    top_optimal = s.optimal;
                    last = Some((s.peak, s.seq.clone()));
                    s
                }
                Err(IlpError::Infeasible) => {
                    return Err(infeasible(format!(
                        "the top H-ILP ({} cNodes) has no solution in {memory} bytes",
                        h.nodes.len()
                    )))
                }
                Err(e @ IlpError::NoSolution { .. }) => {
                    return Err(SolveError::TooLarge { solver: "hiremate", why: e.to_string() })
                }
                Err(e) => return Err(infeasible(e.to_string())),
            };
            Ok(self
                .steps(&remap, &expand, &sol.seq)
                .into_iter()
                .map(|(l, ng)| (sub.compute[l].expect("the top holds the real loss"), ng))
                .collect())
        })?;
        if let Some((peak, seq)) = last {
            let time = seq.iter().map(|&(k, o)| h.nodes[k].options[o].time).sum();
            self.top_plans.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(TopPlan {
                budget,
                peak,
                seq,
                time,
            });
        }
        Ok(schedule.with_optimal(top_optimal && self.solved.0 == self.solved.1))
    }

    /// Where the top H-ILP starts at `budget`, `memory` left for it: the fastest top plan
    /// kept at a budget no larger (so its schedule passed the simulator within this one)
    /// whose rows fit `memory`. `None` for none (HiGHS then starts from store-all's).
    fn top_start(&self, budget: u64, memory: u64) -> Option<Vec<(usize, usize)>> {
        let plans = self.top_plans.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        plans
            .iter()
            .filter(|p| p.budget <= budget && p.peak <= memory)
            .min_by(|a, b| a.time.total_cmp(&b.time))
            .map(|p| p.seq.clone())
    }
}

/// A top H-ILP answer [`Prepared::schedule`] returned, kept to start the top H-ILP at a
/// larger budget: a sweep's budgets rise, and HiGHS started from a plan returns it or a
/// faster one, even where its time limit stops it before it finds its own.
#[derive(Debug, Clone)]
struct TopPlan {
    /// The budget the schedule passed the simulator within.
    budget: u64,
    /// What its peak rows hold ([`hilp::HSolution::peak`]).
    peak: u64,
    seq: Vec<(usize, usize)>,
    /// Σ of its options' times: the top H-ILP's objective.
    time: f64,
}

/// Rockmate's sequential blocks as the first level of the hierarchy: each block of
/// several ops is a cluster, and consecutive blocks are grouped `M^l` at a time until at
/// most `M^t` remain, the top. `None` for a graph with fewer than two blocks, or a block
/// of more than `M^l` ops: H-Partition then cuts it as a whole.
fn blocks_partition(g: &TrainingGraph, cfg: &HPartitionConfig) -> Option<Hierarchy> {
    let blocks = crate::subgraph::sequential_blocks(g);
    if blocks.len() < 2 || blocks.iter().any(|b| b.len() > cfg.max_sub) {
        return None;
    }
    let mut clusters: Vec<Cluster> = Vec::new();
    let mut level: Vec<(Part, Vec<usize>)> = blocks
        .into_iter()
        .map(|b| {
            if b.len() == 1 {
                (Part::Op(b[0]), b)
            } else {
                clusters.push(Cluster { parts: b.iter().map(|&k| Part::Op(k)).collect(), ops: b.clone() });
                (Part::Cluster(clusters.len() - 1), b)
            }
        })
        .collect();
    while level.len() > cfg.max_top {
        let group = cfg.max_sub.min(level.len().div_ceil(cfg.max_top)).max(2);
        level = level
            .chunks(group)
            .map(|c| {
                if c.len() == 1 {
                    return c[0].clone();
                }
                let mut ops: Vec<usize> = c.iter().flat_map(|(_, o)| o.iter().copied()).collect();
                ops.sort_unstable();
                clusters.push(Cluster { parts: c.iter().map(|(p, _)| *p).collect(), ops: ops.clone() });
                (Part::Cluster(clusters.len() - 1), ops)
            })
            .collect();
    }
    let mut ops: Vec<usize> = level.iter().flat_map(|(_, o)| o.iter().copied()).collect();
    ops.sort_unstable();
    clusters.push(Cluster { parts: level.into_iter().map(|(p, _)| p).collect(), ops });
    Some(Hierarchy { top: clusters.len() - 1, clusters })
}

/// A cluster seen from its own subgraph, while its H-graph is built: the part of each
/// local compute node, and the aNodes.
struct LocalCluster<'a> {
    sub: &'a SubGraph,
    cluster: &'a Cluster,
    /// The cluster's local id of each of its global compute ids.
    global_to_local: HashMap<usize, usize>,
    /// The part of each local compute node (`None`: the loss).
    part_of: Vec<Option<usize>>,
    /// The aNode of each local data node (`usize::MAX`: none).
    anode: Vec<usize>,
    /// Each aNode's size.
    sizes: Vec<u64>,
}

impl<'a> LocalCluster<'a> {
    fn new(h: &'a Hierarchy, c: usize, sub: &'a SubGraph) -> LocalCluster<'a> {
        let lg = &sub.graph;
        let cluster = &h.clusters[c];
        let mut global_to_local: HashMap<usize, usize> = HashMap::new();
        for (l, k) in sub.compute.iter().enumerate() {
            if let Some(k) = k {
                global_to_local.insert(*k, l);
            }
        }
        let mut part_of: Vec<Option<usize>> = vec![None; lg.compute.len()];
        for (pi, part) in cluster.parts.iter().enumerate() {
            let ops: Vec<usize> = match *part {
                Part::Op(k) => vec![k],
                Part::Cluster(cc) => h.clusters[cc].ops.clone(),
            };
            for k in ops {
                let l = global_to_local[&k];
                part_of[l] = Some(pi);
            }
        }
        for (l, node) in lg.compute.iter().enumerate() {
            if node.kind == ComputeKind::Backward {
                part_of[l] = node.forward.and_then(|f| part_of[f]);
            }
        }
        let mut local = LocalCluster { sub, cluster, global_to_local, part_of, anode: Vec::new(), sizes: Vec::new() };
        local.anodes();
        local
    }

    /// The aNodes: the data tracked, not saved, and not inside a single cluster part.
    fn anodes(&mut self) {
        let sub = self.sub;
        let lg = &sub.graph;
        let live = Liveness::new(lg);
        let mut touch: Vec<Vec<Option<usize>>> = vec![Vec::new(); lg.data.len()];
        for (l, node) in lg.compute.iter().enumerate() {
            for &d in node.inputs.iter().chain(&node.outputs) {
                touch[d].push(self.part_of[l]);
            }
        }
        let is_cluster_part = |p: usize| matches!(self.cluster.parts[p], Part::Cluster(_));
        self.anode = vec![usize::MAX; lg.data.len()];
        for (d, t) in touch.iter().enumerate() {
            if !live.tracked(d) || lg.data[d].kind == DataKind::Saved {
                continue;
            }
            let internal = match t.first() {
                Some(&Some(p)) => is_cluster_part(p) && t.iter().all(|&x| x == Some(p)),
                _ => false,
            };
            if !internal {
                self.anode[d] = self.sizes.len();
                self.sizes.push(lg.data[d].size);
            }
        }
    }

    /// The aNodes among local data `ids`, sorted, once each.
    fn an<'i>(&self, ids: impl Iterator<Item = &'i usize>) -> Vec<usize> {
        let mut v: Vec<usize> = ids.filter(|&&d| self.anode[d] != usize::MAX).map(|&d| self.anode[d]).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The local forward nodes of part `p`.
    fn fwd_nodes(&self, p: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.sub.loss).filter(move |&l| self.part_of[l] == Some(p))
    }

    /// The local backward nodes of part `p`.
    fn bwd_nodes(&self, p: usize) -> impl Iterator<Item = usize> + '_ {
        (self.sub.loss + 1..self.sub.graph.compute.len()).filter(move |&l| self.part_of[l] == Some(p))
    }

    /// The forward cNode of part `p`, an op: its options with and without grad.
    fn op_forward(&self, p: usize) -> (HNode, Expand) {
        let lg = &self.sub.graph;
        let l = self.fwd_nodes(p).next().expect("an op part has its forward");
        let node = &lg.compute[l];
        let hnode = HNode {
            kind: HKind::Forward { pair: p },
            inputs: self.an(node.inputs.iter()),
            outputs: self.an(node.outputs.iter()),
            options: op_options(lg, l),
        };
        (hnode, Expand::OpForward(l))
    }

    /// The cluster's loss, one option.
    fn loss(&self) -> (HNode, Expand) {
        let loss = &self.sub.graph.compute[self.sub.loss];
        let hnode = HNode {
            kind: HKind::Loss,
            inputs: self.an(loss.inputs.iter()),
            outputs: self.an(loss.outputs.iter()),
            options: vec![HOption {
                time: loss.time,
                overhead: loss.tmp,
                phantom: 0,
                reads: Vec::new(),
                substeps: Vec::new(),
            }],
        };
        (hnode, Expand::Loss(self.sub.loss))
    }

    /// The backward cNode of part `p`, an op (local node `l`).
    fn op_backward(&self, p: usize, l: usize) -> (HNode, Expand) {
        let lg = &self.sub.graph;
        let node = &lg.compute[l];
        let hnode = HNode {
            kind: HKind::Backward { pair: p },
            inputs: self.an(node.inputs.iter()),
            outputs: self.an(node.outputs.iter()),
            options: op_options(lg, l),
        };
        (hnode, Expand::OpBackward(l))
    }
}

/// How a cNode of a cluster's H-graph becomes steps.
#[derive(Debug, Clone)]
enum Expand {
    OpForward(usize),
    OpBackward(usize),
    Loss(usize),
    /// A sub-cluster: its options' parts, mapped from its local ids to ours.
    Cluster {
        child: usize,
        forward: bool,
        map: Vec<usize>,
    },
}

fn option_of(sub: &SubGraph, live: &Liveness<'_>, forward: Vec<Step>, backward: Vec<Step>) -> ClusterOption {
    let lg = &sub.graph;
    let mut seq = forward.clone();
    seq.push((sub.loss, false));
    seq.extend_from_slice(&backward);
    let r = live.replay(&seq);
    let nf = forward.len();
    let size = |ids: &[usize]| ids.iter().map(|&d| lg.data[d].size).sum::<u64>();
    let outs = size(&sub.outputs);
    let after_forward = if nf == 0 { 0 } else { r[nf - 1].1 };
    let phantom = after_forward.saturating_sub(outs);
    let fwd_peak = r[..nf].iter().map(|p| p.0).max().unwrap_or(0);
    let reads: Vec<usize> = sub
        .inputs
        .iter()
        .chain(&sub.outputs)
        .copied()
        .filter(|&d| backward.iter().any(|&(k, _)| lg.compute[k].inputs.contains(&d)))
        .collect();
    let outputs_read: u64 = reads.iter().filter(|d| sub.outputs.contains(d)).map(|&d| lg.data[d].size).sum();
    let bwd_peak = r[nf + 1..].iter().map(|p| p.0).max().unwrap_or(0);
    let at_start = phantom + size(&sub.grads_in) + outputs_read;
    let time = |s: &[Step]| s.iter().map(|&(k, _)| lg.compute[k].time).sum::<f64>();
    let bwd_base = at_start + size(&sub.grads_out);
    ClusterOption {
        fwd_time: time(&forward),
        bwd_time: time(&backward),
        fwd_overhead: fwd_peak.saturating_sub(outs + phantom),
        bwd_overhead: bwd_peak.saturating_sub(bwd_base),
        phantom,
        reads,
        fwd_substeps: substeps_of(sub, &forward, &r[..nf], outs + phantom),
        bwd_substeps: substeps_of(sub, &backward, &r[nf + 1..], bwd_base),
        forward,
        backward,
    }
}

/// The correction terms (3.34) of one part of an option: its steps, their replayed
/// peaks (which count neither the cluster's inputs nor anything resident before it) and
/// what the H-ILP already counts at the top (`base`). Substep `i` is charged its peak
/// above `base`, less the inputs of the cluster no step from `i` on reads: the schedule
/// frees them after their last reader when the cNode deletes them. Substeps with the same
/// dead inputs keep their largest peak; one that another dominates (no smaller peak, no
/// more dead inputs) is dropped; if only the substeps with no dead input remain, there is
/// nothing to correct and the list is empty.
fn substeps_of(sub: &SubGraph, steps: &[Step], peaks: &[(u64, u64)], base: u64) -> Vec<Substep> {
    let lg = &sub.graph;
    // The last step reading each input of the cluster.
    let last: Vec<Option<usize>> =
        sub.inputs.iter().map(|&d| steps.iter().rposition(|&(k, _)| lg.compute[k].inputs.contains(&d))).collect();
    let mut groups: Vec<Substep> = Vec::new();
    for (i, &(peak, _)) in peaks.iter().enumerate() {
        let dead: Vec<usize> =
            sub.inputs.iter().zip(&last).filter(|(_, l)| l.is_some_and(|l| l < i)).map(|(&d, _)| d).collect();
        let overhead = peak as i64 - base as i64;
        match groups.iter_mut().find(|g| g.dead == dead) {
            Some(g) => g.overhead = g.overhead.max(overhead),
            None => groups.push(Substep { overhead, dead }),
        }
    }
    let dominated = |a: &Substep, b: &Substep| b.overhead >= a.overhead && b.dead.iter().all(|d| a.dead.contains(d));
    let kept: Vec<Substep> = groups
        .iter()
        .enumerate()
        .filter(|&(i, a)| !groups.iter().enumerate().any(|(j, b)| j != i && dominated(a, b) && (a != b || j < i)))
        .map(|(_, a)| a.clone())
        .collect();
    if kept.iter().all(|g| g.dead.is_empty()) {
        Vec::new()
    } else {
        kept
    }
}

/// The least any cNode needs alone: its inputs and outputs, and its cheapest option.
fn min_need(h: &HGraph) -> u64 {
    h.nodes
        .iter()
        .map(|n| {
            let io: u64 = n.inputs.iter().chain(&n.outputs).map(|&d| h.sizes[d]).sum();
            io + n.options.iter().map(|o| o.overhead + o.phantom).min().unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    /// Which of the zoo's graphs (default sizes) are a sequence of Rockmate's blocks of at
    /// most `M^l` ops, and so get Rockmate's plan as HiRemate's incumbent, as
    /// docs/benchmarks.md says: the ResNets, GPT-2 and DenseNet-121, not U-Net, the
    /// encoder-decoder Transformer or Inception-v3.
    #[test]
    fn the_incumbent_goes_to_the_sequential_zoo_models() {
        let sequential = |m: &str| {
            let g = pebble_zoo::build(m, &pebble_zoo::ModelOptions::default()).unwrap().graph;
            super::blocks_partition(&g, &pebble_graph::HPartitionConfig::DEFAULT).is_some()
        };
        for m in ["resnet50", "resnet101", "gpt2-small", "gpt2-large", "densenet121"] {
            assert!(sequential(m), "{m}");
        }
        for m in ["unet", "transformer", "inception_v3"] {
            assert!(!sequential(m), "{m}");
        }
    }

    /// The top H-ILP starts from the fastest plan already returned at a budget no larger
    /// whose rows fit what is left for it; not from one returned at a larger budget
    /// (its schedule may not fit), nor from one whose rows need more memory.
    #[test]
    fn the_top_starts_from_the_fastest_plan_that_fits() {
        let g = pebble_testkit::gpt(2, 16, 8).graph;
        let own = super::HiremateConfig { rockmate_incumbent: false, mincut_incumbent: false, ..Default::default() };
        let problem = pebble_solve::Problem::Graph(&g);
        let options = pebble_solve::SolveOptions::default();
        let all =
            pebble_solve::baseline::store_all::simulate_store_all(problem, &options.sim_config()).unwrap().peak_bytes;
        let fixed = g.fixed_bytes();
        let at = |pct: u64| fixed + (all - fixed) * pct / 100;
        let time =
            |s: &pebble_schedule::Schedule| pebble_solve::simulate(problem, s, &options.sim_config()).unwrap().makespan;
        let p = super::Prepared::new(&g, &own, None).unwrap();
        let kept = |p: &super::Prepared| p.top_plans.lock().unwrap().clone();
        // Feasible from 84% of the activations.
        let (lo, hi) = (at(86), at(100));
        assert_eq!(p.top_start(hi, u64::MAX), None, "nothing kept yet");
        let slow = p.schedule(lo, &options).unwrap();
        let first = kept(&p)[0].clone();
        assert_eq!(first.budget, lo);
        assert!(first.peak <= lo - fixed);
        assert_eq!(p.top_start(lo, first.peak).as_deref(), Some(&first.seq[..]));
        assert_eq!(p.top_start(lo - 1, u64::MAX), None, "kept at a larger budget");
        assert_eq!(p.top_start(hi, first.peak - 1), None, "its rows need more");
        let fast = p.schedule(hi, &options).unwrap();
        assert!(time(&fast) < time(&slow), "100% is no faster than 86%: the test shows nothing");
        let second = kept(&p)[1].clone();
        assert!(second.time < first.time);
        assert_eq!(p.top_start(hi, u64::MAX).as_deref(), Some(&second.seq[..]), "the faster of the two");
        if second.peak > first.peak {
            assert_eq!(p.top_start(hi, second.peak - 1).as_deref(), Some(&first.seq[..]), "the one that fits");
        }
    }

    /// A cluster of more than `MEDIUM_BLOCK` cNodes gets its save axis while the
    /// preparation's time for save axes lasts: with none, exactly the options of the peak
    /// axis alone; with time, those and more (the cheap-recompute options).
    #[test]
    fn the_save_axes_budget_decides_who_gets_a_save_axis() {
        let opts = pebble_zoo::ModelOptions {
            layers: Some(1),
            seq: Some(32),
            batch: Some(2),
            ..pebble_zoo::ModelOptions::default()
        };
        let g = pebble_zoo::build("transformer", &opts).unwrap().graph;
        // A time limit no loaded test machine reaches (each ILP takes well under a second).
        let own = super::HiremateConfig {
            rockmate_incumbent: false,
            mincut_incumbent: false,
            time_limit: 600.0,
            ..Default::default()
        };
        let prepare = |cfg: super::HiremateConfig| super::Prepared::new(&g, &cfg, None).unwrap();
        let peaks_only = prepare(super::HiremateConfig { coarse_grid: (8, 1), ..own });
        let none = prepare(super::HiremateConfig { save_axes: 0.0, ..own });
        let ample = prepare(super::HiremateConfig { save_axes: 1e6, ..own });
        let coarse: Vec<usize> = (0..none.h.clusters.len())
            .filter(|&c| c != none.h.top && none.rep[c] == c)
            .filter(|&c| none.hgraph(c).unwrap().0.nodes.len() > crate::rockmate::MEDIUM_BLOCK)
            // Of ops alone: a parent's options also change with its children's.
            .filter(|&c| none.h.clusters[c].parts.iter().all(|p| matches!(p, pebble_graph::Part::Op(_))))
            .collect();
        assert!(!coarse.is_empty(), "no coarse cluster to test");
        for p in [&peaks_only, &none, &ample] {
            assert_eq!(p.solved.0, p.solved.1, "every ILP proven (the comparison needs exact answers)");
        }
        // 86 ILPs without save axes, the coarse cluster's 18 besides with them; with no
        // time for save axes, the 3 of the 18 that the peak axis's answers settle.
        assert_eq!(
            (peaks_only.solved.0, none.solved.0 - peaks_only.solved.0, ample.solved.0 - peaks_only.solved.0),
            (86, 3, 18)
        );
        let count = |p: &super::Prepared, c: usize| p.options_of(c).options.len();
        let mut gained = 0;
        for &c in &coarse {
            assert_eq!(none.options_of(c).options, peaks_only.options_of(c).options, "cluster {c}");
            let (a, n) = (&ample.options_of(c).options, &none.options_of(c).options);
            assert!(n.iter().all(|o| a.contains(o)), "cluster {c}: the peak axis's options stay");
            gained += count(&ample, c) - count(&none, c);
        }
        assert!(gained > 0, "the save axes found no option the peak axes had not");
    }
}
