//! The chain view of a training graph that is a sequence of blocks.
//!
//! A graph whose forward and backward nodes all carry a `stage` (a zoo model's, an ONNX
//! import's) is cut where its stages say. Any other graph (one captured from PyTorch, say)
//! is cut where a single activation crosses: Rockmate's sequential blocks
//! (`pebble_ilp::subgraph::sequential_blocks`, on `pebble_graph::cut`'s single-crossing
//! cuts, the cuts the ONNX importer stages by). Each backward node joins the block of the
//! forward node it names (`forward`); one that names none joins the last block whose
//! forward makes what it reads, counting no value that crosses a cut (a block's input is
//! read by backward nodes of both sides), or that alone reads a parameter it reads; with
//! neither, there is no chain view. `pebble_graph::partition::to_chain_with` then sums
//! the blocks into the chain, counting what a chain plan expanded to graph ops holds
//! ([`Retention::Step`], pebble.torch's `chain.py`): each value a chain step makes stays
//! until the step ends, and `F_all` keeps all its block's forward makes.

use std::borrow::Cow;

use pebble_graph::{partition, Chain, ComputeKind, DataKind, Retention, TrainingGraph};

/// The chain view of `g` and the stage of each compute node (its block; the chain's
/// length `L` for the loss, which is the chain's `B_L`), or why it has none.
pub fn chain_view(g: &TrainingGraph) -> Result<(Chain, Vec<usize>), String> {
    let staged = if fully_staged(g) { Cow::Borrowed(g) } else { Cow::Owned(staged(g)?) };
    let chain = partition::to_chain_with(&staged, Retention::Step).map_err(|e| e.to_string())?;
    let l = chain.len();
    let stages = staged
        .compute
        .iter()
        .map(|c| match c.kind {
            ComputeKind::Loss => l,
            _ => c.stage.expect("staged"),
        })
        .collect();
    Ok((chain, stages))
}

/// Whether every forward and backward node has a stage.
fn fully_staged(g: &TrainingGraph) -> bool {
    g.compute.iter().all(|c| c.kind == ComputeKind::Loss || c.stage.is_some())
}

