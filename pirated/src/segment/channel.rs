//! The secure channel between a segment's two points: Noise `NNpsk0` (X25519, ChaCha20-Poly1305,
//! BLAKE2s) under the pre-shared key, through `snow`.
//!
//! The upstream point U opens with the preamble (magic and version: D tells a peer of another
//! version from one without the key) and the handshake's first message: its ephemeral key, and
//! the interval it is in, under the pre-shared key. The downstream point D answers only a first
//! message that verifies (a stranger gets not a byte to guess the key against), is of an
//! interval near its own and was not seen before (see `peer`), with its own ephemeral key and
//! its Hello; U's first transport message is its Hello. From there each direction has its own
//! key, drawn from both ephemerals, the pre-shared key and the whole transcript (the preamble
//! included); messages are numbered by the channel, so that one replayed, reordered, dropped or
//! reflected fails to open and closes the connection.
//!
//! On the wire: the preamble, then Noise messages, each behind its length (u16, little-endian);
//! a peer message longer than one Noise message carries goes in several, in order.

use std::sync::Arc;

use snow::{Builder, HandshakeState, StatelessTransportState};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::wire::{Message, Refusal, HEADER, HELLO_BODY};
use crate::psk::Psk;

/// The Noise protocol, in Noise's own naming.
pub const PARAMS: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";
pub const MAGIC: [u8; 4] = *b"PSEG";
/// The protocol's version: D refuses a peer speaking another, logging both numbers.
pub const VERSION: u16 = 3;
/// What U sends first, in the clear (and bound into the handshake as its prologue).
pub const PREAMBLE: [u8; 8] = {
    let v = VERSION.to_le_bytes();
    [MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], v[0], v[1], 0, 0]
};
/// Bytes of an ephemeral key.
const KEY: usize = 32;
const TAG: usize = 16;
/// Bytes of the handshake's first message: U's ephemeral key, and its interval (u64) sealed.
pub const FIRST: usize = KEY + 8 + TAG;
/// The longest Noise message.
pub const MAX_NOISE: usize = 65535;
/// The most plaintext one Noise message carries.
const CHUNK: usize = MAX_NOISE - TAG;

/// U's side of a handshake under way.
pub struct Initiator(HandshakeState);

impl Initiator {
    /// U's handshake begun in `interval`, and what U sends to begin it: the preamble and the
    /// first message.
    pub fn start(psk: &Psk, interval: u64) -> Result<(Initiator, Vec<u8>), Refusal> {
        let mut state = builder(psk)?.build_initiator().map_err(noise)?;
        let mut first = [0u8; FIRST];
        let n = state.write_message(&interval.to_le_bytes(), &mut first).map_err(noise)?;
        let mut out = PREAMBLE.to_vec();
        out.extend_from_slice(&(n as u16).to_le_bytes());
        out.extend_from_slice(&first[..n]);
        Ok((Initiator(state), out))
    }

    /// D's answer (one Noise message, without its length) taken: D's Hello, and the channel.
    pub fn finish(mut self, answer: &[u8]) -> Result<(Message, Sealer, Opener), Refusal> {
        let mut payload = vec![0u8; answer.len()];
        let n = self.0.read_message(answer, &mut payload).map_err(unauthentic)?;
        let hello = Message::decode(&payload[..n])?;
        let (sealer, opener) = split(self.0)?;
        Ok((hello, sealer, opener))
    }
}

/// D's side of a handshake whose first message verified.
pub struct Responder(HandshakeState);

impl Responder {
    /// U's first message (its preamble checked, see [`read_first`]) verified under the key:
    /// D's side, and the interval U says it is in; or a refusal, and D sends nothing.
    pub fn verify(psk: &Psk, first: &[u8; FIRST]) -> Result<(Responder, u64), Refusal> {
        let mut state = builder(psk)?.build_responder().map_err(noise)?;
        let mut interval = [0u8; 8];
        let n = state.read_message(first, &mut interval).map_err(unauthentic)?;
        match n == interval.len() {
            true => Ok((Responder(state), u64::from_le_bytes(interval))),
            false => Err(Refusal::new("malformed", format!("a first message carrying {n} bytes, not 8"))),
        }
    }

