//! The segment's maps out of the live datapath: each half of the per-CPU banks read (merged
//! over CPUs: every aggregate is a sum or an XOR) and cleared, and the packet cache's ring.

use std::os::fd::{AsFd, AsRawFd, RawFd};

use anyhow::{bail, Context};
use aya::maps::{Map, MapData, RingBuf};
use pirate_common::{
    maps,
    segment::{lda::LdaCell, rda::RdaBucket, CacheEntry, Seen, SegmentShape},
};

use super::{bpf_call, percpu, Datapath};

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

impl Datapath {
    /// Hands the segment's maps over (once).
    pub fn take_segment(&mut self, shape: SegmentShape) -> anyhow::Result<SegmentMaps> {
        let per_cpu = |dp: &mut Datapath, name| match dp.take_map(name)? {
            Map::PerCpuArray(d) => Ok(d),
            _ => bail!("{name} is not a per-CPU array: pirated and its XDP object were built apart"),
        };
        Ok(SegmentMaps {
            shape,
            seen: per_cpu(self, maps::SEGMENT_SEEN)?,
            lda: per_cpu(self, maps::SEGMENT_LDA)?,
            rda: per_cpu(self, maps::SEGMENT_RDA)?,
            cache: RingBuf::try_from(self.take_map(maps::SEGMENT_CACHE)?)?,
            cpus: self.cpus,
        })
    }
}

impl SegmentMaps {
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
        let (lda_n, rda_n) = (self.shape.lda.cells() as u32, self.shape.rda.len() as u32);
        let fd = self.lda.fd().as_fd();
        for i in half * lda_n..(half + 1) * lda_n {
            let cell = percpu::values::<LdaCell>(fd, i, self.cpus).context("reading SEGMENT_LDA")?.into_iter().fold(
                LdaCell::default(),
                |a, c| LdaCell {
                    ts_sum: a.ts_sum.wrapping_add(c.ts_sum),
                    count: a.count + c.count,
                    id_xor: a.id_xor ^ c.id_xor,
                },
            );
            banks.lda.push(cell);
        }
        let fd = self.rda.fd().as_fd();
        for i in half * rda_n..(half + 1) * rda_n {
            let bucket = percpu::values::<RdaBucket>(fd, i, self.cpus)
                .context("reading SEGMENT_RDA")?
                .into_iter()
                .fold(RdaBucket::default(), |a, b| RdaBucket {
                    id_xor: a.id_xor ^ b.id_xor,
                    ts_sum: a.ts_sum.wrapping_add(b.ts_sum),
                    count: a.count + b.count,
                });
            banks.rda.push(bucket);
        }
        Ok(banks)
    }

    /// Zeroes half `half` of the banks on every CPU, for the interval that writes it next.
    pub fn clear(&self, half: u32) -> anyhow::Result<()> {
        let (lda_n, rda_n) = (self.shape.lda.cells() as u32, self.shape.rda.len() as u32);
        let zero_lda = vec![LdaCell::default(); self.cpus];
        for i in half * lda_n..(half + 1) * lda_n {
            // SAFETY: one LdaCell per possible CPU, the map's value.
            unsafe { bpf_call::update(self.lda.fd().as_fd(), i, &zero_lda) }.context("clearing SEGMENT_LDA")?;
        }
        let zero_rda = vec![RdaBucket::default(); self.cpus];
        for i in half * rda_n..(half + 1) * rda_n {
            // SAFETY: one RdaBucket per possible CPU, the map's value.
            unsafe { bpf_call::update(self.rda.fd().as_fd(), i, &zero_rda) }.context("clearing SEGMENT_RDA")?;
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
