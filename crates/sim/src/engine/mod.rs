//! The view-independent event engine: four streams (compute, device→host, host→device,
//! and the host CPU's optimizer steps),
//! tensor residency, timing and memory accounting.
//!
//! The front-ends ([`crate::chain`], [`crate::graph`]) name tensors by dense ids
//! `0..n` and translate each compute op into an effect (duration, temporary memory, the
//! tensors it reads, allocates and frees). The engine checks residency, places the op in
//! time, and records memory events; [`Engine::finish`] sorts them and derives the peak,
//! the timeline and the first budget violation.
//!
//! # Memory events and ties
//!
//! Every allocation and release is an event `(time, class, op, phase, delta)`, sorted in
//! that order. At equal times releases come first (`class` 0), so that an op's consumed
//! inputs are gone when the next op allocates. A release that happens at the very instant
//! its memory was allocated (a zero-duration op's temporary memory, say) cannot go first:
//! it gets `class` 1, where events follow program order (`op`, then allocation before
//! release within an op). The peak of a compute-only schedule is therefore exactly
//! `max over ops of (resident before the op + its outputs + its temporary memory)`.
//!
//! # Offloads
//!
//! An offload's device memory is released when its transfer ends, but not while a compute
//! op issued after it (in program order) still reads the tensor: until the tensor is
//! prefetched, produced again or freed, the device copy stays readable, and each read pushes
//! the release to that read's end. This keeps validity independent of timing (an op may
//! read a tensor whose offload is in flight, as in Shilova's model where `ā_ℓ` is offloaded
//! while `F_{ℓ+1}` reads it) and never frees memory under a running op.

use pebble_machine::Link;
use pebble_schedule::{Op, Tensor};

use crate::allocator::AllocatorConfig;
use crate::reserved::{tag, NONE, TMP};
use crate::{Lane, MemoryPoint, SimConfig, SimError, SimReport, Span, TransferMemory};

mod memory;

/// Tolerance on fractions.
pub(crate) const EPS: f64 = 1e-9;

/// A memory event. `key` packs `(class, op, phase)` so that one integer comparison orders
/// events with equal times.
#[derive(Debug, Clone, Copy)]
struct Ev {
    time: f64,
    key: u64,
    delta: i128,
    /// What the bytes are: a tensor's id ([`tag`]), [`TMP`] (the op's temporary memory) or
    /// [`NONE`], for the caching allocator's replay ([`crate::reserved`]).
    tag: u32,
}

/// Bytes in use as a `u64`: sums of sizes are kept in `i128`, so that no size up to
/// `u64::MAX` wraps; a total beyond `u64::MAX` reads as `u64::MAX` (over any budget).
fn saturate(bytes: i128) -> u64 {
    bytes.clamp(0, u64::MAX as i128) as u64
}

const OP_MASK: u64 = (1 << 62) - 1;

fn key(class: u64, op: usize, phase: u64) -> u64 {
    (class << 63) | (((op as u64) & OP_MASK) << 1) | phase
}

fn key_op(key: u64) -> usize {
    ((key >> 1) & OP_MASK) as usize
}

/// Phase of an event within its op.
const ALLOC: u64 = 0;
const RELEASE: u64 = 1;

/// Device memory a transfer moves linearly over `[t0, t1]` (`TransferMemory::Progressive`).
#[derive(Debug, Clone, Copy)]
struct Ramp {
    t0: f64,
    t1: f64,
    delta: i128,
    /// The tensor's [`Ev::tag`], and the op that moves it.
    tag: u32,
    op: usize,
}

impl Ramp {
    /// What the ramp has moved by time `t`.
    fn at(&self, t: f64) -> f64 {
        if t <= self.t0 {
            0.0
        } else if t >= self.t1 {
            self.delta as f64
        } else {
            self.delta as f64 * (t - self.t0) / (self.t1 - self.t0)
        }
    }
}

/// Device memory an offload gives back when it (and the reads issued after it) are done.
#[derive(Debug, Clone, Copy)]
struct Pending {
    bytes: u64,
    time: f64,
    op: usize,
    /// The latest start of a compute op that holds the copy: a release at that very instant
    /// must follow the op's allocation (see [`Engine::class`]).
    floor: f64,
}

