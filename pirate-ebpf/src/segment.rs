//! `segment`, the `CHAIN_SEGMENT` capability: records each packet into its interval's LDA and
//! RDA banks and hands the RDA's packets to pirated's cache (`pirate_common::segment`, the one
//! copy of that step). Timestamps are TAI, the clock two synchronised points share.

use aya_ebpf::{helpers::bpf_ktime_get_tai_ns, macros::xdp, programs::XdpContext};
use pirate_common::{
    counters,
    ctx::{PacketCtx, CHAIN_SEGMENT},
    identity::identity,
    segment::{lda::LdaCell, packet, rda::RdaBucket, CacheEntry, Cached, Seen, Store},
};

use crate::{
    chain,
    maps::{count, SEGMENT_CACHE, SEGMENT_LDA, SEGMENT_RDA, SEGMENT_SEEN, SEGMENT_SHAPE},
    root::{parsed, Packet},
};

#[xdp]
pub fn segment(ctx: XdpContext) -> u32 {
    let Some(pkt) = parsed(&ctx) else { return chain::forward(&ctx) };
    step(&ctx, pkt);
    chain::from(&ctx, CHAIN_SEGMENT + 1)
}

#[inline(always)]
fn step(ctx: &XdpContext, pkt: &PacketCtx) {
    let Some(shape) = SEGMENT_SHAPE.get(0) else { return };
    if shape.interval_ns == 0 {
        return;
    }
    let id = identity(&Packet(ctx), pkt);
    // SAFETY: a helper without arguments.
    let ts = unsafe { bpf_ktime_get_tai_ns() };
    count(counters::EVENT_SEGMENT_RECORDED);
    if packet(shape, id, ts, &mut Maps) == Cached::Lost {
        count(counters::EVENT_SEGMENT_CACHE_LOST);
    }
}

/// The banks in their per-CPU maps: nothing else writes this CPU's values.
struct Maps;

impl Store for Maps {
    #[inline(always)]
    fn seen(&mut self, half: u32) -> Option<&mut Seen> {
        // SAFETY: this CPU's value.
        SEGMENT_SEEN.get_ptr_mut(half).map(|p| unsafe { &mut *p })
    }

    #[inline(always)]
    fn lda(&mut self, index: u32) -> Option<&mut LdaCell> {
        // SAFETY: as above.
        SEGMENT_LDA.get_ptr_mut(index).map(|p| unsafe { &mut *p })
    }

    #[inline(always)]
    fn rda(&mut self, index: u32) -> Option<&mut RdaBucket> {
        // SAFETY: as above.
        SEGMENT_RDA.get_ptr_mut(index).map(|p| unsafe { &mut *p })
    }

    #[inline(always)]
    fn cache(&mut self, entry: CacheEntry) -> bool {
        SEGMENT_CACHE.output::<CacheEntry>(&entry, 0).is_ok()
    }
}
