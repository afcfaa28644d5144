//! The live source: the attached datapath, advanced one epoch at a time and drained.

use std::os::fd::RawFd;

use super::{EpochData, Kernel};
use crate::{
    datapath::Datapath,
    pirate::{drain::Records, flow::FlowEpoch},
};

pub struct Live {
    dp: Datapath,
    records: Records,
    /// The epoch the datapath is in.
    epoch: u32,
}

impl Live {
    pub fn new(mut dp: Datapath) -> anyhow::Result<Live> {
        let records = Records::take(&mut dp)?;
        let epoch = dp.epoch();
        Ok(Live { dp, records, epoch })
    }

    /// Flows in the flow table now (after a restart, those the last instance left).
    pub fn tracked(&self) -> usize {
        self.records.tracked(&self.dp)
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
        let drained = self.records.drain(&self.dp, closed, flows)?;
        let kernel = Kernel::new(counters, &drained);
        Ok((EpochData { epoch: closed, flows: drained.flows }, kernel))
    }
}