    /// What D sends back (its ephemeral key and `hello`, behind their length), and the channel.
    pub fn answer(mut self, hello: &Message) -> Result<(Vec<u8>, Sealer, Opener), Refusal> {
        let hello = hello.encode();
        let mut answer = vec![0u8; 2 + KEY + hello.len() + TAG];
        let n = self.0.write_message(&hello, &mut answer[2..]).map_err(noise)?;
        answer[..2].copy_from_slice(&(n as u16).to_le_bytes());
        let (sealer, opener) = split(self.0)?;
        Ok((answer, sealer, opener))
    }
}

/// The ephemeral key a first message carries: the same in a first message played again.
pub fn ephemeral(first: &[u8; FIRST]) -> [u8; KEY] {
    first[..KEY].try_into().unwrap()
}

/// The longest answer D sends: its ephemeral key and its Hello, sealed.
pub const MAX_ANSWER: usize = KEY + HEADER + HELLO_BODY as usize + TAG;

/// U's preamble and first message, as D reads them: nothing more is read from a stranger.
pub async fn read_first(from: &mut (impl AsyncRead + Unpin)) -> Result<[u8; FIRST], Refusal> {
    let mut preamble = [0u8; PREAMBLE.len()];
    from.read_exact(&mut preamble).await.map_err(|e| Refusal::io(format!("reading the preamble: {e}")))?;
    if preamble[..4] != MAGIC {
        let detail = format!("not a pirated segment peer (starts {:02x?})", &preamble[..4]);
        return Err(Refusal::new("malformed", detail));
    }
    let version = u16::from_le_bytes([preamble[4], preamble[5]]);
    if version != VERSION {
        return Err(Refusal::new("version", format!("protocol version {version}, this pirated speaks {VERSION}")));
    }
    let mut len = [0u8; 2];
    from.read_exact(&mut len).await.map_err(|e| Refusal::io(format!("reading the handshake: {e}")))?;
    if usize::from(u16::from_le_bytes(len)) != FIRST || preamble[6..] != [0, 0] {
        return Err(Refusal::new("malformed", "a handshake of another form than NNpsk0's first message".into()));
    }
    let mut first = [0u8; FIRST];
    from.read_exact(&mut first).await.map_err(|e| Refusal::io(format!("reading the handshake: {e}")))?;
    Ok(first)
}

/// One Noise message of at most `max` bytes, read behind its length (a longer one is refused
/// before it is read).
pub async fn read_noise(from: &mut (impl AsyncRead + Unpin), max: usize) -> Result<Vec<u8>, Refusal> {
    let mut len = [0u8; 2];
    from.read_exact(&mut len).await.map_err(|e| Refusal::io(format!("reading from the peer: {e}")))?;
    let len = usize::from(u16::from_le_bytes(len));
    if len > max {
        return Err(Refusal::new("malformed", format!("a message of {len} bytes where at most {max} may come")));
    }
    let mut message = vec![0u8; len];
    from.read_exact(&mut message).await.map_err(|e| Refusal::io(format!("reading from the peer: {e}")))?;
    Ok(message)
}

/// The sending half of a channel.
pub struct Sealer {
    state: Arc<StatelessTransportState>,
    nonce: u64,
}

