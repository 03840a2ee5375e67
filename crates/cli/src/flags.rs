//! The command line as clap parses it: flag names, value syntax and help text. Nothing
//! here loads a file or builds a model; `source.rs` and the commands give the values
//! their meaning. Values with a fixed syntax (sizes, budgets, slots, bandwidths) are
//! parsed here, so that a bad one is a usage error naming its flag (exit code 2).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use pebble_graph::units::{parse_budget, BudgetSpec};
use pebble_solve::Slots;

/// Plans memory-constrained DNN training: which activations to keep, recompute or offload.
#[derive(Debug, Parser)]
#[command(name = "pebble", version, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the model zoo: names, families, published parameter counts and defaults.
    Models(ModelsArgs),
    /// Describe a model: parameters, static memory, store-all peak and time, FLOPs.
    Info(InfoArgs),
    /// Write a model's chain or training graph as JSON.
    Graph(GraphArgs),
    /// Plan one training step within a memory budget with one solver.
    Plan(PlanArgs),
    /// Run a schedule through the simulator: makespan, peak, host peak.
    Simulate(SimulateArgs),
    /// Trade-off of time overhead against memory for several solvers.
    Sweep(SweepArgs),
    /// The largest batch that fits a device memory, under a solver or a run-time policy.
    Maxbatch(MaxbatchArgs),
    /// Train a zoo model for real under a memory budget: plan, run, measure.
    Train(TrainArgs),
    /// Measure each op's time and temporary memory on a device; write the graph or chain.
    Profile(ProfileArgs),
    /// Compare Burn's autodiff (with and without checkpointing) with pebble's store-all and rotor.
    Bench(BenchArgs),
    /// Reproduce a published experiment in simulation: ch4, ch7, weights, offmate, hiremate, delta.
    Reproduce(ReproduceArgs),
    /// Pipelined model parallelism: spread the layers over several devices and plan the
    /// pipeline (1F1B*, PipeDream, the ILP, MadPipe, GPipe, interleaved 1F1B, Zero Bubble).
    Pipeline(PipelineArgs),
}

/// `pebble pipeline`.
#[derive(Debug, Clone, Args)]
pub struct PipelineArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub opts: ModelOpts,
    /// The solver: 1f1b, pipedream, pipeline-ilp, madpipe, gpipe, interleaved-1f1b, zb-h1, zb-v.
    #[arg(long, value_name = "NAME")]
    pub solver: String,
    /// Devices `P` [default: the profile's device count].
    #[arg(long, value_name = "P")]
    pub devices: Option<usize>,
    /// Memory of each device, everything resident counted: `16GiB`, plain bytes (units for
    /// chain files), or `inf` [default: the profile's device memory].
    #[arg(long, value_name = "SIZE|inf", value_parser = size_or_inf, allow_hyphen_values = true)]
    pub memory: Option<MemoryLimit>,
    /// Device↔device bandwidth of each link, bytes per second (or per time unit for chain
    /// files): `12e9`, `12GB`, or `inf` for free communications [default: the profile's
    /// interconnect].
    #[arg(long, value_name = "BYTES_PER_S|inf", value_parser = bandwidth_or_inf, allow_hyphen_values = true)]
    pub bandwidth: Option<f64>,
    /// Micro-batches per step for the schedules with a flush (gpipe, interleaved-1f1b,
    /// zb-h1, zb-v, and 1f1b, which is the periodic 1F1B* without it) [default: the most
    /// up to 2P that fits the memory].
    #[arg(long, value_name = "M")]
    pub microbatches: Option<usize>,
    /// Virtual stages per device of interleaved-1f1b.
    #[arg(long, value_name = "V", default_value_t = 2)]
    pub virtual_stages: usize,
    /// Weight versions each device keeps [default: 2 for the periodic schedules
    /// (PipeDream-2BW's stashing), 1 with a flush]; the thesis's `C = 3` is 2 versions
    /// and a gradient.
    #[arg(long, value_name = "N")]
    pub weight_versions: Option<u64>,
    /// Time limit of the ILPs (pipeline-ilp, madpipe's phase 2), in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0, value_parser = positive_value)]
    pub time_limit: f64,
    /// Draw the schedule as a Gantt chart (one row per device and per link) to this SVG.
    /// An existing file is kept unless --force is given.
    #[arg(long, value_name = "FILE.svg")]
    pub gantt: Option<PathBuf>,
    /// Write the plan: `pebble` (the schedule JSON, format 2) or `torch` (the action
    /// format of PyTorch's pipeline schedule runtime), to --output or standard output.
    #[arg(long, value_name = "FORMAT", value_enum)]
    pub export: Option<ExportFormat>,
    /// Where --export writes (default: standard output). An existing file is kept unless
    /// --force is given.
    #[arg(short, long, value_name = "FILE", requires = "export")]
    pub output: Option<PathBuf>,
    /// Overwrite the --gantt and --output files if they exist.
    #[arg(long)]
    pub force: bool,
    /// Also run one step of the plan for real on the CPU (a zoo model only): one worker
    /// thread per device, each capped at --memory, over --microbatches micro-batches (default
    /// 2P), beside the same micro-batches on one device; reports the losses and gradients
    /// against one device's and each worker's measured peak. It plans as it runs: it
    /// refuses --bandwidth, and --virtual-stages, --weight-versions and --time-limit other
    /// than its own (2, 1 and 60 s).
    #[arg(long)]
    pub run: bool,
    /// Print JSON instead of a summary.
    #[arg(long)]
    pub json: bool,
}

