//! The chain's static tensors (`Weight(i)`, `WeightGrad(i)`, `OptState(i)`) in a step:
//! their transfers, frees and updates on the device and on the host CPU.

use super::*;

/// What a step on the static tensors gives: done, or why not.
type Done = Result<(), RuntimeError>;

impl<B: Backend> Runner<'_, B> {
    /// Takes in the prefetches that have arrived.
    pub(super) fn poll(&mut self, run: &mut ChainRun<B>) -> Done {
        for (job, parts) in run.xfer.arrived()? {
            if let Some(id) = run.track.iter().position(|t| t.prefetch == Some(job)) {
                run.track[id].prefetch = None;
                self.put(run, id, parts);
            }
        }
        Ok(())
    }

    /// Waits for the tensor's prefetch in flight, if any.
    pub(super) fn settle(&mut self, run: &mut ChainRun<B>, id: usize) -> Done {
        if let Some(job) = run.track[id].prefetch.take() {
            let parts = run.xfer.wait_prefetch(job)?;
            self.put(run, id, parts);
        }
        Ok(())
    }

    /// Holds a prefetched tensor: an activation's parts in `held`, a static tensor's in
    /// the parameter slots. A parameter already on the device (up to date, through
    /// another stage) keeps its copy.
    pub(super) fn put(&mut self, run: &mut ChainRun<B>, id: usize, parts: Parts<B, Part>) {
        if !run.held.ids.is_static(id) {
            run.held.put(id, parts);
            return;
        }
        let extra = run.st.pending.remove(&id).unwrap_or_default();
        let mut halves: HashMap<usize, [Option<FloatTensor<B>>; 2]> = HashMap::new();
        for (part, value) in parts.into_iter().chain(extra) {
            let Some(t) = value.float() else { continue };
            match part {
                Part::Param(q) => {
                    if self.params[q].is_none() || self.stale[q] {
                        self.params[q] = Some(t);
                        self.stale[q] = false;
                    }
                }
                Part::Grad(q) => self.grads[q] = Some(t),
                Part::M(q) => halves.entry(q).or_default()[0] = Some(t),
                Part::V(q) => halves.entry(q).or_default()[1] = Some(t),
                Part::Boundary(_) | Part::Inner(_) => {}
            }
        }
        for (q, [m, v]) in halves {
            self.moments[q] = m.zip(v);
        }
    }

    /// Handles to a static tensor's parts (the device copy stays).
    pub(super) fn static_parts(&self, k: usize, op: &Op, ids: Ids, id: usize) -> Result<Parts<B, Part>, RuntimeError> {
        let (kind, i) = ids.static_of(id).expect("a static tensor");
        let missing = || sched_err(k, op, format!("{:?} is not whole on the device", ids.tensor(id)));
        let mut parts = Vec::new();
        match kind {
            WEIGHT => {
                for &q in &self.p.weights[i] {
                    parts.push((Part::Param(q), Value::Float(self.params[q].clone().ok_or_else(missing)?)));
                }
            }
            WGRAD => {
                for &q in &self.p.weights[i] {
                    parts.push((Part::Grad(q), Value::Float(self.grads[q].clone().ok_or_else(missing)?)));
                }
            }
            _ => {
                for &q in &self.p.weights[i] {
                    if q < self.moments.len() {
                        let (m, v) = self.moments[q].clone().ok_or_else(missing)?;
                        parts.push((Part::M(q), Value::Float(m)));
                        parts.push((Part::V(q), Value::Float(v)));
                    }
                }
            }
        }
        Ok(parts)
    }

    /// Drops stage `i`'s device copy of `kind`. A parameter another stage's weights keep
    /// on the device stays; one whose only up-to-date copy this is may not go.
    pub(super) fn clear_static(&mut self, k: usize, op: &Op, kind: usize, i: usize, run: &mut ChainRun<B>) -> Done {
        run.st.dev[i][kind] = false;
        match kind {
            WEIGHT => {
                for &q in &self.p.weights[i] {
                    if self.params[q].is_none() {
                        continue;
                    }
                    if !self.stale[q] && run.st.fresh[q].is_none() {
                        return Err(sched_err(
                            k,
                            op,
                            format!(
                                "parameter `{}` has no up-to-date host copy: dropping its device copy would lose it",
                                self.p.net.params[q].name
                            ),
                        ));
                    }
                    self.params[q] = None;
                    self.stale[q] = false;
                }
            }
            WGRAD => self.p.weights[i].iter().for_each(|&q| self.grads[q] = None),
            _ => {
                for &q in &self.p.weights[i] {
                    if let Some(slot) = self.moments.get_mut(q) {
                        *slot = None;
                    }
                }
            }
        }
        Ok(())
    }

    /// Schedule op `k`, an offload (or upload) of static tensor `id`.
    pub(super) fn offload_static(&mut self, k: usize, op: &Op, id: usize, upload: bool, run: &mut ChainRun<B>) -> Done {
        let ids = run.held.ids;
        let (kind, i) = ids.static_of(id).expect("a static tensor");
        self.settle(run, id)?;
        if !run.st.dev[i][kind] || run.track[id].hold.is_some() {
            return Err(sched_err(k, op, format!("{:?} is not on the device", ids.tensor(id))));
        }
        if kind == WEIGHT && self.p.weights[i].iter().any(|&q| self.stale[q]) {
            return Err(sched_err(k, op, "its device copy is stale since its update on the host: free it instead"));
        }
        let parts = self.static_parts(k, op, ids, id)?;
        if let Some(old) = run.track[id].host.take() {
            run.st.drop_host(&mut run.xfer, old);
        }
        let text = op.to_string();
        if upload {
            // The device copy stays for the reads before the next free.
            let bytes = std::mem::take(&mut run.track[id].dev);
            run.xfer.offload(k, &text, parts, bytes, false)?;
            run.track[id].hold = Some((usize::MAX, k, bytes));
        } else {
            let bytes = std::mem::take(&mut run.track[id].dev);
            run.xfer.offload(k, &text, parts, bytes, true)?;
        }
        run.track[id].host = Some(k);
        if kind == WEIGHT {
            self.p.weights[i].iter().for_each(|&q| run.st.fresh[q] = Some(k));
        }
        if !upload {
            self.clear_static(k, op, kind, i, run)?;
        }
        Ok(())
    }

    /// Schedule op `k`, a prefetch of static tensor `id`: each parameter from its
    /// up-to-date copy (the device's, through another stage, or a host copy).
    pub(super) fn prefetch_static(&mut self, k: usize, op: &Op, id: usize, run: &mut ChainRun<B>) -> Done {
        let ids = run.held.ids;
        let (kind, i) = ids.static_of(id).expect("a static tensor");
        if run.st.dev[i][kind] || run.track[id].prefetch.is_some() {
            return Err(sched_err(k, op, format!("{:?} is already on the device", ids.tensor(id))));
        }
        let mut sources: Vec<(usize, Option<Vec<Part>>)> = Vec::new();
        if kind == WEIGHT {
            let mut on_device = Vec::new();
            for &q in &self.p.weights[i] {
                match (&self.params[q], run.st.fresh[q]) {
                    (Some(t), _) if !self.stale[q] => on_device.push((Part::Param(q), Value::Float(t.clone()))),
                    (_, Some(job)) => match sources.iter_mut().find(|(j, _)| *j == job) {
                        Some((_, Some(list))) => list.push(Part::Param(q)),
                        _ => sources.push((job, Some(vec![Part::Param(q)]))),
                    },
                    _ => {
                        let name = &self.p.net.params[q].name;
                        return Err(sched_err(k, op, format!("parameter `{name}` has no up-to-date copy to prefetch")));
                    }
                }
            }
            run.st.pending.insert(id, on_device);
        } else {
            let Some(job) = run.track[id].host else {
                return Err(sched_err(k, op, format!("{:?} has no host copy to prefetch", ids.tensor(id))));
            };
            sources.push((job, None));
        }
        let bytes = run.sizes[id];
        run.xfer.prefetch(k, &op.to_string(), sources, bytes)?;
        run.track[id].prefetch = Some(k);
        run.track[id].dev = bytes;
        run.st.dev[i][kind] = true;
        Ok(())
    }

    /// Schedule op `k`, a free of static tensor `id`: a weight or a state loses its device
    /// copy (its host copy stays), a gradient both.
    pub(super) fn free_static(&mut self, k: usize, op: &Op, id: usize, run: &mut ChainRun<B>) -> Done {
        let ids = run.held.ids;
        let (kind, i) = ids.static_of(id).expect("a static tensor");
        self.settle(run, id)?;
        let t = &mut run.track[id];
        if !run.st.dev[i][kind] && t.hold.is_none() {
            if kind == WGRAD && t.host.is_some() {
                let job = t.host.take().expect("checked");
                run.st.drop_host(&mut run.xfer, job);
                return Ok(());
            }
            return Err(sched_err(k, op, format!("{:?} is not on the device", ids.tensor(id))));
        }
        if kind == STATE && t.host.is_none() {
            return Err(sched_err(k, op, "the optimizer state has no host copy: its device copy cannot be dropped"));
        }
        if let Some((_, job, bytes)) = t.hold.take() {
            run.xfer.let_go(job, bytes);
        }
        let bytes = std::mem::take(&mut run.track[id].dev);
        run.xfer.release(bytes);
        self.clear_static(k, op, kind, i, run)?;
        if kind == WGRAD {
            if let Some(job) = run.track[id].host.take() {
                run.st.drop_host(&mut run.xfer, job);
            }
        }
        Ok(())
    }

    /// After `B_i` (of a schedule that names the static tensors): the optimizer step of
    /// the parameters whose last gradient contribution it made, on the device unless the
    /// host CPU updates the stage (a tied parameter, resident with its gradient and
    /// state, is updated here either way); the host copies of the stage's weights
    /// and state are then stale.
    pub(super) fn after_backward(&mut self, k: usize, op: &Op, i: usize, run: &mut ChainRun<B>) -> Done {
        let on_cpu = run.st.on_cpu[i];
        let ids = run.held.ids;
        let updated: Vec<usize> = (0..self.params.len())
            .filter(|&q| self.p.update_stage[q] == Some(i))
            .filter(|&q| !on_cpu || self.p.owned_by(q).is_none())
            .collect();
        if let Some(u) = self.step.update {
            for &q in &updated {
                let Some(g) = self.grads[q].clone() else { continue };
                let name = &self.p.net.params[q].name;
                let param = match self.params[q].take() {
                    Some(t) if !self.stale[q] => t,
                    _ => {
                        return Err(sched_err(
                            k,
                            op,
                            format!("updates `{name}`, which is not up to date on the device"),
                        ));
                    }
                };
                let moments = match self.moments.get_mut(q) {
                    Some(slot) => Some(slot.take().ok_or_else(|| {
                        sched_err(k, op, format!("updates `{name}`, whose optimizer state is not on the device"))
                    })?),
                    None => None,
                };
                let (param, moments) = optim::apply::<B>(u.optimizer, u.t, param, g, moments);
                self.params[q] = Some(param);
                if let Some(m) = moments {
                    self.moments[q] = Some(m);
                }
            }
        }
        for &q in &updated {
            run.st.fresh[q] = None;
        }
        if !on_cpu {
            for kind in [WEIGHT, STATE] {
                if let Some(job) = run.track[ids.stat(kind, i)].host.take() {
                    run.st.drop_host(&mut run.xfer, job);
                }
            }
        }
        Ok(())
    }

    /// Schedule op `k`, the optimizer step of stage `i` on the host CPU: from the host
    /// copy of its gradient to new host copies of its weights and state.
    pub(super) fn cpu_update(&mut self, k: usize, op: &Op, i: usize, run: &mut ChainRun<B>) -> Done {
        let ids = run.held.ids;
        let l = self.p.len();
        if i >= l {
            return Err(sched_err(k, op, format!("stage {i} out of range (L = {l})")));
        }
        let Some(grad) = run.track[ids.wgrad(i)].host.take() else {
            return Err(sched_err(
                k,
                op,
                format!("WeightGrad({i}) is not on the host: offload it before the CPU update"),
            ));
        };
        let Some(weight) = run.track[ids.weight(i)].host else {
            return Err(sched_err(k, op, format!("Weight({i}) has no up-to-date host copy for the CPU to update")));
        };
        let state = if self.moments.is_empty() {
            None
        } else {
            if run.st.dev[i][STATE] {
                return Err(sched_err(
                    k,
                    op,
                    format!("OptState({i}) is on the device: a CPU-updated state lives on the host"),
                ));
            }
            let Some(job) = run.track[ids.state(i)].host else {
                return Err(sched_err(k, op, format!("OptState({i}) has no host copy for the CPU to update")));
            };
            Some(job)
        };
        let owned = self.p.weights[i].clone();
        let update = self.step.update;
        let arithmetic: HostUpdate<Part> = Box::new(move |g, w, s| host_update(update, &owned, g, w, s));
        run.xfer.cpu_update(k, &op.to_string(), (grad, weight, state), arithmetic)?;
        for &q in &self.p.weights[i] {
            if self.params[q].is_some() {
                self.stale[q] = true;
            }
            run.st.fresh[q] = Some(weight);
        }
        Ok(())
    }
}