impl Sealer {
    /// `m`'s bytes on the wire: in Noise messages, each behind its length.
    pub fn seal(&mut self, m: &Message) -> Vec<u8> {
        let plain = m.encode();
        let mut out = Vec::with_capacity(plain.len() + plain.len().div_ceil(CHUNK) * (2 + TAG));
        for chunk in plain.chunks(CHUNK) {
            let at = out.len();
            out.resize(at + 2 + chunk.len() + TAG, 0);
            // A chunk fits a Noise message, and 2^64 messages are never sent: this cannot fail.
            let n = self.state.write_message(self.nonce, chunk, &mut out[at + 2..]).expect("a chunk fits");
            out[at..at + 2].copy_from_slice(&(n as u16).to_le_bytes());
            self.nonce += 1;
        }
        out
    }
}

/// The receiving half of a channel.
pub struct Opener {
    state: Arc<StatelessTransportState>,
    nonce: u64,
}

impl Opener {
    /// The next message, of at most `max_body` bytes of body, or why it was refused (the
    /// connection is then dropped: after a bad message the stream cannot be trusted). Nothing
    /// longer than such a message is read.
    pub async fn read(&mut self, from: &mut (impl AsyncRead + Unpin), max_body: u32) -> Result<Message, Refusal> {
        let max = (HEADER + max_body as usize + TAG).min(MAX_NOISE);
        let mut plain = Vec::new();
        self.open(&read_noise(from, max).await?, &mut plain)?;
        let Some(header) = plain.first_chunk::<HEADER>() else {
            return Err(Refusal::new(
                "malformed",
                format!("a message of {} bytes, shorter than a header", plain.len()),
            ));
        };
        let whole = HEADER + Message::body_len(header, max_body)?;
        while plain.len() < whole {
            self.open(&read_noise(from, max).await?, &mut plain)?;
        }
        Message::decode(&plain)
    }

    /// Opens one Noise message onto the end of `plain`.
    fn open(&mut self, message: &[u8], plain: &mut Vec<u8>) -> Result<(), Refusal> {
        let at = plain.len();
        plain.resize(at + message.len(), 0);
        let n = self.state.read_message(self.nonce, message, &mut plain[at..]).map_err(unauthentic)?;
        plain.truncate(at + n);
        self.nonce += 1;
        Ok(())
    }
}

fn builder(psk: &Psk) -> Result<Builder<'_>, Refusal> {
    Builder::new(PARAMS.parse().map_err(noise)?).prologue(&PREAMBLE).and_then(|b| b.psk(0, psk.bytes())).map_err(noise)
}

fn split(state: HandshakeState) -> Result<(Sealer, Opener), Refusal> {
    let state = Arc::new(state.into_stateless_transport_mode().map_err(noise)?);
    Ok((Sealer { state: state.clone(), nonce: 0 }, Opener { state, nonce: 0 }))
}

/// A message that does not open: another key, or one not sent in this connection, in this order.
fn unauthentic(e: snow::Error) -> Refusal {
    Refusal::new("authentication", format!("a message that does not open ({e}): another key, or not this connection's"))
}

/// The handshake failed on this side (its random source, say).
fn noise(e: snow::Error) -> Refusal {
    Refusal::io(format!("Noise: {e}"))
}

#[cfg(test)]
mod tests {
    use pirate_common::segment::SegmentShape;

    use super::*;
    use crate::segment::wire::{Record, MAX_BODY};

    fn hello(interval: u64) -> Message {
        Message::Hello { shape: SegmentShape { interval_ns: 1_000_000_000, ..Default::default() }, interval }
    }

    /// D's side of a handshake U began under `psk`, from what U sent.
    async fn verify(psk: &Psk, sent: &[u8]) -> Result<(Responder, u64), Refusal> {
        Responder::verify(psk, &read_first(&mut &sent[..]).await?)
    }

    /// Both ends of a channel after a handshake under `psk`, as each sees the other's Hello.
    async fn pair(psk: &Psk) -> ((Sealer, Opener), (Sealer, Opener)) {
        let (u, sent) = Initiator::start(psk, 2).unwrap();
        let (d, interval) = verify(psk, &sent).await.unwrap();
        assert_eq!(interval, 2);
        let (answer, d_sealer, d_opener) = d.answer(&hello(2)).unwrap();
        let (theirs, u_sealer, u_opener) = u.finish(&read_noise(&mut &answer[..], MAX_ANSWER).await.unwrap()).unwrap();
        assert_eq!(theirs, hello(2));
        ((u_sealer, u_opener), (d_sealer, d_opener))
    }

