//! Everything the XDP program and pirated must agree on, and the per-packet logic both run.
//!
//! `no_std`, allocation-free and loop-bounded so the same code passes the eBPF verifier inside
//! `pirate-ebpf` and runs unchanged in pirated's pcap replay: the kernel path and the userspace
//! path can then be checked against each other packet for packet.
#![cfg_attr(not(test), no_std)]

pub mod batch_break;
pub mod config;
pub mod counters;
pub mod ctx;
pub mod flow;
pub mod hash;
pub mod modes;
pub mod parse;
pub mod tracker;

#[cfg(feature = "user")]
mod pod {
    //! aya needs to know these types are plain old data to copy them in and out of maps.
    //! Only for the two layouts the datapath uses, whose sizes are checked to have no padding.
    use crate::{
        config::{Params, MODES_COMPACT as C, MODES_WIDE as W},
        ctx::PacketCtx,
        flow::{EpochRecord, FlowKey, FlowState},
    };
    unsafe impl aya::Pod for FlowKey {}
    unsafe impl aya::Pod for Params {}
    unsafe impl aya::Pod for PacketCtx {}
    unsafe impl aya::Pod for FlowState<C> {}
    unsafe impl aya::Pod for FlowState<W> {}
    unsafe impl aya::Pod for EpochRecord<C> {}
    unsafe impl aya::Pod for EpochRecord<W> {}
    const _: () = assert!(size_of::<FlowKey>() == 40 && size_of::<Params>() == 48);
    const _: () = assert!(size_of::<FlowState<C>>() == 56 + 20 * C + 8);
    const _: () = assert!(size_of::<FlowState<W>>() == 56 + 20 * W + 8);
}
