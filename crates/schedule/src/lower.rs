//! The one meaning of a chain schedule: each op lowered to the tensors it reads, creates,
//! frees and moves (Shilova's thesis, Table 2.1, with rotor's 0-based indices). The
//! simulator (`pebble-sim`) times and measures this program and the executors run it;
//! none of them decides these things on its own.
//!
//! Tensors: `Activation(i)` (`a_i` alone, `x[i]`), `Saved(i)` for `i ≥ 1` (`ā_i`,
//! `xbar[i]`, which contains `a_i`), `Grad(i)` (`δ_i`, `x[i]`) and, when the chain has
//! them, `Weight(i)`, `WeightGrad(i)`, `OptState(i)` (`w[i]`, `g[i]`, `o[i]`, resident from
//! the start and part of `static_bytes`). "`a_i` is available" means `Activation(i)` or
//! `Saved(i)` is whole on the device; an op reads `Activation(i)` when it can, `Saved(i)`
//! otherwise.
//!
//! * `F_i^∅` reads `a_i`, creates `Activation(i+1)`, and frees `Activation(i)` if that is
//!   what it read (a saved set persists).
//! * `F_i^ck` reads `a_i`, creates `Activation(i+1)`.
//! * `F_i^all` reads `a_i`, creates `Saved(i+1)`.
//! * `B_L` (the loss) reads `a_L`, creates `δ_L`, frees `Activation(L)`.
//! * `B_i` (`i < L`) reads `δ_{i+1}`, `ā_{i+1}` and `a_i`, creates `δ_i`, and frees
//!   `δ_{i+1}`, `ā_{i+1}`, `Activation(i+1)` and `Activation(i)` (whatever is left of
//!   them). With weight gradients it accumulates into `WeightGrad(i)` (creating it if no
//!   copy is on the device); unless the host CPU updates the stage, it updates the weights
//!   and the optimizer state in place (reading the state), which makes their host copies
//!   stale (the fused update of Beaumont et al. 2022).
//! * With weights, `F_i` and `B_i` (`i < L`) also read `Weight(i)`.
//! * `Free(Weight(i))` and `Free(OptState(i))` drop the device copy only; any other free
//!   releases the tensor's copies everywhere.
//! * An offload of a weight or a state read again before its next offload, prefetch or
//!   free is an *upload* ([`placement::is_upload`]): the device copy stays until a free.
//!   Any other offload's device copy stays readable, for the compute ops after it that read
//!   the tensor ([`Action::Offload`]'s `hold_until`), until the tensor is prefetched,
//!   created again or freed.
//!
//! A periodic schedule is lowered over several periods: each period after the first
//! starts with a new input `a_0` in place of the last `δ_0`.
//!
//! Graph schedules are lowered by [`lower_graph`] (Zhao's §1.3).

use pebble_graph::Chain;
use serde::Serialize;
use thiserror::Error;

use crate::placement::{self, Copies, StageStart};
use crate::{ForwardMode, Op, Tensor};

/// Tolerance on fractions.
const EPS: f64 = 1e-9;

/// The static tensor kinds, in [`Ids::stat`]'s order.
pub const WEIGHT: usize = 0;
/// See [`WEIGHT`].
pub const WGRAD: usize = 1;
/// See [`WEIGHT`].
pub const STATE: usize = 2;

/// Dense ids of a chain's tensors, the one numbering the simulator and the executors
/// share: `a_i`, `ā_i`, `δ_i` for `i` in `0..n` (`n = L + 1`), then `Weight(i)`,
/// `WeightGrad(i)`, `OptState(i)` (ids exist for all of them; [`Ids::of`] names only those
/// the chain has).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Ids {
    /// The chain's stage count `L`.
    pub l: usize,
    /// The chain has weights `w`.
    pub weights: bool,
    /// The chain has weight gradients `g`.
    pub grads: bool,
    /// The chain has optimizer states `o`.
    pub states: bool,
}

