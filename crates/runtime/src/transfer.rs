//! Moving tensors between the device and the host beside the compute stream.
//!
//! Two threads, one per direction (device→host, host→device), each run their transfers
//! one at a time in the order they were issued, as the simulator's two transfer streams
//! do. A transfer of `bytes` lasts `latency + bytes / bandwidth` of its direction's
//! [`LinkSpeed`]: the thread copies, then sleeps the rest.
//!
//! * An **offload** copies the tensor's data to a host copy through Burn's data API
//!   (`into_data`: a host buffer, what CUDA copies into with pinned memory). The device
//!   copy it was given is dropped when the copy is done; one the compute stream still
//!   holds for a read is let go by the stream ([`Transfers::let_go`]).
//! * A **prefetch** waits for the host copy it reads (its offload may still be running),
//!   takes device memory in the pool, rebuilds the device tensors (`from_data`) and hands
//!   them to the compute stream ([`Transfers::wait_prefetch`], [`Transfers::arrived`]).
//!   The host copy stays until the stream drops it ([`Transfers::drop_host`]).
//!
//! # Pools
//!
//! The device pool counts bytes as the planner does (each tensor by its declared size)
//! and holds them under a hard cap: a compute op ([`Transfers::reserve`]) or a prefetch
//! that would go over it waits until offloads in flight release enough (Shilova's O.3,
//! "the GPU waits for memory to be released"); when nothing in flight will release any,
//! the schedule did not fit and the step fails. The host pool counts host copies.
//!
//! Host copies are made and dropped inside [`memory::host_scope`], so the counting
//! allocator reports them apart from device memory.

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use burn_backend::{Backend, TensorData};

use crate::{memory, RuntimeError, Value};

/// One direction of the host link, as the executor throttles it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkSpeed {
    /// Bytes per second (`f64::INFINITY`: as fast as the copy).
    pub bandwidth: f64,
    /// Seconds every transfer takes on top of its bytes.
    pub latency: f64,
}

impl LinkSpeed {
    /// No throttling: a transfer takes as long as the copy.
    pub const UNTHROTTLED: LinkSpeed = LinkSpeed { bandwidth: f64::INFINITY, latency: 0.0 };

    /// Seconds a transfer of `bytes` lasts: `latency + bytes / bandwidth`.
    pub fn seconds(&self, bytes: u64) -> f64 {
        self.latency + bytes as f64 / self.bandwidth
    }

    fn check(&self, direction: &str) -> Result<(), String> {
        if self.bandwidth.is_nan() || self.bandwidth <= 0.0 {
            return Err(format!("the {direction} bandwidth must be positive, got {}", self.bandwidth));
        }
        if !self.latency.is_finite() || self.latency < 0.0 {
            return Err(format!("the {direction} latency must be a non-negative number, got {}", self.latency));
        }
        Ok(())
    }
}

/// How a step moves tensors and bounds device memory.
#[derive(Debug, Clone, PartialEq)]
pub struct TransferOptions {
    /// The device→host link (offloads).
    pub d2h: LinkSpeed,
    /// The host→device link (prefetches).
    pub h2d: LinkSpeed,
    /// The device pool's cap in bytes (`None`: none). The pool counts what the step
    /// holds from its start (`StepInputs::resident_bytes` and the parameters' gradients)
    /// and the schedule's tensors at their declared sizes, and a running op's temporaries
    /// where the session has them ([`StageTemporaries`]). A graph schedule runs under it
    /// where the session has its graph's sizes ([`GraphSizes`]), uncapped otherwise.
    pub device_cap: Option<u64>,
    /// The host pool's cap in bytes (`None`: none): an offload that would take the host
    /// copies above it waits for the host CPU's updates in flight to release their
    /// gradients' copies, as the simulator has them done by then (a CPU that lags costs
    /// time, not host memory).
    pub host_cap: Option<u64>,
    /// Bytes of gradient the host CPU's optimizer step processes per second
    /// (`f64::INFINITY`: as fast as it runs): a CPU update of `g` bytes lasts at least
    /// `g / cpu_rate`, as the simulator times it.
    pub cpu_rate: f64,
    /// Times each compute op of a chain schedule ([`StepOutput::op_seconds`](crate::exec::StepOutput::op_seconds)),
    /// synchronizing the device after each: on an asynchronous backend (CUDA) that
    /// drains the compute queue once per stage.
    pub time_ops: bool,
    /// Prefetch ops (by schedule index) each held until a compute op (by schedule index)
    /// has taken its memory: the simulator's order of allocations (`pebble-sim`'s
    /// `SimReport::prefetch_gates`, which `pebble-train` passes on). Without
    /// it, a link faster than the simulator's can take memory for two prefetches before
    /// the op the simulator ran between them, and that op finds the pool full. Empty: each
    /// prefetch starts as soon as the link is free.
    pub prefetch_gates: Arc<HashMap<usize, usize>>,
}

