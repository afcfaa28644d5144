//! Header parsing from Ethernet to the transport header, over any byte source: XDP packet
//! memory in the kernel, a captured frame in replay. Bounded everywhere (two VLAN tags, six
//! IPv6 extension headers) so the verifier can follow it.

use crate::{
    ctx::PacketCtx,
    key::{FlowKey, FAMILY_V4, FAMILY_V6},
    zero::zero,
};

/// Bytes of a frame, read with bounds checks. The XDP implementation checks against
/// `data_end`; the replay implementation against the slice.
pub trait Frame {
    /// `size_of::<T>()` bytes at `off`, or `None` past the end.
    fn read<T: Copy>(&self, off: usize) -> Option<T>;

    /// `N` bytes at `off`, or `None` past the end, where `off` varies in a loop: the XDP
    /// implementation copies them out with a helper, since the verifier cannot follow a packet
    /// pointer's bounds check at an offset that grows in a loop.
    fn chunk<const N: usize>(&self, off: usize) -> Option<[u8; N]> {
        self.read(off)
    }
}

impl Frame for [u8] {
    #[inline(always)]
    fn read<T: Copy>(&self, off: usize) -> Option<T> {
        let end = off.checked_add(core::mem::size_of::<T>())?;
        if end > self.len() {
            return None;
        }
        // SAFETY: the range was checked above; T is plain data read unaligned.
        Some(unsafe { core::ptr::read_unaligned(self.as_ptr().add(off) as *const T) })
    }
}

/// Why a frame yields no flow (`PacketCtx::outcome` holds it as a `u8`).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reject {
    NotIp = 1,
    Malformed = 2,
    Unsupported = 3,
}

impl Reject {
    /// Its name in reports and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Reject::NotIp => "not_ip",
            Reject::Malformed => "malformed",
            Reject::Unsupported => "unsupported",
        }
    }
}

const ETH_P_IPV4: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
pub use crate::key::{IPPROTO_TCP, IPPROTO_UDP};
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_ICMPV6: u8 = 58;
/// ICMP echo types, request then reply, of ICMP and ICMPv6.
pub const ICMP_ECHO: [u8; 2] = [8, 0];
pub const ICMPV6_ECHO: [u8; 2] = [128, 129];
const MAX_VLAN_TAGS: usize = 2;
const MAX_V6_EXT_HEADERS: usize = 6;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

#[inline(always)]
fn be16<F: Frame + ?Sized>(f: &F, off: usize) -> Option<u16> {
    f.read::<[u8; 2]>(off).map(u16::from_be_bytes)
}

/// Parses a frame into `ctx`: its flow key, header offsets and what the trackers need (all of
/// `ctx` but the timestamp, hash and outcome, which the caller sets). `ctx` is reset first: in
/// the kernel it is a per-CPU slot still holding the previous packet.
#[inline(always)]
pub fn parse<F: Frame + ?Sized>(f: &F, ctx: &mut PacketCtx) -> Result<(), Reject> {
    // SAFETY: plain data, whose zero is every field's "unset".
    unsafe { zero(ctx) };
    let mut off = 12;
    let mut ethertype = be16(f, off).ok_or(Reject::Malformed)?;
    off += 2;
    for _ in 0..MAX_VLAN_TAGS {
        if ethertype != ETH_P_8021Q && ethertype != ETH_P_8021AD {
            break;
        }
        ethertype = be16(f, off + 2).ok_or(Reject::Malformed)?;
        off += 4;
    }
    let (l4, l4_len) = match ethertype {
        ETH_P_IPV4 => ipv4(f, off, &mut ctx.key)?,
        ETH_P_IPV6 => ipv6(f, off, &mut ctx.key)?,
        _ => return Err(Reject::NotIp),
    };
    ctx.l3_off = off as u16;
    ctx.l4_off = clamp16(l4);
    match ctx.key.proto {
        IPPROTO_TCP => tcp(f, l4, l4_len, ctx),
        IPPROTO_UDP => udp(f, l4, l4_len, ctx),
        IPPROTO_ICMP => echo(f, l4, ICMP_ECHO, ctx),
        IPPROTO_ICMPV6 => echo(f, l4, ICMPV6_ECHO, ctx),
        _ => Err(Reject::Unsupported),
    }
}

/// Returns the transport header's offset and the transport segment's length (header + payload),
/// taken from the IP header: Ethernet padding must not count as payload. The length is not
/// bounded by the frame on purpose: captures cut at a snapshot length and multi-buffer XDP frames
/// hold less than the IP length says, and the payload size is what the heuristics need.
#[inline(always)]
fn ipv4<F: Frame + ?Sized>(f: &F, off: usize, key: &mut FlowKey) -> Result<(usize, usize), Reject> {
    let vihl: u8 = f.read(off).ok_or(Reject::Malformed)?;
    if vihl >> 4 != 4 {
        return Err(Reject::Malformed);
    }
    let ihl = ((vihl & 0x0f) as usize) * 4;
    let total = be16(f, off + 2).ok_or(Reject::Malformed)? as usize;
    if ihl < 20 || total < ihl {
        return Err(Reject::Malformed);
    }
    // Fragments other than a whole datagram carry no (or a partial) transport header.
    let frag = be16(f, off + 6).ok_or(Reject::Malformed)?;
    if frag & 0x3fff != 0 {
        return Err(Reject::Unsupported);
    }
    key.proto = f.read(off + 9).ok_or(Reject::Malformed)?;
    let addrs: [u8; 8] = f.read(off + 12).ok_or(Reject::Malformed)?;
    key.src[..4].copy_from_slice(&addrs[..4]);
    key.dst[..4].copy_from_slice(&addrs[4..]);
    key.family = FAMILY_V4;
    Ok((off + ihl, total - ihl))
}