impl Ids {
    /// The ids of `chain`'s tensors.
    pub fn of_chain(chain: &Chain) -> Ids {
        Ids { l: chain.len(), weights: chain.w.is_some(), grads: chain.g.is_some(), states: chain.o.is_some() }
    }
    /// The ids of a chain of `l` stages that has weights, their gradients and states (an
    /// executor's, which always holds them).
    pub fn with_statics(l: usize) -> Ids {
        Ids { l, weights: true, grads: true, states: true }
    }
    /// `L + 1`.
    pub fn n(self) -> usize {
        self.l + 1
    }
    /// How many ids there are.
    pub fn count(self) -> usize {
        6 * self.n()
    }
    /// `Activation(i)`.
    pub fn act(self, i: usize) -> usize {
        i
    }
    /// `Saved(i)`.
    pub fn sav(self, i: usize) -> usize {
        self.n() + i
    }
    /// `Grad(i)`.
    pub fn grad(self, i: usize) -> usize {
        2 * self.n() + i
    }
    /// Static tensor `kind` ([`WEIGHT`], [`WGRAD`], [`STATE`]) of stage `i`.
    pub fn stat(self, kind: usize, i: usize) -> usize {
        (3 + kind) * self.n() + i
    }
    /// `Weight(i)`.
    pub fn weight(self, i: usize) -> usize {
        self.stat(WEIGHT, i)
    }
    /// `WeightGrad(i)`.
    pub fn wgrad(self, i: usize) -> usize {
        self.stat(WGRAD, i)
    }
    /// `OptState(i)`.
    pub fn state(self, i: usize) -> usize {
        self.stat(STATE, i)
    }
    /// Whether `id` is a static tensor (a weight, its gradient or its state).
    pub fn is_static(self, id: usize) -> bool {
        id >= 3 * self.n()
    }
    /// `(kind, stage)` of a static tensor.
    pub fn static_of(self, id: usize) -> Option<(usize, usize)> {
        self.is_static(id).then(|| (id / self.n() - 3, id % self.n()))
    }
    /// The id of a tensor of this chain, if it has it.
    pub fn of(self, t: Tensor) -> Option<usize> {
        let l = self.l;
        match t {
            Tensor::Activation(i) if i <= l => Some(self.act(i)),
            Tensor::Saved(i) if (1..=l).contains(&i) => Some(self.sav(i)),
            Tensor::Grad(i) if i <= l => Some(self.grad(i)),
            Tensor::Weight(i) if self.weights && i < l => Some(self.weight(i)),
            Tensor::WeightGrad(i) if self.grads && i < l => Some(self.wgrad(i)),
            Tensor::OptState(i) if self.states && i < l => Some(self.state(i)),
            _ => None,
        }
    }
    /// The tensor an id names.
    pub fn tensor(self, id: usize) -> Tensor {
        let i = id % self.n();
        match id / self.n() {
            0 => Tensor::Activation(i),
            1 => Tensor::Saved(i),
            2 => Tensor::Grad(i),
            3 => Tensor::Weight(i),
            4 => Tensor::WeightGrad(i),
            _ => Tensor::OptState(i),
        }
    }
    /// Why a tensor is not one of this chain's, for errors.
    fn not_ours(self, t: Tensor) -> String {
        match t {
            Tensor::Data(_) => {
                format!("{t:?} (a graph tensor; chain schedules name Activation, Saved, Grad, Weight, WeightGrad or OptState)")
            }
            Tensor::Weight(_) if !self.weights => format!("{t:?} (the chain has no weights `w`)"),
            Tensor::WeightGrad(_) if !self.grads => format!("{t:?} (the chain has no weight gradients `g`)"),
            Tensor::OptState(_) if !self.states => format!("{t:?} (the chain has no optimizer states `o`)"),
            Tensor::Saved(0) => "Saved(0) (there is no saved set ā_0; a_0 is Activation(0))".to_string(),
            _ => format!("{t:?} (the chain has {} stages)", self.l),
        }
    }
}

/// Bytes of a chain tensor: `x[i]` for `a_i` and `δ_i`, `xbar[i]` for `ā_i`, `w[i]`,
/// `g[i]`, `o[i]` for the static ones; 0 for a tensor the chain does not have. The one
/// size every reader of a chain schedule uses.
pub fn tensor_bytes(chain: &Chain, t: Tensor) -> u64 {
    let at = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
    let stat = |v: &Option<Vec<u64>>, i: usize| v.as_deref().map_or(0, |v| at(v, i));
    match t {
        Tensor::Activation(i) | Tensor::Grad(i) => at(&chain.x, i),
        Tensor::Saved(i) => at(&chain.xbar, i),
        Tensor::Weight(i) => stat(&chain.w, i),
        Tensor::WeightGrad(i) => stat(&chain.g, i),
        Tensor::OptState(i) => stat(&chain.o, i),
        Tensor::Data(_) => 0,
    }
}

