//! Turning a partitioned training graph into a chain (Rotor's view of a network as a
//! sequence of blocks, Shilova §2.1: "any network that can be sequentialized into a
//! chain of arbitrary sub-DAG blocks fits this model").
//!
//! The partition is read from [`ComputeNode::stage`]: forward and backward nodes of
//! block `i` carry `stage = Some(i)`. For each cut between blocks, `x` is the total
//! size of the activations that cross it, so a block whose input is several tensors
//! (a skip connection, a U-Net level) is still one stage. Tensors that cross several
//! cuts count at each: the chain view is conservative for non-sequential graphs.

use crate::{Chain, ComputeKind, DataKind, GraphError, TrainingGraph};

/// How long the executor of a chain plan keeps what a block's nodes make, within a chain
/// step: what `ftmp`, `btmp` and `xbar` must cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Retention {
    /// Each value is freed after its last reader in the step, unless the chain keeps it:
    /// `F_all` keeps what a backward reads (autograd's saved tensors), as the runtime's
    /// executor does.
    #[default]
    LastUse,
    /// Each value a step makes stays until the step ends (then the step frees all it made
    /// but what the chain keeps), and `F_all` keeps everything its block's forward makes,
    /// read by a backward or not, until its `ā` is freed: a chain plan expanded to graph
    /// ops stage by stage, the frees after each chain step (pebble.torch's `chain.py`).
    /// The step's inputs, which the caller holds (no plan can release them), stay out of
    /// `x`, in `static_bytes`: a chain plan cannot count on offloading or freeing `a_0`.
    Step,
}

/// Builds the chain of a graph whose forward and backward nodes carry a stage, for an
/// executor that frees each value after its last use ([`Retention::LastUse`]).
pub fn to_chain(g: &TrainingGraph) -> Result<Chain, GraphError> {
    to_chain_with(g, Retention::LastUse)
}

/// Builds the chain of a graph whose forward and backward nodes carry a stage.
///
/// * `ftime[i]`, `btime[i]`: sums over the nodes of block `i`; `btime[L]` is the loss.
/// * `x[i]`: activations produced before block `i` (or inputs) and read by block `i` or later.
/// * `xbar[i+1]`: what block `i`'s forward produces that a backward reads (with
///   [`Retention::Step`], all it produces), plus `x[i+1]`.
/// * `ftmp`, `btmp`: the block's internal peak above the chain model's own accounting,
///   found by replaying the block's nodes in order, freeing as `retention` says. `ftmp`
///   covers the forward with grad (above `xbar[i+1]`) and, with [`Retention::Step`],
///   without grad too (its `Saved` outputs not made, above `x[i+1]`).
/// * `w[i]`, `g[i]`, `o[i]`: the parameters only block `i` reads, their gradients and
///   optimizer states. A parameter several blocks read (a tied embedding) is named by
///   none: it stays resident with its gradient and state, in `static_bytes`, so that
///   what the chain names is counted once. Inputs that no block reads (labels) and
///   static data go to `static_bytes`.
pub fn to_chain_with(g: &TrainingGraph, retention: Retention) -> Result<Chain, GraphError> {
    g.validate()?;
    let l = block_count(g)?;
    let loss = g.loss().expect("validated");
    let uses = Uses::of(g, l)?;
    let mut chain = Chain {
        name: g.name.clone(),
        ftime: vec![0.0; l],
        btime: vec![0.0; l + 1],
        x: vec![0; l + 1],
        xbar: vec![0; l + 1],
        ftmp: vec![0; l],
        btmp: vec![0; l + 1],
        w: Some(vec![0; l]),
        g: Some(vec![0; l]),
        o: Some(vec![0; l]),
        utmp: Some(vec![0; l]),
        static_bytes: g.static_bytes(),
    };
    activation_sizes(g, &uses, l, retention, &mut chain);
    block_times(g, l, &mut chain)?;
    param_sizes(g, &mut chain)?;
    temporaries(g, &uses, l, retention, &mut chain);
    chain.btmp[l] = g.compute[loss].tmp;
    chain.validate()?;
    Ok(chain)
}