#[derive(Debug, Clone, Default)]
struct TState {
    size: u64,
    /// Logical fraction on the device, after every transfer issued so far has completed.
    dev_frac: f64,
    /// Device bytes held for `dev_frac` (pending offload releases excluded).
    dev_bytes: u64,
    host_frac: f64,
    host_bytes: u64,
    /// The whole tensor is on the device (possibly with an offload in flight): compute may read it.
    intact: bool,
    /// The device copy is out of date (a weight or optimizer state updated on the host):
    /// compute may not read it until it is dropped and prefetched again.
    stale: bool,
    /// When the device copy is usable: end of its producer or of its last prefetch.
    ready: f64,
    /// When the host copy is complete: end of its last offload.
    host_ready: f64,
    /// End of the last transfer of this tensor, either direction.
    busy_until: f64,
    last_alloc: f64,
    host_last_alloc: f64,
    pending: Vec<Pending>,
}

impl TState {
    fn present(&self) -> bool {
        self.dev_frac > EPS
            || self.dev_bytes > 0
            || self.host_frac > EPS
            || self.host_bytes > 0
            || !self.pending.is_empty()
    }
}

/// One tensor the engine tracks.
pub(crate) struct TensorSpec {
    /// Its name in errors.
    pub name: Tensor,
    /// Its size in bytes.
    pub size: u64,
    /// Whether it is resident (and complete) at time 0.
    pub resident: bool,
    /// Whether a complete host copy exists at time 0 (a weight in a periodic schedule).
    pub host: bool,
}

/// A compute op's effect, as a front-end describes it.
pub(crate) struct Effect<'a> {
    pub duration: f64,
    pub tmp: u64,
    /// Must be resident (whole, on the device); the op waits for their prefetches.
    pub reads: &'a [usize],
    /// Allocated at the op's start; must not be on the device.
    pub allocs: &'a [usize],
    /// Released at the op's end (those present; absent ones are skipped).
    pub frees: &'a [usize],
}

/// The event engine for one simulation.
pub(crate) struct Engine<'s> {
    ops: &'s [Op],
    budget: Option<u64>,
    /// The machine's host memory: offloaded copies beyond it are an error.
    host_memory: u64,
    d2h: Link,
    h2d: Link,
    timeline: bool,
    transfers: TransferMemory,
    t: Vec<TState>,
    names: Vec<Tensor>,
    base: u64,
    cursor: f64,
    /// Start of the last compute op.
    last_start: f64,
    d2h_free: f64,
    h2d_free: f64,
    /// When the CPU stream (host optimizer steps) is free.
    cpu_free: f64,
    cpu_busy: f64,
    compute_time: f64,
    compute_ops: usize,
    dev: Vec<Ev>,
    ramps: Vec<Ramp>,
    host: Vec<Ev>,
    /// The latest time at which memory already scheduled is released: a compute op that
    /// starts later cannot wait for memory.
    horizon: f64,
    d2h_busy: f64,
    h2d_busy: f64,
    spans: Vec<Span>,
    /// The caching allocator to replay the events through, if any.
    allocator: Option<AllocatorConfig>,
    /// The blocks resident at time 0 (tag, bytes): the baseline, then tensors by id.
    initial: Vec<(u32, u64)>,
}

impl<'s> Engine<'s> {
    /// An engine for `ops`, with `baseline` bytes resident for the whole step beyond `tensors`.
    pub fn new(
        ops: &'s [Op],
        config: &SimConfig,
        baseline: u64,
        tensors: impl IntoIterator<Item = TensorSpec>,
    ) -> Self {
        let mut t = Vec::new();
        let mut names = Vec::new();
        let mut base = baseline;
        let mut host = Vec::new();
        let mut initial = vec![(NONE, baseline)];
        for spec in tensors {
            let mut s = TState { size: spec.size, ..TState::default() };
            if spec.resident {
                s.dev_frac = 1.0;
                s.dev_bytes = spec.size;
                s.intact = true;
                base = base.saturating_add(spec.size);
                initial.push((tag(t.len()), spec.size));
            }
            if spec.host {
                s.host_frac = 1.0;
                s.host_bytes = spec.size;
                host.push(Ev { time: 0.0, key: key(1, 0, ALLOC), delta: spec.size as i128, tag: NONE });
            }
            t.push(s);
            names.push(spec.name);
        }
        Engine {
            ops,
            budget: config.budget,
            host_memory: config.machine.host_memory,
            d2h: config.machine.d2h,
            h2d: config.machine.h2d,
            timeline: config.timeline,
            transfers: config.transfers,
            t,
            names,
            base,
            cursor: 0.0,
            last_start: 0.0,
            d2h_free: 0.0,
            h2d_free: 0.0,
            cpu_free: 0.0,
            cpu_busy: 0.0,
            compute_time: 0.0,
            compute_ops: 0,
            dev: Vec::with_capacity(ops.len() * 2),
            ramps: Vec::new(),
            host,
            horizon: 0.0,
            d2h_busy: 0.0,
            h2d_busy: 0.0,
            spans: Vec::new(),
            allocator: config.allocator_config(),
            initial,
        }
    }

