//! Programs that only `cargo xtask bench datapath` loads: the bare XDP_PASS baseline, and the
//! parts of what the root and the chain's first program do, one at a time, so that their cost
//! can be taken apart (docs/cost.md).

use aya_ebpf::{bindings::xdp_action, helpers::bpf_ktime_get_ns, macros::xdp, programs::XdpContext};
use pirate_common::{counters, ctx::UNREAD, parse::parse};

use crate::{
    chain,
    maps::{count, CTX},
    root::{parsed, Packet},
};

/// The baseline: an XDP program that only passes.
#[xdp]
pub fn bare_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

/// The clock read.
#[xdp]
pub fn bench_clock(_ctx: XdpContext) -> u32 {
    // SAFETY: a helper without arguments.
    let ts = unsafe { bpf_ktime_get_ns() };
    // The verdict depends on the read, so that it stays.
    if ts == 0 {
        xdp_action::XDP_DROP
    } else {
        xdp_action::XDP_PASS
    }
}

/// The per-CPU context's lookup and the parse into it.
#[xdp]
pub fn bench_parse(ctx: XdpContext) -> u32 {
    let Some(pkt) = CTX.get_ptr_mut(0) else { return xdp_action::XDP_PASS };
    // SAFETY: this CPU's slot.
    let pkt = unsafe { &mut *pkt };
    let _ = parse(&Packet(&ctx), pkt);
    xdp_action::XDP_PASS
}

/// What the chain's first program pays once a packet (`root::parsed`): the parse, the clock,
/// the seed's lookup, the flow hash and id.
#[xdp]
pub fn bench_read(ctx: XdpContext) -> u32 {
    let Some(pkt) = CTX.get_ptr_mut(0) else { return xdp_action::XDP_PASS };
    // SAFETY: this CPU's slot.
    unsafe { (*pkt).outcome = UNREAD };
    match parsed(&ctx) {
        Some(_) => xdp_action::XDP_PASS,
        None => xdp_action::XDP_DROP,
    }
}

/// One counter's increment.
#[xdp]
pub fn bench_count(_ctx: XdpContext) -> u32 {
    count(counters::EVENT_NO_TAIL_CALL);
    xdp_action::XDP_PASS
}

/// The tail calls into every slot, empty while it runs, and the counter of a packet none took.
#[xdp]
pub fn bench_empty_slots(ctx: XdpContext) -> u32 {
    chain::from(&ctx, 0)
}
