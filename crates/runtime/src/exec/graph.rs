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
            (TransferOptions { host_cap: None, ..options.clone() }, sizes.resident)
        } else {
            let prefetch_gates = Default::default(); // nothing reserves: no op would pass them
            (TransferOptions { device_cap: None, host_cap: None, prefetch_gates, ..options.clone() }, 0)
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
        let mut run = self.graph_run(index)?;
        let mut k = 0;
        let mut exec = |sop: &Op| -> Result<(), RuntimeError> {
            k += 1;
            self.graph_op(&mut run, index, xfer, k - 1, sop)
        };
        drive(&mut exec)
    }

    /// A graph step's start: the step's inputs resident, and which compute node is which
    /// op's forward or backward.
    fn graph_run(&self, index: &GraphIndex) -> Result<GraphRun<B>, RuntimeError> {
        let net = &self.p.net;
        let sizes = &self.step.temporaries.graph;
        let counted = sizes.fits(index.data);
        let mut run = GraphRun {
            data: (0..index.data).map(|_| None).collect(),
            dev: vec![0; index.data],
            counted,
            node_op: HashMap::new(),
            loss_op: net.ops.len() - 1,
            host_job: vec![None; index.data],
            prefetch_job: vec![None; index.data],
            in_flight: 0,
        };
        // Inputs of the step are resident from the start (their bytes are in the pool's base).
        for (t, tensor) in net.tensors.iter().enumerate() {
            if tensor.producer.is_none() && index.tensor[t] != usize::MAX {
                let d = index.tensor[t];
                run.data[d] = Some(self.static_value(t)?);
                if counted {
                    run.dev[d] = sizes.data[d];
                }
            }
        }
        for (o, (&f, &b)) in index.forward.iter().zip(&index.backward).enumerate() {
            if f != usize::MAX {
                run.node_op.insert(f, (o, false));
            }
            if b != usize::MAX {
                run.node_op.insert(b, (o, true));
            }
        }
        Ok(run)
    }

    /// Schedule op `k` of a graph step.
    fn graph_op(
        &mut self,
        run: &mut GraphRun<B>,
        index: &GraphIndex,
        xfer: &mut Transfers<'_, '_, B, usize>,
        k: usize,
        sop: &Op,
    ) -> Result<(), RuntimeError> {
        let in_range = |d: usize| d < run.data.len();
        match *sop {
            Op::Compute { node, no_grad } => {
                let (o, is_backward) = run
                    .op_of(index, node)
                    .ok_or_else(|| sched_err(k, sop, format!("compute node {node} is not in the graph")))?;
                // Reloads in flight that this node reads land first.
                if run.in_flight > 0 {
                    for d in self.graph_reads(index, node, o, is_backward) {
                        run.land(xfer, d)?;
                    }
                }
                let tmp = self.reserve_outputs(run, xfer, k, sop, node, no_grad)?;
                if node == index.loss {
                    self.graph_loss(run, index, o)?;
                } else if is_backward {
                    self.graph_backward(run, index, k, sop, o)?;
                } else {
                    self.graph_forward(run, index, o, no_grad)?;
                }
                xfer.release(tmp);
                Ok(())
            }
            Op::Free { tensor: Tensor::Data(d) } if in_range(d) => run.free(xfer, d),
            Op::Free { tensor: Tensor::Data(_) } => Ok(()),
            Op::Offload { tensor: Tensor::Data(d), fraction } if fraction >= 1.0 && in_range(d) => {
                // At its declared size where the pool counts them, as the simulator moves it.
                let declared = run.counted.then(|| self.step.temporaries.graph.data[d]);
                run.offload(xfer, k, sop, d, declared)
            }
            Op::Prefetch { tensor: Tensor::Data(d), fraction } if fraction >= 1.0 && in_range(d) => {
                run.prefetch(xfer, k, sop, d)
            }
            Op::Offload { .. } | Op::Prefetch { .. } => {
                Err(sched_err(k, sop, "a graph schedule moves whole data nodes"))
            }
            _ => Err(sched_err(k, sop, "not a graph op (compute or free)")),
        }
    }

    /// The outputs compute node `node` allocates and its temporaries must fit in the
    /// pool; returns the temporaries, which go back when it is done.
    fn reserve_outputs(
        &self,
        run: &mut GraphRun<B>,
        xfer: &mut Transfers<'_, '_, B, usize>,
        k: usize,
        sop: &Op,
        node: usize,
        no_grad: bool,
    ) -> Result<u64, RuntimeError> {
        if !run.counted {
            return Ok(0);
        }
        let sizes = &self.step.temporaries.graph;
        let mut tmp = sizes.tmp.get(node).copied().unwrap_or(0);
        let mut need = 0;
        for &(d, saved) in sizes.outputs.get(node).map_or(&[][..], Vec::as_slice) {
            if no_grad && saved {
                tmp += sizes.data[d]; // made and dropped inside the op
            } else if run.dev[d] == 0 {
                run.dev[d] = sizes.data[d];
                need += sizes.data[d];
            }
        }
        xfer.reserve(k, &sop.to_string(), need + tmp)?;
        Ok(tmp)
    }

    /// The loss node: the loss, and the gradients of its inputs.
    fn graph_loss(&mut self, run: &mut GraphRun<B>, index: &GraphIndex, o: usize) -> Result<(), RuntimeError> {
        let op = &self.p.net.ops[o];
        let inputs = op.inputs.iter().map(|&t| self.graph_value(index, &run.data, t)).collect::<Result<Vec<_>, _>>()?;
        let out = ops::loss(op, inputs, &self.needs(o), &self.ctx(o, true))?;
        crate::memory::sample();
        self.loss = Some(out.value);
        for (j, g) in out.inputs.into_iter().enumerate() {
            if let Some(g) = g {
                self.graph_grad(index, &mut run.data, op.inputs[j], g)?;
            }
        }
        Ok(())
    }

    /// A forward node: op `o`'s output, and its saved extras unless `no_grad`.
    fn graph_forward(
        &mut self,
        run: &mut GraphRun<B>,
        index: &GraphIndex,
        o: usize,
        no_grad: bool,
    ) -> Result<(), RuntimeError> {
        let op = &self.p.net.ops[o];
        let inputs = op.inputs.iter().map(|&t| self.graph_value(index, &run.data, t)).collect::<Result<Vec<_>, _>>()?;
        let out = ops::forward(op, inputs, &self.params_of(o)?, &self.ctx(o, !no_grad))?;
        run.data[index.tensor[op.output]] = Some(out.output);
        for (j, x) in out.extras.into_iter().enumerate() {
            run.data[index.extras[o][j]] = Some(x);
        }
        Ok(())
    }

    /// A backward node: op `o`'s explicit backward on its declared saved tensors, adding
    /// into the inputs' gradient nodes and the parameters' gradients.
    fn graph_backward(
        &mut self,
        run: &mut GraphRun<B>,
        index: &GraphIndex,
        k: usize,
        sop: &Op,
        o: usize,
    ) -> Result<(), RuntimeError> {
        let op = &self.p.net.ops[o];
        let g = run.data[index.grad[op.output]]
            .clone()
            .and_then(Value::float)
            .ok_or_else(|| sched_err(k, sop, "the output's gradient is not resident"))?;
        let mut values = Vec::new();
        let mut extra = 0;
        for item in &op.decl.saved {
            values.push(match item {
                Saved::Input(j) => self.graph_value(index, &run.data, op.inputs[*j])?,
                Saved::Output => self.graph_value(index, &run.data, op.output)?,
                Saved::Extra { .. } => {
                    extra += 1;
                    run.data[index.extras[o][extra - 1]]
                        .clone()
                        .ok_or_else(|| sched_err(k, sop, "a saved extra is not resident"))?
                }
            });
        }
        let dims = self.input_dims(o);
        let params = self.params_of(o)?;
        self.release_zeroed_grads(o);
        let out = ops::backward(op, &dims, g, values, &params, &self.needs(o), &self.ctx(o, true))?;
        for (j, g) in out.inputs.into_iter().enumerate() {
            if let Some(g) = g {
                self.graph_grad(index, &mut run.data, op.inputs[j], g)?;
            }
        }
        for (j, g) in out.params.into_iter().enumerate() {
            add_into::<B>(&mut self.grads[op.params[j]], g);
        }
        Ok(())
    }
}

