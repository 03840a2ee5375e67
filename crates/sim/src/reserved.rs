//! The engine's memory events replayed through the caching allocator's model
//! ([`crate::allocator`]): what PyTorch would reserve for the schedule, beside what it
//! allocates (`SimConfig::allocator`).
//!
//! Every block the engine tracks becomes one allocation, in the order the engine's events
//! sort (releases first at equal times): each tensor's device bytes, each compute op's
//! temporary memory, the static memory as one block and each tensor resident from the
//! start, in id order. A partial release (an offload of a fraction of a tensor) frees the
//! tensor's oldest block and allocates what remains of it again: the allocator cannot
//! shrink a block in place. Progressive transfers ([`crate::TransferMemory::Progressive`])
//! take their whole block at a prefetch's start and give it back at an offload's end.

use std::collections::HashMap;

use crate::allocator::{AllocatorConfig, AllocatorStats, BlockId, CachingAllocator, OutOfMemory};

/// The tag of an op's temporary memory.
pub(crate) const TMP: u32 = u32::MAX;
/// The tag of what no block holds (host memory, a ramp's ends).
pub(crate) const NONE: u32 = u32::MAX - 1;

/// A tensor's tag: its id (ids from [`NONE`] up, which no schedule reaches, read as none).
pub(crate) fn tag(id: usize) -> u32 {
    u32::try_from(id).unwrap_or(NONE).min(NONE)
}

/// One allocation or release, as the engine records it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Event {
    /// When.
    pub time: f64,
    /// The engine's order at equal times.
    pub key: u64,
    /// Bytes taken (positive) or given back.
    pub delta: i128,
    /// Whose: a tensor id, `TMP` for the op's temporary memory, `NONE` for nothing.
    pub tag: u32,
    /// The op it belongs to.
    pub op: usize,
}

/// Why the replay stopped: the allocator refused a request of op `op` at `time`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refused {
    pub op: usize,
    pub time: f64,
    pub oom: OutOfMemory,
}

/// The live blocks of the replay.
struct Replay {
    alloc: CachingAllocator,
    /// Per tensor tag, its blocks (oldest first) and their sizes.
    tensors: HashMap<u32, Vec<(BlockId, u64)>>,
    /// Per op, its temporary memory's block.
    tmp: HashMap<usize, Vec<BlockId>>,
}

impl Replay {
    fn take(&mut self, tag: u32, op: usize, bytes: u64) -> Result<(), OutOfMemory> {
        let id = self.alloc.malloc(bytes)?;
        if tag == TMP {
            self.tmp.entry(op).or_default().push(id);
        } else {
            self.tensors.entry(tag).or_default().push((id, bytes));
        }
        Ok(())
    }

    fn give_back(&mut self, tag: u32, op: usize, bytes: u64) -> Result<(), OutOfMemory> {
        if tag == TMP {
            if let Some(id) = self.tmp.get_mut(&op).and_then(Vec::pop) {
                self.alloc.free(id);
            }
            return Ok(());
        }
        let blocks = self.tensors.entry(tag).or_default();
        let mut left = bytes;
        while left > 0 && !blocks.is_empty() {
            let (id, size) = blocks.remove(0);
            self.alloc.free(id);
            if size > left {
                // A part of the block goes: what stays is a block of its own.
                return self.take(tag, op, size - left);
            }
            left -= size;
        }
        Ok(())
    }
}

/// Replays `events` (with `initial`, the blocks resident at time 0, first) through the
/// caching allocator under `config`; its statistics, or the first request it refused.
pub(crate) fn replay(
    mut events: Vec<Event>,
    initial: &[(u32, u64)],
    config: AllocatorConfig,
) -> Result<AllocatorStats, Refused> {
    let mut r = Replay { alloc: CachingAllocator::new(config), tensors: HashMap::new(), tmp: HashMap::new() };
    for &(tag, bytes) in initial.iter().filter(|(_, b)| *b > 0) {
        r.take(tag, 0, bytes).map_err(|oom| Refused { op: 0, time: 0.0, oom })?;
    }
    events.sort_unstable_by(|a, b| a.time.total_cmp(&b.time).then(a.key.cmp(&b.key)));
    for e in events.iter().filter(|e| e.delta != 0 && e.tag != NONE) {
        let bytes = u64::try_from(e.delta.unsigned_abs()).unwrap_or(u64::MAX);
        let done = if e.delta > 0 { r.take(e.tag, e.op, bytes) } else { r.give_back(e.tag, e.op, bytes) };
        done.map_err(|oom| Refused { op: e.op, time: e.time, oom })?;
    }
    Ok(r.alloc.stats())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: i128 = 1 << 20;

    fn ev(time: f64, op: usize, delta: i128, tag: u32) -> Event {
        // Releases sort before allocations at equal times, as in the engine.
        let key = (u64::from(delta > 0) << 63) | ((op as u64) << 1);
        Event { time, key, delta, tag, op }
    }

    /// Three 6 MiB tensors share one 20 MiB segment (a request under 10 MiB); freeing the
    /// first and the last leaves 6 MiB and 8 MiB holes, so a 9 MiB tensor takes a second
    /// segment: 15 MiB allocated in 40 MiB reserved. Under a capacity of 30 MiB no segment
    /// is wholly free to give back: out of memory, where allocated bytes fit.
    #[test]
    fn holes_in_a_segment_reserve_a_second_one() {
        let events = vec![
            ev(0.0, 0, 6 * MIB, 0),
            ev(1.0, 1, 6 * MIB, 1),
            ev(2.0, 2, 6 * MIB, 2),
            ev(3.0, 3, -6 * MIB, 0),
            ev(3.0, 3, -6 * MIB, 2),
            ev(4.0, 4, 9 * MIB, 3),
        ];
        let stats = replay(events.clone(), &[], AllocatorConfig::default()).unwrap();
        assert_eq!((stats.peak_allocated, stats.peak_reserved), (18 << 20, 40 << 20));
        assert_eq!((stats.allocated, stats.reserved), (15 << 20, 40 << 20));
        let capped = AllocatorConfig { capacity: Some(30 << 20), ..AllocatorConfig::default() };
        let refused = replay(events, &[], capped).unwrap_err();
        assert_eq!((refused.op, refused.time, refused.oom.requested), (4, 4.0, 9 << 20));
    }

    /// A temporary is its op's own block; an offload of 1/3 of a tensor frees its block
    /// and takes the 2/3 left as a new one; a release of the whole frees every block.
    #[test]
    fn temporaries_by_op_and_partial_releases() {
        let events = vec![
            ev(0.0, 0, 3 * MIB, 7),
            ev(0.0, 0, MIB / 2, TMP),
            ev(1.0, 0, -MIB / 2, TMP),
            ev(1.0, 1, MIB / 4, TMP),
            ev(2.0, 1, -MIB / 4, TMP),
            ev(2.0, 2, -MIB, 7),
            ev(3.0, 3, MIB, 7),
            ev(4.0, 4, -3 * MIB, 7),
        ];
        let stats = replay(events, &[(NONE, 512)], AllocatorConfig::default()).unwrap();
        // 512 B static in a 2 MiB small segment; 3 MiB + the 0.5 MiB temporary (small).
        assert_eq!(stats.peak_allocated, 512 + (3 << 20) + (1 << 19));
        // Only the static block is left.
        assert_eq!(stats.allocated, 512);
    }
}
