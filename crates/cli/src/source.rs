//! What the flags mean: the problem a command works on (a chain file, a graph file, a
//! zoo model or an ONNX model), the view a solver gets of it, and budgets resolved against its store-all
//! peak. Every failure caused by the input is a [`BadInput`](crate::error::BadInput)
//! naming the flag and, through the library's own error, the field.

use std::path::{Path, PathBuf};

use anyhow::Context;
use pebble_graph::{partition, units::format_bytes, Chain, TrainingGraph};
use pebble_machine::{Machine, Profile};
use pebble_schedule::{Schedule, View};
use pebble_sim::{SimConfig, SimReport};
use pebble_solve::{baseline::store_all::simulate_store_all, Problem, Solver};
use pebble_zoo::{DType, Model, ModelOptions, Optimizer, Temporaries, ZooError};

use crate::error::bad;
use crate::flags::{DTypeArg, ModelOpts, ModelSource, OptimizerArg, SourceArgs};

/// Reads a whole file, naming the flag that gave its path.
pub fn read_file(path: &Path, flag: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path).map_err(|e| bad(format!("{flag} `{}`: cannot read it: {e}", path.display())))
}

/// Writes a whole file, naming the flag that gave its path.
fn write_file(path: &Path, flag: &str, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).map_err(|e| bad(format!("{flag} `{}`: cannot write it: {e}", path.display())))
}

/// Refuses, before any work, an output file that exists unless `force` (`--force`) says
/// to overwrite it.
pub fn check_new_file(path: &Path, flag: &str, force: bool) -> anyhow::Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(bad(format!("{flag} `{}`: is a directory, not a file", path.display()))),
        Ok(_) if !force => Err(exists(path, flag)),
        _ => Ok(()),
    }
}

/// The refusal to overwrite `path`.
fn exists(path: &Path, flag: &str) -> anyhow::Error {
    bad(format!("{flag} `{}`: the file exists; give --force to overwrite it, or another name", path.display()))
}

/// Writes a whole file that must not exist yet unless `force`, naming the flag that gave
/// its path (the file is created exclusively, so one that appeared meanwhile is kept too).
pub fn write_new_file(path: &Path, flag: &str, text: &str, force: bool) -> anyhow::Result<()> {
    use std::io::Write;
    check_new_file(path, flag, force)?;
    if force {
        return write_file(path, flag, text);
    }
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            exists(path, flag)
        } else {
            bad(format!("{flag} `{}`: cannot write it: {e}", path.display()))
        }
    })?;
    file.write_all(text.as_bytes()).map_err(|e| bad(format!("{flag} `{}`: cannot write it: {e}", path.display())))
}

/// Reads a schedule file (`--schedule`).
pub fn read_schedule(path: &Path) -> anyhow::Result<Schedule> {
    let text = read_file(path, "--schedule")?;
    Schedule::from_json(&text).map_err(|e| bad(format!("--schedule `{}`: {e}", path.display())))
}

/// The solver called `name`, or a bad-input error listing the known ones.
pub fn find_solver(name: &str, flag: &str) -> anyhow::Result<&'static dyn Solver> {
    pebble_solve::solver(name).map_err(|e| bad(format!("{flag}: {e}")))
}

/// The planner `--solver` or `--policy` names (clap lets one through), and whether it is
/// a run-time policy.
pub fn solver_or_policy<'a>(solver: &'a Option<String>, policy: &'a Option<String>) -> anyhow::Result<(&'a str, bool)> {
    match (solver, policy) {
        (Some(s), _) => find_solver(s, "--solver").map(|_| (s.as_str(), false)),
        (None, Some(p)) => {
            pebble_solve::policy::check_name(p).map_err(|e| bad(format!("--policy: {e}")))?;
            Ok((p.as_str(), true))
        }
        (None, None) => Err(bad("give --solver or --policy")),
    }
}

/// The profile `--profile` (or the old `--device`) names, looked up; `None` if not given.
pub fn profile(opts: &ModelOpts) -> anyhow::Result<Option<Profile>> {
    let flag = if opts.profile.is_some() { "--profile" } else { "--device" };
    match opts.profile_name().map_err(bad)? {
        Some(name) => lookup_profile(flag, &name).map(Some),
        None => Ok(None),
    }
}

/// The built-in profile or JSON file `name` that `flag` gives; bad input (exit code 2)
/// naming the flag, and the file where one was read, if it cannot be had.
pub fn lookup_profile(flag: &str, name: &str) -> anyhow::Result<Profile> {
    Profile::lookup(name).map_err(|e| match e {
        pebble_machine::ProfileError::Unknown { .. } => bad(format!("{flag}: {e}")),
        _ => bad(format!("{flag} `{name}`: {e}")),
    })
}

