//! A model of PyTorch 2.11's CUDA caching allocator
//! (`c10/cuda/CUDACachingAllocator.cpp`, native backend, one stream),
//! replaying a sequence of allocations and frees to give what
//! `torch.cuda.max_memory_allocated()` and `max_memory_reserved()` report.
//! This file models the default segments, with or without
//! `max_split_size_mb`; `expandable.rs` models `expandable_segments:True`;
//! [`Allocator`] is either, as [`AllocatorSettings`] say.
//!
//! The rules it reproduces:
//! - requests are rounded up to a multiple of 512 bytes (512 at least);
//! - requests of at most 1 MiB use the small pool, larger ones the large pool;
//! - a request is served by the smallest cached free block of its pool that
//!   fits (ties: lowest address);
//! - on a miss a new segment is reserved: 2 MiB for small requests, 20 MiB
//!   for requests under 10 MiB, else the request rounded up to 2 MiB;
//! - a block larger than the request is split when the remainder is at least
//!   512 bytes (small pool) or more than 1 MiB (large pool); otherwise the
//!   whole block is handed out and counts as allocated;
//! - a freed block merges with free neighbours of its segment;
//! - when reserving would exceed the device's capacity, cached blocks that are
//!   whole segments are released and the reservation retried (with
//!   `max_split_size_mb`, first the smallest oversize one big enough, or the
//!   largest oversize ones until enough: `release_available_cached_blocks`;
//!   then all of them: `release_cached_blocks`); then it is an out-of-memory
//!   error;
//! - with `max_split_size_mb` (`get_free_block`, `should_split`): blocks of
//!   at least that size are never split; a request below it never takes
//!   one, and a request at or above it takes a cached block only when it is
//!   less than 20 MiB larger.

use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, BTreeSet};

pub const MIN_BLOCK_SIZE: u64 = 512;
pub const SMALL_SIZE: u64 = 1 << 20;
pub const SMALL_BUFFER: u64 = 2 << 20;
pub const LARGE_BUFFER: u64 = 20 << 20;
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
pub const ROUND_LARGE: u64 = 2 << 20;

/// `round_size`.
pub fn round_size(size: u64) -> u64 {
    if size < MIN_BLOCK_SIZE {
        MIN_BLOCK_SIZE
    } else {
        MIN_BLOCK_SIZE * size.div_ceil(MIN_BLOCK_SIZE)
    }
}

/// `get_allocation_size`: the segment reserved for a request of `size`.
pub fn allocation_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        ROUND_LARGE * size.div_ceil(ROUND_LARGE)
    }
}

/// The small (at most 1 MiB) and the large requests' pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Pool {
    Small,
    Large,
}

impl Pool {
    pub(super) fn of(rounded: u64) -> Pool {
        if rounded <= SMALL_SIZE {
            Pool::Small
        } else {
            Pool::Large
        }
    }
}

/// One `T` per pool.
#[derive(Debug, Default)]
pub(super) struct PerPool<T>([T; 2]);

impl<T> PerPool<T> {
    pub(super) fn iter(&self) -> impl Iterator<Item = (Pool, &T)> {
        [Pool::Small, Pool::Large].into_iter().zip(self.0.iter())
    }
}

impl<T> std::ops::Index<Pool> for PerPool<T> {
    type Output = T;
    fn index(&self, pool: Pool) -> &T {
        &self.0[pool as usize]
    }
}

impl<T> std::ops::IndexMut<Pool> for PerPool<T> {
    fn index_mut(&mut self, pool: Pool) -> &mut T {
        &mut self.0[pool as usize]
    }
}

#[derive(Debug, Clone, Copy)]
struct Block {
    size: u64,
    segment: u64,
    allocated: bool,
    pool: Pool,
}

/// The allocator's counters, as `torch.cuda.memory_stats()` names them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    pub allocated: u64,
    pub allocated_peak: u64,
    pub reserved: u64,
    pub reserved_peak: u64,
    pub requested: u64,
    pub requested_peak: u64,
    pub segments: u64,
    pub num_alloc_retries: u64,
}