    // ----- queries -------------------------------------------------------------------

    /// Whether some of the tensor is (logically) on the device.
    pub fn on_device(&self, id: usize) -> bool {
        self.t[id].dev_frac > EPS
    }

    /// Whether a complete host copy exists (or is being made).
    pub fn on_host(&self, id: usize) -> bool {
        self.t[id].host_frac >= 1.0 - EPS
    }

    // ----- errors --------------------------------------------------------------------

    /// The op's text, for errors.
    /// An op index past the schedule's end is in a later period of a periodic schedule.
    pub fn text(&self, op: usize) -> String {
        let n = self.ops.len().max(1);
        let text = self.ops.get(op % n).map(|o| o.to_string()).unwrap_or_default();
        if op >= n {
            format!("{text}, period {}", op / n + 1)
        } else {
            text
        }
    }

    pub fn missing(&self, op: usize, id: usize) -> SimError {
        SimError::MissingInput { op, text: self.text(op), tensor: self.names[id] }
    }

    pub fn already(&self, op: usize, id: usize) -> SimError {
        SimError::AlreadyResident { op, text: self.text(op), tensor: self.names[id] }
    }

    pub fn invalid(&self, op: usize, why: impl Into<String>) -> SimError {
        SimError::InvalidOp { op, text: self.text(op), why: why.into() }
    }

    pub fn out_of_range(&self, op: usize, what: impl Into<String>) -> SimError {
        SimError::OutOfRange { op, text: self.text(op), what: what.into() }
    }

    /// The error to report when op `e`'s op is invalid: a budget violation by an earlier op
    /// wins, so that the first failing op in program order is the one reported.
    pub fn fail(&mut self, e: SimError) -> SimError {
        self.settle_all();
        match self.scan() {
            Err(budget) => budget,
            Ok(_) => e,
        }
    }

    // ----- ops -----------------------------------------------------------------------

    /// Runs a compute op on the compute stream.
    pub fn compute(&mut self, op: usize, eff: &Effect<'_>) -> Result<(), SimError> {
        if let Some(&r) = eff.reads.iter().find(|&&r| !self.t[r].intact) {
            return Err(self.missing(op, r));
        }
        if let Some(&r) = eff.reads.iter().find(|&&r| self.t[r].stale) {
            return Err(self.invalid(
                op,
                format!(
                    "reads {:?}, whose device copy is stale since its update on the host: free it and prefetch it again",
                    self.names[r]
                ),
            ));
        }
        if let Some(&a) = eff.allocs.iter().find(|&&a| self.t[a].dev_frac > EPS) {
            return Err(self.already(op, a));
        }
        let mut start = self.cursor;
        for &r in eff.reads {
            start = start.max(self.t[r].ready);
        }
        let mut need = eff.tmp;
        for &a in eff.allocs {
            self.settle(a);
            need = need.saturating_add(self.t[a].size);
        }
        let ready = start;
        start = self.wait_for_memory(start, need, eff.tmp, eff.duration);
        let end = start + eff.duration;
        // One event per block: the op's temporary memory, then each output.
        if eff.tmp > 0 {
            self.dev.push(Ev { time: start, key: key(1, op, ALLOC), delta: eff.tmp as i128, tag: TMP });
        }
        for &a in eff.allocs {
            let s = &mut self.t[a];
            s.dev_frac = 1.0;
            s.dev_bytes = s.size;
            s.intact = true;
            s.ready = end;
            s.last_alloc = start;
            if s.size > 0 {
                self.dev.push(Ev { time: start, key: key(1, op, ALLOC), delta: s.size as i128, tag: tag(a) });
            }
        }
        for &r in eff.reads {
            for p in &mut self.t[r].pending {
                p.time = p.time.max(end);
                p.floor = p.floor.max(start);
            }
        }
        if eff.tmp > 0 {
            let class = Self::class(end, start, start);
            self.dev.push(Ev { time: end, key: key(class, op, RELEASE), delta: -(eff.tmp as i128), tag: TMP });
        }
        for &f in eff.frees {
            if self.t[f].present() {
                self.release(f, end, start, op);
            }
        }
        if self.timeline {
            self.spans.push(Span { lane: Lane::Compute, op, start, end });
        }
        debug_assert!(start >= ready);
        self.cursor = end;
        self.last_start = start;
        self.compute_time += eff.duration;
        self.compute_ops += 1;
        Ok(())
    }

