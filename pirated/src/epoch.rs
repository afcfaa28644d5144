//! The epoch pipeline: a closed epoch's plain data (from the live datapath or a replay) through
//! each capability's step into reports (`Steps`), the balancer's step on Pirate's figures, then
//! to the sinks (JSON lines, metrics). The daemon's loop ticks, flips, drains and runs it; replay
//! runs the same steps over a capture's epochs.

use std::{
    io::Write,
    sync::{Arc, Mutex},
    time::Instant,
};

use pirate_common::fridge::Fridges;
use tokio::time::{interval, MissedTickBehavior};
use tracing::{debug, info, warn};

use crate::{
    capture::CaptureReader,
    config::Config,
    datapath::ring::{watch, Watched},
    fridge::report::{FridgeReport, Window},
    json::{JsonLines, Sent},
    lb::balancer::{Balancer, LbEpoch},
    metrics::Metrics,
    parallel,
    pirate::{
        report::{EpochReport, Scratch},
        step::Step,
    },
    source::{live::Live, replay, EpochData},
};

/// Each capability's estimate of a closed epoch, from its plain data to its report: Pirate's
/// pipeline and the fridges' window, side by side. The same for the daemon and replay.
pub struct Steps {
    pirate: Step,
    fridge: Option<Window>,
}

/// One epoch's reports, each capability's (the balancer's after the estimates).
pub struct Reports {
    pub pirate: EpochReport,
    pub fridge: Option<FridgeReport>,
    pub lb: Option<LbEpoch>,
}

impl Steps {
    /// With `compare`, Pirate reports both estimators' per-server quantiles (for JSON lines).
    pub fn new(config: &Config, compare: bool) -> Steps {
        Steps {
            pirate: Step::new(&config.pirate, compare, config.metrics.histograms),
            fridge: config.fridge.enabled.then(|| Window::new(&config.fridge)),
        }
    }

    /// Estimates one closed epoch (CPU work), Pirate's into `scratch`'s memory.
    pub fn estimate(&mut self, mut data: EpochData, scratch: Scratch) -> Reports {
        let (epoch, fridge) = (data.epoch, data.fridge.take());
        let (pirate, flows) = (&self.pirate, data.flows);
        let (pirate, fridge) = match self.fridge.as_mut().zip(fridge) {
            Some((window, part)) => {
                let (p, f) = parallel::join(|| pirate.run(epoch, flows, scratch), || window.close(epoch, part));
                (p, Some(f))
            }
            None => (pirate.run(epoch, flows, scratch), None),
        };
        Reports { pirate, fridge, lb: None }
    }
}

impl Reports {
    /// The estimates' JSON lines: Pirate's, then the fridges'.
    pub fn write_estimates(&self, out: &mut impl Write) -> std::io::Result<()> {
        self.pirate.write_json(out)?;
        match &self.fridge {
            Some(f) => f.write_json(out),
            None => Ok(()),
        }
    }

    /// The fridges' new shape, when this epoch recalibrated them.
    pub fn recalibrated(&self) -> Option<Fridges> {
        self.fridge.as_ref().and_then(|f| f.recalibrated)
    }
}

/// `pirated replay`: every epoch of the capture `reader` reads, as JSON lines on `out`; the fridges
/// recalibrated as the daemon does. Last, a `"type": "capture"` line of what was read and left
/// out (and the same on stderr). An error if the capture ended in one (after the lines for what
/// came before) or measured nothing.
pub fn replay(config: &Config, reader: CaptureReader, out: &mut impl Write) -> anyhow::Result<()> {
    let path = reader.path().to_owned();
    let mut steps = Steps::new(config, true);
    let (mut flows, mut samples) = (0, 0);
    let summary = replay::run(config, reader, |data| {
        flows += data.flows.len();
        samples += data.fridge.as_ref().map_or(0, |f| f.samples.len());
        let reports = steps.estimate(data, Scratch::default());
        reports.write_estimates(out)?;
        Ok(reports.recalibrated())
    })?;
    serde_json::to_writer(&mut *out, &summary.json())?;
    out.write_all(b"\n")?;
    out.flush()?;
    eprintln!("pirated: {}: {summary}", path.display());
    if let Some(e) = summary.read.error {
        return Err(e);
    }
    if flows == 0 && samples == 0 {
        anyhow::bail!(
            "{}: nothing measured (no flow with a figure, no fridge sample in {} records)",
            path.display(),
            summary.read.records
        );
    }
    Ok(())
}

