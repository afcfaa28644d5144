//! `pirate`'s closed epoch, read out of the kernel: the flows the datapath handed over through
//! the ring buffer since the epoch flip, and the rest from the flow table, read in place. Never
//! writes to live state; it deletes from `V6_NAMES` the IPv6 addresses it has learned.

use std::{collections::HashMap, os::fd::RawFd, time::Duration};

use anyhow::{bail, Context};
use aya::maps::{HashMap as BpfHashMap, MapData, RingBuf};
use pirate_common::{
    key::{FlowId, FlowKey, FAMILY_V6},
    pirate::flow::EpochRecord,
    with_modes,
};

use super::flow::FlowEpoch;
use crate::datapath::{pirate::PirateMaps, table::FlowTable, Datapath};

/// What one drain found.
pub struct Drained {
    /// Flows that had packets in the closed epoch.
    pub flows: Vec<FlowEpoch>,
    /// Flows in the flow table (active or not).
    pub tracked: usize,
    /// Copies dropped as torn (read while the datapath rewrote them).
    pub inconsistent: usize,
    /// IPv6 flows left out because their addresses never reached pirated (`V6_NAMES` full).
    pub unnamed: usize,
}

/// Pirate's maps as the drain reads them (the flow table, the hand-over ring buffer), and the
/// IPv6 addresses of the flows in the table.
pub struct Records {
    maps: PirateMaps,
    names: Names,
}

impl Records {
    pub fn new(maps: PirateMaps) -> Records {
        Records { maps, names: Names { known: HashMap::new() } }
    }

    /// Pirate's maps taken out of `dp`.
    pub fn take(dp: &mut Datapath) -> anyhow::Result<Records> {
        Ok(Records::new(dp.take_pirate()?))
    }

    pub fn maps(&self) -> &PirateMaps {
        &self.maps
    }

    /// The descriptor to wait for records on.
    pub fn fd(&self) -> RawFd {
        self.maps.records_fd()
    }

    /// Drops the records waiting. Between a drain and the next epoch flip every record is stale
    /// (a flow the drain already read from the table, touched again), so pirated empties the
    /// ring as they come and it never fills.
    pub fn discard(&mut self) {
        let (_, ring, _) = self.maps.parts();
        while ring.next().is_some() {}
    }

    /// Flows in the flow table now.
    pub fn tracked(&self) -> usize {
        with_modes!(self.maps.layout(), M => self.maps.table().occupied::<M>())
    }

    /// Collects epoch `closed` after the datapath moved on to `closed + 1`: flows touched since
    /// the flip handed their state over through the ring buffer; the others still hold it in the
    /// table. The flows are written into `flows`' memory (what it held is dropped).
    pub fn drain(&mut self, closed: u32, flows: Vec<FlowEpoch>) -> anyhow::Result<Drained> {
        // Let packets already inside the program under the old epoch finish.
        std::thread::sleep(Duration::from_millis(1));
        let layout = self.maps.layout();
        let (table, ring, fresh) = self.maps.parts();
        self.names.learn(fresh, closed)?;
        with_modes!(layout, M => drain::<M>(table, ring, &mut self.names, closed, flows))
    }
}

/// IPv6 flows' addresses by id: learned from `V6_NAMES` (and deleted there), kept while their
/// flow is in the table.
struct Names {
    /// The addresses, and the drain that last learned or needed them.
    known: HashMap<FlowId, ([u8; 32], u32)>,
}

impl Names {
    /// Takes the addresses the datapath wrote into `fresh` (`V6_NAMES`) since the last drain
    /// (`stamp`: this one's epoch).
    fn learn(&mut self, fresh: &mut BpfHashMap<MapData, FlowId, [u8; 32]>, stamp: u32) -> anyhow::Result<()> {
        let new: Vec<(FlowId, [u8; 32])> = fresh.iter().collect::<Result<_, _>>().context("reading V6_NAMES")?;
        for (id, addrs) in new {
            self.known.insert(id, (addrs, stamp));
            // Already gone only if another reader took it: nothing to do then.
            let _ = fresh.remove(&id);
        }
        Ok(())
    }

