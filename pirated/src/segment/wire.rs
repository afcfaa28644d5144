//! The messages between a segment's two points, as they travel inside the secure channel
//! ([`super::channel`], which authenticates, encrypts and orders them): a kind, the measurement
//! interval it is about, and a body. Fields are little-endian.
//!
//! A message: kind (u8), 0 (3 bytes), body length (u32), interval (u64), the body.

use pirate_common::segment::{
    lda::{LdaCell, LdaShape},
    rda::{RdaBucket, RdaShape},
    CacheEntry, SegmentShape,
};

/// Bytes before a message's body.
pub const HEADER: usize = 16;
/// The largest body accepted, checked before anything is read into memory: the largest
/// banks (4 × 2^16 buckets of 24 bytes, both kinds) fit well within it.
pub const MAX_BODY: u32 = 64 << 20;
/// The largest body accepted before the peer has proved it holds the key: a Hello's.
pub const HELLO_BODY: u32 = 64;

/// A point's record of one interval: what the upstream point sends after each.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Record {
    pub interval: u64,
    /// Whether the banks hold this interval alone (false: the point restarted within it, or
    /// read its banks too late).
    pub measured: bool,
    pub packets: u64,
    pub lda: Vec<LdaCell>,
    pub rda: Vec<RdaBucket>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    /// The first message each way, inside the handshake: the shape (the points must agree on
    /// it) and the interval the sender is in (the clocks must agree too).
    Hello {
        shape: SegmentShape,
        interval: u64,
    },
    Record(Record),
    /// Downstream asks upstream for the timestamps of the packets only upstream saw.
    Request {
        interval: u64,
        ids: Vec<u64>,
    },
    /// Upstream's answer: the requested packets its cache holds.
    Stamps {
        interval: u64,
        stamps: Vec<CacheEntry>,
    },
    /// Upstream's times of packets, streamed as they come (every few ms, several in one
    /// interval) for a capability at the downstream point: RLI's sampled references.
    Times {
        interval: u64,
        times: Vec<CacheEntry>,
    },
}

impl Message {
    /// Its kind's number on the wire (1..=KINDS).
    pub fn kind(&self) -> u8 {
        match self {
            Message::Hello { .. } => 1,
            Message::Record(_) => 2,
            Message::Request { .. } => 3,
            Message::Stamps { .. } => 4,
            Message::Times { .. } => TIMES,
        }
    }

    pub fn interval(&self) -> u64 {
        match self {
            Message::Hello { interval, .. }
            | Message::Request { interval, .. }
            | Message::Stamps { interval, .. }
            | Message::Times { interval, .. } => *interval,
            Message::Record(r) => r.interval,
        }
    }