/// The temporary memory of each stage's forward (`ftmp`) and backward (`btmp`, the
/// loss's last) in the chain a plan was made on. The device pool holds an op's
/// temporaries while it runs, as the simulator does, so that an op waits for offloads in
/// flight to make room for them (O.3) instead of running over the budget beside copies
/// the link has not taken yet. Without them the pool counts tensors only.
///
/// For graph schedules it also holds the training graph's sizes ([`GraphSizes`]): with
/// them, a graph schedule's pool counts as the simulator does and runs under the cap.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StageTemporaries {
    /// `ftmp[i]`: bytes stage `i`'s forward holds while it runs.
    pub forward: Vec<u64>,
    /// `btmp[i]`: bytes stage `i`'s backward holds while it runs (`i = L`: the loss).
    pub backward: Vec<u64>,
    /// Stage `i`'s backward with the optimizer step fused into it (`Chain::fused_btmp`).
    pub fused_backward: Vec<u64>,
    /// The training graph's sizes, for graph schedules (empty: they run uncapped).
    pub graph: GraphSizes,
}

impl StageTemporaries {
    /// A chain's `ftmp` and `btmp`.
    pub fn of(chain: &pebble_graph::Chain) -> StageTemporaries {
        StageTemporaries {
            forward: chain.ftmp.clone(),
            backward: chain.btmp.clone(),
            fused_backward: (0..chain.len()).map(|i| chain.fused_btmp(i)).collect(),
            graph: GraphSizes::default(),
        }
    }

    /// A chain's `ftmp` and `btmp`, and the sizes of the training graph of the same
    /// network: what the pool counts for a schedule of either view.
    pub fn of_views(chain: &pebble_graph::Chain, graph: &pebble_graph::TrainingGraph) -> StageTemporaries {
        StageTemporaries { graph: GraphSizes::of(graph), ..StageTemporaries::of(chain) }
    }

    /// The temporaries of compute op `op` (0 for a stage it does not know), a backward's
    /// with the optimizer step fused into it if `updates` (after the backward's own).
    pub fn of_op(&self, op: &pebble_schedule::Op, updates: bool) -> u64 {
        use pebble_schedule::Op;
        let at = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
        match *op {
            Op::Forward { stage, .. } => at(&self.forward, stage),
            Op::Backward { stage } if updates => at(&self.fused_backward, stage),
            Op::Backward { stage } => at(&self.backward, stage),
            _ => 0,
        }
    }
}

/// What the device pool counts for a graph schedule, as the simulator does
/// (`pebble_sim`'s graph semantics): the inputs and static nodes from the start, each
/// data node at its declared size from the compute node that allocates it (or the
/// prefetch that brings it back) until its free (or its offload's end), and each compute
/// node's temporaries while it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GraphSizes {
    /// Each data node's declared size.
    pub data: Vec<u64>,
    /// Bytes of the data nodes resident from the step's start (inputs and static nodes).
    pub resident: u64,
    /// Each compute node's temporaries.
    pub tmp: Vec<u64>,
    /// Each compute node's outputs that it allocates (static ones accumulate in place),
    /// each with whether it is a saved node (which a `no_grad` forward skips).
    pub outputs: Vec<Vec<(usize, bool)>>,
}

impl GraphSizes {
    /// The sizes of `graph`.
    pub fn of(graph: &pebble_graph::TrainingGraph) -> GraphSizes {
        use pebble_graph::DataKind;
        GraphSizes {
            data: graph.data.iter().map(|d| d.size).collect(),
            resident: graph.fixed_bytes(),
            tmp: graph.compute.iter().map(|c| c.tmp).collect(),
            outputs: graph
                .compute
                .iter()
                .map(|c| {
                    let outs = c.outputs.iter().filter(|&&d| d < graph.data.len() && !graph.data[d].kind.is_static());
                    outs.map(|&d| (d, graph.data[d].kind == DataKind::Saved)).collect()
                })
                .collect(),
        }
    }

    /// Whether these are the sizes of a graph of `data` data nodes (a graph schedule of
    /// another graph, or of none, runs uncapped).
    pub fn fits(&self, data: usize) -> bool {
        !self.data.is_empty() && self.data.len() == data
    }
}

impl Default for TransferOptions {
    fn default() -> Self {
        TransferOptions {
            d2h: LinkSpeed::UNTHROTTLED,
            h2d: LinkSpeed::UNTHROTTLED,
            device_cap: None,
            host_cap: None,
            cpu_rate: f64::INFINITY,
            time_ops: false,
            prefetch_gates: Arc::default(),
        }
    }
}

/// What the transfers of one step did, measured.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TransferReport {
    /// Seconds the device→host link was busy (copying or throttled).
    pub d2h_busy: f64,
    /// Seconds the host→device link was busy.
    pub h2d_busy: f64,
    /// Seconds the compute stream waited for prefetches or for device memory.
    pub compute_stall: f64,
    /// Bytes offloaded.
    pub offloaded_bytes: u64,
    /// Bytes prefetched.
    pub prefetched_bytes: u64,
    /// The device pool's peak, in its own accounting (declared sizes).
    pub device_pool_peak: u64,
    /// The host pool's peak (host copies, declared sizes), those the step started with
    /// included.
    pub host_pool_peak: u64,
    /// Seconds the host CPU spent in optimizer steps ([`pebble_schedule::Op::CpuUpdate`]).
    pub cpu_busy: f64,
}

/// A tensor's data on the host, as Burn's data API returns it.
#[derive(Clone)]
pub(crate) enum HostValue {
    Float(TensorData),
    Int(TensorData),
    Bool(TensorData),
}

