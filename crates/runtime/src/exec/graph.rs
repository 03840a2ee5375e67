//! Graph schedules: one slot per data node of the training graph, filled by compute
//! nodes and emptied by explicit frees, op by op as a [`Drive`] hands them over.

use super::*;

impl<B: Backend> Runner<'_, B> {
    /// The value of forward tensor `t`, rebuilding a view from its root.
    fn graph_value(
        &self,
        index: &GraphIndex,
        data: &[Option<Value<B>>],
        t: TensorId,
    ) -> Result<Value<B>, RuntimeError> {
        let tensor = &self.p.net.tensors[t];
        if tensor.view_of.is_none() {
            if tensor.producer.is_none() && data[index.tensor[t]].is_none() {
                return self.static_value(t);
            }
            return data[index.tensor[t]]
                .clone()
                .ok_or_else(|| RuntimeError::NotResident { tensor: tensor.name.clone() });
        }
        let o = tensor.producer.expect("a view has a producer");
        let op = &self.p.net.ops[o];
        let input = self.graph_value(index, data, op.inputs[0])?;
        Ok(ops::forward(op, vec![input], &[], &self.ctx(o, false))?.output)
    }

    /// Adds `g`, the gradient of forward tensor `t`, to its gradient node (through views).
    fn graph_grad(
        &self,
        index: &GraphIndex,
        data: &mut [Option<Value<B>>],
        mut t: TensorId,
        mut g: FloatTensor<B>,
    ) -> Result<(), RuntimeError> {
        while let Some(o) = self.p.net.tensors[t].view_of.and(self.p.net.tensors[t].producer) {
            let out = ops::backward(
                &self.p.net.ops[o],
                &self.input_dims(o),
                g,
                Vec::new(),
                &[],
                &[true],
                &self.ctx(o, true),
            )?;
            g = out
                .inputs
                .into_iter()
                .next()
                .flatten()
                .ok_or_else(|| RuntimeError::NoInputGradient { op: self.p.net.ops[o].name.clone() })?;
            t = self.p.net.ops[o].inputs[0];
        }
        let slot = &mut data[index.grad[t]];
        let mut cur = slot.take().and_then(Value::float);
        add_into::<B>(&mut cur, g);
        *slot = cur.map(Value::Float);
        Ok(())
    }

    /// Runs the graph ops `drive` hands over; offloads and prefetches of data nodes go on
    /// the transfer threads (the link at `options`' speeds, started on the first), each
    /// offload's device copy let go when its copy is done, as the simulator releases it.
    pub(super) fn graph(
        &mut self,
        index: &GraphIndex,
        drive: &mut Drive<'_>,
        options: &TransferOptions,
    ) -> Result<TransferReport, RuntimeError> {
        let device = self.device;
        // With the graph's sizes, the pool counts as the simulator does, under the cap: a
        // compute op (or a reload) that would go over it waits for the offloads in flight,
        // as the simulator's does. Without them it counts nothing and caps nothing.
        let sizes = &self.step.temporaries.graph;
        let (options, base) = if sizes.fits(index.data) {
            (TransferOptions { host_cap: None, ..*options }, sizes.resident)
        } else {
            (TransferOptions { device_cap: None, host_cap: None, ..*options }, 0)
        };
        let (result, finished) = std::thread::scope(|scope| {
            let mut xfer = Transfers::<B, usize>::new(scope, device, options, base, HashMap::new());
            let result = self.graph_ops(index, drive, &mut xfer);
            let ok = result.is_ok();
            (result, xfer.finish(ok))
        });
        result?;
        let (report, left) = finished?;
        let _host = memory::host_scope();
        drop(left);
        Ok(report)
    }

    /// The data nodes compute node `node` (op `o`, its backward if `is_backward`) reads.
    fn graph_reads(&self, index: &GraphIndex, node: usize, o: usize, is_backward: bool) -> Vec<usize> {
        let op = &self.p.net.ops[o];
        if node == index.loss || !is_backward {
            return op.inputs.iter().map(|&t| index.tensor[t]).collect();
        }
        let mut reads = vec![index.grad[op.output]];
        for item in &op.decl.saved {
            match item {
                Saved::Input(j) => reads.push(index.tensor[op.inputs[*j]]),
                Saved::Output => reads.push(index.tensor[op.output]),
                Saved::Extra { .. } => {}
            }
        }
        reads.extend(index.extras[o].iter().copied());
        reads
    }

    /// Runs the graph ops `drive` hands to the executor it is given, in order, each as
    /// soon as it is handed over: a schedule's ops, or a run-time policy's decisions.
    fn graph_ops(
        &mut self,
        index: &GraphIndex,
        drive: &mut Drive<'_>,
        xfer: &mut Transfers<'_, '_, B, usize>,
    ) -> Result<(), RuntimeError> {
        let net = &self.p.net;
        let mut data: Vec<Option<Value<B>>> = (0..index.data).map(|_| None).collect();
        // Inputs of the step are resident from the start. `dev`: each data node's bytes in
        // the device pool (declared sizes, where the step has them; the inputs' are in the
        // pool's base).
        let sizes = &self.step.temporaries.graph;
        let counted = sizes.fits(index.data);
        let mut dev = vec![0u64; index.data];
        for (t, tensor) in net.tensors.iter().enumerate() {
            if tensor.producer.is_none() && index.tensor[t] != usize::MAX {
                let d = index.tensor[t];
                data[d] = Some(self.static_value(t)?);
                if counted {
                    dev[d] = sizes.data[d];
                }
            }
        }
        // Which compute node is which op's forward or backward.
        let mut node_op: HashMap<usize, (usize, bool)> = HashMap::new();
        for (o, (&f, &b)) in index.forward.iter().zip(&index.backward).enumerate() {
            if f != usize::MAX {
                node_op.insert(f, (o, false));
            }
            if b != usize::MAX {
                node_op.insert(b, (o, true));
            }
        }
        let loss_op = net.ops.len() - 1;
        // The offload holding each data node's host copy, and its prefetch in flight.
        let mut host_job: Vec<Option<(usize, u64)>> = vec![None; index.data];
        let mut prefetch_job: Vec<Option<usize>> = vec![None; index.data];
        let mut in_flight = 0usize;
        let mut k = 0;
        let mut exec = |sop: &Op| -> Result<(), RuntimeError> {
            let k = {
                k += 1;
                k - 1
            };
            match *sop {
                // Reloads in flight that this node reads land first.
                Op::Compute { node, .. } if in_flight > 0 => {
                    let (o, is_backward) = match node_op.get(&node) {
                        Some(&found) => found,
                        None if node == index.loss => (loss_op, false),
                        None => return Err(sched_err(k, sop, format!("compute node {node} is not in the graph"))),
                    };
                    for d in self.graph_reads(index, node, o, is_backward) {
                        if let Some(job) = prefetch_job.get_mut(d).and_then(Option::take) {
                            in_flight -= 1;
                            data[d] = landed(xfer, job)?;
                        }
                    }
                }
                _ => {}
            }
            // The outputs a compute node allocates and its temporaries must fit in the
            // pool; the temporaries go back when it is done.
            let mut tmp = 0;
            if let (Op::Compute { node, no_grad }, true) = (*sop, counted) {
                tmp = sizes.tmp.get(node).copied().unwrap_or(0);
                let mut need = tmp;
                for &(d, saved) in sizes.outputs.get(node).map_or(&[][..], Vec::as_slice) {
                    if dev[d] == 0 && !(no_grad && saved) {
                        dev[d] = sizes.data[d];
                        need += sizes.data[d];
                    }
                }
                xfer.reserve(k, &sop.to_string(), need)?;
            }
            match *sop {
                Op::Compute { node, no_grad } => {
                    if node == index.loss {
                        let op = &net.ops[loss_op];
                        let inputs = op
                            .inputs
                            .iter()
                            .map(|&t| self.graph_value(index, &data, t))
                            .collect::<Result<Vec<_>, _>>()?;
                        let out = ops::loss(op, inputs, &self.needs(loss_op), &self.ctx(loss_op, true))?;
                        crate::memory::sample();
                        self.loss = Some(out.value);
                        for (j, g) in out.inputs.into_iter().enumerate() {
                            if let Some(g) = g {
                                self.graph_grad(index, &mut data, op.inputs[j], g)?;
                            }
                        }
                        xfer.release(tmp);
                        return Ok(());
                    }
                    let Some(&(o, is_backward)) = node_op.get(&node) else {
                        return Err(sched_err(k, sop, format!("compute node {node} is not in the graph")));
                    };
                    let op = &net.ops[o];
                    if !is_backward {
                        let inputs = op
                            .inputs
                            .iter()
                            .map(|&t| self.graph_value(index, &data, t))
                            .collect::<Result<Vec<_>, _>>()?;
                        let out = ops::forward(op, inputs, &self.params_of(o)?, &self.ctx(o, !no_grad))?;
                        data[index.tensor[op.output]] = Some(out.output);
                        for (j, x) in out.extras.into_iter().enumerate() {
                            data[index.extras[o][j]] = Some(x);
                        }
                    } else {
                        let g = data[index.grad[op.output]]
                            .clone()
                            .and_then(Value::float)
                            .ok_or_else(|| sched_err(k, sop, "the output's gradient is not resident"))?;
                        let mut values = Vec::new();
                        let mut extra = 0;
                        for item in &op.decl.saved {
                            values.push(match item {
                                Saved::Input(j) => self.graph_value(index, &data, op.inputs[*j])?,
                                Saved::Output => self.graph_value(index, &data, op.output)?,
                                Saved::Extra { .. } => {
                                    extra += 1;
                                    data[index.extras[o][extra - 1]]
                                        .clone()
                                        .ok_or_else(|| sched_err(k, sop, "a saved extra is not resident"))?
                                }
                            });
                        }
                        let out = ops::backward(
                            op,
                            &self.input_dims(o),
                            g,
                            values,
                            &self.params_of(o)?,
                            &self.needs(o),
                            &self.ctx(o, true),
                        )?;
                        for (j, g) in out.inputs.into_iter().enumerate() {
                            if let Some(g) = g {
                                self.graph_grad(index, &mut data, op.inputs[j], g)?;
                            }
                        }
                        for (j, g) in out.params.into_iter().enumerate() {
                            add_into::<B>(&mut self.grads[op.params[j]], g);
                        }
                    }
                    xfer.release(tmp);
                }
                Op::Free { tensor: Tensor::Data(d) } => {
                    if d < data.len() {
                        if let Some(job) = prefetch_job[d].take() {
                            in_flight -= 1;
                            drop(landed(xfer, job)?);
                        }
                        if let Some((job, _)) = host_job[d].take() {
                            xfer.drop_host(job);
                        }
                        data[d] = None;
                        xfer.release(std::mem::take(&mut dev[d]));
                    }
                }
                Op::Offload { tensor: Tensor::Data(d), fraction } if fraction >= 1.0 && d < data.len() => {
                    // A reload still in flight lands first: the offload takes what arrives.
                    if let Some(job) = prefetch_job[d].take() {
                        in_flight -= 1;
                        data[d] = landed(xfer, job)?;
                    }
                    let value =
                        data[d].take().ok_or_else(|| sched_err(k, sop, "offloads a data node not on the device"))?;
                    if let Some((old, _)) = host_job[d].take() {
                        xfer.drop_host(old);
                    }
                    // At its declared size where the pool counts them, as the simulator moves it.
                    let bytes = if counted { sizes.data[d] } else { value.bytes() };
                    dev[d] = 0;
                    xfer.offload(k, &sop.to_string(), vec![(d, value)], bytes, true)?;
                    host_job[d] = Some((k, bytes));
                }
                Op::Prefetch { tensor: Tensor::Data(d), fraction } if fraction >= 1.0 && d < data.len() => {
                    let Some((job, bytes)) = host_job[d] else {
                        return Err(sched_err(k, sop, "prefetches a data node with no host copy"));
                    };
                    if data[d].is_some() || prefetch_job[d].is_some() {
                        return Err(sched_err(k, sop, "prefetches a data node already on the device"));
                    }
                    xfer.prefetch(k, &sop.to_string(), vec![(job, None)], bytes)?;
                    dev[d] = bytes;
                    prefetch_job[d] = Some(k);
                    in_flight += 1;
                }
                Op::Offload { .. } | Op::Prefetch { .. } => {
                    return Err(sched_err(k, sop, "a graph schedule moves whole data nodes"));
                }
                _ => return Err(sched_err(k, sop, "not a graph op (compute or free)")),
            }
            Ok(())
        };
        drive(&mut exec)
    }
}

/// The data node prefetch `job` brings back, once it has landed.
fn landed<B: Backend>(xfer: &mut Transfers<'_, '_, B, usize>, job: usize) -> Result<Option<Value<B>>, RuntimeError> {
    Ok(xfer.wait_prefetch(job)?.into_iter().next().map(|(_, v)| v))
}
