//! The caching allocator with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`
//! (PyTorch 2.11's `c10/cuda/CUDACachingAllocator.cpp`: Note [Expandable
//! Segments], `find_expandable_block`, `map_block`,
//! `try_allocate_expandable_block`, `get_free_block`, `should_split`,
//! `unmap_block`, `release_blocks`). One stream; per pool one segment of
//! virtual address space (1 1/8 of the device's memory) into which physical
//! pages are mapped as needed: 2 MiB pages for the small pool, 20 MiB pages
//! for the large pool. Reserved memory is the mapped pages.
//!
//! The rules it reproduces:
//! - requests are rounded and pooled as without expandable segments;
//! - a request takes the best-fitting free mapped block of its pool, where
//!   among blocks of the same size a block followed by unmapped space counts
//!   as large as it could grow (`get_free_block`'s expandable size);
//! - on a miss, the lowest-addressed unmapped range (with the free mapped
//!   block just before it, if any) that has room is mapped, in whole pages,
//!   just enough for the request, merging with its free neighbours;
//! - any block larger than the request is split when at least 512 bytes
//!   remain (`should_split`: small and large pools alike);
//! - freed blocks merge with free mapped neighbours;
//! - when mapping would exceed the capacity, every whole page inside a free
//!   block is unmapped (`release_cached_blocks`) and the mapping retried;
//!   then it is an out-of-memory error.

use super::allocator::{round_size, OutOfMemory, PerPool, Pool, Stats};
use super::allocator::{LARGE_BUFFER, MIN_BLOCK_SIZE, SMALL_BUFFER};
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, BTreeSet};