/// What one step of a lowered chain schedule does.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// `F_stage` in `mode`: reads `a_stage` through `input`, creates `output`.
    Forward {
        /// The stage.
        stage: usize,
        /// How it keeps its graph.
        mode: ForwardMode,
        /// `Activation(stage)` or `Saved(stage)`.
        input: usize,
        /// `Activation(stage+1)` or `Saved(stage+1)`.
        output: usize,
    },
    /// The loss `B_L`: reads `a_L` through `input`, creates `δ_L`.
    Loss {
        /// `Activation(L)` or `Saved(L)`.
        input: usize,
        /// `Grad(L)`.
        output: usize,
    },
    /// `B_stage`: reads `δ_{stage+1}` (`grad_in`), `ā_{stage+1}` (`saved`) and `a_stage`
    /// (`input`), creates `δ_stage` (`output`).
    Backward {
        /// The stage.
        stage: usize,
        /// `Activation(stage)` or `Saved(stage)`.
        input: usize,
        /// `Grad(stage+1)`.
        grad_in: usize,
        /// `Saved(stage+1)`.
        saved: usize,
        /// `Grad(stage)`.
        output: usize,
        /// The optimizer step runs on the device inside this backward (the fused update),
        /// not on the host CPU.
        update_on_device: bool,
    },
    /// The optimizer step of a stage on the host CPU: reads `grad`'s host copy (released
    /// at its end) and updates `weight`'s and `state`'s host copies.
    CpuUpdate {
        /// The stage.
        stage: usize,
        /// `WeightGrad(stage)`.
        grad: usize,
        /// `Weight(stage)`.
        weight: usize,
        /// `OptState(stage)`, if the chain has states.
        state: Option<usize>,
    },
    /// A free: every copy of `tensor`, or its device copy only (a weight or a state).
    Free {
        /// The tensor.
        tensor: usize,
        /// Only the device copy goes.
        device_only: bool,
    },
    /// `fraction` of `tensor` to the host.
    Offload {
        /// The tensor.
        tensor: usize,
        /// The part moved.
        fraction: f64,
        /// A copy that keeps the device copy (a weight or state read again).
        upload: bool,
        /// The last step (index in the program) that reads the device copy after this
        /// offload, which must stay until that step ends; `None` if no step does.
        hold_until: Option<usize>,
    },
    /// `fraction` of `tensor` back to the device.
    Prefetch {
        /// The tensor.
        tensor: usize,
        /// The part moved.
        fraction: f64,
    },
}

/// One step of a lowered chain schedule: a schedule op and what it does to the tensors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    /// The index of its op in the schedule.
    pub op: usize,
    /// What it does.
    pub action: Action,
    /// Tensors a compute step reads whole on the device (it waits for their prefetches).
    pub reads: Vec<usize>,
    /// Tensors it creates on the device, at its start.
    pub creates: Vec<usize>,
    /// Tensors it frees at its end: every copy of each (those that have one).
    pub frees: Vec<usize>,
    /// Tensors it updates in place on the device: their host copies become stale.
    pub updates: Vec<usize>,
    /// The prefetch steps whose copies it reads.
    pub waits: Vec<usize>,
    /// The first tensor it reads that is not whole on the device at this point: the step
    /// cannot run (the simulator says why, with times; an executor refuses it).
    pub missing: Option<usize>,
}

/// An op the lowering refuses: it names no tensor or stage of the chain, or is not a chain
/// op, or breaks the order of a step.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Refusal {
    /// An index out of the chain's range.
    #[error("out of range: {0}")]
    OutOfRange(String),
    /// Not an op a chain schedule may have here.
    #[error("{0}")]
    Invalid(String),
}