/// The block of compute node `c` (`kind` names what it is, for the error).
fn stage_of(g: &TrainingGraph, c: usize, kind: &str) -> Result<usize, GraphError> {
    g.compute[c].stage.ok_or_else(|| {
        GraphError::Invalid(format!(
            "compute[{c}] `{}` ({kind}) has no stage: the graph is not partitioned",
            g.compute[c].name
        ))
    })
}

/// The number of blocks `L`: one more than the last stage of a forward or backward node.
/// A stage beyond the node count would leave blocks without nodes (and a stage of 2^64 − 1
/// once sized the chain's vectors at 2^64 entries).
fn block_count(g: &TrainingGraph) -> Result<usize, GraphError> {
    let mut l = 0;
    for (c, node) in g.compute.iter().enumerate() {
        if node.kind != ComputeKind::Loss {
            let stage = stage_of(g, c, "forward or backward")?;
            if stage >= g.compute.len() {
                return Err(GraphError::Invalid(format!(
                    "field `compute[{c}].stage`: stage {stage} of `{}` is beyond the graph's {} compute nodes",
                    node.name,
                    g.compute.len()
                )));
            }
            l = l.max(stage + 1);
        }
    }
    if l == 0 {
        return Err(GraphError::EmptyChain);
    }
    Ok(l)
}

/// Who produces and reads each data node, by block.
struct Uses {
    /// The compute nodes that produce each data node.
    producers: Vec<Vec<usize>>,
    /// The compute nodes that read each data node.
    consumers: Vec<Vec<usize>>,
    /// Block whose forward produces each data node (None for inputs / static).
    made_in: Vec<Option<usize>>,
    /// First forward block (L for the loss) that reads each data node.
    first_fwd_use: Vec<Option<usize>>,
    /// Last forward block (L for the loss) that reads each data node.
    last_fwd_use: Vec<Option<usize>>,
    /// Whether a backward node reads each data node.
    read_by_backward: Vec<bool>,
}

impl Uses {
    fn of(g: &TrainingGraph, l: usize) -> Result<Uses, GraphError> {
        let nd = g.data.len();
        let producers = g.producers();
        let consumers = g.consumers();
        let mut made_in: Vec<Option<usize>> = vec![None; nd];
        for (c, node) in g.compute.iter().enumerate() {
            if node.kind == ComputeKind::Forward {
                for &d in &node.outputs {
                    made_in[d] = Some(stage_of(g, c, "forward")?);
                }
            }
        }
        let fwd_stage = |c: usize| -> Option<usize> {
            match g.compute[c].kind {
                ComputeKind::Forward => g.compute[c].stage,
                ComputeKind::Loss => Some(l),
                ComputeKind::Backward => None,
            }
        };
        let last_fwd_use: Vec<Option<usize>> =
            (0..nd).map(|d| consumers[d].iter().filter_map(|&c| fwd_stage(c)).max()).collect();
        let read_by_backward: Vec<bool> =
            (0..nd).map(|d| consumers[d].iter().any(|&c| g.compute[c].kind == ComputeKind::Backward)).collect();
        let first_fwd_use: Vec<Option<usize>> =
            (0..nd).map(|d| consumers[d].iter().filter_map(|&c| fwd_stage(c)).min()).collect();
        Ok(Uses { producers, consumers, made_in, first_fwd_use, last_fwd_use, read_by_backward })
    }
}

