//! `pirate_lb`, the built-in forwarder in a `FORWARD` slot: a packet to a VIP goes to the real
//! its flow holds in the connection table, or, for a new flow, the real of its entry in the VIP's
//! live ring (`pirate_common::lb`); it leaves IPIP-encapsulated towards that real, which answers
//! the client directly (DSR). Everything else passes untouched.

use core::mem::MaybeUninit;

use aya_ebpf::{
    bindings::{bpf_fib_lookup, xdp_action},
    helpers::{bpf_fib_lookup as fib_lookup, bpf_redirect, bpf_xdp_adjust_head},
    macros::xdp,
    programs::XdpContext,
};
use pirate_common::{
    counters,
    ctx::PacketCtx,
    lb::{ipip_header, ring_index, LbShape, VipKey, EGRESS_KERNEL, IPIP_HEADER},
    parse::Frame,
    zero::zero,
};

use crate::{
    maps::{count, LB_CONNS, LB_COUNTERS, LB_HALVES, LB_REALS, LB_RINGS, LB_SHAPE, LB_VIPS},
    root::{parsed_to_forward, Packet},
};

const ETH_HEADER: usize = 14;
const AF_INET: u8 = 2;
const BPF_FIB_LKUP_RET_SUCCESS: i64 = 0;

#[xdp]
pub fn pirate_lb(ctx: XdpContext) -> u32 {
    let Some(pkt) = parsed_to_forward(&ctx) else { return xdp_action::XDP_PASS };
    let Some(vip) = VipKey::of(&pkt.key) else { return xdp_action::XDP_PASS };
    // SAFETY: a value pirated writes once, before the VIP is live.
    let Some(&number) = (unsafe { LB_VIPS.get(&vip) }) else { return xdp_action::XDP_PASS };
    match send(&ctx, pkt, number) {
        Some(action) => action,
        None => {
            count(counters::EVENT_LB_UNFORWARDED);
            xdp_action::XDP_PASS
        }
    }
}

/// Encapsulates the packet towards its flow's real and sends it; `None` leaves it as it was (the
/// bounds checks after the head moved cannot fail: the frame only grew).
#[inline(always)]
fn send(ctx: &XdpContext, pkt: &PacketCtx, vip: u32) -> Option<u32> {
    let shape = LB_SHAPE.get(0)?;
    // Tagged frames would need their tags moved: not taken.
    if pkt.l3_off as usize != ETH_HEADER || shape.ring_size == 0 {
        return None;
    }
    let id = pkt.id;
    // SAFETY: a u32 copied out at once.
    let (real, new) = match unsafe { LB_CONNS.get(&id) } {
        Some(&real) => (real, false),
        None => {
            let half = *LB_HALVES.get(vip)?;
            let real = *LB_RINGS.get(ring_index(vip, half, pkt.hash, shape.ring_size))?;
            // An LRU table makes room by evicting the least recently used flow.
            let _ = LB_CONNS.insert(&id, &real, 0);
            (real, true)
        }
    };
    let dst = *LB_REALS.get(real)?;
    if dst == [0; 4] {
        return None;
    }
    let inner: [u8; 4] = Packet(ctx).read(ETH_HEADER)?;
    let inner_len = u16::from_be_bytes([inner[2], inner[3]]);
    let macs: [u8; 12] = Packet(ctx).read(0)?;
    // SAFETY: the helper only moves the frame's start (checked by the kernel).
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(IPIP_HEADER as i32)) } != 0 {
        return None;
    }
    // From here on the frame is the encapsulated one: every path below sends or passes it.
    write(ctx, 0, &macs)?;
    write(ctx, 12, &0x0800u16.to_be_bytes())?;
    write(ctx, ETH_HEADER, &ipip_header(shape.tunnel_source, dst, inner_len, inner[1]))?;
    if let Some(c) = LB_COUNTERS.get_ptr_mut(real) {
        // SAFETY: this CPU's slot.
        let c = unsafe { &mut *c };
        c.packets += 1;
        c.bytes += inner_len as u64;
        c.connections += new as u64;
    }
    Some(egress(ctx, shape, dst, inner_len, inner[1]))
}

/// Sends the encapsulated frame where the kernel's routes say, from XDP, or passes it to the
/// kernel to route when the forwarder cannot (no neighbour entry yet, a link too small).
#[inline(always)]
fn egress(ctx: &XdpContext, shape: &LbShape, dst: [u8; 4], inner_len: u16, tos: u8) -> u32 {
    if shape.flags & EGRESS_KERNEL != 0 {
        count(counters::EVENT_LB_ROUTED);
        return xdp_action::XDP_PASS;
    }
    // Zeroed in place: a zeroed value moved into it came out of LLVM a byte loop again.
    let mut fib = MaybeUninit::<bpf_fib_lookup>::uninit();
    // SAFETY: plain data; zero is every field's "unset".
    let fib = unsafe {
        zero(fib.as_mut_ptr());
        fib.assume_init_mut()
    };
    fib.family = AF_INET;
    fib.l4_protocol = 4;
    fib.__bindgen_anon_1.tot_len = inner_len.saturating_add(IPIP_HEADER as u16);
    fib.__bindgen_anon_2.tos = tos;
    fib.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes(shape.tunnel_source);
    fib.__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes(dst);
    let ingress = ctx.ingress_ifindex() as u32;
    fib.ifindex = ingress;
    // SAFETY: a live context and a lookup struct of the size passed.
    let ret = unsafe { fib_lookup(ctx.ctx as *mut _, fib, size_of::<bpf_fib_lookup>() as i32, 0) };
    let mut macs = [0u8; 12];
    macs[..6].copy_from_slice(&fib.dmac);
    macs[6..].copy_from_slice(&fib.smac);
    if ret != BPF_FIB_LKUP_RET_SUCCESS || write(ctx, 0, &macs).is_none() {
        count(counters::EVENT_LB_ROUTED);
        return xdp_action::XDP_PASS;
    }
    count(counters::EVENT_LB_FORWARDED);
    if fib.ifindex == ingress {
        return xdp_action::XDP_TX;
    }
    // SAFETY: a helper taking plain values.
    unsafe { bpf_redirect(fib.ifindex, 0) as u32 }
}

#[inline(always)]
fn write<T: Copy>(ctx: &XdpContext, off: usize, v: &T) -> Option<()> {
    let at = ctx.data() + off;
    if at + size_of::<T>() > ctx.data_end() {
        return None;
    }
    // SAFETY: bounds checked against data_end just above.
    unsafe { core::ptr::write_unaligned(at as *mut T, *v) };
    Some(())
}
