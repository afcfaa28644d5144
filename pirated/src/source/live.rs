//! The live source: the attached datapath, advanced one epoch at a time and drained.

use std::os::fd::RawFd;

use pirate_common::fridge::Fridges;

use super::{EpochData, Kernel};
use crate::{
    config::Config,
    datapath::Datapath,
    fridge::samples::Samples,
    pirate::{drain::Records, flow::FlowEpoch},
};

pub struct Live {
    dp: Datapath,
    records: Records,
    /// The fridges' samples, if enabled.
    samples: Option<Samples>,
    /// The epoch the datapath is in.
    epoch: u32,
}

impl Live {
    pub fn new(mut dp: Datapath, config: &Config) -> anyhow::Result<Live> {
        let records = Records::take(&mut dp)?;
        let samples = match config.fridge.enabled {
            true => Some(Samples::take(&mut dp)?),
            false => None,
        };
        let epoch = dp.epoch();
        Ok(Live { dp, records, samples, epoch })
    }

    /// The descriptor that becomes readable when fridge samples arrive, if fridges are on.
    pub fn samples_fd(&self) -> Option<RawFd> {
        self.samples.as_ref().map(|s| s.fd())
    }

    /// Moves the samples waiting in the ring into the epoch's.
    pub fn collect_samples(&mut self) {
        if let Some(s) = &mut self.samples {
            s.collect();
        }
    }

    /// Runs the fridges with `shape` from now on (recalibrated entry probabilities).
    pub fn reshape_fridges(&mut self, shape: Fridges) -> anyhow::Result<()> {
        match &mut self.samples {
            Some(s) => s.reshape(shape),
            None => Ok(()),
        }
    }

    /// Flows in the flow table now (after a restart, those the last instance left).
    pub fn tracked(&self) -> usize {
        self.records.tracked()
    }

    /// The descriptor that becomes readable when flows hand epochs over.
    pub fn records_fd(&self) -> RawFd {
        self.records.fd()
    }

    /// Empties the hand-over ring between a drain and the next flip, where every record is stale.
    pub fn discard_stale(&mut self) {
        self.records.discard()
    }

    /// Moves the datapath on to the next epoch and reads the one it closed (into `flows`'
    /// memory), with what the datapath counted.
    pub fn close_epoch(&mut self, flows: Vec<FlowEpoch>) -> anyhow::Result<(EpochData, Kernel)> {
        let closed = self.epoch;
        self.epoch = closed.wrapping_add(1);
        self.dp.set_epoch(self.epoch)?;
        // Before the table: flows inserted after this read are in the table, not yet counted.
        let counters = self.dp.counters()?;
        let drained = self.records.drain(closed, flows)?;
        let kernel = Kernel::new(counters, &drained);
        let fridge = self.samples.as_mut().map(|s| s.close()).transpose()?;
        Ok((EpochData { epoch: closed, flows: drained.flows, fridge }, kernel))
    }
}