/// Waits for records in the hand-over ring and drops them (between a drain and the next epoch
/// flip, every record is stale), or for fridge samples and collects them.
async fn empty_when_ready(ring: &Watched, samples: Option<&Watched>, live: &mut Live) -> anyhow::Result<()> {
    let samples_ready = async {
        match samples {
            Some(fd) => fd.readable().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        guard = ring.readable() => {
            let mut guard = guard?;
            live.discard_stale();
            guard.clear_ready();
        }
        guard = samples_ready => {
            let mut guard = guard?;
            live.collect_samples();
            guard.clear_ready();
        }
    }
    Ok(())
}

/// Runs epochs until `shutdown` resolves, each through the pipeline: close (the live source) →
/// each capability's estimate (`Steps`, off the async runtime) → balance (`balancer`, if VIPs are
/// configured) → the datapath told what changed (the fridges recalibrated) → publish (metrics,
/// and JSON lines to `lines`). The partial epoch is closed and reported at shutdown too, as
/// replay does.
pub async fn run(
    config: &Config,
    live: &mut Live,
    mut balancer: Option<Balancer>,
    metrics: Arc<Mutex<Metrics>>,
    lines: Option<&JsonLines>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let json = lines.is_some();
    let steps = Arc::new(Mutex::new(Steps::new(config, json)));
    // SAFETY: the ring buffers' descriptors belong to `live`, which outlives these (this
    // function).
    let ring = unsafe { watch(live.records_fd(), "the hand-over ring buffer")? };
    let samples = live.samples_fd().map(|fd| unsafe { watch(fd, "the fridge sample ring buffer") }).transpose()?;
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
            ready = empty_when_ready(&ring, samples.as_ref(), live) => {
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
        let steps = steps.clone();
        let work = tokio::task::spawn_blocking(move || {
            let reports = steps.lock().unwrap().estimate(data, scratch);
            let mut text = Vec::new();
            if json {
                reports.write_estimates(&mut text)?;
            }
            Ok::<_, std::io::Error>((reports, text))
        });
        tokio::pin!(work);
        // Flows go on rolling over meanwhile, and their records are stale: the ring holds only
        // what a few milliseconds bring.
        let (mut reports, mut text) = loop {
            tokio::select! {
                done = &mut work => break done??,
                ready = empty_when_ready(&ring, samples.as_ref(), live) => ready?,
            }
        };
        let epoch = reports.pirate.epoch;
        reports.lb = balancer.as_mut().map(|b| b.step(epoch, reports.pirate.figures())).transpose()?;
        if let (true, Some(lb)) = (json, &reports.lb) {
            lb.write_json(epoch, &mut text)?;
        }
        if let Some(shape) = reports.recalibrated() {
            live.reshape_fridges(shape)?;
            info!(p = ?(0..shape.count as usize).map(|k| shape.p(k)).collect::<Vec<_>>(), "fridges recalibrated");
        }
        let sent = lines.as_ref().map(|l| l.send(text));
        let mut m = metrics.lock().unwrap();
        m.publish(&reports.pirate, reports.fridge.as_ref(), reports.lb.as_ref(), &kernel);
        m.observe_epoch_time(started.elapsed());
        match sent {
            Some(Sent::Dropped) => m.json_epoch_dropped(),
            Some(Sent::Closed) => {
                info!("stdout was closed: stopping");
                return Ok(());
            }
            _ => {}
        }
        m.expose();
        let report = &reports.pirate;
        debug!(epoch, flows = report.flows.len(), servers = report.servers().len(), took = ?started.elapsed(), "epoch");
        if stopping {
            return Ok(());
        }
        (flows, scratch) = reports.pirate.into_buffers();
    }
}
