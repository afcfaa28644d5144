//! RLI's side of the datapath: its flow table and reference ring sized, its shape written, and
//! its handle: every flow's per-CPU counters, the references the ring still holds, and the ring
//! of references taken.

use std::os::fd::{AsRawFd, RawFd};

use anyhow::Context;
use aya::{
    maps::{Array, MapData, PerCpuHashMap, RingBuf},
    Ebpf, EbpfLoader,
};
use pirate_common::{
    key::FlowKey,
    maps,
    rli::{flow::RliFlow, reference::RliShape, Reference, Taken, RING},
};

use super::{object, percpu::CounterReader, spec};

/// Sizes RLI's flow table and the ring of references taken.
pub(super) fn size(loader: &mut EbpfLoader<'_>, spec: &spec::Rli) {
    loader.set_max_entries(maps::RLI_FLOWS, spec.max_flows).set_max_entries(maps::RLI_TAKEN, spec.ring_bytes);
}

/// Writes RLI's shape, before `rli` is chained.
pub(super) fn configure(ebpf: &mut Ebpf, spec: &spec::Rli) -> anyhow::Result<()> {
    Array::<_, RliShape>::try_from(ebpf.map_mut(maps::RLI_SHAPE).unwrap())?
        .set(0, spec.shape, 0)
        .context("writing RLI_SHAPE")
}

/// RLI's maps as the downstream point reads them.
pub struct RliMaps {
    /// The datapath's counters: the references' outcomes among them.
    pub counters: CounterReader,
    flows: PerCpuHashMap<MapData, FlowKey, RliFlow>,
    refs: Array<MapData, Reference>,
    taken: RingBuf<MapData>,
}

impl RliMaps {
    pub(super) fn take(ebpf: &mut Ebpf, counters: CounterReader) -> anyhow::Result<RliMaps> {
        Ok(RliMaps {
            counters,
            flows: PerCpuHashMap::try_from(object::take(ebpf, maps::RLI_FLOWS)?)?,
            refs: Array::try_from(object::take(ebpf, maps::RLI_REFS)?)?,
            taken: RingBuf::try_from(object::take(ebpf, maps::RLI_TAKEN)?)?,
        })
    }

    /// Every flow in the table with its counters on each CPU. A flow the LRU evicts while the
    /// walk goes on may be missed, or read twice (the walk restarts its bucket).
    pub fn flows(&self) -> anyhow::Result<Vec<(FlowKey, Vec<RliFlow>)>> {
        let mut out = Vec::new();
        for entry in self.flows.iter() {
            match entry {
                Ok((key, values)) => out.push((key, values.iter().copied().collect())),
                // Evicted between the walk's key and its lookup.
                Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(e).context("reading RLI_FLOWS"),
            }
        }
        Ok(out)
    }

    /// Lets go of flows (ended ones, whose figures are all out). A packet of one arriving at
    /// that instant is lost to its counters, never miscounted.
    pub fn remove(&mut self, keys: &[FlowKey]) {
        for key in keys {
            // Evicted meanwhile: gone already.
            let _ = self.flows.remove(key);
        }
    }

    /// The references the ring holds, by sequence number. A slot is read twice and taken only
    /// if both reads agree: one being written reads as a mix of two references.
    pub fn references(&self) -> anyhow::Result<Vec<Reference>> {
        let mut out = Vec::with_capacity(RING as usize);
        for i in 0..RING {
            let r = self.refs.get(&i, 0).context("reading RLI_REFS")?;
            if r.seq != 0 && r.seq % RING as u64 == i as u64 && self.refs.get(&i, 0).ok() == Some(r) {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// Hands every reference taken since the last call to `f`.
    pub fn drain_taken(&mut self, mut f: impl FnMut(Taken)) {
        while let Some(item) = self.taken.next() {
            if item.len() >= size_of::<Taken>() {
                // SAFETY: the datapath writes `Taken` records; read unaligned.
                f(unsafe { std::ptr::read_unaligned(item.as_ptr() as *const Taken) });
            }
        }
    }

    /// The descriptor that becomes readable when references are taken.
    pub fn taken_fd(&self) -> RawFd {
        self.taken.as_raw_fd()
    }
}
