//! A model of PyTorch's CUDA caching allocator: what `torch.cuda.memory_allocated()` and
//! `torch.cuda.memory_reserved()` become under a sequence of allocations and frees.
//!
//! It follows `DeviceCachingAllocator` in `c10/cuda/CUDACachingAllocator.cpp` of
//! pytorch/pytorch at commit `001074d25084fdb87a799823e395a50f5ec044d3` (a tree from
//! before `max_non_split_rounding_mb`: the slack that `get_free_block` allows an oversize
//! block is the constant [`kLargeBuffer`] there; later versions make it an option with
//! that default; the torch 2.15 the project's tools use also makes the 20 MiB large segment
//! an option, `large_segment_size_mb`, with the same default). Each rule below names the
//! function it comes from.
//!
//! * Sizes are rounded up to [`kMinBlockSize`] ([`round_size`]); a rounded size up to
//!   [`kSmallSize`] goes to the small pool, a larger one to the large pool (`get_pool`).
//! * A request is served from the pool's cached free blocks by best fit: the smallest
//!   block at least as large, ties broken by address (`get_free_block`, the pool being
//!   ordered by `BlockComparatorSize`). With a `max_split_size`, a request below it is not
//!   given a block at or above it, and a request at or above it is not given a block
//!   [`kLargeBuffer`] or more larger than itself; the search then fails, it does not go on
//!   to the next block.
//! * The block is split when the remainder is worth keeping (`should_split`): in the small
//!   pool (and with expandable segments) when it is at least [`kMinBlockSize`], in the
//!   large pool when the request is below `max_split_size` and the remainder is more than
//!   [`kSmallSize`]. The allocated part keeps the block's start; the remainder goes back
//!   to the pool (`alloc_found_block`). An unsplit block is allocated whole, and
//!   [`CachingAllocator::allocated`] counts its whole size, as `allocated_bytes` does.
//! * A freed block merges with free neighbours of its segment (`free_block`,
//!   `try_merge_blocks`) and goes back to its pool. Nothing moves; a segment is only given
//!   back to the device when it is wholly free and memory runs out.
//! * When no cached block fits, a new segment is taken (`alloc_block`), of
//!   [`get_allocation_size`]: [`kSmallBuffer`] for a small request, [`kLargeBuffer`] for a
//!   large one below [`kMinLargeAlloc`], else the size rounded up to [`kRoundLarge`]. If the
//!   device has no room for it, `malloc` frees cached oversize blocks
//!   (`release_available_cached_blocks`, only with a `max_split_size`) and retries, then
//!   frees every wholly free segment (`release_cached_blocks`) and retries once more; if
//!   that fails too it returns [`OutOfMemory`].
//!
//! # Expandable segments
//!
//! With [`AllocatorMode::ExpandableSegments`] (`expandable_segments:True`, see
//! Note [Expandable Segments] in the source) each pool has one segment of virtual address
//! space that is backed by physical pages on demand: pages of [`kSmallBuffer`] in the small
//! pool and [`kLargeBuffer`] in the large pool (`find_expandable_block`). A request that no
//! free block fits is placed at the lowest address where the free and unmapped blocks that
//! follow are large enough, and the pages it needs there are mapped
//! (`try_allocate_expandable_block`, `map_block`); `reserved` counts mapped pages. Best fit
//! counts a free block followed by unmapped space as that much larger, so a block that
//! cannot grow is preferred (`get_free_block`). Blocks split down to [`kMinBlockSize`] in
//! both pools (`should_split`). When memory runs out, the whole pages inside free blocks
//! are unmapped (`release_blocks`, `unmap_block`) before the retry, and may then be mapped
//! again elsewhere in the segment.
//!
//! # What is simplified
//!
//! * One stream and one device: no cross-stream uses or events (`recordStream`,
//!   `process_events`), no CUDA graph pools, no free-memory callbacks, no
//!   `garbage_collection_threshold`, no `roundup_power2_divisions` (default off), no
//!   `empty_cache`.
//! * The capacity is the device's memory as `cudaMalloc` and `cuMemCreate` see it: a
//!   segment or a range of pages is refused when reserved memory plus its size would pass
//!   it (a range of pages is mapped whole or not at all, as `ExpandableSegment::map` does).
//!   Driver overheads, other processes and `set_per_process_memory_fraction` (which, with
//!   expandable segments, checks the whole `get_allocation_size` ahead) are not modelled.
//! * Addresses are offsets: segments are laid end to end in a `u64` address space and
//!   never reused; the expandable segment of each pool spans `2^62` bytes rounded down to
//!   whole pages, where PyTorch reserves 9/8 of the device's memory and opens a further
//!   segment when one is full. Here a pool has at most one, and a request that does not
//!   fit in its address space is out of memory.
//! * `release_available_cached_blocks` is skipped with expandable segments (the commit read
//!   would call `release_block`, which asserts a non-expandable block; later versions skip
//!   expandable blocks there).
//! * A `max_split_size` below [`kLargeBuffer`] is raised to it, as `parseMaxSplitSize`
//!   refuses or raises such values.
//! * As `NativeCachingAllocator::allocate`, a request of 0 bytes takes no memory (a null
//!   [`BlockId`] that `free` ignores) and one of 1 EiB or more is out of memory at once.
#![allow(non_upper_case_globals)]

use std::collections::BTreeMap;
use std::fmt;

/// All sizes are rounded up to a multiple of 512 bytes (`kMinBlockSize`, `round_size`).
pub const kMinBlockSize: u64 = 512;
/// The largest "small" request, 1 MiB: rounded sizes up to it use the small pool
/// (`kSmallSize`, `get_pool`).
pub const kSmallSize: u64 = 1_048_576;
/// Small requests are packed in 2 MiB segments (`kSmallBuffer`, `get_allocation_size`);
/// also the page size of the small pool's expandable segment.
pub const kSmallBuffer: u64 = 2_097_152;
/// Large requests below 10 MiB share a [`kLargeBuffer`] segment (`kMinLargeAlloc`).
pub const kMinLargeAlloc: u64 = 10_485_760;
/// Larger requests get a segment of their size rounded up to 2 MiB (`kRoundLarge`).
pub const kRoundLarge: u64 = 2_097_152;
/// Large requests below [`kMinLargeAlloc`] are packed in 20 MiB segments (`kLargeBuffer`);
/// also the page size of the large pool's expandable segment, and the most an oversize
/// cached block may exceed a request by (`get_free_block`).
pub const kLargeBuffer: u64 = 20_971_520;

/// `NativeCachingAllocator::allocate` refuses requests of 1 EiB or more (`one_exa_bytes`).
const ONE_EXA_BYTES: u64 = 1 << 60;
/// The virtual size of an expandable segment, before rounding down to whole pages.
const EXPANDABLE_SPAN: u64 = 1 << 62;
/// The key of the null block that a request of 0 bytes gets.
const NULL_KEY: u64 = u64::MAX;

/// `round_size`: `size` rounded up to a multiple of [`kMinBlockSize`] (at least one);
/// `None` when that does not fit in a `u64`.
pub fn round_size(size: u64) -> Option<u64> {
    if size < kMinBlockSize {
        Some(kMinBlockSize)
    } else {
        size.checked_next_multiple_of(kMinBlockSize)
    }
}

