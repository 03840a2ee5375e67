//! What a step leaves for the next: the parameters, their optimizer state and the chain
//! static tensors' host copies ([`Statics`]).

use super::*;

/// A host copy a step leaves for the next, with its bytes.
pub(super) type Carried = (Arc<HostCopy<Part>>, u64);

/// The parameters, their gradients' placement and the optimizer state between steps:
/// device copies per parameter, host copies per chain static tensor.
pub struct Statics<B: Backend> {
    /// Each parameter's device copy (`None`: only on the host).
    pub(crate) params: Vec<Option<FloatTensor<B>>>,
    /// Each parameter's moments on the device (empty for an optimizer without state).
    pub(crate) moments: Vec<Option<Moments<B>>>,
    /// Per stage, whether `Weight(i)`, `WeightGrad(i)`, `OptState(i)` are on the device
    /// (a gradient's device copy is made afresh by each step).
    pub(crate) device: Vec<[bool; 3]>,
    /// Per stage, the host copies of `Weight(i)`, `WeightGrad(i)`, `OptState(i)`.
    pub(crate) hosts: Vec<[Option<Carried>; 3]>,
    /// Each parameter's up-to-date host copy: the stage whose `Weight` host copy has it.
    pub(crate) fresh: Vec<Option<usize>>,
}

impl<B: Backend> Statics<B> {
    /// Everything on the device, for a chain of `stages` stages.
    pub(crate) fn new(params: Vec<FloatTensor<B>>, moments: Vec<Moments<B>>, stages: usize) -> Statics<B> {
        let n = params.len();
        Statics {
            params: params.into_iter().map(Some).collect(),
            moments: moments.into_iter().map(Some).collect(),
            device: vec![[true; 3]; stages],
            hosts: (0..stages).map(|_| [None, None, None]).collect(),
            fresh: vec![None; n],
        }
    }

    /// Optimizer states per parameter (2 for AdamW, 0 for SGD).
    fn moments_per_param(&self) -> u64 {
        if self.moments.is_empty() {
            0
        } else {
            2
        }
    }

    /// Device bytes of the parameters and moments on the device (each tensor once).
    pub(crate) fn device_bytes(&self) -> u64 {
        let bytes = |t: &FloatTensor<B>| (t.shape().num_elements() * t.dtype().size()) as u64;
        let params: u64 = self.params.iter().flatten().map(bytes).sum();
        let moments: u64 = self.moments.iter().flatten().map(|(m, v)| bytes(m) + bytes(v)).sum();
        params + moments
    }

    /// Whether every parameter and moment is on the device and nothing is on the host.
    pub(crate) fn all_on_device(&self) -> bool {
        self.params.iter().all(Option::is_some) && self.moments.iter().all(Option::is_some)
    }

    /// Every parameter's current value, from its device copy or its up-to-date host copy.
    pub(crate) fn current_values(&self) -> Result<Vec<Vec<f32>>, RuntimeError> {
        (0..self.params.len())
            .map(|q| match &self.params[q] {
                Some(t) => crate::read_floats::<B>(t.clone()),
                None => match self.fresh_part(q) {
                    Some(HostValue::Float(d)) => {
                        d.to_vec::<f32>().map_err(|e| RuntimeError::Readback(format!("{e:?}")))
                    }
                    _ => Err(lost(q)),
                },
            })
            .collect()
    }

    /// Parameter `q`'s current value as host data: from its device copy, or its
    /// up-to-date host copy.
    fn host_value(&self, q: usize) -> Result<HostValue, RuntimeError> {
        let _host = memory::host_scope();
        if let Some(t) = &self.params[q] {
            return HostValue::read(Value::<B>::Float(t.clone()));
        }
        self.fresh_part(q).cloned().ok_or_else(|| lost(q))
    }

    /// Parameter `q`'s part in its up-to-date host copy.
    fn fresh_part(&self, q: usize) -> Option<&HostValue> {
        let stage = self.fresh[q]?;
        let (copy, _) = self.hosts[stage][WEIGHT].as_ref()?;
        copy.parts.iter().find(|(k, _)| *k == Part::Param(q)).map(|(_, v)| v)
    }

    /// Drops stage `i`'s host copy of `kind` and what pointed at it.
    fn drop_host(&mut self, i: usize, kind: usize) {
        let copy = self.hosts[i][kind].take();
        if kind == WEIGHT {
            self.fresh.iter_mut().filter(|f| **f == Some(i)).for_each(|f| *f = None);
        }
        let _host = memory::host_scope();
        drop(copy);
    }

