//! The seed corpus: valid files of every kind `pebble` reads, most of them written by
//! the `pebble` binary itself (`graph -o`, `plan -o`, `pipeline --export pebble -o`),
//! each with the problem it was planned for, so that a schedule can be checked against
//! its chain or graph as `pebble simulate` does.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A chain (`--chain`).
    Chain,
    /// A training graph (`--graph`).
    Graph,
    /// A chain or graph schedule, format 2 or 1 (`--schedule`).
    Schedule,
    /// A pipeline schedule, format 2 (`--schedule` of a pipeline).
    Pipeline,
    /// A machine profile (`--profile FILE`).
    Profile,
    /// An ONNX model (`--onnx`).
    Onnx,
}

pub const KINDS: [Kind; 6] = [Kind::Chain, Kind::Graph, Kind::Schedule, Kind::Pipeline, Kind::Profile, Kind::Onnx];

/// One problem the schedules were planned for: a chain file, a graph file (not for a
/// hand-written chain), and the flags that name it.
#[derive(Debug, Clone)]
pub struct Family {
    pub name: &'static str,
    pub chain: PathBuf,
    pub graph: Option<PathBuf>,
    /// `--model ...` or `--chain FILE`.
    pub flags: Vec<String>,
}

/// One valid file.
#[derive(Debug, Clone)]
pub struct Seed {
    pub kind: Kind,
    pub path: PathBuf,
    pub bytes: Vec<u8>,
    /// Its problem, for schedules, chains and graphs ([`Corpus::families`]).
    pub family: Option<usize>,
}

/// Every seed, written under `dir`.
pub struct Corpus {
    pub dir: PathBuf,
    pub families: Vec<Family>,
    pub seeds: Vec<Seed>,
}

impl Corpus {
    /// The seeds of one kind.
    pub fn of(&self, kind: Kind) -> Vec<&Seed> {
        self.seeds.iter().filter(|s| s.kind == kind).collect()
    }
}

/// The `pebble` binary under test.
pub fn pebble_bin() -> &'static str {
    env!("CARGO_BIN_EXE_pebble")
}

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(args: &[String]) -> bool {
    let out = Command::new(pebble_bin()).args(args).output().expect("the binary runs");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("panicked"),
        "pebble {args:?} panicked writing a seed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.status.success()
}

fn strings(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

/// The zoo models of the corpus: small enough that every command on them is quick.
pub const MODELS: [(&str, &[&str]); 3] = [
    ("gpt", &["--model", "gpt", "--layers", "2", "--width", "32", "--heads", "2", "--seq", "64", "--batch", "2"]),
    ("mlp", &["--model", "mlp", "--layers", "3", "--width", "16", "--batch", "2"]),
    ("resnet", &["--model", "resnet", "--layers", "1", "--width", "8", "--image", "16", "--batch", "2"]),
];

const CHAIN_SOLVERS: [&str; 6] = ["rotor", "pofo", "offload-dp", "opportunist", "weight-offload", "zero-offload"];
const GRAPH_SOLVERS: [&str; 3] = ["dtr", "delta", "pytorch-mincut"];
const PIPE_SOLVERS: [&str; 7] = ["1f1b", "gpipe", "zb-h1", "interleaved-1f1b", "pipedream", "madpipe", "zb-v"];

/// Writes the corpus into a fresh directory under the target's scratch space (`tag`
/// keeps two test binaries apart).
pub fn corpus(tag: &str) -> Corpus {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fuzz-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let mut families = vec![Family {
        name: "toy",
        chain: root().join("crates/cli/tests/fixtures/chain.json"),
        graph: None,
        flags: strings(&["--chain", &root().join("crates/cli/tests/fixtures/chain.json").to_string_lossy()]),
    }];
    for (name, flags) in MODELS {
        let flags = strings(flags);
        let chain = dir.join(format!("{name}.chain.json"));
        let graph = dir.join(format!("{name}.graph.json"));
        let write = |view: &str, out: &Path| {
            let args = [strings(&["graph", "--view", view, "-o", &out.to_string_lossy()]), flags.clone()].concat();
            assert!(run(&args), "pebble {args:?} failed");
        };
        write("chain", &chain);
        write("graph", &graph);
        families.push(Family { name, chain, graph: Some(graph), flags });
    }
    let mut seeds = Vec::new();
    let mut add = |kind, path: PathBuf, family| {
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        seeds.push(Seed { kind, path, bytes, family });
    };
    for (f, family) in families.iter().enumerate() {
        add(Kind::Chain, family.chain.clone(), Some(f));
        if let Some(g) = &family.graph {
            add(Kind::Graph, g.clone(), Some(f));
        }
        let budget = if family.graph.is_some() { ["--activation-budget", "70%"] } else { ["--budget", "32"] };
        let graph_solvers: &[&str] = if family.graph.is_some() { &GRAPH_SOLVERS } else { &[] };
        for solver in CHAIN_SOLVERS.iter().chain(graph_solvers) {
            let out = dir.join(format!("{}.{solver}.json", family.name));
            let args = [
                strings(&["plan", "--solver", solver, "-o", &out.to_string_lossy()]),
                strings(&budget),
                family.flags.clone(),
            ]
            .concat();
            if run(&args) {
                add(Kind::Schedule, out.clone(), Some(f));
                // The same in format 1, which still loads.
                let text = std::fs::read_to_string(&out).expect("just written");
                let v1 = dir.join(format!("{}.{solver}.v1.json", family.name));
                std::fs::write(&v1, text.replacen("\"version\": 2", "\"version\": 1", 1)).expect("scratch space");
                add(Kind::Schedule, v1, Some(f));
            }
        }
        for solver in PIPE_SOLVERS {
            let out = dir.join(format!("{}.pipe.{solver}.json", family.name));
            let args = [
                strings(&["pipeline", "--solver", solver, "--devices", "2", "--memory", "inf", "--export", "pebble"]),
                strings(&["-o", &out.to_string_lossy()]),
                family.flags.clone(),
            ]
            .concat();
            if run(&args) {
                add(Kind::Pipeline, out, Some(f));
            }
        }
    }
    for profile in pebble_machine::Profile::builtin() {
        let path = dir.join(format!("{}.profile.json", profile.name));
        std::fs::write(&path, profile.to_json()).expect("scratch space");
        add(Kind::Profile, path, None);
    }
    let cnn = dir.join("small_cnn.onnx");
    std::fs::write(&cnn, super::proto::small_cnn()).expect("scratch space");
    add(Kind::Onnx, cnn, None);
    // The light models of the ONNX test suite, where fetched (`scripts/fetch-onnx-models.sh`).
    for name in ["bvlc_alexnet", "zfnet512", "vgg19", "squeezenet"] {
        let path = root().join(format!("models/onnx/light_{name}.onnx"));
        if path.exists() {
            add(Kind::Onnx, path, None);
        }
    }
    for kind in KINDS {
        assert!(seeds.iter().any(|s| s.kind == kind), "no seed of {kind:?}");
    }
    Corpus { dir, families, seeds }
}
