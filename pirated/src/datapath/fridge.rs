//! The fridges' side of the datapath: their slots and sample ring sized, their shape written,
//! and their handle: the shape (recalibrated), the requests offered to each fridge, and the
//! sample ring, owned by the one reader of the samples.

use std::os::fd::{AsRawFd, RawFd};

use anyhow::Context;
use aya::{
    maps::{Array, MapData, RingBuf},
    Ebpf, EbpfLoader,
};
use pirate_common::{
    fridge::{Fridges, MAX_FRIDGES},
    maps,
};

use super::{object, spec};

/// Sizes the fridges' slots and sample ring for `spec`.
pub(super) fn size(loader: &mut EbpfLoader<'_>, spec: &spec::Fridge) {
    loader
        .set_max_entries(maps::FRIDGE_SLOTS, spec.shape.slots())
        .set_max_entries(maps::FRIDGE_SAMPLES, spec.ring_bytes);
}

/// Writes the fridges' shape: before the fridge is chained, for it reads its shape from the
/// first packet on.
pub(super) fn configure(ebpf: &mut Ebpf, spec: &spec::Fridge) -> anyhow::Result<()> {
    Array::<_, Fridges>::try_from(ebpf.map_mut(maps::FRIDGE_SHAPE).unwrap())?
        .set(0, spec.shape, 0)
        .context("writing FRIDGE_SHAPE")
}

/// The fridges' maps as the daemon reads them.
pub struct FridgeMaps {
    /// The shape the datapath runs with, as last written.
    running: Fridges,
    shape: Array<MapData, Fridges>,
    offered: Array<MapData, u64>,
    samples: RingBuf<MapData>,
}

impl FridgeMaps {
    /// Takes the fridges' maps out of the object, which runs with the shape `spec` gave it.
    pub(super) fn take(ebpf: &mut Ebpf, spec: &spec::Fridge) -> anyhow::Result<FridgeMaps> {
        Ok(FridgeMaps {
            running: spec.shape,
            shape: Array::try_from(object::take(ebpf, maps::FRIDGE_SHAPE)?)?,
            offered: Array::try_from(object::take(ebpf, maps::FRIDGE_OFFERED)?)?,
            samples: RingBuf::try_from(object::take(ebpf, maps::FRIDGE_SAMPLES)?)?,
        })
    }

    /// Writes the fridges' shape (pirated recalibrates their entry probabilities so).
    pub fn set_shape(&mut self, shape: Fridges) -> anyhow::Result<()> {
        self.shape.set(0, shape, 0).context("writing FRIDGE_SHAPE")?;
        self.running = shape;
        Ok(())
    }

    /// The shape the datapath runs with.
    pub fn shape(&self) -> Fridges {
        self.running
    }

    /// The requests offered to each fridge so far.
    pub fn offered(&self) -> anyhow::Result<[u64; MAX_FRIDGES]> {
        let mut out = [0; MAX_FRIDGES];
        for (k, slot) in out.iter_mut().enumerate() {
            *slot = self.offered.get(&(k as u32), 0).context("reading FRIDGE_OFFERED")?;
        }
        Ok(out)
    }

    /// The samples' ring.
    pub fn samples(&mut self) -> &mut RingBuf<MapData> {
        &mut self.samples
    }

    /// The descriptor that becomes readable when samples arrive.
    pub fn samples_fd(&self) -> RawFd {
        self.samples.as_raw_fd()
    }
}
