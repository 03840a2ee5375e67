//! The network handed to a [`NetBuilder`]: the loss on the logits, and stages cut where
//! one tensor crosses ([`single_crossing_cuts`]).

use pebble_graph::cut::single_crossing_cuts;
use pebble_zoo::ops::Elem;
use pebble_zoo::{NetBuilder, Network, OpKind, ParamId};

use super::{Ctx, Importer, Value};
use crate::error::OnnxError;

impl Importer<'_> {
    /// The tensor the loss reads, checked to be float logits `[N, classes, ...]`.
    pub(super) fn logits(&mut self, logits: &str) -> Result<usize, OnnxError> {
        let ctx = Ctx { node: logits.to_string(), op: "output".into() };
        let t = match self.values.get(logits) {
            Some(Value::Tensor(t)) => *t,
            Some(Value::Input(_)) => self.tensor_named(&ctx, logits)?,
            Some(Value::Const(_)) => {
                return Err(OnnxError::Malformed(format!("the output `{logits}` is a constant: nothing to train")))
            }
            None => return Err(OnnxError::Malformed(format!("no node produces the output `{logits}`"))),
        };
        let shape = self.tensors[t].shape.clone();
        if self.tensors[t].elem != Elem::Float || shape.len() < 2 || shape.contains(&0) {
            return Err(OnnxError::Malformed(format!(
                "the output `{logits}` has shape {shape:?}: a loss needs float logits [N, classes, ...]"
            )));
        }
        Ok(t)
    }

    /// Stages: a new one after every op whose output is the only tensor that crosses from
    /// the ops so far to the ops after (a sequential cut point). Views share their
    /// input's memory, so a tensor counts as its root, made by the op that allocated it;
    /// inputs of the step cross until their last reader, and the loss reads the logits
    /// after every op.
    fn cuts(&self, logits: usize) -> Vec<usize> {
        let n = self.ops.len();
        let made_by: Vec<Option<usize>> = self.tensors.iter().map(|t| t.producer).collect();
        let reads = self.ops.iter().enumerate().flat_map(|(i, op)| op.inputs.iter().map(move |&t| (t, i)));
        let reads = reads.chain([(logits, n)]).map(|(t, i)| (self.tensors[t].root, i));
        single_crossing_cuts(n, &made_by, reads)
    }

    /// Hands the ops to a [`NetBuilder`], with the loss: cross-entropy of the logits
    /// (flattened to `[N, classes]`) against integer labels.
    pub(super) fn emit(&self, name: &str, logits: usize) -> Result<Network, OnnxError> {
        let mut cuts = self.cuts(logits).into_iter().peekable();
        let mut b = NetBuilder::new(name, self.options.dtype);
        let mut ids = vec![usize::MAX; self.tensors.len()];
        for &t in &self.inputs {
            ids[t] = b.input(&self.tensors[t].name, self.tensors[t].shape.clone(), self.tensors[t].elem);
        }
        let shape = &self.tensors[logits].shape;
        let labels = b.input("labels", vec![shape[0]], Elem::Int);
        let mut bound: Vec<Option<ParamId>> = vec![None; self.weights.len()];
        for (i, op) in self.ops.iter().enumerate() {
            let inputs: Vec<usize> = op.inputs.iter().map(|&t| ids[t]).collect();
            let tied: Option<Vec<ParamId>> = op.params.iter().map(|&w| bound[w]).collect();
            let out = match tied {
                Some(p) if !p.is_empty() => b.op_tied(&op.name, op.kind.clone(), &inputs, &p)?,
                _ => b.op(&op.name, op.kind.clone(), &inputs)?,
            };
            for (&w, p) in op.params.iter().zip(b.params_of(out)) {
                bound[w].get_or_insert(p);
            }
            ids[op.output] = out;
            if cuts.next_if_eq(&i).is_some() {
                b.next_stage();
            }
        }
        let mut out = ids[logits];
        if shape.len() > 2 {
            let flat = vec![shape[0], shape[1..].iter().product()];
            out = b.op("logits", OpKind::Reshape { shape: flat }, &[out])?;
        }
        b.loss("loss", OpKind::CrossEntropy, &[out, labels])?;
        Ok(b.finish()?)
    }
}
