//! Everything the XDP programs and pirated must agree on, and the per-packet logic both run: what
//! every capability shares at the top (context, parser, key, hash, counters, map names), and a
//! folder per capability with its map types and per-packet state machine.
//!
//! `no_std`, allocation-free and loop-bounded so the same code passes the eBPF verifier inside
//! `pirate-ebpf` and runs unchanged in pirated's pcap replay: the kernel path and the userspace
//! path can then be checked against each other packet for packet.
#![cfg_attr(not(test), no_std)]

pub mod counters;
pub mod ctx;
pub mod fridge;
pub mod hash;
pub mod identity;
pub mod key;
pub mod lb;
pub mod maps;
pub mod parse;
pub mod pirate;
pub mod rli;
pub mod segment;
pub mod zero;