#[inline(always)]
fn ipv6<F: Frame + ?Sized>(f: &F, off: usize, key: &mut FlowKey) -> Result<(usize, usize), Reject> {
    let v: u8 = f.read(off).ok_or(Reject::Malformed)?;
    if v >> 4 != 6 {
        return Err(Reject::Malformed);
    }
    let mut remaining = be16(f, off + 4).ok_or(Reject::Malformed)? as usize;
    let mut next: u8 = f.read(off + 6).ok_or(Reject::Malformed)?;
    key.src = f.read(off + 8).ok_or(Reject::Malformed)?;
    key.dst = f.read(off + 24).ok_or(Reject::Malformed)?;
    key.family = FAMILY_V6;
    let mut at = off + 40;
    for _ in 0..MAX_V6_EXT_HEADERS {
        let len = match next {
            // Hop-by-hop, routing, destination options: (8-octet units beyond the first) + 1.
            0 | 43 | 60 => {
                let hdr: [u8; 2] = f.read(at).ok_or(Reject::Malformed)?;
                next = hdr[0];
                (hdr[1] as usize + 1) * 8
            }
            // Authentication header: 4-octet units, minus 2.
            51 => {
                let hdr: [u8; 2] = f.read(at).ok_or(Reject::Malformed)?;
                next = hdr[0];
                (hdr[1] as usize + 2) * 4
            }
            // Fragment header: fragments carry no (or a partial) transport header.
            44 => return Err(Reject::Unsupported),
            _ => break,
        };
        if len > remaining {
            return Err(Reject::Malformed);
        }
        remaining -= len;
        at += len;
    }
    key.proto = next;
    Ok((at, remaining))
}

#[inline(always)]
fn tcp<F: Frame + ?Sized>(f: &F, off: usize, seg_len: usize, ctx: &mut PacketCtx) -> Result<(), Reject> {
    let ports: [u8; 4] = f.read(off).ok_or(Reject::Malformed)?;
    let seq: [u8; 4] = f.read(off + 4).ok_or(Reject::Malformed)?;
    let ack: [u8; 4] = f.read(off + 8).ok_or(Reject::Malformed)?;
    let doff_flags: [u8; 2] = f.read(off + 12).ok_or(Reject::Malformed)?;
    let hdr = ((doff_flags[0] >> 4) as usize) * 4;
    if hdr < 20 || hdr > seg_len {
        return Err(Reject::Malformed);
    }
    // The whole header (options included) must be in the frame, not just the fields read.
    let _: u8 = f.read(off + hdr - 1).ok_or(Reject::Malformed)?;
    ctx.key.sport = u16::from_be_bytes([ports[0], ports[1]]);
    ctx.key.dport = u16::from_be_bytes([ports[2], ports[3]]);
    ctx.payload = clamp16(seg_len - hdr);
    ctx.tcp_flags = doff_flags[1];
    ctx.seq = u32::from_be_bytes(seq);
    ctx.ack = u32::from_be_bytes(ack);
    Ok(())
}

#[inline(always)]
fn udp<F: Frame + ?Sized>(f: &F, off: usize, seg_len: usize, ctx: &mut PacketCtx) -> Result<(), Reject> {
    let hdr: [u8; 8] = f.read(off).ok_or(Reject::Malformed)?;
    if seg_len < 8 {
        return Err(Reject::Malformed);
    }
    ctx.key.sport = u16::from_be_bytes([hdr[0], hdr[1]]);
    ctx.key.dport = u16::from_be_bytes([hdr[2], hdr[3]]);
    ctx.payload = clamp16(seg_len - 8);
    if ctx.payload >= 4 {
        ctx.head = u32::from_be_bytes(f.read(off + 8).ok_or(Reject::Malformed)?);
    }
    Ok(())
}

/// An ICMP echo request or reply of the given types (request, reply); other ICMP messages carry
/// nothing a capability reads.
#[inline(always)]
fn echo<F: Frame + ?Sized>(f: &F, off: usize, types: [u8; 2], ctx: &mut PacketCtx) -> Result<(), Reject> {
    let hdr: [u8; 8] = f.read(off).ok_or(Reject::Malformed)?;
    if hdr[0] != types[0] && hdr[0] != types[1] {
        return Err(Reject::Unsupported);
    }
    ctx.icmp_type = hdr[0];
    ctx.head = u32::from_be_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]);
    Ok(())
}

#[inline(always)]
fn clamp16(v: usize) -> u16 {
    if v > u16::MAX as usize {
        u16::MAX
    } else {
        v as u16
    }
}
