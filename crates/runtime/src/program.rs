//! A network prepared for execution: its ops grouped into the chain's stages, what
//! crosses each cut, and what each stage's backward reads. The grouping is the one
//! [`pebble_graph::partition::to_chain`] uses on the lowered graph, so that a chain
//! schedule means the same thing to the executor as to the simulator.

use std::collections::{HashMap, HashSet};

use pebble_zoo::ops::Saved;
use pebble_zoo::{Network, TensorId};

/// A tensor a stage's forward keeps for its backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// A forward tensor.
    Tensor(TensorId),
    /// The `j`-th saved extra of op `op` (a mask, statistics, attention weights).
    Extra(usize, usize),
}

/// Where a saved tensor of an op's backward comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The stage's input boundary `a_s`.
    Boundary(TensorId),
    /// The stage's saved set `ā_{s+1}` (which includes `a_{s+1}`).
    Saved(Key),
    /// A step input that no stage's forward reads first (labels): always resident.
    Static(TensorId),
}

/// One chain stage.
#[derive(Debug, Clone, Default)]
pub struct Stage {
    /// Its ops, in execution order (views run in the stage of their first reader).
    pub ops: Vec<usize>,
    /// For each tensor the forward may drop: the position in `ops` after which it is dead.
    pub last_use: HashMap<TensorId, usize>,
    /// What `F_all` keeps beyond the output boundary: tensors and extras its backward reads.
    pub saved: Vec<Key>,
    /// For each op of the stage whose backward runs (in `ops`' order): the sources of
    /// its declared saved tensors.
    pub backward_reads: HashMap<usize, Vec<Source>>,
}

/// A network ready to run chain and graph schedules.
#[derive(Debug, Clone)]
pub struct Program {
    /// The network.
    pub net: Network,
    /// The chain's stages `0..L`; stage `L` holds the views before the loss, then the loss.
    pub stages: Vec<Stage>,
    /// `boundary[i]`: the tensors crossing cut `i` (`a_i`), for `i` in `0..=L`.
    pub boundary: Vec<Vec<TensorId>>,
    /// Step inputs not read by stage 0 (labels): resident for the whole step.
    pub static_inputs: Vec<TensorId>,
    /// The stage each op runs in.
    pub stage_of: Vec<usize>,
    /// `weights[i]`: the parameters only stage `i` reads (the chain's `Weight(i)`, whose
    /// gradients and optimizer states are its `WeightGrad(i)` and `OptState(i)`), in
    /// order. A parameter several stages read (a tied embedding) is in none: it stays
    /// resident with its gradient and state, as the chain leaves them unnamed.
    pub weights: Vec<Vec<usize>>,
    /// The stage whose backward updates each parameter under the fused update: the first
    /// stage that reads it, whose backward adds the last contribution to its gradient
    /// (`None` for a parameter no op reads).
    pub update_stage: Vec<Option<usize>>,
    /// The stages that read each parameter, in order.
    pub readers: Vec<Vec<usize>>,
}

