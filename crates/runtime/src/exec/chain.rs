//! Chain schedules: the program [`lower::lower_chain`] gives, run step by step on the
//! chain tensors (`a_i`, `ā_i`, `δ_i`), with the transfers and the pools.

use super::*;

mod statics;

use super::statics::static_sizes;

impl<B: Backend> Runner<'_, B> {
    /// Runs a chain schedule: compute ops on this thread, transfers on the two threads
    /// of [`Transfers`] (and CPU updates on a third), all of it inside one scope so that
    /// nothing outlives the step but what `statics` carries to the next.
    pub(super) fn chain(
        &mut self,
        schedule: &Schedule,
        options: &TransferOptions,
        statics: &mut Statics<B>,
    ) -> Result<TransferReport, RuntimeError> {
        let l = self.p.len();
        let ids = Ids::with_statics(l);
        let lowered;
        let steps = match self.step.lowered {
            Some(steps) => steps,
            None => {
                lowered = lower_checked(schedule, l, &statics.device)?;
                &lowered[..]
            }
        };
        // (The moments are the runner's for the step.)
        let moments = if self.moments.is_empty() { 0 } else { 2 };
        let sizes = chain_sizes(self.p, ids, moments);
        let n_ops = schedule.ops.len();
        let mut held = Held::new(ids);
        let mut a0 = Env::new();
        for &t in &self.p.boundary[0] {
            a0.insert(t, self.static_value(t)?);
        }
        held.act[0] = Some(a0);
        let mut track = vec![Track::default(); ids.count()];
        // The host copies the last step left, under jobs past this step's ops.
        let mut hosts = HostCopies::new();
        for i in 0..l {
            for kind in [WEIGHT, WGRAD, STATE] {
                let id = ids.stat(kind, i);
                if let Some(entry) = statics.hosts[i][kind].take() {
                    hosts.insert(n_ops + id, entry);
                    track[id].host = Some(n_ops + id);
                }
                if statics.device[i][kind] {
                    track[id].dev = sizes[id];
                }
            }
        }
        let fresh = statics.fresh.iter().map(|s| s.map(|s| n_ops + ids.weight(s))).collect();
        // The pool starts with what the step holds from its start, as the simulator counts
        // it: the parameters, their gradients and states, less the stages' that start off
        // the device, and the batch (`a_0` among it).
        track[ids.act(0)].dev = sizes[ids.act(0)];
        let net = &self.p.net;
        let params: u64 = net.params.iter().map(|q| net.bytes(&q.shape, Elem::Float)).sum();
        let inputs: u64 = self.step.inputs.values().map(Value::bytes).sum();
        let absent: u64 = (0..l)
            .flat_map(|i| [WEIGHT, WGRAD, STATE].map(|kind| (i, kind)))
            .filter(|&(i, kind)| !statics.device[i][kind])
            .map(|(i, kind)| sizes[ids.stat(kind, i)])
            .sum();
        let base = ((2 + moments) * params + inputs).saturating_sub(absent).max(sizes[ids.act(0)]);
        let device = self.device;
        let on_cpu = placement::cpu_updated(&schedule.ops, l);
        let fused = placement::names_statics(schedule);
        let st = StaticRun { dev: statics.device.clone(), fresh, pending: HashMap::new(), on_cpu, fused };
        let (result, finished) = std::thread::scope(|scope| {
            let xfer = Transfers::new(scope, device, options.clone(), base, hosts);
            let mut run = ChainRun { held, track, sizes, xfer, st };
            let result = self.chain_ops(schedule, steps, &mut run);
            let ok = result.is_ok();
            let ChainRun { held, xfer, track, st, .. } = run;
            drop(held);
            (result.map(|()| (track, st)), xfer.finish(ok))
        });
        let (track, mut stat) = result?;
        let (report, mut left) = finished?;
        // What the step leaves for the next: host copies of the static tensors, and which
        // parameters they hold up to date; a device copy the CPU updated past goes.
        for i in 0..l {
            for kind in [WEIGHT, WGRAD, STATE] {
                statics.hosts[i][kind] = track[ids.stat(kind, i)].host.and_then(|job| left.remove(&job));
            }
        }
        statics.fresh = stat
            .fresh
            .iter()
            .map(|f| f.and_then(|job| (0..l).find(|&s| track[ids.weight(s)].host == Some(job))))
            .collect();
        for q in 0..self.params.len() {
            if self.stale[q] {
                self.params[q] = None;
                if let Some(s) = self.p.owned_by(q) {
                    stat.dev[s][WEIGHT] = false;
                }
            }
        }
        statics.device = stat.dev;
        let _host = memory::host_scope();
        drop(left);
        Ok(report)
    }

    fn chain_ops(&mut self, schedule: &Schedule, steps: &[Step], run: &mut ChainRun<B>) -> Result<(), RuntimeError> {
        let ids = run.held.ids;
        let time_ops = run.xfer.options().time_ops;
        if time_ops {
            self.op_seconds = vec![0.0; schedule.ops.len()];
        }
        for (k, (op, step)) in schedule.ops.iter().zip(steps).enumerate() {
            self.poll(run)?;
            match step.action {
                Action::Forward { .. } | Action::Loss { .. } | Action::Backward { .. } => {
                    for &r in &step.reads {
                        self.settle(run, r)?;
                    }
                    // What it creates and the op's temporaries must fit in the pool beside
                    // what it holds; the temporaries go back when the op is done.
                    let fused = self.step.update.is_some() && !step.updates.is_empty();
                    let tmp = self.step.temporaries.of_op(op, fused);
                    let mut need = tmp;
                    for &c in &step.creates {
                        if !ids.is_static(c) {
                            // Made again while held (or kept for a read): the old device
                            // copy goes first; a host copy stays.
                            run.drop_device(c)?;
                        }
                        need += run.sizes[c];
                    }
                    run.xfer.reserve(k, &op.to_string(), need)?;
                    for &c in &step.creates {
                        run.track[c].dev = run.sizes[c];
                        if let Some((WGRAD, i)) = ids.static_of(c) {
                            run.st.dev[i][WGRAD] = true;
                            for &q in &self.p.weights[i] {
                                let shape = self.p.net.params[q].shape.clone();
                                self.grads[q] = Some(crate::value::zeros::<B>(shape, self.device));
                                self.zeroed[q] = true;
                            }
                        }
                    }
                    let start = Instant::now();
                    self.compute(k, op, step, &mut run.held).map_err(|e| at_op(e, k, op))?;
                    if time_ops {
                        sync::<B>(self.device)?;
                        self.op_seconds[k] = start.elapsed().as_secs_f64();
                    }
                    run.xfer.release(tmp);
                    for &r in &step.frees {
                        run.release(r)?;
                    }
                    run.let_go_after(k);
                    if let Action::Backward { stage: i, .. } = step.action {
                        if run.st.fused {
                            self.after_backward(k, op, i, run)?;
                        }
                    }
                }
                Action::CpuUpdate { stage, .. } => self.cpu_update(k, op, stage, run)?,
                Action::Free { tensor: id, .. } if ids.is_static(id) => self.free_static(k, op, id, run)?,
                Action::Free { tensor: id, .. } => run.release(id)?,
                Action::Offload { tensor: id, upload, .. } if ids.is_static(id) => {
                    self.offload_static(k, op, id, upload, run)?
                }
                Action::Offload { tensor: id, hold_until, .. } => run.offload(k, op, id, hold_until)?,
                Action::Prefetch { tensor: id, .. } if ids.is_static(id) => self.prefetch_static(k, op, id, run)?,
                Action::Prefetch { tensor: id, .. } => run.prefetch(k, op, id)?,
            }
        }
        // A prefetch still in flight (a period's last ops bring in what the next period
        // reads first) lands before the step ends.
        for id in 0..run.track.len() {
            self.settle(run, id)?;
        }
        Ok(())
    }

    /// Runs one compute step of a chain schedule on the tensors `held`: what it reads and
    /// also frees is taken from `held`, what it frees unread is dropped first, the rest of
    /// what it reads is shared.
    fn compute(&mut self, k: usize, op: &Op, step: &Step, h: &mut Held<B>) -> Result<(), RuntimeError> {
        let ids = h.ids;
        let gone = |id: usize| sched_err(k, op, format!("{:?} is not on the device", ids.tensor(id)));
        for &f in step.frees.iter().filter(|f| !step.reads.contains(f)) {
            h.clear(f);
        }
        let take = |id: usize| step.frees.contains(&id);
        match step.action {
            Action::Forward { stage, mode, input, output } => {
                let a = h.boundary(input, take(input)).ok_or_else(|| gone(input))?;
                let grad = mode == ForwardMode::KeepAll;
                let (out, inner) = self.forward_stage(stage, a, grad)?;
                h.set(output, Slot::from_forward(out, inner, grad));
            }
            Action::Loss { input, output } => {
                let a = h.boundary(input, take(input)).ok_or_else(|| gone(input))?;
                h.set(output, Slot::Grad(self.loss_stage(&a)?));
            }
            Action::Backward { stage, input, grad_in, saved, output, .. } => {
                let d = h.take_grad(grad_in).ok_or_else(|| gone(grad_in))?;
                let s = h.take_saved(saved).ok_or_else(|| gone(saved))?;
                let a = h.boundary(input, take(input)).ok_or_else(|| gone(input))?;
                h.set(output, Slot::Grad(self.backward_stage(stage, d, &a, s)?));
            }
            _ => unreachable!("a compute step"),
        }
        Ok(())
    }
}

