//! The fridges' samples out of the live datapath: the ring buffer, emptied whenever it has
//! something (samples are never stale, unlike `pirate`'s records), and the requests offered to
//! each fridge read at every epoch's close.

use std::{
    os::fd::{AsRawFd, RawFd},
    time::Instant,
};

use aya::maps::{MapData, RingBuf};
use pirate_common::{
    fridge::{Fridges, Sample, MAX_FRIDGES},
    maps,
};

use super::report::FridgeEpoch;
use crate::datapath::Datapath;

pub struct Samples {
    ring: RingBuf<MapData>,
    pending: Vec<Sample>,
    /// The shape the datapath runs with.
    shape: Fridges,
    /// The counters and the time at the last close.
    offered: [u64; MAX_FRIDGES],
    closed: Instant,
}

impl Samples {
    pub fn take(dp: &mut Datapath, shape: Fridges) -> anyhow::Result<Samples> {
        let ring = RingBuf::try_from(dp.take_map(maps::FRIDGE_SAMPLES)?)?;
        let offered = dp.fridge_offered()?;
        Ok(Samples { ring, pending: Vec::new(), shape, offered, closed: Instant::now() })
    }

    /// The descriptor to wait for samples on.
    pub fn fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    /// Moves what the ring holds into the epoch's samples.
    pub fn collect(&mut self) {
        while let Some(item) = self.ring.next() {
            if item.len() >= size_of::<Sample>() {
                // SAFETY: the datapath writes whole `Sample`s; read unaligned from ring memory.
                self.pending.push(unsafe { std::ptr::read_unaligned(item.as_ptr() as *const Sample) });
            }
        }
    }

    /// Closes the fridges' epoch: its samples, and the requests offered since the last close.
    pub fn close(&mut self, dp: &Datapath) -> anyhow::Result<FridgeEpoch> {
        self.collect();
        let (offered, now) = (dp.fridge_offered()?, Instant::now());
        let epoch = FridgeEpoch {
            samples: std::mem::take(&mut self.pending),
            offered: std::array::from_fn(|k| offered[k].saturating_sub(self.offered[k])),
            span_ns: now.duration_since(self.closed).as_nanos() as u64,
            shape: self.shape,
        };
        (self.offered, self.closed) = (offered, now);
        Ok(epoch)
    }

    /// The datapath now runs with `shape` (recalibrated).
    pub fn reshape(&mut self, dp: &mut Datapath, shape: Fridges) -> anyhow::Result<()> {
        dp.set_fridge_shape(shape)?;
        self.shape = shape;
        Ok(())
    }
}