impl Program {
    /// Prepares `net`.
    pub fn new(net: Network) -> Program {
        let l = net.stages();
        let n_ops = net.ops.len();
        let loss = n_ops - 1;
        // Readers of each tensor.
        let mut readers: Vec<Vec<usize>> = vec![Vec::new(); net.tensors.len()];
        for (o, op) in net.ops.iter().enumerate() {
            for &t in &op.inputs {
                readers[t].push(o);
            }
        }
        // Stage of each op: real ops keep theirs, the loss is L, a view runs where its
        // first (transitive) reader runs.
        let mut stage_of = vec![usize::MAX; n_ops];
        stage_of[loss] = l;
        for o in (0..n_ops).rev() {
            let op = &net.ops[o];
            if o == loss {
                continue;
            }
            if !op.decl.view {
                stage_of[o] = op.stage.min(l.saturating_sub(1));
            } else {
                stage_of[o] = readers[op.output].iter().map(|&r| stage_of[r]).min().unwrap_or(l);
            }
        }
        // Views whose reader runs before them cannot happen: a reader comes later in the
        // op order, and its stage is at least the view's own.
        let mut stages: Vec<Stage> = vec![Stage::default(); l + 1];
        for o in 0..n_ops {
            stages[stage_of[o]].ops.push(o);
        }
        let producer_stage = |t: TensorId| net.tensors[t].producer.map(|p| stage_of[p]);
        let reader_stages = |t: TensorId| readers[t].iter().map(|&r| stage_of[r]);
        // Boundaries.
        let mut boundary: Vec<Vec<TensorId>> = vec![Vec::new(); l + 1];
        let mut static_inputs = Vec::new();
        for t in 0..net.tensors.len() {
            let Some(last) = reader_stages(t).max() else { continue };
            match producer_stage(t) {
                None => {
                    if reader_stages(t).min() == Some(0) {
                        for b in boundary.iter_mut().take(last + 1) {
                            b.push(t);
                        }
                    } else {
                        static_inputs.push(t);
                    }
                }
                Some(p) => {
                    for b in boundary.iter_mut().take(last + 1).skip(p + 1) {
                        b.push(t);
                    }
                }
            }
        }
        // What each stage's backward reads, and where from.
        for s in 0..l {
            let in_boundary: HashSet<TensorId> = boundary[s].iter().copied().collect();
            let mut saved: Vec<Key> = Vec::new();
            let mut reads = HashMap::new();
            for &o in &stages[s].ops {
                let op = &net.ops[o];
                if !net.tensors[op.output].requires_grad {
                    continue;
                }
                let mut extra = 0;
                let mut sources = Vec::new();
                for item in &op.decl.saved {
                    let source = match item {
                        Saved::Input(k) => tensor_source(&net, op.inputs[*k], &in_boundary, &static_inputs),
                        Saved::Output => Source::Saved(Key::Tensor(op.output)),
                        Saved::Extra { .. } => {
                            extra += 1;
                            Source::Saved(Key::Extra(o, extra - 1))
                        }
                    };
                    if let Source::Saved(k) = source {
                        if !saved.contains(&k) {
                            saved.push(k);
                        }
                    }
                    sources.push(source);
                }
                reads.insert(o, sources);
            }
            // The output boundary is part of ā_{s+1} already.
            saved.retain(|k| !matches!(k, Key::Tensor(t) if boundary[s + 1].contains(t)));
            stages[s].saved = saved;
            stages[s].backward_reads = reads;
        }
        // Last forward use of each tensor within its stage.
        for stage in stages.iter_mut() {
            let mut last = HashMap::new();
            for (pos, &o) in stage.ops.iter().enumerate() {
                for &t in &net.ops[o].inputs {
                    last.insert(t, pos);
                }
                last.entry(net.ops[o].output).or_insert(pos);
            }
            stage.last_use = last;
        }
        // The parameters of each stage, and who updates them.
        let mut reader_stages: Vec<Vec<usize>> = vec![Vec::new(); net.params.len()];
        for (o, op) in net.ops.iter().enumerate() {
            for &p in &op.params {
                if !reader_stages[p].contains(&stage_of[o]) {
                    reader_stages[p].push(stage_of[o]);
                }
            }
        }
        let mut weights: Vec<Vec<usize>> = vec![Vec::new(); l];
        for (p, readers) in reader_stages.iter().enumerate() {
            if let [s] = readers[..] {
                if s < l {
                    weights[s].push(p);
                }
            }
        }
        reader_stages.iter_mut().for_each(|r| r.sort_unstable());
        let update_stage = reader_stages.iter().map(|r| r.first().copied()).collect();
        Program { net, stages, boundary, static_inputs, stage_of, weights, update_stage, readers: reader_stages }
    }

    /// Number of chain stages `L`.
    pub fn len(&self) -> usize {
        self.stages.len() - 1
    }

    /// The stage that owns parameter `q`'s gradient and optimizer state: its one reader
    /// (`None` for a tied parameter, read by several stages).
    pub fn owned_by(&self, q: usize) -> Option<usize> {
        match self.readers[q][..] {
            [s] if s < self.len() => Some(s),
            _ => None,
        }
    }

    /// Whether the chain is empty (never, for a network with a loss).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn tensor_source(net: &Network, t: TensorId, in_boundary: &HashSet<TensorId>, statics: &[TensorId]) -> Source {
    if in_boundary.contains(&t) {
        Source::Boundary(t)
    } else if net.tensors[t].producer.is_none() && statics.contains(&t) {
        Source::Static(t)
    } else {
        Source::Saved(Key::Tensor(t))
    }
}