/// `get_allocation_size`: the segment a rounded request takes when no cached block fits
/// it: [`kSmallBuffer`] up to [`kSmallSize`], [`kLargeBuffer`] below [`kMinLargeAlloc`],
/// else the size rounded up to [`kRoundLarge`] (`None` when that does not fit in a `u64`).
pub fn get_allocation_size(size: u64) -> Option<u64> {
    if size <= kSmallSize {
        Some(kSmallBuffer)
    } else if size < kMinLargeAlloc {
        Some(kLargeBuffer)
    } else {
        size.checked_next_multiple_of(kRoundLarge)
    }
}

/// How segments are obtained (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AllocatorMode {
    /// `expandable_segments:False`, the default: each segment is one `cudaMalloc`.
    #[default]
    Caching,
    /// `expandable_segments:True`: one virtual segment per pool, grown by mapping pages.
    ExpandableSegments,
}

/// The allocator's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AllocatorConfig {
    /// Plain segments or expandable ones.
    pub mode: AllocatorMode,
    /// Device memory in bytes that segments (or mapped pages) may take; `None` = unlimited.
    pub capacity: Option<u64>,
    /// `max_split_size_mb` in bytes: blocks this large or larger are not split, and serve
    /// only requests this large or larger. `None` (the default) = unlimited. Values below
    /// [`kLargeBuffer`] are raised to it.
    pub max_split_size: Option<u64>,
}

/// A block handed out by [`CachingAllocator::malloc`]. Each allocation gets its own id, so
/// a stale id never frees a later allocation of the same memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockId {
    key: u64,
    serial: u64,
}

/// What the allocator holds, as `torch.cuda.memory_stats()` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct AllocatorStats {
    /// Bytes of live blocks (`allocated_bytes.all.current`).
    pub allocated: u64,
    /// Bytes of segments, or of mapped pages (`reserved_bytes.all.current`).
    pub reserved: u64,
    /// Highest `allocated` so far (`torch.cuda.max_memory_allocated()`).
    pub peak_allocated: u64,
    /// Highest `reserved` so far (`torch.cuda.max_memory_reserved()`).
    pub peak_reserved: u64,
    /// The most bytes allocated at any moment when `reserved` stood at `peak_reserved`.
    pub allocated_at_peak_reserved: u64,
    /// Fragmentation at the reserved peak: `1 - allocated_at_peak_reserved /
    /// peak_reserved`, the share of the peak reservation that was never in use while the
    /// peak lasted (the "reserved by PyTorch but unallocated" of the out-of-memory
    /// message, over reserved). 0 before anything is reserved. The figure users often
    /// take from the two peaks, `1 - peak_allocated / peak_reserved`, is at most this one.
    pub fragmentation_at_peak: f64,
    /// Segments now held: `cudaMalloc`ed segments, or contiguous mapped ranges of the
    /// expandable segments (as `torch.cuda.memory_snapshot()` lists them).
    pub segments: usize,
    /// The largest cached free block (`cacheInfo`), 0 if none.
    pub largest_free_block: u64,
    /// Segments allocated or ranges of pages mapped (`num_device_alloc`).
    pub num_device_alloc: u64,
    /// Segments freed or ranges of pages unmapped (`num_device_free`).
    pub num_device_free: u64,
    /// Allocations that had to free every cached segment and retry (`num_alloc_retries`).
    pub num_alloc_retries: u64,
    /// Allocations that failed after the retries (`num_ooms`).
    pub num_ooms: u64,
}

/// A request the allocator could not serve: "CUDA out of memory".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfMemory {
    /// Bytes requested.
    pub requested: u64,
    /// The segment size the request would take (`get_allocation_size` of the rounded
    /// request; `u64::MAX` when that is not representable), which PyTorch's message names.
    pub alloc_size: u64,
    /// Bytes allocated when it failed.
    pub allocated: u64,
    /// Bytes reserved when it failed (after the cache was released).
    pub reserved: u64,
    /// The device capacity, if any.
    pub capacity: Option<u64>,
}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let capacity = self.capacity.map_or_else(|| "unlimited".to_string(), format_size);
        write!(
            f,
            "CUDA out of memory. Tried to allocate {} (request of {}); {} allocated, {} reserved, capacity {}",
            format_size(self.alloc_size),
            format_size(self.requested),
            format_size(self.allocated),
            format_size(self.reserved),
            capacity
        )
    }
}

impl std::error::Error for OutOfMemory {}

/// `format_size`: bytes up to 1 KiB, then KiB, MiB or GiB with two decimals.
fn format_size(size: u64) -> String {
    let bytes = size as f64;
    if size <= 1 << 10 {
        format!("{size} bytes")
    } else if size <= 1 << 20 {
        format!("{:.2} KiB", bytes / 1024.0)
    } else if size <= 1 << 30 {
        format!("{:.2} MiB", bytes / 1_048_576.0)
    } else {
        format!("{:.2} GiB", bytes / 1_073_741_824.0)
    }
}

/// The two pools (`small_blocks`, `large_blocks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pool {
    Small,
    Large,
}

impl Pool {
    /// `get_pool`.
    fn of(size: u64) -> Pool {
        if size <= kSmallSize {
            Pool::Small
        } else {
            Pool::Large
        }
    }

    /// The page size of the pool's expandable segment (`find_expandable_block`).
    fn page_size(self) -> u64 {
        match self {
            Pool::Small => kSmallBuffer,
            Pool::Large => kLargeBuffer,
        }
    }
}

/// `Block`: a range of a segment, allocated, free or (expandable) unmapped.
#[derive(Debug, Clone)]
struct Block {
    addr: u64,
    size: u64,
    pool: Pool,
    allocated: bool,
    mapped: bool,
    prev: Option<u64>,
    next: Option<u64>,
    serial: u64,
}

impl Block {
    fn free(addr: u64, size: u64, pool: Pool, mapped: bool) -> Block {
        Block { addr, size, pool, allocated: false, mapped, prev: None, next: None, serial: 0 }
    }
}

/// `BlockPool`.
#[derive(Debug, Default)]
struct BlockPool {
    /// Free mapped blocks by (size, address) (`blocks`, ordered by `BlockComparatorSize`).
    blocks: BTreeMap<(u64, u64), u64>,
    /// Unmapped ranges of the expandable segment by address (`unmapped`).
    unmapped: BTreeMap<u64, u64>,
    /// Whether the pool's expandable segment exists.
    expandable: bool,
}

/// The model of `DeviceCachingAllocator` for one device and one stream.
#[derive(Debug)]
pub struct CachingAllocator {
    config: AllocatorConfig,
    blocks: BTreeMap<u64, Block>,
    small: BlockPool,
    large: BlockPool,
    next_key: u64,
    next_serial: u64,
    next_addr: u64,
    allocated: u64,
    reserved: u64,
    counters: AllocatorStats,
}

impl CachingAllocator {
    /// An empty allocator.
    pub fn new(config: AllocatorConfig) -> Self {
        let max_split_size = config.max_split_size.map(|m| m.max(kLargeBuffer));
        CachingAllocator {
            config: AllocatorConfig { max_split_size, ..config },
            blocks: BTreeMap::new(),
            small: BlockPool::default(),
            large: BlockPool::default(),
            next_key: 0,
            next_serial: 0,
            next_addr: 0,
            allocated: 0,
            reserved: 0,
            counters: AllocatorStats::default(),
        }
    }

