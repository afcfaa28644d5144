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
    rli::{
        flow::{RliFlow, MAX_SKIP},
        reference::RliShape,
        Reference, Taken, RING,
    },
};

use super::{object, percpu::CounterReader, spec};

/// Sizes RLI's flow table and the ring of references taken.
pub(super) fn size(loader: &mut EbpfLoader<'_>, spec: &spec::Rli) {
    loader.set_max_entries(maps::RLI_FLOWS, spec.max_flows).set_max_entries(maps::RLI_TAKEN, spec.ring_bytes);
}

/// Writes RLI's shape, before `rli` is chained. Sampled references number on from the
/// shared clock's microseconds, above any a previous pirated's references took (pinned maps
/// are kept across restarts, injected references' numbers are on that clock too).
pub(super) fn configure(ebpf: &mut Ebpf, spec: &spec::Rli) -> anyhow::Result<()> {
    Array::<_, RliShape>::try_from(ebpf.map_mut(maps::RLI_SHAPE).unwrap())?
        .set(0, spec.shape, 0)
        .context("writing RLI_SHAPE")?;
    if spec.shape.sample_below != 0 {
        let mut refs = Array::<_, Reference>::try_from(ebpf.map_mut(maps::RLI_REFS).unwrap())?;
        let newest = refs.get(&RING, 0).context("reading RLI_REFS")?.seq;
        let from = Reference { seq: newest.max(crate::clock::now() / 1000), ..Reference::default() };
        refs.set(RING + 1, from, 0).context("writing RLI_REFS")?;
    }
    Ok(())
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

    /// The references `flows` wait on (each group's first, and the `MAX_SKIP` after its last),
    /// and the newest, as the ring holds them: a few reads, not the whole ring's (thousands of
    /// calls into the kernel, tens of ms on a busy host, which sampled references' delays
    /// would wait for). A slot is read twice and taken only if both reads agree: one being
    /// written reads as a mix of two references.
    pub fn references(&self, flows: &[(FlowKey, Vec<RliFlow>)]) -> anyhow::Result<Vec<Reference>> {
        let newest = self.refs.get(&RING, 0).context("reading RLI_REFS")?.seq;
        let mut wanted: Vec<u64> = flows
            .iter()
            .flat_map(|(_, cpus)| cpus.iter().flat_map(|f| f.waiting.iter().filter(|w| w.packets > 0)))
            .flat_map(|w| std::iter::once(w.seq()).chain((1..=MAX_SKIP).map(move |k| w.last + k)))
            .chain(std::iter::once(newest))
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut out = Vec::with_capacity(wanted.len());
        for seq in wanted.into_iter().filter(|&seq| seq != 0) {
            let i = (seq % RING as u64) as u32;
            let r = self.refs.get(&i, 0).context("reading RLI_REFS")?;
            if r.seq == seq && self.refs.get(&i, 0).ok() == Some(r) {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// A sampled reference's delay (or void), into its slot if the slot still holds it. (Its
    /// slot is overwritten only `RING` references later: far beyond the few ms a delay takes.)
    pub fn resolve(&mut self, r: Reference) -> anyhow::Result<()> {
        let i = (r.seq % RING as u64) as u32;
        if self.refs.get(&i, 0).context("reading RLI_REFS")?.seq == r.seq {
            self.refs.set(i, r, 0).context("writing RLI_REFS")?;
        }
        Ok(())
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
