//! RLI live: the upstream point's injector (a thread sending one reference every period, each
//! stamped on the shared clock just before it goes to the socket), or with sampled references
//! its task handing their times to the peer channel; and the downstream point's task (sampled
//! references matched with their times as they come; each interval, the references taken in
//! it summarised and every flow's figures read, as JSON lines).

use std::{
    net::{SocketAddr, UdpSocket},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::Context;
use pirate_common::{counters, rli::reference::seal};
use tokio::{sync::mpsc, task::JoinHandle as TaskHandle};
use tracing::{info, warn};

use super::{
    config::RliConfig,
    drain::Intervals,
    egress::Egress,
    inject::Schedule,
    metrics::Shared,
    report,
    sampled::{Matcher, Outcomes},
};
use crate::{
    background, clock,
    datapath::{ring, rli::RliMaps},
    json::Lines,
    psk::Psk,
};

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
        let schedule = rli.schedule();
        let egress = schedule.reads_link().then(|| Egress::of(&socket)).transpose()?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let interface = egress.as_ref().map(|e| e.interface.clone());
        let thread = std::thread::Builder::new()
            .name("rli-references".into())
            .spawn(move || inject(socket, key, schedule, egress, &s))
            .context("starting the references' thread")?;
        info!(%target, injection = ?rli.injection, period = %rli.period, interface, "rli: sending references");
        Ok(Injector { stop, thread: Some(thread) })
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

/// The injector's loop: it wakes on a grid of the schedule's poll period (a late wake moves on
/// along the grid: the missed ones are not sent in a burst), asks the schedule, and stamps a
/// reference just before it goes to the socket.
fn inject(socket: UdpSocket, key: [u64; 2], mut schedule: Schedule, egress: Option<Egress>, stop: &AtomicBool) {
    let (poll, ceiling) = (schedule.poll_ns(), schedule.ceiling_ns());
    let mut seq = clock::now() / 1000;
    let mut next = clock::now();
    let mut last_sent: Option<u64> = None;
    let mut warned = false;
    let mut warn_once = |what: &str, e: &dyn std::fmt::Display| {
        if !std::mem::replace(&mut warned, true) {
            warn!("rli: {what}: {e} (said once)");
        }
    };
    while !stop.load(Ordering::Relaxed) {
        // In slices: a clock stepped back is not slept through, nor is a stop.
        let now = clock::now();
        if now < next {
            std::thread::sleep(Duration::from_nanos(next - now).min(Duration::from_millis(100)));
            continue;
        }
        let at = next;
        next += poll;
        if next <= now {
            // Late, or the clock stepped forward: on along the grid.
            next += (now - next) / poll * poll + poll;
        }
        let link = match egress.as_ref().map(Egress::read).transpose() {
            Ok(link) => link.unwrap_or_default(),
            Err(e) => {
                warn_once("reading the egress interface's counters", &e);
                continue;
            }
        };
        if !schedule.due(at, link) {
            continue;
        }
        schedule.sent(at, link);
        // Never two closer than the ceiling, whatever the wakes: this one waits for it.
        if let Some(gap) = last_sent.map(|last| clock::now().saturating_sub(last)).filter(|&gap| gap < ceiling) {
            std::thread::sleep(Duration::from_nanos(ceiling - gap));
        }
        seq += 1;
        let stamp = clock::now();
        last_sent = Some(stamp);
        if let Err(e) = socket.send(&seal(key, seq, stamp)) {
            warn_once("sending a reference failed", &e);
        }
    }
}

/// With sampled references, the niceness pirated's threads take (`rli.nice`): the packets
/// around a reference wait for its upstream time, which a few of pirated's tasks carry at each
/// point, and other work on a busy host can keep them off the CPU long enough for the waiting
/// packets' groups to widen (docs/accuracy.md, "Sampled references, live"). Without the
/// privilege to, a warning.
pub fn prioritise(nice: i32) {
    if nice == 0 {
        return;
    }
    // SAFETY: plain calls on this process; PRIO_PROCESS 0 with `who` 0 is the caller, and each
    // thread created after inherits it.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 {
        warn!(
            nice,
            "rli: cannot take rli.nice ({}): sampled references' delays may wait on other work",
            std::io::Error::last_os_error()
        );
    }
}

/// Starts the upstream point's task with sampled references: as its datapath samples packets,
/// their times go to `send` (the peer channel; dropped while it is full or away, and the
/// downstream point voids their references). The task wakes when the ring has something (the
/// kernel wakes a reader that has caught up, so under load it takes them in batches): a time
/// waiting for a tick would keep the references' delays, and the packets around them, pending.
pub fn spawn_upstream(mut maps: RliMaps, send: mpsc::Sender<Vec<(u64, u64)>>) -> TaskHandle<()> {
    tokio::spawn(async move {
        // SAFETY: the ring's descriptor belongs to `maps`, which this task owns.
        let ready = match unsafe { ring::watch(maps.taken_fd(), "RLI's sampled packets") } {
            Ok(ready) => ready,
            Err(e) => return warn!("rli: {e:#}"),
        };
        loop {
            match ready.readable().await {
                Ok(mut guard) => guard.clear_ready(),
                Err(e) => return warn!("rli: watching the sampled packets: {e}"),
            }
            let mut times = Vec::new();
            maps.drain_taken(|t| times.push((t.id, t.tai_ns)));
            if !times.is_empty() && send.try_send(times).is_err() && send.is_closed() {
                return;
            }
        }
    })
}