    /// The settings in use (`max_split_size` raised to [`kLargeBuffer`] if it was below).
    pub fn config(&self) -> AllocatorConfig {
        self.config
    }

    /// `malloc`: a block of at least `size` bytes, from the cache or a new segment.
    pub fn malloc(&mut self, size: u64) -> Result<BlockId, OutOfMemory> {
        if size == 0 {
            return Ok(BlockId { key: NULL_KEY, serial: 0 });
        }
        let rounded = round_size(size).filter(|_| size < ONE_EXA_BYTES);
        let alloc_size = rounded.and_then(get_allocation_size);
        let Some(rounded) = rounded else {
            return Err(self.out_of_memory(size, alloc_size));
        };
        let pool = Pool::of(rounded);
        let found = self.get_free_block(pool, rounded).or_else(|| self.alloc_with_retries(pool, rounded, alloc_size));
        let Some(block) = found else {
            self.counters.num_ooms = self.counters.num_ooms.saturating_add(1);
            return Err(self.out_of_memory(size, alloc_size));
        };
        Ok(self.alloc_found_block(block, rounded))
    }

    /// `free`: gives a block back to its pool, merged with its free neighbours. Freeing a
    /// block that is not allocated (twice, or a stale id) is a bug of the caller: it fails
    /// a debug assertion and is otherwise ignored.
    pub fn free(&mut self, block: BlockId) {
        if block.key == NULL_KEY {
            return;
        }
        let live = self.blocks.get(&block.key).is_some_and(|b| b.allocated && b.serial == block.serial);
        debug_assert!(live, "free of a block that is not allocated: {block:?}");
        if !live {
            return;
        }
        let b = self.block_mut(block.key);
        b.allocated = false;
        let size = b.size;
        self.allocated -= size;
        self.free_block(block.key);
    }

    /// Bytes of live blocks, each counted whole (`torch.cuda.memory_allocated()`).
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Bytes of segments, or of mapped pages (`torch.cuda.memory_reserved()`).
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// The current figures, peaks and counters.
    pub fn stats(&self) -> AllocatorStats {
        let head = |b: &Block| b.mapped && b.prev.is_none_or(|p| !self.block(p).mapped);
        let segments = self.blocks.values().filter(|b| head(b)).count();
        let largest = |p: &BlockPool| p.blocks.keys().next_back().map_or(0, |&(size, _)| size);
        let peak = self.counters.peak_reserved;
        let fragmentation = match peak {
            0 => 0.0,
            _ => 1.0 - self.counters.allocated_at_peak_reserved as f64 / peak as f64,
        };
        AllocatorStats {
            allocated: self.allocated,
            reserved: self.reserved,
            fragmentation_at_peak: fragmentation,
            segments,
            largest_free_block: largest(&self.small).max(largest(&self.large)),
            ..self.counters
        }
    }

    fn out_of_memory(&self, requested: u64, alloc_size: Option<u64>) -> OutOfMemory {
        OutOfMemory {
            requested,
            alloc_size: alloc_size.unwrap_or(u64::MAX),
            allocated: self.allocated,
            reserved: self.reserved,
            capacity: self.config.capacity,
        }
    }

    fn expandable(&self) -> bool {
        self.config.mode == AllocatorMode::ExpandableSegments
    }

    fn block(&self, key: u64) -> &Block {
        &self.blocks[&key]
    }

    fn block_mut(&mut self, key: u64) -> &mut Block {
        self.blocks.get_mut(&key).expect("the allocator's blocks link to live blocks")
    }

    fn pool(&self, pool: Pool) -> &BlockPool {
        match pool {
            Pool::Small => &self.small,
            Pool::Large => &self.large,
        }
    }

    fn pool_mut(&mut self, pool: Pool) -> &mut BlockPool {
        match pool {
            Pool::Small => &mut self.small,
            Pool::Large => &mut self.large,
        }
    }

    fn new_block(&mut self, block: Block) -> u64 {
        let key = self.next_key;
        self.next_key = key.wrapping_add(1);
        self.blocks.insert(key, block);
        key
    }

    /// Links `key` between `prev` and `next` (`Block::splice`).
    fn splice(&mut self, prev: Option<u64>, key: u64, next: Option<u64>) {
        let b = self.block_mut(key);
        b.prev = prev;
        b.next = next;
        if let Some(p) = prev {
            self.block_mut(p).next = Some(key);
        }
        if let Some(n) = next {
            self.block_mut(n).prev = Some(key);
        }
    }

    /// Puts a free block in its pool's set (`insert_into_blocks`, or `unmapped`).
    fn insert_free(&mut self, key: u64) {
        let b = self.block(key);
        let (pool, size, addr, mapped) = (b.pool, b.size, b.addr, b.mapped);
        let p = self.pool_mut(pool);
        if mapped {
            p.blocks.insert((size, addr), key);
        } else {
            p.unmapped.insert(addr, key);
        }
    }

    /// Takes a free block out of its pool's set.
    fn remove_free(&mut self, key: u64) {
        let b = self.block(key);
        let (pool, size, addr, mapped) = (b.pool, b.size, b.addr, b.mapped);
        let p = self.pool_mut(pool);
        if mapped {
            p.blocks.remove(&(size, addr));
        } else {
            p.unmapped.remove(&addr);
        }
    }

    /// Whether the device can take `bytes` more (`cudaMalloc` / `cuMemCreate` succeeding).
    fn device_has_room(&self, bytes: u64) -> bool {
        let total = self.reserved.checked_add(bytes);
        total.is_some_and(|t| self.config.capacity.is_none_or(|c| t <= c))
    }

    fn grow_reserved(&mut self, bytes: u64) {
        self.reserved = self.reserved.saturating_add(bytes);
        self.counters.num_device_alloc = self.counters.num_device_alloc.saturating_add(1);
        if self.reserved > self.counters.peak_reserved {
            self.counters.peak_reserved = self.reserved;
            self.counters.allocated_at_peak_reserved = self.allocated;
        }
    }

    fn shrink_reserved(&mut self, bytes: u64) {
        self.reserved -= bytes;
        self.counters.num_device_free = self.counters.num_device_free.saturating_add(1);
    }

    /// `get_free_block`: best fit in the pool, with the `max_split_size` refusals.
    fn get_free_block(&mut self, pool: Pool, size: u64) -> Option<u64> {
        let mut fits = self.pool(pool).blocks.range((size, 0)..).map(|(_, &key)| key);
        let mut best = fits.next()?;
        if self.expandable() {
            // A block followed by unmapped space counts as large as it could grow.
            for next in fits {
                if self.expandable_size(next) >= self.expandable_size(best) {
                    break;
                }
                best = next;
            }
        }
        let found = self.block(best).size;
        if let Some(max_split_size) = self.config.max_split_size {
            // Do not return an oversized block for a large request.
            if size < max_split_size && found >= max_split_size {
                return None;
            }
            // Allow oversized block size to be rounded up but within a limit.
            if size >= max_split_size && found >= size.saturating_add(kLargeBuffer) {
                return None;
            }
        }
        self.remove_free(best);
        Some(best)
    }

    /// `expandable_size` in `get_free_block`: the block's size plus the unmapped space after it.
    fn expandable_size(&self, key: u64) -> u64 {
        let b = self.block(key);
        let after = b.next.map(|n| self.block(n)).filter(|n| !n.mapped).map_or(0, |n| n.size);
        b.size.saturating_add(after)
    }