impl Pool {
    /// The page size mapped at once with expandable segments.
    fn page(self) -> u64 {
        match self {
            Pool::Small => SMALL_BUFFER,
            Pool::Large => LARGE_BUFFER,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Block {
    size: u64,
    allocated: bool,
    mapped: bool,
    pool: Pool,
}

/// The allocator state with expandable segments.
pub struct ExpandableAllocator {
    capacity: Option<u64>,
    /// Every block (mapped or not) by address; a segment's blocks tile it.
    blocks: BTreeMap<u64, Block>,
    /// Segment base -> end.
    segments: BTreeMap<u64, u64>,
    /// Free mapped blocks per pool, by (size, address).
    free: PerPool<BTreeSet<(u64, u64)>>,
    /// Unmapped blocks per pool, by address.
    unmapped: PerPool<BTreeSet<u64>>,
    /// Live allocation id -> (block address, requested size).
    live: FxHashMap<u64, (u64, u64)>,
    next_base: u64,
    stats: Stats,
}

const ADDRESS_STEP: u64 = 1 << 44;

impl ExpandableAllocator {
    pub fn new(capacity: Option<u64>) -> ExpandableAllocator {
        ExpandableAllocator {
            capacity,
            blocks: BTreeMap::new(),
            segments: BTreeMap::new(),
            free: PerPool::default(),
            unmapped: PerPool::default(),
            live: FxHashMap::default(),
            next_base: ADDRESS_STEP,
            stats: Stats::default(),
        }
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    pub fn reset_peaks(&mut self) {
        self.stats.reset_peaks();
    }

    /// The segment holding `address`: (base, end).
    fn segment_of(&self, address: u64) -> (u64, u64) {
        let (&base, &end) = self
            .segments
            .range(..=address)
            .next_back()
            .expect("every block lies in a segment");
        (base, end)
    }

    fn prev_of(&self, address: u64) -> Option<u64> {
        let (base, _) = self.segment_of(address);
        self.blocks
            .range(base..address)
            .next_back()
            .map(|(a, _)| *a)
    }

    fn next_of(&self, address: u64) -> Option<u64> {
        let (_, end) = self.segment_of(address);
        let size = self.blocks[&address].size;
        let next = address + size;
        (next < end).then_some(next)
    }

    /// Takes a block out of its set (free mapped or unmapped).
    fn unlist(&mut self, address: u64) {
        let b = self.blocks[&address];
        if b.mapped {
            self.free[b.pool].remove(&(b.size, address));
        } else {
            self.unmapped[b.pool].remove(&address);
        }
    }

    /// Puts an unlisted, unallocated block into its set.
    fn list(&mut self, address: u64) {
        let b = self.blocks[&address];
        if b.mapped {
            self.free[b.pool].insert((b.size, address));
        } else {
            self.unmapped[b.pool].insert(address);
        }
    }

    /// Merges the unlisted, unallocated block at `address` with its
    /// unallocated neighbours of the same mapping (`try_merge_blocks`);
    /// returns the merged block's address, unlisted.
    fn merge(&mut self, address: u64) -> u64 {
        let mut start = address;
        let mapped = self.blocks[&address].mapped;
        if let Some(next) = self.next_of(address) {
            let n = self.blocks[&next];
            if !n.allocated && n.mapped == mapped {
                self.unlist(next);
                self.blocks.remove(&next);
                self.blocks.get_mut(&address).expect("block").size += n.size;
            }
        }
        if let Some(prev) = self.prev_of(address) {
            let p = self.blocks[&prev];
            if !p.allocated && p.mapped == mapped {
                self.unlist(prev);
                let b = self.blocks.remove(&address).expect("block");
                self.blocks.get_mut(&prev).expect("block").size += b.size;
                start = prev;
            }
        }
        start
    }

    /// `get_free_block`: the best-fitting free mapped block, where a block
    /// followed by unmapped space counts as large as it can grow.
    fn take_free_block(&mut self, pool: Pool, size: u64) -> Option<u64> {
        let expandable_size = |(s, a): (u64, u64)| {
            s + self
                .next_of(a)
                .map(|n| self.blocks[&n])
                .filter(|n| !n.mapped)
                .map_or(0, |n| n.size)
        };
        let mut fits = self.free[pool].range((size, 0)..).copied();
        let mut best = fits.next()?;
        for next in fits {
            if expandable_size(next) < expandable_size(best) {
                best = next;
            } else {
                break;
            }
        }
        self.free[pool].remove(&best);
        Some(best.1)
    }

    /// `find_expandable_block`: the lowest unmapped range (with the free
    /// mapped block before it) with room for `size`, else a new segment.
    fn find_expandable_block(&mut self, pool: Pool, size: u64) -> u64 {
        let allocatable = |a: Option<u64>| a.filter(|a| !self.blocks[a].allocated);
        for &c in &self.unmapped[pool] {
            let start = allocatable(self.prev_of(c)).unwrap_or(c);
            let (mut bytes, mut b) = (0, Some(start));
            while bytes < size {
                let Some(a) = allocatable(b) else { break };
                bytes += self.blocks[&a].size;
                b = self.next_of(a);
            }
            if bytes >= size {
                return start;
            }
        }
        // 1 1/8 of the device's memory (unlimited: 64 TiB), in whole pages.
        let device = self.capacity.unwrap_or(1 << 46);
        let space = (device + device / 8).div_ceil(pool.page()) * pool.page();
        let base = self.next_base;
        self.next_base += space.div_ceil(ADDRESS_STEP) * ADDRESS_STEP;
        self.segments.insert(base, base + space);
        self.blocks.insert(
            base,
            Block {
                size: space,
                allocated: false,
                mapped: false,
                pool,
            },
        );
        self.list(base);
        base
    }

    /// `map_block`: maps the first `size` bytes (whole pages) of the
    /// unmapped block at `address`; returns the merged free block's
    /// address, or `None` when the pages do not fit in the capacity.
    fn map_block(&mut self, address: u64, size: u64) -> Option<u64> {
        let b = self.blocks[&address];
        let mapped = size.div_ceil(b.pool.page()) * b.pool.page();
        let mapped = mapped.min(b.size);
        if self
            .capacity
            .is_some_and(|c| self.stats.reserved + mapped > c)
        {
            return None;
        }
        self.unlist(address);
        if mapped < b.size {
            let rest = address + mapped;
            self.blocks.insert(
                rest,
                Block {
                    size: b.size - mapped,
                    ..b
                },
            );
            self.list(rest);
        }
        let block = self.blocks.get_mut(&address).expect("block");
        block.size = mapped;
        block.mapped = true;
        self.stats.reserved += mapped;
        self.stats.reserved_peak = self.stats.reserved_peak.max(self.stats.reserved);
        self.stats.segments += 1;
        let start = self.merge(address);
        self.list(start);
        Some(start)
    }

    /// `try_allocate_expandable_block`: maps enough for `size` at the
    /// lowest address with room; the block, unlisted.
    fn try_allocate(&mut self, pool: Pool, size: u64) -> Option<u64> {
        let mut candidate = self.find_expandable_block(pool, size);
        if !self.blocks[&candidate].mapped {
            let whole = self.blocks[&candidate].size;
            candidate = self.map_block(candidate, whole.min(size))?;
        }
        while self.blocks[&candidate].size < size {
            let remaining = size - self.blocks[&candidate].size;
            let next = self.next_of(candidate).expect("room was found");
            let next_size = self.blocks[&next].size;
            candidate = self.map_block(next, remaining.min(next_size))?;
        }
        self.unlist(candidate);
        Some(candidate)
    }

    pub fn capacity(&self) -> Option<u64> {
        self.capacity
    }

    /// The largest free mapped block.
    pub fn largest_free_block(&self) -> u64 {
        self.free
            .iter()
            .filter_map(|(_, set)| set.iter().map(|(size, _)| *size).max())
            .max()
            .unwrap_or(0)
    }

    /// `unmap_block` on every free mapped block: the whole pages inside it.
    pub fn release_cached(&mut self) {
        let free: Vec<(u64, u64)> = self
            .free
            .iter()
            .flat_map(|(_, set)| set.iter().copied())
            .collect();
        for (size, address) in free {
            let page = self.blocks[&address].pool.page();
            let lo = address.div_ceil(page) * page;
            let hi = (address + size) / page * page;
            if hi <= lo {
                continue;
            }
            self.unlist(address);
            let b = self.blocks.remove(&address).expect("block");
            let pieces = [
                (address, lo - address, true),
                (lo, hi - lo, false),
                (hi, address + size - hi, true),
            ];
            for (a, s, mapped) in pieces {
                if s > 0 {
                    self.blocks.insert(
                        a,
                        Block {
                            size: s,
                            mapped,
                            ..b
                        },
                    );
                    if mapped {
                        self.list(a);
                    }
                }
            }
            self.stats.reserved -= hi - lo;
            let merged = self.merge(lo);
            self.list(merged);
        }
    }

    pub fn malloc(&mut self, id: u64, size: u64) -> Result<(), OutOfMemory> {
        let rounded = round_size(size);
        let pool = Pool::of(rounded);
        let address = match self.take_free_block(pool, rounded) {
            Some(a) => a,
            None => match self.try_allocate(pool, rounded) {
                Some(a) => a,
                None => {
                    self.stats.num_alloc_retries += 1;
                    self.release_cached();
                    self.try_allocate(pool, rounded).ok_or(OutOfMemory {
                        requested: size,
                        stats: self.stats,
                    })?
                }
            },
        };
        let b = self.blocks[&address];
        if b.size - rounded >= MIN_BLOCK_SIZE {
            let rest = address + rounded;
            self.blocks.insert(
                rest,
                Block {
                    size: b.size - rounded,
                    ..b
                },
            );
            self.list(rest);
            self.blocks.get_mut(&address).expect("block").size = rounded;
        }
        let block = self.blocks.get_mut(&address).expect("block");
        block.allocated = true;
        let granted = block.size;
        self.live.insert(id, (address, size));
        self.stats.add_allocation(granted, size);
        Ok(())
    }

    /// Frees allocation `id` (unknown ids are ignored).
    pub fn free(&mut self, id: u64) {
        let Some((address, requested)) = self.live.remove(&id) else {
            return;
        };
        let block = self.blocks.get_mut(&address).expect("live block");
        block.allocated = false;
        let size = block.size;
        self.stats.allocated -= size;
        self.stats.requested -= requested;
        let merged = self.merge(address);
        self.list(merged);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::allocator::CachingAllocator;

    const MIB: u64 = 1 << 20;

    #[test]
    fn pages_are_mapped_as_needed_and_blocks_tile_one_segment() {
        let mut a = ExpandableAllocator::new(None);
        a.malloc(0, 3 * MIB).unwrap();
        assert_eq!(a.stats().reserved, 20 * MIB, "one 20 MiB page");
        a.malloc(1, 30 * MIB).unwrap();
        // 17 MiB are free after the first block; the second maps 20 MiB more
        // right after them and takes 30 of the 37 MiB.
        assert_eq!(a.stats().reserved, 40 * MIB);
        assert_eq!(a.stats().allocated, 33 * MIB);
        a.malloc(2, 100).unwrap();
        assert_eq!(
            a.stats().reserved,
            42 * MIB,
            "a 2 MiB page for the small pool"
        );
    }

    #[test]
    fn growing_tensors_reuse_freed_space_where_segments_would_fragment() {
        // Batch sizes that grow a little each step leave slivers in fixed
        // segments; the expandable segment grows in place.
        let run = |a: &mut dyn FnMut(u64, u64, bool)| {
            let mut id = 0;
            for step in 0..6u64 {
                let size = (50 + 3 * step) * MIB;
                for _ in 0..3 {
                    a(id, size, true);
                    id += 1;
                }
                for k in 0..3 {
                    a(id - 3 + k, 0, false);
                }
            }
        };
        let mut plain = CachingAllocator::new(None);
        run(&mut |id, size, alloc| {
            if alloc {
                plain.malloc(id, size).unwrap()
            } else {
                plain.free(id)
            }
        });
        let mut expandable = ExpandableAllocator::new(None);
        run(&mut |id, size, alloc| {
            if alloc {
                expandable.malloc(id, size).unwrap()
            } else {
                expandable.free(id)
            }
        });
        let (p, e) = (
            plain.stats().reserved_peak,
            expandable.stats().reserved_peak,
        );
        assert!(e < p, "expandable {e} vs segments {p}");
        // The last step's 3 x 65 MiB, in 20 MiB pages, plus what earlier
        // steps left mapped.
        assert!(e <= 220 * MIB, "{e}");
    }

    #[test]
    fn out_of_capacity_unmaps_free_pages_then_fails() {
        // 100 MiB of device: the segment's address space is 120 MiB.
        let mut a = ExpandableAllocator::new(Some(100 * MIB));
        a.malloc(0, 50 * MIB).unwrap(); // maps 60: [0,50) + free [50,60)
        a.malloc(1, 30 * MIB).unwrap(); // maps 20 more: [50,80)
        assert_eq!(a.stats().reserved, 80 * MIB);
        a.free(0); // [0,50) free, mapped
                   // 60 MiB fit nowhere mapped; the segment's last 40 MiB of address
                   // space are too few, a new segment would map 60 MiB (140 > 100): the
                   // free pages [0,40) are unmapped first, then the new mapping fits.
        a.malloc(2, 60 * MIB).unwrap();
        assert_eq!(a.stats().reserved, 100 * MIB);
        assert_eq!(a.stats().num_alloc_retries, 1);
        assert!(a.malloc(3, 80 * MIB).is_err());
    }
}
