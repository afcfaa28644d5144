//! RLI's reference packets: a UDP datagram from the upstream point to the reference port,
//! whose payload is a header, a sequence number, the send time on the shared clock (TAI) and a
//! tag over all three under a key both points derive from the segment key (SipHash-2-4), so
//! that the downstream point refuses what it did not send, and (by the sequence number) what it
//! sent before.

use crate::{
    hash::{seeded, sip24},
    key::FlowKey,
};

/// The payload's first word: "PRLI", version 1, two bytes reserved.
pub const HEADER: u64 = 0x5052_4c49_0001_0000;
/// Payload bytes: header, sequence number, send time, tag (each a big-endian u64).
pub const PAYLOAD: usize = 32;
/// What the key tags to draw the sampling's seed ("PRLIsmpl").
const SAMPLE_SEED: u64 = 0x5052_4c49_736d_706c;

/// What the datapath checks references against, or samples them by, written by pirated.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RliShape {
    /// The tag's key (derived from the segment key).
    pub key: [u64; 2],
    /// A reference whose delay is beyond this either way is refused as stale.
    pub max_delay_ns: u64,
    /// Sampled references: a packet whose identity hashes under `sample_seed` (derived from the
    /// segment key, so that no one else knows which) below this is one; 0: none.
    pub sample_below: u64,
    pub sample_seed: u64,
    /// The UDP destination port injected references go to (host order); 0: none.
    pub port: u16,
    /// This point is the upstream one: a sampled packet's time is handed to pirated (for the
    /// downstream point), nothing else is done.
    pub upstream: u8,
    pub _pad: [u8; 5],
}

const _: () = assert!(size_of::<RliShape>() == 48);

#[cfg(feature = "user")]
unsafe impl aya::Pod for RliShape {}

impl RliShape {
    /// Whether a packet of `key` is addressed as a reference (valid or not).
    #[inline(always)]
    pub fn is_reference(&self, key: &FlowKey) -> bool {
        self.port != 0 && key.proto == 17 && key.dport == self.port
    }

    /// The shape with the references' key (the tag's, and the sampling's seed drawn from it).
    pub fn keyed(self, key: [u64; 2]) -> RliShape {
        RliShape { key, sample_seed: sip24(key, &[SAMPLE_SEED]), ..self }
    }

    /// Whether the packet of identity `id` is a sampled reference.
    #[inline(always)]
    pub fn sampled(&self, id: u64) -> bool {
        seeded(self.sample_seed, id) < self.sample_below
    }
}

/// The tag of reference `seq` sent at `sent_ns`.
#[inline(always)]
pub fn tag(key: [u64; 2], seq: u64, sent_ns: u64) -> u64 {
    sip24(key, &[HEADER, seq, sent_ns])
}

/// A reference's payload.
pub fn seal(key: [u64; 2], seq: u64, sent_ns: u64) -> [u8; PAYLOAD] {
    let mut out = [0; PAYLOAD];
    for (i, w) in [HEADER, seq, sent_ns, tag(key, seq, sent_ns)].iter().enumerate() {
        out[i * 8..i * 8 + 8].copy_from_slice(&w.to_be_bytes());
    }
    out
}

/// The sequence number and send time of a payload whose header and tag are right.
#[inline(always)]
pub fn open(key: [u64; 2], payload: &[u8; PAYLOAD]) -> Option<(u64, u64)> {
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&payload[i * 8..i * 8 + 8]);
        u64::from_be_bytes(w)
    };
    let (seq, sent_ns) = (word(1), word(2));
    (word(0) == HEADER && word(3) == tag(key, seq, sent_ns)).then_some((seq, sent_ns))
}

/// The sequence numbers taken, so that none is taken twice: the highest, and a bit for each
/// of the 63 before it. Shared by the CPUs without a lock: two copies of one reference taken
/// at the same instant on two CPUs could both pass (a replay races its original), which costs
/// one duplicate reference, never a forged one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    pub newest: u64,
    /// Bit i: `newest - i` was taken.
    pub seen: u64,
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for Window {}

impl Window {
    /// Takes `seq` if it is new; false if it was taken before or is older than the window.
    /// Sequence number 0 is never taken (it means "none" elsewhere).
    #[inline(always)]
    pub fn admit(&mut self, seq: u64) -> bool {
        if seq == 0 {
            return false;
        }
        if seq > self.newest {
            let shift = seq - self.newest;
            self.seen = if shift >= 64 { 0 } else { self.seen << shift } | 1;
            self.newest = seq;
            return true;
        }
        let back = self.newest - seq;
        if back >= 64 || self.seen & (1 << back) != 0 {
            return false;
        }
        self.seen |= 1 << back;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload opens under its key only, and not once a bit of it changes.
    #[test]
    fn a_reference_opens_under_its_key_only() {
        let key = [1, 2];
        let sealed = seal(key, 7, 123_456_789);
        assert_eq!(open(key, &sealed), Some((7, 123_456_789)));
        assert_eq!(open([1, 3], &sealed), None);
        for byte in 0..PAYLOAD {
            let mut bad = sealed;
            bad[byte] ^= 0x10;
            assert_eq!(open(key, &bad), None, "byte {byte}");
        }
    }

    /// Each sequence number is taken once, late ones within the window too, older ones never.
    #[test]
    fn the_window_takes_each_sequence_number_once() {
        let mut w = Window::default();
        assert!(!w.admit(0));
        assert!(w.admit(100) && !w.admit(100));
        assert!(w.admit(103) && w.admit(101) && !w.admit(101) && w.admit(102));
        assert!(!w.admit(103 - 64) && w.admit(103 - 63) && !w.admit(103 - 63));
        assert!(w.admit(1000) && !w.admit(103) && !w.admit(1000));
    }
}