    /// `should_split`.
    fn should_split(&self, key: u64, size: u64) -> bool {
        let b = self.block(key);
        let remaining = b.size.saturating_sub(size);
        if b.pool == Pool::Small || self.expandable() {
            remaining >= kMinBlockSize
        } else {
            self.config.max_split_size.is_none_or(|m| size < m) && remaining > kSmallSize
        }
    }

    /// `alloc_found_block`: splits off the remainder if `should_split`, marks the block
    /// allocated and counts its whole size.
    fn alloc_found_block(&mut self, key: u64, size: u64) -> BlockId {
        let key = if self.should_split(key, size) { self.split(key, size) } else { key };
        let serial = self.next_serial;
        self.next_serial = serial.wrapping_add(1);
        let b = self.block_mut(key);
        b.allocated = true;
        b.serial = serial;
        let bytes = b.size;
        self.allocated = self.allocated.saturating_add(bytes);
        let c = &mut self.counters;
        c.peak_allocated = c.peak_allocated.max(self.allocated);
        if self.reserved == c.peak_reserved {
            c.allocated_at_peak_reserved = c.allocated_at_peak_reserved.max(self.allocated);
        }
        BlockId { key, serial }
    }

    /// The split of `alloc_found_block`: a new block of `size` at the start of `key`, whose
    /// remainder goes back to the pool. Returns the new block.
    fn split(&mut self, key: u64, size: u64) -> u64 {
        let rest = self.block(key).clone();
        let front = self.new_block(Block::free(rest.addr, size, rest.pool, true));
        self.splice(rest.prev, front, Some(key));
        let r = self.block_mut(key);
        r.addr += size;
        r.size -= size;
        self.insert_free(key);
        front
    }

    /// `free_block`: merges with free neighbours and returns the block to its pool.
    fn free_block(&mut self, key: u64) {
        let (prev, next) = (self.block(key).prev, self.block(key).next);
        self.try_merge_blocks(key, prev);
        self.try_merge_blocks(key, next);
        self.insert_free(key);
    }

    /// `try_merge_blocks`: `dst` (out of any pool) absorbs its neighbour `src` if `src` is
    /// free and mapped alike.
    fn try_merge_blocks(&mut self, dst: u64, src: Option<u64>) {
        let Some(src) = src else { return };
        let s = self.block(src).clone();
        if s.allocated || s.mapped != self.block(dst).mapped {
            return;
        }
        self.remove_free(src);
        self.blocks.remove(&src);
        let d = self.block(dst).clone();
        let (prev, next) = if d.prev == Some(src) { (s.prev, d.next) } else { (d.prev, s.next) };
        let m = self.block_mut(dst);
        m.addr = m.addr.min(s.addr);
        m.size += s.size;
        self.splice(prev, dst, next);
    }

    /// The block-finding part of `malloc` when the cache has none: `alloc_block`, then
    /// `release_available_cached_blocks` and `alloc_block`, then `release_cached_blocks`
    /// and `alloc_block` again.
    fn alloc_with_retries(&mut self, pool: Pool, size: u64, alloc_size: Option<u64>) -> Option<u64> {
        if let Some(key) = self.alloc_block(pool, size, alloc_size) {
            return Some(key);
        }
        if self.release_available_cached_blocks(pool, size) {
            if let Some(key) = self.alloc_block(pool, size, alloc_size) {
                return Some(key);
            }
        }
        self.release_cached_blocks();
        self.counters.num_alloc_retries = self.counters.num_alloc_retries.saturating_add(1);
        self.alloc_block(pool, size, alloc_size)
    }

    /// `alloc_block`: a new segment of `alloc_size`, or pages of the expandable segment.
    fn alloc_block(&mut self, pool: Pool, size: u64, alloc_size: Option<u64>) -> Option<u64> {
        if self.expandable() {
            return self.try_allocate_expandable_block(pool, size);
        }
        let bytes = alloc_size?;
        if !self.device_has_room(bytes) {
            return None;
        }
        let addr = self.next_addr;
        self.next_addr = addr.checked_add(bytes)?;
        self.grow_reserved(bytes);
        Some(self.new_block(Block::free(addr, bytes, pool, true)))
    }

    /// `release_available_cached_blocks`: with a `max_split_size`, frees the smallest
    /// cached oversize block that covers the request, or else oversize blocks from the
    /// largest down until as much is freed. True if enough was freed.
    fn release_available_cached_blocks(&mut self, pool: Pool, size: u64) -> bool {
        let Some(max_split_size) = self.config.max_split_size.filter(|_| !self.expandable()) else {
            return false;
        };
        let target = size.max(max_split_size);
        let covering = self.pool(pool).blocks.range((target, 0)..).next().map(|(_, &key)| key);
        if let Some(key) = covering {
            self.release_block(key);
            return true;
        }
        let oversize: Vec<(u64, u64)> = self
            .pool(pool)
            .blocks
            .iter()
            .rev()
            .take_while(|((s, _), _)| *s >= max_split_size)
            .map(|((s, _), &k)| (*s, k))
            .collect();
        let mut released = 0u64;
        for (bytes, key) in oversize {
            if released >= target {
                break;
            }
            released = released.saturating_add(bytes);
            self.release_block(key);
        }
        released >= target
    }

    /// `release_cached_blocks`: frees every wholly free segment of both pools, or unmaps
    /// the free pages of the expandable segments.
    fn release_cached_blocks(&mut self) {
        self.release_blocks(Pool::Large);
        self.release_blocks(Pool::Small);
    }

    /// `release_blocks`.
    fn release_blocks(&mut self, pool: Pool) {
        let free: Vec<u64> = self.pool(pool).blocks.values().copied().collect();
        for key in free {
            if self.expandable() {
                self.unmap_block(key);
                let b = self.block(key);
                if !b.mapped && b.prev.is_none() && b.next.is_none() {
                    self.release_expandable_segment(key);
                }
            } else if self.block(key).prev.is_none() && self.block(key).next.is_none() {
                self.release_block(key);
            }
        }
    }

    /// `release_block`: gives a wholly free segment back to the device (`cudaFree`).
    fn release_block(&mut self, key: u64) {
        let b = self.block(key);
        let whole = b.prev.is_none() && b.next.is_none();
        debug_assert!(whole, "only whole segments are released");
        if !whole {
            return;
        }
        let size = b.size;
        self.remove_free(key);
        self.blocks.remove(&key);
        self.shrink_reserved(size);
    }

    /// `release_expandable_segment`: drops a wholly unmapped expandable segment.
    fn release_expandable_segment(&mut self, key: u64) {
        let pool = self.block(key).pool;
        self.remove_free(key);
        self.blocks.remove(&key);
        self.pool_mut(pool).expandable = false;
    }