    /// Puts the static tensors where a step that starts at `starts` expects them (as the
    /// simulator starts a period), copying between the device and the host directly
    /// (neither timed nor throttled: this happens before a step, not in one). Host copies
    /// are made first (from the device copies), then device copies brought in (from the
    /// host copies), then what is not wanted dropped. Returns whether anything moved.
    pub(crate) fn arrange(
        &mut self,
        p: &Program,
        starts: &[StageStart],
        device: &B::Device,
    ) -> Result<bool, RuntimeError> {
        let l = p.len();
        let sizes = static_sizes(p, self.moments_per_param());
        let mut moved = false;
        for (i, want) in starts.iter().enumerate().take(l) {
            // A weights' host copy serves if each of its parameters has an up-to-date host
            // copy: this one, or (a tied parameter updated by another stage) that stage's.
            let weights = &p.weights[i];
            let fresh = self.hosts[i][WEIGHT].is_some() && weights.iter().all(|&q| self.fresh_part(q).is_some());
            if want.weight.host && !fresh {
                let parts = weights
                    .iter()
                    .map(|&q| Ok((Part::Param(q), self.host_value(q)?)))
                    .collect::<Result<Vec<_>, RuntimeError>>()?;
                self.drop_host(i, WEIGHT);
                self.hosts[i][WEIGHT] = Some((Arc::new(HostCopy { parts }), sizes[i][WEIGHT]));
                weights.iter().for_each(|&q| self.fresh[q] = Some(i));
                moved = true;
            }
            if want.state.host && self.hosts[i][STATE].is_none() {
                let mut parts: Parts<B, Part> = Vec::new();
                for &q in &p.weights[i] {
                    if let Some(slot) = self.moments.get(q) {
                        let (m, v) = slot.clone().ok_or_else(|| lost_state(i))?;
                        parts.push((Part::M(q), Value::Float(m)));
                        parts.push((Part::V(q), Value::Float(v)));
                    }
                }
                self.hosts[i][STATE] = Some((Arc::new(HostCopy::read(parts)?), sizes[i][STATE]));
                moved = true;
            }
            if want.grad.host && self.hosts[i][WGRAD].is_none() {
                let zeros = p.weights[i]
                    .iter()
                    .map(|&q| {
                        let shape = p.net.params[q].shape.clone();
                        (Part::Grad(q), Value::<B>::Float(crate::value::zeros::<B>(shape, device)))
                    })
                    .collect();
                self.hosts[i][WGRAD] = Some((Arc::new(HostCopy::read(zeros)?), sizes[i][WGRAD]));
                moved = true;
            }
        }
        for (i, want) in starts.iter().enumerate().take(l) {
            if want.weight.device && !self.device[i][WEIGHT] {
                for &q in &p.weights[i] {
                    if self.params[q].is_none() {
                        let value = self.fresh_part(q).ok_or_else(|| lost(q))?.upload::<B>(device);
                        self.params[q] = value.float();
                    }
                }
                moved = true;
            }
            if want.state.device && !self.device[i][STATE] {
                let (copy, _) = self.hosts[i][STATE].as_ref().ok_or_else(|| lost_state(i))?;
                let mut halves: HashMap<usize, [Option<FloatTensor<B>>; 2]> = HashMap::new();
                for (k, v) in &copy.parts {
                    let (q, half) = match *k {
                        Part::M(q) => (q, 0),
                        Part::V(q) => (q, 1),
                        _ => continue,
                    };
                    halves.entry(q).or_default()[half] = v.upload::<B>(device).float();
                }
                for (q, [m, v]) in halves {
                    self.moments[q] = m.zip(v);
                }
                moved = true;
            }
        }
        for (i, want) in starts.iter().enumerate().take(l) {
            if !want.state.device && self.device[i][STATE] {
                if self.hosts[i][STATE].is_none() {
                    return Err(lost_state(i));
                }
                for &q in &p.weights[i] {
                    if let Some(slot) = self.moments.get_mut(q) {
                        *slot = None;
                    }
                }
                moved = true;
            }
            if !want.state.host && self.hosts[i][STATE].is_some() {
                if !want.state.device {
                    return Err(lost_state(i));
                }
                self.drop_host(i, STATE);
                moved = true;
            }
            if !want.grad.host && self.hosts[i][WGRAD].is_some() {
                self.drop_host(i, WGRAD);
                moved = true;
            }
            moved |= self.device[i][WEIGHT] != want.weight.device || self.device[i][WGRAD] != want.grad.device;
            self.device[i] = [want.weight.device, want.grad.device, want.state.device];
        }
        // Weights' host copies not wanted go (a parameter then lives on the device), then
        // device copies no stage keeps (a parameter then lives in a host copy).
        for (i, want) in starts.iter().enumerate().take(l) {
            if !want.weight.host && self.hosts[i][WEIGHT].is_some() {
                self.drop_host(i, WEIGHT);
                moved = true;
            }
        }
        for q in 0..self.params.len() {
            // A parameter no stage owns (tied, or read by none) stays on the device.
            let kept = p.owned_by(q).is_none_or(|s| self.device[s][WEIGHT]);
            if !kept && self.params[q].is_some() {
                if self.fresh_part(q).is_none() {
                    return Err(lost(q));
                }
                self.params[q] = None;
            }
        }
        Ok(moved)
    }
}

/// Parameter `q` would be left with no up-to-date copy anywhere.
fn lost(q: usize) -> RuntimeError {
    RuntimeError::Schedule {
        index: 0,
        op: "the step's start".into(),
        why: format!("parameter {q} has no up-to-date copy on the device or the host"),
    }
}

fn lost_state(i: usize) -> RuntimeError {
    RuntimeError::Schedule {
        index: 0,
        op: "the step's start".into(),
        why: format!("the optimizer state of stage {i} has no copy on the device or the host"),
    }
}

/// Per stage, the bytes of `Weight(i)`, `WeightGrad(i)` and `OptState(i)` at their
/// declared sizes (`moments` optimizer states per parameter).
pub(super) fn static_sizes(p: &Program, moments: u64) -> Vec<[u64; 3]> {
    let bytes = |q: usize| p.net.bytes(&p.net.params[q].shape, Elem::Float);
    (0..p.len())
        .map(|i| {
            let owned: u64 = p.weights[i].iter().map(|&q| bytes(q)).sum();
            [p.weights[i].iter().map(|&q| bytes(q)).sum(), owned, moments * owned]
        })
        .collect()
}