/// `pebble pipeline --export`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// pebble's schedule JSON (format 2).
    Pebble,
    /// PyTorch's pipeline schedule runtime actions.
    Torch,
}

/// `pebble models`.
#[derive(Debug, Clone, Args)]
pub struct ModelsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `--batch`: a size, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchArg {
    /// This batch.
    Fixed(usize),
    /// The batch of most samples per second (`pebble plan`).
    Auto,
}

fn batch_value(text: &str) -> Result<BatchArg, String> {
    if text == "auto" {
        return Ok(BatchArg::Auto);
    }
    text.parse::<usize>()
        .map(BatchArg::Fixed)
        .map_err(|_| format!("`{text}` is not a batch size (a whole number, or `auto`)"))
}

impl SizeOpts {
    /// The batch asked for; `auto` is an error outside `pebble plan`, which resolves it.
    pub fn fixed_batch(&self) -> Result<Option<usize>, String> {
        match self.batch {
            None => Ok(None),
            Some(BatchArg::Fixed(b)) => Ok(Some(b)),
            Some(BatchArg::Auto) => {
                Err("--batch auto: only `pebble plan` searches the batch size; give a number here".into())
            }
        }
    }
}

/// A zoo model's sizes, shared by the planner's and the executor's commands.
#[derive(Debug, Clone, Args)]
pub struct SizeOpts {
    /// Batch size (default: the model's); `auto` (`pebble plan` only): the batch of most
    /// samples per second within the budget, found by planning at each.
    #[arg(long, value_name = "N|auto", value_parser = batch_value)]
    pub batch: Option<BatchArg>,
    /// Image side, for vision models.
    #[arg(long, value_name = "PIXELS")]
    pub image: Option<usize>,
    /// Sequence length, for sequence models.
    #[arg(long, value_name = "TOKENS")]
    pub seq: Option<usize>,
    /// Layer count, for models of variable depth.
    #[arg(long, value_name = "N")]
    pub layers: Option<usize>,
    /// Width (channels or embedding size), for models of variable width (`gpt`, `resnet`, `mlp`).
    #[arg(long, value_name = "N")]
    pub width: Option<usize>,
    /// Attention heads, for models with a variable head count (`gpt`).
    #[arg(long, value_name = "N")]
    pub heads: Option<usize>,
}

/// Options every zoo model takes. Each needs `--model` (`--batch`, `--dtype`,
/// `--optimizer`, `--master-weights`, `--trainable` and `--profile` also `--onnx`),
/// which `Source::load` checks with [`ModelOpts::given`] (clap's `requires` cannot: it
/// takes a requirement on one member of the source group as met when another member is
/// given). A model that has no use for one (`--seq` for a ResNet) rejects it when it is
/// built, as the zoo rejects `--master-weights` without `--dtype bf16` and a
/// `--trainable` fraction outside (0, 1].
#[derive(Debug, Clone, Args)]
pub struct ModelOpts {
    #[command(flatten)]
    pub size: SizeOpts,
    /// Float type of parameters and activations [default: f32].
    #[arg(long, value_enum)]
    pub dtype: Option<DTypeArg>,
    /// Optimizer whose state counts as static memory [default: adam].
    #[arg(long, value_enum)]
    pub optimizer: Option<OptimizerArg>,
    /// Mixed precision: with `--dtype bf16`, also an fp32 master copy of the weights and
    /// fp32 optimizer states (static memory per parameter: 2 + 2 + (1 + states) × 4
    /// bytes). Needs `--dtype bf16`.
    #[arg(long)]
    pub master_weights: bool,
    /// LoRA-like partial training: the trainable fraction of each parameter tensor, in
    /// (0, 1]. Gradients and optimizer states cover that fraction (rounded up to whole
    /// elements); the frozen weights stay whole; op times do not change [default: 1].
    #[arg(long, value_name = "FRACTION", allow_hyphen_values = true)]
    pub trainable: Option<f64>,
    /// The machine to plan for (op times, memory, links, runtime overhead): v100 (default),
    /// a100, h100, rtx3060, or a JSON profile file.
    #[arg(long, value_name = "PROFILE")]
    pub profile: Option<String>,
    /// `cpu`: plan for pebble's executor on the CPU, as `train --device cpu` runs the plan
    /// (the ops hold the temporaries burn-flex allocates, which are larger than the
    /// kernels' the profile's device has). Any other value is the deprecated spelling of
    /// `--profile`, kept for one release.
    #[arg(long, value_name = "cpu")]
    pub device: Option<String>,
}

