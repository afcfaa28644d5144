//! The per-packet context the chain's first program that needs it writes once (parse, flow
//! hash, timestamp) and every later one reads, and the chain's slot numbers. Programs never
//! parse a frame again:
//! the verifier keeps nothing across a tail call, so what they share travels in this struct.

use crate::key::{FlowId, FlowKey};

/// `CHAIN` slot of `rli` (per-flow one-way delay from reference packets). Capabilities run in
/// slot order; `rli` first, because it takes the reference packets out of the traffic before
/// any other program counts them.
pub const CHAIN_RLI: u32 = 0;
/// `CHAIN` slot of `pirate` (inter-packet-gap modes).
pub const CHAIN_PIRATE: u32 = 1;
/// `CHAIN` slot of `fridge` (request→response delays).
pub const CHAIN_FRIDGE: u32 = 2;
/// `CHAIN` slot of `segment` (two-point one-way latency banks).
pub const CHAIN_SEGMENT: u32 = 3;
/// Slots in `CHAIN`: `rli`, `pirate`, `fridge`, `segment`.
pub const CHAIN_SLOTS: u32 = 4;
/// Slots in `FORWARD`, Katran's root-array convention: a balancer registers itself at a
/// configured position (Katran's `rootMapPos`, default 2); the first filled slot takes the
/// packet after every measuring program, and with all of them empty it passes.
pub const FORWARD_SLOTS: u32 = 3;

/// `PacketCtx::outcome` of a frame the parser accepted; the others are [`crate::parse::Reject`]
/// and [`UNREAD`].
pub const PARSED: u8 = 0;
/// `PacketCtx::outcome` of a frame not parsed yet: `pirate_root` marks each packet so, and the
/// first program of the chain that reads the context parses it.
pub const UNREAD: u8 = u8::MAX;

/// What the chain learned of one frame, in the one-entry per-CPU `CTX` map: an XDP run,
/// tail calls included, ends on its CPU before the next packet starts there. Offsets, not
/// pointers, into the frame.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacketCtx {
    pub key: FlowKey,
    /// [`FlowId::of`] `key`, under the datapath's seed: what the flow tables are keyed by.
    pub id: FlowId,
    /// Arrival, on the datapath's monotonic clock (`bpf_ktime_get_ns`; the capture's in replay).
    pub ts_ns: u64,
    /// [`FlowKey::flow_hash`] of `key`, under the datapath's seed.
    pub hash: u32,
    /// TCP sequence and acknowledgement numbers (0 for UDP).
    pub seq: u32,
    pub ack: u32,
    /// Transport payload bytes (TCP data, UDP datagram body).
    pub payload: u16,
    /// Offsets of the IP and transport headers from the frame's start.
    pub l3_off: u16,
    pub l4_off: u16,
    /// TCP flags byte (0 for UDP).
    pub tcp_flags: u8,
    /// [`PARSED`], or why the parser rejected the frame (`Reject as u8`), or [`UNREAD`].
    pub outcome: u8,
    /// Scratch for a capability program: `pirate` keeps the way of the packet's flow in its set
    /// here, and reads it back as a value the verifier knows nothing of, so that it walks the
    /// per-packet step once, not once per way.
    pub way: u32,
    /// The four bytes after the transport header, big-endian: a UDP datagram's first (a DNS
    /// transaction id and flags), an ICMP echo's identifier and sequence number; else 0.
    pub head: u32,
    /// An ICMP echo's type (request 8, reply 0; ICMPv6 128, 129); else 0.
    pub icmp_type: u8,
    pub _pad: [u8; 3],
}

const _: () = assert!(size_of::<PacketCtx>() == 96);

// SAFETY: plain data, no padding (the size assertion above).
#[cfg(feature = "user")]
unsafe impl aya::Pod for PacketCtx {}
