//! The peer protocol between a segment's two points: length-prefixed messages over TCP, each
//! authenticated with HMAC-SHA256, numbered by measurement interval, and versioned. Fields are
//! little-endian.
//!
//! A connection starts with a Hello each way, authenticated under the pre-shared key and
//! carrying a fresh random nonce; every later message is authenticated under a session key
//! derived from the key and both nonces ([`session_key`]), starting with a Ready each way. So a
//! recorded connection played again fails at its Ready (the nonces differ), and within a
//! connection each kind is accepted only for newer intervals near the receiver's clock.
//!
//! A frame: `PSEG`, version (u16), kind (u8), 0 (u8), interval (u64), body length (u32), 0
//! (u32), the body, then the 32-byte tag over all before it.

use hmac::{Hmac, Mac};
use pirate_common::segment::{
    lda::{LdaCell, LdaShape},
    rda::{RdaBucket, RdaShape},
    CacheEntry, SegmentShape,
};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncReadExt};

pub const MAGIC: [u8; 4] = *b"PSEG";
/// The protocol's version: a peer speaking another is refused with both numbers.
pub const VERSION: u16 = 2;
const HEADER: usize = 24;
const TAG: usize = 32;
/// Bytes of a Hello's nonce.
pub const NONCE: usize = 16;
/// The largest body accepted, checked before anything is read into memory: the largest
/// banks (4 × 2^16 buckets of 24 bytes, both kinds) fit well within it.
pub const MAX_BODY: u32 = 64 << 20;
/// The largest body accepted before the peer has proved it holds the key: a Hello's.
pub const HELLO_BODY: u32 = 128;

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
    /// Sent by both on connecting, under the pre-shared key: which end, the shape (the points
    /// must agree on it), the interval the sender is in, and a fresh nonce for the session key.
    Hello {
        up: bool,
        shape: SegmentShape,
        interval: u64,
        nonce: [u8; NONCE],
    },
    /// Sent by both after the Hellos, under the session key: proves the sender holds the key
    /// in this connection (a Hello alone can be a recording).
    Ready {
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
}

impl Message {
    /// Its kind's number on the wire (1..=KINDS).
    pub fn kind(&self) -> u8 {
        match self {
            Message::Hello { .. } => 1,
            Message::Record(_) => 2,
            Message::Request { .. } => 3,
            Message::Stamps { .. } => 4,
            Message::Ready { .. } => 5,
        }
    }

    pub fn interval(&self) -> u64 {
        match self {
            Message::Hello { interval, .. }
            | Message::Request { interval, .. }
            | Message::Stamps { interval, .. }
            | Message::Ready { interval } => *interval,
            Message::Record(r) => r.interval,
        }
    }

    /// The message framed and authenticated under `key` (the pre-shared key for a Hello, the
    /// session key for the rest).
    pub fn encode(&self, key: &[u8]) -> Vec<u8> {
        let mut body = Vec::new();
        match self {
            Message::Hello { up, shape, nonce, .. } => {
                body.push(*up as u8);
                body.extend_from_slice(&[0; 7]);
                put_shape(&mut body, shape);
                body.extend_from_slice(nonce);
            }
            Message::Ready { .. } => {}
            Message::Record(r) => {
                body.push(r.measured as u8);
                body.extend_from_slice(&[0; 7]);
                body.extend_from_slice(&r.packets.to_le_bytes());
                body.extend_from_slice(&(r.lda.len() as u32).to_le_bytes());
                body.extend_from_slice(&(r.rda.len() as u32).to_le_bytes());
                for c in &r.lda {
                    put(&mut body, &[c.ts_sum, c.count, c.id_xor]);
                }
                for b in &r.rda {
                    put(&mut body, &[b.id_xor, b.ts_sum, b.count as u64]);
                }
            }
            Message::Request { ids, .. } => {
                body.extend_from_slice(&(ids.len() as u64).to_le_bytes());
                put(&mut body, ids);
            }
            Message::Stamps { stamps, .. } => {
                body.extend_from_slice(&(stamps.len() as u64).to_le_bytes());
                for s in stamps {
                    put(&mut body, &[s.id, s.ts]);
                }
            }
        }
        frame(self.kind(), self.interval(), &body, key)
    }

