//! RLI live: the upstream point's injector (a thread sending one reference every period, each
//! stamped on the shared clock just before it goes to the socket) and the downstream point's
//! task (each interval, the references taken in it summarised and every flow's figures read,
//! as JSON lines).

use std::{
    collections::BTreeMap,
    net::{SocketAddr, UdpSocket},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::Context;
use pirate_common::rli::reference::seal;
use tokio::task::JoinHandle as TaskHandle;
use tracing::{info, warn};

use super::{
    config::RliConfig,
    drain::{Drain, FlowFigures},
    quantiles::Summary,
    report,
};
use crate::{clock, datapath::rli::RliMaps, json::Lines, psk::Psk};

/// What the references' tags are keyed with: 128 bits derived from the segment key for this
/// purpose alone.
pub fn tag_key(psk: &Psk) -> [u64; 2] {
    let k = psk.derive("pirated rli reference tag v1");
    let word = |i: usize| u64::from_le_bytes(k[i * 8..i * 8 + 8].try_into().unwrap());
    [word(0), word(1)]
}

/// The upstream point's injector; stops when dropped.
pub struct Injector {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// References sent, and sends that failed.
    pub sent: Arc<AtomicU64>,
    pub failed: Arc<AtomicU64>,
}

impl Injector {
    /// Starts sending references to `rli.target`, port `rli.port`, one every `rli.period`. The
    /// sequence numbers start at the shared clock's microseconds, so that a restarted injector
    /// goes on above the numbers the downstream point has taken.
    pub fn start(rli: &RliConfig, key: [u64; 2]) -> anyhow::Result<Injector> {
        let target = SocketAddr::new(rli.target.context("rli.target is not set")?, rli.port);
        let any: SocketAddr = if target.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().unwrap();
        let socket = UdpSocket::bind(any).context("binding the references' socket")?;
        socket.connect(target).with_context(|| format!("no route for references to {target}"))?;
        let (stop, sent, failed) =
            (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let period = rli.period.0;
        let (s, n, f) = (stop.clone(), sent.clone(), failed.clone());
        let thread = std::thread::Builder::new()
            .name("rli-references".into())
            .spawn(move || inject(socket, key, period, &s, &n, &f))
            .context("starting the references' thread")?;
        info!(%target, ?period, "rli: sending references");
        Ok(Injector { stop, thread: Some(thread), sent, failed })
    }
}

impl Drop for Injector {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn inject(socket: UdpSocket, key: [u64; 2], period: Duration, stop: &AtomicBool, sent: &AtomicU64, failed: &AtomicU64) {
    let step = period.as_nanos() as u64;
    let mut seq = clock::now() / 1000;
    let mut next = clock::now();
    let mut warned = false;
    while !stop.load(Ordering::Relaxed) {
        let now = clock::now();
        if now < next {
            std::thread::sleep(Duration::from_nanos(next - now));
        }
        // Late (a slow wake): the schedule moves on, the missed ones are not sent in a burst.
        next = next.max(clock::now().saturating_sub(step)) + step;
        seq += 1;
        let payload = seal(key, seq, clock::now());
        match socket.send(&payload) {
            Ok(_) => sent.fetch_add(1, Ordering::Relaxed),
            Err(e) => {
                if !std::mem::replace(&mut warned, true) {
                    warn!("rli: sending a reference failed: {e} (counted; said once)");
                }
                failed.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}

/// Starts the downstream point's task: every interval of `interval_ns` on the shared clock, a
/// `segment_references` line and a `segment_flow` line per flow with packets in it.
pub fn spawn_downstream(mut maps: RliMaps, interval_ns: u64, lines: Option<Lines>) -> TaskHandle<()> {
    tokio::spawn(async move {
        let mut drain = Drain::default();
        let mut delays: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
        let mut next = clock::now() / interval_ns;
        // Packets stamped just before the end may still be on their way through the program.
        let settle = (interval_ns / 100).clamp(5_000_000, 100_000_000);
        loop {
            let due = (next + 1) * interval_ns + settle;
            tokio::time::sleep(Duration::from_nanos(due.saturating_sub(clock::now()))).await;
            maps.drain_taken(|t| delays.entry(t.tai_ns / interval_ns).or_default().push(t.reference.delay_ns as f64));
            let flows = match maps.flows().and_then(|f| Ok((f, maps.references()?))) {
                Ok((flows, refs)) => drain.read(flows, &refs),
                Err(e) => {
                    warn!("rli: reading the flows: {e:#}");
                    Vec::new()
                }
            };
            let mut taken = delays.remove(&next).unwrap_or_default();
            // An interval's late references arrive with the next one's: dropped when older.
            delays.retain(|i, _| *i > next);
            publish(lines.as_ref(), next, Summary::of(&mut taken), &flows);
            next += 1;
        }
    })
}

fn publish(lines: Option<&Lines>, interval: u64, references: Option<Summary>, flows: &[FlowFigures]) {
    let Some(lines) = lines else { return };
    let mut text = Vec::new();
    if report::write(&mut text, interval, references.as_ref(), flows).is_ok() {
        lines.send(text);
    }
}
