//! Where a closed epoch comes from: the live datapath or a pcap replay, the same plain data out
//! of either, so every capability estimates and reports the same way on both.

pub mod live;
pub mod replay;
pub mod two_points;

use pirate_common::counters;

use crate::{
    fridge::report::FridgeEpoch,
    pirate::{drain::Drained, flow::FlowEpoch},
};

/// One closed epoch, as plain data.
pub struct EpochData {
    pub epoch: u32,
    /// `pirate`: the flows with packets in the epoch.
    pub flows: Vec<FlowEpoch>,
    /// The fridges' samples and requests, if enabled.
    pub fridge: Option<FridgeEpoch>,
}

/// The live datapath's own figures at the end of an epoch.
pub struct Kernel {
    /// Absolute counters, summed over CPUs, indexed like `pirate_common::counters`.
    pub counters: [u64; counters::COUNT as usize],
    /// Entries in `pirate`'s flow table.
    pub tracked: usize,
    /// Flow copies dropped as torn (read while the datapath rewrote them).
    pub inconsistent: usize,
    /// IPv6 flows left out for want of their addresses.
    pub unnamed: usize,
}

impl Kernel {
    /// The counters read before a drain, and what the drain found.
    pub fn new(counters: [u64; counters::COUNT as usize], drained: &Drained) -> Kernel {
        Kernel { counters, tracked: drained.tracked, inconsistent: drained.inconsistent, unnamed: drained.unnamed }
    }
}