    /// Reads one message of at most `max_body` bytes of body from `from`. `Err` says why a
    /// message was refused (the connection is then dropped: after a bad frame the stream cannot
    /// be trusted to be in step); an I/O error, or the peer closing, is an `Err` too.
    pub async fn read(from: &mut (impl AsyncRead + Unpin), key: &[u8], max_body: u32) -> Result<Message, Refusal> {
        let mut header = [0u8; HEADER];
        from.read_exact(&mut header).await.map_err(|e| Refusal::io(format!("reading a message: {e}")))?;
        if header[..4] != MAGIC {
            return Err(Refusal::new(
                "malformed",
                format!("not a pirated segment message (starts {:02x?})", &header[..4]),
            ));
        }
        let version = u16::from_le_bytes([header[4], header[5]]);
        if version != VERSION {
            return Err(Refusal::new("version", format!("protocol version {version}, this pirated speaks {VERSION}")));
        }
        let len = u32::from_le_bytes(header[16..20].try_into().unwrap());
        if len > max_body {
            return Err(Refusal::new("malformed", format!("a body of {len} bytes, above the limit of {max_body}")));
        }
        let mut rest = vec![0u8; len as usize + TAG];
        from.read_exact(&mut rest).await.map_err(|e| Refusal::io(format!("reading a message body: {e}")))?;
        let (body, tag) = rest.split_at(len as usize);
        mac(key).chain_update(header).chain_update(body).verify_slice(tag).map_err(|_| {
            Refusal::new("authentication", "authentication failed (a different key, or a corrupted message)".into())
        })?;
        let interval = u64::from_le_bytes(header[8..16].try_into().unwrap());
        parse(header[6], interval, body)
            .ok_or_else(|| Refusal::new("malformed", format!("a malformed message of kind {}", header[6])))
    }
}

/// A message of kind `kind` for interval `interval` holding `body`, framed and authenticated
/// under `key`: what [`Message::encode`] sends, and what a fuzzer reaches the body parser with.
pub fn frame(kind: u8, interval: u64, body: &[u8], key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + body.len() + TAG);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&[kind, 0]);
    out.extend_from_slice(&interval.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(body);
    let tag = mac(key).chain_update(&out).finalize().into_bytes();
    out.extend_from_slice(&tag);
    out
}

/// Why a message, or a peer, was refused: `reason` labels the metric, `detail` goes to the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `authentication`, `malformed`, `version`, `stale` (an interval already seen, or far from
    /// this point's), `shape` (the points disagree on it), `role`; `io` for a connection lost.
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

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

/// Number of message kinds.
pub const KINDS: usize = 5;

/// The key a connection's messages after the Hellos are authenticated under.
pub fn session_key(key: &[u8], up_nonce: &[u8; NONCE], down_nonce: &[u8; NONCE]) -> [u8; 32] {
    mac(key)
        .chain_update(b"pirated segment session")
        .chain_update(up_nonce)
        .chain_update(down_nonce)
        .finalize()
        .into_bytes()
        .into()
}

/// A fresh nonce from the kernel's random source.
pub fn nonce() -> std::io::Result<[u8; NONCE]> {
    let mut n = [0u8; NONCE];
    // SAFETY: writes at most NONCE bytes into `n`.
    let got = unsafe { libc::getrandom(n.as_mut_ptr().cast(), NONCE, 0) };
    match got == NONCE as isize {
        true => Ok(n),
        false => Err(std::io::Error::last_os_error()),
    }
}

