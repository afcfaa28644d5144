//! The daemon's loop: each epoch tick flips the datapath's epoch, drains the closed one,
//! estimates, and publishes to metrics and (optionally) JSON lines.

use std::{
    sync::{Arc, Mutex},
    time::Instant,
};

use tokio::{
    io::{unix::AsyncFd, Interest},
    time::{interval, MissedTickBehavior},
};
use tracing::{debug, warn};

use crate::{
    config::Config,
    datapath::{Datapath, FIRST_EPOCH},
    metrics::Metrics,
    report::EpochReport,
};

/// The ring buffer's descriptor, owned by the datapath, registered for readiness only.
struct Borrowed(std::os::fd::RawFd);

impl std::os::fd::AsRawFd for Borrowed {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0
    }
}

/// Runs epochs until `shutdown` resolves.
pub async fn run(
    config: &Config,
    dp: &mut Datapath,
    metrics: Arc<Mutex<Metrics>>,
    json: bool,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let settings = config.estimation();
    // SAFETY: the ring buffer's descriptor belongs to `dp`, which outlives `ring` (this function).
    let ring = unsafe { AsyncFd::register_with_interest(Borrowed(dp.records_fd()), Interest::READABLE) }
        .map_err(|e| anyhow::anyhow!("watching the hand-over ring buffer: {e}"))?;
    let mut epoch = FIRST_EPOCH;
    let mut tick = interval(config.epoch.0);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate
    tokio::pin!(shutdown);
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            _ = &mut shutdown => true,
            guard = ring.readable() => {
                // Between a drain and the next flip every record is stale: keep the ring empty.
                let mut guard = guard?;
                dp.discard_records()?;
                guard.clear_ready();
                continue;
            }
        };
        // On shutdown the partial epoch is closed and reported too, as replay does.
        let started = Instant::now();
        let closed = epoch;
        epoch = epoch.wrapping_add(1);
        dp.set_epoch(epoch)?;
        // Before the table: flows inserted after this read are in the table, not yet counted.
        let kernel = dp.counters()?;
        let drained = dp.drain(closed)?;
        if drained.inconsistent > 0 {
            warn!(count = drained.inconsistent, "dropped flow copies read mid-update");
        }
        let report = EpochReport::new(closed, drained.flows, &settings, config.pirate.estimator, json);
        if json {
            report.write_json(&mut std::io::stdout().lock())?;
        }
        let mut m = metrics.lock().unwrap();
        m.publish(&report, &kernel, drained.tracked);
        m.observe_epoch_time(started.elapsed());
        debug!(epoch = closed, flows = report.flows.len(), servers = report.servers().len(), took = ?started.elapsed(), "epoch");
        if stopping {
            return Ok(());
        }
    }
}