impl HostValue {
    /// Reads a value the caller also holds (a shared handle) back to the host.
    ///
    /// burn-flex copies a shared buffer's bytes, then copies them once more to align them:
    /// the host briefly holds the tensor twice. On the CPU backend a float is instead
    /// copied by an exact op (`× 1`), whose fresh buffer burn-flex then hands over as it
    /// is: one host buffer, as the planner counts it.
    pub(crate) fn read<B: Backend>(v: Value<B>) -> Result<HostValue, RuntimeError> {
        let err = |e| RuntimeError::Readback(format!("{e:?}"));
        Ok(match v {
            Value::Float(t) => {
                let cpu = std::any::TypeId::of::<B>() == std::any::TypeId::of::<burn_flex::Flex>();
                let t = if cpu { B::float_mul_scalar(t, 1.0f32.into()) } else { t };
                HostValue::Float(burn_backend::read_sync(B::float_into_data(t)).map_err(err)?)
            }
            Value::Int(t) => HostValue::Int(burn_backend::read_sync(B::int_into_data(t)).map_err(err)?),
            Value::Bool(t) => HostValue::Bool(burn_backend::read_sync(B::bool_into_data(t)).map_err(err)?),
        })
    }

    /// A device tensor from a copy of the data (the host copy stays).
    pub(crate) fn upload<B: Backend>(&self, device: &B::Device) -> Value<B> {
        match self {
            HostValue::Float(d) => Value::Float(B::float_from_data(d.clone(), device)),
            HostValue::Int(d) => Value::Int(B::int_from_data(d.clone(), device)),
            HostValue::Bool(d) => Value::Bool(B::bool_from_data(d.clone(), device)),
        }
    }
}

/// The parts of one tensor the schedule names, each labelled by `K`.
pub(crate) type Parts<B, K> = Vec<(K, Value<B>)>;

/// An offload's read of one value to the host, as the compute stream issued it.
pub(crate) enum Reading<B: Backend> {
    /// Read on the device→host thread, through Burn's data API.
    Later(Value<B>),
    /// Already queued on the device (CUDA's copy stream, `PEBBLE_CUDA_READ=queued`): the
    /// device→host thread waits for it.
    #[cfg(feature = "cuda")]
    Queued(crate::cuda::QueuedRead),
}

impl<B: Backend> Reading<B> {
    /// The device value still to read (`None` where the device queued the read).
    fn unread(&self) -> Option<&Value<B>> {
        match self {
            Reading::Later(v) => Some(v),
            #[cfg(feature = "cuda")]
            Reading::Queued(_) => None,
        }
    }

    /// Starts reading `v` where the backend can queue the read now; otherwise leaves it to
    /// the device→host thread.
    fn start(v: Value<B>) -> Self {
        match v {
            #[cfg(feature = "cuda")]
            Value::Float(t) => match crate::cuda::queue_read::<B>(t) {
                Ok(read) => Reading::Queued(read),
                Err(t) => Reading::Later(Value::Float(t)),
            },
            v => Reading::Later(v),
        }
    }

    /// Whether reads are queued when they are issued, ordered after their producers by
    /// the device (so the compute stream need not wait before issuing them).
    fn queued() -> bool {
        #[cfg(feature = "cuda")]
        if crate::cuda::queued_reads() {
            return true;
        }
        false
    }
}

/// Done prefetches: `(job, device tensors)`, in job order.
type Arrived<B, K> = Vec<(usize, Parts<B, K>)>;

/// A host copy: dropped inside a host scope, so that the allocator counts it as host memory.
pub(crate) struct HostCopy<K> {
    pub(crate) parts: Vec<(K, HostValue)>,
}

/// Host copies by the job that made them, with their bytes (declared sizes): what a step
/// starts with and what it leaves.
pub(crate) type HostCopies<K> = HashMap<usize, (Arc<HostCopy<K>>, u64)>;

/// The parts of host copies, as a CPU update reads and writes them.
pub(crate) type HostParts<K> = Vec<(K, HostValue)>;

/// A CPU update's arithmetic: from the gradient's, the weights' and the state's host parts
/// to the new weights and state (run on the host CPU thread, inside a host scope).
pub(crate) type HostUpdate<K> = Box<
    dyn FnOnce(HostParts<K>, HostParts<K>, HostParts<K>) -> Result<(HostParts<K>, HostParts<K>), RuntimeError> + Send,
>;

impl<K> Drop for HostCopy<K> {
    fn drop(&mut self) {
        let _host = memory::host_scope();
        drop(std::mem::take(&mut self.parts));
    }
}

impl<K> HostCopy<K> {
    /// Copies `values` to the host.
    pub(crate) fn read<B: Backend>(values: Parts<B, K>) -> Result<HostCopy<K>, RuntimeError> {
        Self::finish(values.into_iter().map(|(k, v)| (k, Reading::Later(v))).collect())
    }

