//! The daemon's loop: each epoch tick flips the datapath's epoch, drains the closed one,
//! estimates, and publishes to metrics and (optionally) JSON lines.

use std::{
    sync::{Arc, Mutex},
    time::Instant,
};

use tokio::time::{interval, MissedTickBehavior};
use tracing::{debug, warn};

use crate::{config::Config, datapath::Datapath, estimate::pirate::Denoise, metrics::Metrics, report::EpochReport};

pub fn denoise(config: &Config) -> Denoise {
    Denoise {
        idle_floor_ns: config.pirate.idle_floor.as_nanos(),
        min_mode_share: config.pirate.min_mode_share,
        min_time_share: config.pirate.min_time_share,
        prefer_candidates: config.pirate.mark_after_short,
        min_ibg_gaps: config.pirate.min_ibg_gaps,
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
    let denoise = denoise(config);
    let mut epoch: u32 = 1;
    dp.set_epoch(epoch)?;
    let mut tick = interval(config.epoch.0);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate
    tokio::pin!(shutdown);
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            _ = &mut shutdown => true,
        };
        // On shutdown the partial epoch is closed and reported too, as replay does.
        let started = Instant::now();
        let closed = epoch;
        epoch = epoch.wrapping_add(1);
        dp.set_epoch(epoch)?;
        let drained = dp.drain(closed)?;
        if drained.inconsistent > 0 {
            warn!(count = drained.inconsistent, "dropped flow copies read mid-update");
        }
        let kernel = dp.counters()?;
        let report = EpochReport::new(closed, drained.flows, &denoise);
        if json {
            report.write_json(&mut std::io::stdout().lock())?;
        }
        let mut m = metrics.lock().unwrap();
        m.publish(&report, &kernel, drained.tracked);
        m.observe_epoch_time(started.elapsed());
        debug!(epoch = closed, flows = report.flows.len(), servers = report.servers.len(), took = ?started.elapsed(), "epoch");
        if stopping {
            return Ok(());
        }
    }
}
