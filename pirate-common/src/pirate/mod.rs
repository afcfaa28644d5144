//! Pirate: response latency from client→server packets only. Per flow, Alg. 1 (causal pairs)
//! and Alg. 2 (inter-packet-gap modes) with the §3.4 heuristics, in the kernel and in replay.

pub mod batch_break;
pub mod config;
pub mod flow;
pub mod grid;
pub mod layout;
pub mod modes;
pub mod protocol;
pub mod table;
pub mod tracker;

use crate::{
    ctx::PacketCtx,
    parse::{IPPROTO_TCP, IPPROTO_UDP},
};

/// Whether `pirate` measures the packet: TCP and UDP flows, not the ICMP echoes the parser keeps
/// for the fridge.
#[inline(always)]
pub fn measures(pkt: &PacketCtx) -> bool {
    pkt.key.proto == IPPROTO_TCP || pkt.key.proto == IPPROTO_UDP
}

#[cfg(feature = "user")]
mod pod {
    //! aya copies these in and out of maps as plain data: only the two layouts the datapath
    //! uses, whose sizes are checked to have no padding.
    use super::{
        config::{Params, MODES_COMPACT as C, MODES_WIDE as W},
        flow::FlowState,
        table::{Set, WAYS},
    };
    unsafe impl aya::Pod for Params {}
    unsafe impl aya::Pod for FlowState<C> {}
    unsafe impl aya::Pod for FlowState<W> {}
    unsafe impl aya::Pod for Set<C> {}
    unsafe impl aya::Pod for Set<W> {}
    const _: () = assert!(size_of::<Params>() == 56);
    const _: () = assert!(size_of::<FlowState<C>>() == 44 + 10 * C + 4);
    const _: () = assert!(size_of::<FlowState<W>>() == 44 + 10 * W + 4);
    const _: () = assert!(size_of::<FlowState<C>>() == 148);
    const _: () = assert!(size_of::<Set<C>>() == WAYS * (16 + size_of::<FlowState<C>>()));
    const _: () = assert!(size_of::<Set<W>>() == WAYS * (16 + size_of::<FlowState<W>>()));
}