    /// Finishes the reads of `values` to the host. A value still to read is read through
    /// a clone, so that the backend copies the data even where the job held the last
    /// handle (burn-flex hands a unique buffer over instead of copying it); the device
    /// copy is dropped outside the scope.
    fn finish<B: Backend>(values: Vec<(K, Reading<B>)>) -> Result<HostCopy<K>, RuntimeError> {
        let mut copy = {
            let _host = memory::host_scope();
            HostCopy { parts: Vec::with_capacity(values.len()) }
        };
        for (k, reading) in values {
            let data = match reading {
                Reading::Later(v) => {
                    let data = {
                        let _host = memory::host_scope();
                        HostValue::read(v.clone())
                    };
                    drop(v);
                    data
                }
                #[cfg(feature = "cuda")]
                Reading::Queued(read) => {
                    let _host = memory::host_scope();
                    burn_backend::read_sync(read).map(HostValue::Float).map_err(RuntimeError::Readback)
                }
            };
            copy.parts.push((k, data?));
        }
        Ok(copy)
    }
}

struct Offload<B: Backend, K> {
    job: usize,
    values: Vec<(K, Reading<B>)>,
    bytes: u64,
}

struct Prefetch<K> {
    job: usize,
    /// The op, for errors.
    op: String,
    /// The host copies it reads (the jobs that made them), each whole or only the parts
    /// listed.
    sources: Vec<(usize, Option<Vec<K>>)>,
    bytes: u64,
    /// The compute op it waits for ([`TransferOptions::prefetch_gates`]).
    after: Option<usize>,
}

struct CpuJob<K> {
    job: usize,
    op: String,
    grad: usize,
    weight: usize,
    state: Option<usize>,
    update: HostUpdate<K>,
}

/// What the compute stream and the two transfer threads share.
struct Board<B: Backend, K> {
    cap: Option<u64>,
    host_cap: Option<u64>,
    /// The gradients' copies (offload jobs) of the CPU updates issued and not done.
    cpu_pending: Vec<usize>,
    /// Device pool bytes in use, and their peak.
    used: u64,
    peak: u64,
    host_used: u64,
    host_peak: u64,
    /// Offloads issued and not done.
    offloading: HashSet<usize>,
    /// Done offloads' host copies, with their bytes.
    hosts: HashMap<usize, (Arc<HostCopy<K>>, u64)>,
    /// Offloads (or CPU updates) whose host copy is dropped when they are done.
    unwanted: HashSet<usize>,
    /// Host copies a CPU update issued and not done is rewriting: prefetches wait for them.
    updating: HashSet<usize>,
    /// Device bytes an offload in flight releases when it is done.
    release_on_done: HashMap<usize, u64>,
    /// Done prefetches' device tensors, not yet taken by the compute stream.
    arrived: HashMap<usize, Parts<B, K>>,
    /// The compute stream is waiting (or done): it will release nothing until woken.
    compute_idle: bool,
    /// The last compute op that took its memory from the pool.
    reached: Option<usize>,
    /// The compute stream waits for a prefetch (or is done): prefetches pass their gates.
    awaiting: bool,
    d2h_busy: f64,
    h2d_busy: f64,
    cpu_busy: f64,
    offloaded: u64,
    prefetched: u64,
    error: Option<RuntimeError>,
    /// The step failed: threads stop waiting.
    closing: bool,
}

struct Shared<B: Backend, K> {
    board: Mutex<Board<B, K>>,
    changed: Condvar,
}

impl<B: Backend, K> Shared<B, K> {
    fn lock(&self) -> MutexGuard<'_, Board<B, K>> {
        self.board.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'g>(&self, guard: MutexGuard<'g, Board<B, K>>) -> MutexGuard<'g, Board<B, K>> {
        self.changed.wait(guard).unwrap_or_else(|e| e.into_inner())
    }
}

/// Sleeps until `seconds` have passed since `start`.
fn throttle(start: Instant, seconds: f64) {
    let target = Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or(Duration::MAX);
    let elapsed = start.elapsed();
    if target > elapsed {
        std::thread::sleep(target - elapsed);
    }
}

/// Waits, before a transfer is issued, for the work queued on the device (a no-op on the
/// CPU, whose ops run as they are called). On CUDA this holds the compute stream back at
/// every transfer; `PEBBLE_TRANSFER_SYNC=0` skips it, leaving the order of a read after
/// the kernels that write its tensor to Burn and CubeCL (an experiment for the next GPU
/// session, docs/gpu.md).
fn issue_sync<B: Backend>(device: &B::Device) -> Result<(), RuntimeError> {
    static SKIP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *SKIP.get_or_init(|| std::env::var("PEBBLE_TRANSFER_SYNC").is_ok_and(|v| v == "0")) {
        return Ok(());
    }
    crate::sync::<B>(device)
}

fn transfer_err(index: usize, op: &str, why: impl Into<String>) -> RuntimeError {
    RuntimeError::Transfer { index, op: op.to_string(), why: why.into() }
}

/// The compute stream's side of the transfer machinery for one step: the device and host
/// pools, and (once the first transfer is issued) the two transfer threads.
pub(crate) struct Transfers<'scope, 'env, B: Backend, K: Send + Sync + 'static> {
    shared: Arc<Shared<B, K>>,
    scope: &'scope Scope<'scope, 'env>,
    device: &'env B::Device,
    options: TransferOptions,
    d2h: Option<Sender<Offload<B, K>>>,
    h2d: Option<Sender<Prefetch<K>>>,
    cpu: Option<Sender<CpuJob<K>>>,
    threads: Vec<ScopedJoinHandle<'scope, ()>>,
    stall: Duration,
}

