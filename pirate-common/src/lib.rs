//! Everything the XDP program and pirated must agree on, and the per-packet logic both run.
//!
//! `no_std`, allocation-free and loop-bounded so the same code passes the eBPF verifier inside
//! `pirate-ebpf` and runs unchanged in pirated's pcap replay: the kernel path and the userspace
//! path can then be checked against each other packet for packet.
#![cfg_attr(not(test), no_std)]

pub mod config;
pub mod counters;
pub mod flow;
pub mod modes;
pub mod parse;
pub mod tracker;

#[cfg(feature = "user")]
mod pod {
    //! aya needs to know these types are plain old data to copy them in and out of maps.
    use crate::{
        config::Params,
        flow::{EpochRecord, FlowKey, FlowState},
    };
    unsafe impl aya::Pod for FlowKey {}
    unsafe impl aya::Pod for Params {}
    unsafe impl<const M: usize> aya::Pod for FlowState<M> {}
    unsafe impl<const M: usize> aya::Pod for EpochRecord<M> {}
}
