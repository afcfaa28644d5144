//! `pirate`'s closed epoch, read out of the kernel: the flows the datapath handed over through
//! the ring buffer since the epoch flip, and the rest from the flow table. Never writes to live
//! state.

use std::{
    collections::HashMap,
    os::fd::{AsRawFd, RawFd},
    time::Duration,
};

use anyhow::{bail, Context};
use aya::maps::{MapData, RingBuf};
use pirate_common::{
    key::FlowKey,
    maps,
    pirate::{
        flow::{EpochRecord, FlowState},
        layout::Layout,
    },
    with_modes,
};

use super::flow::FlowEpoch;
use crate::datapath::{map_batch, Datapath};

/// What one drain found.
pub struct Drained {
    /// Flows that had packets in the closed epoch.
    pub flows: Vec<FlowEpoch>,
    /// Entries in the flow table (active or not).
    pub tracked: usize,
    /// Copies dropped as torn (read while the datapath rewrote them).
    pub inconsistent: usize,
}

/// The hand-over ring buffer of finished flow epochs, pirated's alone to consume.
pub struct Records {
    ring: RingBuf<MapData>,
    layout: Layout,
}

impl Records {
    pub fn take(dp: &mut Datapath) -> anyhow::Result<Records> {
        let ring = RingBuf::try_from(dp.take_map(maps::RECORDS)?)?;
        Ok(Records { ring, layout: dp.layout() })
    }

    /// The descriptor to wait for records on.
    pub fn fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    /// Drops the records waiting. Between a drain and the next epoch flip every record is stale
    /// (a flow the drain already read from the table, touched again), so pirated empties the
    /// ring as they come and it never fills.
    pub fn discard(&mut self) -> anyhow::Result<usize> {
        Ok(with_modes!(self.layout, M => take::<M>(&mut self.ring)?.len()))
    }

    /// Collects epoch `closed` after the datapath moved on to `closed + 1`: flows touched since
    /// the flip handed their state over through the ring buffer; the others still hold it in the
    /// table.
    pub fn drain(&mut self, dp: &Datapath, closed: u32) -> anyhow::Result<Drained> {
        // Let packets already inside the program under the old epoch finish.
        std::thread::sleep(Duration::from_millis(1));
        with_modes!(self.layout, M => drain::<M>(dp.flows()?, &mut self.ring, closed))
    }
}

fn drain<const M: usize>(table: &MapData, ring: &mut RingBuf<MapData>, closed: u32) -> anyhow::Result<Drained>
where
    FlowState<M>: aya::Pod,
{
    let mut flows = Vec::new();
    let mut tracked = 0;
    map_batch::for_each::<FlowKey, FlowState<M>>(table, |key, state| {
        tracked += 1;
        if state.measured(closed) {
            flows.push(FlowEpoch::from_state(*key, state));
        }
    })
    .context("reading the flow table")?;
    // After the scan: a flow reset during the scan handed its state over before the reset, and
    // its record overrides a copy the scan may have read mid-update.
    let records: HashMap<FlowKey, FlowEpoch> = take::<M>(ring)?
        .into_iter()
        .filter(|rec| rec.state.epoch == closed)
        .map(|rec| (rec.key, FlowEpoch::from_state(rec.key, &rec.state)))
        .collect();
    if !records.is_empty() {
        flows.retain(|f| !records.contains_key(&f.key));
        flows.extend(records.into_values());
    }
    let before = flows.len();
    flows.retain(FlowEpoch::is_consistent);
    Ok(Drained { inconsistent: before - flows.len(), flows, tracked })
}

/// Every record waiting in the ring buffer.
fn take<const M: usize>(ring: &mut RingBuf<MapData>) -> anyhow::Result<Vec<EpochRecord<M>>> {
    let want = size_of::<EpochRecord<M>>();
    let mut out = Vec::new();
    while let Some(item) = ring.next() {
        if item.len() != want {
            bail!("a {}-byte hand-over record, not {want}: pirated and its XDP object disagree", item.len());
        }
        // SAFETY: the datapath wrote an EpochRecord<M> (size checked); read unaligned.
        out.push(unsafe { std::ptr::read_unaligned(item.as_ptr() as *const EpochRecord<M>) });
    }
    Ok(out)
}
