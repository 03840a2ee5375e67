//! [`KJoin::lower`]: Table 1.1 operations as graph ops (`Compute` and `Free`).

use std::collections::{HashMap, HashSet};

use pebble_graph::{ComputeId, DataId, DataKind, TrainingGraph};
use pebble_schedule::{Op, Schedule, Tensor, View};

use super::{JoinChain, KJoin};
use crate::remat::multichain::KOp;

impl KJoin {
    /// Lowers Table 1.1 operations (for this K-join's `L` and `b`) to graph ops, with
    /// `keep_saved = false` (see [`KJoin::lower_with`]).
    pub fn lower(&self, g: &TrainingGraph, ops: &[KOp]) -> Result<Vec<Op>, String> {
        self.lower_with(g, ops, false)
    }

    /// Lowers Table 1.1 operations (for this K-join's `L` and `b`) to graph ops.
    ///
    /// The graph side tracks the thesis's copies of each `a_i` and frees a tensor when its
    /// last copy goes. Each op runs a group of compute nodes and frees, after each node,
    /// what the op consumes (and what the group made for itself) once no later node of the
    /// group reads or writes it:
    ///
    /// * `F_i`: layer `i`'s forward nodes without grad; consumes `a_{i-1}` unless a copy
    ///   remains (after `S_{i-1}`), keeps `a_i`. On a staged graph the input is freed
    ///   before the `put` node: in place, as in the thesis.
    /// * `B_i`: layer `i`'s backward nodes; if they read `a_i` or a tensor layer `i`'s
    ///   forward saves and it is not resident, layer `i`'s forward nodes run first with
    ///   grad (real graphs; never on [`kjoin_graph`](super::kjoin_graph)s). Consumes `δ_i` and `a_{i-1}`, keeps
    ///   `δ_{i-1}`.
    /// * `Loss`: the head's forward nodes with grad, the loss, the head's backward nodes;
    ///   consumes every `a_{L_k}`, keeps every `δ_{L_k}`.
    /// * `S_i`: one more copy. `D_i`: one copy fewer. `D̄`: frees `δ_0` if the graph has it.
    ///
    /// Then every `Free` moves up to right after the last compute op that reads or writes
    /// the tensor: a real backward need not read `a_{i-1}`, which the thesis keeps until
    /// `B_i`. On a [`kjoin_graph`](super::kjoin_graph) every free already follows its tensor's last use.
    ///
    /// With `keep_saved`, an `F_i` that is the last one before `B_i` runs with grad when
    /// `B_i` reads what layer `i` produces, and that stays (`a_i` too, past its last copy)
    /// until `B_i`: no recomputation before the backward, at the price of memory the
    /// thesis's model does not count. Nothing changes on a [`kjoin_graph`](super::kjoin_graph).
    pub fn lower_with(&self, g: &TrainingGraph, ops: &[KOp], keep_saved: bool) -> Result<Vec<Op>, String> {
        let mut low = Lowering::new(self, g, ops, keep_saved);
        for (n, op) in ops.iter().enumerate() {
            low.op(n, *op).map_err(|why| format!("op {n} ({op}): {why}"))?;
        }
        Ok(free_early(g, low.out))
    }

    /// [`KJoin::lower`] as a graph [`Schedule`].
    pub fn schedule(&self, g: &TrainingGraph, ops: &[KOp]) -> Result<Schedule, String> {
        Ok(Schedule::new(View::Graph, self.lower(g, ops)?))
    }
}

/// The state of [`KJoin::lower_with`] between two operations: the thesis's copies of
/// each value, what is resident, and the graph ops so far.
struct Lowering<'a> {
    join: &'a KJoin,
    g: &'a TrainingGraph,
    keep_saved: bool,
    copies: HashMap<DataId, usize>,
    resident: Vec<bool>,
    /// Tensors kept for a later backward beyond the thesis's copies (keep_saved).
    held: HashSet<DataId>,
    /// last_f[n]: op n is an F_i after which the next F_i / B_i of its layer is B_i.
    last_f: Vec<bool>,
    out: Vec<Op>,
}