/// `x` (the activations crossing each cut, inputs of the first block included but with
/// [`Retention::Step`]; other inputs go to `static_bytes`) and `xbar` (what each block saves for its backward, or
/// with [`Retention::Step`] all it makes, plus `x`).
fn activation_sizes(g: &TrainingGraph, uses: &Uses, l: usize, retention: Retention, chain: &mut Chain) {
    let Uses { made_in, first_fwd_use, last_fwd_use, read_by_backward, .. } = uses;
    for (d, node) in g.data.iter().enumerate() {
        match node.kind {
            DataKind::Input if retention == Retention::Step => chain.static_bytes += node.size,
            DataKind::Input => {
                if first_fwd_use[d] == Some(0) {
                    // An input of the first block crosses every cut up to its last reader.
                    for i in 0..=last_fwd_use[d].unwrap_or(0).min(l) {
                        if i == 0 || last_fwd_use[d].is_some_and(|u| u >= i) {
                            chain.x[i] += node.size;
                        }
                    }
                } else {
                    chain.static_bytes += node.size;
                }
            }
            DataKind::Activation => {
                if let (Some(p), Some(u)) = (made_in[d], last_fwd_use[d]) {
                    for i in p + 1..=u.min(l) {
                        chain.x[i] += node.size;
                    }
                }
            }
            _ => {}
        }
    }
    for (d, node) in g.data.iter().enumerate() {
        if let Some(p) = made_in[d] {
            let crosses_next = last_fwd_use[d].is_some_and(|u| u > p);
            let kept = read_by_backward[d] || retention == Retention::Step;
            if kept && !crosses_next && !node.kind.is_static() {
                chain.xbar[p + 1] += node.size;
            }
        }
    }
    chain.xbar[0] = chain.x[0];
    for i in 1..=l {
        chain.xbar[i] += chain.x[i];
    }
}

/// `ftime` and `btime`: each block's forward and backward times, and the loss's.
fn block_times(g: &TrainingGraph, l: usize, chain: &mut Chain) -> Result<(), GraphError> {
    for (c, node) in g.compute.iter().enumerate() {
        match node.kind {
            ComputeKind::Forward => chain.ftime[stage_of(g, c, "forward")?] += node.time,
            ComputeKind::Backward => chain.btime[stage_of(g, c, "backward")?] += node.time,
            ComputeKind::Loss => chain.btime[l] += node.time,
        }
    }
    Ok(())
}

/// `w`, `g` and `o`: weights, their gradients and optimizer states. A parameter's belong
/// to the one stage that reads it. A parameter that several stages read (tied weights)
/// stays unnamed, in `static_bytes`, with its gradient and state: named at each reader, it
/// would be counted once per reader where it is resident once, or not at all where one
/// reader's copy is away and another's is not. The zoo names a parameter's gradient
/// `{param}.grad` and its states `{param}.{optimizer}`.
fn param_sizes(g: &TrainingGraph, chain: &mut Chain) -> Result<(), GraphError> {
    let nd = g.data.len();
    let mut readers = vec![Vec::<usize>::new(); nd];
    for (c, node) in g.compute.iter().enumerate() {
        if node.kind == ComputeKind::Forward {
            let s = stage_of(g, c, "forward")?;
            for &d in &node.inputs {
                if g.data[d].kind == DataKind::Parameter && !readers[d].contains(&s) {
                    readers[d].push(s);
                }
            }
        }
    }
    let stage_of_param: std::collections::HashMap<&str, usize> =
        (0..nd).filter(|&d| readers[d].len() == 1).map(|d| (g.data[d].name.as_str(), readers[d][0])).collect();
    // The optimizer step fused into a backward holds one temporary the size of the
    // parameter it updates (`pebble-runtime`'s `optim::apply`), one parameter at a time:
    // the largest one the backward is the last to reach (for a tied one, its first reader).
    let updated_by: std::collections::HashMap<&str, (usize, u64)> =
        (0..nd).filter_map(|d| Some((g.data[d].name.as_str(), (*readers[d].iter().min()?, g.data[d].size)))).collect();
    for (d, node) in g.data.iter().enumerate() {
        if let (DataKind::Parameter, [s]) = (node.kind, &readers[d][..]) {
            chain.w.as_mut().expect("set above")[*s] += node.size;
        }
    }
    for node in g.data.iter().filter(|n| n.kind == DataKind::ParamGrad) {
        let param = node.name.rsplit_once('.').and_then(|(param, _)| updated_by.get(param));
        if let Some(&(s, size)) = param {
            let utmp = &mut chain.utmp.as_mut().expect("set above")[s];
            *utmp = (*utmp).max(size);
        }
    }
    for node in &g.data {
        let slot = match node.kind {
            DataKind::ParamGrad => chain.g.as_mut(),
            DataKind::OptimizerState => chain.o.as_mut(),
            _ => None,
        };
        let Some(slot) = slot else { continue };
        let owner = node.name.rsplit_once('.').and_then(|(param, _)| stage_of_param.get(param));
        if let Some(&s) = owner {
            slot[s] += node.size;
        }
    }
    Ok(())
}

