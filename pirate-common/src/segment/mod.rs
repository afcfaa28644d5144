//! Two-point one-way latency (LDA and RDA): what the upstream and downstream points record per
//! packet, computed identically at both, in the kernel and in replay.
//!
//! A packet is known at both points by its 64-bit identity (a hash of fields that do not change
//! in flight); every choice a point makes for a packet (sampled or not, which bank, row or
//! bucket, which sign) is a hash of that identity, so both points make the same choices.

pub mod lda;
pub mod rda;

use crate::hash::seeded;
use lda::{LdaCell, LdaShape};
use rda::{RdaBucket, RdaShape};

/// `SegmentShape::flags`: the LDA banks record.
pub const LDA: u32 = 1;
/// `SegmentShape::flags`: the RDA banks and the packet cache record.
pub const RDA: u32 = 2;

/// Seed of the hash that samples packets into the RDA and its cache.
const SAMPLE_SEED: u64 = 0x5344_4173_616d_706c; // "RDAsampl"

/// What a point records, the same at both: measurement interval `i` is
/// `[i * interval_ns, (i + 1) * interval_ns)` on the points' shared clock (TAI), so that both
/// cut the stream at the same instants without a control message (RDA §III-A). Every bank
/// array has two halves, by interval parity: the datapath writes one while pirated reads and
/// clears the other.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentShape {
    /// 0: the segment capability is off.
    pub interval_ns: u64,
    pub lda: LdaShape,
    pub rda: RdaShape,
    /// The RDA and its cache take the packets whose sampling hash has at least this many
    /// leading zeros (a share of 2^-`sample_zeros`), the same ones at both points.
    pub sample_zeros: u32,
    pub flags: u32,
    pub _pad: u32,
}

const _: () = assert!(size_of::<SegmentShape>() == 40);

/// How many packets one CPU recorded into a half, and for which interval: the datapath starts
/// a half's count again when its packet belongs to another interval than the one counted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    pub interval: u64,
    pub packets: u64,
}

/// A packet the RDA took, for its point's packet cache (pirated keeps it by interval): the
/// timestamps of the packets only one point saw repair the RDA.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheEntry {
    pub id: u64,
    pub ts: u64,
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for SegmentShape {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for Seen {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for CacheEntry {}

impl SegmentShape {
    /// The interval a packet at `ts` belongs to.
    #[inline(always)]
    pub fn interval(&self, ts: u64) -> u64 {
        ts / self.interval_ns
    }

    /// Whether the RDA and its cache take packet `id`.
    #[inline(always)]
    pub fn sampled(&self, id: u64) -> bool {
        seeded(SAMPLE_SEED, id).leading_zeros() >= self.sample_zeros
    }
}

/// Where a point's record lives: the datapath's maps, or replay's vectors. Indices are into the
/// whole array, both halves.
pub trait Store {
    fn seen(&mut self, half: u32) -> Option<&mut Seen>;
    fn lda(&mut self, index: u32) -> Option<&mut LdaCell>;
    fn rda(&mut self, index: u32) -> Option<&mut RdaBucket>;
    /// Hands a cached packet to pirated; whether it went (a full ring drops it).
    fn cache(&mut self, entry: CacheEntry) -> bool;
}

/// What [`packet`] did beyond recording, for the datapath's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cached {
    No,
    Sent,
    Lost,
}

/// Records packet `id` seen at `ts` into the half of its interval's parity.
#[inline(always)]
pub fn packet<S: Store>(shape: &SegmentShape, id: u64, ts: u64, store: &mut S) -> Cached {
    if shape.interval_ns == 0 {
        return Cached::No;
    }
    let interval = shape.interval(ts);
    let half = (interval & 1) as u32;
    if let Some(seen) = store.seen(half) {
        if seen.interval != interval {
            *seen = Seen { interval, packets: 0 };
        }
        seen.packets += 1;
    }
    if shape.flags & LDA != 0 {
        if let Some(c) = shape.lda.cell(id) {
            if let Some(cell) = store.lda(half * shape.lda.cells() as u32 + c) {
                cell.add(id, ts);
            }
        }
    }
    if shape.flags & RDA == 0 || !shape.sampled(id) {
        return Cached::No;
    }
    let base = half * shape.rda.len() as u32;
    for bank in 0..rda::MAX_BANKS as u32 {
        if bank < shape.rda.banks {
            if let Some(bucket) = store.rda(base + shape.rda.bucket(bank, id)) {
                bucket.update(id, ts, 1);
            }
        }
    }
    match store.cache(CacheEntry { id, ts }) {
        true => Cached::Sent,
        false => Cached::Lost,
    }
}