/// The cost profile a command was given: `--profile`, or the old `--device PROFILE` with a
/// warning on standard error. Both at once is an error.
pub fn profile_flag(profile: &Option<String>, legacy_device: Option<&str>) -> Result<Option<String>, String> {
    match (profile, legacy_device) {
        (Some(_), Some(_)) => {
            Err("give the cost profile once, with --profile (--device PROFILE is its old spelling)".into())
        }
        (Some(p), None) => Ok(Some(p.clone())),
        (None, Some(d)) => {
            eprintln!(
                "warning: --device {d} names a cost profile, which is now --profile {d}; --device is kept for one \
                 release, and now means where to run (cpu|cuda) in train, profile and bench"
            );
            Ok(Some(d.to_string()))
        }
        (None, None) => Ok(None),
    }
}

impl ModelOpts {
    /// `--profile`, or the deprecated `--device`.
    pub fn profile_name(&self) -> Result<Option<String>, String> {
        let legacy = self.device.as_deref().filter(|_| !self.for_cpu_executor());
        profile_flag(&self.profile, legacy)
    }

    /// `--device cpu`: plan for pebble's executor on the CPU, as `train --device cpu` runs
    /// it, whose ops hold burn-flex's temporaries (any other `--device` value is the old
    /// spelling of `--profile`).
    pub fn for_cpu_executor(&self) -> bool {
        self.device.as_deref().is_some_and(|d| d.eq_ignore_ascii_case("cpu"))
    }
}

impl ModelOpts {
    /// The first model option given, as its flag.
    pub fn given(&self) -> Option<&'static str> {
        [
            (self.size.batch.is_some(), "--batch"),
            (self.size.image.is_some(), "--image"),
            (self.size.seq.is_some(), "--seq"),
            (self.size.layers.is_some(), "--layers"),
            (self.size.width.is_some(), "--width"),
            (self.size.heads.is_some(), "--heads"),
            (self.dtype.is_some(), "--dtype"),
            (self.optimizer.is_some(), "--optimizer"),
            (self.master_weights, "--master-weights"),
            (self.trainable.is_some(), "--trainable"),
            (self.profile.is_some(), "--profile"),
            (self.device.is_some(), "--device"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }

    /// The first option given that only a zoo model takes (an ONNX file has its sizes).
    pub fn zoo_only(&self) -> Option<&'static str> {
        [
            (self.size.image.is_some(), "--image"),
            (self.size.seq.is_some(), "--seq"),
            (self.size.layers.is_some(), "--layers"),
            (self.size.width.is_some(), "--width"),
            (self.size.heads.is_some(), "--heads"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }
}

/// `--dtype`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DTypeArg {
    /// 32-bit floats.
    F32,
    /// bfloat16.
    Bf16,
}

/// `--optimizer`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OptimizerArg {
    /// No state.
    Sgd,
    /// One state per parameter.
    Momentum,
    /// Two states per parameter (Adam, or AdamW: `adamw` is the same memory).
    #[value(alias = "adamw")]
    Adam,
}

/// `--view`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ViewArg {
    /// Rotor's chain of blocks.
    Chain,
    /// The forward+backward training graph.
    Graph,
}

/// Where the problem comes from: exactly one of a chain file, a graph file, a zoo model
/// or an ONNX model.
#[derive(Debug, Clone, Args)]
#[group(id = "source", required = true, multiple = false)]
pub struct SourceArgs {
    /// A chain in rotor's JSON format (ftime, btime, x, xbar, ftmp, btmp); sizes in plain units.
    #[arg(long, value_name = "FILE")]
    pub chain: Option<PathBuf>,
    /// A training graph in pebble's JSON format (as `pebble graph` writes it).
    #[arg(long, value_name = "FILE")]
    pub graph: Option<PathBuf>,
    /// A zoo model (see `pebble models`).
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// An ONNX model file, imported with its shapes (`scripts/fetch-onnx-models.sh`
    /// fetches test models); `--batch`, `--dtype`, `--optimizer`, `--master-weights`,
    /// `--trainable` and `--profile` apply.
    #[arg(long, value_name = "FILE")]
    pub onnx: Option<PathBuf>,
}

