//! The secure channel between a segment's two points: Noise `NNpsk0` (X25519, ChaCha20-Poly1305,
//! BLAKE2s) under the pre-shared key, through `snow`.
//!
//! The upstream point U opens with the preamble (magic and version: a peer of another version
//! is told apart from one without the key) and the handshake's first message, its ephemeral
//! key under the pre-shared key. The downstream point D answers only a first message that
//! verifies (a stranger gets not a byte to guess the key against), with its own ephemeral key
//! and its Hello; U's first transport message is its Hello. From there each direction has its
//! own key, drawn from both ephemerals, the pre-shared key and the whole transcript (the
//! preamble included); messages are numbered by the channel, so that one replayed, reordered,
//! dropped or reflected fails to open and closes the connection. A recorded first message
//! played again gets D's answer, but the player cannot go on without U's ephemeral secret.
//!
//! On the wire: the preamble, then Noise messages, each behind its length (u16, little-endian);
//! a peer message longer than one Noise message carries goes in several, in order.

use std::sync::Arc;

use snow::{Builder, HandshakeState, StatelessTransportState};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::{
    key::Psk,
    wire::{Message, Refusal, HEADER},
};

/// The Noise protocol, in Noise's own naming.
pub const PARAMS: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";
pub const MAGIC: [u8; 4] = *b"PSEG";
/// The protocol's version: a peer speaking another is refused with both numbers.
pub const VERSION: u16 = 3;
/// What U sends first, in the clear (and bound into the handshake as its prologue).
pub const PREAMBLE: [u8; 8] = {
    let v = VERSION.to_le_bytes();
    [MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], v[0], v[1], 0, 0]
};
/// Bytes of the handshake's first message: U's ephemeral key, and the tag of an empty payload.
pub const FIRST: usize = 48;
/// The longest Noise message.
pub const MAX_NOISE: usize = 65535;
const TAG: usize = 16;
/// The most plaintext one Noise message carries.
const CHUNK: usize = MAX_NOISE - TAG;

/// U's side of a handshake under way.
pub struct Initiator(HandshakeState);

impl Initiator {
    /// U's handshake begun, and what U sends to begin it: the preamble and the first message.
    pub fn start(psk: &Psk) -> Result<(Initiator, Vec<u8>), Refusal> {
        let mut state = builder(psk)?.build_initiator().map_err(noise)?;
        let mut first = [0u8; FIRST];
        let n = state.write_message(&[], &mut first).map_err(noise)?;
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

/// D's answer to U's first message (its preamble checked, see [`read_first`]): what D sends
/// back (its ephemeral key and `hello`, behind their length), and the channel; or a refusal,
/// and D sends nothing.
pub fn respond(psk: &Psk, first: &[u8; FIRST], hello: &Message) -> Result<(Vec<u8>, Sealer, Opener), Refusal> {
    let mut state = builder(psk)?.build_responder().map_err(noise)?;
    state.read_message(first, &mut []).map_err(unauthentic)?;
    let mut answer = vec![0u8; 2 + MAX_NOISE];
    let n = state.write_message(&hello.encode(), &mut answer[2..]).map_err(noise)?;
    answer[..2].copy_from_slice(&(n as u16).to_le_bytes());
    answer.truncate(2 + n);
    let (sealer, opener) = split(state)?;
    Ok((answer, sealer, opener))
}

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

/// One Noise message, read behind its length.
pub async fn read_noise(from: &mut (impl AsyncRead + Unpin)) -> Result<Vec<u8>, Refusal> {
    let mut len = [0u8; 2];
    from.read_exact(&mut len).await.map_err(|e| Refusal::io(format!("reading from the peer: {e}")))?;
    let mut message = vec![0u8; usize::from(u16::from_le_bytes(len))];
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
    /// connection is then dropped: after a bad message the stream cannot be trusted).
    pub async fn read(&mut self, from: &mut (impl AsyncRead + Unpin), max_body: u32) -> Result<Message, Refusal> {
        let mut plain = Vec::new();
        self.open(&read_noise(from).await?, &mut plain)?;
        let Some(header) = plain.first_chunk::<HEADER>() else {
            return Err(Refusal::new(
                "malformed",
                format!("a message of {} bytes, shorter than a header", plain.len()),
            ));
        };
        let whole = HEADER + Message::body_len(header, max_body)?;
        while plain.len() < whole {
            self.open(&read_noise(from).await?, &mut plain)?;
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

    /// Both ends of a channel after a handshake under `psk`, as each sees the other's Hello.
    async fn pair(psk: &Psk) -> ((Sealer, Opener), (Sealer, Opener)) {
        let (u, sent) = Initiator::start(psk).unwrap();
        let first = read_first(&mut &sent[..]).await.unwrap();
        let (answer, d_sealer, d_opener) = respond(psk, &first, &hello(2)).unwrap();
        let (theirs, u_sealer, u_opener) = u.finish(&read_noise(&mut &answer[..]).await.unwrap()).unwrap();
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
    /// key does not open; a first message under another key gets no answer.
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
        let (_, sent) = Initiator::start(&Psk::generate().unwrap()).unwrap();
        let first = read_first(&mut &sent[..]).await.unwrap();
        assert_eq!(respond(&psk, &first, &hello(2)).err().unwrap().reason, "authentication");
    }

    /// A stranger's bytes, another version, and a first message of another length are refused
    /// before any cryptography.
    #[tokio::test]
    async fn strangers_are_refused_by_their_preamble() {
        let reason = |bytes: Vec<u8>| async move { read_first(&mut &bytes[..]).await.unwrap_err().reason };
        assert_eq!(reason(b"GET / HTTP/1.1\r\n\r\n".to_vec()).await, "malformed");
        let mut other = PREAMBLE.to_vec();
        other[4] = 2;
        assert_eq!(reason(other).await, "version");
        let (_, sent) = Initiator::start(&Psk::generate().unwrap()).unwrap();
        let mut long = sent.clone();
        long[PREAMBLE.len()] += 1;
        assert_eq!(reason(long).await, "malformed");
        assert_eq!(reason(sent[..sent.len() - 1].to_vec()).await, "io");
    }
}
