//! The built-in forwarder `pirate_lb`: its map types, and what the XDP program and pirated must
//! compute alike: where a flow's real sits in the rings, and the IPIP header it is sent in.
//!
//! Each VIP has two rings of `ring_size` real indices in `LB_RINGS` (VIP v's half h starts at
//! `(2v + h) · ring_size`) and `LB_HALVES[v]` names the live one: pirated writes a new ring into
//! the other half, then flips the index, so that no lookup sees a ring half written.

use crate::key::{FlowKey, FAMILY_V4};

/// VIPs the forwarder can hold.
pub const MAX_VIPS: u32 = 64;
/// Reals over all VIPs (Katran's `MAX_REALS`).
pub const MAX_REALS: u32 = 4096;
/// Bytes of the outer IPv4 header.
pub const IPIP_HEADER: usize = 20;

/// A VIP as `pirate_lb` matches a packet's destination: IPv4 address, port, protocol.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VipKey {
    pub addr: [u8; 4],
    /// Host byte order.
    pub port: u16,
    pub proto: u8,
    pub _pad: u8,
}

const _: () = assert!(size_of::<VipKey>() == 8);

impl VipKey {
    /// The VIP a packet of `key` is addressed to, if it is IPv4 (the only family the forwarder
    /// takes).
    #[inline(always)]
    pub fn of(key: &FlowKey) -> Option<VipKey> {
        if key.family != FAMILY_V4 {
            return None;
        }
        Some(VipKey {
            addr: [key.dst[0], key.dst[1], key.dst[2], key.dst[3]],
            port: key.dport,
            proto: key.proto,
            _pad: 0,
        })
    }
}

/// The forwarder's shape, written once by pirated.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LbShape {
    /// Entries per ring (a prime).
    pub ring_size: u32,
    /// The outer source address of encapsulated packets.
    pub tunnel_source: [u8; 4],
    /// `EGRESS_KERNEL`, or 0: the forwarder sends packets itself.
    pub flags: u32,
}

/// `LbShape::flags`: encapsulate, then pass to the kernel, which routes the packet (any
/// interface, a trip through the stack); without it the forwarder looks the route up and sends
/// the packet from XDP (XDP_TX or a redirect), falling back to the kernel where it cannot.
pub const EGRESS_KERNEL: u32 = 1;

/// Per real, over all CPUs in pirated: what `pirate_lb` sent it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RealCounters {
    pub packets: u64,
    /// Bytes of the inner packets (IP header on).
    pub bytes: u64,
    /// Flows the forwarder assigned to it (each once, when it entered the connection table).
    pub connections: u64,
}

/// `LB_RINGS`' index of the entry holding the real for a flow of `hash` to VIP `vip`, in half
/// `half` of its rings.
#[inline(always)]
pub fn ring_index(vip: u32, half: u32, hash: u32, ring_size: u32) -> u32 {
    (vip * 2 + (half & 1)) * ring_size + hash % ring_size
}

/// The outer IPv4 header that carries an inner IPv4 packet of `inner_len` bytes from `src` to
/// `dst` (protocol 4, IPIP): the inner TOS, TTL 64, no DF (the kernel may fragment what a link
/// cannot carry, rather than drop it), checksum filled in.
#[inline(always)]
pub fn ipip_header(src: [u8; 4], dst: [u8; 4], inner_len: u16, tos: u8) -> [u8; IPIP_HEADER] {
    let len = (inner_len as u32 + IPIP_HEADER as u32).min(u16::MAX as u32) as u16;
    let len = len.to_be_bytes();
    #[rustfmt::skip]
    let mut h = [
        0x45, tos, len[0], len[1],
        0, 0, 0, 0,
        64, 4, 0, 0,
        src[0], src[1], src[2], src[3],
        dst[0], dst[1], dst[2], dst[3],
    ];
    let mut sum = 0u32;
    for i in 0..IPIP_HEADER / 2 {
        sum += u16::from_be_bytes([h[2 * i], h[2 * i + 1]]) as u32;
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    let check = (!(sum as u16)).to_be_bytes();
    h[10] = check[0];
    h[11] = check[1];
    h
}

// SAFETY: plain data without padding (the sizes add up).
#[cfg(feature = "user")]
unsafe impl aya::Pod for VipKey {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for LbShape {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for RealCounters {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header's checksum verifies (the one's-complement sum over it is 0xffff), and the
    /// fields sit where RFC 791 puts them.
    #[test]
    fn ipip_headers_check_out() {
        let h = ipip_header([10, 202, 0, 1], [10, 202, 1, 2], 1480, 0x10);
        let mut sum = 0u32;
        for w in h.chunks(2) {
            sum += u16::from_be_bytes([w[0], w[1]]) as u32;
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff);
        assert_eq!(u16::from_be_bytes([h[2], h[3]]), 1500);
        assert_eq!((h[0], h[1], h[8], h[9]), (0x45, 0x10, 64, 4));
        assert_eq!(&h[16..], &[10, 202, 1, 2]);
    }

    /// The two halves of each VIP's rings never overlap another's.
    #[test]
    fn ring_halves_are_disjoint() {
        let size = 13;
        let mut seen = std::collections::HashSet::new();
        for vip in 0..3 {
            for half in 0..2 {
                for hash in 0..size {
                    assert!(seen.insert(ring_index(vip, half, hash, size)));
                }
            }
        }
        assert_eq!(seen.len(), 3 * 2 * 13);
        assert_eq!(*seen.iter().max().unwrap(), 3 * 2 * 13 - 1);
    }
}