    /// `find_expandable_block`: the lowest-addressed unmapped block (or the free block
    /// before it) from which free and unmapped blocks add up to `size`; creates the pool's
    /// segment, wholly unmapped, if it has none.
    fn find_expandable_block(&mut self, pool: Pool, size: u64) -> Option<u64> {
        let unmapped: Vec<u64> = self.pool(pool).unmapped.values().copied().collect();
        for mut candidate in unmapped {
            if let Some(prev) = self.block(candidate).prev.filter(|&p| !self.block(p).allocated) {
                candidate = prev;
            }
            if self.has_available_address_space(candidate, size) {
                return Some(candidate);
            }
        }
        if self.pool(pool).expandable {
            return None;
        }
        let span = EXPANDABLE_SPAN / pool.page_size() * pool.page_size();
        let key = self.new_block(Block::free(0, span, pool, false));
        self.insert_free(key);
        self.pool_mut(pool).expandable = true;
        Some(key)
    }

    /// `has_available_address_space` in `find_expandable_block`.
    fn has_available_address_space(&self, key: u64, size: u64) -> bool {
        let (mut bytes, mut at) = (0u64, Some(key));
        while let Some(k) = at.filter(|_| bytes < size) {
            let b = self.block(k);
            if b.allocated {
                break;
            }
            bytes = bytes.saturating_add(b.size);
            at = b.next;
        }
        bytes >= size
    }

    /// `try_allocate_expandable_block`: maps pages from the candidate on until a free
    /// block of `size` is formed, and takes it out of the pool.
    fn try_allocate_expandable_block(&mut self, pool: Pool, size: u64) -> Option<u64> {
        let mut candidate = self.find_expandable_block(pool, size)?;
        if !self.block(candidate).mapped {
            let bytes = self.block(candidate).size.min(size);
            if !self.map_block(candidate, bytes) {
                return None;
            }
        }
        while self.block(candidate).size < size {
            let remaining = size - self.block(candidate).size;
            let next = self.block(candidate).next.filter(|&n| !self.block(n).mapped)?;
            if !self.map_block(next, remaining.min(self.block(next).size)) {
                return None;
            }
            candidate = next;
        }
        self.remove_free(candidate);
        Some(candidate)
    }

    /// `map_block`: maps the pages covering the first `size` bytes of an unmapped block
    /// (all or none, as `ExpandableSegment::map`), leaving the rest unmapped, and merges the
    /// mapped part with free neighbours.
    fn map_block(&mut self, key: u64, size: u64) -> bool {
        let b = self.block(key).clone();
        let page = b.pool.page_size();
        let bytes = size.div_ceil(page).saturating_mul(page).min(b.size);
        if !self.device_has_room(bytes) {
            return false;
        }
        self.remove_free(key);
        if bytes < b.size {
            let rest = self.new_block(Block::free(b.addr + bytes, b.size - bytes, b.pool, false));
            self.splice(Some(key), rest, b.next);
            self.insert_free(rest);
        }
        let m = self.block_mut(key);
        m.mapped = true;
        m.size = bytes;
        let (prev, next) = (m.prev, m.next);
        self.try_merge_blocks(key, prev);
        self.try_merge_blocks(key, next);
        self.insert_free(key);
        self.grow_reserved(bytes);
        true
    }

