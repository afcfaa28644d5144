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
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
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
    time::Instant,
};
use tracing::{debug, info, warn};

use super::{
    clock,
    wire::{self, Message, Refusal, HELLO_BODY, KINDS, MAX_BODY},
};
use crate::limit::Held;

/// Intervals a message may be away from this point's current one.
const WINDOW: u64 = 4;
/// Intervals without a record after which the downstream point closes the connection.
const SILENT_INTERVALS: u64 = 3;
/// How long a new connection has to complete the handshake.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(5);
/// Handshakes the downstream point runs at once, and from one address (an IPv6 /64): beyond, the
/// oldest is closed for the newest, so that strangers cannot take every descriptor (and /metrics
/// with them), nor keep the peer out.
const MAX_HANDSHAKES: usize = 16;
const MAX_HANDSHAKES_PER_SOURCE: usize = 2;
/// Refusals logged at most once this often (each is counted).
const LOG_EVERY: Duration = Duration::from_secs(10);
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
    /// Refusals by reason, for the metrics.
    pub refusals: Arc<Refusals>,
}

/// What a connection needs besides its stream.
#[derive(Clone)]
struct Session {
    key: Arc<Vec<u8>>,
    shape: SegmentShape,
    upstream: bool,
    incoming: mpsc::Sender<Message>,
    up: Arc<AtomicBool>,
    refusals: Arc<Refusals>,
    /// Per reason, when a refusal was last logged, and how many since were not.
    log: Arc<std::sync::Mutex<RefusalLog>>,
}

/// Per refusal reason, when one was last logged, and how many since were not.
type RefusalLog = HashMap<&'static str, (Option<Instant>, u64)>;

/// Why a peer may be refused: each a `reason` label of the metrics.
pub const REASONS: [&str; 9] =
    ["malformed", "authentication", "version", "role", "shape", "stale", "io", "busy", "silent"];

/// Refusals by reason since the metrics last took them: counters, so that a flood of strangers
/// costs no memory.
#[derive(Default)]
pub struct Refusals([AtomicU64; REASONS.len()]);

impl Refusals {
    fn count(&self, reason: &'static str) {
        let i = REASONS.iter().position(|r| *r == reason).unwrap_or(0);
        self.0[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The refusals by reason since the last call.
    pub fn take(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        REASONS.iter().zip(&self.0).map(|(r, n)| (*r, n.swap(0, Ordering::Relaxed))).filter(|(_, n)| *n > 0)
    }
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
            let mut handshakes = Held::new(MAX_HANDSHAKES, MAX_HANDSHAKES_PER_SOURCE);
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, from)) => {
                            // Strangers hold few handshakes and few from one address: the oldest
                            // gives way to the newest, so that a peer's handshake (two round
                            // trips) gets through however many strangers keep connecting.
                            if let Some(evicted) = handshakes.make_room(from.ip()) {
                                evicted.abort();
                                session.refuse(&from.to_string(), Refusal::new("busy", "a newer connection took the place of an older one's handshake".into()));
                            }
                            let (session, ready) = (session.clone(), ready.clone());
                            let task = tokio::spawn(async move {
                                if let Some(e) = session.handshake(stream, from.to_string()).await {
                                    let _ = ready.send(e).await;
                                }
                            });
                            handshakes.hold(from.ip(), task.abort_handle());
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
        let end = |incoming, outgoing| Link { incoming, outgoing, up: up.clone(), refusals: Arc::default() };
        (end(up_incoming, to_down), end(down_incoming, to_up))
    }

    fn new(key: Vec<u8>, shape: SegmentShape, upstream: bool) -> (Link, Session, mpsc::Receiver<Message>) {
        let (incoming_tx, incoming) = mpsc::channel(QUEUE);
        let (outgoing, outgoing_rx) = mpsc::channel(QUEUE);
        let refusals = Arc::new(Refusals::default());
        let up = Arc::new(AtomicBool::new(false));
        let session = Session {
            key: Arc::new(key),
            shape,
            upstream,
            incoming: incoming_tx,
            up: up.clone(),
            refusals: refusals.clone(),
            log: Arc::default(),
        };
        (Link { incoming, outgoing, up, refusals }, session, outgoing_rx)
    }
}

