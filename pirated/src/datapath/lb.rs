//! The built-in forwarder's side of the datapath: its rings and connection table sized, and its
//! handle: its shape, VIPs and reals, the rings (mapped into the daemon and written a half at a
//! time), its counters and connection table, and the `FORWARD` slots.

use std::{
    net::Ipv4Addr,
    os::fd::{AsFd, BorrowedFd},
};

use anyhow::{bail, Context};
use aya::{
    maps::{Array, HashMap, Map, MapData, ProgramArray},
    programs::{ProgramFd, Xdp},
    Ebpf, EbpfLoader,
};
use pirate_common::{
    key::{FlowId, FlowKey},
    lb::{ring_index, LbShape, RealCounters, VipKey},
    maps,
};

use super::{bpf_call, mmap::Mapped, object, percpu, spec};

/// The forwarder's program.
pub(super) const LB: &str = "pirate_lb";

/// Sizes the forwarder's rings and connection table for `spec`.
pub(super) fn size(loader: &mut EbpfLoader<'_>, spec: &spec::Lb) {
    loader.set_max_entries(maps::LB_RINGS, spec.ring_entries).set_max_entries(maps::LB_CONNS, spec.max_connections);
}

/// The forwarder's maps and program as the balancer drives them.
pub struct LbMaps {
    shape: Array<MapData, LbShape>,
    reals: Array<MapData, [u8; 4]>,
    vips: HashMap<MapData, VipKey, u32>,
    halves: Array<MapData, u32>,
    rings: Mapped,
    counters: MapData,
    connections: HashMap<MapData, FlowId, u32>,
    /// `FORWARD`, a program array.
    forward: Map,
    /// `pirate_lb`, to register in a `FORWARD` slot.
    program: ProgramFd,
    /// Possible CPUs: the counters' value count.
    cpus: usize,
    /// The datapath's flow seed, which IPv6 connections' ids depend on.
    seed: u64,
}

impl LbMaps {
    /// Takes the forwarder's maps out of the object, and a descriptor of `pirate_lb`.
    pub(super) fn take(ebpf: &mut Ebpf, cpus: usize, seed: u64) -> anyhow::Result<LbMaps> {
        let program: &Xdp = ebpf.program(LB).unwrap().try_into()?;
        let program = program.fd()?.try_clone().context("duplicating pirate_lb's descriptor")?;
        let rings = object::take_array(ebpf, maps::LB_RINGS)?;
        Ok(LbMaps {
            shape: Array::try_from(object::take(ebpf, maps::LB_SHAPE)?)?,
            reals: Array::try_from(object::take(ebpf, maps::LB_REALS)?)?,
            vips: HashMap::try_from(object::take(ebpf, maps::LB_VIPS)?)?,
            halves: Array::try_from(object::take(ebpf, maps::LB_HALVES)?)?,
            rings: Mapped::of(&rings).context("mapping LB_RINGS")?,
            counters: object::take_per_cpu(ebpf, maps::LB_COUNTERS)?,
            connections: HashMap::try_from(object::take(ebpf, maps::LB_CONNS)?)?,
            forward: object::take(ebpf, maps::FORWARD)?,
            program,
            cpus,
            seed,
        })
    }

    /// Writes the forwarder's shape, its reals (index → address) and VIPs (key → number), and
    /// drops VIPs a previous instance left that `vips` no longer has (their packets pass from
    /// then on). Rings come after, by [`LbMaps::write_ring`]; a VIP is live once in `vips`.
    pub fn install(&mut self, shape: LbShape, reals: &[(u32, Ipv4Addr)], vips: &[(VipKey, u32)]) -> anyhow::Result<()> {
        self.shape.set(0, shape, 0).context("writing LB_SHAPE")?;
        for &(index, addr) in reals {
            self.reals.set(index, addr.octets(), 0).with_context(|| format!("writing LB_REALS[{index}]"))?;
        }
        let table = &mut self.vips;
        for &(key, number) in vips {
            table.insert(key, number, 0).with_context(|| format!("writing LB_VIPS for {key:?}"))?;
        }
        let stale: Vec<VipKey> =
            table.keys().filter_map(Result::ok).filter(|k| !vips.iter().any(|(v, _)| v == k)).collect();
        for key in stale {
            table.remove(&key).with_context(|| format!("removing the stale VIP {key:?}"))?;
        }
        Ok(())
    }

