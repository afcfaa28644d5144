//! The TCP link between the two points: the upstream point connects (and reconnects, every
//! second while the downstream one is away), the downstream point listens. A connection first
//! goes through the secure channel's handshake ([`super::channel`]), the Hellos inside it, and
//! only one that completes it replaces the current connection: a stranger, a wrong key or a
//! recorded connection played again is refused without disturbing the measurement. After it,
//! the link carries messages both ways, in a channel that refuses any message not sent in it,
//! in order; each kind must also move on to newer intervals near this point's clock. A refused
//! message drops the connection (logged, counted); nothing a peer sends can stop the daemon.

use std::{
    collections::HashMap,
    future::Future,
    net::IpAddr,
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
    channel::{self, Initiator, Opener, Responder, Sealer, MAX_ANSWER},
    wire::{Message, Refusal, HELLO_BODY, KINDS, MAX_BODY, TIMES},
};
use crate::{clock, limit::Held, psk::Psk};

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
/// Handshakes whose first message verified, at once: the upstream point's, which a stranger
/// cannot crowd out (a first message played again is refused before it gets here).
const MAX_PROVED: usize = 4;
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
    key: Arc<Psk>,
    shape: SegmentShape,
    upstream: bool,
    incoming: mpsc::Sender<Message>,
    up: Arc<AtomicBool>,
    refusals: Arc<Refusals>,
    /// Per reason, when a refusal was last logged, and how many since were not.
    log: Arc<std::sync::Mutex<RefusalLog>>,
    /// The ephemeral keys of the first messages verified, with the interval each said, for as
    /// long as that interval is fresh (see `Session::first_time`).
    seen: Arc<std::sync::Mutex<HashMap<[u8; 32], u64>>>,
}

/// Per refusal reason, when one was last logged, and how many since were not.
type RefusalLog = HashMap<&'static str, (Option<Instant>, u64)>;

/// Why a peer may be refused: each a `reason` label of the metrics.
pub const REASONS: [&str; 8] = ["malformed", "authentication", "version", "shape", "stale", "io", "busy", "silent"];

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

/// A connection past its handshake, with its channel's halves.
struct Established {
    reader: OwnedReadHalf,
    writer: OwnedWriteHalf,
    peer: String,
    sealer: Sealer,
    opener: Opener,
}