    /// An explicit free: at the compute cursor, but not before the tensor's transfers end.
    pub fn free(&mut self, op: usize, id: usize) -> Result<(), SimError> {
        if !self.t[id].present() {
            return Err(self
                .invalid(op, format!("{:?} is not resident (neither on the device nor on the host)", self.names[id])));
        }
        self.release(id, self.cursor, self.last_start, op);
        Ok(())
    }

    /// Frees the device copy of a tensor that has a complete host copy (a weight the host
    /// holds up to date), keeping the host copy: at the compute cursor, but not before
    /// the tensor's transfers (and the reads holding an offloaded copy) end.
    pub fn drop_device(&mut self, op: usize, id: usize) -> Result<(), SimError> {
        if !self.on_host(id) {
            return Err(self.invalid(
                op,
                format!(
                    "{:?} has no up-to-date host copy, so its device copy cannot be dropped (offload it instead)",
                    self.names[id]
                ),
            ));
        }
        let s = &self.t[id];
        if s.dev_frac <= EPS && s.pending.is_empty() {
            return Err(self.invalid(op, format!("{:?} is not on the device", self.names[id])));
        }
        self.release_device(id, self.cursor, self.last_start, op);
        Ok(())
    }

    /// The tensor was modified on the device (a weight's update inside its backward): its
    /// host copy is stale, and is released at the compute cursor.
    pub fn invalidate_host(&mut self, op: usize, id: usize) {
        self.release_host(id, self.cursor, self.last_start, op);
    }

    /// A step input arrives (the next period's batch): resident from the compute cursor.
    pub fn arrive(&mut self, op: usize, id: usize) -> Result<(), SimError> {
        if self.t[id].present() {
            return Err(self.already(op, id));
        }
        let s = &mut self.t[id];
        s.dev_frac = 1.0;
        s.dev_bytes = s.size;
        s.intact = true;
        s.ready = self.cursor;
        s.last_alloc = self.cursor;
        if s.size > 0 {
            self.dev.push(Ev { time: self.cursor, key: key(1, op, ALLOC), delta: s.size as i128, tag: tag(id) });
        }
        Ok(())
    }

