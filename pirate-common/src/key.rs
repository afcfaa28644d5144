//! The flow key every capability shares (the chain's parse writes it into the packet context
//! and the flow hash reads it), and the 16-byte id `pirate`'s flow table keeps in its place.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::hash::{digest, words_hash};

pub const FAMILY_V4: u8 = 4;
pub const FAMILY_V6: u8 = 6;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;

/// Direction-aware 5-tuple: client→server and server→client are different flows.
/// IPv4 addresses sit in the first 4 bytes of `src`/`dst`, the rest zero. 8-byte aligned so that
/// the flow hash reads it as words.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// Host byte order.
    pub sport: u16,
    pub dport: u16,
    /// IP protocol number (6 TCP, 17 UDP).
    pub proto: u8,
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
    pub _pad: [u8; 2],
}

const _: () = assert!(size_of::<FlowKey>() == 40);

// SAFETY: plain data, no padding (fields fill 40 bytes exactly).
#[cfg(feature = "user")]
unsafe impl aya::Pod for FlowKey {}

impl FlowKey {
    /// The key as five words: source address (2), destination address (2), then ports,
    /// protocol and family; what the hashes read.
    #[inline(always)]
    pub fn words(&self) -> &[u64; 5] {
        // SAFETY: 8-byte aligned, 40 bytes of plain data without padding.
        unsafe { &*(self as *const FlowKey as *const [u64; 5]) }
    }

    /// A 32-bit hash of the whole key under `seed`: what the chain's parse writes into every
    /// packet's context. Five multiplies, for every packet.
    #[inline(always)]
    pub fn flow_hash(&self, seed: u64) -> u32 {
        words_hash(seed, self.words())
    }

    /// The source (the client of a client→server flow): address and port.
    pub fn client(&self) -> SocketAddr {
        SocketAddr::new(self.addr(&self.src), self.sport)
    }

    /// The destination (the server a client→server flow talks to): address and port.
    pub fn server(&self) -> SocketAddr {
        SocketAddr::new(self.addr(&self.dst), self.dport)
    }

    /// The transport's name, for reports.
    pub fn proto_name(&self) -> &'static str {
        match self.proto {
            IPPROTO_TCP => "tcp",
            IPPROTO_UDP => "udp",
            _ => "other",
        }
    }

    fn addr(&self, bytes: &[u8; 16]) -> IpAddr {
        match self.family {
            FAMILY_V4 => IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3])),
            _ => IpAddr::V6(Ipv6Addr::from(*bytes)),
        }
    }
}

/// A flow table's key, 16 bytes where [`FlowKey`] takes 40: an IPv4 flow's 5-tuple as it is,
/// an IPv6 flow's ports and protocol with an 80-bit digest of its addresses (which pirated
/// learns once per flow, from `V6_NAMES`). Two IPv6 flows of one port pair collide with
/// probability 2^-80. 8-byte aligned: compared as two words.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowId {
    /// IPv4: source then destination address; IPv6: 64 bits of their digest.
    pub addrs: [u8; 8],
    /// Host byte order.
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    /// `FAMILY_V4` or `FAMILY_V6`; 0 in an empty table slot.
    pub family: u8,
    /// IPv6: 16 more bits of the digest; IPv4: 0.
    pub digest_hi: u16,
}

const _: () = assert!(size_of::<FlowId>() == 16);

impl FlowId {
    /// The id of `key`, an IPv6 key's digest under `seed`.
    #[inline(always)]
    pub fn of(key: &FlowKey, seed: u64) -> FlowId {
        let mut id = FlowId {
            addrs: [0; 8],
            sport: key.sport,
            dport: key.dport,
            proto: key.proto,
            family: key.family,
            digest_hi: 0,
        };
        if key.family == FAMILY_V6 {
            let (lo, hi) = digest(seed, &key.words()[..4]);
            id.addrs = lo.to_le_bytes();
            id.digest_hi = hi;
        } else {
            id.addrs[..4].copy_from_slice(&key.src[..4]);
            id.addrs[4..].copy_from_slice(&key.dst[..4]);
        }
        id
    }