    /// The message's bytes: its header, then its body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0; HEADER];
        match self {
            Message::Hello { shape, .. } => put_shape(&mut out, shape),
            Message::Record(r) => {
                out.push(r.measured as u8);
                out.extend_from_slice(&[0; 7]);
                out.extend_from_slice(&r.packets.to_le_bytes());
                out.extend_from_slice(&(r.lda.len() as u32).to_le_bytes());
                out.extend_from_slice(&(r.rda.len() as u32).to_le_bytes());
                for c in &r.lda {
                    put(&mut out, &[c.ts_sum, c.count, c.id_xor]);
                }
                for b in &r.rda {
                    put(&mut out, &[b.id_xor, b.ts_sum, b.count as u64]);
                }
            }
            Message::Request { ids, .. } => {
                out.extend_from_slice(&(ids.len() as u64).to_le_bytes());
                put(&mut out, ids);
            }
            Message::Stamps { stamps, .. } | Message::Times { times: stamps, .. } => {
                out.extend_from_slice(&(stamps.len() as u64).to_le_bytes());
                for s in stamps {
                    put(&mut out, &[s.id, s.ts]);
                }
            }
        }
        let body = (out.len() - HEADER) as u32;
        out[0] = self.kind();
        out[4..8].copy_from_slice(&body.to_le_bytes());
        out[8..16].copy_from_slice(&self.interval().to_le_bytes());
        out
    }

    /// The body length a header announces, if it is at most `max_body`.
    pub fn body_len(header: &[u8; HEADER], max_body: u32) -> Result<usize, Refusal> {
        let len = u32::from_le_bytes(header[4..8].try_into().unwrap());
        match len <= max_body {
            true => Ok(len as usize),
            false => Err(Refusal::new("malformed", format!("a body of {len} bytes, above the limit of {max_body}"))),
        }
    }

    /// The message `bytes` hold (a header and the body it announces, nothing more), or why not.
    pub fn decode(bytes: &[u8]) -> Result<Message, Refusal> {
        let malformed = || Refusal::new("malformed", format!("a malformed message of kind {}", bytes[0]));
        let (Some(header), Some(body)) = (bytes.get(..HEADER), bytes.get(HEADER..)) else {
            return Err(Refusal::new(
                "malformed",
                format!("a message of {} bytes, shorter than a header", bytes.len()),
            ));
        };
        if Message::body_len(header.try_into().unwrap(), u32::MAX)? != body.len() {
            return Err(malformed());
        }
        let interval = u64::from_le_bytes(header[8..16].try_into().unwrap());
        parse(header[0], interval, body).ok_or_else(malformed)
    }
}

/// Why a message, or a peer, was refused: `reason` labels the metric, `detail` goes to the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `authentication`, `malformed`, `version`, `stale` (an interval already seen, or far from
    /// this point's), `shape` (the points disagree on it); `io` for a connection lost.
    pub reason: &'static str,
    pub detail: String,
}

impl Refusal {
    pub fn new(reason: &'static str, detail: String) -> Refusal {
        Refusal { reason, detail }
    }

    pub fn io(detail: String) -> Refusal {
        Refusal::new("io", detail)
    }
}

impl std::error::Error for Refusal {}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

/// Number of message kinds.
pub const KINDS: usize = 5;
/// The kind of `Message::Times`, the one several messages of an interval may have.
pub const TIMES: u8 = 5;

fn put(out: &mut Vec<u8>, words: &[u64]) {
    for w in words {
        out.extend_from_slice(&w.to_le_bytes());
    }
}

fn put_shape(out: &mut Vec<u8>, s: &SegmentShape) {
    out.extend_from_slice(&s.interval_ns.to_le_bytes());
    for w in
        [s.lda.rows, s.lda.banks, u32::from_le_bytes(s.lda.zeros), s.rda.buckets, s.rda.banks, s.sample_zeros, s.flags]
    {
        out.extend_from_slice(&w.to_le_bytes());
    }
}

/// A body, read with bounds checks.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    /// A count of items of `size` bytes that the rest of the body must hold.
    fn count(&mut self, n: u64, size: usize) -> Option<usize> {
        let n = usize::try_from(n).ok()?;
        (n.checked_mul(size)? <= self.0.len()).then_some(n)
    }
}

