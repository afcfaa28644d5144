//! The built-in forwarder's side of the datapath: its shape, VIPs and reals, the rings (mapped
//! into the daemon and written a half at a time), its counters and connection table, and its
//! `FORWARD` slot.

use std::{net::Ipv4Addr, os::fd::AsFd};

use anyhow::{bail, Context};
use aya::maps::{Array, HashMap, Map, ProgramArray};
use pirate_common::{
    key::FlowId,
    lb::{ring_index, LbShape, RealCounters, VipKey},
    maps,
};

use super::{percpu, Datapath};

/// The forwarder's program.
pub(super) const LB: &str = "pirate_lb";

impl Datapath {
    /// Writes the forwarder's shape, its reals (index → address) and VIPs (key → number), and
    /// drops VIPs a previous instance left that `vips` no longer has (their packets pass from
    /// then on). Rings come after, by [`Datapath::write_ring`]; a VIP is live once in `vips`.
    pub fn install_lb(
        &mut self,
        shape: LbShape,
        reals: &[(u32, Ipv4Addr)],
        vips: &[(VipKey, u32)],
    ) -> anyhow::Result<()> {
        Array::<_, LbShape>::try_from(self.ebpf.map_mut(maps::LB_SHAPE).unwrap())?
            .set(0, shape, 0)
            .context("writing LB_SHAPE")?;
        let mut addrs = Array::<_, [u8; 4]>::try_from(self.ebpf.map_mut(maps::LB_REALS).unwrap())?;
        for &(index, addr) in reals {
            addrs.set(index, addr.octets(), 0).with_context(|| format!("writing LB_REALS[{index}]"))?;
        }
        let mut table = HashMap::<_, VipKey, u32>::try_from(self.ebpf.map_mut(maps::LB_VIPS).unwrap())?;
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
        let mut halves = Array::<_, u32>::try_from(self.ebpf.map_mut(maps::LB_HALVES).unwrap())?;
        let spare = halves.get(&vip, 0).with_context(|| format!("reading LB_HALVES[{vip}]"))? ^ 1;
        let size = ring.len() as u32;
        for (pos, &real) in ring.iter().enumerate() {
            self.rings.write(ring_index(vip, spare, pos as u32, size) as usize, real);
        }
        halves.set(vip, spare, 0).with_context(|| format!("flipping LB_HALVES[{vip}]"))
    }

    /// What the forwarder sent real `index`, over all CPUs.
    pub fn real_counters(&self, index: u32) -> anyhow::Result<RealCounters> {
        let map = super::per_cpu_array(&self.ebpf, maps::LB_COUNTERS)?;
        let per_cpu = percpu::values::<RealCounters>(map.fd().as_fd(), index, self.cpus)
            .with_context(|| format!("reading LB_COUNTERS[{index}]"))?;
        Ok(per_cpu.iter().fold(RealCounters::default(), |a, c| RealCounters {
            packets: a.packets + c.packets,
            bytes: a.bytes + c.bytes,
            connections: a.connections + c.connections,
        }))
    }

    /// The real flow `id` is held on, if the connection table has it.
    pub fn connection(&self, id: &FlowId) -> anyhow::Result<Option<u32>> {
        let table = HashMap::<_, FlowId, u32>::try_from(self.ebpf.map(maps::LB_CONNS).unwrap())?;
        match table.get(id, 0) {
            Ok(real) => Ok(Some(real)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(e).context("reading LB_CONNS"),
        }
    }

    /// Puts `pirate_lb` into `FORWARD` slot `position`.
    pub fn register_forwarder(&mut self, position: u32) -> anyhow::Result<()> {
        let program: &aya::programs::Xdp = self.ebpf.program(LB).unwrap().try_into()?;
        let fd = program.fd()?.try_clone().context("duplicating pirate_lb's descriptor")?;
        ProgramArray::try_from(self.ebpf.map_mut(maps::FORWARD).unwrap())?
            .set(position, &fd, 0)
            .with_context(|| format!("registering pirate_lb in FORWARD slot {position}"))
    }

    /// The id of the program in `FORWARD` slot `position`, if one is registered there.
    pub fn forwarder_program(&self, position: u32) -> anyhow::Result<Option<u32>> {
        let Map::ProgramArray(forward) = self.ebpf.map(maps::FORWARD).unwrap() else {
            bail!("FORWARD is not a program array: pirated and its XDP object were built apart");
        };
        let mut id = [0u32];
        // SAFETY: a program array's entries read back as the program's u32 id.
        match unsafe { super::bpf_call::lookup(forward.fd().as_fd(), position, &mut id) } {
            Ok(()) => Ok(Some(id[0])),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading FORWARD slot {position}")),
        }
    }
}