impl Stats {
    /// The peaks set to the current values (`reset_peak_memory_stats`).
    pub fn reset_peaks(&mut self) {
        self.allocated_peak = self.allocated;
        self.reserved_peak = self.reserved;
        self.requested_peak = self.requested;
    }

    /// Counts a block of `granted` bytes handed out for a request of
    /// `requested` bytes.
    pub fn add_allocation(&mut self, granted: u64, requested: u64) {
        self.allocated += granted;
        self.requested += requested;
        self.allocated_peak = self.allocated_peak.max(self.allocated);
        self.requested_peak = self.requested_peak.max(self.requested);
    }
}

/// Failure to serve a request within the capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfMemory {
    pub requested: u64,
    pub stats: Stats,
}

/// `PYTORCH_CUDA_ALLOC_CONF`'s settings the model follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct AllocatorSettings {
    /// `max_split_size_mb`, in bytes (`None`: unlimited, the default).
    pub max_split_size: Option<u64>,
    /// `expandable_segments:True`.
    pub expandable_segments: bool,
}

impl AllocatorSettings {
    /// The `PYTORCH_CUDA_ALLOC_CONF` value for these settings (empty for the
    /// defaults).
    pub fn env_value(&self) -> String {
        let mut parts = Vec::new();
        if self.expandable_segments {
            parts.push("expandable_segments:True".to_string());
        }
        if let Some(m) = self.max_split_size {
            parts.push(format!("max_split_size_mb:{}", m >> 20));
        }
        parts.join(",")
    }
}

/// Why a `PYTORCH_CUDA_ALLOC_CONF` value cannot be modelled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocConfError {
    #[error("`{item}`: write KEY:VALUE (expandable_segments:True, max_split_size_mb:N)")]
    NotKeyValue { item: String },
    #[error("expandable_segments:{value}: write True or False")]
    NotABool { value: String },
    #[error("max_split_size_mb:{value}: write a whole number of MiB")]
    NotMib { value: String },
    #[error("max_split_size_mb:{mb}: PyTorch requires more than 20 (its large segment size)")]
    SplitTooSmall { mb: u64 },
    #[error("`{key}`: segtune models expandable_segments and max_split_size_mb only")]
    UnmodelledKey { key: String },
}

impl std::str::FromStr for AllocatorSettings {
    type Err = AllocConfError;
    /// Parses a `PYTORCH_CUDA_ALLOC_CONF` value: `expandable_segments:True`,
    /// `max_split_size_mb:N` (N > 20, as PyTorch requires), comma-separated.
    fn from_str(text: &str) -> Result<AllocatorSettings, AllocConfError> {
        let mut settings = AllocatorSettings::default();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item
                .split_once(':')
                .ok_or_else(|| AllocConfError::NotKeyValue { item: item.into() })?;
            match key.trim() {
                "expandable_segments" => {
                    settings.expandable_segments = match value.trim() {
                        "True" | "true" => true,
                        "False" | "false" => false,
                        v => return Err(AllocConfError::NotABool { value: v.into() }),
                    }
                }
                "max_split_size_mb" => {
                    let mb: u64 = value.trim().parse().map_err(|_| AllocConfError::NotMib {
                        value: value.into(),
                    })?;
                    if mb <= 20 {
                        return Err(AllocConfError::SplitTooSmall { mb });
                    }
                    settings.max_split_size = Some(mb << 20);
                }
                other => return Err(AllocConfError::UnmodelledKey { key: other.into() }),
            }
        }
        Ok(settings)
    }
}

/// The caching allocator with its settings: default segments or expandable.
pub enum Allocator {
    Segments(CachingAllocator),
    Expandable(super::expandable::ExpandableAllocator),
}

impl Allocator {
    pub fn new(capacity: Option<u64>, settings: AllocatorSettings) -> Allocator {
        if settings.expandable_segments {
            Allocator::Expandable(super::expandable::ExpandableAllocator::new(capacity))
        } else {
            let mut a = CachingAllocator::new(capacity);
            a.max_split_size = settings.max_split_size.unwrap_or(u64::MAX);
            Allocator::Segments(a)
        }
    }