/// `ftmp` and `btmp` of each block: replays the block's forward (with grad and without)
/// and backward.
fn temporaries(g: &TrainingGraph, uses: &Uses, l: usize, retention: Retention, chain: &mut Chain) {
    let Uses { producers, consumers, last_fwd_use, read_by_backward, .. } = uses;
    let whole_step = retention == Retention::Step;
    let is_static = |d: usize| g.data[d].kind.is_static();
    // Each block's forward and backward nodes, in order, in one pass (not one per block).
    let (mut forwards, mut backwards) = (vec![Vec::new(); l], vec![Vec::new(); l]);
    for (c, node) in g.compute.iter().enumerate() {
        match (node.kind, node.stage) {
            (ComputeKind::Forward, Some(s)) if s < l => forwards[s].push(c),
            (ComputeKind::Backward, Some(s)) if s < l => backwards[s].push(c),
            _ => {}
        }
    }
    for (s, (fwd, bwd)) in forwards.into_iter().zip(backwards).enumerate() {
        let keep = |d: usize| whole_step || read_by_backward[d] || last_fwd_use[d].is_some_and(|u| u > s);
        let with_grad = replay(g, &fwd, consumers, &keep, false, &[]);
        // The chain charges F_all with x[s] + xbar[s+1] + ftmp and F_none with x[s] +
        // x[s+1] + ftmp; the replays count above x[s]. With `Step`, a forward without grad
        // holds all it makes (but its `Saved` outputs) until it ends: above x[s+1], it
        // can hold more than with grad above xbar[s+1]. (`LastUse` keeps its accounting:
        // the forward with grad alone.)
        let without_grad = if whole_step {
            replay(g, &fwd, consumers, &|_| true, true, &[]).saturating_sub(chain.x[s + 1])
        } else {
            0
        };
        chain.ftmp[s] = with_grad.saturating_sub(chain.xbar[s + 1]).max(without_grad);
        // Gradients that leave the block (inputs' gradients) are the chain's δ_s.
        let keep_b = |d: usize| {
            whole_step
                || g.data[d].kind == DataKind::Gradient && producers[d].iter().any(|&p| g.compute[p].stage != Some(s))
        };
        let peak_b = replay(g, &bwd, consumers, &keep_b, false, &[]);
        // What the backward reads and does not make (the saved tensors, δ_{s+1}): the
        // executor lets each go after its last reader in the block, where the chain holds
        // them through the whole backward. Replayed so, the peak is lower by what is
        // gone by then, and btmp gives that back (down to 0).
        let held: Vec<usize> = bwd
            .iter()
            .flat_map(|&c| g.compute[c].inputs.iter().copied())
            .filter(|&d| !is_static(d) && !bwd.iter().any(|&c| g.compute[c].outputs.contains(&d)))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let held_bytes: u64 = held.iter().map(|&d| g.data[d].size).sum();
        let freed = (held_bytes + peak_b).saturating_sub(replay(g, &bwd, consumers, &keep_b, false, &held));
        // The chain charges B with x[s] + xbar[s+1] + δ_{s+1} + δ_s + btmp; the replay
        // counts what the block's backward allocates, δ_s included.
        chain.btmp[s] = peak_b.saturating_sub(chain.x[s]).saturating_sub(freed);
    }
}

