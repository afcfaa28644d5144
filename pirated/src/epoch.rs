//! The epoch pipeline: a closed epoch's plain data (from the live datapath or a replay) through
//! each capability's estimators into reports, then to the sinks (JSON lines, metrics). The
//! daemon's loop ticks, flips, drains and runs it; replay runs it over a capture's epochs.

use std::{
    io::Write,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context;
use tokio::{
    io::{unix::AsyncFd, Interest},
    time::{interval, MissedTickBehavior},
};
use tracing::{debug, info, warn};

use crate::{
    config::Config,
    json::{JsonLines, Sent},
    metrics::Metrics,
    pirate::{
        estimate::{Estimator, Settings},
        report::{EpochReport, Scratch},
    },
    source::{live::Live, replay, EpochData},
};

/// What turns an epoch's data into reports: the same for the daemon and replay.
#[derive(Clone, Copy)]
pub struct Pipeline {
    settings: Settings,
    estimator: Estimator,
    /// Both estimators' per-server quantiles, for the JSON lines (they cost as much again).
    compare: bool,
}

impl Pipeline {
    pub fn new(config: &Config, compare: bool) -> Pipeline {
        Pipeline { settings: config.estimation(), estimator: config.pirate.estimator, compare }
    }

    /// Estimates one closed epoch (CPU work: the daemon runs it off the async runtime), into
    /// `scratch`'s memory (the last epoch's, or new).
    pub fn run(&self, data: EpochData, scratch: Scratch) -> EpochReport {
        EpochReport::new(data.epoch, data.flows, scratch, &self.settings, self.estimator, self.compare)
    }
}

/// `pirated replay`: every epoch of the capture at `path`, as JSON lines on `out`.
pub fn replay(config: &Config, path: &Path, out: &mut impl Write) -> anyhow::Result<Vec<EpochReport>> {
    let pipeline = Pipeline::new(config, true);
    let reports: Vec<EpochReport> =
        replay::epochs(config, path)?.into_iter().map(|e| pipeline.run(e, Scratch::default())).collect();
    for r in &reports {
        r.write_json(out)?;
    }
    Ok(reports)
}

/// The ring buffer's descriptor, owned by the live source, registered for readiness only.
struct Borrowed(std::os::fd::RawFd);

impl std::os::fd::AsRawFd for Borrowed {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0
    }
}

/// Waits for records in the hand-over ring and drops them: between a drain and the next epoch
/// flip, every record is stale.
async fn discard_when_ready(ring: &AsyncFd<Borrowed>, live: &mut Live) -> anyhow::Result<()> {
    let mut guard = ring.readable().await?;
    live.discard_stale();
    guard.clear_ready();
    Ok(())
}

/// Runs epochs until `shutdown` resolves; the partial epoch is closed and reported then too, as
/// replay does.
pub async fn run(
    config: &Config,
    live: &mut Live,
    metrics: Arc<Mutex<Metrics>>,
    json: bool,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let pipeline = Pipeline::new(config, json);
    let lines = if json { Some(JsonLines::spawn().context("starting the JSON lines writer")?) } else { None };
    // SAFETY: the ring buffer's descriptor belongs to `live`, which outlives `ring` (this function).
    let ring = unsafe { AsyncFd::register_with_interest(Borrowed(live.records_fd()), Interest::READABLE) }
        .map_err(|e| anyhow::anyhow!("watching the hand-over ring buffer: {e}"))?;
    let mut tick = interval(config.epoch.0);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate
    tokio::pin!(shutdown);
    // The per-flow vectors, each epoch filling the last one's; sized at start for a table
    // taken over from the last instance.
    let tracked = live.tracked();
    let (mut flows, mut scratch) = (crate::buffer::populated(tracked), Scratch::with_room(tracked));
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            _ = &mut shutdown => true,
            ready = discard_when_ready(&ring, live) => {
                ready?;
                continue;
            }
        };
        let started = Instant::now();
        let (data, kernel) = live.close_epoch(flows)?;
        if kernel.unnamed > 0 {
            warn!(count = kernel.unnamed, "left out IPv6 flows whose addresses never arrived (V6_NAMES full)");
        }
        if kernel.inconsistent > 0 {
            warn!(count = kernel.inconsistent, "dropped flow copies read mid-update");
        }
        let work = tokio::task::spawn_blocking(move || {
            let report = pipeline.run(data, scratch);
            let mut text = Vec::new();
            let written = if json { report.write_json(&mut text) } else { Ok(()) };
            written.map(|()| (report, text))
        });
        tokio::pin!(work);
        // Flows go on rolling over meanwhile, and their records are stale: the ring holds only
        // what a few milliseconds bring.
        let (report, text) = loop {
            tokio::select! {
                done = &mut work => break done??,
                ready = discard_when_ready(&ring, live) => ready?,
            }
        };
        let sent = lines.as_ref().map(|l| l.send(text));
        let mut m = metrics.lock().unwrap();
        m.publish(&report, &kernel);
        m.observe_epoch_time(started.elapsed());
        match sent {
            Some(Sent::Dropped) => m.json_epoch_dropped(),
            Some(Sent::Closed) => {
                info!("stdout was closed: stopping");
                return Ok(());
            }
            _ => {}
        }
        debug!(epoch = report.epoch, flows = report.flows.len(), servers = report.servers().len(), took = ?started.elapsed(), "epoch");
        if stopping {
            if let Some(lines) = lines {
                lines.finish(Duration::from_secs(2));
            }
            return Ok(());
        }
        (flows, scratch) = report.into_buffers();
    }
}