    /// Messages travel both ways, a large record in several Noise messages.
    #[tokio::test]
    async fn messages_travel_both_ways() {
        let psk = Psk::generate().unwrap();
        let ((mut u_out, mut u_in), (mut d_out, mut d_in)) = pair(&psk).await;
        let record =
            Message::Record(Record { interval: 9, lda: vec![Default::default(); 10_000], ..Default::default() });
        let sent = u_out.seal(&record);
        assert!(sent.len() > MAX_NOISE);
        assert_eq!(d_in.read(&mut &sent[..], MAX_BODY).await, Ok(record));
        let request = Message::Request { interval: 9, ids: vec![1, 2] };
        assert_eq!(u_in.read(&mut &d_out.seal(&request)[..], MAX_BODY).await, Ok(request));
    }

    /// A message played again, out of order, reflected to its sender, or sealed under another
    /// key does not open; a first message under another key does not verify.
    #[tokio::test]
    async fn replayed_reordered_reflected_or_foreign_messages_do_not_open() {
        let psk = Psk::generate().unwrap();
        let ((mut u_out, mut u_in), (_, mut d_in)) = pair(&psk).await;
        let (a, b) = (u_out.seal(&hello(3)), u_out.seal(&hello(4)));
        let refused = |r: Result<Message, Refusal>| assert_eq!(r.unwrap_err().reason, "authentication");
        // Reordered: b before a.
        refused(d_in.read(&mut &b[..], MAX_BODY).await);
        let ((mut u_out, mut u_in2), (_, mut d_in)) = pair(&psk).await;
        let a2 = u_out.seal(&hello(3));
        assert_eq!(d_in.read(&mut &a2[..], MAX_BODY).await, Ok(hello(3)));
        // Played again within the connection, and from the earlier one.
        refused(d_in.read(&mut &a2[..], MAX_BODY).await);
        refused(d_in.read(&mut &a[..], MAX_BODY).await);
        // Reflected: U's own message back to U.
        refused(u_in.read(&mut &a[..], MAX_BODY).await);
        refused(u_in2.read(&mut &u_out.seal(&hello(5))[..], MAX_BODY).await);
        // Another key.
        let (_, sent) = Initiator::start(&Psk::generate().unwrap(), 2).unwrap();
        assert_eq!(verify(&psk, &sent).await.err().unwrap().reason, "authentication");
    }

    /// A stranger's bytes, another version, and a first message of another length are refused
    /// before any cryptography; before the key is proved, nothing longer than a Hello is read.
    #[tokio::test]
    async fn strangers_are_refused_by_their_preamble_and_lengths() {
        let reason = |bytes: Vec<u8>| async move { read_first(&mut &bytes[..]).await.unwrap_err().reason };
        assert_eq!(reason(b"GET / HTTP/1.1\r\n\r\n".to_vec()).await, "malformed");
        let mut other = PREAMBLE.to_vec();
        other[4] = 2;
        assert_eq!(reason(other).await, "version");
        let (_, sent) = Initiator::start(&Psk::generate().unwrap(), 2).unwrap();
        let mut long = sent.clone();
        long[PREAMBLE.len()] += 1;
        assert_eq!(reason(long).await, "malformed");
        assert_eq!(reason(sent[..sent.len() - 1].to_vec()).await, "io");
        let announced = [&[0xff, 0xff][..], &[0; 64]].concat();
        let refused = read_noise(&mut &announced[..], MAX_ANSWER).await.unwrap_err();
        assert!(refused.detail.contains("65535 bytes"), "{refused}");
    }
}