    /// `unmap_block`: unmaps the whole pages inside a free block; what is left of the block
    /// on either side stays mapped and free.
    fn unmap_block(&mut self, key: u64) {
        let b = self.block(key).clone();
        let page = b.pool.page_size();
        let end_addr = b.addr + b.size;
        let (begin, end) = (b.addr.div_ceil(page) * page, end_addr / page * page);
        if begin >= end {
            return;
        }
        self.remove_free(key);
        if begin > b.addr {
            let before = self.new_block(Block::free(b.addr, begin - b.addr, b.pool, true));
            self.splice(b.prev, before, Some(key));
            self.insert_free(before);
        }
        if end < end_addr {
            let after = self.new_block(Block::free(end, end_addr - end, b.pool, true));
            let next = self.block(key).next;
            self.splice(Some(key), after, next);
            self.insert_free(after);
        }
        let m = self.block_mut(key);
        (m.addr, m.size, m.mapped) = (begin, end - begin, false);
        let (prev, next) = (m.prev, m.next);
        self.try_merge_blocks(key, prev);
        self.try_merge_blocks(key, next);
        self.insert_free(key);
        self.shrink_reserved(end - begin);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn allocator(mode: AllocatorMode, capacity: Option<u64>, max_split_size: Option<u64>) -> CachingAllocator {
        CachingAllocator::new(AllocatorConfig { mode, capacity, max_split_size })
    }

    fn caching() -> CachingAllocator {
        allocator(AllocatorMode::Caching, None, None)
    }

    fn expandable() -> CachingAllocator {
        allocator(AllocatorMode::ExpandableSegments, None, None)
    }

    /// Asserts (allocated, reserved).
    #[track_caller]
    fn assert_mem(a: &CachingAllocator, allocated: u64, reserved: u64) {
        assert_eq!((a.allocated(), a.reserved()), (allocated, reserved), "(allocated, reserved)");
        check_invariants(a);
    }

    #[test]
    fn round_size_and_allocation_size_follow_the_constants() {
        assert_eq!(round_size(0), Some(512)); // below kMinBlockSize: kMinBlockSize
        assert_eq!(round_size(1), Some(512));
        assert_eq!(round_size(512), Some(512)); // already a multiple
        assert_eq!(round_size(513), Some(1024)); // next multiple of 512
        assert_eq!(round_size(u64::MAX), None); // the next multiple of 512 overflows
        assert_eq!(get_allocation_size(MIB), Some(2 * MIB)); // <= kSmallSize: kSmallBuffer
        assert_eq!(get_allocation_size(MIB + 512), Some(20 * MIB)); // < kMinLargeAlloc: kLargeBuffer
        assert_eq!(get_allocation_size(10 * MIB - 512), Some(20 * MIB));
        assert_eq!(get_allocation_size(10 * MIB), Some(10 * MIB)); // >= 10 MiB: rounded to 2 MiB
        assert_eq!(get_allocation_size(10 * MIB + 512), Some(12 * MIB));
        assert_eq!(get_allocation_size(u64::MAX - 511), None); // rounding to 2 MiB overflows
    }

    #[test]
    fn small_requests_share_a_2_mib_segment() {
        let mut a = caching();
        a.malloc(1).unwrap();
        assert_mem(&a, 512, 2 * MIB); // rounded to 512; small pool: a 2 MiB segment, split
        a.malloc(1000).unwrap();
        assert_mem(&a, 1536, 2 * MIB); // 1000 -> 1024, split from the same segment's remainder
        a.malloc(MIB).unwrap();
        assert_mem(&a, MIB + 1536, 2 * MIB); // 1 MiB is still small; the remainder 2 MiB - 1536 fits it
        a.malloc(MIB).unwrap();
        assert_mem(&a, 2 * MIB + 1536, 4 * MIB); // remainder 1 MiB - 1536 < 1 MiB: a second 2 MiB segment
        assert_eq!(a.stats().segments, 2);
        assert_eq!(a.stats().largest_free_block, MIB); // the second segment's remainder
    }

    #[test]
    fn large_requests_get_20_mib_or_their_own_segment() {
        let mut a = caching();
        a.malloc(MIB + 1).unwrap();
        assert_mem(&a, MIB + 512, 20 * MIB); // 1 MiB + 512 > kSmallSize, < 10 MiB: a 20 MiB segment, split
        a.malloc(12 * MIB).unwrap();
        assert_mem(&a, 13 * MIB + 512, 20 * MIB); // fits the remainder 19 MiB - 512, split again
        a.malloc(12 * MIB).unwrap();
        assert_mem(&a, 25 * MIB + 512, 32 * MIB); // remainder 7 MiB - 512 too small; >= 10 MiB: own 12 MiB segment
        a.malloc(13 * MIB + 1).unwrap();
        // 13 MiB + 512 -> a 14 MiB segment; remainder 1 MiB - 512 <= kSmallSize: allocated whole
        assert_mem(&a, 39 * MIB + 512, 46 * MIB);
        a.malloc(3 * MIB).unwrap();
        assert_mem(&a, 42 * MIB + 512, 46 * MIB); // best fit: the 7 MiB - 512 remainder, split
        a.malloc(4 * MIB - 512).unwrap();
        assert_mem(&a, 46 * MIB, 46 * MIB); // the 4 MiB - 512 left fits exactly
        assert_eq!(a.stats().segments, 3); // 20 + 12 + 14 MiB
        assert_eq!(a.stats().largest_free_block, 0);
    }

    #[test]
    fn the_large_pool_does_not_split_off_1_mib_or_less() {
        let mut a = caching();
        a.malloc(9 * MIB).unwrap();
        assert_mem(&a, 9 * MIB, 20 * MIB); // 20 MiB segment; remainder 11 MiB > 1 MiB: split
        let b = a.malloc(10 * MIB).unwrap();
        assert_mem(&a, 20 * MIB, 20 * MIB); // fits the 11 MiB; remainder 1 MiB is not > 1 MiB: all 11 MiB allocated
        a.free(b);
        assert_mem(&a, 9 * MIB, 20 * MIB); // its 11 MiB come back

        let mut a = caching();
        a.malloc(19 * MIB).unwrap();
        assert_mem(&a, 20 * MIB, 20 * MIB); // >= 10 MiB: 19 MiB rounded to 20; remainder 1 MiB: not split

        let mut a = caching();
        a.malloc(MIB).unwrap();
        a.malloc(MIB - 512).unwrap();
        assert_mem(&a, 2 * MIB - 512, 2 * MIB); // small pool: remainder 512 >= kMinBlockSize is split off
        a.malloc(1).unwrap();
        assert_mem(&a, 2 * MIB, 2 * MIB); // and serves a 1-byte request
    }

    #[test]
    fn freed_neighbours_merge() {
        let mut a = caching();
        let x = a.malloc(4 * MIB).unwrap();
        let y = a.malloc(6 * MIB).unwrap();
        assert_mem(&a, 10 * MIB, 20 * MIB); // one 20 MiB segment: [0,4) [4,10), 10 MiB free
        let z = a.malloc(8 * MIB).unwrap();
        assert_mem(&a, 18 * MIB, 20 * MIB); // [10,18); remainder 2 MiB > 1 MiB: split
        a.free(x);
        assert_mem(&a, 14 * MIB, 20 * MIB);
        a.free(y);
        assert_mem(&a, 8 * MIB, 20 * MIB);
        assert_eq!(a.stats().largest_free_block, 10 * MIB); // [0,4) and [4,10) merged
        let w = a.malloc(10 * MIB).unwrap();
        assert_mem(&a, 18 * MIB, 20 * MIB); // the merged 10 MiB serves it: no new segment
        a.free(w);
        a.free(z);
        assert_mem(&a, 0, 20 * MIB);
        assert_eq!(a.stats().largest_free_block, 20 * MIB); // the whole segment is one block again
        assert_eq!(a.stats().segments, 1);
    }

    #[test]
    fn holes_that_cannot_serve_a_larger_request_reserve_a_new_segment() {
        let mut a = caching();
        let first: Vec<BlockId> = (0..3).map(|_| a.malloc(12 * MIB).unwrap()).collect();
        assert_mem(&a, 36 * MIB, 36 * MIB); // three own 12 MiB segments
        first.into_iter().for_each(|b| a.free(b));
        assert_mem(&a, 0, 36 * MIB); // cached, not given back
        a.malloc(14 * MIB).unwrap();
        assert_mem(&a, 14 * MIB, 50 * MIB); // 0 + 14 < 36 MiB reserved, but no 12 MiB hole fits 14
        a.malloc(14 * MIB).unwrap();
        a.malloc(14 * MIB).unwrap();
        assert_mem(&a, 42 * MIB, 78 * MIB); // 36 + 3 x 14
        let s = a.stats();
        assert_eq!((s.peak_allocated, s.peak_reserved, s.allocated_at_peak_reserved), (42 * MIB, 78 * MIB, 42 * MIB));
        assert!((s.fragmentation_at_peak - 36.0 / 78.0).abs() < 1e-12); // 1 - 42/78
        assert_eq!(s.segments, 6);
    }

    #[test]
    fn expandable_segments_tile_the_same_pattern() {
        let mut a = expandable();
        let first: Vec<BlockId> = (0..3).map(|_| a.malloc(12 * MIB).unwrap()).collect();
        // [0,12) in page 1; [12,24) maps page 2 (free [12,20) grows to [12,40)); [24,36) fits [24,40)
        assert_mem(&a, 36 * MIB, 40 * MIB);
        first.into_iter().for_each(|b| a.free(b));
        assert_mem(&a, 0, 40 * MIB); // all merged into one free 40 MiB block, still mapped
        a.malloc(14 * MIB).unwrap();
        assert_mem(&a, 14 * MIB, 40 * MIB); // [0,14) from the merged block
        a.malloc(14 * MIB).unwrap();
        assert_mem(&a, 28 * MIB, 40 * MIB); // [14,28)
        a.malloc(14 * MIB).unwrap();
        assert_mem(&a, 42 * MIB, 60 * MIB); // [28,42): the free [28,40) grows by one 20 MiB page
        let s = a.stats();
        assert_eq!((s.peak_reserved, s.allocated_at_peak_reserved, s.segments), (60 * MIB, 42 * MIB, 1));
        assert!((s.fragmentation_at_peak - 18.0 / 60.0).abs() < 1e-12); // 1 - 42/60
    }

    #[test]
    fn expandable_best_fit_prefers_a_block_that_cannot_grow() {
        let mut a = expandable();
        let x1 = a.malloc(16 * MIB).unwrap();
        assert_mem(&a, 16 * MIB, 20 * MIB); // [0,16) in the first 20 MiB page
        a.malloc(2 * MIB).unwrap();
        assert_mem(&a, 18 * MIB, 20 * MIB); // > 1 MiB: large pool, [16,18)
        a.malloc(4 * MIB).unwrap();
        assert_mem(&a, 22 * MIB, 40 * MIB); // free [18,20) grows by a page: [18,22)
        a.malloc(4 * MIB).unwrap();
        assert_mem(&a, 26 * MIB, 40 * MIB); // [22,26); free tail [26,40) = 14 MiB
        a.free(x1);
        assert_mem(&a, 10 * MIB, 40 * MIB); // free [0,16), next to an allocated block
        a.malloc(12 * MIB).unwrap();
        // the 14 MiB tail could grow without bound, so the 16 MiB block [0,16) serves it
        assert_mem(&a, 22 * MIB, 40 * MIB);
        a.malloc(16 * MIB).unwrap();
        // free: [12,16) and the 14 MiB tail; the tail grows by a page (plain best fit: 40)
        assert_mem(&a, 38 * MIB, 60 * MIB);
    }

    #[test]
    fn capacity_frees_cached_segments_before_failing() {
        let mut a = allocator(AllocatorMode::Caching, Some(64 * MIB), None);
        let first: Vec<BlockId> = (0..3).map(|_| a.malloc(12 * MIB).unwrap()).collect();
        first.into_iter().for_each(|b| a.free(b));
        assert_mem(&a, 0, 36 * MIB); // three cached 12 MiB segments
        a.malloc(14 * MIB).unwrap();
        assert_mem(&a, 14 * MIB, 50 * MIB); // 36 + 14 <= 64
        a.malloc(14 * MIB).unwrap();
        assert_mem(&a, 28 * MIB, 64 * MIB); // 50 + 14 = 64 <= 64
        a.malloc(14 * MIB).unwrap();
        // 64 + 14 > 64: the three unused 12 MiB segments are freed, then 28 + 14
        assert_mem(&a, 42 * MIB, 42 * MIB);
        let s = a.stats();
        assert_eq!((s.num_device_free, s.num_alloc_retries, s.num_ooms, s.segments), (3, 1, 0, 3));
        assert_eq!(s.peak_reserved, 64 * MIB);
    }

    #[test]
    fn out_of_memory_when_no_segment_is_wholly_free() {
        let mut a = allocator(AllocatorMode::Caching, Some(40 * MIB), None);
        let b: Vec<BlockId> = (0..4).map(|_| a.malloc(9 * MIB).unwrap()).collect();
        // two 20 MiB segments, each [9][9] and a 2 MiB remainder (2 MiB > 1 MiB: split)
        assert_mem(&a, 36 * MIB, 40 * MIB);
        a.free(b[0]);
        a.free(b[2]);
        assert_mem(&a, 18 * MIB, 40 * MIB);
        let err = a.malloc(12 * MIB).unwrap_err();
        // holes of 9, 9, 2, 2 MiB; a 12 MiB segment would make 52 > 40; nothing wholly free
        let expected = OutOfMemory {
            requested: 12 * MIB,
            alloc_size: 12 * MIB,
            allocated: 18 * MIB,
            reserved: 40 * MIB,
            capacity: Some(40 * MIB),
        };
        assert_eq!(err, expected);
        assert_eq!(
            err.to_string(),
            "CUDA out of memory. Tried to allocate 12.00 MiB (request of 12.00 MiB); \
             18.00 MiB allocated, 40.00 MiB reserved, capacity 40.00 MiB"
        );
        assert_mem(&a, 18 * MIB, 40 * MIB); // nothing changed
        assert_eq!((a.stats().num_ooms, a.stats().num_alloc_retries), (1, 1));
        a.free(b[1]);
        assert_mem(&a, 9 * MIB, 40 * MIB); // the first segment is wholly free again: 20 MiB
        a.malloc(12 * MIB).unwrap();
        assert_mem(&a, 21 * MIB, 40 * MIB); // served from it, remainder 8 MiB split off
    }

    #[test]
    fn max_split_size_keeps_oversize_blocks_for_large_requests() {
        let mss = Some(32 * MIB);
        let mut a = allocator(AllocatorMode::Caching, None, mss);
        let x = a.malloc(40 * MIB).unwrap();
        a.free(x);
        assert_mem(&a, 0, 40 * MIB);
        let y = a.malloc(24 * MIB).unwrap();
        assert_mem(&a, 24 * MIB, 64 * MIB); // 24 < 32 may not take the cached 40 >= 32: new 24 MiB segment
        let z = a.malloc(34 * MIB).unwrap();
        assert_mem(&a, 64 * MIB, 64 * MIB); // 34 >= 32 takes the 40 (< 34 + 20), unsplit: counts 40
        a.free(z);
        a.free(y);
        a.malloc(28 * MIB).unwrap();
        // the best fit, the 40 MiB block, is oversize for 28 < 32: the search stops there (the 24 is too small)
        assert_mem(&a, 28 * MIB, 92 * MIB);

        let mut a = allocator(AllocatorMode::Caching, None, mss);
        let x = a.malloc(60 * MIB).unwrap();
        a.free(x);
        a.malloc(36 * MIB).unwrap();
        assert_mem(&a, 36 * MIB, 96 * MIB); // 60 >= 36 + 20: too large to round up to; a new segment
        a.malloc(42 * MIB).unwrap();
        assert_mem(&a, 96 * MIB, 96 * MIB); // 60 < 42 + 20: taken whole
        assert_eq!(a.config().max_split_size, mss);
        let low = allocator(AllocatorMode::Caching, None, Some(MIB));
        assert_eq!(low.config().max_split_size, Some(20 * MIB)); // raised to kLargeBuffer
    }

    #[test]
    fn max_split_size_frees_oversize_blocks_first() {
        let mut a = allocator(AllocatorMode::Caching, Some(100 * MIB), Some(32 * MIB));
        let x = a.malloc(40 * MIB).unwrap();
        let y = a.malloc(50 * MIB).unwrap();
        a.free(x);
        a.free(y);
        assert_mem(&a, 0, 90 * MIB);
        a.malloc(24 * MIB).unwrap();
        // oversize blocks refused; 90 + 24 > 100: the smallest cached block >= max(24, 32) = 32,
        // the 40 MiB one, is freed, and 50 + 24 fits; the 50 MiB segment stays cached
        assert_mem(&a, 24 * MIB, 74 * MIB);
        assert_eq!((a.stats().num_alloc_retries, a.stats().largest_free_block), (0, 50 * MIB));
        a.malloc(60 * MIB).unwrap();
        // 74 + 60 > 100; no cached block >= 60: the oversize 50 is freed (50 < 60, not enough),
        // then release_cached_blocks (nothing left) and 24 + 60 = 84 fits
        assert_mem(&a, 84 * MIB, 84 * MIB);
        assert_eq!((a.stats().num_device_free, a.stats().num_alloc_retries), (2, 1));
    }

    #[test]
    fn expandable_segments_unmap_free_pages_when_memory_runs_out() {
        for mode in [AllocatorMode::Caching, AllocatorMode::ExpandableSegments] {
            let mut a = allocator(mode, Some(60 * MIB), None);
            let c: Vec<BlockId> = (0..3).map(|_| a.malloc(14 * MIB).unwrap()).collect();
            a.free(c[0]);
            a.free(c[1]);
            a.malloc(30 * MIB).unwrap();
            match mode {
                // segments of 14 MiB; 42 + 30 > 60: the two free ones go, 14 + 30 fits
                AllocatorMode::Caching => assert_mem(&a, 44 * MIB, 44 * MIB),
                // [0,14) [14,28) [28,42) in pages [0,60); free [0,28) and [42,60); the tail
                // needs a fourth page: 80 > 60, so page [0,20) is unmapped and mapped at [60,80)
                AllocatorMode::ExpandableSegments => {
                    assert_mem(&a, 44 * MIB, 60 * MIB);
                    let s = a.stats();
                    assert_eq!((s.num_device_free, s.segments, s.largest_free_block), (1, 1, 8 * MIB));
                }
            }
        }
        let mut a = allocator(AllocatorMode::ExpandableSegments, Some(20 * MIB), None);
        a.malloc(12 * MIB).unwrap();
        let err = a.malloc(12 * MIB).unwrap_err();
        // [12,20) holds no whole page to unmap, and a second page would make 40 > 20
        assert_eq!(
            (err.requested, err.alloc_size, err.allocated, err.reserved),
            (12 * MIB, 12 * MIB, 12 * MIB, 20 * MIB)
        );
        assert_mem(&a, 12 * MIB, 20 * MIB);
    }

    #[test]
    fn absurd_sizes_fail_without_overflow() {
        for mode in [AllocatorMode::Caching, AllocatorMode::ExpandableSegments] {
            for capacity in [None, Some(u64::MAX), Some(64 * MIB)] {
                for mss in [None, Some(u64::MAX)] {
                    let mut a = allocator(mode, capacity, mss);
                    for size in [u64::MAX, u64::MAX - 511, u64::MAX / 2, 1 << 60] {
                        let err = a.malloc(size).unwrap_err(); // 1 EiB or more: refused at once
                        assert_eq!((err.requested, err.allocated, err.reserved), (size, 0, 0));
                    }
                    let zero = a.malloc(0).unwrap();
                    a.free(zero);
                    a.free(zero);
                    assert_mem(&a, 0, 0); // a 0-byte request takes nothing
                    for _ in 0..20 {
                        let _ = a.malloc((1 << 60) - 1); // may succeed or fail, never overflow
                        check_invariants(&a);
                    }
                }
            }
        }
    }

    #[test]
    #[cfg_attr(debug_assertions, should_panic(expected = "not allocated"))]
    fn a_double_free_is_ignored() {
        let mut a = caching();
        let x = a.malloc(1).unwrap();
        a.free(x);
        a.free(x);
        assert_mem(&a, 0, 2 * MIB);
    }

    #[test]
    #[cfg_attr(debug_assertions, should_panic(expected = "not allocated"))]
    fn a_stale_id_does_not_free_a_later_allocation() {
        let mut a = caching();
        let x = a.malloc(19 * MIB).unwrap();
        a.free(x);
        a.malloc(19 * MIB).unwrap(); // the same unsplit 20 MiB block again
        a.free(x);
        assert_mem(&a, 20 * MIB, 20 * MIB);
    }

    /// The segments (contiguous mapped runs of blocks), as (first address, size, pool).
    fn segments(a: &CachingAllocator) -> Vec<(u64, u64, Pool)> {
        let heads = a.blocks.iter().filter(|(_, b)| b.mapped && b.prev.is_none_or(|p| !a.block(p).mapped));
        let size_from = |mut at: Option<u64>| {
            let mut size = 0;
            while let Some(b) = at.map(|k| a.block(k)).filter(|b| b.mapped) {
                size += b.size;
                at = b.next;
            }
            size
        };
        heads.map(|(&k, b)| (b.addr, size_from(Some(k)), b.pool)).collect()
    }

    fn check_links(a: &CachingAllocator) {
        for (&k, b) in &a.blocks {
            if let Some(n) = b.next {
                let n = a.block(n);
                assert_eq!((n.prev, n.addr, n.pool), (Some(k), b.addr + b.size, b.pool));
                let both_free = !b.allocated && !n.allocated && b.mapped == n.mapped;
                assert!(!both_free, "adjacent free blocks left unmerged");
            }
            if let Some(p) = b.prev {
                assert_eq!(a.block(p).next, Some(k));
            }
            let p = a.pool(b.pool);
            let listed = if b.mapped { p.blocks.get(&(b.size, b.addr)) } else { p.unmapped.get(&b.addr) };
            assert_eq!(listed, (!b.allocated).then_some(&k), "pool membership of {b:?}");
        }
        let listed: usize = [&a.small, &a.large].iter().map(|p| p.blocks.len() + p.unmapped.len()).sum();
        assert_eq!(listed, a.blocks.values().filter(|b| !b.allocated).count());
    }

    /// The invariants the documented rules imply.
    fn check_invariants(a: &CachingAllocator) {
        check_links(a);
        let segs = segments(a);
        let sum: u64 = segs.iter().map(|s| s.1).sum();
        let live: u64 = a.blocks.values().filter(|b| b.allocated).map(|b| b.size).sum();
        assert_eq!((sum, live), (a.reserved, a.allocated), "reserved = sum of segments, allocated = live blocks");
        assert!(a.allocated <= a.reserved);
        assert!(a.config.capacity.is_none_or(|c| a.reserved <= c));
        let s = a.stats();
        assert!(s.peak_reserved >= s.reserved && s.peak_allocated >= s.allocated);
        assert!(s.allocated_at_peak_reserved <= s.peak_reserved && s.segments == segs.len());
        for (addr, size, pool) in segs {
            if a.expandable() {
                assert!(addr.is_multiple_of(pool.page_size()) && size.is_multiple_of(pool.page_size()));
            } else if pool == Pool::Small {
                assert_eq!(size, kSmallBuffer);
            } else {
                assert!(size == kLargeBuffer || size >= kMinLargeAlloc && size.is_multiple_of(kRoundLarge));
            }
        }
    }

    /// A 64-bit linear congruential generator (Knuth's MMIX constants).
    struct Lcg(u64);

    impl Lcg {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 33) % n
        }