fn parse(kind: u8, interval: u64, body: &[u8]) -> Option<Message> {
    let mut r = Reader(body);
    let message = match kind {
        1 => {
            let interval_ns = r.u64()?;
            let (rows, banks, zeros) = (r.u32()?, r.u32()?, r.u32()?.to_le_bytes());
            let rda = RdaShape { buckets: r.u32()?, banks: r.u32()? };
            let (sample_zeros, flags) = (r.u32()?, r.u32()?);
            let shape =
                SegmentShape { interval_ns, lda: LdaShape { rows, banks, zeros }, rda, sample_zeros, flags, _pad: 0 };
            Message::Hello { shape, interval }
        }
        2 => {
            let measured = r.take(8)?[0] != 0;
            let packets = r.u64()?;
            let (lda_n, rda_n) = (r.u32()? as u64, r.u32()? as u64);
            let lda_n = r.count(lda_n, 24)?;
            let lda = (0..lda_n)
                .map(|_| Some(LdaCell { ts_sum: r.u64()?, count: r.u64()?, id_xor: r.u64()? }))
                .collect::<Option<_>>()?;
            let rda_n = r.count(rda_n, 24)?;
            let rda = (0..rda_n)
                .map(|_| Some(RdaBucket { id_xor: r.u64()?, ts_sum: r.u64()?, count: r.u64()? as i64 }))
                .collect::<Option<_>>()?;
            Message::Record(Record { interval, measured, packets, lda, rda })
        }
        3 => {
            let n = r.u64()?;
            let n = r.count(n, 8)?;
            Message::Request { interval, ids: (0..n).map(|_| r.u64()).collect::<Option<_>>()? }
        }
        4 | TIMES => {
            let n = r.u64()?;
            let n = r.count(n, 16)?;
            let stamps = (0..n).map(|_| Some(CacheEntry { id: r.u64()?, ts: r.u64()? })).collect::<Option<_>>()?;
            match kind {
                4 => Message::Stamps { interval, stamps },
                _ => Message::Times { interval, times: stamps },
            }
        }
        _ => return None,
    };
    // Nothing may follow what the kind holds.
    r.0.is_empty().then_some(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages() -> Vec<Message> {
        let shape = SegmentShape {
            interval_ns: 1_000_000_000,
            lda: LdaShape { rows: 4, banks: 2, zeros: [5, 1, 0, 0] },
            rda: RdaShape { buckets: 3, banks: 2 },
            sample_zeros: 1,
            flags: 3,
            _pad: 0,
        };
        let record = Record {
            interval: 7,
            measured: true,
            packets: 99,
            lda: vec![LdaCell { ts_sum: u64::MAX, count: 3, id_xor: 5 }; 8],
            rda: vec![RdaBucket { id_xor: 0xdead_beef, ts_sum: 12, count: -1 }; 6],
        };
        vec![
            Message::Hello { shape, interval: 5 },
            Message::Record(record),
            Message::Request { interval: 6, ids: vec![1, 2, u64::MAX] },
            Message::Stamps { interval: 6, stamps: vec![CacheEntry { id: 2, ts: 3 }] },
            Message::Times { interval: 6, times: vec![CacheEntry { id: 4, ts: 5 }, CacheEntry { id: 6, ts: 7 }] },
        ]
    }

    /// Every message reads back as written, and a Hello fits the limit before the handshake.
    #[test]
    fn messages_round_trip() {
        for m in messages() {
            assert_eq!(Message::decode(&m.encode()), Ok(m));
        }
        assert!(messages()[0].encode().len() <= HEADER + HELLO_BODY as usize);
    }

    /// A truncated message, one longer than its header says, an unknown kind and a body
    /// claiming more than it carries are each refused with a reason, never a panic.
    #[test]
    fn bad_messages_are_refused_with_a_reason() {
        let refused = |bytes: &[u8], what: &str| {
            let refusal = Message::decode(bytes).expect_err("refused");
            assert_eq!(refusal.reason, "malformed");
            assert!(refusal.detail.contains(what), "{refusal:?} should say {what:?}");
        };
        let record = messages()[1].encode();
        refused(&record[..record.len() - 1], "malformed");
        refused(&[record.clone(), vec![0]].concat(), "malformed");
        refused(&record[..HEADER - 1], "shorter than a header");
        let mut unknown = record.clone();
        unknown[0] = 9;
        refused(&unknown, "kind 9");
        // A Request claiming 5 ids and carrying 1.
        let mut forged = Message::Request { interval: 6, ids: vec![1] }.encode();
        forged[HEADER..HEADER + 8].copy_from_slice(&5u64.to_le_bytes());
        refused(&forged, "kind 3");
        let mut header = [0; HEADER];
        header[4..8].copy_from_slice(&(HELLO_BODY + 1).to_le_bytes());
        assert!(Message::body_len(&header, HELLO_BODY).unwrap_err().detail.contains("limit"));
    }
}
