//! `pirate`'s flow table as pirated sees it: the kernel's mmapable array of sets
//! (`pirate_common::pirate::table`), mapped into the daemon and read in place a set at a time,
//! where a hash table had to be copied out entry by entry.

use std::io;

use aya::maps::MapData;
use pirate_common::pirate::table::Set;

use super::mmap::Mapped;

pub struct FlowTable(Mapped);

impl FlowTable {
    /// Maps the flow table `map` (an mmapable array of sets).
    pub fn map(map: &MapData) -> io::Result<FlowTable> {
        Mapped::of(map).map(FlowTable)
    }

    pub fn sets(&self) -> usize {
        self.0.entries()
    }

    /// A copy of set `i`. The datapath may be writing it meanwhile: a flow's copy can be torn
    /// (see `FlowEpoch::is_consistent`).
    pub fn read<const M: usize>(&self, i: usize) -> Set<M> {
        self.0.read(i)
    }

    /// Flows in the table now, counted from the ids alone (a cache line per set).
    pub fn occupied<const M: usize>(&self) -> usize {
        let ways = |i| {
            // SAFETY: an aligned set inside the mapping; any bit pattern is a valid id.
            let ids = unsafe { std::ptr::read_volatile(&raw const (*self.0.at::<Set<M>>(i)).ids) };
            ids.iter().filter(|id| id.family != 0).count()
        };
        (0..self.sets()).map(ways).sum()
    }

    /// Overwrites set `i`: for benchmarks that fill the table, never for a live one.
    pub fn write<const M: usize>(&self, i: usize, set: &Set<M>) {
        self.0.write(i, *set)
    }
}
