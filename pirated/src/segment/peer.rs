//! The TCP link between the two points: the upstream point connects (and reconnects, every
//! second while the downstream one is away), the downstream point listens. A connection first
//! goes through a handshake (a Hello each way under the pre-shared key, then a Ready each way
//! under the connection's session key), and only one that completes it replaces the current
//! connection: a stranger, a wrong key or a recorded connection played again is refused without
//! disturbing the measurement. After it, the link carries messages both ways, each checked
//! against replay: an interval already seen for its kind, or more than a few intervals from this
//! point's clock, is refused. A refused message drops the connection (logged, counted); nothing
//! a peer sends can stop the daemon.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use pirate_common::segment::SegmentShape;
use tokio::{
    io::AsyncWriteExt,
    net::{
        tcp::{OwnedReadHalf, OwnedWriteHalf},
        TcpListener, TcpStream,
    },
    sync::{mpsc, Mutex},
    task::JoinHandle,
};
use tracing::{info, warn};

use super::{
    clock,
    wire::{self, Message, Refusal, HELLO_BODY, KINDS, MAX_BODY},
};

/// Intervals a message may be away from this point's current one.
const WINDOW: u64 = 4;
/// How long a new connection has to complete the handshake.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(5);
/// Messages waiting to be sent, or to be handled, at most.
const QUEUE: usize = 64;

/// This point's end of the link.
pub struct Link {
    /// Messages from the peer, checked.
    pub incoming: mpsc::Receiver<Message>,
    /// Messages to the peer; dropped while it is away.
    pub outgoing: mpsc::Sender<Message>,
    /// Whether a peer is connected and has completed the handshake.
    pub up: Arc<AtomicBool>,
    /// Refusals, for the metrics.
    pub refusals: mpsc::UnboundedReceiver<&'static str>,
}

/// What a connection needs besides its stream.
#[derive(Clone)]
struct Session {
    key: Arc<Vec<u8>>,
    shape: SegmentShape,
    upstream: bool,
    incoming: mpsc::Sender<Message>,
    up: Arc<AtomicBool>,
    refusals: mpsc::UnboundedSender<&'static str>,
}

/// A connection past its handshake, with its session key.
struct Established {
    reader: OwnedReadHalf,
    writer: OwnedWriteHalf,
    peer: String,
    key: [u8; 32],
}