impl SourceArgs {
    /// The model the flags name, if they name one (a zoo model or an ONNX file).
    pub fn model_source(&self) -> Option<ModelSource<'_>> {
        match (&self.model, &self.onnx) {
            (Some(name), _) => Some(ModelSource::Zoo(name)),
            (None, Some(path)) => Some(ModelSource::Onnx(path)),
            (None, None) => None,
        }
    }
}

/// A model of `info` and `graph`: exactly one of a zoo model or an ONNX file.
#[derive(Debug, Clone, Args)]
#[group(id = "model_source", required = true, multiple = false)]
pub struct ModelArgs {
    /// A zoo model (see `pebble models`).
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// An ONNX model file, imported with its shapes; `--batch`, `--dtype`, `--optimizer`,
    /// `--master-weights`, `--trainable` and `--profile` apply.
    #[arg(long, value_name = "FILE")]
    pub onnx: Option<PathBuf>,
}

impl ModelArgs {
    /// The model the flags name.
    pub fn model_source(&self) -> ModelSource<'_> {
        match (&self.model, &self.onnx) {
            (Some(name), _) => ModelSource::Zoo(name),
            (None, Some(path)) => ModelSource::Onnx(path),
            // clap's group makes one of the two required.
            (None, None) => ModelSource::Zoo(""),
        }
    }
}

/// A model named on the command line.
#[derive(Debug, Clone, Copy)]
pub enum ModelSource<'a> {
    /// `--model NAME`.
    Zoo(&'a str),
    /// `--onnx FILE`.
    Onnx(&'a std::path::Path),
}

/// `pebble info`.
#[derive(Debug, Clone, Args)]
pub struct InfoArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub opts: ModelOpts,
    /// Print JSON instead of a summary.
    #[arg(long)]
    pub json: bool,
}

/// `pebble graph`.
#[derive(Debug, Clone, Args)]
pub struct GraphArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub opts: ModelOpts,
    /// Which view to write.
    #[arg(long, value_enum, default_value = "graph")]
    pub view: ViewArg,
    /// Where to write it (default: standard output). An existing file is kept unless
    /// --force is given.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Overwrite the --output file if it exists.
    #[arg(long)]
    pub force: bool,
}

/// The memory budget of `pebble plan`: exactly one of the two.
#[derive(Debug, Clone, Args)]
#[group(id = "budget_group", required = true, multiple = false)]
pub struct BudgetArgs {
    /// Device memory for everything resident, static memory included: `4GiB`, `512MiB`,
    /// plain bytes (units for chain files), or `P%` of what store-all needs (its peak plus
    /// the profile's runtime reserve). Solvers plan in what the reserve leaves.
    #[arg(long, value_name = "SIZE", value_parser = budget_value, allow_hyphen_values = true)]
    pub budget: Option<BudgetSpec>,
    /// Memory for everything but static memory (parameters, their gradients, optimizer
    /// states), which is added to it; `P%` is of what store-all needs less static memory.
    #[arg(long, value_name = "SIZE", value_parser = budget_value, allow_hyphen_values = true)]
    pub activation_budget: Option<BudgetSpec>,
}

/// An optional budget (`pebble simulate`): at most one of the two, meaning what they mean
/// in `plan` and `train`.
#[derive(Debug, Clone, Args)]
#[group(id = "optional_budget", required = false, multiple = false)]
pub struct OptionalBudgetArgs {
    /// Fail if device memory exceeds this: as `--budget` of `pebble plan`.
    #[arg(long, value_name = "SIZE", value_parser = budget_value, allow_hyphen_values = true)]
    pub budget: Option<BudgetSpec>,
    /// As `--activation-budget` of `pebble plan`.
    #[arg(long, value_name = "SIZE", value_parser = budget_value, allow_hyphen_values = true)]
    pub activation_budget: Option<BudgetSpec>,
}

impl OptionalBudgetArgs {
    /// The budget flags, if one was given.
    pub fn given(&self) -> Option<BudgetArgs> {
        (self.budget.is_some() || self.activation_budget.is_some())
            .then_some(BudgetArgs { budget: self.budget, activation_budget: self.activation_budget })
    }
}