    pub fn malloc(&mut self, id: u64, size: u64) -> Result<(), OutOfMemory> {
        match self {
            Allocator::Segments(a) => a.malloc(id, size),
            Allocator::Expandable(a) => a.malloc(id, size),
        }
    }

    pub fn free(&mut self, id: u64) {
        match self {
            Allocator::Segments(a) => a.free(id),
            Allocator::Expandable(a) => a.free(id),
        }
    }

    pub fn stats(&self) -> Stats {
        match self {
            Allocator::Segments(a) => a.stats(),
            Allocator::Expandable(a) => a.stats(),
        }
    }

    pub fn reset_peaks(&mut self) {
        match self {
            Allocator::Segments(a) => a.reset_peaks(),
            Allocator::Expandable(a) => a.reset_peaks(),
        }
    }

    /// `emptyCache()`: every cached segment (or free page) goes back to the
    /// device.
    pub fn empty_cache(&mut self) {
        match self {
            Allocator::Segments(a) => a.release_all_cached_segments(),
            Allocator::Expandable(a) => a.release_cached(),
        }
    }

    /// `cacheInfo`'s largest block, as cuDNN's benchmark bounds its
    /// workspace with: the device's free memory (`cudaMemGetInfo`, what the
    /// capacity leaves beyond the reserved bytes), or the largest cached
    /// free block if that is larger. Unlimited without a capacity.
    pub fn max_block_size(&self) -> u64 {
        let (capacity, largest) = match self {
            Allocator::Segments(a) => (a.capacity, a.largest_free_block()),
            Allocator::Expandable(a) => (a.capacity(), a.largest_free_block()),
        };
        let device_free = capacity.map_or(u64::MAX, |c| c.saturating_sub(self.stats().reserved));
        device_free.max(largest)
    }
}

/// The allocator state.
pub struct CachingAllocator {
    capacity: Option<u64>,
    /// `max_split_size_mb` in bytes (`u64::MAX`: unlimited).
    max_split_size: u64,
    /// Every block by address.
    blocks: BTreeMap<u64, Block>,
    /// Free blocks per pool, ordered by (size, address).
    free: PerPool<BTreeSet<(u64, u64)>>,
    /// Segment base -> size.
    segments: BTreeMap<u64, u64>,
    /// Live allocation id -> (block address, requested size).
    live: FxHashMap<u64, (u64, u64)>,
    next_address: u64,
    stats: Stats,
}

