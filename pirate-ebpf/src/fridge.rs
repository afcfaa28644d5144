//! `fridge`, the `CHAIN_FRIDGE` capability: offers each request of an enabled class to its
//! fridge and sends each matched response's sample to pirated
//! (`pirate_common::fridge`, the one copy of that step).

use core::{
    intrinsics::{atomic_xadd, AtomicOrdering::Relaxed},
    ptr::NonNull,
};

use aya_ebpf::{helpers::bpf_get_prandom_u32, macros::xdp, programs::XdpContext};
use pirate_common::{
    counters,
    ctx::{PacketCtx, CHAIN_FRIDGE},
    fridge::{packet, Sample, Slot, Store, MAX_FRIDGES},
};

use crate::{
    chain,
    maps::{count, FRIDGE_OFFERED, FRIDGE_SAMPLES, FRIDGE_SHAPE, FRIDGE_SLOTS},
    root::parsed,
};

#[xdp]
pub fn fridge(ctx: XdpContext) -> u32 {
    let Some(pkt) = parsed(&ctx) else { return chain::forward(&ctx) };
    step(pkt);
    chain::from(&ctx, CHAIN_FRIDGE + 1)
}

#[inline(always)]
fn step(pkt: &PacketCtx) {
    let Some(shape) = FRIDGE_SHAPE.get(0) else { return };
    packet(shape, pkt, &mut Maps, |sample| {
        count(match FRIDGE_SAMPLES.output::<Sample>(&sample, 0) {
            Ok(()) => counters::EVENT_FRIDGE_SAMPLE_SENT,
            Err(_) => counters::EVENT_FRIDGE_SAMPLE_LOST,
        })
    });
}

/// The fridges in their maps. Every CPU writes the slots; a slot two CPUs write at once may
/// mix two requests, which then match neither response (a pair lost, as by overwriting).
struct Maps;

impl Maps {
    #[inline(always)]
    fn counter(k: usize) -> Option<NonNull<u64>> {
        NonNull::new(FRIDGE_OFFERED.get_ptr_mut((k & (MAX_FRIDGES - 1)) as u32)?)
    }
}

impl Store for Maps {
    #[inline(always)]
    fn slot(&mut self, index: u32) -> Option<&mut Slot> {
        // SAFETY: a live map value (see the type's note on concurrent writers).
        FRIDGE_SLOTS.get_ptr_mut(index).map(|p| unsafe { &mut *p })
    }

    /// An atomic add (the counter is every CPU's), then a read: with `--cpu generic` the BPF
    /// backend has no fetch-and-add (and the target no compare-and-swap, hence no
    /// `AtomicU64`). The count read may hold other CPUs' requests of the same instant too.
    #[inline(always)]
    fn offer(&mut self, k: usize) -> u64 {
        let Some(c) = Self::counter(k) else { return 0 };
        // SAFETY: a live, 8-byte aligned map value.
        unsafe { atomic_xadd::<u64, u64, { Relaxed }>(c.as_ptr(), 1) };
        self.offered(k)
    }

    #[inline(always)]
    fn offered(&self, k: usize) -> u64 {
        // SAFETY: as above; an aligned 8-byte load is whole (the backend cannot select an
        // atomic load).
        Self::counter(k).map_or(0, |c| unsafe { c.as_ptr().read_volatile() })
    }

    #[inline(always)]
    fn random(&mut self) -> u32 {
        // SAFETY: a helper without arguments.
        unsafe { bpf_get_prandom_u32() }
    }
}