/// A chain schedule lowered: its steps in program order (over every period of a periodic
/// one), up to the first op it refuses.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChainProgram {
    /// The ids its steps name.
    pub ids: Ids,
    /// The ops in one period (the schedule's length).
    pub period_len: usize,
    /// How many periods the steps cover.
    pub periods: usize,
    /// Which stages the host CPU updates.
    pub on_cpu: Vec<bool>,
    /// The steps, `periods × period_len` of them unless an op was refused.
    pub steps: Vec<Step>,
    /// The op refused (its index in the steps, and why), where the steps stop.
    #[serde(skip)]
    pub refused: Option<(usize, Refusal)>,
}

impl ChainProgram {
    /// The program, or the op it refuses and why.
    pub fn checked(self) -> Result<ChainProgram, (usize, Refusal)> {
        match self.refused {
            Some(r) => Err(r),
            None => Ok(self),
        }
    }
}

/// Where a tensor is, logically: what fraction of it is on the device, whether all of it
/// is readable there, and what fraction has a host copy.
#[derive(Debug, Clone, Copy, Default)]
struct Where {
    dev: f64,
    intact: bool,
    host: f64,
    from_prefetch: Option<usize>,
}

impl Where {
    fn present(&self) -> bool {
        self.dev > EPS || self.host > EPS
    }
    fn created(&mut self) {
        self.dev = 1.0;
        self.intact = true;
        self.from_prefetch = None;
    }
    fn released(&mut self) {
        *self = Where::default();
    }
    fn on_device(&self) -> bool {
        self.dev > EPS
    }
    /// `fraction` of it to the host; the device copy stays readable until it is
    /// prefetched, created again or freed.
    fn offloaded(&mut self, fraction: f64) {
        let rest = self.dev - fraction;
        self.dev = if rest <= EPS { 0.0 } else { rest };
        self.host = (self.host + fraction).min(1.0);
    }
    /// `fraction` of it back to the device by step `g`.
    fn prefetched(&mut self, fraction: f64, g: usize) {
        self.dev += fraction;
        self.intact = self.dev >= 1.0 - EPS;
        self.from_prefetch = Some(g);
    }
}

/// Lowers a chain schedule's `ops` over `periods` periods (1 for a one-off step), its
/// static tensors starting where `start` says (per stage; missing stages on the device).
pub fn lower_chain(ops: &[Op], ids: Ids, periodic: bool, start: &[StageStart], periods: usize) -> ChainProgram {
    let mut low = Lowering::new(ops, ids, periodic, start);
    let len = ops.len();
    let mut steps = Vec::with_capacity(len * periods);
    let mut refused = None;
    'periods: for p in 0..periods {
        if p > 0 {
            low.next_batch();
        }
        for (k, op) in ops.iter().enumerate() {
            match low.step(p * len + k, k, op) {
                Ok(step) => steps.push(step),
                Err(why) => {
                    refused = Some((p * len + k, why));
                    break 'periods;
                }
            }
        }
    }
    for (k, j) in std::mem::take(&mut low.holds) {
        if let Action::Offload { hold_until, .. } = &mut steps[k].action {
            *hold_until = Some(j);
        }
    }
    ChainProgram { ids, period_len: len, periods, on_cpu: low.on_cpu, steps, refused }
}

/// The state of one lowering.
struct Lowering<'o> {
    ops: &'o [Op],
    ids: Ids,
    periodic: bool,
    on_cpu: Vec<bool>,
    at: Vec<Where>,
    /// Which backwards ran in this period.
    done: Vec<bool>,
    /// The offload whose device copy each tensor keeps for reads.
    open: Vec<Option<usize>>,
    /// `(offload, a later step reading its copy)`, in program order: the last entry of
    /// each offload is its `hold_until`.
    holds: Vec<(usize, usize)>,
}

impl<'o> Lowering<'o> {
    fn new(ops: &'o [Op], ids: Ids, periodic: bool, start: &[StageStart]) -> Self {
        let mut at = vec![Where::default(); ids.count()];
        at[ids.act(0)].created();
        let has = [ids.weights, ids.grads, ids.states];
        for i in 0..ids.l {
            let s = start.get(i).copied().unwrap_or(StageStart::DEVICE);
            for (kind, copies) in [(WEIGHT, s.weight), (WGRAD, s.grad), (STATE, s.state)] {
                if has[kind] {
                    at[ids.stat(kind, i)] = placed(copies);
                }
            }
        }
        Lowering {
            ops,
            ids,
            periodic,
            on_cpu: placement::cpu_updated(ops, ids.l),
            at,
            done: vec![false; ids.n()],
            open: vec![None; ids.count()],
            holds: Vec::new(),
        }
    }