    /// Makes `ring` (a real index per entry, `ring_size` of them) VIP `vip`'s: written into the
    /// half of its rings no lookup uses, then made the live one, so that a lookup sees the old
    /// ring or the new, never a mix. (A lookup that read the old half's number just before the
    /// flip still reads the old ring: the next write, an epoch later, goes there.)
    pub fn write_ring(&mut self, vip: u32, ring: &[u32]) -> anyhow::Result<()> {
        let halves = &mut self.halves;
        let spare = halves.get(&vip, 0).with_context(|| format!("reading LB_HALVES[{vip}]"))? ^ 1;
        let size = ring.len() as u32;
        for (pos, &real) in ring.iter().enumerate() {
            self.rings.write(ring_index(vip, spare, pos as u32, size) as usize, real);
        }
        halves.set(vip, spare, 0).with_context(|| format!("flipping LB_HALVES[{vip}]"))
    }

    /// What the forwarder sent real `index`, over all CPUs.
    pub fn real_counters(&self, index: u32) -> anyhow::Result<RealCounters> {
        let per_cpu = percpu::values::<RealCounters>(self.counters.fd().as_fd(), index, self.cpus)
            .with_context(|| format!("reading LB_COUNTERS[{index}]"))?;
        Ok(per_cpu.iter().fold(RealCounters::default(), |a, c| RealCounters {
            packets: a.packets + c.packets,
            bytes: a.bytes + c.bytes,
            connections: a.connections + c.connections,
        }))
    }

    /// The real flow `key` is held on, if the connection table has it.
    pub fn connection(&self, key: &FlowKey) -> anyhow::Result<Option<u32>> {
        match self.connections.get(&FlowId::of(key, self.seed), 0) {
            Ok(real) => Ok(Some(real)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(e).context("reading LB_CONNS"),
        }
    }

    /// Puts `pirate_lb` into `FORWARD` slot `position`.
    pub fn register_forwarder(&mut self, position: u32) -> anyhow::Result<()> {
        ProgramArray::try_from(&mut self.forward)?
            .set(position, &self.program, 0)
            .with_context(|| format!("registering pirate_lb in FORWARD slot {position}"))
    }

    /// Pins `FORWARD` at `path`, where another balancer (Katran) registers itself, as it does in
    /// the daemon's pin directory: for a datapath loaded without one (benchmarks).
    pub fn pin_forward(&self, path: &std::path::Path) -> anyhow::Result<()> {
        self.forward.pin(path).with_context(|| format!("pinning FORWARD at {}", path.display()))
    }

    /// The id of the program in `FORWARD` slot `position`, if one is registered there.
    pub fn forwarder_program(&self, position: u32) -> anyhow::Result<Option<u32>> {
        let Map::ProgramArray(forward) = &self.forward else {
            bail!("FORWARD is not a program array: pirated and its XDP object were built apart");
        };
        program_in_slot(forward.fd().as_fd(), position).with_context(|| format!("reading FORWARD slot {position}"))
    }
}

/// The id of the program in slot `slot` of the program array `array`, if the slot holds one (aya
/// writes program arrays but does not read them).
pub fn program_in_slot(array: BorrowedFd<'_>, slot: u32) -> std::io::Result<Option<u32>> {
    let mut id = [0u32];
    // SAFETY: a program array's entries read back as the program's u32 id.
    match unsafe { bpf_call::lookup(array, slot, &mut id) } {
        Ok(()) => Ok(Some(id[0])),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}