/// A graph step's data nodes, their standing with the pools, and the transfers in flight.
struct GraphRun<B: Backend> {
    data: Vec<Option<Value<B>>>,
    /// Each data node's bytes in the device pool (declared sizes, where the step has them).
    dev: Vec<u64>,
    /// The pool counts the graph's sizes.
    counted: bool,
    /// Which compute node is which op's forward or backward.
    node_op: HashMap<usize, (usize, bool)>,
    loss_op: usize,
    /// The offload holding each data node's host copy, with its bytes.
    host_job: Vec<Option<(usize, u64)>>,
    /// Each data node's prefetch in flight.
    prefetch_job: Vec<Option<usize>>,
    in_flight: usize,
}

impl<B: Backend> GraphRun<B> {
    /// Op `o` of compute node `node`, and whether it is its backward.
    fn op_of(&self, index: &GraphIndex, node: usize) -> Option<(usize, bool)> {
        match self.node_op.get(&node) {
            Some(&found) => Some(found),
            None if node == index.loss => Some((self.loss_op, false)),
            None => None,
        }
    }

    /// Waits for data node `d`'s prefetch in flight, if any, and holds what it brings.
    fn land(&mut self, xfer: &mut Transfers<'_, '_, B, usize>, d: usize) -> Result<(), RuntimeError> {
        if let Some(job) = self.prefetch_job.get_mut(d).and_then(Option::take) {
            self.in_flight -= 1;
            self.data[d] = landed(xfer, job)?;
        }
        Ok(())
    }

