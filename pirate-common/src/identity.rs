//! A packet's identity, the same at both points: a 64-bit hash of what no hop changes. The
//! flow key (addresses, ports, protocol), the IPv4 id or IPv6 flow label, the transport payload
//! length, TCP's sequence and acknowledgement numbers and flags, and the first 8 bytes of payload
//! (with the 4 after the transport header the parser keeps). Left out: TTL or hop limit, DSCP and
//! ECN (a hop may mark them), checksums and TCP's window. A NAT between the points breaks it.

use crate::hash::seeded;
use crate::{
    ctx::PacketCtx,
    key::FAMILY_V4,
    parse::{Frame, IPPROTO_TCP, IPPROTO_UDP},
};

const SEED: u64 = 0x5365_676d_656e_7421; // "Segment!"

/// Bytes of payload the identity reads, when the packet has that many.
const PREFIX: u16 = 8;

/// The identity of the parsed packet `pkt` in frame `f`.
#[inline(always)]
pub fn identity<F: Frame + ?Sized>(f: &F, pkt: &PacketCtx) -> u64 {
    // Masked: the verifier tracks a packet offset's range only while it stays below 64 KiB. The
    // IP header starts within 22 bytes (two VLAN tags); a transport header past 4 KiB (jumbo
    // frames with huge IPv6 extension headers) reads other bytes, at both points alike.
    let l3 = (pkt.l3_off & 0xff) as usize;
    let l4 = (pkt.l4_off & 0xfff) as usize;
    // IPv4's id, or IPv6's flow label (with its version and traffic class masked out).
    let ip = match pkt.key.family {
        FAMILY_V4 => f.read::<[u8; 2]>(l3 + 4).map_or(0, |b| u16::from_be_bytes(b) as u32),
        _ => f.read::<[u8; 4]>(l3).map_or(0, |b| u32::from_be_bytes(b) & 0x000f_ffff),
    };
    let header = match pkt.key.proto {
        IPPROTO_TCP => f.read::<u8>(l4 + 12).map_or(0, |doff| ((doff >> 4) & 0xf) as usize * 4),
        IPPROTO_UDP => 8,
        _ => 0,
    };
    let prefix = match (header, pkt.payload >= PREFIX) {
        (1.., true) => f.read::<u64>(l4 + header).unwrap_or(0),
        _ => 0,
    };
    let key = pkt.key.words();
    // By value, in a fixed order: a loop the verifier walks without pointer arithmetic.
    let words = [
        key[0],
        key[1],
        key[2],
        key[3],
        key[4],
        ip as u64 | (pkt.payload as u64) << 32 | (pkt.tcp_flags as u64) << 48 | (pkt.icmp_type as u64) << 56,
        (pkt.seq as u64) << 32 | pkt.ack as u64,
        prefix,
        pkt.head as u64,
    ];
    words.into_iter().fold(SEED, seeded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse;

    /// A UDP/IPv4 frame: TTL `ttl`, IP id `ip_id`, payload `payload`.
    fn udp_frame(ttl: u8, ip_id: u16, tos: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&0x0800u16.to_be_bytes());
        let total = (20 + 8 + payload.len()) as u16;
        f.extend_from_slice(&[0x45, tos]);
        f.extend_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&ip_id.to_be_bytes());
        f.extend_from_slice(&[0x40, 0, ttl, 17, 0xab, 0xcd]); // DF, checksum anything
        f.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        f.extend_from_slice(&5000u16.to_be_bytes());
        f.extend_from_slice(&53u16.to_be_bytes());
        f.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
        f.extend_from_slice(&[0x12, ttl]); // UDP checksum, varying with the TTL here
        f.extend_from_slice(payload);
        f
    }

    fn id_of(frame: &[u8]) -> u64 {
        let mut ctx = PacketCtx::default();
        parse(frame, &mut ctx).unwrap();
        identity(frame, &ctx)
    }

    /// What hops change (TTL, ECN, checksums, Ethernet padding) leaves the identity alone; what
    /// tells two packets apart (IP id, a payload byte within the prefix) changes it.
    #[test]
    fn hops_keep_it_and_packets_differ() {
        let payload = b"0123456789abcdef";
        let sent = id_of(&udp_frame(64, 7, 0, payload));
        assert_eq!(id_of(&udp_frame(61, 7, 0x03, payload)), sent);
        let mut padded = udp_frame(64, 7, 0, payload);
        padded.extend_from_slice(&[0xee; 6]);
        assert_eq!(id_of(&padded), sent);
        assert_ne!(id_of(&udp_frame(64, 8, 0, payload)), sent);
        assert_ne!(id_of(&udp_frame(64, 7, 0, b"1123456789abcdef")), sent);
        // Short payloads: the 4 bytes the parser keeps still count, padding still does not.
        let short = id_of(&udp_frame(64, 7, 0, b"abcd"));
        let mut short_padded = udp_frame(64, 7, 0, b"abcd");
        short_padded.extend_from_slice(&[0xee; 20]);
        assert_eq!(id_of(&short_padded), short);
        assert_ne!(id_of(&udp_frame(64, 7, 0, b"abce")), short);
    }
}