        fn size(&mut self) -> u64 {
            let edges = [1, 512, 513, kSmallSize, kSmallSize + 1, kMinLargeAlloc, kLargeBuffer, kLargeBuffer + 1];
            match self.below(4) {
                0 => 1 + self.below(kSmallSize),
                1 => kSmallSize + self.below(kMinLargeAlloc),
                2 => 1 + self.below(64 * MIB),
                _ => edges[self.below(edges.len() as u64) as usize],
            }
        }
    }

    fn random_trace(config: AllocatorConfig, seed: u64) {
        let mut a = CachingAllocator::new(config);
        let mut rng = Lcg(seed);
        let mut live = Vec::new();
        let grows_only = config.mode == AllocatorMode::Caching && config.capacity.is_none();
        for _ in 0..300 {
            let before = a.reserved();
            if live.is_empty() || rng.below(5) < 3 {
                match a.malloc(rng.size()) {
                    Ok(b) => live.push(b),
                    Err(e) => {
                        assert!(config.capacity.is_some(), "out of memory without a capacity: {e}");
                        assert_eq!((e.allocated, e.reserved), (a.allocated(), a.reserved()));
                    }
                }
            } else {
                let i = rng.below(live.len() as u64) as usize;
                a.free(live.swap_remove(i));
            }
            check_invariants(&a);
            assert!(!grows_only || a.reserved() >= before, "reserved decreased without a capacity");
        }
        let reserved = a.reserved();
        live.into_iter().for_each(|b| a.free(b));
        assert_eq!(a.allocated(), 0);
        assert_eq!(a.reserved(), reserved, "frees never give memory back");
        assert!(a.blocks.values().all(|b| !b.allocated));
        if !a.expandable() {
            assert!(a.blocks.values().all(|b| b.prev.is_none() && b.next.is_none()), "segments merged whole");
        }
    }

    #[test]
    fn random_traces_keep_the_invariants() {
        for mode in [AllocatorMode::Caching, AllocatorMode::ExpandableSegments] {
            for capacity in [None, Some(200 * MIB)] {
                for max_split_size in [None, Some(40 * MIB)] {
                    for seed in 0..4 {
                        random_trace(AllocatorConfig { mode, capacity, max_split_size }, seed);
                    }
                }
            }
        }
    }
}