/// Options passed on to the solvers and the simulator.
#[derive(Debug, Clone, Args)]
pub struct SolveArgs {
    /// Memory discretization of the dynamic programs: a slot count, or `exact` to use a
    /// chain's integer units as they are [default: 500].
    #[arg(long, value_name = "N|exact", value_parser = slots_value, allow_hyphen_values = true)]
    pub slots: Option<Slots>,
    /// Wall-clock limit of MILP solvers, in seconds.
    #[arg(long, value_name = "SECONDS", value_parser = positive_value, allow_hyphen_values = true)]
    pub time_limit: Option<f64>,
    /// Host↔device bandwidth, bytes per second (or per time unit for chain files);
    /// `12e9` or `12GB` [default: the device's link, or 16e9 for files].
    #[arg(long, value_name = "BYTES_PER_S", value_parser = bandwidth_value, allow_hyphen_values = true)]
    pub bandwidth: Option<f64>,
    /// How the simulator counts device memory: `none`, the bytes of live tensors; `caching`,
    /// what PyTorch's CUDA caching allocator reserves for them (its segments within the
    /// budget); `expandable`, the same with `expandable_segments:True`.
    #[arg(long, value_name = "MODEL", value_enum, default_value_t = AllocatorArg::None)]
    pub allocator: AllocatorArg,
}

/// `--allocator`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AllocatorArg {
    /// Bytes of live tensors.
    None,
    /// PyTorch's caching allocator.
    Caching,
    /// PyTorch's caching allocator with `expandable_segments:True`.
    Expandable,
}

impl AllocatorArg {
    /// The simulator's allocator for this flag.
    pub fn config(self) -> Option<pebble_sim::allocator::AllocatorConfig> {
        use pebble_sim::allocator::{AllocatorConfig, AllocatorMode};
        let mode = match self {
            AllocatorArg::None => return None,
            AllocatorArg::Caching => AllocatorMode::Caching,
            AllocatorArg::Expandable => AllocatorMode::ExpandableSegments,
        };
        Some(AllocatorConfig { mode, ..AllocatorConfig::default() })
    }
}

/// The chart of one schedule over time, as `plan` and `simulate` draw it.
#[derive(Debug, Clone, Args)]
pub struct TimelineArgs {
    /// Plot this schedule's timeline to this SVG file: compute ops, device→host and
    /// host→device transfers, and device memory against the budget, on one time axis.
    /// An existing file is kept unless --force is given.
    #[arg(long, value_name = "FILE.svg")]
    pub timeline: Option<PathBuf>,
    /// Overwrite the --timeline file (and `plan`'s --output) if it exists.
    #[arg(long)]
    pub force: bool,
}

/// `pebble plan`.
#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub opts: ModelOpts,
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// The solver (listed below).
    #[arg(long, value_name = "NAME")]
    pub solver: String,
    #[command(flatten)]
    pub solve: SolveArgs,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    pub json: bool,
    /// Write the schedule as JSON to this file.
    #[arg(short, long, value_name = "SCHEDULE")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub timeline: TimelineArgs,
}

/// `pebble simulate`.
#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// The schedule, as `pebble plan -o` writes it.
    #[arg(long, value_name = "FILE")]
    pub schedule: PathBuf,
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub opts: ModelOpts,
    /// Which view of the model to simulate [default: the schedule's].
    #[arg(long, value_enum)]
    pub view: Option<ViewArg>,
    #[command(flatten)]
    pub budget: OptionalBudgetArgs,
    /// Host↔device bandwidth, bytes per second (or per time unit for chain files), both
    /// directions [default: the profile's link].
    #[arg(long, value_name = "BYTES_PER_S", value_parser = bandwidth_value, allow_hyphen_values = true)]
    pub bandwidth: Option<f64>,
    /// How device memory is counted: `none`, `caching` or `expandable` (as `plan`'s).
    #[arg(long, value_name = "MODEL", value_enum, default_value_t = AllocatorArg::None)]
    pub allocator: AllocatorArg,
    /// Print JSON instead of a summary.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub timeline: TimelineArgs,
}

/// `pebble maxbatch`.
#[derive(Debug, Clone, Args)]
#[group(id = "planner", required = true, multiple = false, args = ["solver", "policy"])]
pub struct MaxbatchArgs {
    /// A zoo model (see `pebble models`).
    #[arg(long, value_name = "NAME")]
    pub model: String,
    #[command(flatten)]
    pub opts: ModelOpts,
    /// Device memory for everything resident, static memory included: `80GB`, `16GiB` or
    /// plain bytes (not a percentage: store-all's peak grows with the batch).
    #[arg(long, value_name = "SIZE", value_parser = budget_value)]
    pub memory: BudgetSpec,
    /// A solver (see `pebble plan --help`).
    #[arg(long, value_name = "NAME")]
    pub solver: Option<String>,
    /// A run-time policy (`delta`, `dtr`, `lru`, `largest`), replayed in the simulator on
    /// the training graph.
    #[arg(long, value_name = "NAME")]
    pub policy: Option<String>,
    #[command(flatten)]
    pub solve: SolveArgs,
    /// The largest batch tried.
    #[arg(long, value_name = "N", default_value_t = 1 << 16)]
    pub max: usize,
    /// Then check the answer for real: train one step at the batch the simulation found
    /// (on `--device cpu|cuda`, the device pool capped at `--memory`, which is really
    /// allocated: keep it within the host's memory on the CPU), and bisect below it with
    /// real steps until one runs within `--memory` (on costs profiled on the device).
    #[arg(long)]
    pub run: bool,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    pub json: bool,
}