impl CachingAllocator {
    /// An allocator that may reserve at most `capacity` bytes (`None`: no limit).
    pub fn new(capacity: Option<u64>) -> CachingAllocator {
        CachingAllocator {
            capacity,
            max_split_size: u64::MAX,
            blocks: BTreeMap::new(),
            free: PerPool::default(),
            segments: BTreeMap::new(),
            live: FxHashMap::default(),
            next_address: 1 << 32,
            stats: Stats::default(),
        }
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Resets the peaks to the current values (`reset_peak_memory_stats`).
    pub fn reset_peaks(&mut self) {
        self.stats.reset_peaks();
    }

    /// Allocates `size` bytes for allocation `id`.
    pub fn malloc(&mut self, id: u64, size: u64) -> Result<(), OutOfMemory> {
        let rounded = round_size(size);
        let pool = Pool::of(rounded);
        let address = match self.take_free_block(pool, rounded) {
            Some(a) => a,
            None => self.reserve(pool, rounded, size)?,
        };
        let block = self.blocks[&address];
        let remaining = block.size - rounded;
        let split = match pool {
            Pool::Small => remaining >= MIN_BLOCK_SIZE,
            Pool::Large => rounded < self.max_split_size && remaining > SMALL_SIZE,
        };
        let granted = if split {
            let rest = Block {
                size: remaining,
                segment: block.segment,
                allocated: false,
                pool,
            };
            self.blocks.insert(address + rounded, rest);
            self.free[pool].insert((remaining, address + rounded));
            rounded
        } else {
            block.size
        };
        let b = self.blocks.get_mut(&address).expect("block");
        b.size = granted;
        b.allocated = true;
        self.live.insert(id, (address, size));
        self.stats.add_allocation(granted, size);
        Ok(())
    }

    /// Frees allocation `id` (unknown ids are ignored: they were allocated
    /// before the replay started).
    pub fn free(&mut self, id: u64) {
        let Some((address, requested)) = self.live.remove(&id) else {
            return;
        };
        let mut block = self.blocks.remove(&address).expect("live block");
        self.stats.allocated -= block.size;
        self.stats.requested -= requested;
        block.allocated = false;
        let next_address = address + block.size;
        let mut start = address;
        // Merge with the previous and the next block of the same segment.
        if let Some((&prev_addr, prev)) = self.blocks.range(..address).next_back() {
            if !prev.allocated && prev.segment == block.segment && prev_addr + prev.size == address
            {
                let prev = self.blocks.remove(&prev_addr).expect("prev");
                self.free[prev.pool].remove(&(prev.size, prev_addr));
                block.size += prev.size;
                start = prev_addr;
            }
        }
        if let Some(&next) = self.blocks.get(&next_address) {
            if !next.allocated && next.segment == block.segment {
                self.blocks.remove(&next_address);
                self.free[next.pool].remove(&(next.size, next_address));
                block.size += next.size;
            }
        }
        self.free[block.pool].insert((block.size, start));
        self.blocks.insert(start, block);
    }

    fn take_free_block(&mut self, pool: Pool, size: u64) -> Option<u64> {
        let set = &mut self.free[pool];
        let &(found_size, address) = set.range((size, 0)..).next()?;
        // Oversize blocks serve only oversize requests, within 20 MiB.
        let max_split = self.max_split_size;
        if (size < max_split && found_size >= max_split)
            || (size >= max_split && found_size >= size.saturating_add(LARGE_BUFFER))
        {
            return None;
        }
        set.remove(&(found_size, address));
        Some(address)
    }

    fn reserve(&mut self, pool: Pool, rounded: u64, requested: u64) -> Result<u64, OutOfMemory> {
        let segment = allocation_size(rounded);
        if !self.fits(segment) {
            if self.max_split_size != u64::MAX {
                self.release_available_cached_segments(pool, rounded.max(self.max_split_size));
            }
            if !self.fits(segment) {
                self.stats.num_alloc_retries += 1;
                self.release_all_cached_segments();
            }
            if !self.fits(segment) {
                return Err(OutOfMemory {
                    requested,
                    stats: self.stats,
                });
            }
        }
        let base = self.next_address;
        self.next_address += segment.max(ROUND_LARGE);
        self.segments.insert(base, segment);
        self.blocks.insert(
            base,
            Block {
                size: segment,
                segment: base,
                allocated: false,
                pool,
            },
        );
        self.stats.reserved += segment;
        self.stats.segments += 1;
        self.stats.reserved_peak = self.stats.reserved_peak.max(self.stats.reserved);
        Ok(base)
    }

    /// The largest free (cached) block of either pool.
    pub fn largest_free_block(&self) -> u64 {
        self.free
            .iter()
            .filter_map(|(_, set)| set.iter().map(|(size, _)| *size).max())
            .max()
            .unwrap_or(0)
    }

    fn fits(&self, segment: u64) -> bool {
        self.capacity
            .is_none_or(|c| self.stats.reserved + segment <= c)
    }

    /// Free blocks that are whole segments (unsplit), as (size, address, pool).
    fn cached_segments(&self) -> Vec<(u64, u64, Pool)> {
        self.free
            .iter()
            .flat_map(|(pool, set)| set.iter().map(move |(s, a)| (*s, *a, pool)))
            .filter(|(s, a, _)| self.segments.get(a) == Some(s))
            .collect()
    }

    fn release(&mut self, size: u64, address: u64, pool: Pool) {
        self.free[pool].remove(&(size, address));
        self.blocks.remove(&address);
        self.segments.remove(&address);
        self.stats.reserved -= size;
        self.stats.segments -= 1;
    }

    /// `release_available_cached_blocks` (with `max_split_size_mb` only):
    /// the smallest cached oversize segment of the pool at least as large as
    /// needed, else the largest oversize ones until enough is freed.
    fn release_available_cached_segments(&mut self, pool: Pool, needed: u64) {
        let max_split = self.max_split_size;
        let mut candidates: Vec<(u64, u64, Pool)> = self
            .cached_segments()
            .into_iter()
            .filter(|c| c.2 == pool && c.0 >= max_split)
            .collect();
        candidates.sort();
        if let Some(&(s, a, p)) = candidates.iter().find(|c| c.0 >= needed) {
            self.release(s, a, p);
            return;
        }
        let mut freed = 0;
        for &(s, a, p) in candidates.iter().rev() {
            if freed >= needed {
                break;
            }
            self.release(s, a, p);
            freed += s;
        }
    }

    /// `release_cached_blocks`: every whole cached segment.
    pub fn release_all_cached_segments(&mut self) {
        for (s, a, p) in self.cached_segments() {
            self.release(s, a, p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn rounding_and_segment_sizes() {
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(allocation_size(1000), 2 * MIB);
        assert_eq!(allocation_size(MIB), 2 * MIB);
        assert_eq!(allocation_size(MIB + 512), 20 * MIB);
        assert_eq!(allocation_size(10 * MIB), 10 * MIB);
        assert_eq!(allocation_size(11 * MIB + 1), 12 * MIB);
    }

    #[test]
    fn small_requests_pack_into_one_2mib_segment() {
        let mut a = CachingAllocator::new(None);
        for id in 0..4 {
            a.malloc(id, 1000).unwrap();
        }
        let s = a.stats();
        assert_eq!(s.allocated, 4 * 1024);
        assert_eq!(s.reserved, 2 * MIB);
        assert_eq!(s.requested, 4000);
    }

    #[test]
    fn a_mid_sized_request_splits_a_20mib_segment() {
        let mut a = CachingAllocator::new(None);
        a.malloc(0, 3 * MIB).unwrap();
        a.malloc(1, 5 * MIB).unwrap();
        let s = a.stats();
        assert_eq!(
            s.reserved,
            20 * MIB,
            "the second request reuses the first segment's remainder"
        );
        assert_eq!(s.allocated, 8 * MIB);
    }

    #[test]
    fn a_remainder_of_at_most_1mib_is_not_split_and_counts_as_allocated() {
        let mut a = CachingAllocator::new(None);
        // 19.5 MiB leaves 0.5 MiB of its 20 MiB segment: the whole block is handed out.
        a.malloc(0, 19 * MIB + MIB / 2).unwrap();
        assert_eq!(a.stats().allocated, 20 * MIB);
        assert_eq!(a.stats().reserved, 20 * MIB);
    }

    #[test]
    fn freed_blocks_coalesce_and_are_reused_best_fit() {
        let mut a = CachingAllocator::new(None);
        a.malloc(0, 4 * MIB).unwrap(); // [0,4) of segment 1
        a.malloc(1, 4 * MIB).unwrap(); // [4,8)
        a.malloc(2, 4 * MIB).unwrap(); // [8,12), free remainder [12,20)
        a.free(0);
        a.free(1); // merges into [0,8)
                   // 6 MiB: best fit is the 8 MiB merged block, not the 8 MiB tail... both are 8 MiB;
                   // the lower address wins, and its 2 MiB remainder stays unsplit (<= 1 MiB? no: 2 MiB > 1 MiB, split).
        a.malloc(3, 6 * MIB).unwrap();
        assert_eq!(a.stats().reserved, 20 * MIB);
        assert_eq!(a.stats().allocated, 10 * MIB);
        a.free(2);
        a.free(3);
        assert_eq!(a.stats().allocated, 0);
        // Everything merged back into one free 20 MiB segment: a 20 MiB request fits without reserving.
        a.malloc(4, 20 * MIB).unwrap();
        assert_eq!(a.stats().reserved, 20 * MIB);
    }

    #[test]
    fn large_requests_get_their_own_rounded_segment() {
        let mut a = CachingAllocator::new(None);
        a.malloc(0, 100 * MIB + 1).unwrap();
        assert_eq!(a.stats().reserved, 102 * MIB);
        assert_eq!(a.stats().allocated, 100 * MIB + 512);
        a.free(0);
        // A 50 MiB request reuses the cached 102 MiB block, splitting it.
        a.malloc(1, 50 * MIB).unwrap();
        assert_eq!(a.stats().reserved, 102 * MIB);
        assert_eq!(a.stats().allocated, 50 * MIB);
        assert_eq!(a.stats().reserved_peak, 102 * MIB);
    }

    #[test]
    fn a_cache_miss_over_capacity_releases_cached_segments_first() {
        let mut a = CachingAllocator::new(Some(64 * MIB));
        a.malloc(0, 40 * MIB).unwrap();
        a.free(0); // cached 40 MiB segment
                   // 50 MiB does not fit in the cached 40 MiB block; reserving it would
                   // need 90 MiB > 64 MiB, so the cached segment is released first.
        a.malloc(1, 50 * MIB).unwrap();
        assert_eq!(a.stats().reserved, 50 * MIB);
        assert_eq!(a.stats().num_alloc_retries, 1);
        assert!(
            a.malloc(2, 20 * MIB).is_err(),
            "50 + 20 MiB exceed 64 MiB with nothing cached"
        );
    }

    #[test]
    fn split_blocks_are_not_released() {
        let mut a = CachingAllocator::new(Some(24 * MIB));
        a.malloc(0, 2 * MIB).unwrap(); // 20 MiB segment, split
                                       // The 18 MiB free remainder belongs to a split segment: it cannot be
                                       // released, so a 19 MiB request (another 20 MiB segment) is out of memory.
        assert!(a.malloc(1, 19 * MIB).is_err());
    }

    fn with_max_split(capacity: Option<u64>, mib: u64) -> CachingAllocator {
        let mut a = CachingAllocator::new(capacity);
        a.max_split_size = mib * MIB;
        a
    }

    #[test]
    fn oversize_blocks_serve_only_oversize_requests_within_20_mib() {
        let mut a = with_max_split(None, 100);
        a.malloc(0, 200 * MIB).unwrap();
        a.free(0); // a cached 200 MiB oversize block
        a.malloc(1, 50 * MIB).unwrap();
        assert_eq!(
            a.stats().reserved,
            250 * MIB,
            "a small request takes no oversize block"
        );
        a.malloc(2, 170 * MIB).unwrap();
        assert_eq!(
            a.stats().reserved,
            420 * MIB,
            "30 MiB too large a rest: a new segment"
        );
        a.malloc(3, 190 * MIB).unwrap();
        assert_eq!(
            a.stats().reserved,
            420 * MIB,
            "within 20 MiB: the cached block"
        );
        assert_eq!(
            a.stats().allocated,
            (50 + 170 + 200) * MIB,
            "the oversize block is handed out whole, not split"
        );
    }

    #[test]
    fn settings_parse_as_pytorch_cuda_alloc_conf() {
        let s: AllocatorSettings = "expandable_segments:True,max_split_size_mb:128"
            .parse()
            .unwrap();
        assert!(s.expandable_segments);
        assert_eq!(s.max_split_size, Some(128 * MIB));
        assert_eq!(
            s.env_value(),
            "expandable_segments:True,max_split_size_mb:128"
        );
        assert_eq!(AllocatorSettings::default().env_value(), "");
        assert!("max_split_size_mb:20".parse::<AllocatorSettings>().is_err());
        assert!("garbage_collection_threshold:0.6"
            .parse::<AllocatorSettings>()
            .is_err());
        assert!("expandable_segments".parse::<AllocatorSettings>().is_err());
    }

    #[test]
    fn with_max_split_size_the_smallest_big_enough_oversize_segment_goes_first() {
        let mut a = with_max_split(Some(400 * MIB), 100);
        a.malloc(0, 150 * MIB).unwrap();
        a.malloc(1, 200 * MIB).unwrap();
        a.free(0);
        a.free(1); // cached: 150 and 200 MiB oversize segments
                   // 300 MiB: release_available_cached_blocks frees the largest (200)
                   // then 150 until 300 are freed: both; no retry count (not the last try).
        a.malloc(2, 300 * MIB).unwrap();
        assert_eq!(a.stats().reserved, 300 * MIB);
        assert_eq!(a.stats().num_alloc_retries, 0);
    }
}
