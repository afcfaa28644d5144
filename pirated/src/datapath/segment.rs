//! The segment's side of the datapath: its banks and cache ring sized, its shape written, and
//! its handle: each half of the per-CPU banks read (merged over CPUs: every aggregate is a sum
//! or an XOR) and cleared, and the packet cache's ring.

use std::os::fd::{AsFd, AsRawFd, RawFd};

use anyhow::Context;
use aya::{
    maps::{Array, MapData, RingBuf},
    Ebpf, EbpfLoader,
};
use pirate_common::{
    maps,
    segment::{lda::LdaCell, rda::RdaBucket, CacheEntry, Seen, SegmentShape},
};

use super::{bpf_call, object, percpu, spec};

/// Sizes the segment's banks and packet cache ring for `spec`.
pub(super) fn size(loader: &mut EbpfLoader<'_>, spec: &spec::Segment) {
    loader
        .set_max_entries(maps::SEGMENT_LDA, spec.lda_entries)
        .set_max_entries(maps::SEGMENT_RDA, spec.rda_entries)
        .set_max_entries(maps::SEGMENT_CACHE, spec.cache_ring_bytes);
}

/// Writes the segment's shape, before the segment program is chained.
pub(super) fn configure(ebpf: &mut Ebpf, spec: &spec::Segment) -> anyhow::Result<()> {
    Array::<_, SegmentShape>::try_from(ebpf.map_mut(maps::SEGMENT_SHAPE).unwrap())?
        .set(0, spec.shape, 0)
        .context("writing SEGMENT_SHAPE")
}

/// One half of a point's banks as read: one interval's record, if the half held only it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Banks {
    pub lda: Vec<LdaCell>,
    pub rda: Vec<RdaBucket>,
    /// Packets recorded in the interval, over all CPUs.
    pub packets: u64,
    /// A CPU recorded a later interval into the half before it was read: the half mixes two.
    pub overrun: bool,
}

/// The segment's maps, taken out of the datapath by the one task that reads them.
pub struct SegmentMaps {
    shape: SegmentShape,
    seen: MapData,
    lda: MapData,
    rda: MapData,
    cache: RingBuf<MapData>,
    cpus: usize,
}

impl SegmentMaps {
    /// Takes the segment's maps out of the object, for banks of `shape`.
    pub(super) fn take(ebpf: &mut Ebpf, shape: SegmentShape, cpus: usize) -> anyhow::Result<SegmentMaps> {
        Ok(SegmentMaps {
            shape,
            seen: object::take_per_cpu(ebpf, maps::SEGMENT_SEEN)?,
            lda: object::take_per_cpu(ebpf, maps::SEGMENT_LDA)?,
            rda: object::take_per_cpu(ebpf, maps::SEGMENT_RDA)?,
            cache: RingBuf::try_from(object::take(ebpf, maps::SEGMENT_CACHE)?)?,
            cpus,
        })
    }

    /// Half `interval & 1`, as interval `interval` left it.
    pub fn read(&self, interval: u64) -> anyhow::Result<Banks> {
        let half = (interval & 1) as u32;
        let mut banks = Banks::default();
        for seen in percpu::values::<Seen>(self.seen.fd().as_fd(), half, self.cpus).context("reading SEGMENT_SEEN")? {
            match seen.interval.cmp(&interval) {
                std::cmp::Ordering::Equal => banks.packets += seen.packets,
                std::cmp::Ordering::Greater => banks.overrun = true,
                std::cmp::Ordering::Less => {}
            }
        }
        banks.lda =
            self.read_half(&self.lda, half, self.shape.lda.cells(), LdaCell::merge).context("reading SEGMENT_LDA")?;
        banks.rda =
            self.read_half(&self.rda, half, self.shape.rda.len(), RdaBucket::merge).context("reading SEGMENT_RDA")?;
        Ok(banks)
    }

    /// Zeroes half `half` of the banks on every CPU, for the interval that writes it next.
    pub fn clear(&self, half: u32) -> anyhow::Result<()> {
        self.clear_half::<LdaCell>(&self.lda, half, self.shape.lda.cells()).context("clearing SEGMENT_LDA")?;
        self.clear_half::<RdaBucket>(&self.rda, half, self.shape.rda.len()).context("clearing SEGMENT_RDA")
    }

    /// Half `half` of the per-CPU array `map` (`n` entries a half), each entry merged over CPUs.
    fn read_half<T: aya::Pod + Default>(
        &self,
        map: &MapData,
        half: u32,
        n: usize,
        merge: fn(T, T) -> T,
    ) -> std::io::Result<Vec<T>> {
        let n = n as u32;
        (half * n..(half + 1) * n)
            .map(|i| Ok(percpu::values::<T>(map.fd().as_fd(), i, self.cpus)?.into_iter().fold(T::default(), merge)))
            .collect()
    }

    /// Zeroes half `half` of the per-CPU array `map` of `T` (`n` entries a half) on every CPU.
    fn clear_half<T: aya::Pod + Default>(&self, map: &MapData, half: u32, n: usize) -> std::io::Result<()> {
        let zero = vec![T::default(); self.cpus];
        let n = n as u32;
        for i in half * n..(half + 1) * n {
            // SAFETY: one T per possible CPU, the map's value.
            unsafe { bpf_call::update(map.fd().as_fd(), i, &zero) }?;
        }
        Ok(())
    }

    /// The descriptor that becomes readable when cached packets arrive.
    pub fn cache_fd(&self) -> RawFd {
        self.cache.as_raw_fd()
    }

    /// Every cached packet waiting in the ring, to `f`.
    pub fn drain_cache(&mut self, mut f: impl FnMut(CacheEntry)) {
        while let Some(item) = self.cache.next() {
            if item.len() >= size_of::<CacheEntry>() {
                // SAFETY: the datapath writes whole entries; read unaligned from ring memory.
                f(unsafe { std::ptr::read_unaligned(item.as_ptr() as *const CacheEntry) });
            }
        }
    }
}
