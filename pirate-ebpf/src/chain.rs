//! The only code that tail-calls: from a `CHAIN` slot on, then the `FORWARD` slots, as Katran's
//! root tries its array. A tail call returns only if its slot is empty (or the call failed), so
//! each attempt that returns moves on to the next slot; with none left the packet passes.

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use pirate_common::{
    counters,
    ctx::{CHAIN_SLOTS, FORWARD_SLOTS},
};

use crate::maps::{count, CHAIN, FORWARD};

/// Hands the packet to the first filled `CHAIN` slot from `first` on, else to [`forward`].
#[inline(always)]
pub fn from(ctx: &XdpContext, first: u32) -> u32 {
    for slot in first..CHAIN_SLOTS {
        // SAFETY: returns only if the slot is empty or the call fails.
        unsafe { CHAIN.tail_call(ctx, slot) };
    }
    forward(ctx)
}

/// Hands the packet to the first registered forwarder, else passes it (counted).
#[inline(always)]
pub fn forward(ctx: &XdpContext) -> u32 {
    for slot in 0..FORWARD_SLOTS {
        // SAFETY: as above.
        unsafe { FORWARD.tail_call(ctx, slot) };
    }
    count(counters::EVENT_NO_TAIL_CALL);
    xdp_action::XDP_PASS
}