/// The host CPU's optimizer step of the parameters `owned` (a stage's), on the host
/// copies of their gradients, weights and moments, in place and without temporaries:
/// [`optim::apply_slices`], the backend's arithmetic element by element (on the CPU
/// backend, the device's update bit for bit). Without `update` (a step that updates
/// nothing) the copies are left as they are.
fn host_update(
    update: Option<Update>,
    owned: &[usize],
    grads: HostParts<Part>,
    mut weights: HostParts<Part>,
    mut state: HostParts<Part>,
) -> Result<(HostParts<Part>, HostParts<Part>), RuntimeError> {
    let Some(u) = update else { return Ok((weights, state)) };
    let bad = |e: burn_backend::DataError| RuntimeError::Readback(format!("{e:?}"));
    let mut g: HashMap<usize, burn_backend::TensorData> = HashMap::new();
    for (part, value) in grads {
        if let (Part::Grad(q), HostValue::Float(data)) = (part, value) {
            g.insert(q, data);
        }
    }
    let mut moments: HashMap<usize, [Option<&mut burn_backend::TensorData>; 2]> = HashMap::new();
    for (part, value) in state.iter_mut() {
        if let (Part::M(q) | Part::V(q), HostValue::Float(data)) = (*part, value) {
            moments.entry(q).or_default()[usize::from(matches!(part, Part::V(_)))] = Some(data);
        }
    }
    for (part, value) in weights.iter_mut() {
        let (Part::Param(q), HostValue::Float(p)) = (*part, value) else { continue };
        // A gradient that never reached the parameter leaves it (and its moments) as is.
        let (true, Some(grad)) = (owned.contains(&q), g.get(&q)) else { continue };
        let grad = grad.as_slice::<f32>().map_err(bad)?;
        let p = p.as_mut_slice::<f32>().map_err(bad)?;
        match moments.remove(&q) {
            Some([Some(m), Some(v)]) => {
                let (m, v) = (m.as_mut_slice::<f32>().map_err(bad)?, v.as_mut_slice::<f32>().map_err(bad)?);
                optim::apply_slices(u.optimizer, u.t, p, grad, Some((m, v)));
            }
            _ => optim::apply_slices(u.optimizer, u.t, p, grad, None),
        }
    }
    drop(moments);
    Ok((weights, state))
}