/// `pebble sweep`.
#[derive(Debug, Clone, Args)]
pub struct SweepArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub opts: ModelOpts,
    /// The solvers to compare, comma-separated [default: store-all, sequential, rotor,
    /// rockmate].
    #[arg(long, value_name = "A,B,C", value_delimiter = ',')]
    pub solvers: Option<Vec<String>>,
    /// Number of budgets, evenly spaced from the recompute-all peak to the store-all peak.
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub points: u32,
    /// Plot overhead against budget to this SVG file (with --devices: throughput against
    /// memory per device). An existing file is kept unless --force is given.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// What --svg plots: `overhead`, each solver's time overhead over store-all against
    /// the budget; or `throughput`, samples per second (batch / simulated step time)
    /// against each schedule's simulated peak memory, `sequential`'s schedules as separate
    /// crosses (Shilova's Fig. 2.5). Not with --devices (which plots throughput already).
    #[arg(
        long,
        value_name = "KIND",
        value_enum,
        default_value_t = SweepChart::Overhead,
        requires = "svg",
        conflicts_with = "devices"
    )]
    pub chart: SweepChart,
    /// Overwrite the --svg file if it exists.
    #[arg(long)]
    pub force: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Pipeline mode: spread the model over this many devices and sweep the memory of
    /// each, for pipeline solvers (see `pebble pipeline`); `--bandwidth` is then the link
    /// between two devices [default: the profile's interconnect].
    #[arg(long, value_name = "P")]
    pub devices: Option<usize>,
    #[command(flatten)]
    pub solve: SolveArgs,
}

/// `--chart` of `pebble sweep`: what its --svg plots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SweepChart {
    /// Time overhead over store-all against the budget.
    Overhead,
    /// Samples per second against the simulated peak memory.
    Throughput,
}

/// The model options of the executor's commands: `--device` names the hardware to run
/// on, `--profile` the machine the planner plans for, as in every other command.
#[derive(Debug, Clone, Args)]
pub struct RunModelOpts {
    /// A zoo model (see `pebble models`); `gpt`, `resnet` and `mlp` are small enough for a CPU.
    #[arg(long, value_name = "NAME")]
    pub model: String,
    #[command(flatten)]
    pub size: SizeOpts,
    /// Where to run: cpu (burn-flex) or cuda (burn-cuda; a binary built with `--features cuda`).
    #[arg(long, value_name = "cpu|cuda", default_value = "cpu")]
    pub device: String,
    /// The machine to plan for (op times, memory, links, runtime overhead): v100 (default),
    /// a100, h100, rtx3060, or a JSON profile file.
    #[arg(long, value_name = "PROFILE")]
    pub profile: Option<String>,
    /// Seed of the parameters, the synthetic batch and dropout.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl RunModelOpts {
    /// Where to run, and the cost profile. `--device v100` (the old spelling of
    /// `--profile v100`) still works for one release, with a warning, and runs on the CPU.
    pub fn device_and_profile(&self) -> Result<(DeviceArg, Option<String>), String> {
        match self.device.to_ascii_lowercase().as_str() {
            "cpu" => Ok((DeviceArg::Cpu, self.profile.clone())),
            "cuda" | "gpu" => Ok((DeviceArg::Cuda, self.profile.clone())),
            other if pebble_machine::Profile::lookup(other).is_ok() => {
                Ok((DeviceArg::Cpu, profile_flag(&self.profile, Some(&self.device))?))
            }
            _ => {
                Err(format!("--device: `{}` is not a device (cpu or cuda); cost profiles go in --profile", self.device))
            }
        }
    }
}

/// `--device` of the executor's commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceArg {
    /// burn-flex on the CPU.
    Cpu,
    /// burn-cuda on the first NVIDIA GPU (needs a binary built with `--features cuda`).
    Cuda,
}

/// `--optimizer` of `pebble train`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TrainOptimizerArg {
    /// Plain SGD.
    Sgd,
    /// Adam: AdamW without weight decay.
    Adam,
    /// AdamW (weight decay 0.01).
    Adamw,
}