    /// Frees data node `d`: its device copy, its host copy, a prefetch in flight.
    fn free(&mut self, xfer: &mut Transfers<'_, '_, B, usize>, d: usize) -> Result<(), RuntimeError> {
        self.land(xfer, d)?;
        if let Some((job, _)) = self.host_job[d].take() {
            xfer.drop_host(job);
        }
        self.data[d] = None;
        xfer.release(std::mem::take(&mut self.dev[d]));
        Ok(())
    }

    /// Schedule op `k`, an offload of data node `d` (a reload still in flight lands
    /// first: the offload takes what arrives).
    fn offload(
        &mut self,
        xfer: &mut Transfers<'_, '_, B, usize>,
        k: usize,
        sop: &Op,
        d: usize,
        declared: Option<u64>,
    ) -> Result<(), RuntimeError> {
        self.land(xfer, d)?;
        let value = self.data[d].take().ok_or_else(|| sched_err(k, sop, "offloads a data node not on the device"))?;
        if let Some((old, _)) = self.host_job[d].take() {
            xfer.drop_host(old);
        }
        let bytes = declared.unwrap_or_else(|| value.bytes());
        self.dev[d] = 0;
        xfer.offload(k, &sop.to_string(), vec![(d, value)], bytes, true)?;
        self.host_job[d] = Some((k, bytes));
        Ok(())
    }

    /// Schedule op `k`, a prefetch of data node `d` from its host copy.
    fn prefetch(
        &mut self,
        xfer: &mut Transfers<'_, '_, B, usize>,
        k: usize,
        sop: &Op,
        d: usize,
    ) -> Result<(), RuntimeError> {
        let Some((job, bytes)) = self.host_job[d] else {
            return Err(sched_err(k, sop, "prefetches a data node with no host copy"));
        };
        if self.data[d].is_some() || self.prefetch_job[d].is_some() {
            return Err(sched_err(k, sop, "prefetches a data node already on the device"));
        }
        xfer.prefetch(k, &sop.to_string(), vec![(job, None)], bytes)?;
        self.dev[d] = bytes;
        self.prefetch_job[d] = Some(k);
        self.in_flight += 1;
        Ok(())
    }
}

/// The data node prefetch `job` brings back, once it has landed.
fn landed<B: Backend>(xfer: &mut Transfers<'_, '_, B, usize>, job: usize) -> Result<Option<Value<B>>, RuntimeError> {
    Ok(xfer.wait_prefetch(job)?.into_iter().next().map(|(_, v)| v))
}