impl<'scope, 'env, B: Backend, K: Clone + PartialEq + Send + Sync + 'static> Transfers<'scope, 'env, B, K> {
    /// A pool holding `base` bytes, under `options.device_cap`, and the host copies `hosts`
    /// a previous step left. Threads are started in `scope` on the first transfer.
    pub fn new(
        scope: &'scope Scope<'scope, 'env>,
        device: &'env B::Device,
        options: TransferOptions,
        base: u64,
        hosts: HostCopies<K>,
    ) -> Self {
        let host_used = hosts.values().map(|(_, bytes)| bytes).sum();
        let board = Board {
            cap: options.device_cap,
            host_cap: options.host_cap,
            cpu_pending: Vec::new(),
            used: base,
            peak: base,
            host_used,
            host_peak: host_used,
            offloading: HashSet::new(),
            hosts,
            unwanted: HashSet::new(),
            updating: HashSet::new(),
            release_on_done: HashMap::new(),
            arrived: HashMap::new(),
            compute_idle: false,
            reached: None,
            awaiting: false,
            d2h_busy: 0.0,
            h2d_busy: 0.0,
            cpu_busy: 0.0,
            offloaded: 0,
            prefetched: 0,
            error: None,
            closing: false,
        };
        let shared = Arc::new(Shared { board: Mutex::new(board), changed: Condvar::new() });
        Transfers {
            shared,
            scope,
            device,
            options,
            d2h: None,
            h2d: None,
            cpu: None,
            threads: Vec::new(),
            stall: Duration::ZERO,
        }
    }

    /// The options the step runs under.
    pub fn options(&self) -> &TransferOptions {
        &self.options
    }

    fn start(&mut self, index: usize, op: &str) -> Result<(), RuntimeError> {
        if self.d2h.is_some() {
            return Ok(());
        }
        self.options.d2h.check("device→host").map_err(|why| transfer_err(index, op, why))?;
        self.options.h2d.check("host→device").map_err(|why| transfer_err(index, op, why))?;
        let (d2h, rx) = channel();
        let shared = self.shared.clone();
        let link = self.options.d2h;
        self.threads.push(self.scope.spawn(move || offloads::<B, K>(&shared, rx, link)));
        self.d2h = Some(d2h);
        let (h2d, rx) = channel();
        let shared = self.shared.clone();
        let (link, device) = (self.options.h2d, self.device);
        self.threads.push(self.scope.spawn(move || prefetches::<B, K>(&shared, rx, link, device)));
        self.h2d = Some(h2d);
        let (cpu, rx) = channel();
        let shared = self.shared.clone();
        let rate = self.options.cpu_rate;
        self.threads.push(self.scope.spawn(move || cpu_updates::<B, K>(&shared, rx, rate)));
        self.cpu = Some(cpu);
        Ok(())
    }

    /// A transfer thread's error, if one failed.
    pub fn check(&self) -> Result<(), RuntimeError> {
        match self.shared.lock().error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Takes `bytes` of the device pool for compute op `index`, waiting for offloads in
    /// flight to release memory if the cap says so.
    pub fn reserve(&mut self, index: usize, op: &str, bytes: u64) -> Result<(), RuntimeError> {
        let mut b = self.shared.lock();
        if let Some(cap) = b.cap {
            if b.used.saturating_add(bytes) > cap {
                let start = Instant::now();
                b.compute_idle = true;
                self.shared.changed.notify_all();
                while b.used.saturating_add(bytes) > cap {
                    if let Some(e) = b.error.take() {
                        return Err(e);
                    }
                    if b.release_on_done.is_empty() {
                        b.compute_idle = false;
                        return Err(transfer_err(
                            index,
                            op,
                            format!(
                                "its outputs need {bytes} bytes of device memory: the pool holds {} of its cap {cap}, \
                                 and no offload in flight will release any",
                                b.used
                            ),
                        ));
                    }
                    b = self.shared.wait(b);
                }
                b.compute_idle = false;
                self.stall += start.elapsed();
            }
        }
        b.used += bytes;
        b.peak = b.peak.max(b.used);
        b.reached = b.reached.max(Some(index));
        self.shared.changed.notify_all();
        Ok(())
    }

    /// Gives `bytes` back to the device pool.
    pub fn release(&mut self, bytes: u64) {
        let mut b = self.shared.lock();
        b.used = b.used.saturating_sub(bytes);
        self.shared.changed.notify_all();
    }

    /// Issues offload `job` (the schedule op's index) of `values`, `bytes` in the pool.
    /// With `release`, the transfer releases them when it is done; otherwise the compute
    /// stream keeps a device copy for its reads and lets go of it later.
    pub fn offload(
        &mut self,
        job: usize,
        op: &str,
        values: Parts<B, K>,
        bytes: u64,
        release: bool,
    ) -> Result<(), RuntimeError> {
        self.start(job, op)?;
        // Issued when the compute before it has finished, also on a device that queues it
        // (unless the device orders the read after its producer itself).
        let queued = Reading::<B>::queued();
        if !queued {
            issue_sync::<B>(self.device)?;
        }
        let values = values.into_iter().map(|(k, v)| (k, Reading::start(v))).collect();
        {
            let mut b = self.shared.lock();
            b.offloading.insert(job);
            if release {
                b.release_on_done.insert(job, bytes);
            }
        }
        let sent = self.d2h.as_ref().expect("started").send(Offload { job, values, bytes });
        sent.map_err(|_| self.check().err().unwrap_or_else(|| transfer_err(job, op, "the device→host thread stopped")))
    }

    /// The compute stream lets go of the device copy it kept after offload `job`: its
    /// `bytes` are released now if the offload is done, or when it is.
    pub fn let_go(&mut self, job: usize, bytes: u64) {
        let mut b = self.shared.lock();
        if b.offloading.contains(&job) {
            b.release_on_done.insert(job, bytes);
        } else {
            b.used = b.used.saturating_sub(bytes);
            self.shared.changed.notify_all();
        }
    }

    /// Drops the host copy offload `job` made (now, or when the offload or the CPU update
    /// rewriting it is done).
    pub fn drop_host(&mut self, job: usize) {
        let mut b = self.shared.lock();
        if b.updating.contains(&job) || b.offloading.contains(&job) {
            b.unwanted.insert(job);
        } else if let Some((copy, bytes)) = b.hosts.remove(&job) {
            b.host_used = b.host_used.saturating_sub(bytes);
            drop(copy);
            self.shared.changed.notify_all();
        }
    }

    /// Issues prefetch `job` of `bytes` from the host copies `sources` (each whole, or only
    /// the parts listed) that offloads made (or are making).
    pub fn prefetch(
        &mut self,
        job: usize,
        op: &str,
        sources: Vec<(usize, Option<Vec<K>>)>,
        bytes: u64,
    ) -> Result<(), RuntimeError> {
        self.start(job, op)?;
        issue_sync::<B>(self.device)?;
        let after = self.options.prefetch_gates.get(&job).copied();
        let prefetch = Prefetch { job, op: op.to_string(), sources, bytes, after };
        let sent = self.h2d.as_ref().expect("started").send(prefetch);
        sent.map_err(|_| self.check().err().unwrap_or_else(|| transfer_err(job, op, "the host→device thread stopped")))
    }

    /// Issues CPU update `job`: once offload `grad` is done, the host CPU runs `update` on
    /// the host copies `grad`, `weight` and `state`, replaces the last two by its results
    /// (under the same jobs) and drops the gradient's copy. Prefetches of the weights or
    /// the state issued from now on wait for it.
    pub fn cpu_update(
        &mut self,
        job: usize,
        op: &str,
        (grad, weight, state): (usize, usize, Option<usize>),
        update: HostUpdate<K>,
    ) -> Result<(), RuntimeError> {
        self.start(job, op)?;
        {
            let mut b = self.shared.lock();
            b.updating.insert(weight);
            b.updating.extend(state);
            b.cpu_pending.push(grad);
        }
        let sent =
            self.cpu.as_ref().expect("started").send(CpuJob { job, op: op.to_string(), grad, weight, state, update });
        sent.map_err(|_| self.check().err().unwrap_or_else(|| transfer_err(job, op, "the host CPU thread stopped")))
    }

    /// The prefetches done since the last call: `(job, device tensors)`.
    pub fn arrived(&mut self) -> Result<Arrived<B, K>, RuntimeError> {
        let mut b = self.shared.lock();
        if let Some(e) = b.error.take() {
            return Err(e);
        }
        let mut done: Arrived<B, K> = b.arrived.drain().collect();
        done.sort_by_key(|(job, _)| *job);
        Ok(done)
    }

    /// Waits for prefetch `job` (the compute stream stalls) and takes its tensors.
    pub fn wait_prefetch(&mut self, job: usize) -> Result<Parts<B, K>, RuntimeError> {
        let mut b = self.shared.lock();
        if let Some(parts) = b.arrived.remove(&job) {
            return Ok(parts);
        }
        let start = Instant::now();
        b.compute_idle = true;
        b.awaiting = true;
        self.shared.changed.notify_all();
        let parts = loop {
            if let Some(e) = b.error.take() {
                b.awaiting = false;
                return Err(e);
            }
            if let Some(parts) = b.arrived.remove(&job) {
                break parts;
            }
            b = self.shared.wait(b);
        };
        b.compute_idle = false;
        b.awaiting = false;
        self.stall += start.elapsed();
        Ok(parts)
    }

    /// Ends the step: on success the threads finish what was issued; on failure they stop
    /// waiting. Returns what the transfers did and the host copies left, or a thread's
    /// error.
    pub fn finish(mut self, ok: bool) -> Result<(TransferReport, HostCopies<K>), RuntimeError> {
        {
            let mut b = self.shared.lock();
            b.compute_idle = true;
            b.awaiting = true;
            b.closing |= !ok;
            self.shared.changed.notify_all();
        }
        // Closing the channels ends the threads' loops once their queues are empty.
        self.d2h = None;
        self.h2d = None;
        self.cpu = None;
        let mut panicked = false;
        for thread in self.threads.drain(..) {
            panicked |= thread.join().is_err();
        }
        let mut b = self.shared.lock();
        if let Some(e) = b.error.take() {
            return Err(e);
        }
        if panicked {
            return Err(RuntimeError::Device("a transfer thread panicked".into()));
        }
        let report = TransferReport {
            d2h_busy: b.d2h_busy,
            h2d_busy: b.h2d_busy,
            compute_stall: self.stall.as_secs_f64(),
            offloaded_bytes: b.offloaded,
            prefetched_bytes: b.prefetched,
            device_pool_peak: b.peak,
            host_pool_peak: b.host_peak,
            cpu_busy: b.cpu_busy,
        };
        Ok((report, std::mem::take(&mut b.hosts)))
    }
}