    /// The key of a flow the table holds in drain `stamp`; `None` for an IPv6 flow whose
    /// addresses never arrived.
    fn key(&mut self, id: &FlowId, stamp: u32) -> Option<FlowKey> {
        if id.family != FAMILY_V6 {
            return id.v4_key();
        }
        let (addrs, seen) = self.known.get_mut(id)?;
        *seen = stamp;
        let mut key =
            FlowKey { sport: id.sport, dport: id.dport, proto: id.proto, family: FAMILY_V6, ..FlowKey::default() };
        key.src.copy_from_slice(&addrs[..16]);
        key.dst.copy_from_slice(&addrs[16..]);
        Some(key)
    }

    /// Forgets the flows neither learned nor found in the table in drain `stamp`.
    fn forget_all_but(&mut self, stamp: u32) {
        self.known.retain(|_, (_, seen)| *seen == stamp);
    }
}

fn drain<const M: usize>(
    table: &FlowTable,
    ring: &mut RingBuf<MapData>,
    names: &mut Names,
    closed: u32,
    mut flows: Vec<FlowEpoch>,
) -> anyhow::Result<Drained> {
    flows.clear();
    let (mut tracked, mut unnamed, mut inconsistent) = (0, 0, 0);
    // Where each set's flows start in `flows`, for the records to find their flows' copies.
    let mut starts: Vec<u32> = Vec::with_capacity(table.sets() + 1);
    let mut records = Vec::new();
    for i in 0..table.sets() {
        if i % RING_EVERY_SETS == 0 {
            take::<M>(ring, closed, &mut records)?;
        }
        starts.push(flows.len() as u32);
        for (w, id) in table.ids::<M>(i).iter().enumerate() {
            if id.family == 0 {
                continue;
            }
            tracked += 1;
            let Some(state) = table.measured::<M>(i, w, closed).filter(|s| s.measured(closed)) else { continue };
            match names.key(id, closed).map(|key| FlowEpoch::from_state(key, &state)) {
                Some(flow) if flow.is_consistent() => flows.push(flow),
                Some(_) => inconsistent += 1,
                None => unnamed += 1,
            }
        }
    }
    starts.push(flows.len() as u32);
    take::<M>(ring, closed, &mut records)?;
    // A flow rolled over after the scan read it handed its state over before the reset, and its
    // record replaces a copy the scan may have read mid-update.
    for rec in records {
        let Some(key) = names.key(&rec.id, closed) else {
            unnamed += 1;
            continue;
        };
        let flow = FlowEpoch::from_state(key, &rec.state);
        let (a, b) = table.sets_of(&key);
        let copy = [a, b]
            .into_iter()
            .flat_map(|s| starts[s as usize] as usize..starts[s as usize + 1] as usize)
            .find(|&j| flows[j].key == key);
        match copy {
            Some(j) => flows[j] = flow,
            None => flows.push(flow),
        }
    }
    names.forget_all_but(closed);
    Ok(Drained { inconsistent, flows, tracked, unnamed })
}

/// The drain reads the ring buffer every this many sets (a few milliseconds of its scan), so
/// that the ring need only hold what flows hand over meanwhile.
const RING_EVERY_SETS: usize = 4096;

/// Appends to `out` the records waiting in the ring buffer that hold epoch `closed` (the others
/// are stale).
fn take<const M: usize>(ring: &mut RingBuf<MapData>, closed: u32, out: &mut Vec<EpochRecord<M>>) -> anyhow::Result<()> {
    let want = size_of::<EpochRecord<M>>();
    while let Some(item) = ring.next() {
        if item.len() != want {
            bail!("a {}-byte hand-over record, not {want}: pirated and its XDP object disagree", item.len());
        }
        // SAFETY: the datapath wrote an EpochRecord<M> (size checked); read unaligned.
        let rec = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const EpochRecord<M>) };
        if rec.state.epoch == closed {
            out.push(rec);
        }
    }
    Ok(())
}
