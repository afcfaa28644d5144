//! The live segment: a task beside the epoch loop that closes each interval on the shared
//! clock, keeps the packet cache, and talks to the other point. The upstream point sends its
//! record of each interval and answers requests for timestamps; the downstream point asks for
//! the timestamps of the packets only upstream saw, and one interval later (when its own cache
//! of the next interval is complete, for packets late across the boundary) reconciles, reports
//! and publishes.

use std::{
    collections::{BTreeMap, HashMap},
    future::Future,
    pin::Pin,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use anyhow::Context;
use pirate_common::segment::{CacheEntry, SegmentShape};
use tokio::{net::TcpListener, sync::mpsc, task::JoinHandle};
use tracing::{debug, info, warn};

use super::{
    config::{Role, SegmentConfig},
    metrics::Shared,
    peer::Link,
    point::{Cache, Found, Point},
    rda,
    reconcile::{reconcile, SegmentReport, DOWNSTREAM_UNMEASURED, NO_UPSTREAM_STAMPS},
    wire::{Message, Record},
};
use crate::{
    background, clock,
    datapath::{Capability, Datapath},
    json::Lines,
};

/// After an interval's end, how long to wait before reading its banks: packets stamped just
/// before the end may still be on their way through the program.
fn settle(shape: &SegmentShape) -> Duration {
    Duration::from_nanos(shape.interval_ns / 100).clamp(Duration::from_millis(5), Duration::from_millis(100))
}

/// Packets' times at the upstream point (identity, TAI ns), which the link carries for another
/// capability at the downstream point (RLI's sampled references) as they come: at the upstream
/// point what to send, at the downstream point where they go. Either may be absent.
#[derive(Default)]
pub struct Relay {
    pub send: Option<mpsc::Receiver<Vec<(u64, u64)>>>,
    pub deliver: Option<mpsc::Sender<Vec<(u64, u64)>>>,
}

/// Starts the segment's task if `[segment]` gives this pirated a role. The downstream point's
/// listener is bound here, so a busy address fails the start; with role `both`, the downstream
/// point's chain (`down`, attached) measures the segment alone, the two points linked in memory.
pub async fn spawn(
    segment: &SegmentConfig,
    down: Option<Datapath>,
    dp: &mut Datapath,
    relay: Relay,
    metrics: Shared,
    lines: Option<Lines>,
) -> anyhow::Result<Option<JoinHandle<()>>> {
    if !segment.enabled() {
        return Ok(None);
    }
    let shape = segment.shape();
    let cache = segment.cache_packets as usize;
    let Relay { mut send, mut deliver } = relay;
    let mut state = |upstream, maps, mut link: Link| -> anyhow::Result<State> {
        // The relayed times by tasks of their own: the point's task stops for a while to close
        // an interval (its banks read), which they must not wait for.
        match upstream {
            true => relay_out(send.take(), link.outgoing.clone(), shape),
            false => relay_in(deliver.take(), &mut link),
        }
        Ok(State {
            shape,
            upstream,
            point: Point::start(maps, shape)?,
            cache: Cache::new(cache),
            link,
            pending: BTreeMap::new(),
            metrics: metrics.clone(),
            lines: lines.clone(),
            unmeasured: None,
        })
    };
    let run: Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>> = match segment.role {
        Role::Both => {
            let mut down_dp = down.context("role both without a downstream point")?;
            down_dp.chain(Capability::Pirate, false)?;
            let (up_link, down_link) = Link::pair();
            let up = state(true, dp.take_segment()?, up_link)?;
            let down = state(false, down_dp.take_segment()?, down_link)?;
            info!(up = %dp.interface(), down = %down_dp.interface(), "segment: both points in this pirated");
            Box::pin(async move {
                // Its chain stays attached while the points run.
                let _down_dp = down_dp;
                tokio::try_join!(up.run(), down.run()).map(|_| ())
            })
        }
        Role::Up => {
            let link = Link::connect(segment.peer.clone(), segment.key()?, shape);
            Box::pin(state(true, dp.take_segment()?, link)?.run())
        }
        _ => {
            let listener = TcpListener::bind(segment.listen)
                .await
                .with_context(|| format!("binding segment.listen {}", segment.listen))?;
            info!(listen = %segment.listen, "segment: waiting for the upstream point");
            let link = Link::listen(listener, segment.key()?, shape);
            Box::pin(state(false, dp.take_segment()?, link)?.run())
        }
    };
    Ok(Some(tokio::spawn(async move {
        if let Err(e) = run.await {
            warn!("segment: stopped measuring: {e:#}");
        }
    })))
}

/// At the upstream point: the times from `send` to the peer, as they come (the peer away, or
/// slow: dropped, and at the downstream point their references never get a delay, and say so).
fn relay_out(send: Option<mpsc::Receiver<Vec<(u64, u64)>>>, outgoing: mpsc::Sender<Message>, shape: SegmentShape) {
    let Some(mut send) = send else { return };
    tokio::spawn(async move {
        while let Some(times) = send.recv().await {
            let interval = shape.interval(clock::now());
            let times = times.into_iter().map(|(id, ts)| CacheEntry { id, ts }).collect();
            let _ = outgoing.try_send(Message::Times { interval, times });
        }
    });
}

/// At the downstream point: the peer's times go to `deliver`, every other message on to the
/// point's task (through the link's `incoming`, which this puts itself in front of).
fn relay_in(deliver: Option<mpsc::Sender<Vec<(u64, u64)>>>, link: &mut Link) {
    let Some(deliver) = deliver else { return };
    let (onward, incoming) = mpsc::channel(RELAY_QUEUE);
    let mut from_peer = std::mem::replace(&mut link.incoming, incoming);
    tokio::spawn(async move {
        while let Some(m) = from_peer.recv().await {
            match m {
                Message::Times { times, .. } => {
                    let _ = deliver.try_send(times.into_iter().map(|t| (t.id, t.ts)).collect());
                }
                other => {
                    if onward.send(other).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
}

/// Messages on their way from the relay to the point's task.
const RELAY_QUEUE: usize = 64;

/// An interval the downstream point is reconciling.
#[derive(Default)]
struct Pending {
    up: Option<Record>,
    down: Option<Record>,
    stamps: HashMap<u64, u64>,
    requested: bool,
    /// Asked upstream for timestamps, not yet answered.
    awaiting: bool,
}

struct State {
    shape: SegmentShape,
    upstream: bool,
    point: Point,
    cache: Cache,
    link: Link,
    pending: BTreeMap<u64, Pending>,
    metrics: Shared,
    lines: Option<Lines>,
    /// Why the last interval had no figures, if it had none.
    unmeasured: Option<&'static str>,
}

impl State {
    async fn run(mut self) -> anyhow::Result<()> {
        // SAFETY: the ring's descriptor belongs to `self.point`, which outlives this.
        let cache_ready =
            unsafe { crate::datapath::ring::watch(self.point.maps().cache_fd(), "the packet cache ring")? };
        let settle = settle(&self.shape);
        let mut next = self.shape.interval(clock::now());
        loop {
            let due = (next + 1) * self.shape.interval_ns + settle.as_nanos() as u64;
            let wait = Duration::from_nanos(due.saturating_sub(clock::now()));
            tokio::select! {
                () = tokio::time::sleep(wait) => {
                    self.drain_cache();
                    // Reading the banks and reconciling take a while: the other tasks (the
                    // relayed times among them) go on on other threads meanwhile, ahead of it.
                    tokio::task::block_in_place(|| background::run(|| self.close(next)))?;
                    next += 1;
                }
                guard = cache_ready.readable() => {
                    let mut guard = guard?;
                    self.drain_cache();
                    guard.clear_ready();
                }
                Some(m) = self.link.incoming.recv() => self.receive(m),
            }
        }
    }

    fn drain_cache(&mut self) {
        let (shape, cache) = (&self.shape, &mut self.cache);
        self.point.maps().drain_cache(|entry| cache.add(shape, entry));
    }

    fn close(&mut self, interval: u64) -> anyhow::Result<()> {
        let record = self.point.close(interval)?;
        let refused: Vec<(&'static str, u64)> = self.link.refusals.take().collect();
        let (up, dropped) = (self.link.up.load(Ordering::Relaxed), self.cache.take_dropped());
        (self.metrics)(&mut |m| {
            m.peer(up, refused.iter().copied(), dropped);
            if self.upstream {
                m.recorded_upstream(record.packets);
            }
        });
        if self.upstream {
            let _ = self.link.outgoing.try_send(Message::Record(record));
            // Downstream asks about an interval at most one interval after it ends.
            self.cache.keep_from(interval.saturating_sub(2));
            return Ok(());
        }
        self.pending.entry(interval).or_default().down = Some(record);
        self.request(interval);
        if let Some(previous) = interval.checked_sub(1) {
            if let Some(p) = self.pending.remove(&previous) {
                let report = self.reconcile(previous, p);
                self.publish(&report);
            }
        }
        self.pending = self.pending.split_off(&interval);
        self.cache.keep_from(interval);
        Ok(())
    }

    fn receive(&mut self, m: Message) {
        match m {
            Message::Record(r) if !self.upstream => {
                let interval = r.interval;
                // Too late for a reconciliation already made: dropped.
                if self.pending.first_key_value().is_none_or(|(first, _)| interval >= *first) {
                    self.pending.entry(interval).or_default().up = Some(r);
                    self.request(interval);
                }
            }
            Message::Stamps { interval, stamps } if !self.upstream => {
                if let Some(p) = self.pending.get_mut(&interval) {
                    p.stamps.extend(stamps.into_iter().map(|s| (s.id, s.ts)));
                    p.awaiting = false;
                }
            }
            Message::Request { interval, ids } if self.upstream => {
                self.drain_cache();
                let stamps = ids
                    .into_iter()
                    .filter_map(|id| Some(CacheEntry { id, ts: self.cache.get(interval, id)? }))
                    .collect();
                let _ = self.link.outgoing.try_send(Message::Stamps { interval, stamps });
            }
            other => {
                debug!(message = ?std::mem::discriminant(&other), "segment: a message for the other role, ignored")
            }
        }
    }

    /// Once both records of `interval` are in: asks upstream for the timestamps of the packets
    /// only it saw.
    fn request(&mut self, interval: u64) {
        let Some(p) = self.pending.get_mut(&interval) else { return };
        let (Some(up), Some(down)) = (&p.up, &p.down) else { return };
        if p.requested || self.shape.flags & pirate_common::segment::RDA == 0 || !up.measured || !down.measured {
            return;
        }
        p.requested = true;
        // U's packets are U's to confirm (it answers for those it has); D's are in its cache.
        let seen = |sign: i64, id: u64| sign < 0 || self.cache.get(interval, id).is_some();
        let lost = rda::decode(&self.shape.rda, &up.rda, &down.rda, seen).lost;
        if !lost.is_empty() {
            p.awaiting = true;
            let _ = self.link.outgoing.try_send(Message::Request { interval, ids: lost });
        }
    }

    fn reconcile(&self, interval: u64, p: Pending) -> SegmentReport {
        // Upstream's record of an interval before this point's first.
        let Some(down) = p.down else {
            return SegmentReport { interval, unmeasured: Some(DOWNSTREAM_UNMEASURED), ..Default::default() };
        };
        let found = Found { up: |id| p.stamps.get(&id).copied(), down: &self.cache, interval };
        let mut report = reconcile(&self.shape, p.up, down, &found);
        if p.awaiting && report.unmeasured.is_none() {
            report = SegmentReport { unmeasured: Some(NO_UPSTREAM_STAMPS), lda: None, rda: None, ..report };
        }
        let end = (interval + 1) * self.shape.interval_ns;
        report.took = Duration::from_nanos(clock::now().saturating_sub(end));
        report
    }

    fn publish(&mut self, report: &SegmentReport) {
        let started = Instant::now();
        (self.metrics)(&mut |m| m.publish(report));
        if let Some(lines) = &self.lines {
            let mut text = Vec::new();
            if report.write_json(&mut text).is_ok() {
                lines.send(text);
            }
        }
        // Logged when it changes: a peer away for an hour is one line, not 3600.
        if report.unmeasured != self.unmeasured {
            match report.unmeasured {
                Some(reason) => {
                    info!(interval = report.interval, reason, "segment: intervals not measured from here on")
                }
                None => info!(interval = report.interval, "segment: measuring"),
            }
        }
        self.unmeasured = report.unmeasured;
        debug!(interval = report.interval, took = ?report.took, publishing = ?started.elapsed(), "segment: interval");
    }
}