fn mac(key: &[u8]) -> Hmac<Sha256> {
    Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length")
}

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
            let up = r.take(8)?[0] != 0;
            let interval_ns = r.u64()?;
            let (rows, banks, zeros) = (r.u32()?, r.u32()?, r.u32()?.to_le_bytes());
            let rda = RdaShape { buckets: r.u32()?, banks: r.u32()? };
            let (sample_zeros, flags) = (r.u32()?, r.u32()?);
            let shape =
                SegmentShape { interval_ns, lda: LdaShape { rows, banks, zeros }, rda, sample_zeros, flags, _pad: 0 };
            let nonce = r.take(NONCE)?.try_into().ok()?;
            Message::Hello { up, shape, interval, nonce }
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
        4 => {
            let n = r.u64()?;
            let n = r.count(n, 16)?;
            let stamps = (0..n).map(|_| Some(CacheEntry { id: r.u64()?, ts: r.u64()? })).collect::<Option<_>>()?;
            Message::Stamps { interval, stamps }
        }
        5 => Message::Ready { interval },
        _ => return None,
    };
    // Nothing may follow what the kind holds.
    r.0.is_empty().then_some(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"a key of sixteen bytes or more";

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
            Message::Hello { up: true, shape, interval: 5, nonce: [7; NONCE] },
            Message::Ready { interval: 5 },
            Message::Record(record),
            Message::Request { interval: 6, ids: vec![1, 2, u64::MAX] },
            Message::Stamps { interval: 6, stamps: vec![CacheEntry { id: 2, ts: 3 }] },
        ]
    }

    async fn read(bytes: &[u8], key: &[u8]) -> Result<Message, Refusal> {
        Message::read(&mut &bytes[..], key, MAX_BODY).await
    }

    /// Every message reads back as written.
    #[tokio::test]
    async fn messages_round_trip() {
        for m in messages() {
            assert_eq!(read(&m.encode(KEY), KEY).await, Ok(m));
        }
    }

    /// A wrong key, any flipped bit, another version, a truncated frame, an oversized length
    /// and a body longer than its kind holds are each refused with a reason, never a panic.
    #[tokio::test]
    async fn bad_messages_are_refused_with_a_reason() {
        let frame = messages()[2].encode(KEY);
        let refused = |r: Result<Message, Refusal>, what: &str| {
            let refusal = r.expect_err("refused");
            assert!(refusal.detail.contains(what), "{refusal:?} should say {what:?}");
        };
        refused(read(&frame, b"another key, also long enough").await, "authentication");
        for bit in [8 * 9, 8 * 30, 8 * (frame.len() - 1)] {
            let mut flipped = frame.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            refused(read(&flipped, KEY).await, "authentication");
        }
        let mut version = frame.clone();
        version[4] = 9;
        refused(read(&version, KEY).await, "version 9");
        refused(read(&frame[..frame.len() - 1], KEY).await, "reading");
        let mut huge = frame.clone();
        huge[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        refused(read(&huge, KEY).await, "limit");
        refused(read(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", KEY).await, "not a pirated");
        // Before the handshake, a body larger than a Hello's is not read.
        refused(Message::read(&mut &frame[..], KEY, HELLO_BODY).await, "limit");
        // Authentic, but a Request claiming more ids than it carries.
        let mut body = 5u64.to_le_bytes().to_vec();
        body.extend_from_slice(&1u64.to_le_bytes());
        let mut forged = MAGIC.to_vec();
        forged.extend_from_slice(&VERSION.to_le_bytes());
        forged.extend_from_slice(&[3, 0]);
        forged.extend_from_slice(&6u64.to_le_bytes());
        forged.extend_from_slice(&(body.len() as u32).to_le_bytes());
        forged.extend_from_slice(&[0; 4]);
        forged.extend_from_slice(&body);
        let tag = mac(KEY).chain_update(&forged).finalize().into_bytes();
        forged.extend_from_slice(&tag);
        refused(read(&forged, KEY).await, "malformed");
    }

    /// A Hello fits the limit before the handshake; a session key is the connection's own.
    #[test]
    fn hellos_fit_and_session_keys_differ() {
        assert!(messages()[0].encode(KEY).len() <= HEADER + HELLO_BODY as usize + TAG);
        let (a, b) = (nonce().unwrap(), nonce().unwrap());
        assert_ne!(a, b);
        assert_eq!(session_key(KEY, &a, &b), session_key(KEY, &a, &b));
        assert_ne!(session_key(KEY, &a, &b), session_key(KEY, &b, &a));
        assert_ne!(session_key(KEY, &a, &b), session_key(b"another key, also long enough", &a, &b));
    }
}