/// Resolves the model options against the defaults; the profile is looked up here.
pub fn model_options(opts: &ModelOpts) -> anyhow::Result<ModelOptions> {
    let profile = profile(opts)?.unwrap_or_else(|| ModelOptions::default().profile);
    Ok(ModelOptions {
        batch: opts.size.fixed_batch().map_err(bad)?,
        image: opts.size.image,
        seq: opts.size.seq,
        layers: opts.size.layers,
        width: opts.size.width,
        heads: opts.size.heads,
        dtype: match opts.dtype {
            Some(DTypeArg::Bf16) => DType::Bf16,
            Some(DTypeArg::F32) | None => DType::F32,
        },
        optimizer: match opts.optimizer {
            Some(OptimizerArg::Sgd) => Optimizer::Sgd,
            Some(OptimizerArg::Momentum) => Optimizer::Momentum,
            Some(OptimizerArg::Adam) | None => Optimizer::Adam,
        },
        // The zoo checks both (`--master-weights` needs bf16, `--trainable` a fraction in
        // (0, 1]) when it builds the model: a bad value is a `BadOption` naming the flag.
        master_weights: opts.master_weights,
        trainable: opts.trainable,
        profile,
        temporaries: opts.for_cpu_executor().then_some(Temporaries::BurnFlex),
    })
}

/// Builds the model `--model` or `--onnx` names.
pub fn load_model(source: ModelSource<'_>, opts: &ModelOpts) -> anyhow::Result<(Model, ModelOptions)> {
    match source {
        ModelSource::Zoo(name) => build_model(name, opts),
        ModelSource::Onnx(path) => import_onnx(path, opts),
    }
}

/// Builds a zoo model. Unknown names, options the model does not take and shapes it
/// cannot use are bad input; a lowered graph that fails validation is a zoo bug.
pub fn build_model(name: &str, opts: &ModelOpts) -> anyhow::Result<(Model, ModelOptions)> {
    let options = model_options(opts)?;
    match pebble_zoo::build(name, &options) {
        Ok(model) => Ok((model, options)),
        Err(e @ ZooError::Graph { .. }) => Err(anyhow::Error::new(e).context(format!("--model `{name}`"))),
        // These name the model and the option already.
        Err(e @ (ZooError::UnknownModel { .. } | ZooError::BadOption { .. } | ZooError::TooLarge { .. })) => {
            Err(bad(format!("--model: {e}")))
        }
        Err(e) => Err(bad(format!("--model `{name}`: {e}"))),
    }
}

/// Imports an ONNX file (`--onnx`) as a model with both views. A file that cannot be read
/// or imported, and the zoo's size options, are bad input naming the file or the flag.
pub fn import_onnx(path: &Path, opts: &ModelOpts) -> anyhow::Result<(Model, ModelOptions)> {
    if let Some(flag) = opts.zoo_only() {
        return Err(bad(format!(
            "{flag} does not apply to --onnx: an ONNX model has its own sizes (--batch, --dtype, --optimizer, \
             --master-weights, --trainable and --profile apply)"
        )));
    }
    let options = model_options(opts)?;
    let import = pebble_onnx::ImportOptions { batch: options.batch, dtype: options.dtype };
    let network =
        pebble_onnx::import_file(path, &import).map_err(|e| bad(format!("--onnx `{}`: {e}", path.display())))?;
    match pebble_onnx::imported_model(network, &path.display().to_string(), &options) {
        Ok(model) => Ok((model, options)),
        Err(e @ ZooError::Graph { .. }) => Err(anyhow::Error::new(e).context(format!("--onnx `{}`", path.display()))),
        Err(e) => Err(bad(format!("--onnx `{}`: {e}", path.display()))),
    }
}

/// How sizes and times of a problem read: bytes and seconds for models and graphs,
/// plain units for hand-written chains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Units {
    /// Bytes and seconds.
    Bytes,
    /// The chain file's own units.
    Plain,
}

impl Units {
    /// A size, e.g. `1.500 GiB` or `1536`.
    pub fn size(self, v: u64) -> String {
        match self {
            Units::Bytes => format_bytes(v),
            Units::Plain => v.to_string(),
        }
    }

    /// A duration, e.g. `0.1234 s` or `12.5`.
    pub fn time(self, t: f64) -> String {
        match self {
            Units::Bytes => format!("{} s", significant(t)),
            Units::Plain => significant(t),
        }
    }
}

/// Four significant digits, without an exponent for everyday magnitudes.
pub fn significant(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let digits = (3 - v.abs().log10().floor() as i32).clamp(0, 12) as usize;
    format!("{v:.digits$}")
}

