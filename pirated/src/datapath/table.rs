//! `pirate`'s flow table as pirated sees it: the kernel's mmapable array of sets
//! (`pirate_common::pirate::table`), mapped into the daemon and read in place: a set's ids, then
//! the states of the flows measured in the epoch, where a hash table had to be copied out entry
//! by entry.

use std::io;

use aya::maps::MapData;
use pirate_common::{
    key::{FlowId, FlowKey},
    pirate::{
        flow::{FlowState, ACTIVE},
        table::{sets_of, Set, WAYS},
    },
};

use super::mmap::Mapped;

pub struct FlowTable {
    sets: Mapped,
    /// The datapath's flow seed: where a flow sits, and an IPv6 flow's id, depend on it.
    seed: u64,
}

impl FlowTable {
    /// Maps the flow table `map` (an mmapable array of sets) of a datapath of seed `seed`.
    pub fn map(map: &MapData, seed: u64) -> io::Result<FlowTable> {
        Ok(FlowTable { sets: Mapped::of(map)?, seed })
    }

    pub fn sets(&self) -> usize {
        self.sets.entries()
    }

    /// The two sets flow `key` may sit in.
    pub fn sets_of(&self, key: &FlowKey) -> (u32, u32) {
        sets_of(key.flow_hash(self.seed), self.sets() as u32)
    }

    /// The id the datapath keys flow `key` by.
    pub fn id(&self, key: &FlowKey) -> FlowId {
        FlowId::of(key, self.seed)
    }

    /// The ids of set `i`'s ways (family 0: empty).
    pub fn ids<const M: usize>(&self, i: usize) -> [FlowId; WAYS] {
        // SAFETY: an aligned set inside the mapping; any bit pattern is a valid id.
        unsafe { std::ptr::read_volatile(&raw const (*self.sets.at::<Set<M>>(i)).ids) }
    }

    /// A copy of the state in way `w` of set `i` if it holds packets of `epoch`, as its epoch
    /// and status, read first, say: a flow idle in the epoch costs the drain those two words,
    /// not its whole state. The datapath may be writing it meanwhile: the copy can be torn (see
    /// `FlowEpoch::is_consistent`) or have moved on to the next epoch.
    pub fn measured<const M: usize>(&self, i: usize, w: usize, epoch: u32) -> Option<FlowState<M>> {
        // SAFETY: a place inside the mapping, not read.
        let state = unsafe { &raw const (*self.sets.at::<Set<M>>(i)).states[w] };
        // SAFETY: aligned fields of a state inside the mapping; any bit pattern is valid.
        let (at, status) = unsafe {
            (std::ptr::read_volatile(&raw const (*state).epoch), std::ptr::read_volatile(&raw const (*state).status))
        };
        // SAFETY: as above, the whole state.
        (at == epoch && status & ACTIVE != 0).then(|| unsafe { std::ptr::read_volatile(state) })
    }

    /// Flows in the table now, counted from the ids alone (a cache line per set).
    pub fn occupied<const M: usize>(&self) -> usize {
        let ways = |i| {
            // SAFETY: an aligned set inside the mapping; any bit pattern is a valid id.
            let ids = unsafe { std::ptr::read_volatile(&raw const (*self.sets.at::<Set<M>>(i)).ids) };
            ids.iter().filter(|id| id.family != 0).count()
        };
        (0..self.sets()).map(ways).sum()
    }

    /// Overwrites set `i`: for benchmarks that fill the table, never for a live one.
    pub fn write<const M: usize>(&self, i: usize, set: &Set<M>) {
        self.sets.write(i, *set)
    }
}