/// A part of a chain tensor as it travels to the host and back: a boundary tensor (of
/// `a_i`, `ā_i` or `δ_i`) or an inner saved tensor of `ā_i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    Boundary(TensorId),
    Inner(Key),
    /// A parameter (of `Weight(i)`).
    Param(usize),
    /// A parameter's gradient (of `WeightGrad(i)`).
    Grad(usize),
    /// A parameter's first and second moments (of `OptState(i)`).
    M(usize),
    V(usize),
}

/// A chain step's standing of the static tensors beside the pools.
struct StaticRun<B: Backend> {
    /// Per stage, whether `Weight(i)`, `WeightGrad(i)`, `OptState(i)` are on the device
    /// (from a prefetch's issue on).
    dev: Vec<[bool; 3]>,
    /// Each parameter's up-to-date host copy: the job that made it.
    fresh: Vec<Option<usize>>,
    /// Parameters a weight prefetch in flight takes from the device (another stage's
    /// copy, up to date) instead of the host.
    pending: HashMap<usize, Parts<B, Part>>,
    /// The stages the host CPU updates.
    on_cpu: Vec<bool>,
    /// The schedule names the static tensors: each stage is updated in its backward.
    fused: bool,
}

impl<B: Backend> StaticRun<B> {
    /// Drops the host copy `job` made, and forgets what it held up to date.
    fn drop_host<K: Clone + PartialEq + Send + Sync + 'static>(
        &mut self,
        xfer: &mut Transfers<'_, '_, B, K>,
        job: usize,
    ) {
        xfer.drop_host(job);
        self.fresh.iter_mut().filter(|f| **f == Some(job)).for_each(|f| *f = None);
    }
}