/// `g` with the stages of its sequential blocks.
fn staged(g: &TrainingGraph) -> Result<TrainingGraph, String> {
    let blocks = pebble_ilp::subgraph::sequential_blocks(g);
    if blocks.len() < 2 {
        return Err("no single activation crosses between its forward nodes: the graph is one block".into());
    }
    let mut s = g.clone();
    for c in &mut s.compute {
        c.stage = None;
    }
    for (i, block) in blocks.iter().enumerate() {
        for &k in block {
            s.compute[k].stage = Some(i);
        }
    }
    // The block of each forward node (the loss and backward nodes are in none).
    let block: Vec<Option<usize>> =
        s.compute.iter().map(|c| if c.kind == ComputeKind::Forward { c.stage } else { None }).collect();
    let loss = g.loss();
    let (producers, consumers) = (g.producers(), g.consumers());
    // Values a forward node makes that a later block's forward (or the loss) reads.
    let crossing: Vec<bool> = (0..g.data.len())
        .map(|d| {
            let made = producers[d].iter().filter_map(|&p| block[p]).max();
            let read =
                consumers[d].iter().filter_map(|&c| if Some(c) == loss { Some(blocks.len()) } else { block[c] }).max();
            matches!((made, read), (Some(m), Some(r)) if r > m)
        })
        .collect();
    for k in 0..s.compute.len() {
        if s.compute[k].kind != ComputeKind::Backward {
            continue;
        }
        let named = s.compute[k].forward.and_then(|f| block.get(f).copied().flatten());
        // What only one block's forward makes (no crossing value), and the parameters only
        // one block's forward reads.
        let read = || {
            let inputs = s.compute[k].inputs.iter().copied();
            let made =
                inputs.clone().filter(|&d| !crossing[d]).flat_map(|d| producers[d].iter().filter_map(|&p| block[p]));
            let params = inputs.filter(|&d| g.data[d].kind == DataKind::Parameter).filter_map(|d| {
                let mut readers = consumers[d].iter().filter_map(|&c| block[c]);
                let first = readers.next()?;
                readers.all(|r| r == first).then_some(first)
            });
            made.chain(params).max()
        };
        let stage = named.or_else(read).ok_or_else(|| {
            format!(
                "compute[{k}] `{}` (backward) names no forward node, and reads nothing that one block alone makes \
                 or reads: give each backward node its `forward`",
                s.compute[k].name
            )
        })?;
        s.compute[k].stage = Some(stage);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mlp() -> pebble_zoo::Model {
        let options = pebble_zoo::ModelOptions {
            layers: Some(3),
            width: Some(32),
            batch: Some(4),
            ..pebble_zoo::ModelOptions::default()
        };
        pebble_zoo::build("mlp", &options).unwrap()
    }

    #[test]
    fn a_staged_graph_keeps_its_stages() {
        let m = mlp();
        let (chain, stages) = chain_view(&m.graph).unwrap();
        // The zoo's chain counts for an executor that frees each value after its last
        // use; the chain view for one that frees what a chain step made when it ends:
        // the same cuts and times, and F_all keeps what no backward reads too. The input
        // (the caller holds it) moves from x[0] to the resident bytes.
        let input = m.chain.x[0];
        assert!(input > 0 && input < m.graph.fixed_bytes() - m.graph.static_bytes(), "{:?}", m.chain.x);
        assert_eq!((chain.x[0], chain.static_bytes), (0, m.chain.static_bytes + input));
        assert_eq!(
            (&chain.x[1..], &chain.ftime, &chain.btime, &chain.w),
            (&m.chain.x[1..], &m.chain.ftime, &m.chain.btime, &m.chain.w)
        );
        let xbar = chain.xbar.iter().zip(&m.chain.xbar).skip(1);
        assert!(xbar.clone().all(|(a, b)| a >= b), "{:?} {:?}", chain.xbar, m.chain.xbar);
        for (c, s) in m.graph.compute.iter().zip(&stages) {
            match c.kind {
                ComputeKind::Loss => assert_eq!(*s, chain.len()),
                _ => assert_eq!(Some(*s), c.stage),
            }
        }
    }

    #[test]
    fn an_unstaged_sequence_is_cut_where_one_activation_crosses() {
        let m = mlp();
        let mut g = m.graph.clone();
        for c in &mut g.compute {
            c.stage = None;
        }
        let (chain, stages) = chain_view(&g).unwrap();
        // Cut after every op (linear | relu | linear | relu | linear): more blocks than the
        // zoo's three, the same totals.
        assert!(chain.len() >= 3, "{} blocks", chain.len());
        let total = |c: &Chain| (c.ftime.iter().sum::<f64>(), c.btime.iter().sum::<f64>());
        let (f, b) = (total(&chain), total(&m.chain));
        assert!((f.0 - b.0).abs() <= 1e-12 * b.0 && (f.1 - b.1).abs() <= 1e-12 * b.1);
        assert_eq!(chain.static_bytes, m.chain.static_bytes + m.chain.x[0]);
        // Stages rise along the forward and fall along the backward.
        let fwd: Vec<usize> =
            g.compute.iter().zip(&stages).filter(|(c, _)| c.kind == ComputeKind::Forward).map(|(_, s)| *s).collect();
        assert!(fwd.windows(2).all(|w| w[0] <= w[1]) && fwd[0] == 0, "{fwd:?}");
        // Without forward links, a linear's backward finds its block by its weight; a
        // ReLU's, alone in its block, reads only values that cross: no chain view.
        let relu = g.compute.iter().position(|c| c.kind == ComputeKind::Backward && c.name.starts_with("relu"));
        let linear = g.compute.iter().position(|c| c.kind == ComputeKind::Backward && c.name.starts_with("fc1"));
        let (relu, linear) = (relu.expect("a relu backward"), linear.expect("fc1's backward"));
        let mut unlinked = g.clone();
        unlinked.compute[linear].forward = None;
        let (again, stages2) = chain_view(&unlinked).unwrap();
        assert_eq!(again, chain);
        assert_eq!(stages2, stages);
        unlinked.compute[relu].forward = None;
        let e = chain_view(&unlinked).unwrap_err();
        assert!(e.contains("`forward`") && e.contains(&g.compute[relu].name), "{e}");
    }

    #[test]
    fn one_block_has_no_chain_view() {
        let mut g = pebble_zoo::build(
            "mlp",
            &pebble_zoo::ModelOptions { layers: Some(1), width: Some(8), batch: Some(2), ..Default::default() },
        )
        .unwrap()
        .graph;
        for c in &mut g.compute {
            c.stage = None;
        }
        assert!(chain_view(&g).unwrap_err().contains("one block"));
    }
}