impl<'a> Lowering<'a> {
    /// The start state: each chain's input resident, with one copy.
    fn new(join: &'a KJoin, g: &'a TrainingGraph, ops: &[KOp], keep_saved: bool) -> Lowering<'a> {
        let mut copies: HashMap<DataId, usize> = HashMap::new();
        let mut resident = vec![false; g.data.len()];
        for (d, n) in g.data.iter().enumerate() {
            resident[d] = n.kind == DataKind::Input;
        }
        for ch in &join.chains {
            copies.insert(ch.acts[0], 1);
        }
        let mut last_f = vec![false; ops.len()];
        let mut next_is_b: HashMap<(usize, usize), bool> = HashMap::new();
        for (n, op) in ops.iter().enumerate().rev() {
            match *op {
                KOp::Backward { chain, index } => {
                    next_is_b.insert((chain, index), true);
                }
                KOp::Forward { chain, index } => {
                    last_f[n] = next_is_b.get(&(chain, index)).copied().unwrap_or(false);
                    next_is_b.insert((chain, index), false);
                }
                _ => {}
            }
        }
        Lowering { join, g, keep_saved, copies, resident, held: HashSet::new(), last_f, out: Vec::new() }
    }

    /// Lowers op `n`; `Err` says why it cannot run here.
    fn op(&mut self, n: usize, op: KOp) -> Result<(), String> {
        let join = self.join;
        let layer = |chain: usize, index: usize| {
            join.chains.get(chain).filter(|c| index >= 1 && index <= c.len()).ok_or("out of range".to_string())
        };
        let value = |chain: usize, index: usize| {
            join.chains.get(chain).filter(|c| index <= c.len()).ok_or("out of range".to_string())
        };
        match op {
            KOp::Forward { chain, index } => self.forward(n, layer(chain, index)?, index),
            KOp::Backward { chain, index } => self.backward(layer(chain, index)?, index),
            KOp::Loss => self.loss(),
            KOp::Store { chain, index } => {
                match self.copies.get_mut(&value(chain, index)?.acts[index]).filter(|c| **c > 0) {
                    Some(c) => {
                        *c += 1;
                        Ok(())
                    }
                    None => Err("replicates a value that is not stored".into()),
                }
            }
            KOp::Discard { chain, index } => {
                let d = value(chain, index)?.acts[index];
                if self.copies.get(&d).copied().unwrap_or(0) == 0 {
                    return Err("discards a value that is not stored".into());
                }
                if self.drop_copy(d) {
                    free(d, &mut self.resident, &mut self.out);
                }
                Ok(())
            }
            KOp::DiscardGrad { chain } => {
                let ch = join.chains.get(chain).ok_or("out of range".to_string())?;
                if let Some(d) = ch.grads[0] {
                    if self.resident[d] {
                        free(d, &mut self.resident, &mut self.out);
                    }
                }
                Ok(())
            }
        }
    }

    /// Drops one thesis copy of `d`; true when the tensor is to be freed.
    fn drop_copy(&mut self, d: DataId) -> bool {
        let c = self.copies.get_mut(&d).expect("checked by the caller");
        *c -= 1;
        *c == 0 && !self.held.contains(&d)
    }

    /// What layer `i`'s backward reads of what its forward produces.
    fn bwd_reads_layer(&self, ch: &JoinChain, i: usize) -> Vec<DataId> {
        let g = self.g;
        let layer_out: HashSet<DataId> = ch.forward[i - 1]
            .iter()
            .flat_map(|&c| g.compute[c].outputs.iter().copied())
            .filter(|&d| !g.data[d].kind.is_static())
            .collect();
        let mut v: Vec<DataId> = Vec::new();
        for &c in &ch.backward[i - 1] {
            for &d in &g.compute[c].inputs {
                if layer_out.contains(&d) && !v.contains(&d) {
                    v.push(d);
                }
            }
        }
        v
    }

    /// `F_i` (op `n`) of chain `ch`.
    fn forward(&mut self, n: usize, ch: &JoinChain, index: usize) -> Result<(), String> {
        let (a_in, a_out) = (ch.acts[index - 1], ch.acts[index]);
        if self.copies.get(&a_in).copied().unwrap_or(0) == 0 {
            return Err("its input is not stored".into());
        }
        if self.resident[a_out] {
            return Err("recomputes a value that is stored".into());
        }
        let consumed: Vec<DataId> = if self.drop_copy(a_in) { vec![a_in] } else { Vec::new() };
        let mut keep: HashSet<DataId> = [a_out].into();
        let mut no_grad = true;
        if self.keep_saved && self.last_f[n] {
            let reads = self.bwd_reads_layer(ch, index);
            if !reads.is_empty() {
                no_grad = false;
                keep.extend(reads.iter().copied());
                self.held.extend(reads);
            }
        }
        let nodes: Vec<(ComputeId, bool)> = ch.forward[index - 1].iter().map(|&c| (c, no_grad)).collect();
        run_group(self.g, &nodes, &consumed, &keep, &mut self.resident, &mut self.out);
        *self.copies.entry(a_out).or_insert(0) += 1;
        Ok(())
    }

    /// `B_i` of chain `ch`, after its layer's forward again if it must.
    fn backward(&mut self, ch: &JoinChain, index: usize) -> Result<(), String> {
        let g = self.g;
        let a_in = ch.acts[index - 1];
        if self.copies.get(&a_in).copied().unwrap_or(0) == 0 {
            return Err("its input is not stored".into());
        }
        if let Some(d) = ch.grads[index] {
            if !self.resident[d] {
                return Err("δ_i is not resident".into());
            }
        }
        let bwd = &ch.backward[index - 1];
        let fwd = &ch.forward[index - 1];
        let reads = self.bwd_reads_layer(ch, index);
        let mut consumed: Vec<DataId> = ch.grads[index].into_iter().collect();
        let mut nodes: Vec<(ComputeId, bool)> = Vec::new();
        if reads.iter().any(|&d| !self.resident[d]) {
            let layer_out = fwd.iter().flat_map(|&c| g.compute[c].outputs.iter().copied());
            if let Some(d) = layer_out.filter(|&d| !g.data[d].kind.is_static()).find(|&d| self.resident[d]) {
                return Err(format!("must recompute its layer's forward, but `{}` is resident", g.data[d].name));
            }
            nodes.extend(fwd.iter().map(|&c| (c, false)));
        } else {
            // What an earlier F_i kept for this backward (keep_saved).
            for d in reads {
                if self.held.remove(&d) && self.copies.get(&d).copied().unwrap_or(0) == 0 {
                    consumed.push(d);
                }
            }
        }
        nodes.extend(bwd.iter().map(|&c| (c, false)));
        if self.drop_copy(a_in) {
            consumed.push(a_in);
        }
        let keep: HashSet<DataId> = ch.grads[index - 1].into_iter().collect();
        run_group(g, &nodes, &consumed, &keep, &mut self.resident, &mut self.out);
        Ok(())
    }

    /// `Loss`: the head, consuming every chain's last value.
    fn loss(&mut self) -> Result<(), String> {
        let join = self.join;
        let mut consumed = Vec::new();
        for ch in &join.chains {
            let top = *ch.acts.last().expect("a_0");
            if self.copies.get(&top).copied().unwrap_or(0) == 0 {
                return Err(format!("`{}` is not stored", self.g.data[top].name));
            }
            if self.drop_copy(top) {
                consumed.push(top);
            }
        }
        let mut keep: HashSet<DataId> = join.head_results.iter().copied().collect();
        keep.extend(join.chains.iter().filter_map(|ch| ch.grads[ch.len()]));
        keep.extend(self.held.iter().copied());
        let nodes: Vec<(ComputeId, bool)> = join.head.iter().map(|&c| (c, false)).collect();
        run_group(self.g, &nodes, &consumed, &keep, &mut self.resident, &mut self.out);
        Ok(())
    }
}