    /// An optimizer step on the host CPU: it reads the host copy of `grad` (complete once
    /// its offload ends) and updates in place the host copies of `weight` and `state`
    /// (if any), which must be complete. It starts when the CPU stream is free, at the
    /// compute cursor at the earliest, and lasts `duration`. At its end the gradient's host
    /// copy is released and the weight's and state's host copies are current; a device copy
    /// of either is stale from then on.
    pub fn cpu_update(
        &mut self,
        op: usize,
        grad: usize,
        weight: usize,
        state: Option<usize>,
        duration: f64,
    ) -> Result<(), SimError> {
        if !self.on_host(grad) {
            return Err(self
                .invalid(op, format!("{:?} is not on the host: offload it before the CPU update", self.names[grad])));
        }
        if !self.on_host(weight) {
            return Err(self.invalid(
                op,
                format!("{:?} has no up-to-date host copy for the CPU to update (upload it first)", self.names[weight]),
            ));
        }
        if let Some(st) = state {
            if !self.on_host(st) {
                return Err(self.invalid(
                    op,
                    format!("{:?} has no host copy for the CPU to update (offload it first)", self.names[st]),
                ));
            }
            if self.on_device(st) {
                return Err(self.invalid(
                    op,
                    format!(
                        "{:?} is on the device as well: a CPU-updated state lives on the host only",
                        self.names[st]
                    ),
                ));
            }
        }
        let mut start = self.cursor.max(self.cpu_free).max(self.t[grad].host_ready).max(self.t[weight].host_ready);
        if let Some(st) = state {
            start = start.max(self.t[st].host_ready);
        }
        let end = start + duration;
        self.cpu_free = end;
        self.cpu_busy += duration;
        if self.timeline {
            self.spans.push(Span { lane: Lane::Cpu, op, start, end });
        }
        self.release_host(grad, end, start, op);
        for id in std::iter::once(weight).chain(state) {
            let s = &mut self.t[id];
            s.host_ready = s.host_ready.max(end);
            if s.dev_frac > EPS || !s.pending.is_empty() {
                s.stale = true;
            }
        }
        Ok(())
    }

    /// Start of the last compute op.
    pub fn last_start(&self) -> f64 {
        self.last_start
    }