/// What a chain compute step creates: `a_{i+1}`, `ā_{i+1}` or `δ_i`.
enum Slot<B: Backend> {
    Act(Env<B>),
    Saved(SavedSet<B>),
    Grad(GradMap<B>),
}

impl<B: Backend> Slot<B> {
    /// A forward's output: a saved set with its inner tensors if it kept its graph.
    fn from_forward(out: Env<B>, inner: HashMap<Key, Value<B>>, kept: bool) -> Self {
        if kept {
            Slot::Saved(SavedSet { boundary: out, inner })
        } else {
            Slot::Act(out)
        }
    }
}

/// The chain tensors whose device copies the step holds.
struct Held<B: Backend> {
    ids: Ids,
    act: Vec<Option<Env<B>>>,
    sav: Vec<Option<SavedSet<B>>>,
    delta: Vec<Option<GradMap<B>>>,
}

impl<B: Backend> Held<B> {
    fn new(ids: Ids) -> Self {
        Held {
            ids,
            act: (0..ids.n()).map(|_| None).collect(),
            sav: (0..ids.n()).map(|_| None).collect(),
            delta: (0..ids.n()).map(|_| None).collect(),
        }
    }

    fn present(&self, id: usize) -> bool {
        let (kind, i) = (id / self.ids.n(), id % self.ids.n());
        match kind {
            0 => self.act[i].is_some(),
            1 => self.sav[i].is_some(),
            2 => self.delta[i].is_some(),
            _ => false,
        }
    }

    fn clear(&mut self, id: usize) {
        let (kind, i) = (id / self.ids.n(), id % self.ids.n());
        match kind {
            0 => self.act[i] = None,
            1 => self.sav[i] = None,
            2 => self.delta[i] = None,
            _ => {}
        }
    }