/// Peak of the memory a list of nodes allocates, replayed in order (`no_grad`: without
/// grad), beyond what was resident before but `held`: outputs are allocated when first
/// produced (but static ones, and without grad the saved ones, which are temporaries
/// then), and freed after their last reader in the list unless `keep` says they outlive
/// it; `held` are resident at the start and go the same way.
fn replay(
    g: &TrainingGraph,
    nodes: &[usize],
    consumers: &[Vec<usize>],
    keep: &dyn Fn(usize) -> bool,
    no_grad: bool,
    held: &[usize],
) -> u64 {
    let skip = |d: usize| g.data[d].kind.is_static() || no_grad && g.data[d].kind == DataKind::Saved;
    let mut live: u64 = held.iter().map(|&d| g.data[d].size).sum();
    let mut peak: u64 = live;
    let mut allocated: std::collections::HashSet<usize> = held.iter().copied().collect();
    for (k, &c) in nodes.iter().enumerate() {
        let node = &g.compute[c];
        let mut fresh = 0;
        for &d in &node.outputs {
            if !skip(d) && allocated.insert(d) {
                fresh += g.data[d].size;
            }
        }
        peak = peak.max(live + fresh + g.compute_tmp(c, no_grad));
        live += fresh;
        let later = &nodes[k + 1..];
        for &d in node.inputs.iter().chain(&node.outputs) {
            if allocated.contains(&d) && !keep(d) && !consumers[d].iter().any(|x| later.contains(x)) {
                allocated.remove(&d);
                live -= g.data[d].size;
            }
        }
    }
    peak
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-block perceptron as `pebble graph --model mlp --layers 1 --width 2 --batch 1`
    /// writes it, its forward's stage replaced by `stage`.
    fn one_block(stage: &str) -> String {
        format!(
            r#"{{"name":"mlp","compute":[
            {{"name":"fc0","kind":"forward","time":5e-06,"tmp":0,"inputs":[0,4,7],"outputs":[2],"op":"linear","stage":{stage}}},
            {{"name":"loss","kind":"loss","time":1e-05,"tmp":40,"inputs":[2,1],"outputs":[3],"op":"cross_entropy"}},
            {{"name":"fc0.bwd","kind":"backward","time":5e-06,"tmp":0,"inputs":[3,0,4,7],"outputs":[5,8],"op":"linear","forward":0,"stage":0}}],
            "data":[{{"name":"x","kind":"input","size":3136}},{{"name":"labels","kind":"input","size":4}},
            {{"name":"fc0","kind":"activation","size":40}},{{"name":"fc0.grad","kind":"gradient","size":40}},
            {{"name":"fc0.weight","kind":"parameter","size":31360}},{{"name":"fc0.weight.grad","kind":"param_grad","size":31360}},
            {{"name":"fc0.weight.adam","kind":"optimizer_state","size":62720}},{{"name":"fc0.bias","kind":"parameter","size":40}},
            {{"name":"fc0.bias.grad","kind":"param_grad","size":40}},{{"name":"fc0.bias.adam","kind":"optimizer_state","size":80}}]}}"#
        )
    }

    #[test]
    fn a_stage_beyond_the_nodes_names_the_field() {
        let g = TrainingGraph::from_json(&one_block("0")).expect("as pebble writes it");
        assert_eq!(to_chain(&g).expect("one block").len(), 1);
        // 2^64 - 1 sized the chain's vectors at 2^64 entries (found by the CLI's fuzz test,
        // issue 47); 3 would leave blocks 1 and 2 without a node.
        for stage in ["18446744073709551615", "3"] {
            let g = TrainingGraph::from_json(&one_block(stage)).expect("the stage is read as is");
            let e = to_chain(&g).unwrap_err().to_string();
            assert!(e.contains("field `compute[0].stage`") && e.contains(stage), "{e}");
        }
    }
}
