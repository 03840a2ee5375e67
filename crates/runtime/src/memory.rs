//! Measuring memory.
//!
//! On the CPU every tensor buffer of burn-flex comes from the global allocator, so a
//! counting allocator gives the true peak of live heap bytes during a step. A binary (or
//! test) opts in with
//!
//! ```no_run
//! #[global_allocator]
//! static ALLOC: pebble_runtime::memory::CountingAlloc = pebble_runtime::memory::CountingAlloc;
//! ```
//!
//! and [`counting`] then says so. Without it the counters stay at zero.
//!
//! Host copies of offloaded tensors live on the heap too, but they are not device memory:
//! what a thread allocates or frees inside a [`host_scope`] goes to separate counters
//! ([`host_live`], [`host_peak`]), so that [`live`] and [`peak`] stay the device's. The
//! executor's transfer threads open a scope around making a host copy, and a host copy
//! opens one when it is dropped (`transfer.rs`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static ACTIVE: AtomicBool = AtomicBool::new(false);
// Signed: a block allocated outside a host scope and freed inside one would otherwise wrap.
static HOST_LIVE: AtomicI64 = AtomicI64::new(0);
static HOST_PEAK: AtomicI64 = AtomicI64::new(0);

thread_local! {
    // Const-initialized and without a destructor: reading it never allocates.
    static HOST: Cell<bool> = const { Cell::new(false) };
}

fn in_host_scope() -> bool {
    HOST.try_with(Cell::get).unwrap_or(false)
}

/// The system allocator, counting live bytes and their peak (device and host apart).
pub struct CountingAlloc;

impl CountingAlloc {
    #[inline]
    fn grew(size: usize) {
        if in_host_scope() {
            let now = HOST_LIVE.fetch_add(size as i64, Ordering::Relaxed) + size as i64;
            HOST_PEAK.fetch_max(now, Ordering::Relaxed);
            return;
        }
        let now = LIVE.fetch_add(size as u64, Ordering::Relaxed) + size as u64;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
    #[inline]
    fn shrank(size: usize) {
        if in_host_scope() {
            HOST_LIVE.fetch_sub(size as i64, Ordering::Relaxed);
            return;
        }
        LIVE.fetch_sub(size as u64, Ordering::Relaxed);
    }
}

// SAFETY: every call forwards to `System` with the caller's layout; the counters do not
// touch the memory.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ACTIVE.store(true, Ordering::Relaxed);
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            Self::grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            Self::grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) };
        Self::shrank(layout.size());
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                Self::grew(new_size - layout.size());
            } else {
                Self::shrank(layout.size() - new_size);
            }
        }
        p
    }
}

/// Whether the process counts its allocations ([`CountingAlloc`] is its global allocator).
pub fn counting() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Live heap bytes now, host copies excepted.
pub fn live() -> u64 {
    LIVE.load(Ordering::Relaxed)
}

/// The peak of live heap bytes since the last [`reset_peak`], host copies excepted.
pub fn peak() -> u64 {
    PEAK.load(Ordering::Relaxed)
}

/// Live bytes allocated inside host scopes (host copies of offloaded tensors) now.
pub fn host_live() -> u64 {
    HOST_LIVE.load(Ordering::Relaxed).max(0) as u64
}

/// The peak of [`host_live`] since the last [`reset_peak`].
pub fn host_peak() -> u64 {
    HOST_PEAK.load(Ordering::Relaxed).max(0) as u64
}

/// While the returned guard lives, this thread's allocations and frees count as host
/// memory ([`host_live`]) instead of device memory ([`live`]). Scopes nest.
pub fn host_scope() -> HostScope {
    let outer = HOST.with(|h| h.replace(true));
    HostScope { outer, _not_send: std::marker::PhantomData }
}

/// While the returned guard lives, this thread's allocations and frees count as device
/// memory again, inside a host scope (a device tensor dropped by the host CPU's thread).
pub fn device_scope() -> HostScope {
    let outer = HOST.with(|h| h.replace(false));
    HostScope { outer, _not_send: std::marker::PhantomData }
}

/// The guard of [`host_scope`]: restores the thread's previous accounting when dropped.
pub struct HostScope {
    outer: bool,
    // The flag is per thread: the guard must be dropped on the thread that made it.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for HostScope {
    fn drop(&mut self) {
        HOST.with(|h| h.set(self.outer));
    }
}

/// Starts measuring a step: resets the heap (device and host) and device peaks and
/// returns the live heap bytes now, which the step's peak is taken above.
pub fn start_step() -> u64 {
    let before = live();
    reset_peak();
    reset_device_peak();
    before
}

/// Starts new peaks (device and host heap) from the live bytes now.
pub fn reset_peak() {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
    HOST_PEAK.store(HOST_LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// A reading of device memory in use, for backends whose memory the global allocator
/// does not see (CUDA). The executor samples it after every op; the step's peak is the
/// largest sample, so a peak inside one op's kernels is missed.
pub type Probe = fn() -> u64;

static PROBE: std::sync::RwLock<Option<Probe>> = std::sync::RwLock::new(None);
static DEVICE_PEAK: AtomicU64 = AtomicU64::new(0);

/// Installs (or removes) the device-memory probe.
pub fn set_probe(probe: Option<Probe>) {
    *PROBE.write().unwrap_or_else(|e| e.into_inner()) = probe;
}

/// Whether a device-memory probe is installed.
pub fn probing() -> bool {
    PROBE.read().map(|p| p.is_some()).unwrap_or(false)
}

/// Bytes the device can still allocate, where pebble can tell: on the CPU (no device
/// probe installed) the host's `MemAvailable` (Linux); `None` elsewhere.
pub fn device_available() -> Option<u64> {
    if probing() {
        return None;
    }
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// What a thread that may allocate device memory calls when it starts (on CUDA, where
/// each thread allocates on a stream of its own, it adds that stream to the probe's sum).
pub type ThreadHook = fn();

static THREAD_HOOK: std::sync::RwLock<Option<ThreadHook>> = std::sync::RwLock::new(None);

/// Installs (or removes) the hook [`device_thread`] calls.
pub fn set_thread_hook(hook: Option<ThreadHook>) {
    *THREAD_HOOK.write().unwrap_or_else(|e| e.into_inner()) = hook;
}

/// Called by the executor's transfer threads when they start: the device's memory they
/// allocate counts in the probe's samples.
pub fn device_thread() {
    if let Some(hook) = *THREAD_HOOK.read().unwrap_or_else(|e| e.into_inner()) {
        hook();
    }
}

/// Samples the device probe, if any, into the device peak.
pub fn sample() {
    if let Some(probe) = *PROBE.read().unwrap_or_else(|e| e.into_inner()) {
        DEVICE_PEAK.fetch_max(probe(), Ordering::Relaxed);
    }
}

/// Starts a new device peak from a fresh sample.
pub fn reset_device_peak() {
    DEVICE_PEAK.store(0, Ordering::Relaxed);
    sample();
}

/// The largest device sample since [`reset_device_peak`].
pub fn device_peak() -> u64 {
    DEVICE_PEAK.load(Ordering::Relaxed)
}