impl Link {
    /// The upstream point's link: connects to `peer` (host:port) and stays connected.
    pub fn connect(peer: String, key: Psk, shape: SegmentShape) -> Link {
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
    /// handshake runs on its own, among strangers until its first message verifies, then among
    /// the connections that proved the key; the newest to complete one replaces the current.
    pub fn listen(listener: TcpListener, key: Psk, shape: SegmentShape) -> Link {
        let (link, session, outgoing) = Link::new(key, shape, false);
        let outgoing = Arc::new(Mutex::new(outgoing));
        tokio::spawn(async move {
            let (ready, mut established) = mpsc::channel::<Established>(1);
            let (proving, mut proved) = mpsc::channel::<(IpAddr, Established)>(MAX_PROVED);
            let mut current: Option<JoinHandle<()>> = None;
            // Strangers hold few handshakes and few from one address: the oldest gives way to
            // the newest. The upstream point's first message follows its TCP handshake at once,
            // and takes it out of their way as soon as it verifies.
            let mut strangers = Held::new(MAX_HANDSHAKES, MAX_HANDSHAKES_PER_SOURCE);
            let mut proving_key = Held::new(MAX_PROVED, MAX_PROVED);
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, from)) => {
                            let (verifying, proving) = (session.clone(), proving.clone());
                            let task = tokio::spawn(async move {
                                if let Some(c) = verifying.verify(stream, from.to_string()).await {
                                    let _ = proving.send((from.ip(), c)).await;
                                }
                            });
                            if strangers.admit(from.ip(), task.abort_handle()) {
                                session.refuse(&from.to_string(), Refusal::new("busy", "a newer connection took the place of an older one's handshake".into()));
                            }
                        }
                        Err(e) => {
                            warn!("segment: accepting a peer connection: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    },
                    Some((ip, c)) = proved.recv() => {
                        let peer = c.peer.clone();
                        let (finishing, ready) = (session.clone(), ready.clone());
                        let task = tokio::spawn(async move {
                            if let Some(e) = finishing.finish(c).await {
                                let _ = ready.send(e).await;
                            }
                        });
                        if proving_key.admit(ip, task.abort_handle()) {
                            session.refuse(&peer, Refusal::new("busy", "a newer connection that proved the key took the place of an older one".into()));
                        }
                    }
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

    fn new(key: Psk, shape: SegmentShape, upstream: bool) -> (Link, Session, mpsc::Receiver<Message>) {
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
            seen: Arc::default(),
        };
        (Link { incoming, outgoing, up, refusals }, session, outgoing_rx)
    }
}

impl Session {
    /// The upstream point's handshake, and the Hellos in it: the connection established, or
    /// refused (logged and counted) and dropped.
    async fn handshake(&self, stream: TcpStream, peer: String) -> Option<Established> {
        let (mut reader, mut writer) = self.prepare(stream, &peer);
        let interval = self.shape.interval(clock::now());
        let steps = async {
            let (initiator, first) = Initiator::start(&self.key, interval)?;
            send(&mut writer, &first).await?;
            let answer =
                channel::read_noise(&mut reader, MAX_ANSWER).await.map_err(|e| closed_in_handshake(e, &peer))?;
            let (theirs, mut sealer, opener) = initiator.finish(&answer)?;
            self.check_hello(theirs)?;
            send(&mut writer, &sealer.seal(&Message::Hello { shape: self.shape, interval })).await?;
            Ok((sealer, opener))
        };
        let (sealer, opener) = self.within_handshake(&peer, steps).await?;
        Some(Established { reader, writer, peer, sealer, opener })
    }

    /// The downstream point's first step with a stranger: its first message read and verified
    /// under the key, of an interval near this point's and not seen before, then answered. The
    /// connection, or nothing (refused, logged and counted: a stranger is sent not a byte).
    async fn verify(&self, stream: TcpStream, peer: String) -> Option<Established> {
        let (mut reader, mut writer) = self.prepare(stream, &peer);
        let steps = async {
            let first = channel::read_first(&mut reader).await?;
            let (responder, interval) = Responder::verify(&self.key, &first)?;
            self.fresh(interval)?;
            self.first_time(channel::ephemeral(&first), interval)?;
            let hello = Message::Hello { shape: self.shape, interval: self.shape.interval(clock::now()) };
            let (answer, sealer, opener) = responder.answer(&hello)?;
            send(&mut writer, &answer).await?;
            Ok((sealer, opener))
        };
        let (sealer, opener) = self.within_handshake(&peer, steps).await?;
        Some(Established { reader, writer, peer, sealer, opener })
    }

    /// The downstream point's last step: the upstream point's Hello, which proves it holds the
    /// key in this connection. The connection established, or nothing (refused).
    async fn finish(&self, c: Established) -> Option<Established> {
        let Established { mut reader, writer, peer, sealer, mut opener } = c;
        let hello = async { self.check_hello(opener.read(&mut reader, HELLO_BODY).await?) };
        self.within_handshake(&peer, hello).await?;
        Some(Established { reader, writer, peer, sealer, opener })
    }

    /// The connection's halves, its socket set for a peer: TCP finds a peer that vanishes
    /// without a word (unplugged, its host down), probing after an interval's quiet and giving
    /// unacknowledged data up after `SILENT_INTERVALS` intervals (at least a second each).
    fn prepare(&self, stream: TcpStream, peer: &str) -> (OwnedReadHalf, OwnedWriteHalf) {
        let _ = stream.set_nodelay(true);
        let interval = Duration::from_nanos(self.shape.interval_ns).max(Duration::from_secs(1));
        let socket = socket2::SockRef::from(&stream);
        let keepalive = socket2::TcpKeepalive::new().with_time(interval).with_interval(interval).with_retries(3);
        if let Err(e) = socket
            .set_tcp_keepalive(&keepalive)
            .and_then(|()| socket.set_tcp_user_timeout(Some(interval * SILENT_INTERVALS as u32)))
        {
            debug!(%peer, "segment: TCP keepalive: {e}");
        }
        stream.into_split()
    }

    /// What `steps` give within `HANDSHAKE_WITHIN`, or nothing (refused, logged and counted).
    async fn within_handshake<T>(&self, peer: &str, steps: impl Future<Output = Result<T, Refusal>>) -> Option<T> {
        let outcome = tokio::time::timeout(HANDSHAKE_WITHIN, steps)
            .await
            .unwrap_or_else(|_| Err(Refusal::new("malformed", format!("no handshake within {HANDSHAKE_WITHIN:?}"))));
        outcome.map_err(|refusal| self.refuse(peer, refusal)).ok()
    }

    /// Refuses a first message seen before (played again by one who recorded it: it verifies,
    /// and is of a fresh interval for `WINDOW` intervals), and remembers this one for as long.
    fn first_time(&self, ephemeral: [u8; 32], interval: u64) -> Result<(), Refusal> {
        let now = self.shape.interval(clock::now());
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.retain(|_, at| at.saturating_add(WINDOW) >= now);
        match seen.insert(ephemeral, interval) {
            None => Ok(()),
            Some(_) => Err(Refusal::new("stale", "a first message seen before (played again)".into())),
        }
    }

    /// Runs an established connection until it fails, is refused, or (at the downstream point)
    /// falls silent: no record for `SILENT_INTERVALS` intervals closes it. Reading and writing
    /// run side by side, neither ever cut off in the middle of a message.
    async fn serve(&self, c: Established, outgoing: &mut mpsc::Receiver<Message>) {
        self.up.store(true, Ordering::Relaxed);
        // Stale messages queued while no peer was there are of no use to this one.
        while outgoing.try_recv().is_ok() {}
        let Established { mut reader, mut writer, peer, mut sealer, mut opener } = c;
        let silence = Duration::from_nanos(self.shape.interval_ns.saturating_mul(SILENT_INTERVALS));
        let reading = async {
            let mut last = [0u64; KINDS + 1];
            let mut deadline = Instant::now() + silence;
            loop {
                let read = opener.read(&mut reader, MAX_BODY);
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
                if let Err(e) = writer.write_all(&sealer.seal(&out)).await {
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

    /// Whether the peer's Hello is one this point can measure with.
    fn check_hello(&self, m: Message) -> Result<(), Refusal> {
        let Message::Hello { shape, interval } = m else {
            return Err(Refusal::new("malformed", "the first message was not a hello".into()));
        };
        if shape != self.shape {
            return Err(Refusal::new(
                "shape",
                format!("the peer's segment settings differ (peer {shape:?}, here {:?}): both points need the same interval, lda_*, rda_*, packets and sample_zeros", self.shape),
            ));
        }
        self.fresh(interval)
    }

    /// Refuses a message of an interval already seen for its kind, or far from now, and a record
    /// whose banks are not of the agreed shape (the reconciliation indexes them by it).
    fn check(&self, last: &mut [u64; KINDS + 1], m: Message) -> Result<Message, Refusal> {
        if let Message::Hello { .. } = m {
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
        // Times come several an interval; the channel refuses one played again.
        if interval < last[kind] || (interval == last[kind] && kind != TIMES as usize) {
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

async fn send(writer: &mut OwnedWriteHalf, bytes: &[u8]) -> Result<(), Refusal> {
    writer.write_all(bytes).await.map_err(|e| Refusal::io(format!("sending: {e}")))
}

/// The downstream point closing the connection before it answers is how it refuses: say what
/// it likely refused.
fn closed_in_handshake(e: Refusal, peer: &str) -> Refusal {
    Refusal::io(format!(
        "{peer} closed the connection without answering the handshake ({e}): another key or protocol version, \
         or not a pirated; its log says which"
    ))
}

#[cfg(test)]
mod tests {
    use pirate_common::segment::{lda::LdaCell, rda::RdaShape};

    use super::*;
    use crate::segment::wire::Record;

    /// The key both points share in these tests.
    fn key() -> Psk {
        Psk::new(*b"the points' key, 32 bytes long..")
    }

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
        (Link::listen(listener, key(), shape), addr)
    }

    /// The interval a point of intervals of `interval_ms` is in now.
    fn now(interval_ms: u64) -> u64 {
        shape(interval_ms).interval(clock::now())
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
            let mut said = Vec::new();
            let read =
                tokio::time::timeout(Duration::from_millis(500), tokio::io::AsyncReadExt::read_to_end(s, &mut said));
            closed += usize::from(read.await.is_ok());
            assert!(said.is_empty(), "the downstream point said {said:?} to a stranger");
        }
        assert_eq!(closed, 40 - MAX_HANDSHAKES_PER_SOURCE, "strangers closed at once");
        let busy: u64 = down.refusals.take().filter(|(r, _)| *r == "busy").map(|(_, n)| n).sum();
        assert_eq!(busy as usize, 40 - MAX_HANDSHAKES_PER_SOURCE);
        let _up = Link::connect(addr.to_string(), key(), shape(1000));
        assert!(becomes(&down.up, true, Duration::from_secs(3)).await, "the upstream point never got in");
    }

    /// An upstream point that stays connected but sends no record for three intervals is
    /// dropped: the downstream point's link goes down, and says why.
    #[tokio::test]
    async fn a_silent_upstream_is_dropped() {
        let (down, addr) = downstream(shape(100)).await;
        let _up = Link::connect(addr.to_string(), key(), shape(100));
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
        let (_link, session, _out) = Link::new(key(), shape, false);
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

    /// Bytes `from` sends until it closes, or until `within` has passed.
    async fn heard(from: &mut TcpStream, within: Duration) -> Vec<u8> {
        let mut said = Vec::new();
        let _ = tokio::time::timeout(within, tokio::io::AsyncReadExt::read_to_end(from, &mut said)).await;
        said
    }

    /// An upstream point that connects to one in the middle, its connection there, and what it
    /// sent first (the preamble and the handshake's first message).
    async fn intercepted(shape: SegmentShape) -> (Link, TcpStream, Vec<u8>) {
        let middle = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = Link::connect(middle.local_addr().unwrap().to_string(), key(), shape);
        let (mut from_up, _) = middle.accept().await.unwrap();
        let mut first = vec![0u8; channel::PREAMBLE.len() + 2 + channel::FIRST];
        tokio::io::AsyncReadExt::read_exact(&mut from_up, &mut first).await.unwrap();
        (up, from_up, first)
    }

    /// A Noise message behind its length, as the wire carries it.
    fn framed(noise: &[u8]) -> Vec<u8> {
        [&(noise.len() as u16).to_le_bytes()[..], noise].concat()
    }

    /// How many refusals of `reason` a link counted since the last call.
    fn refused(link: &Link, reason: &str) -> u64 {
        link.refusals.take().filter(|(r, _)| *r == reason).map(|(_, n)| n).sum()
    }

    /// An upstream point with another key gets no link, and the downstream point says not a
    /// byte to it: neither a stranger nor an eavesdropper has anything of D's to test guessed
    /// keys against.
    #[tokio::test]
    async fn another_key_gets_no_link_and_not_a_byte() {
        let (down, addr) = downstream(shape(1000)).await;
        let up = Link::connect(addr.to_string(), Psk::generate().unwrap(), shape(1000));
        assert!(!becomes(&down.up, true, Duration::from_millis(1500)).await, "a wrong key got in");
        assert!(!up.up.load(Ordering::Relaxed));
        assert!(refused(&down, "authentication") >= 1);
        let mut stranger = TcpStream::connect(addr).await.unwrap();
        let (_, first) = Initiator::start(&Psk::generate().unwrap(), now(1000)).unwrap();
        stranger.write_all(&first).await.unwrap();
        assert_eq!(heard(&mut stranger, Duration::from_secs(2)).await, Vec::<u8>::new());
    }

    /// The bytes an upstream point sent in a real connection, played again to the downstream
    /// point, get not a byte and no link: its first message was seen before (and the Hello
    /// after it was sealed for the first connection's keys).
    #[tokio::test]
    async fn a_recorded_connection_played_again_gets_no_link() {
        let (down, addr) = downstream(shape(100)).await;
        // One in the middle relays the connection and records what the upstream point sends.
        let (_up, mut from_up, mut recorded) = intercepted(shape(100)).await;
        let mut to_down = TcpStream::connect(addr).await.unwrap();
        to_down.write_all(&recorded).await.unwrap();
        from_up.write_all(&framed(&channel::read_noise(&mut to_down, MAX_ANSWER).await.unwrap())).await.unwrap();
        let hello = framed(&channel::read_noise(&mut from_up, MAX_ANSWER).await.unwrap());
        to_down.write_all(&hello).await.unwrap();
        recorded.extend_from_slice(&hello);
        assert!(becomes(&down.up, true, Duration::from_secs(2)).await, "the relayed connection got no link");
        drop((from_up, to_down));
        assert!(becomes(&down.up, false, Duration::from_secs(2)).await);
        refused(&down, "io");
        let mut replay = TcpStream::connect(addr).await.unwrap();
        replay.write_all(&recorded).await.unwrap();
        assert_eq!(heard(&mut replay, Duration::from_secs(2)).await, Vec::<u8>::new());
        assert!(!becomes(&down.up, true, Duration::from_millis(500)).await, "a replayed connection got in");
        assert_eq!(refused(&down, "stale"), 1);
    }

    /// Each point's own messages sent back to it (by one between the points, without the key)
    /// are refused: the upstream point's first message as the downstream point's answer, the
    /// downstream point's answer as the upstream point's Hello.
    #[tokio::test]
    async fn messages_reflected_to_their_sender_are_refused() {
        let (down, addr) = downstream(shape(1000)).await;
        let (up, mut from_up, first) = intercepted(shape(1000)).await;
        from_up.write_all(&first[channel::PREAMBLE.len()..]).await.unwrap();
        let mut to_down = TcpStream::connect(addr).await.unwrap();
        to_down.write_all(&first).await.unwrap();
        let answer = framed(&channel::read_noise(&mut to_down, MAX_ANSWER).await.unwrap());
        to_down.write_all(&answer).await.unwrap();
        assert_eq!(heard(&mut from_up, Duration::from_secs(2)).await, Vec::<u8>::new(), "U went on");
        assert!(heard(&mut to_down, Duration::from_secs(2)).await.is_empty());
        // D refuses its own answer by its length, or as not opening.
        let d: Vec<_> = down.refusals.take().collect();
        assert!(matches!(d[..], [("malformed" | "authentication", 1)]), "{d:?}");
        assert_eq!(refused(&up, "authentication"), 1);
        assert!(!up.up.load(Ordering::Relaxed) && !down.up.load(Ordering::Relaxed));
    }

    /// A fake downstream point (without the key) that answers the upstream point's first
    /// message is refused: the upstream point sends it nothing more, no record.
    #[tokio::test]
    async fn a_fake_downstream_gets_nothing() {
        let (up, mut from_up, _) = intercepted(shape(1000)).await;
        // An ephemeral key and a payload's worth of bytes, as a downstream point's answer has.
        let (_, guess) = Initiator::start(&Psk::generate().unwrap(), now(1000)).unwrap();
        from_up.write_all(&framed(&[&guess[channel::PREAMBLE.len() + 2..], &[7; 32][..]].concat())).await.unwrap();
        up.outgoing.send(Message::Request { interval: 1, ids: vec![1] }).await.unwrap();
        assert_eq!(heard(&mut from_up, Duration::from_secs(2)).await, Vec::<u8>::new());
        assert_eq!(refused(&up, "authentication"), 1);
        assert!(!up.up.load(Ordering::Relaxed));
    }

    /// Forwards what `from` sends to `to`, each piece `delay` after it came: a path of that
    /// one-way delay.
    async fn delayed(mut from: tokio::net::tcp::OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) {
        let (pieces, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
        tokio::spawn(async move {
            while let Some((at, piece)) = due.recv().await {
                tokio::time::sleep_until(at).await;
                if to.write_all(&piece).await.is_err() {
                    return;
                }
            }
        });
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(n @ 1..) = tokio::io::AsyncReadExt::read(&mut from, &mut buf).await {
            if pieces.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    }

    /// Strangers from many addresses who keep connecting cannot keep out an upstream point
    /// whose handshake takes round trips long enough for them to fill the downstream point's
    /// handshakes over and over: its first message, right behind its TCP handshake, takes it
    /// out of their way once it verifies. (Among them until its Hello, it was closed for a
    /// newer stranger every time.)
    #[tokio::test]
    async fn strangers_from_many_addresses_cannot_keep_a_distant_upstream_out() {
        let (down, addr) = downstream(shape(1000)).await;
        // 20 addresses, a connection every 2 ms, the last 64 held open.
        let flood = tokio::spawn(async move {
            let mut held = std::collections::VecDeque::new();
            for i in 0u32.. {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.bind(([127, 0, 1, (i % 20) as u8 + 1], 0).into()).unwrap();
                if let Ok(s) = socket.connect(addr).await {
                    held.push_back(s);
                }
                if held.len() > 64 {
                    held.pop_front();
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        // The upstream point 50 ms away each way: its first message goes with its TCP
        // handshake, what follows crosses the path.
        let relay = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let far = relay.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut from_up, _)) = relay.accept().await {
                let mut first = vec![0u8; channel::PREAMBLE.len() + 2 + channel::FIRST];
                if tokio::io::AsyncReadExt::read_exact(&mut from_up, &mut first).await.is_err() {
                    continue;
                }
                let Ok(mut to_down) = TcpStream::connect(addr).await else { continue };
                let _ = to_down.write_all(&first).await;
                let ((up_read, up_write), (down_read, down_write)) = (from_up.into_split(), to_down.into_split());
                let delay = Duration::from_millis(50);
                tokio::spawn(delayed(up_read, down_write, delay));
                tokio::spawn(delayed(down_read, up_write, delay));
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _up = Link::connect(far.to_string(), key(), shape(1000));
        let got_in = becomes(&down.up, true, Duration::from_secs(4)).await;
        flood.abort();
        assert!(got_in, "the strangers kept the upstream point out");
        assert!(refused(&down, "busy") > 16, "the strangers never filled the handshakes");
    }
}
