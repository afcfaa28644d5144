//! `rli`, the `CHAIN_RLI` capability at the downstream point: takes the reference packets out
//! of the traffic (their delay kept, the packet dropped; forged, replayed or stale ones dropped
//! and counted, never used) and puts every other packet into its flow's counters
//! (`pirate_common::rli`, the one copy of that step).

use core::{
    intrinsics::{atomic_xadd, AtomicOrdering::Relaxed},
    ptr::{read_volatile, write_volatile},
};

use aya_ebpf::{
    bindings::{xdp_action, BPF_NOEXIST},
    helpers::bpf_ktime_get_tai_ns,
    macros::xdp,
    programs::XdpContext,
};
use pirate_common::{
    counters,
    ctx::{PacketCtx, CHAIN_RLI},
    key::FlowKey,
    rli::{flow::RliFlow, packet, reference::Window, Flows, Reference, References, Taken, Verdict, RING},
};

use crate::{
    chain,
    maps::{count, RLI_FLOWS, RLI_REFS, RLI_SHAPE, RLI_TAKEN, RLI_WINDOW},
    root::{parsed, Packet},
};

#[xdp]
pub fn rli(ctx: XdpContext) -> u32 {
    let Some(pkt) = parsed(&ctx) else { return chain::forward(&ctx) };
    match step(&ctx, pkt) {
        Verdict::Regular => chain::from(&ctx, CHAIN_RLI + 1),
        Verdict::Sampled => {
            count(counters::EVENT_RLI_SAMPLED);
            chain::from(&ctx, CHAIN_RLI + 1)
        }
        Verdict::SampledLost => {
            count(counters::EVENT_RLI_SAMPLED_LOST);
            chain::from(&ctx, CHAIN_RLI + 1)
        }
        verdict => {
            count(match verdict {
                Verdict::Taken => counters::EVENT_RLI_TAKEN,
                Verdict::Lost => counters::EVENT_RLI_TAKEN_LOST,
                Verdict::Forged => counters::EVENT_RLI_FORGED,
                Verdict::Replayed => counters::EVENT_RLI_REPLAYED,
                _ => counters::EVENT_RLI_STALE,
            });
            xdp_action::XDP_DROP
        }
    }
}

#[inline(always)]
fn step(ctx: &XdpContext, pkt: &PacketCtx) -> Verdict {
    let Some(shape) = RLI_SHAPE.get(0) else { return Verdict::Regular };
    // SAFETY: a helper without arguments.
    let tai = || unsafe { bpf_ktime_get_tai_ns() };
    packet(shape, pkt, &Packet(ctx), tai, &mut Maps, &mut Maps)
}

/// The references in their shared maps. One CPU writes a reference while others may read it:
/// its slot's sequence number is cleared first and written last, and a reader takes the slot
/// only if it reads the same sequence number before and after the rest, so a slot half
/// written is not taken (x86 keeps stores in order; volatile keeps the compiler from moving
/// them; a weakly ordered CPU, arm64, gives no such promise without barriers, and a reader
/// there may take a slot mid-write: one reference's time with another's number, rarely). The
/// newest's number is written after its slot, and is not compared and set atomically: two
/// CPUs taking references at once (a replayed copy racing its original) may set it back by one.
/// A sampled reference's number is an atomic add then a read (the backend has no
/// fetch-and-add): two CPUs sampling at the same instant may read the same number. The slot
/// then keeps one of the two, and pirated writes each one's delay with its own arrival, so the
/// slot always pairs an arrival with its delay (of packets nanoseconds apart).
struct Maps;

impl Maps {
    #[inline(always)]
    fn slot(index: u32) -> Option<*mut Reference> {
        RLI_REFS.get_ptr_mut(index)
    }
}

impl References for Maps {
    #[inline(always)]
    fn newest(&self) -> u64 {
        // SAFETY: a live map value, read whole-word.
        Self::slot(RING).map_or(0, |p| unsafe { read_volatile(&(*p).seq) })
    }

    #[inline(always)]
    fn get(&self, seq: u64) -> Option<Reference> {
        let p = Self::slot((seq % RING as u64) as u32)?;
        // SAFETY: as above; see the type's note.
        unsafe {
            let (before, at_ns, delay_ns) =
                (read_volatile(&(*p).seq), read_volatile(&(*p).at_ns), read_volatile(&(*p).delay_ns));
            (before == seq && read_volatile(&(*p).seq) == seq).then_some(Reference { seq, at_ns, delay_ns })
        }
    }

    #[inline(always)]
    fn put(&mut self, r: Reference) {
        let (Some(p), Some(newest)) = (Self::slot((r.seq % RING as u64) as u32), Self::slot(RING)) else { return };
        // SAFETY: as above.
        unsafe {
            write_volatile(&mut (*p).seq, 0);
            write_volatile(&mut (*p).at_ns, r.at_ns);
            write_volatile(&mut (*p).delay_ns, r.delay_ns);
            write_volatile(&mut (*p).seq, r.seq);
            if r.seq > read_volatile(&(*newest).seq) {
                write_volatile(&mut (*newest).seq, r.seq);
            }
        }
    }

    #[inline(always)]
    fn number(&mut self) -> u64 {
        let Some(p) = Self::slot(RING + 1) else { return 0 };
        // SAFETY: a live, 8-byte aligned map value; see the type's note.
        unsafe {
            atomic_xadd::<u64, u64, { Relaxed }>(&raw mut (*p).seq, 1);
            read_volatile(&(*p).seq)
        }
    }

    #[inline(always)]
    fn window(&mut self) -> Option<&mut Window> {
        // SAFETY: a live map value (see `Window` on CPUs writing it at once).
        RLI_WINDOW.get_ptr_mut(0).map(|p| unsafe { &mut *p })
    }

    #[inline(always)]
    fn taken(&mut self, taken: Taken) -> bool {
        RLI_TAKEN.output::<Taken>(&taken, 0).is_ok()
    }
}

impl Flows for Maps {
    #[inline(always)]
    fn flow(&mut self, key: &FlowKey) -> Option<&mut RliFlow> {
        if let Some(p) = RLI_FLOWS.get_ptr_mut(key) {
            // SAFETY: this CPU's value.
            return Some(unsafe { &mut *p });
        }
        if RLI_FLOWS.insert(key, &RliFlow::default(), BPF_NOEXIST as u64).is_ok() {
            count(counters::EVENT_RLI_FLOW_INSERTED);
        }
        // SAFETY: as above.
        RLI_FLOWS.get_ptr_mut(key).map(|p| unsafe { &mut *p })
    }
}