/// The problem a command works on.
pub enum Source {
    /// `--chain FILE`.
    Chain {
        /// The file.
        path: PathBuf,
        /// Its chain.
        chain: Chain,
    },
    /// `--graph FILE`.
    Graph {
        /// The file.
        path: PathBuf,
        /// Its graph.
        graph: TrainingGraph,
    },
    /// `--model NAME` or `--onnx FILE`.
    Model {
        /// The built model.
        model: Box<Model>,
        /// The options it was built with.
        options: ModelOptions,
    },
}

/// One view of a source, owned, ready to hand to a solver or the simulator.
pub enum Subject {
    /// A chain.
    Chain(Chain),
    /// A training graph.
    Graph(TrainingGraph),
}

impl Subject {
    /// The solver's problem.
    pub fn problem(&self) -> Problem<'_> {
        match self {
            Subject::Chain(c) => Problem::Chain(c),
            Subject::Graph(g) => Problem::Graph(g),
        }
    }

    /// The view.
    pub fn view(&self) -> View {
        self.problem().view()
    }

    /// Memory resident for the whole step: the chain's `static_bytes` (which also holds
    /// inputs only the loss reads, such as labels) or the graph's static data.
    pub fn static_bytes(&self) -> u64 {
        match self {
            Subject::Chain(c) => c.static_bytes,
            Subject::Graph(g) => g.static_bytes(),
        }
    }

    /// The store-all schedule simulated without a budget on `machine`: the reference peak
    /// and time.
    pub fn store_all(&self, machine: &Machine) -> anyhow::Result<SimReport> {
        let problem = self.problem();
        simulate_store_all(problem, &SimConfig::on(*machine)).context("the simulator rejects the store-all schedule")
    }
}

/// The name of a view as the CLI spells it.
pub fn view_name(view: View) -> &'static str {
    match view {
        View::Chain => "chain",
        View::Graph => "graph",
        View::Pipeline => "pipeline",
    }
}

impl Source {
    /// Loads the chain file, graph file or model the flags name, and the machine to plan
    /// for: the model's profile, or for a chain or graph file the one `--profile` names
    /// (the abstract machine, with no runtime overhead, when none is given).
    pub fn load(args: &SourceArgs, opts: &ModelOpts) -> anyhow::Result<(Source, Machine)> {
        let source = Self::load_source(args, opts)?;
        let machine = match &source {
            Source::Model { options, .. } => options.profile.machine,
            _ => profile(opts)?.map(|p| p.machine).unwrap_or_default(),
        };
        Ok((source, machine))
    }

    fn load_source(args: &SourceArgs, opts: &ModelOpts) -> anyhow::Result<Source> {
        if args.model_source().is_none() {
            if let Some(flag) = opts.given().filter(|f| !matches!(*f, "--profile" | "--device")) {
                return Err(bad(format!(
                    "{flag} is a model option: it needs --model or --onnx, not a chain or graph file"
                )));
            }
        }
        if let Some(path) = &args.chain {
            let chain = Chain::from_json(&read_file(path, "--chain")?)
                .map_err(|e| bad(format!("--chain `{}`: {e}", path.display())))?;
            Ok(Source::Chain { path: path.clone(), chain })
        } else if let Some(path) = &args.graph {
            let graph = TrainingGraph::from_json(&read_file(path, "--graph")?)
                .map_err(|e| bad(format!("--graph `{}`: {e}", path.display())))?;
            Ok(Source::Graph { path: path.clone(), graph })
        } else if let Some(model) = args.model_source() {
            let (model, options) = load_model(model, opts)?;
            Ok(Source::Model { model: Box::new(model), options })
        } else {
            // clap's group makes one of the four required.
            Err(bad("give one of --chain, --graph, --model or --onnx"))
        }
    }

    /// Parameters, their gradients and optimizer states: what `--activation-budget`
    /// leaves out. A model knows them exactly from its graph; a chain file only has its
    /// `static_bytes`.
    pub fn param_state_bytes(&self, subject: &Subject) -> u64 {
        match self {
            Source::Model { model, .. } => model.graph.static_bytes(),
            _ => subject.static_bytes(),
        }
    }

    /// How sizes and times read.
    pub fn units(&self) -> Units {
        match self {
            Source::Chain { .. } => Units::Plain,
            _ => Units::Bytes,
        }
    }

