//! The TCP link between the two points: the upstream point connects (and reconnects, every
//! second while the downstream one is away), the downstream point listens, and a newer
//! connection replaces an older one. Each side starts with a Hello; the link then carries
//! messages both ways, each checked against replay: an interval already seen for its kind, or
//! more than a few intervals from this point's clock, is refused. A refused message drops the
//! connection (logged, counted); nothing a peer sends can stop the daemon.

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
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tracing::{info, warn};

use super::{
    clock,
    wire::{Message, Refusal},
};

/// Intervals a message may be away from this point's current one.
const WINDOW: u64 = 4;
/// How long a new connection has to say Hello.
const HELLO_WITHIN: Duration = Duration::from_secs(5);
/// Messages waiting to be sent, or to be handled, at most.
const QUEUE: usize = 64;

/// This point's end of the link.
pub struct Link {
    /// Messages from the peer, checked.
    pub incoming: mpsc::Receiver<Message>,
    /// Messages to the peer; dropped while it is away.
    pub outgoing: mpsc::Sender<Message>,
    /// Whether a peer is connected and has said Hello.
    pub up: Arc<AtomicBool>,
    /// Refusals, for the metrics.
    pub refusals: mpsc::UnboundedReceiver<&'static str>,
}

/// What a session needs besides its stream.
#[derive(Clone)]
struct Session {
    key: Arc<Vec<u8>>,
    shape: SegmentShape,
    upstream: bool,
    incoming: mpsc::Sender<Message>,
    up: Arc<AtomicBool>,
    refusals: mpsc::UnboundedSender<&'static str>,
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
                        session.run(stream, &mut outgoing).await;
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

    /// The downstream point's link: serves the upstream point on `listener`.
    pub fn listen(listener: TcpListener, key: Vec<u8>, shape: SegmentShape) -> Link {
        let (link, session, mut outgoing) = Link::new(key, shape, false);
        tokio::spawn(async move {
            let mut next: Option<(TcpStream, std::net::SocketAddr)> = None;
            loop {
                let (stream, from) = match next.take() {
                    Some(accepted) => accepted,
                    None => match listener.accept().await {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            warn!("segment: accepting a peer connection: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    },
                };
                info!(%from, "segment: the upstream point connected");
                tokio::select! {
                    () = session.run(stream, &mut outgoing) => {}
                    accepted = listener.accept() => {
                        if let Ok(accepted) = accepted {
                            info!(from = %accepted.1, "segment: a newer connection replaces the current one");
                            next = Some(accepted);
                        }
                    }
                }
                session.up.store(false, Ordering::Relaxed);
            }
        });
        link
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
    /// Runs one connection until it fails or is refused.
    async fn run(&self, stream: TcpStream, outgoing: &mut mpsc::Receiver<Message>) {
        let _ = stream.set_nodelay(true);
        let peer = stream.peer_addr().map_or_else(|_| "?".into(), |a| a.to_string());
        let (mut reader, mut writer) = stream.into_split();
        let interval = self.shape.interval(clock::now());
        let hello = Message::Hello { up: self.upstream, shape: self.shape, interval }.encode(&self.key);
        if let Err(e) = writer.write_all(&hello).await {
            warn!(%peer, "segment: saying hello: {e}");
            return;
        }
        let greeted = match tokio::time::timeout(HELLO_WITHIN, Message::read(&mut reader, &self.key)).await {
            Ok(Ok(m)) => self.check_hello(m),
            Ok(Err(refusal)) => Err(refusal),
            Err(_) => Err(Refusal::new("malformed", format!("no hello within {HELLO_WITHIN:?}"))),
        };
        if let Err(refusal) = greeted {
            self.refuse(&peer, refusal);
            return;
        }
        self.up.store(true, Ordering::Relaxed);
        // Stale messages queued while no peer was there are of no use to this one.
        while outgoing.try_recv().is_ok() {}
        let mut last = [0u64; 5];
        loop {
            tokio::select! {
                read = Message::read(&mut reader, &self.key) => {
                    let checked = read.and_then(|m| self.check(&mut last, m));
                    match checked {
                        Ok(m) => {
                            if self.incoming.send(m).await.is_err() {
                                return;
                            }
                        }
                        Err(refusal) => {
                            self.refuse(&peer, refusal);
                            break;
                        }
                    }
                }
                out = outgoing.recv() => {
                    let Some(out) = out else { return };
                    if let Err(e) = writer.write_all(&out.encode(&self.key)).await {
                        warn!(%peer, "segment: sending to the peer: {e}");
                        break;
                    }
                }
            }
        }
        self.up.store(false, Ordering::Relaxed);
    }

    fn check_hello(&self, m: Message) -> Result<(), Refusal> {
        let Message::Hello { up, shape, interval } = m else {
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
        self.fresh(interval)
    }

    /// Refuses a message of an interval already seen for its kind, or far from now.
    fn check(&self, last: &mut [u64; 5], m: Message) -> Result<Message, Refusal> {
        if let Message::Hello { .. } = m {
            return Err(Refusal::new("malformed", "a second hello".into()));
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