impl<B: Backend, K: Send + Sync + 'static> Drop for Transfers<'_, '_, B, K> {
    fn drop(&mut self) {
        // Dropped without `finish` (an error): no thread may keep waiting for the stream.
        if !self.threads.is_empty() {
            let mut b = self.shared.lock();
            b.closing = true;
            b.compute_idle = true;
            self.shared.changed.notify_all();
        }
    }
}

/// The device→host thread: copies, throttles, hands the host copy over.
fn offloads<B: Backend, K: Send + Sync>(shared: &Shared<B, K>, jobs: Receiver<Offload<B, K>>, link: LinkSpeed) {
    // Burn's `read_sync` keeps a per-thread waker it makes on first use and frees when the
    // thread ends: made here, outside any host scope, it does not count as a host copy.
    burn_backend::read_sync(std::future::ready(()));
    memory::device_thread();
    for Offload { job, values, bytes } in jobs {
        let start = Instant::now();
        {
            let mut b = shared.lock();
            // Over the host cap, wait for the CPU updates that can finish (their gradient
            // is on the host) to release their gradients' copies.
            while let Some(cap) = b.host_cap {
                let finishing = b.cpu_pending.iter().any(|g| *g != job && !b.offloading.contains(g));
                if b.closing || b.host_used.saturating_add(bytes) <= cap || !finishing {
                    break;
                }
                b = shared.wait(b);
            }
            if b.closing {
                return;
            }
            b.host_used += bytes;
            b.host_peak = b.host_peak.max(b.host_used);
        }
        // The device copy stays until the link has taken it all, as the simulator and the
        // pool have it (O.7): on the CPU the read is a memcpy, done long before.
        let device_copy: Vec<Value<B>> = values.iter().filter_map(|(_, r)| r.unread().cloned()).collect();
        let copy = HostCopy::finish(values);
        throttle(start, link.seconds(bytes));
        drop(device_copy);
        let busy = start.elapsed().as_secs_f64();
        let mut b = shared.lock();
        b.d2h_busy += busy;
        b.offloaded += bytes;
        b.offloading.remove(&job);
        if let Some(released) = b.release_on_done.remove(&job) {
            b.used = b.used.saturating_sub(released);
        }
        match copy {
            Ok(copy) if !b.unwanted.remove(&job) => {
                b.hosts.insert(job, (Arc::new(copy), bytes));
            }
            Ok(copy) => {
                b.host_used = b.host_used.saturating_sub(bytes);
                drop(copy);
            }
            Err(e) => {
                b.error.get_or_insert(e);
            }
        }
        shared.changed.notify_all();
    }
}