/// `--costs` of `pebble train`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CostsArg {
    /// Profile every op on the device first, and plan on the measured costs.
    Profiled,
    /// Plan on the zoo's roofline times and declared temporaries.
    Analytic,
    /// Profile every op, then time each stage's forward and backward in store-all steps
    /// on the device, and plan on the ops' times scaled to those.
    Steps,
}

/// `pebble train`.
#[derive(Debug, Clone, Args)]
#[group(id = "train_planner", required = true, multiple = false, args = ["solver", "policy"])]
pub struct TrainArgs {
    #[command(flatten)]
    pub model: RunModelOpts,
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// The solver (see `pebble plan --help`).
    #[arg(long, value_name = "NAME")]
    pub solver: Option<String>,
    /// A run-time policy (`delta`, `dtr`, `lru`, `largest`) that decides inside each step,
    /// with no plan: each op runs as soon as the policy decides it, and what ran is logged
    /// and simulated.
    #[arg(long, value_name = "NAME")]
    pub policy: Option<String>,
    /// Training steps.
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub steps: u32,
    /// The optimizer (its state counts as static memory).
    #[arg(long, value_enum, default_value = "adamw")]
    pub optimizer: TrainOptimizerArg,
    /// Learning rate.
    #[arg(long, value_name = "LR", default_value_t = 1e-3, value_parser = positive_value, allow_hyphen_values = true)]
    pub lr: f64,
    /// Where the planner's op costs come from: `analytic` (the profile's roofline, as
    /// `plan` uses: the same flags give the same schedule), `profiled` (each op measured
    /// alone on the device first) or `steps` (profiled, then each stage timed in a few
    /// store-all steps on the device, the ops' times scaled to match).
    #[arg(long, value_enum, default_value = "analytic")]
    pub costs: CostsArg,
    /// The solver's options; `--bandwidth` also throttles the executor's host link.
    #[command(flatten)]
    pub solve: SolveArgs,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    pub json: bool,
}

/// `pebble profile`.
#[derive(Debug, Clone, Args)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub model: RunModelOpts,
    /// Which view to write.
    #[arg(long, value_enum, default_value = "graph")]
    pub view: ViewArg,
    /// Optimizer whose state the graph counts [default: adam].
    #[arg(long, value_enum)]
    pub optimizer: Option<OptimizerArg>,
    /// Where to write it (default: standard output). An existing file is kept unless
    /// --force is given.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Overwrite the --output file if it exists.
    #[arg(long)]
    pub force: bool,
}

/// `pebble bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: RunModelOpts,
    /// Steps per contender (the first is a warm-up for the step time).
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub steps: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn budget_value(text: &str) -> Result<BudgetSpec, String> {
    parse_budget(text)
}

fn slots_value(text: &str) -> Result<Slots, String> {
    if text.eq_ignore_ascii_case("exact") {
        return Ok(Slots::Exact);
    }
    match text.parse::<usize>() {
        Ok(n) if n > 0 => Ok(Slots::Count(n)),
        _ => Err(format!("`{text}` is not a positive slot count or `exact`")),
    }
}

fn positive_value(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("`{text}` is not a positive number")),
    }
}

/// A memory that may be unlimited (`inf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimit(pub Option<u64>);

fn size_or_inf(text: &str) -> Result<MemoryLimit, String> {
    if matches!(text.trim(), "inf" | "unlimited") {
        return Ok(MemoryLimit(None));
    }
    pebble_graph::units::parse_size(text).map(|b| MemoryLimit(Some(b)))
}

fn bandwidth_or_inf(text: &str) -> Result<f64, String> {
    if text.trim() == "inf" {
        return Ok(f64::INFINITY);
    }
    bandwidth_value(text)
}