impl Link {
    /// The upstream point's link: connects to `peer` (host:port) and stays connected.
    pub fn connect(peer: String, key: Vec<u8>, shape: SegmentShape) -> Link {
        let (link, session, mut outgoing) = Link::new(key, shape, true);
        tokio::spawn(async move {
            let mut failing = false;
            loop {
                match TcpStream::connect(&peer).await {
                    Ok(stream) => {
                        failing = false;
                        info!(%peer, "segment: connected to the downstream point");
                        if let Some(established) = session.handshake(stream, peer.clone()).await {
                            session.serve(established, &mut outgoing).await;
                        }
                    }
                    Err(e) if !failing => {
                        warn!(%peer, "segment: cannot reach the downstream point ({e}); retrying every second");
                        failing = true;
                    }
                    Err(_) => {}
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        link
    }

    /// The downstream point's link: serves the upstream point on `listener`. Each connection's
    /// handshake runs on its own; the newest connection to complete one replaces the current.
    pub fn listen(listener: TcpListener, key: Vec<u8>, shape: SegmentShape) -> Link {
        let (link, session, outgoing) = Link::new(key, shape, false);
        let outgoing = Arc::new(Mutex::new(outgoing));
        tokio::spawn(async move {
            let (ready, mut established) = mpsc::channel::<Established>(1);
            let mut current: Option<JoinHandle<()>> = None;
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, from)) => {
                            let (session, ready) = (session.clone(), ready.clone());
                            tokio::spawn(async move {
                                if let Some(e) = session.handshake(stream, from.to_string()).await {
                                    let _ = ready.send(e).await;
                                }
                            });
                        }
                        Err(e) => {
                            warn!("segment: accepting a peer connection: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    },
                    Some(e) = established.recv() => {
                        if let Some(old) = current.take().filter(|old| !old.is_finished()) {
                            info!(from = %e.peer, "segment: a newer connection replaces the current one");
                            old.abort();
                        }
                        let (session, outgoing) = (session.clone(), outgoing.clone());
                        // The replaced connection's task releases the queue when its abort lands.
                        current = Some(tokio::spawn(async move { session.serve(e, &mut *outgoing.lock().await).await }));
                    }
                }
            }
        });
        link
    }

    /// Both ends of an in-memory link, for one pirated that is both points: always up, nothing
    /// to authenticate.
    pub fn pair() -> (Link, Link) {
        let (to_up, up_incoming) = mpsc::channel(QUEUE);
        let (to_down, down_incoming) = mpsc::channel(QUEUE);
        let up = Arc::new(AtomicBool::new(true));
        let end =
            |incoming, outgoing| Link { incoming, outgoing, up: up.clone(), refusals: mpsc::unbounded_channel().1 };
        (end(up_incoming, to_down), end(down_incoming, to_up))
    }

    fn new(key: Vec<u8>, shape: SegmentShape, upstream: bool) -> (Link, Session, mpsc::Receiver<Message>) {
        let (incoming_tx, incoming) = mpsc::channel(QUEUE);
        let (outgoing, outgoing_rx) = mpsc::channel(QUEUE);
        let (refusals_tx, refusals) = mpsc::unbounded_channel();
        let up = Arc::new(AtomicBool::new(false));
        let session = Session {
            key: Arc::new(key),
            shape,
            upstream,
            incoming: incoming_tx,
            up: up.clone(),
            refusals: refusals_tx,
        };
        (Link { incoming, outgoing, up, refusals }, session, outgoing_rx)
    }
}

impl Session {
    /// Hellos, then Readys under the session key: the connection established, or refused
    /// (logged and counted) and dropped.
    async fn handshake(&self, stream: TcpStream, peer: String) -> Option<Established> {
        let _ = stream.set_nodelay(true);
        let (mut reader, mut writer) = stream.into_split();
        let steps = async {
            let ours = wire::nonce().map_err(|e| Refusal::io(format!("drawing a nonce: {e}")))?;
            let interval = self.shape.interval(clock::now());
            let hello = Message::Hello { up: self.upstream, shape: self.shape, interval, nonce: ours };
            send(&mut writer, &hello.encode(&self.key)).await?;
            let theirs = self.check_hello(Message::read(&mut reader, &self.key, HELLO_BODY).await?)?;
            let (up, down) = if self.upstream { (&ours, &theirs) } else { (&theirs, &ours) };
            let key = wire::session_key(&self.key, up, down);
            send(&mut writer, &Message::Ready { interval }.encode(&key)).await?;
            match Message::read(&mut reader, &key, 0).await? {
                Message::Ready { interval } => self.fresh(interval)?,
                _ => return Err(Refusal::new("malformed", "the message after the hello was not a ready".into())),
            }
            Ok(key)
        };
        let outcome = tokio::time::timeout(HANDSHAKE_WITHIN, steps)
            .await
            .unwrap_or_else(|_| Err(Refusal::new("malformed", format!("no handshake within {HANDSHAKE_WITHIN:?}"))));
        match outcome {
            Ok(key) => Some(Established { reader, writer, peer, key }),
            Err(refusal) => {
                self.refuse(&peer, refusal);
                None
            }
        }
    }

    /// Runs an established connection until it fails or is refused.
    async fn serve(&self, mut c: Established, outgoing: &mut mpsc::Receiver<Message>) {
        self.up.store(true, Ordering::Relaxed);
        // Stale messages queued while no peer was there are of no use to this one.
        while outgoing.try_recv().is_ok() {}
        let mut last = [0u64; KINDS + 1];
        loop {
            tokio::select! {
                read = Message::read(&mut c.reader, &c.key, MAX_BODY) => {
                    match read.and_then(|m| self.check(&mut last, m)) {
                        Ok(m) => {
                            if self.incoming.send(m).await.is_err() {
                                break;
                            }
                        }
                        Err(refusal) => {
                            self.refuse(&c.peer, refusal);
                            break;
                        }
                    }
                }
                out = outgoing.recv() => {
                    let Some(out) = out else { break };
                    if let Err(e) = c.writer.write_all(&out.encode(&c.key)).await {
                        warn!(peer = %c.peer, "segment: sending to the peer: {e}");
                        break;
                    }
                }
            }
        }
        self.up.store(false, Ordering::Relaxed);
    }

    /// The peer's nonce, if its Hello is one this point can measure with.
    fn check_hello(&self, m: Message) -> Result<[u8; wire::NONCE], Refusal> {
        let Message::Hello { up, shape, interval, nonce } = m else {
            return Err(Refusal::new("malformed", "the first message was not a hello".into()));
        };
        if up == self.upstream {
            let role = if up { "upstream" } else { "downstream" };
            return Err(Refusal::new("role", format!("the peer is {role} too: one point must be up, the other down")));
        }
        if shape != self.shape {
            return Err(Refusal::new(
                "shape",
                format!("the peer's segment settings differ (peer {shape:?}, here {:?}): both points need the same interval, lda_*, rda_*, packets and sample_zeros", self.shape),
            ));
        }
        self.fresh(interval)?;
        Ok(nonce)
    }

    /// Refuses a message of an interval already seen for its kind, or far from now, and a record
    /// whose banks are not of the agreed shape (the reconciliation indexes them by it).
    fn check(&self, last: &mut [u64; KINDS + 1], m: Message) -> Result<Message, Refusal> {
        if let Message::Hello { .. } | Message::Ready { .. } = m {
            return Err(Refusal::new("malformed", "a second handshake".into()));
        }
        if let Message::Record(r) = &m {
            let (lda, rda) = (self.shape.lda.cells(), self.shape.rda.len());
            if (r.lda.len(), r.rda.len()) != (lda, rda) {
                return Err(Refusal::new(
                    "shape",
                    format!(
                        "a record of {} LDA cells and {} RDA buckets, where the agreed shape has {lda} and {rda}",
                        r.lda.len(),
                        r.rda.len()
                    ),
                ));
            }
        }
        let kind = m.kind() as usize;
        let interval = m.interval();
        if interval <= last[kind] {
            return Err(Refusal::new("stale", format!("interval {interval} again (replayed?)")));
        }
        self.fresh(interval)?;
        last[kind] = interval;
        Ok(m)
    }

    fn fresh(&self, interval: u64) -> Result<(), Refusal> {
        let now = self.shape.interval(clock::now());
        match now.abs_diff(interval) <= WINDOW {
            true => Ok(()),
            false => Err(Refusal::new(
                "stale",
                format!("interval {interval} while this point is in {now} (replayed, or the clocks are apart)"),
            )),
        }
    }

    fn refuse(&self, peer: &str, refusal: Refusal) {
        if refusal.reason == "io" {
            info!(%peer, "segment: the peer went away ({refusal})");
            return;
        }
        warn!(%peer, reason = refusal.reason, "segment: refused the peer: {refusal}");
        let _ = self.refusals.send(refusal.reason);
    }
}

async fn send(writer: &mut OwnedWriteHalf, frame: &[u8]) -> Result<(), Refusal> {
    writer.write_all(frame).await.map_err(|e| Refusal::io(format!("sending: {e}")))
}

#[cfg(test)]
mod tests {
    use pirate_common::segment::{lda::LdaCell, rda::RdaShape};

    use super::*;
    use crate::segment::wire::Record;

    /// An authenticated peer's record of another shape than the agreed one is refused at the
    /// link, before the reconciliation indexes its banks by the shape (it panicked there).
    #[test]
    fn a_record_of_another_shape_is_refused() {
        let shape = SegmentShape {
            interval_ns: 1_000_000_000,
            lda: crate::segment::lda::tuned(512, &[0.005, 0.1], 1e5, crate::segment::lda::ALPHA),
            rda: RdaShape { buckets: 64, banks: 2 },
            flags: pirate_common::segment::LDA | pirate_common::segment::RDA,
            ..SegmentShape::default()
        };
        let (_link, session, _out) = Link::new(b"sixteen bytes at least".to_vec(), shape, false);
        let interval = shape.interval(clock::now());
        let record = |lda: usize, rda: usize| {
            let rda = vec![Default::default(); rda];
            Message::Record(Record { interval, measured: true, packets: 1, lda: vec![LdaCell::default(); lda], rda })
        };
        let (cells, buckets) = (shape.lda.cells(), shape.rda.len());
        assert!(cells > 0 && buckets > 0);
        for (lda, rda) in [(0, buckets), (cells, 0), (cells - 1, buckets), (cells, buckets + 1), (0, 0)] {
            let refused = session.check(&mut [0; KINDS + 1], record(lda, rda)).unwrap_err();
            assert_eq!(refused.reason, "shape", "{lda} cells, {rda} buckets: {refused}");
        }
        session.check(&mut [0; KINDS + 1], record(cells, buckets)).unwrap();
    }
}