    /// A new period: the last `δ_0` (if on the device) gives way to a new input `a_0`.
    fn next_batch(&mut self) {
        let (g0, a0) = (self.ids.grad(0), self.ids.act(0));
        if self.at[g0].on_device() {
            self.release(g0);
        }
        self.at[a0].created();
        self.done.fill(false);
    }

    /// The id through which `a_i` is read: `Activation(i)` if whole on the device, else
    /// `Saved(i)` if it is, else `Activation(i)` (which is then missing).
    fn a_input(&self, i: usize) -> usize {
        let ids = self.ids;
        if self.at[ids.act(i)].intact {
            ids.act(i)
        } else if i >= 1 && self.at[ids.sav(i)].intact {
            ids.sav(i)
        } else {
            ids.act(i)
        }
    }

    fn id(&self, t: Tensor) -> Result<usize, Refusal> {
        self.ids.of(t).ok_or_else(|| Refusal::OutOfRange(self.ids.not_ours(t)))
    }

    fn release(&mut self, id: usize) {
        self.at[id].released();
        self.open[id] = None;
    }

    fn step(&mut self, g: usize, k: usize, op: &Op) -> Result<Step, Refusal> {
        let mut s = Step {
            op: k,
            action: Action::Free { tensor: 0, device_only: false },
            reads: Vec::new(),
            creates: Vec::new(),
            frees: Vec::new(),
            updates: Vec::new(),
            waits: Vec::new(),
            missing: None,
        };
        match *op {
            Op::Forward { stage, mode } => self.forward(&mut s, stage, mode)?,
            Op::Backward { stage } => self.backward(&mut s, stage)?,
            Op::CpuUpdate { stage } => self.cpu_update(&mut s, stage)?,
            Op::Free { tensor } => {
                let id = self.id(tensor)?;
                let device_only = matches!(tensor, Tensor::Weight(_) | Tensor::OptState(_));
                if device_only {
                    let w = &mut self.at[id];
                    (w.dev, w.intact, w.from_prefetch) = (0.0, false, None);
                } else {
                    self.release(id);
                }
                s.action = Action::Free { tensor: id, device_only };
            }
            Op::Offload { tensor, fraction } => {
                let id = self.id(tensor)?;
                let upload = matches!(tensor, Tensor::Weight(_) | Tensor::OptState(_))
                    && fraction >= 1.0
                    && placement::is_upload(self.ops, k, tensor, self.periodic, &self.on_cpu);
                let w = &mut self.at[id];
                if upload {
                    w.host = 1.0;
                } else {
                    w.offloaded(fraction);
                    if !self.ids.is_static(id) {
                        self.open[id] = Some(g);
                    }
                }
                s.action = Action::Offload { tensor: id, fraction, upload, hold_until: None };
            }
            Op::Prefetch { tensor, fraction } => {
                let id = self.id(tensor)?;
                self.at[id].prefetched(fraction, g);
                self.open[id] = None;
                s.action = Action::Prefetch { tensor: id, fraction };
            }
            Op::Compute { .. } => return Err(Refusal::Invalid("a graph op (compute node) in a chain schedule".into())),
            Op::Run { .. } | Op::Send { .. } => {
                return Err(Refusal::Invalid("a pipeline op in a chain schedule".into()))
            }
        }
        if op.is_compute() {
            self.account(&mut s, g);
        }
        Ok(s)
    }

    fn forward(&mut self, s: &mut Step, i: usize, mode: ForwardMode) -> Result<(), Refusal> {
        let (ids, l) = (self.ids, self.ids.l);
        if i >= l {
            return Err(Refusal::OutOfRange(format!(
                "forward stage {i} (the chain has stages 0..{l}; the loss is B{l})"
            )));
        }
        let input = self.a_input(i);
        s.reads.push(input);
        if ids.weights {
            s.reads.push(ids.weight(i));
        }
        let output = if mode == ForwardMode::KeepAll { ids.sav(i + 1) } else { ids.act(i + 1) };
        s.creates.push(output);
        if mode == ForwardMode::Discard && input == ids.act(i) {
            s.frees.push(input);
        }
        s.action = Action::Forward { stage: i, mode, input, output };
        Ok(())
    }