    /// A title: `resnet50, batch 32, v100`, with each size and training option given away
    /// from the model's default (`llama2-7b, 8 layers, bf16, batch 4, rtx3060`), or the
    /// file's name.
    pub fn label(&self) -> String {
        match self {
            Source::Chain { path, chain } => match &chain.name {
                Some(n) => format!("chain {n}"),
                None => format!("chain {}", path.display()),
            },
            Source::Graph { path, graph } => match &graph.name {
                Some(n) => format!("graph {n}"),
                None => format!("graph {}", path.display()),
            },
            Source::Model { model, options } => {
                let (spec, dims) = (model.spec, &model.dims);
                let count = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
                let sizes = [
                    (spec.layers, dims.layers, count(dims.layers, "layer")),
                    (spec.seq, dims.seq, format!("sequence {}", dims.seq)),
                    (spec.image, dims.image, format!("image {}", dims.image)),
                    (spec.width, dims.width, format!("width {}", dims.width)),
                    (spec.heads, dims.heads, count(dims.heads, "head")),
                ];
                let mut parts = vec![spec.name.to_string()];
                parts.extend(sizes.into_iter().filter(|(d, v, _)| d.is_some_and(|d| d != *v)).map(|(.., text)| text));
                if options.dtype != DType::F32 {
                    parts.push(options.dtype.name().into());
                }
                if options.master_weights {
                    parts.push("fp32 master weights".into());
                }
                if let Some(share) = options.trainable {
                    let percent = format!("{:.3}", share * 100.0);
                    parts.push(format!("{}% trainable", percent.trim_end_matches('0').trim_end_matches('.')));
                }
                if options.optimizer != Optimizer::default() {
                    parts.push(options.optimizer.name().into());
                }
                parts.push(format!("batch {}", dims.batch));
                parts.push(options.profile.name.clone());
                parts.join(", ")
            }
        }
    }

    /// The source and the size of `subject`, in words: what `plan` records as a schedule's
    /// `planned_for`, and what `simulate` compares it with.
    pub fn describe(&self, subject: &Subject) -> String {
        let size = match subject {
            Subject::Chain(c) => format!("chain of {} stages", c.len()),
            Subject::Graph(g) => format!("graph of {} compute nodes", g.compute.len()),
        };
        format!("{} ({size})", self.label())
    }

    /// The source seen in `view`: a chain file only as a chain; a graph file as a graph
    /// or, through its partition, as a chain.
    pub fn view(&self, view: View) -> anyhow::Result<Subject> {
        match (self, view) {
            (Source::Chain { chain, .. }, View::Chain) => Ok(Subject::Chain(chain.clone())),
            (Source::Chain { path, .. }, View::Graph) => Err(bad(format!(
                "--chain `{}`: a chain file has no graph view (give --graph or --model)",
                path.display()
            ))),
            (Source::Graph { graph, .. }, View::Graph) => Ok(Subject::Graph(graph.clone())),
            (Source::Graph { path, graph }, View::Chain) => partition::to_chain(graph)
                .map(Subject::Chain)
                .map_err(|e| bad(format!("--graph `{}`: no chain view: {e}", path.display()))),
            (Source::Model { model, .. }, View::Chain) => Ok(Subject::Chain(model.chain.clone())),
            (Source::Model { model, .. }, View::Graph) => Ok(Subject::Graph(model.graph.clone())),
            (_, View::Pipeline) => Err(bad("a pipeline schedule runs under `pebble pipeline`".to_string())),
        }
    }

    /// The view `solver` plans: for a model, the first of the solver's views; for a file,
    /// the file's own view if the solver plans it, else a graph file's chain.
    pub fn view_for(&self, solver: &dyn Solver) -> anyhow::Result<Subject> {
        let views = solver.views();
        let view = match self {
            Source::Model { .. } => views.first().copied(),
            Source::Chain { .. } => views.iter().copied().find(|v| *v == View::Chain),
            Source::Graph { .. } => {
                if views.contains(&View::Graph) {
                    Some(View::Graph)
                } else {
                    views.iter().copied().find(|v| *v == View::Chain)
                }
            }
        };
        match view {
            Some(v) => self.view(v),
            None => {
                let planned: Vec<&str> = views.iter().map(|v| view_name(*v)).collect();
                Err(bad(format!(
                    "--solver `{}` plans only the {} view, which {} does not have",
                    solver.name(),
                    planned.join(" and "),
                    match self {
                        Source::Chain { .. } => "a chain file",
                        Source::Graph { .. } => "a graph file",
                        Source::Model { .. } => "this model",
                    }
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn significant_digits() {
        assert_eq!(significant(0.123456), "0.1235");
        assert_eq!(significant(12.5), "12.50");
        assert_eq!(significant(1234.4), "1234");
        assert_eq!(significant(0.0), "0");
    }
}