    /// The key of an IPv4 id; an IPv6 id's addresses are not in it (`None`).
    pub fn v4_key(&self) -> Option<FlowKey> {
        if self.family != FAMILY_V4 {
            return None;
        }
        let mut key = FlowKey {
            sport: self.sport,
            dport: self.dport,
            proto: self.proto,
            family: FAMILY_V4,
            ..FlowKey::default()
        };
        key.src[..4].copy_from_slice(&self.addrs[..4]);
        key.dst[..4].copy_from_slice(&self.addrs[4..]);
        Some(key)
    }

    /// The id as two words, for the datapath's comparisons (an array `==` may become a call).
    #[inline(always)]
    pub fn words(&self) -> [u64; 2] {
        // SAFETY: 16 bytes, 8-byte aligned, plain data.
        unsafe { *(self as *const FlowId as *const [u64; 2]) }
    }
}

// SAFETY: plain data, no padding (fields fill 16 bytes exactly).
#[cfg(feature = "user")]
unsafe impl aya::Pod for FlowId {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::FLOW_SEED;

    /// Keys that differ in one field only hash apart, and the hash spreads them evenly over
    /// buckets (what fridges and Maglev lookups rely on).
    #[test]
    fn spreads_keys_that_differ_in_one_field() {
        const BUCKETS: usize = 64;
        const KEYS: u32 = 64 * 1024;
        let mut per_bucket = [0u32; BUCKETS];
        for i in 0..KEYS {
            let mut key = FlowKey { sport: (i & 0xffff) as u16, dport: 80, proto: 6, family: 4, ..FlowKey::default() };
            key.src[..4].copy_from_slice(&[10, 0, (i >> 16) as u8, 1]);
            per_bucket[key.flow_hash(FLOW_SEED) as usize % BUCKETS] += 1;
        }
        let expected = KEYS / BUCKETS as u32;
        // Binomial std-dev is sqrt(1024 · 63/64) ≈ 32: 5 σ either side.
        for (b, n) in per_bucket.iter().enumerate() {
            assert!(n.abs_diff(expected) < 160, "bucket {b}: {n} keys, expected about {expected}");
        }
    }

    fn key(family: u8, src: u8, sport: u16) -> FlowKey {
        let mut k = FlowKey { sport, dport: 443, proto: 6, family, ..FlowKey::default() };
        let len = if family == FAMILY_V4 { 4 } else { 16 };
        k.src[..len].fill(src);
        k.dst[..len].fill(9);
        k
    }

    /// An IPv4 id is its key; IPv6 ids keep ports and protocol and tell addresses apart.
    #[test]
    fn ids_keep_v4_keys_and_tell_v6_addresses_apart() {
        let id = |key: &FlowKey| FlowId::of(key, FLOW_SEED);
        let v4 = key(FAMILY_V4, 10, 5000);
        assert_eq!(id(&v4).v4_key(), Some(v4));
        let (a, b) = (id(&key(FAMILY_V6, 1, 5000)), id(&key(FAMILY_V6, 2, 5000)));
        assert_eq!((a.sport, a.dport, a.proto, a.family), (5000, 443, 6, FAMILY_V6));
        assert_ne!(a, b);
        assert_ne!(a.words(), id(&key(FAMILY_V6, 1, 5001)).words());
        assert_eq!(a.v4_key(), None);
        let mut flipped = key(FAMILY_V6, 1, 5000);
        flipped.dst[15] ^= 1;
        assert_ne!(id(&flipped), a, "one address bit moves the digest");
    }

    /// Another seed moves every hash and every IPv6 digest: which flows share a set, a Maglev
    /// pick or a digest is not known to whoever does not know the seed.
    #[test]
    fn another_seed_moves_hashes_and_digests() {
        let (v4, v6) = (key(FAMILY_V4, 10, 5000), key(FAMILY_V6, 1, 5000));
        assert_ne!(v4.flow_hash(FLOW_SEED), v4.flow_hash(FLOW_SEED + 1));
        assert_ne!(v6.flow_hash(FLOW_SEED), v6.flow_hash(1 << 40));
        assert_ne!(FlowId::of(&v6, FLOW_SEED).words(), FlowId::of(&v6, 1 << 40).words());
        assert_ne!(FlowId::of(&v6, FLOW_SEED).digest_hi, FlowId::of(&v6, 1 << 40).digest_hi);
        assert_eq!(FlowId::of(&v4, FLOW_SEED), FlowId::of(&v4, 1 << 40), "an IPv4 id is its key");
    }
}