    fn backward(&mut self, s: &mut Step, i: usize) -> Result<(), Refusal> {
        let (ids, l) = (self.ids, self.ids.l);
        if i > l {
            return Err(Refusal::OutOfRange(if i == usize::MAX {
                "the loss marker `L` (resolve it with Schedule::resolve_loss)".to_string()
            } else {
                format!("backward stage {i} (the chain has stages 0..={l}, the loss being B{l})")
            }));
        }
        if self.done[i] {
            return Err(Refusal::Invalid(if i == l {
                "the loss already ran".to_string()
            } else {
                format!("B{i} already ran (δ_{i} was already computed)")
            }));
        }
        self.done[i] = true;
        let input = self.a_input(i);
        if i == l {
            s.reads.push(input);
            s.creates.push(ids.grad(l));
            s.frees.push(ids.act(l));
            s.action = Action::Loss { input, output: ids.grad(l) };
            return Ok(());
        }
        let (grad_in, saved, output) = (ids.grad(i + 1), ids.sav(i + 1), ids.grad(i));
        s.reads.extend([grad_in, saved, input]);
        s.creates.push(output);
        if ids.weights {
            s.reads.push(ids.weight(i));
        }
        let update_on_device = !self.on_cpu[i];
        if ids.grads {
            let g = ids.wgrad(i);
            if self.at[g].on_device() {
                s.reads.push(g);
            } else {
                s.creates.push(g);
            }
        }
        if ids.states && update_on_device {
            s.reads.push(ids.state(i));
        }
        s.frees.extend([grad_in, saved, ids.act(i + 1), ids.act(i)]);
        if update_on_device {
            s.updates.extend(ids.weights.then(|| ids.weight(i)));
            s.updates.extend(ids.states.then(|| ids.state(i)));
        }
        s.action = Action::Backward { stage: i, input, grad_in, saved, output, update_on_device };
        Ok(())
    }

    fn cpu_update(&mut self, s: &mut Step, i: usize) -> Result<(), Refusal> {
        let (ids, l) = (self.ids, self.ids.l);
        if i >= l {
            return Err(Refusal::OutOfRange(format!("CPU update of stage {i} (the chain has stages 0..{l})")));
        }
        if !ids.grads {
            return Err(Refusal::Invalid("a CPU update needs the chain's weight gradients (field `g`)".into()));
        }
        if !self.done[i] {
            return Err(Refusal::Invalid(format!("the CPU update of stage {i} comes before B{i} in this period")));
        }
        self.at[ids.wgrad(i)].host = 0.0;
        s.action = Action::CpuUpdate {
            stage: i,
            grad: ids.wgrad(i),
            weight: ids.weight(i),
            state: ids.states.then(|| ids.state(i)),
        };
        Ok(())
    }

    /// A compute step's effect on where the tensors are: what it reads and waits for,
    /// what it creates, and which of its frees have something to free.
    fn account(&mut self, s: &mut Step, g: usize) {
        s.missing = s.reads.iter().copied().find(|&r| !self.at[r].intact);
        for &r in &s.reads {
            if let Some(j) = self.at[r].from_prefetch {
                s.waits.push(j);
            }
            if let Some(k) = self.open[r] {
                self.holds.push((k, g));
            }
        }
        for &c in &s.creates {
            self.at[c].created();
            self.open[c] = None;
        }
        s.frees.retain(|&f| self.at[f].present() && !s.creates.contains(&f));
        s.frees.dedup();
        for &f in &s.frees {
            self.release(f);
        }
        for &u in &s.updates {
            self.at[u].host = 0.0;
        }
    }
}

fn placed(c: Copies) -> Where {
    Where {
        dev: if c.device { 1.0 } else { 0.0 },
        intact: c.device,
        host: if c.host { 1.0 } else { 0.0 },
        from_prefetch: None,
    }
}

mod graph;

pub use graph::{fixed, lower_graph, Fault, GraphAction, GraphProgram, GraphStep};

#[cfg(test)]
mod tests;
