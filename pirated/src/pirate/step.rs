//! Pirate's step of an epoch: the drained flows through the configured estimators into the
//! epoch's report (CPU work: the daemon runs it off the async runtime, replay in line).

use super::{
    config::PirateConfig,
    estimate::{Estimator, Settings},
    flow::FlowEpoch,
    report::{EpochReport, Scratch},
};

/// What turns an epoch's flows into Pirate's report: the same for the daemon and replay.
#[derive(Clone, Copy)]
pub struct Step {
    settings: Settings,
    estimator: Estimator,
    /// Both estimators' per-server quantiles, for the JSON lines (they cost as much again).
    compare: bool,
    /// Per-server histograms, for `metrics.histograms`.
    histograms: bool,
}

impl Step {
    pub fn new(config: &PirateConfig, compare: bool, histograms: bool) -> Step {
        Step { settings: config.settings(), estimator: config.estimator, compare, histograms }
    }

    /// Estimates epoch `epoch`'s `flows` into `scratch`'s memory (the last epoch's, or new).
    pub fn run(&self, epoch: u32, flows: Vec<FlowEpoch>, scratch: Scratch) -> EpochReport {
        EpochReport::new(epoch, flows, scratch, &self.settings, self.estimator, (self.compare, self.histograms))
    }
}