/// The host→device thread: waits for the host copy and for device memory, uploads,
/// throttles, hands the device tensors over.
fn prefetches<B: Backend, K: Clone + PartialEq + Send + Sync>(
    shared: &Shared<B, K>,
    jobs: Receiver<Prefetch<K>>,
    link: LinkSpeed,
    device: &B::Device,
) {
    memory::device_thread();
    for Prefetch { job, op, sources, bytes, after } in jobs {
        let mut b = shared.lock();
        // In the simulator's order: after the compute op it ran before this prefetch.
        while after.is_some_and(|a| b.reached.is_none_or(|r| r < a)) && !b.awaiting {
            if b.closing {
                return;
            }
            b = shared.wait(b);
        }
        if b.closing {
            return;
        }
        let mut copies = Vec::with_capacity(sources.len());
        for (source, only) in sources {
            let copy = loop {
                if b.closing {
                    return;
                }
                if !b.updating.contains(&source) {
                    if let Some((copy, _)) = b.hosts.get(&source) {
                        break copy.clone();
                    }
                    if !b.offloading.contains(&source) {
                        let why = format!("the host copy made by schedule op {source} is gone");
                        b.error.get_or_insert(transfer_err(job, &op, why));
                        shared.changed.notify_all();
                        return;
                    }
                }
                b = shared.wait(b);
            };
            copies.push((copy, only));
        }
        if let Some(cap) = b.cap {
            while b.used.saturating_add(bytes) > cap {
                if b.closing {
                    return;
                }
                if b.release_on_done.is_empty() && b.compute_idle {
                    let why = format!(
                        "it needs {bytes} bytes of device memory: the pool holds {} of its cap {cap}, the compute \
                         stream is waiting, and no offload in flight will release any",
                        b.used
                    );
                    b.error.get_or_insert(transfer_err(job, &op, why));
                    shared.changed.notify_all();
                    return;
                }
                b = shared.wait(b);
            }
        }
        b.used += bytes;
        b.peak = b.peak.max(b.used);
        drop(b);
        let start = Instant::now();
        let mut values: Parts<B, K> = Vec::new();
        for (copy, only) in copies {
            let wanted = |k: &K| only.as_ref().is_none_or(|only| only.contains(k));
            values
                .extend(copy.parts.iter().filter(|(k, _)| wanted(k)).map(|(k, h)| (k.clone(), h.upload::<B>(device))));
        }
        throttle(start, link.seconds(bytes));
        let busy = start.elapsed().as_secs_f64();
        let mut b = shared.lock();
        b.h2d_busy += busy;
        b.prefetched += bytes;
        b.arrived.insert(job, values);
        shared.changed.notify_all();
    }
}

