//! The epoch pipeline: a closed epoch's plain data (from the live datapath or a replay) through
//! each capability's estimators into reports, then to the sinks (JSON lines, metrics). The
//! daemon's loop ticks, flips, drains and runs it; replay runs it over a capture's epochs.

use std::{
    io::Write,
    sync::{Arc, Mutex},
    time::Instant,
};

use tokio::{
    io::{unix::AsyncFd, Interest},
    time::{interval, MissedTickBehavior},
};
use tracing::{debug, info, warn};

use crate::{
    config::Config,
    fridge::report::Window,
    json::{JsonLines, Sent},
    metrics::Metrics,
    pirate::{
        config::PirateConfig,
        estimate::{Estimator, Settings},
        report::{EpochReport, Scratch},
    },
    source::{capture::CaptureReader, live::Live, replay, EpochData},
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
    pub fn new(config: &PirateConfig, compare: bool) -> Pipeline {
        Pipeline { settings: config.settings(), estimator: config.estimator, compare }
    }

    /// Estimates one closed epoch (CPU work: the daemon runs it off the async runtime), into
    /// `scratch`'s memory (the last epoch's, or new).
    pub fn run(&self, data: EpochData, scratch: Scratch) -> EpochReport {
        EpochReport::new(data.epoch, data.flows, scratch, &self.settings, self.estimator, self.compare)
    }
}

/// `pirated replay`: every epoch of the capture `reader` reads, as JSON lines on `out`; the fridges
/// recalibrated as the daemon does. Last, a `"type": "capture"` line of what was read and left
/// out (and the same on stderr). An error if the capture ended in one (after the lines for what
/// came before) or measured nothing.
pub fn replay(config: &Config, reader: CaptureReader, out: &mut impl Write) -> anyhow::Result<()> {
    let path = reader.path().to_owned();
    let pipeline = Pipeline::new(&config.pirate, true);
    let mut window = config.fridge.enabled.then(|| Window::new(&config.fridge));
    let (mut flows, mut samples) = (0, 0);
    let summary = replay::run(config, reader, |mut data| {
        let (epoch, fridge) = (data.epoch, data.fridge.take());
        flows += data.flows.len();
        samples += fridge.as_ref().map_or(0, |f| f.samples.len());
        pipeline.run(data, Scratch::default()).write_json(out)?;
        let Some(report) = window.as_mut().zip(fridge).map(|(w, f)| w.close(epoch, f)) else { return Ok(None) };
        report.write_json(out)?;
        Ok(report.recalibrated)
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

/// The ring buffer's descriptor, owned by the live source, registered for readiness only.
pub(crate) struct Borrowed(std::os::fd::RawFd);

impl std::os::fd::AsRawFd for Borrowed {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0
    }
}

/// Waits for records in the hand-over ring and drops them (between a drain and the next epoch
/// flip, every record is stale), or for fridge samples and collects them.
async fn empty_when_ready(
    ring: &AsyncFd<Borrowed>,
    samples: Option<&AsyncFd<Borrowed>>,
    live: &mut Live,
) -> anyhow::Result<()> {
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

/// Watches a ring buffer's descriptor for readiness.
///
/// # Safety
/// `fd` must stay open while the returned value lives (the live source owns it).
pub(crate) unsafe fn watch(fd: std::os::fd::RawFd, what: &str) -> anyhow::Result<AsyncFd<Borrowed>> {
    // SAFETY: the caller keeps `fd` open.
    unsafe { AsyncFd::register_with_interest(Borrowed(fd), Interest::READABLE) }
        .map_err(|e| anyhow::anyhow!("watching {what}: {e}"))
}

/// Runs epochs until `shutdown` resolves; the partial epoch is closed and reported then too, as
/// replay does. With `lines`, each epoch's JSON lines go there too.
pub async fn run(
    config: &Config,
    live: &mut Live,
    metrics: Arc<Mutex<Metrics>>,
    lines: Option<&JsonLines>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let json = lines.is_some();
    let pipeline = Pipeline::new(&config.pirate, json);
    // SAFETY: the ring buffers' descriptors belong to `live`, which outlives these (this
    // function).
    let ring = unsafe { watch(live.records_fd(), "the hand-over ring buffer")? };
    let samples = live.samples_fd().map(|fd| unsafe { watch(fd, "the fridge sample ring buffer") }).transpose()?;
    let mut window = config.fridge.enabled.then(|| Window::new(&config.fridge));
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
        let (mut data, kernel) = live.close_epoch(flows)?;
        if kernel.unnamed > 0 {
            warn!(count = kernel.unnamed, "left out IPv6 flows whose addresses never arrived (V6_NAMES full)");
        }
        if kernel.inconsistent > 0 {
            warn!(count = kernel.inconsistent, "dropped flow copies read mid-update");
        }
        let mut window_moved = window.take();
        let work = tokio::task::spawn_blocking(move || {
            let epoch = data.epoch;
            let fridge_data = data.fridge.take();
            let report = pipeline.run(data, scratch);
            let fridge = window_moved.as_mut().zip(fridge_data).map(|(w, f)| w.close(epoch, f));
            let mut text = Vec::new();
            if json {
                report.write_json(&mut text)?;
                if let Some(f) = &fridge {
                    f.write_json(&mut text)?;
                }
            }
            Ok::<_, std::io::Error>((report, fridge, window_moved, text))
        });
        tokio::pin!(work);
        // Flows go on rolling over meanwhile, and their records are stale: the ring holds only
        // what a few milliseconds bring.
        let (report, fridge, window_back, mut text) = loop {
            tokio::select! {
                done = &mut work => break done??,
                ready = empty_when_ready(&ring, samples.as_ref(), live) => ready?,
            }
        };
        window = window_back;
        let lb = live.balance(&report)?;
        if let (true, Some(lb)) = (json, &lb) {
            lb.write_json(report.epoch, &mut text)?;
        }
        if let Some(shape) = fridge.as_ref().and_then(|f| f.recalibrated) {
            live.reshape_fridges(shape)?;
            info!(p = ?(0..shape.count as usize).map(|k| shape.p(k)).collect::<Vec<_>>(), "fridges recalibrated");
        }
        let sent = lines.as_ref().map(|l| l.send(text));
        let mut m = metrics.lock().unwrap();
        m.publish(&report, fridge.as_ref(), lb.as_ref(), &kernel);
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
            return Ok(());
        }
        (flows, scratch) = report.into_buffers();
    }
}