    /// The boundary tensors of `a_i` through `id` (`Activation(i)` or `Saved(i)`): taken
    /// from `held` if `take`, else shared.
    fn boundary(&mut self, id: usize, take: bool) -> Option<Env<B>> {
        let (kind, i) = (id / self.ids.n(), id % self.ids.n());
        match (kind, take) {
            (0, true) => self.act[i].take(),
            (0, false) => self.act[i].clone(),
            (1, true) => self.sav[i].take().map(|s| s.boundary),
            (1, false) => self.sav[i].as_ref().map(|s| s.boundary.clone()),
            _ => None,
        }
    }

    /// `δ_i`, taken from `held`.
    fn take_grad(&mut self, id: usize) -> Option<GradMap<B>> {
        (id / self.ids.n() == 2).then(|| self.delta[id % self.ids.n()].take()).flatten()
    }

    /// `ā_i`, taken from `held`.
    fn take_saved(&mut self, id: usize) -> Option<SavedSet<B>> {
        (id / self.ids.n() == 1).then(|| self.sav[id % self.ids.n()].take()).flatten()
    }

    /// Holds what a compute step created.
    fn set(&mut self, id: usize, slot: Slot<B>) {
        let i = id % self.ids.n();
        match slot {
            Slot::Act(env) => self.act[i] = Some(env),
            Slot::Saved(set) => self.sav[i] = Some(set),
            Slot::Grad(map) => self.delta[i] = Some(map),
        }
    }