/// The host CPU's thread: runs the optimizer steps of [`Transfers::cpu_update`] in the
/// order they were issued, each once its gradient's host copy is complete.
fn cpu_updates<B: Backend, K: Clone + Send + Sync>(shared: &Shared<B, K>, jobs: Receiver<CpuJob<K>>, rate: f64) {
    for CpuJob { job, op, grad, weight, state, update } in jobs {
        let mut b = shared.lock();
        // Waits for the host copies it reads; the gradient's offload may be in flight.
        let sources: Vec<usize> = [Some(grad), Some(weight), state].into_iter().flatten().collect();
        loop {
            if b.closing {
                return;
            }
            if sources.iter().all(|s| !b.offloading.contains(s) && b.hosts.contains_key(s)) {
                break;
            }
            if let Some(&gone) = sources.iter().find(|s| !b.offloading.contains(s) && !b.hosts.contains_key(s)) {
                let what = if gone == grad {
                    "gradient"
                } else if gone == weight {
                    "weights"
                } else {
                    "optimizer state"
                };
                let why = format!("the host copy of the {what} (made by schedule op {gone}) is gone");
                b.error.get_or_insert(transfer_err(job, &op, why));
                shared.changed.notify_all();
                return;
            }
            b = shared.wait(b);
        }
        let (g, g_bytes) = b.hosts.remove(&grad).expect("checked");
        let (w, w_bytes) = b.hosts.remove(&weight).expect("checked");
        let (s, s_bytes) = match state {
            Some(st) => {
                let (copy, bytes) = b.hosts.remove(&st).expect("checked");
                (Some(copy), bytes)
            }
            None => (None, 0),
        };
        drop(b);
        let start = Instant::now();
        // The parts leave their copies (a copy a prefetch still reads is copied), then the
        // update runs on them inside a host scope.
        let parts = |copy: Arc<HostCopy<K>>| match Arc::try_unwrap(copy) {
            Ok(mut copy) => std::mem::take(&mut copy.parts),
            Err(shared) => {
                let _host = memory::host_scope();
                shared.parts.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
            }
        };
        let (g, w, s) = (parts(g), parts(w), s.map(parts).unwrap_or_default());
        let result = {
            let _host = memory::host_scope();
            update(g, w, s).map(|(w, s)| (HostCopy { parts: w }, HostCopy { parts: s }))
        };
        if rate > 0.0 {
            throttle(start, g_bytes as f64 / rate);
        }
        let busy = start.elapsed().as_secs_f64();
        let mut b = shared.lock();
        b.cpu_busy += busy;
        b.host_used = b.host_used.saturating_sub(g_bytes);
        if let Some(at) = b.cpu_pending.iter().position(|&g| g == grad) {
            b.cpu_pending.remove(at);
        }
        b.updating.remove(&weight);
        if let Some(st) = state {
            b.updating.remove(&st);
        }
        match result {
            Ok((new_w, new_s)) => {
                for (key, copy, bytes) in [(Some(weight), new_w, w_bytes), (state, new_s, s_bytes)] {
                    let Some(key) = key else { continue };
                    if b.unwanted.remove(&key) {
                        b.host_used = b.host_used.saturating_sub(bytes);
                        drop(copy);
                    } else {
                        b.hosts.insert(key, (Arc::new(copy), bytes));
                    }
                }
            }
            Err(e) => {
                b.error.get_or_insert(e);
            }
        }
        shared.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::{Flex, FlexDevice};

    /// The pool's bytes in use, `wait` after the prefetch of a 1 KiB host copy gated on
    /// compute op 5 (or not gated) is issued, and once op 5 has taken 100 bytes and the
    /// prefetch has landed.
    fn pool_around_a_prefetch(gated: bool, wait: Duration) -> (u64, u64) {
        let gates = if gated { HashMap::from([(1, 5)]) } else { HashMap::new() };
        let options = TransferOptions { prefetch_gates: Arc::new(gates), ..TransferOptions::default() };
        std::thread::scope(|scope| {
            let mut x = Transfers::<Flex, usize>::new(scope, &FlexDevice, options, 0, HashMap::new());
            let value = Value::Float(crate::value::zeros::<Flex>(vec![256], &FlexDevice));
            x.offload(0, "offload", vec![(0, value)], 1024, true).expect("offload");
            x.prefetch(1, "prefetch", vec![(0, None)], 1024).expect("prefetch");
            std::thread::sleep(wait);
            let before = x.shared.lock().used;
            x.reserve(5, "C5", 100).expect("op 5 fits: no cap");
            x.wait_prefetch(1).expect("the prefetch lands");
            let after = x.shared.lock().used;
            x.finish(true).expect("the transfers end");
            (before, after)
        })
    }

    #[test]
    fn a_gated_prefetch_waits_for_its_compute_op_to_take_memory_first() {
        let wait = Duration::from_millis(100);
        // Ungated, the (unthrottled) link has brought it back long before op 5.
        assert_eq!(pool_around_a_prefetch(false, wait), (1024, 1124));
        // Gated on op 5, it takes nothing until op 5 has, then lands.
        assert_eq!(pool_around_a_prefetch(true, wait), (0, 1124));
    }
}