    fn check_fraction(&self, op: usize, fraction: f64) -> Result<(), SimError> {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(self.invalid(op, format!("fraction {fraction} is not in (0, 1]")));
        }
        for (dir, link) in [("device→host", &self.d2h), ("host→device", &self.h2d)] {
            if !(link.bandwidth > 0.0 && link.bandwidth.is_finite()) {
                return Err(
                    self.invalid(op, format!("a transfer needs a positive {dir} bandwidth, got {}", link.bandwidth))
                );
            }
            if !(link.latency >= 0.0 && link.latency.is_finite()) {
                return Err(self.invalid(op, format!("the {dir} latency must be non-negative, got {}", link.latency)));
            }
        }
        Ok(())
    }

    fn part(size: u64, fraction: f64) -> u64 {
        ((size as f64) * fraction).round().min(size as f64) as u64
    }

    /// Copies a whole tensor to the host on the device→host stream, keeping the device copy
    /// (a weight uploaded ahead of a read, dropped after it by an explicit free).
    pub fn upload(&mut self, op: usize, id: usize) -> Result<(), SimError> {
        self.check_fraction(op, 1.0)?;
        if !self.t[id].intact {
            return Err(self.missing(op, id));
        }
        let (_, end) = self.send_to_host(op, id, 1.0);
        self.t[id].busy_until = self.t[id].busy_until.max(end);
        Ok(())
    }

    /// The device→host part of an offload or upload: `fraction` of the tensor on the link
    /// (when it is free and the tensor ready), its host copy grown at the start and
    /// complete at the end. Returns the transfer's start and end.
    fn send_to_host(&mut self, op: usize, id: usize, fraction: f64) -> (f64, f64) {
        let start = self.cursor.max(self.d2h_free).max(self.t[id].ready);
        let end = start + self.d2h.transfer_time(self.t[id].size as f64 * fraction);
        self.d2h_free = end;
        self.d2h_busy += end - start;
        if self.timeline {
            self.spans.push(Span { lane: Lane::D2h, op, start, end });
        }
        let s = &mut self.t[id];
        let host_frac = (s.host_frac + fraction).min(1.0);
        let host_bytes = if host_frac >= 1.0 - EPS { s.size } else { Self::part(s.size, host_frac).max(s.host_bytes) };
        if host_bytes > s.host_bytes {
            self.host.push(Ev {
                time: start,
                key: key(1, op, ALLOC),
                delta: (host_bytes - s.host_bytes) as i128,
                tag: NONE,
            });
            s.host_last_alloc = start;
        }
        s.host_frac = host_frac;
        s.host_bytes = host_bytes;
        s.host_ready = s.host_ready.max(end);
        (start, end)
    }

    /// Moves `fraction` of a tensor to the host on the device→host stream.
    pub fn offload(&mut self, op: usize, id: usize, fraction: f64) -> Result<(), SimError> {
        self.check_fraction(op, fraction)?;
        let s = &self.t[id];
        if s.dev_frac <= EPS {
            return Err(self.missing(op, id));
        }
        if s.dev_frac + EPS < fraction {
            return Err(self.invalid(
                op,
                format!("offloads {fraction} of {:?}, but only {} of it is on the device", self.names[id], s.dev_frac),
            ));
        }
        let (start, end) = self.send_to_host(op, id, fraction);
        let progressive = self.transfers == TransferMemory::Progressive && end > start;
        let s = &mut self.t[id];
        // Device copy: shrinks at the end (or later, see the module docs).
        let rest = s.dev_frac - fraction;
        let bytes = if rest <= EPS { s.dev_bytes } else { Self::part(s.size, fraction).min(s.dev_bytes) };
        s.dev_bytes -= bytes;
        s.dev_frac = if rest <= EPS { 0.0 } else { rest };
        // Progressive: the memory goes at the link's rate; the pending entry (with no bytes)
        // only keeps the device copy readable, as under O.7.
        let held = if progressive { 0 } else { bytes };
        s.pending.push(Pending { bytes: held, time: end, op, floor: self.last_start });
        s.busy_until = s.busy_until.max(end);
        if progressive && bytes > 0 {
            self.ramps.push(Ramp { t0: start, t1: end, delta: -(bytes as i128), tag: tag(id), op });
        }
        self.horizon = self.horizon.max(end);
        Ok(())
    }

    /// Brings `fraction` of a tensor back on the host→device stream.
    pub fn prefetch(&mut self, op: usize, id: usize, fraction: f64) -> Result<(), SimError> {
        self.check_fraction(op, fraction)?;
        let s = &self.t[id];
        if s.dev_frac >= 1.0 - EPS {
            return Err(self.already(op, id));
        }
        if s.host_frac <= EPS {
            return Err(self.invalid(op, format!("{:?} has no host copy to prefetch", self.names[id])));
        }
        if s.host_frac + EPS < fraction {
            return Err(self.invalid(
                op,
                format!("prefetches {fraction} of {:?}, but only {} of it is on the host", self.names[id], s.host_frac),
            ));
        }
        if s.dev_frac + fraction > 1.0 + EPS {
            return Err(self.invalid(
                op,
                format!(
                    "prefetches {fraction} of {:?}, but {} of it is already on the device",
                    self.names[id], s.dev_frac
                ),
            ));
        }
        self.settle(id);
        let s = &self.t[id];
        let frac = s.dev_frac + fraction;
        let bytes = if frac >= 1.0 - EPS {
            s.size - s.dev_bytes
        } else {
            Self::part(s.size, fraction).min(s.size - s.dev_bytes)
        };
        let mut start = self.cursor.max(self.h2d_free).max(s.host_ready);
        let duration = self.h2d.transfer_time(s.size as f64 * fraction);
        let progressive = self.transfers == TransferMemory::Progressive && duration > 0.0;
        if !progressive {
            start = self.wait_for_memory(start, bytes, 0, duration);
        }
        let end = start + duration;
        self.h2d_free = end;
        self.h2d_busy += duration;
        if self.timeline {
            self.spans.push(Span { lane: Lane::H2d, op, start, end });
        }
        if bytes > 0 {
            if progressive {
                self.ramps.push(Ramp { t0: start, t1: end, delta: bytes as i128, tag: tag(id), op });
            } else {
                self.dev.push(Ev { time: start, key: key(1, op, ALLOC), delta: bytes as i128, tag: tag(id) });
            }
        }
        let s = &mut self.t[id];
        s.last_alloc = start;
        s.dev_bytes += bytes;
        if frac >= 1.0 - EPS {
            s.dev_frac = 1.0;
            s.dev_bytes = s.size;
            s.intact = true;
        } else {
            s.dev_frac = frac;
        }
        s.ready = s.ready.max(end);
        s.busy_until = s.busy_until.max(end);
        Ok(())
    }

    // ----- internals -----------------------------------------------------------------

    /// The class of a release at `time` of memory allocated at `alloc`, while a compute op
    /// that started at `floor` may still hold it: 0 (before the allocations of that instant)
    /// only if both happened strictly earlier; otherwise 1 (program order), so that a
    /// zero-duration op's reads and outputs count during it.
    fn class(time: f64, alloc: f64, floor: f64) -> u64 {
        if time > alloc && time > floor {
            0
        } else {
            1
        }
    }

    /// Emits the releases of the tensor's finished offloads; the device copy is no longer
    /// readable unless all of it is (logically) on the device.
    fn settle(&mut self, id: usize) {
        let s = &mut self.t[id];
        if s.pending.is_empty() {
            return;
        }
        for p in s.pending.drain(..) {
            if p.bytes > 0 {
                let class = Self::class(p.time, s.last_alloc, p.floor);
                self.dev.push(Ev {
                    time: p.time,
                    key: key(class, p.op, RELEASE),
                    delta: -(p.bytes as i128),
                    tag: tag(id),
                });
            }
        }
        s.intact = s.dev_frac >= 1.0 - EPS;
    }

    fn settle_all(&mut self) {
        for id in 0..self.t.len() {
            self.settle(id);
        }
    }

    /// Releases everything the tensor holds, device and host, at `time` or when its
    /// transfers (and the reads that hold an offloaded copy) end, whichever is later.
    fn release(&mut self, id: usize, time: f64, floor: f64, op: usize) {
        let (when, floor) = self.release_device(id, time, floor, op);
        self.release_host(id, when, floor, op);
    }

    /// Releases the tensor's host copy at `time` (`floor`: the latest start of a compute
    /// op that held it, see [`Engine::class`]).
    fn release_host(&mut self, id: usize, time: f64, floor: f64, op: usize) {
        let s = &mut self.t[id];
        if s.host_bytes > 0 {
            let class = Self::class(time, s.host_last_alloc, floor);
            self.host.push(Ev { time, key: key(class, op, RELEASE), delta: -(s.host_bytes as i128), tag: NONE });
        }
        s.host_frac = 0.0;
        s.host_bytes = 0;
    }

    /// Releases the tensor's device copy (see [`Engine::release`]); returns when, and the
    /// latest start of a compute op that held it.
    fn release_device(&mut self, id: usize, time: f64, floor: f64, op: usize) -> (f64, f64) {
        let s = &mut self.t[id];
        let mut when = time.max(s.busy_until);
        let mut floor = floor;
        let bytes = s.dev_bytes;
        let last_alloc = s.last_alloc;
        let pending: Vec<Pending> = s.pending.drain(..).collect();
        for p in &pending {
            when = when.max(p.time);
            floor = floor.max(p.floor);
        }
        // An offload's device bytes go when its transfer (and the reads holding them) end,
        // however late the free comes.
        for p in pending.into_iter().filter(|p| p.bytes > 0) {
            let class = Self::class(p.time, last_alloc, p.floor);
            self.dev.push(Ev { time: p.time, key: key(class, p.op, RELEASE), delta: -(p.bytes as i128), tag: tag(id) });
            self.horizon = self.horizon.max(p.time);
        }
        let s = &mut self.t[id];
        if bytes > 0 {
            let class = Self::class(when, s.last_alloc, floor);
            self.dev.push(Ev { time: when, key: key(class, op, RELEASE), delta: -(bytes as i128), tag: tag(id) });
            self.horizon = self.horizon.max(when);
        }
        s.dev_frac = 0.0;
        s.dev_bytes = 0;
        s.intact = false;
        s.stale = false;
        (when, floor)
    }

    fn sort(evs: &mut [Ev]) {
        evs.sort_unstable_by(|a, b| a.time.total_cmp(&b.time).then(a.key.cmp(&b.key)));
    }

    /// Sorts the events and derives peaks (and the timeline if asked); the first budget
    /// violation is an error. Progressive transfers ([`Ramp`]s) make memory piecewise
    /// linear: their ends are visited as events of no size, so that the peak is still found
    /// at an event.
    fn scan(&mut self) -> Result<(u64, u64, Vec<MemoryPoint>), SimError> {
        for r in &self.ramps {
            for time in [r.t0, r.t1] {
                self.dev.push(Ev { time, key: key(0, 0, RELEASE), delta: 0, tag: NONE });
            }
        }
        Self::sort(&mut self.dev);
        Self::sort(&mut self.host);
        let mut ramps = std::mem::take(&mut self.ramps);
        ramps.sort_by(|a, b| a.t0.total_cmp(&b.t0));
        let budget = self.budget;
        if let Some(b) = budget {
            if self.base > b {
                return Err(SimError::BudgetExceeded {
                    op: 0,
                    text: "initial state (static memory and inputs)".into(),
                    time: 0.0,
                    bytes: self.base,
                    budget: b,
                });
            }
        }
        let mut timeline = Vec::new();
        if self.timeline {
            timeline.push(MemoryPoint { time: 0.0, bytes: self.base });
        }
        // Memory at an instant: `running` (exact steps and finished ramps) + the part the
        // ramps in progress have moved.
        let over = |running: i128, part: f64, b: u64| {
            if part == 0.0 {
                running > b as i128
            } else {
                running as f64 + part > b as f64 * (1.0 + 1e-12) + 1e-6
            }
        };
        let bytes = |running: i128, part: f64| saturate(running + part.round() as i128);
        let mut running = self.base as i128;
        let mut peak = running;
        let (mut next_ramp, mut active): (usize, Vec<Ramp>) = (0, Vec::new());
        let evs = &self.dev;
        let mut i = 0;
        while i < evs.len() {
            let time = evs[i].time;
            while next_ramp < ramps.len() && ramps[next_ramp].t0 <= time {
                active.push(ramps[next_ramp]);
                next_ramp += 1;
            }
            active.retain(|r| {
                if r.t1 <= time {
                    running += r.delta;
                    false
                } else {
                    true
                }
            });
            let part: f64 = active.iter().map(|r| r.at(time)).sum();
            let before = running;
            let mut top = running;
            let exceeded = |key: u64, running: i128| {
                let budget = budget?;
                if !over(running, part, budget) {
                    return None;
                }
                let op = key_op(key);
                Some(SimError::BudgetExceeded { op, text: self.text(op), time, bytes: bytes(running, part), budget })
            };
            // A ramp in progress may have taken memory since the last event.
            if let Some(e) = exceeded(evs[i].key, running) {
                return Err(e);
            }
            while i < evs.len() && evs[i].time == time {
                let e = evs[i];
                running += e.delta;
                // An op's blocks (its temporary memory, each output) count together.
                let more = evs.get(i + 1).is_some_and(|n| n.time == time && n.key == e.key);
                if e.delta > 0 && !more {
                    top = top.max(running);
                    if let Some(err) = exceeded(e.key, running) {
                        return Err(err);
                    }
                }
                i += 1;
            }
            let (top, now) = (bytes(top, part), bytes(running, part));
            peak = peak.max(top as i128);
            if self.timeline {
                if top > bytes(before, part) && top > now {
                    timeline.push(MemoryPoint { time, bytes: top });
                }
                if timeline.last().map(|p| p.bytes) != Some(now) {
                    timeline.push(MemoryPoint { time, bytes: now });
                }
            }
        }
        let mut host = 0i128;
        let mut host_peak = 0i128;
        for e in &self.host {
            host += e.delta;
            host_peak = host_peak.max(host);
            if e.delta > 0 && host > self.host_memory as i128 {
                let op = key_op(e.key);
                return Err(SimError::HostMemoryExceeded {
                    op,
                    text: self.text(op),
                    time: e.time,
                    bytes: saturate(host),
                    host_memory: self.host_memory,
                });
            }
        }
        Ok((saturate(peak), saturate(host_peak), timeline))
    }

    /// Ends the simulation: settles the offloads and derives the report.
    pub fn finish(mut self) -> Result<SimReport, SimError> {
        self.settle_all();
        let allocator = self.allocator.map(|config| self.reserved(config)).transpose()?;
        let (peak_bytes, peak_host_bytes, timeline) = self.scan()?;
        Ok(SimReport {
            makespan: self.cursor.max(self.d2h_free).max(self.h2d_free).max(self.cpu_free),
            compute_time: self.compute_time,
            peak_bytes,
            peak_host_bytes,
            compute_ops: self.compute_ops,
            d2h_busy: self.d2h_busy,
            h2d_busy: self.h2d_busy,
            cpu_busy: self.cpu_busy,
            compute_stall: (self.cursor - self.compute_time).max(0.0),
            timeline,
            spans: self.spans,
            periods: 1,
            allocator,
        })
    }
}