    /// Handles to the tensor's parts (the device copy stays).
    fn parts(&self, id: usize) -> Parts<B, Part> {
        let (kind, i) = (id / self.ids.n(), id % self.ids.n());
        let boundary = |env: &Env<B>| env.iter().map(|(&t, v)| (Part::Boundary(t), v.clone())).collect::<Vec<_>>();
        match kind {
            0 => self.act[i].as_ref().map(boundary).unwrap_or_default(),
            1 => self.sav[i]
                .as_ref()
                .map(|s| {
                    let mut parts = boundary(&s.boundary);
                    parts.extend(s.inner.iter().map(|(&k, v)| (Part::Inner(k), v.clone())));
                    parts
                })
                .unwrap_or_default(),
            2 => self.delta[i]
                .as_ref()
                .map(|d| d.iter().map(|(&t, g)| (Part::Boundary(t), Value::Float(g.clone()))).collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// The tensor's parts, no longer held here.
    fn take(&mut self, id: usize) -> Parts<B, Part> {
        let parts = self.parts(id);
        self.clear(id);
        parts
    }

    /// Holds the tensor again, from its parts.
    fn put(&mut self, id: usize, parts: Parts<B, Part>) {
        let (kind, i) = (id / self.ids.n(), id % self.ids.n());
        let mut boundary = Env::new();
        let mut inner = HashMap::new();
        for (part, v) in parts {
            match part {
                Part::Boundary(t) => boundary.insert(t, v),
                Part::Inner(k) => inner.insert(k, v),
                _ => None,
            };
        }
        match kind {
            0 => self.act[i] = Some(boundary),
            1 => self.sav[i] = Some(SavedSet { boundary, inner }),
            2 => self.delta[i] = Some(boundary.into_iter().filter_map(|(t, v)| Some((t, v.float()?))).collect()),
            _ => {}
        }
    }
}

/// Bytes of each chain tensor as the pool counts them: its tensors at their declared
/// sizes, a view and its root once (as the chain counts data nodes).
fn chain_sizes(p: &Program, ids: Ids, moments: u64) -> Vec<u64> {
    let net = &p.net;
    let roots = |ts: &mut dyn Iterator<Item = TensorId>| {
        let set: std::collections::BTreeSet<TensorId> = ts.map(|t| net.root(t)).collect();
        set.into_iter().map(|t| net.bytes(&net.tensors[t].shape, net.tensors[t].elem)).sum::<u64>()
    };
    let mut sizes = vec![0; ids.count()];
    for (i, stage) in static_sizes(p, moments).into_iter().enumerate() {
        for kind in [WEIGHT, WGRAD, STATE] {
            sizes[ids.stat(kind, i)] = stage[kind];
        }
    }
    for i in 0..ids.n() {
        let b = &p.boundary[i];
        sizes[ids.act(i)] = roots(&mut b.iter().copied());
        let grads = b.iter().copied().filter(|&t| net.tensors[t].requires_grad && net.tensors[t].elem == Elem::Float);
        sizes[ids.grad(i)] = roots(&mut grads.into_iter());
        if i >= 1 {
            // The chain's `xbar[i]` adds to `x[i]` what stage `i-1` makes for its backward;
            // a saved view of an older tensor is counted where that tensor is.
            let saved = &p.stages[i - 1].saved;
            let made_here = |t: TensorId| net.tensors[net.root(t)].producer.is_some_and(|o| p.stage_of[o] == i - 1);
            let tensors = saved.iter().filter_map(|k| match k {
                Key::Tensor(t) if made_here(*t) => Some(*t),
                _ => None,
            });
            let extras: u64 = saved
                .iter()
                .filter_map(|k| if let Key::Extra(o, j) = k { Some((*o, *j)) } else { None })
                .map(|(o, j)| {
                    let declared = net.ops[o].decl.saved.iter().filter_map(|s| match s {
                        Saved::Extra { shape, elem, .. } => Some(net.bytes(shape, *elem)),
                        _ => None,
                    });
                    declared.clone().nth(j).unwrap_or(0)
                })
                .sum();
            sizes[ids.sav(i)] = roots(&mut b.iter().copied().chain(tensors)) + extras;
        }
    }
    sizes
}

/// `schedule`'s program for a step of `statics` on a chain of `l` stages: see
/// [`lower_checked`].
pub fn lower_step<B: Backend>(schedule: &Schedule, l: usize, statics: &Statics<B>) -> Result<Vec<Step>, RuntimeError> {
    lower_checked(schedule, l, &statics.device)
}

/// The chain schedule lowered ([`lower::lower_chain`]) from where the step's static
/// tensors start, refusing what the executor cannot run before any of it runs: an op the
/// lowering refuses, a read of a tensor not on the device, a partial transfer.
fn lower_checked(schedule: &Schedule, l: usize, device: &[[bool; 3]]) -> Result<Vec<Step>, RuntimeError> {
    let ids = Ids::with_statics(l);
    let on = |d: bool| Copies { device: d, host: false };
    let starts: Vec<StageStart> =
        device.iter().map(|d| StageStart { weight: on(d[WEIGHT]), grad: on(d[WGRAD]), state: on(d[STATE]) }).collect();
    let program = lower::lower_chain(&schedule.ops, ids, schedule.periodic, &starts, 1);
    let ops = &schedule.ops;
    for (k, step) in program.steps.iter().enumerate() {
        if let Some(m) = step.missing.filter(|&m| !ids.is_static(m)) {
            return Err(sched_err(k, &ops[k], format!("{:?} is not available", ids.tensor(m))));
        }
        if let Action::Offload { fraction, .. } | Action::Prefetch { fraction, .. } = step.action {
            if fraction != 1.0 {
                return Err(sched_err(
                    k,
                    &ops[k],
                    format!(
                        "fraction {fraction}: the executor moves whole tensors (fraction 1); \
                         partial transfers are a relaxation for the planner only"
                    ),
                ));
            }
        }
    }
    match program.refused {
        Some((k, Refusal::OutOfRange(what))) => Err(sched_err(k, &ops[k], format!("{what} is not in this chain"))),
        Some((k, Refusal::Invalid(why))) => Err(sched_err(k, &ops[k], why)),
        None => Ok(program.steps),
    }
}

/// Where a chain tensor stands with the pools.
#[derive(Debug, Clone, Default)]
struct Track {
    /// Device pool bytes its device copy holds (0: not on the device, or offloaded).
    dev: u64,
    /// The offload whose host copy it has (or is being made).
    host: Option<usize>,
    /// `(until, offload, bytes)`: a device copy kept after an offload for the compute ops
    /// up to `until` that read it.
    hold: Option<(usize, usize, u64)>,
    /// Its prefetch in flight.
    prefetch: Option<usize>,
}

/// A chain step's tensors, their standing with the pools, and the transfer machinery.
struct ChainRun<'s, 'e, B: Backend> {
    held: Held<B>,
    track: Vec<Track>,
    sizes: Vec<u64>,
    xfer: Transfers<'s, 'e, B, Part>,
    st: StaticRun<B>,
}

impl<B: Backend> ChainRun<'_, '_, B> {
    /// Waits for the tensor's prefetch in flight, if any.
    fn settle(&mut self, id: usize) -> Result<(), RuntimeError> {
        if let Some(job) = self.track[id].prefetch.take() {
            let parts = self.xfer.wait_prefetch(job)?;
            self.held.put(id, parts);
        }
        Ok(())
    }

    /// Drops the tensor's device copy and gives its bytes back to the pool.
    fn drop_device(&mut self, id: usize) -> Result<(), RuntimeError> {
        self.settle(id)?;
        self.held.clear(id);
        let t = &mut self.track[id];
        if let Some((_, job, bytes)) = t.hold.take() {
            self.xfer.let_go(job, bytes);
        }
        if t.dev > 0 {
            self.xfer.release(std::mem::take(&mut t.dev));
        }
        Ok(())
    }

    /// Releases the tensor: its device copy and its host copy.
    fn release(&mut self, id: usize) -> Result<(), RuntimeError> {
        self.drop_device(id)?;
        if let Some(job) = self.track[id].host.take() {
            self.xfer.drop_host(job);
        }
        Ok(())
    }

    /// Lets go of the device copies kept for reads up to compute op `k`.
    fn let_go_after(&mut self, k: usize) {
        for id in 0..self.track.len() {
            if let Some((until, job, bytes)) = self.track[id].hold {
                if until == k {
                    self.track[id].hold = None;
                    self.held.clear(id);
                    self.xfer.let_go(job, bytes);
                }
            }
        }
    }

    /// Schedule op `k`, an offload of `tensor`.
    fn offload(&mut self, k: usize, op: &Op, id: usize, hold_until: Option<usize>) -> Result<(), RuntimeError> {
        let tensor = self.held.ids.tensor(id);
        self.settle(id)?;
        if !self.held.present(id) || self.track[id].hold.is_some() {
            return Err(sched_err(k, op, format!("{tensor:?} is not on the device")));
        }
        if let Some(old) = self.track[id].host.take() {
            self.xfer.drop_host(old);
        }
        let bytes = std::mem::take(&mut self.track[id].dev);
        let text = op.to_string();
        match hold_until {
            Some(until) => {
                let parts = self.held.parts(id);
                self.xfer.offload(k, &text, parts, bytes, false)?;
                self.track[id].hold = Some((until, k, bytes));
            }
            None => {
                let parts = self.held.take(id);
                self.xfer.offload(k, &text, parts, bytes, true)?;
            }
        }
        self.track[id].host = Some(k);
        Ok(())
    }

    /// Schedule op `k`, a prefetch of `tensor`.
    fn prefetch(&mut self, k: usize, op: &Op, id: usize) -> Result<(), RuntimeError> {
        let tensor = self.held.ids.tensor(id);
        let t = &self.track[id];
        if t.prefetch.is_some() || (self.held.present(id) && t.hold.is_none()) {
            return Err(sched_err(k, op, format!("{tensor:?} is already on the device")));
        }
        let Some(source) = t.host else {
            return Err(sched_err(k, op, format!("{tensor:?} has no host copy to prefetch")));
        };
        if let Some((_, job, bytes)) = self.track[id].hold.take() {
            self.held.clear(id);
            self.xfer.let_go(job, bytes);
        }
        let bytes = self.sizes[id];
        self.xfer.prefetch(k, &op.to_string(), vec![(source, None)], bytes)?;
        self.track[id].prefetch = Some(k);
        self.track[id].dev = bytes;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str, l: usize, extra: &[(usize, Op)]) -> String {
        let mut schedule = Schedule::from_notation(View::Chain, text).unwrap().resolve_loss(l);
        for &(at, op) in extra {
            schedule.ops.insert(at, op);
        }
        lower_checked(&schedule, l, &vec![[true; 3]; l]).unwrap_err().to_string()
    }

    #[test]
    fn what_the_executor_cannot_run_is_refused_before_anything_runs() {
        let half = Op::Offload { tensor: Tensor::Saved(1), fraction: 0.5 };
        let e = refused("F0all F1all L B1 B0", 2, &[(1, half)]);
        assert!(e.starts_with("schedule op 1 ([offload Saved(1) 0.5])") && e.contains("whole tensors"), "{e}");
        let w = Op::Prefetch { tensor: Tensor::Weight(2), fraction: 1.0 };
        let e = refused("F0all F1all L B1 B0", 2, &[(0, w)]);
        assert!(e.contains("Weight(2) (the chain has 2 stages) is not in this chain"), "{e}");
        let e = refused("F0all L B1 B0", 2, &[]);
        assert!(e.starts_with("schedule op 1 (B2)") && e.contains("Activation(2) is not available"), "{e}");
    }
}