/// How often the downstream point's task hands the references taken over when nothing wakes it
/// sooner, and expires sampled references whose upstream time is late.
const TAKEN_EVERY: Duration = Duration::from_millis(100);

/// Starts the downstream point's task: every interval of `interval_ns` on the shared clock, a
/// `segment_references` line and a `segment_flow` line per flow with packets in it, and the
/// interval's metrics. With sampled references, `times` brings the upstream point's times of
/// them, each matched as soon as both it and its reference are in (the task wakes for either)
/// and its delay written into the datapath's ring.
pub fn spawn_downstream(
    mut maps: RliMaps,
    rli: &RliConfig,
    interval_ns: u64,
    mut times: Option<mpsc::Receiver<Vec<(u64, u64)>>>,
    metrics: Shared,
    lines: Option<Lines>,
) -> TaskHandle<()> {
    let mut matcher = Matcher::new(rli.max_delay.as_nanos());
    let sampled = times.is_some();
    tokio::spawn(async move {
        // The references taken are handed over as they come (their ring holds seconds of them,
        // an interval may last an hour): injected ones every `TAKEN_EVERY`, sampled ones, which
        // wait for their delay meanwhile, as the ring has them.
        // SAFETY: the ring's descriptor belongs to `maps`, which this task owns.
        let ready = match sampled.then(|| unsafe { ring::watch(maps.taken_fd(), "RLI's references taken") }) {
            Some(Err(e)) => return warn!("rli: {e:#}"),
            ready => ready.and_then(Result::ok),
        };
        let mut intervals = Intervals::new(interval_ns, sampled);
        // What the table holds now (a previous pirated's) belongs to no interval of ours.
        match maps.flows() {
            Ok(flows) => intervals.baseline(flows),
            Err(e) => warn!("rli: reading the flows: {e:#}"),
        }
        let mut next = intervals.interval(clock::now());
        let mut counted = maps.counters.read().unwrap_or([0; counters::COUNT as usize]);
        let mut outcomes = Outcomes::default();
        let mut resolved = Vec::new();
        let mut unmatched = false;
        loop {
            while clock::now() < intervals.due(next) {
                let wait = Duration::from_nanos(intervals.due(next).saturating_sub(clock::now()));
                tokio::select! {
                    () = tokio::time::sleep(wait.min(TAKEN_EVERY)) => {}
                    Some(()) = async { ready.as_ref()?.readable().await.ok()?.clear_ready(); Some(()) } => {}
                    Some(batch) = async { times.as_mut()?.recv().await } => {
                        for (id, tai_ns) in batch {
                            matcher.upstream(id, tai_ns, &mut resolved);
                        }
                    }
                }
                maps.drain_taken(|t| match t.id {
                    0 => intervals.taken(t, t.tai_ns),
                    _ => matcher.downstream(t, &mut resolved),
                });
                matcher.expire(clock::now(), &mut resolved);
                for t in resolved.drain(..) {
                    if let Err(e) = maps.resolve(t.reference) {
                        warn!("rli: {e:#}");
                    }
                    intervals.taken(t, clock::now());
                }
            }
            // The table's walk takes a while with many flows: other tasks go on meanwhile.
            let closed = tokio::task::block_in_place(|| {
                background::run(|| {
                    let table = match maps.flows().and_then(|f| Ok((maps.references(&f)?, f))) {
                        Ok((refs, flows)) => Some((flows, refs)),
                        Err(e) => {
                            warn!("rli: reading the flows: {e:#}");
                            None
                        }
                    };
                    let closed = intervals.close(next, table, false);
                    maps.remove(&closed.ended);
                    closed
                })
            });
            let now = maps.counters.read().unwrap_or(counted);
            let delta = std::array::from_fn(|i| now[i].saturating_sub(counted[i]));
            counted = now;
            let sampled = matcher.outcomes.since(&mut outcomes);
            // Said when it starts and when it ends, not every interval.
            let orphaned = sampled.unmatched > 0 && sampled.matched == 0;
            if orphaned != std::mem::replace(&mut unmatched, orphaned) {
                match orphaned {
                    true => warn!(
                        references = sampled.unmatched,
                        "rli: no upstream time for any sampled reference: is the upstream point running, with \
                         rli.references = \"sampled\" and the same rli.sample_share and segment key?"
                    ),
                    false => info!("rli: sampled references' upstream times arrive again"),
                }
            }
            metrics(&mut |m| {
                m.publish_counters(&delta, &sampled);
                m.publish_interval(closed.references.as_ref(), &closed.flows);
            });
            if let Some(lines) = &lines {
                let mut text = Vec::new();
                if report::write(&mut text, &closed).is_ok() {
                    lines.send(text);
                }
            }
            // The clock stepped forward: the intervals it skipped had no reading of their own.
            next = (next + 1).max(intervals.interval(clock::now()).saturating_sub(1));
        }
    })
}