fn bandwidth_value(text: &str) -> Result<f64, String> {
    let v = match text.trim().parse::<f64>() {
        Ok(v) => v,
        Err(_) => pebble_graph::units::parse_size(text)? as f64,
    };
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(format!("`{text}`: a bandwidth must be a positive number of bytes per second"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn values() {
        assert_eq!(slots_value("exact"), Ok(Slots::Exact));
        assert_eq!(slots_value("500"), Ok(Slots::Count(500)));
        assert!(slots_value("0").is_err());
        assert_eq!(bandwidth_value("12e9"), Ok(12e9));
        assert_eq!(bandwidth_value("12GB"), Ok(12e9));
        assert!(bandwidth_value("-1").is_err());
        assert!(positive_value("0").is_err());
    }
}

/// The experiments `pebble reproduce` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Experiment {
    /// Shilova's thesis, Ch. 4: offloading and rematerialization (pofo, autocapper,
    /// opportunist) against remat only (rotor) and offload only (offload-dp).
    Ch4,
    /// Beaumont et al. 2022, Table 1: weight offloading (greedy, Greedy*, L2L) against
    /// its MILP lower bound on GPT-2 and BERT-sized chains (a fixed grid: `--models`,
    /// `--batch` and `--image` are Ch. 4's).
    Weights,
    /// Zhao's thesis, Ch. 4: OffMate fine-tuning Llama2-7B on a 12 GB card (Table 4.2 and
    /// its ablations, Phi-2 and Llama2-13B, ZeRO-Offload, ZeRO-Infinity and paged Adam,
    /// the batch size OffMate picks, time against depth).
    Offmate,
    /// Shilova's thesis, Ch. 7: MadPipe against PipeDream's partitioning with 1F1B*, and
    /// GPipe, 1F1B, interleaved 1F1B, ZB-H1 and ZB-V, on P = 2..8 devices of 3 to 16 GB (a
    /// fixed grid: `--models`, `--batch` and `--image` are Ch. 4's).
    Ch7,
    /// Zhao's thesis, Ch. 3: HiRemate against Rockmate and Rotor on GPT-2 small and large,
    /// each cause of its old gap measured alone, and on U-Net, the Transformer,
    /// Inception-v3 and DenseNet-121 (a fixed grid; `--quick`: GPT-2 small only).
    Hiremate,
    /// The DELTA paper: its max-batch and memory-saved tables for ResNet-50 and ResNet-101
    /// on an A100 80 GB, under `delta`, `dtr` and their ablations, and under the static
    /// planners the paper never ran (rotor, pofo, Rockmate, HiRemate), with each one's step
    /// time at DELTA's batch (`--quick`: ResNet-50 only; `--ilp`: re-solve Rockmate's and
    /// HiRemate's recorded figures, about half an hour; a fixed grid: `--models`,
    /// `--batch` and `--image` are Ch. 4's).
    Delta,
}

impl ReproduceArgs {
    /// `--profile`, or the experiment's own machine.
    pub fn profile(&self) -> String {
        let default = match self.experiment {
            Experiment::Offmate => "rtx3060",
            Experiment::Delta => "a100",
            Experiment::Ch4 | Experiment::Weights | Experiment::Ch7 | Experiment::Hiremate => "v100",
        };
        self.profile.clone().unwrap_or_else(|| default.to_string())
    }
}

/// `pebble reproduce`.
#[derive(Debug, Clone, Args)]
pub struct ReproduceArgs {
    /// The experiment.
    #[arg(value_enum)]
    pub experiment: Experiment,
    /// Zoo models, comma-separated. `ch4` also takes chain files (`*.json`, in bytes and
    /// seconds, as `pebble graph --view chain` writes them), planned on `--profile`'s machine.
    #[arg(
        long,
        value_name = "A,B,C",
        value_delimiter = ',',
        default_value = "resnet50,resnet101,resnet152,densenet121,densenet169,inception_v3"
    )]
    pub models: Vec<String>,
    /// Batch size.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub batch: usize,
    /// Image side.
    #[arg(long, value_name = "PIXELS", default_value_t = 500)]
    pub image: usize,
    /// The machine to plan for [default: v100; offmate: rtx3060, the thesis's machine;
    /// delta: a100, the paper's].
    #[arg(long, value_name = "PROFILE")]
    pub profile: Option<String>,
    /// Where to write the JSON and the SVG charts.
    #[arg(long, value_name = "DIR", default_value = "docs")]
    pub out_dir: PathBuf,
    /// Fewer points. `ch4`: α ∈ {0.2, 0.5, 0.75}, β ∈ {12, 36} GB/s (the full run: α from
    /// 0.1 to 1 by tenths and 0.75, β ∈ {12, 18, 24, 36} GB/s); `ch7`: P ∈ {2, 4, 8}, four
    /// memories, 12 GB/s; `weights`: six of Table 1's rows, three bandwidths; `offmate`:
    /// Llama2-7B at 8 layers and Phi-2, fewer depths and batches; `hiremate`: GPT-2 small
    /// only; `delta`: ResNet-50 only.
    #[arg(long)]
    pub quick: bool,
    /// `ch7`: schedule MadPipe's allocation with the Ch. 6 ILP (10 s each) as well as by
    /// 1F1B*'s construction, keeping the better (slow: hundreds of ILPs). `delta`:
    /// re-solve Rockmate's and HiRemate's figures instead of showing the recorded ones.
    #[arg(long)]
    pub ilp: bool,
    /// Overwrite the output files if they exist.
    #[arg(long)]
    pub force: bool,
}
