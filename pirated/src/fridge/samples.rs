//! The fridges' samples out of the live datapath: the ring buffer, emptied whenever it has
//! something (samples are never stale, unlike `pirate`'s records), and the requests offered to
//! each fridge read at every epoch's close.

use std::{os::fd::RawFd, time::Instant};

use pirate_common::fridge::{Fridges, Sample, MAX_FRIDGES};

use super::report::FridgeEpoch;
use crate::datapath::{fridge::FridgeMaps, Datapath};

pub struct Samples {
    maps: FridgeMaps,
    pending: Vec<Sample>,
    /// The counters and the time at the last close.
    offered: [u64; MAX_FRIDGES],
    closed: Instant,
}

impl Samples {
    pub fn new(maps: FridgeMaps) -> anyhow::Result<Samples> {
        let offered = maps.offered()?;
        Ok(Samples { maps, pending: Vec::new(), offered, closed: Instant::now() })
    }

    /// The fridges' maps taken out of `dp`.
    pub fn take(dp: &mut Datapath) -> anyhow::Result<Samples> {
        Samples::new(dp.take_fridge()?)
    }

    /// The descriptor to wait for samples on.
    pub fn fd(&self) -> RawFd {
        self.maps.samples_fd()
    }

    /// Moves what the ring holds into the epoch's samples.
    pub fn collect(&mut self) {
        let ring = self.maps.samples();
        while let Some(item) = ring.next() {
            if item.len() >= size_of::<Sample>() {
                // SAFETY: the datapath writes whole `Sample`s; read unaligned from ring memory.
                self.pending.push(unsafe { std::ptr::read_unaligned(item.as_ptr() as *const Sample) });
            }
        }
    }

    /// Closes the fridges' epoch: its samples, and the requests offered since the last close.
    pub fn close(&mut self) -> anyhow::Result<FridgeEpoch> {
        self.collect();
        let (offered, now) = (self.maps.offered()?, Instant::now());
        let epoch = FridgeEpoch {
            samples: std::mem::take(&mut self.pending),
            offered: std::array::from_fn(|k| offered[k].saturating_sub(self.offered[k])),
            span_ns: now.duration_since(self.closed).as_nanos() as u64,
            shape: self.maps.shape(),
        };
        (self.offered, self.closed) = (offered, now);
        Ok(epoch)
    }

    /// The datapath now runs with `shape` (recalibrated).
    pub fn reshape(&mut self, shape: Fridges) -> anyhow::Result<()> {
        self.maps.set_shape(shape)
    }
}
