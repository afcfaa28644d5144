//! Pirate's side of the datapath: its maps sized (the flow table of the configured layout, the
//! hand-over ring, the IPv6 names), its parameters and epoch program written, and its handle:
//! the flow table mapped, the ring and the names, owned by the one drain that reads them.

use std::{
    fs,
    os::fd::{AsFd, AsRawFd},
};

use anyhow::{anyhow, Context};
use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, ProgramArray, RingBuf},
    programs::Xdp,
    Ebpf, EbpfLoader,
};
use pirate_common::{
    key::FlowId,
    maps,
    pirate::{config::Params, layout::Layout, table::sets_for},
};

use super::{object, ring, spec, table::FlowTable};

/// The most a hand-over ring takes: about 1.6 M compact records (with the kernel's 8-byte header
/// each).
const MAX_RING_BYTES: usize = 256 << 20;

/// Flows per record the hand-over ring holds.
const FLOWS_PER_RECORD: usize = 4;

/// Sizes Pirate's maps for `spec`: the flow table of its layout (the other layout's, which no
/// program of this chain uses, one set), the names and the hand-over ring.
pub(super) fn size(loader: &mut EbpfLoader<'_>, spec: &spec::Pirate) {
    loader
        .set_max_entries(spec.layout.flows_map(), sets_for(spec.max_flows))
        .set_max_entries(spec.layout.unused_flows_map(), 1)
        .set_max_entries(maps::V6_NAMES, spec.max_flows)
        .set_max_entries(maps::RECORDS, ring_size(spec.max_flows as usize, spec.layout));
}

/// Writes Pirate's parameters and puts its epoch program (the layout's) into `PIRATE_FLOW`,
/// once the programs are loaded.
pub(super) fn configure(ebpf: &mut Ebpf, spec: &spec::Pirate) -> anyhow::Result<()> {
    Array::<_, Params>::try_from(ebpf.map_mut(maps::CONFIG).unwrap())?
        .set(0, spec.params, 0)
        .context("writing CONFIG")?;
    let roll_over: &Xdp = ebpf.program(spec.layout.flow_program()).unwrap().try_into()?;
    let roll_over = roll_over.fd()?.try_clone().context("duplicating the epoch program's descriptor")?;
    ProgramArray::try_from(ebpf.map_mut(maps::PIRATE_FLOW).unwrap())?
        .set(0, &roll_over, 0)
        .context("filling PIRATE_FLOW")
}

/// Ring buffer size: a power of two of at least one page holding a record for every
/// `FLOWS_PER_RECORD` flows, up to `MAX_RING_BYTES`. Records pile up only for the few
/// milliseconds between two reads: the drain reads the ring as it scans the table, and pirated
/// discards the stale ones as they arrive at any other time. A record that finds the ring full
/// is counted (`pirated_epoch_records_lost_total`). Its pages count twice in the daemon's
/// resident memory (the kernel maps them twice, for records that wrap around).
fn ring_size(flows: usize, layout: Layout) -> u32 {
    (flows.div_ceil(FLOWS_PER_RECORD) * (layout.record_size() + 8))
        .clamp(ring::min_bytes() as usize, MAX_RING_BYTES)
        .next_power_of_two() as u32
}

/// Pirate's maps as the daemon reads them.
pub struct PirateMaps {
    layout: Layout,
    table: FlowTable,
    /// The flow table's map (the mapping above reads it).
    flows: MapData,
    records: RingBuf<MapData>,
    names: BpfHashMap<MapData, FlowId, [u8; 32]>,
    ring_bytes: u32,
}

impl PirateMaps {
    /// Takes Pirate's maps, sized for `spec`, out of the object.
    pub(super) fn take(ebpf: &mut Ebpf, spec: &spec::Pirate, seed: u64) -> anyhow::Result<PirateMaps> {
        let layout = spec.layout;
        let flows = object::take_array(ebpf, layout.flows_map())?;
        let table = FlowTable::map(&flows, seed).context("mapping the flow table")?;
        let records = RingBuf::try_from(object::take(ebpf, maps::RECORDS)?)?;
        let names = BpfHashMap::try_from(object::take(ebpf, maps::V6_NAMES)?)?;
        let ring_bytes = ring_size(spec.max_flows as usize, layout);
        Ok(PirateMaps { layout, table, flows, records, names, ring_bytes })
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The flow table (the configured layout's), mapped.
    pub fn table(&self) -> &FlowTable {
        &self.table
    }

    /// The flow table, the hand-over ring and the IPv6 flows' addresses the datapath wrote, to
    /// read together.
    pub fn parts(&mut self) -> (&FlowTable, &mut RingBuf<MapData>, &mut BpfHashMap<MapData, FlowId, [u8; 32]>) {
        (&self.table, &mut self.records, &mut self.names)
    }

    /// The descriptor that becomes readable when flows hand epochs over.
    pub fn records_fd(&self) -> std::os::fd::RawFd {
        self.records.as_raw_fd()
    }

    /// Size of the hand-over ring buffer, in bytes.
    pub fn ring_bytes(&self) -> u64 {
        self.ring_bytes as u64
    }

    /// The kernel's memlock accounting of the flow table, in bytes.
    pub fn table_memlock(&self) -> anyhow::Result<u64> {
        memlock_of_fd(self.flows.fd().as_fd().as_raw_fd())
    }
}

/// Reads `memlock:` from /proc/self/fdinfo/<fd>, which the kernel fills for BPF maps.
fn memlock_of_fd(fd: i32) -> anyhow::Result<u64> {
    let info = fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))?;
    info.lines()
        .find_map(|l| l.strip_prefix("memlock:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow!("no memlock in fdinfo"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ring holds a record per `FLOWS_PER_RECORD` flows up to its ceiling, so every
    /// `max_flows` that `check` accepts also loads (the kernel wants a power-of-two number of
    /// pages).
    #[test]
    fn the_ring_holds_a_record_per_four_flows_up_to_its_ceiling() {
        let record = Layout::Compact.record_size() + 8;
        for flows in [1, 100, 65_536, 1 << 20, 4_000_000, 1 << 24] {
            let bytes = ring_size(flows, Layout::Compact) as usize;
            let least = ring::min_bytes() as usize;
            assert!(bytes.is_power_of_two() && (least..=MAX_RING_BYTES).contains(&bytes), "{flows}: {bytes}");
            let want = flows.div_ceil(FLOWS_PER_RECORD) * record;
            assert!(bytes >= want.min(MAX_RING_BYTES), "{flows} flows, {bytes} bytes");
        }
    }
}
