//! `pirate_root`, the program attached to the interface, which starts the chain, and the
//! frame's parse into the per-CPU `CTX` that the first program needing it runs, once a packet. A
//! frame the parser rejects is counted and skips the measuring programs, but still reaches the
//! forwarders.

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, generated::bpf_xdp_load_bytes},
    macros::xdp,
    programs::XdpContext,
};
use pirate_common::{
    counters,
    ctx::{PacketCtx, PARSED, UNREAD},
    hash::FLOW_SEED,
    key::FlowId,
    parse::{parse, Frame, Reject},
};

use crate::{
    chain,
    maps::{count, CTX, SEED},
};

/// The frame, as the parser (and `pirate_lb`) reads it.
pub struct Packet<'a>(pub &'a XdpContext);

impl Frame for Packet<'_> {
    #[inline(always)]
    fn read<T: Copy>(&self, off: usize) -> Option<T> {
        let start = self.0.data();
        let end = self.0.data_end();
        if start + off + core::mem::size_of::<T>() > end {
            return None;
        }
        // SAFETY: bounds checked against data_end just above.
        Some(unsafe { core::ptr::read_unaligned((start + off) as *const T) })
    }

    #[inline(always)]
    fn chunk<const N: usize>(&self, off: usize) -> Option<[u8; N]> {
        let mut buf = [0u8; N];
        // SAFETY: the helper writes at most N bytes into buf, and fails past the frame's end.
        let read = unsafe { bpf_xdp_load_bytes(self.0.ctx, off as u32, buf.as_mut_ptr() as *mut _, N as u32) };
        (read == 0).then_some(buf)
    }
}

/// Starts the chain. It only marks this CPU's context unread: the parse, the clock read and
/// the flow's hash are paid by the first program that needs them ([`parsed`]), so an
/// interface with every slot empty pays only the tail calls.
#[xdp]
pub fn pirate_root(ctx: XdpContext) -> u32 {
    // A one-entry array always has entry 0; the check is for the verifier.
    let Some(pkt) = CTX.get_ptr_mut(0) else { return chain::forward(&ctx) };
    // SAFETY: this CPU's slot; nothing else runs on it until this packet leaves the chain.
    unsafe { (*pkt).outcome = UNREAD };
    chain::from(&ctx, 0)
}

/// This packet's context, read on the first call of the chain (see [`pirate_root`]): parsed,
/// stamped, its flow hashed. `None` for a frame the parser rejects (counted once, by the call
/// that parsed it): the caller skips the measuring programs and goes to the forwarders.
#[inline(always)]
pub fn parsed(ctx: &XdpContext) -> Option<&'static mut PacketCtx> {
    read_once(ctx, true)
}

/// [`parsed`] for a forwarder, the chain's last program: where it is the first to read the
/// context (no capability measured the packet), it skips the clock read (about 40 ns), since no
/// program after it needs the arrival time; `ts_ns` is then 0.
#[inline(always)]
pub fn parsed_to_forward(ctx: &XdpContext) -> Option<&'static mut PacketCtx> {
    read_once(ctx, false)
}

#[inline(always)]
fn read_once(ctx: &XdpContext, stamped: bool) -> Option<&'static mut PacketCtx> {
    // SAFETY: this CPU's slot, as in the root.
    let pkt = unsafe { &mut *CTX.get_ptr_mut(0)? };
    if pkt.outcome == UNREAD {
        read(ctx, pkt, stamped);
    }
    (pkt.outcome == PARSED).then_some(pkt)
}

/// The parse, the arrival time (if `stamped`) and the flow's hash and id, or the rejection
/// counted.
#[inline(always)]
fn read(ctx: &XdpContext, pkt: &mut PacketCtx, stamped: bool) {
    let parsed = parse(&Packet(ctx), pkt);
    // SAFETY: a helper without arguments.
    pkt.ts_ns = if stamped { unsafe { bpf_ktime_get_ns() } } else { 0 };
    match parsed {
        Ok(()) => {
            let seed = SEED.get(0).copied().unwrap_or(FLOW_SEED);
            pkt.hash = pkt.key.flow_hash(seed);
            pkt.id = FlowId::of(&pkt.key, seed);
            pkt.outcome = PARSED;
        }
        Err(reject) => {
            pkt.outcome = reject as u8;
            count(match reject {
                Reject::NotIp => counters::NOT_IP,
                Reject::Malformed => counters::MALFORMED,
                Reject::Unsupported => counters::UNSUPPORTED,
            });
        }
    }
}