impl Session {
    /// Hellos, then Readys under the session key: the connection established, or refused
    /// (logged and counted) and dropped.
    async fn handshake(&self, stream: TcpStream, peer: String) -> Option<Established> {
        let _ = stream.set_nodelay(true);
        // A peer that vanishes without a word (unplugged, its host down) is found out by TCP:
        // probes after an interval's quiet, and unacknowledged data given up on after
        // `SILENT_INTERVALS` intervals (at least a second each).
        let interval = Duration::from_nanos(self.shape.interval_ns).max(Duration::from_secs(1));
        let socket = socket2::SockRef::from(&stream);
        let keepalive = socket2::TcpKeepalive::new().with_time(interval).with_interval(interval).with_retries(3);
        if let Err(e) = socket
            .set_tcp_keepalive(&keepalive)
            .and_then(|()| socket.set_tcp_user_timeout(Some(interval * SILENT_INTERVALS as u32)))
        {
            debug!(%peer, "segment: TCP keepalive: {e}");
        }
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

    /// Runs an established connection until it fails, is refused, or (at the downstream point)
    /// falls silent: no record for `SILENT_INTERVALS` intervals closes it. Reading and writing
    /// run side by side, neither ever cut off in the middle of a message.
    async fn serve(&self, c: Established, outgoing: &mut mpsc::Receiver<Message>) {
        self.up.store(true, Ordering::Relaxed);
        // Stale messages queued while no peer was there are of no use to this one.
        while outgoing.try_recv().is_ok() {}
        let Established { mut reader, mut writer, peer, key } = c;
        let silence = Duration::from_nanos(self.shape.interval_ns.saturating_mul(SILENT_INTERVALS));
        let reading = async {
            let mut last = [0u64; KINDS + 1];
            let mut deadline = Instant::now() + silence;
            loop {
                let read = Message::read(&mut reader, &key, MAX_BODY);
                let m = match self.upstream {
                    true => read.await,
                    false => tokio::time::timeout_at(deadline, read).await.unwrap_or_else(|_| {
                        Err(Refusal::new("silent", format!("no record for {SILENT_INTERVALS} intervals")))
                    }),
                };
                let m = m.and_then(|m| self.check(&mut last, m))?;
                if let Message::Record(_) = m {
                    deadline = Instant::now() + silence;
                }
                if self.incoming.send(m).await.is_err() {
                    return Ok(());
                }
            }
        };
        let writing = async {
            while let Some(out) = outgoing.recv().await {
                if let Err(e) = writer.write_all(&out.encode(&key)).await {
                    warn!(%peer, "segment: sending to the peer: {e}");
                    break;
                }
            }
        };
        tokio::select! {
            read = reading => {
                if let Err(refusal) = read {
                    self.refuse(&peer, refusal);
                }
            }
            () = writing => {}
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

    /// Counts a refusal, and logs it unless one of its reason was logged within `LOG_EVERY`
    /// (the next one logged says how many of that reason were not): strangers' refusals cannot
    /// flood the log, nor hide the peer's.
    fn refuse(&self, peer: &str, refusal: Refusal) {
        self.refusals.count(refusal.reason);
        let unlogged = {
            let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
            let (last, unlogged) = log.entry(refusal.reason).or_default();
            if last.is_some_and(|at| at.elapsed() < LOG_EVERY) {
                *unlogged += 1;
                return;
            }
            *last = Some(Instant::now());
            std::mem::take(unlogged)
        };
        match refusal.reason {
            "io" => info!(%peer, unlogged, "segment: the peer went away ({refusal})"),
            reason => warn!(%peer, reason, unlogged, "segment: refused the peer: {refusal}"),
        }
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

    const KEY: &[u8] = b"sixteen bytes at least";

    /// Both points' shape, with intervals of `interval_ms`.
    fn shape(interval_ms: u64) -> SegmentShape {
        SegmentShape {
            interval_ns: interval_ms * 1_000_000,
            lda: crate::segment::lda::tuned(512, &[0.005, 0.1], 1e5, crate::segment::lda::ALPHA),
            rda: RdaShape { buckets: 64, banks: 2 },
            flags: pirate_common::segment::LDA | pirate_common::segment::RDA,
            ..SegmentShape::default()
        }
    }

    /// The downstream point listening on a port of its own, and that port.
    async fn downstream(shape: SegmentShape) -> (Link, std::net::SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (Link::listen(listener, KEY.to_vec(), shape), addr)
    }

    /// Whether `up` reads `want` within `within`.
    async fn becomes(up: &AtomicBool, want: bool, within: Duration) -> bool {
        let until = Instant::now() + within;
        while Instant::now() < until {
            if up.load(Ordering::Relaxed) == want {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    /// Strangers that connect and say nothing hold at most a few handshakes, fewer from one
    /// address: the older ones are closed for the newer (counted as busy), and the upstream
    /// point, from another address, still gets in (each used to be held for the handshake's 5 s,
    /// and 1 500 of them took every descriptor).
    #[tokio::test]
    async fn strangers_hold_few_handshakes_and_the_upstream_still_gets_in() {
        let (down, addr) = downstream(shape(1000)).await;
        let mut strangers = Vec::new();
        for _ in 0..40 {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(([127, 0, 0, 2], 0).into()).unwrap();
            strangers.push(socket.connect(addr).await.unwrap());
        }
        let mut closed = 0;
        for s in &mut strangers {
            // D's Hello may come first; closed is the end of what it sends.
            let mut said = Vec::new();
            let read =
                tokio::time::timeout(Duration::from_millis(500), tokio::io::AsyncReadExt::read_to_end(s, &mut said));
            closed += usize::from(read.await.is_ok());
        }
        assert_eq!(closed, 40 - MAX_HANDSHAKES_PER_SOURCE, "strangers closed at once");
        let busy: u64 = down.refusals.take().filter(|(r, _)| *r == "busy").map(|(_, n)| n).sum();
        assert_eq!(busy as usize, 40 - MAX_HANDSHAKES_PER_SOURCE);
        let _up = Link::connect(addr.to_string(), KEY.to_vec(), shape(1000));
        assert!(becomes(&down.up, true, Duration::from_secs(3)).await, "the upstream point never got in");
    }

    /// An upstream point that stays connected but sends no record for three intervals is
    /// dropped: the downstream point's link goes down, and says why.
    #[tokio::test]
    async fn a_silent_upstream_is_dropped() {
        let (down, addr) = downstream(shape(100)).await;
        let _up = Link::connect(addr.to_string(), KEY.to_vec(), shape(100));
        assert!(becomes(&down.up, true, Duration::from_secs(3)).await, "the upstream point never got in");
        let since = Instant::now();
        assert!(becomes(&down.up, false, Duration::from_secs(2)).await, "a silent peer stayed up");
        assert!(since.elapsed() >= Duration::from_millis(250), "dropped after {:?}", since.elapsed());
        assert!(down.refusals.take().any(|(r, n)| r == "silent" && n > 0), "not counted as silent");
    }

    /// An authenticated peer's record of another shape than the agreed one is refused at the
    /// link, before the reconciliation indexes its banks by the shape (it panicked there).
    #[test]
    fn a_record_of_another_shape_is_refused() {
        let shape = shape(1000);
        let (_link, session, _out) = Link::new(KEY.to_vec(), shape, false);
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