/// Moves each `Free` up to right after the last compute op (since the tensor was last
/// allocated) that reads or writes it; a tensor no compute op touched stays where it is.
fn free_early(g: &TrainingGraph, ops: Vec<Op>) -> Vec<Op> {
    let mut last: Vec<Option<usize>> = vec![None; g.data.len()];
    let mut after: Vec<Vec<Op>> = vec![Vec::new(); ops.len()];
    let mut keep = vec![true; ops.len()];
    for (p, op) in ops.iter().enumerate() {
        match *op {
            Op::Compute { node, .. } => {
                let n = &g.compute[node];
                for &d in n.inputs.iter().chain(&n.outputs) {
                    last[d] = Some(p);
                }
            }
            Op::Free { tensor: Tensor::Data(d) } => {
                if let Some(q) = last[d].take() {
                    after[q].push(*op);
                    keep[p] = false;
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::with_capacity(ops.len());
    for (p, op) in ops.into_iter().enumerate() {
        if keep[p] {
            out.push(op);
        }
        out.append(&mut after[p]);
    }
    out
}

fn free(d: DataId, resident: &mut [bool], out: &mut Vec<Op>) {
    resident[d] = false;
    out.push(Op::Free { tensor: Tensor::Data(d) });
}

/// Runs `nodes` (with their `no_grad` flags) and frees, right after the last node of the
/// group that reads or writes it, every resident tensor in `consumed` and every
/// non-static tensor the group produces, except those in `keep`. A consumed tensor no
/// node of the group touches is freed before the group.
fn run_group(
    g: &TrainingGraph,
    nodes: &[(ComputeId, bool)],
    consumed: &[DataId],
    keep: &HashSet<DataId>,
    resident: &mut [bool],
    out: &mut Vec<Op>,
) {
    let produced = |c: ComputeId, no_grad: bool| {
        g.compute[c]
            .outputs
            .iter()
            .copied()
            .filter(move |&d| !(g.data[d].kind.is_static() || (no_grad && g.data[d].kind == DataKind::Saved)))
    };
    let mut last: HashMap<DataId, usize> = HashMap::new();
    for (j, &(c, no_grad)) in nodes.iter().enumerate() {
        for &d in &g.compute[c].inputs {
            last.insert(d, j);
        }
        for d in produced(c, no_grad) {
            last.insert(d, j);
        }
    }
    let mut candidates: Vec<DataId> = consumed.to_vec();
    for &(c, no_grad) in nodes {
        for d in produced(c, no_grad) {
            if !candidates.contains(&d) {
                candidates.push(d);
            }
        }
    }
    candidates.retain(|d| !keep.contains(d));
    for &d in &candidates {
        if !last.contains_key(&d) && resident[d] {
            free(d, resident, out);
        }
    }
    for (j, &(c, no_grad)) in nodes.iter().enumerate() {
        out.push(Op::Compute { node: c, no_grad });
        for d in produced(c, no_grad) {
            resident[d] = true;
        }
        for &d in &candidates {
            if last.get(&d) == Some(&j) && resident[d] {
                free(d, resident, out);
            }
        }
    }
}
