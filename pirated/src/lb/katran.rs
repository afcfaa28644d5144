//! Katran's balancer as pirated finds and drives it. Katran registers itself in pirated's
//! `FORWARD` (its `rootMapPath` and `rootMapPos`); pirated finds its maps through the program in
//! that slot (by name, whether or not they are pinned), checks their layouts against Katran's
//! `balancer_structs.h`, reads its VIPs, rings, reals and per-real counters, and, unless Katran's
//! own server controls it, writes them (its default router's MAC, `ctl_array`, is the
//! deployment's to set).
//!
//! Katran keeps established flows on their real in its own LRU; pirated attributes a flow to the
//! real Katran's ring gave it when pirated first saw the flow, by Katran's own flow hash
//! ([`position`]), and remembers it, as the LRU does.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    os::fd::AsFd,
};

use anyhow::{ensure, Context};
use aya::maps::{Array, HashMap, Map, MapData};
use pirate_common::lb::RealCounters;

use crate::datapath::percpu;

/// Katran's `RING_SIZE` (`balancer_consts.h`): positions in each VIP's ring, compiled in.
pub const RING_SIZE: u32 = 65_537;
/// Katran's default `MAX_VIPS` (`balancer_consts.h`): the rings in `ch_rings`.
pub const MAX_VIPS: u32 = 512;
/// Katran's `INIT_JHASH_SEED`: `CH_RINGS_SIZE`, `MAX_VIPS` rings.
const JHASH_SEED: u32 = MAX_VIPS * RING_SIZE;

/// Katran's maps, found through its program.
pub struct Katran {
    vips: HashMap<MapData, [u8; 20], [u8; 8]>,
    reals: Array<MapData, [u8; 20]>,
    max_reals: u32,
    rings: Array<MapData, u32>,
    reals_stats: MapData,
    lru_miss_stats: MapData,
    vip_miss_stats: Array<MapData, [u8; 20]>,
    cpus: usize,
}

impl Katran {
    /// Opens the maps of program `id` (the one in pirated's forwarder slot), checking the layouts
    /// this module reads and writes: a program that is not Katran's balancer, or a Katran built
    /// with other sizes, fails here, clearly, not as a balancer that drops everything.
    pub fn of_program(id: u32) -> anyhow::Result<Katran> {
        let program = aya::programs::loaded_programs()
            .filter_map(Result::ok)
            .find(|p| p.id() == id)
            .with_context(|| format!("program {id} is no longer loaded"))?;
        let ids = program
            .map_ids()
            .context("listing the maps of the program in the forwarder slot")?
            .context("this kernel does not list a program's maps (Linux 4.15 does)")?;
        let mut maps = std::collections::HashMap::new();
        for map in ids {
            let data = MapData::from_id(map).with_context(|| format!("opening map {map} of program {id}"))?;
            if let Some(name) = data.info()?.name_as_str() {
                maps.insert(name.to_owned(), data);
            }
        }
        let mut take = |name: &str, key: u32, value: u32| -> anyhow::Result<(MapData, u32)> {
            let data = maps.remove(name).with_context(|| {
                format!("the program in the forwarder slot (id {id}) has no map {name}: is it Katran's balancer?")
            })?;
            let info = data.info()?;
            ensure!(
                (info.key_size(), info.value_size()) == (key, value),
                "Katran's map {name} has {} B keys and {} B values where balancer_structs.h says {key} and {value}",
                info.key_size(),
                info.value_size()
            );
            Ok((data, info.max_entries()))
        };
        let (vips, _) = take("vip_map", 20, 8)?;
        let (reals, max_reals) = take("reals", 4, 20)?;
        let (rings, positions) = take("ch_rings", 4, 4)?;
        ensure!(
            positions == JHASH_SEED,
            "Katran's ch_rings has {positions} positions: this module assumes MAX_VIPS = {MAX_VIPS} rings of RING_SIZE = {RING_SIZE}"
        );
        let (reals_stats, _) = take("reals_stats", 4, 16)?;
        let (lru_miss_stats, _) = take("lru_miss_stats", 4, 4)?;
        let (vip_miss_stats, _) = take("vip_miss_stats", 4, 20)?;
        let cpus = aya::util::nr_cpus().map_err(|(path, e)| anyhow::anyhow!("reading {path}: {e}"))?;
        Ok(Katran {
            vips: HashMap::try_from(Map::HashMap(vips))?,
            reals: Array::try_from(Map::Array(reals))?,
            max_reals,
            rings: Array::try_from(Map::Array(rings))?,
            reals_stats,
            lru_miss_stats,
            vip_miss_stats: Array::try_from(Map::Array(vip_miss_stats))?,
            cpus,
        })
    }

    /// VIP `vip`/`proto`'s `vip_num` (its ring and stats index), if Katran has the VIP.
    pub fn vip_num(&self, vip: SocketAddrV4, proto: u8) -> anyhow::Result<Option<u32>> {
        match self.vips.get(&vip_definition(vip, proto), 0) {
            Ok(meta) => Ok(Some(u32::from_ne_bytes(meta[4..].try_into().unwrap()))),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading Katran's vip_map for {vip}")),
        }
    }

    /// The real id at `position` of VIP `vip_num`'s ring (0: none).
    pub fn ring_real(&self, vip_num: u32, position: u32) -> anyhow::Result<u32> {
        let key = ring_key(vip_num, position);
        self.rings.get(&key, 0).with_context(|| format!("reading Katran's ch_rings[{key}]"))
    }

    /// Real `id`'s IPv4 address.
    pub fn real_address(&self, id: u32) -> anyhow::Result<Ipv4Addr> {
        let real = self.reals.get(&id, 0).with_context(|| format!("reading Katran's reals[{id}]"))?;
        Ok(Ipv4Addr::new(real[0], real[1], real[2], real[3]))
    }

    /// Every real id set to an address (id 0 is "no real").
    pub fn reals(&self) -> anyhow::Result<Vec<(u32, Ipv4Addr)>> {
        let mut set = Vec::new();
        for id in 1..self.max_reals {
            let addr = self.real_address(id)?;
            if !addr.is_unspecified() {
                set.push((id, addr));
            }
        }
        Ok(set)
    }

    /// Adds VIP `vip`/`proto` as Katran's `vip_num` (its ring and stats index), hashing the
    /// client's address and both ports (vip_meta flags 0). The first VIP's new flows are
    /// counted per real (Katran's `vip_miss_stats` names one VIP).
    pub fn add_vip(&mut self, vip: SocketAddrV4, proto: u8, vip_num: u32) -> anyhow::Result<()> {
        let key = vip_definition(vip, proto);
        self.vips
            .insert(key, vip_meta(0, vip_num), 0)
            .with_context(|| format!("writing Katran's vip_map for {vip}"))?;
        if vip_num == 0 {
            self.vip_miss_stats.set(0, key, 0).context("writing Katran's vip_miss_stats")?;
        }
        Ok(())
    }

    /// Sets real `id` (from 1) to `addr` (IPIP over IPv4).
    pub fn set_real(&mut self, id: u32, addr: Ipv4Addr) -> anyhow::Result<()> {
        self.reals.set(id, real_definition(addr), 0).with_context(|| format!("writing Katran's reals[{id}]"))
    }

    /// Makes `ring` (a real id per position) VIP `vip_num`'s, writing only the positions that
    /// differ from `old` (all of them without it). Each position is one 4-byte write, so a
    /// lookup sees its old real or its new one, both live reals.
    pub fn write_ring(&mut self, vip_num: u32, old: Option<&[u32]>, ring: &[u32]) -> anyhow::Result<()> {
        ensure!(ring.len() == RING_SIZE as usize, "Katran's rings have {RING_SIZE} positions, not {}", ring.len());
        for (pos, &id) in ring.iter().enumerate() {
            if old.is_some_and(|o| o[pos] == id) {
                continue;
            }
            let key = ring_key(vip_num, pos as u32);
            self.rings.set(key, id, 0).with_context(|| format!("writing Katran's ch_rings[{key}]"))?;
        }
        Ok(())
    }

    /// What Katran sent real `id`: packets and bytes (`reals_stats`), and new flows (LRU misses,
    /// counted for the first VIP only).
    pub fn real_counters(&self, id: u32) -> anyhow::Result<RealCounters> {
        let stats = percpu::values::<[u64; 2]>(self.reals_stats.fd().as_fd(), id, self.cpus)
            .with_context(|| format!("reading Katran's reals_stats[{id}]"))?;
        // u32 values, each in an 8-byte per-CPU slot.
        let misses = percpu::values::<u64>(self.lru_miss_stats.fd().as_fd(), id, self.cpus)
            .with_context(|| format!("reading Katran's lru_miss_stats[{id}]"))?;
        Ok(RealCounters {
            packets: stats.iter().map(|s| s[0]).sum(),
            bytes: stats.iter().map(|s| s[1]).sum(),
            connections: misses.iter().map(|m| m & 0xffff_ffff).sum(),
        })
    }
}

/// `struct vip_definition`: the address in the first 4 of 16 bytes, the port in network order
/// at 16 (Katran copies the TCP header's), the protocol at 18, one byte of zero padding.
pub fn vip_definition(vip: SocketAddrV4, proto: u8) -> [u8; 20] {
    let mut key = [0u8; 20];
    key[..4].copy_from_slice(&vip.ip().octets());
    key[16..18].copy_from_slice(&vip.port().to_be_bytes());
    key[18] = proto;
    key
}

/// `struct vip_meta`: its flags (`F_*` of `balancer_consts.h`; 0 hashes the client's address and
/// both ports), then `vip_num`, host byte order.
pub fn vip_meta(flags: u32, vip_num: u32) -> [u8; 8] {
    let mut meta = [0u8; 8];
    meta[..4].copy_from_slice(&flags.to_ne_bytes());
    meta[4..].copy_from_slice(&vip_num.to_ne_bytes());
    meta
}

/// `struct real_definition` of an IPv4 real: 16 bytes of address (IPv4 in the first 4, network
/// order), flags at 16 (no `F_IPV6`: IPIP over IPv4), padding to 20.
pub fn real_definition(addr: Ipv4Addr) -> [u8; 20] {
    let mut real = [0u8; 20];
    real[..4].copy_from_slice(&addr.octets());
    real
}

/// The key in `ch_rings` of position `position` of VIP `vip_num`'s ring.
pub fn ring_key(vip_num: u32, position: u32) -> u32 {
    vip_num * RING_SIZE + position
}

/// The ring position Katran gives an IPv4 flow from `src`:`sport` to `dport`:
/// `jhash_2words(src, ports, INIT_JHASH_SEED) % RING_SIZE`, with the address and the two ports
/// read as the little-endian words their network-order bytes make.
pub fn position(src: Ipv4Addr, sport: u16, dport: u16) -> u32 {
    let a = u32::from_le_bytes(src.octets());
    let mut ports = [0u8; 4];
    ports[..2].copy_from_slice(&sport.to_be_bytes());
    ports[2..].copy_from_slice(&dport.to_be_bytes());
    jhash_2words(a, u32::from_le_bytes(ports), JHASH_SEED) % RING_SIZE
}

/// Bob Jenkins' lookup3 hash of two words, as the Linux kernel's `jhash_2words` defines it.
fn jhash_2words(a: u32, b: u32, seed: u32) -> u32 {
    let init = seed.wrapping_add(0xdead_beef).wrapping_add(2 << 2);
    let (mut a, mut b, mut c) = (a.wrapping_add(init), b.wrapping_add(init), init);
    // lookup3's final mix.
    c = (c ^ b).wrapping_sub(b.rotate_left(14));
    a = (a ^ c).wrapping_sub(c.rotate_left(11));
    b = (b ^ a).wrapping_sub(a.rotate_left(25));
    c = (c ^ b).wrapping_sub(b.rotate_left(16));
    a = (a ^ c).wrapping_sub(c.rotate_left(4));
    b = (b ^ a).wrapping_sub(a.rotate_left(14));
    (c ^ b).wrapping_sub(b.rotate_left(24))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values Katran's own `linux_includes/jhash.h`, compiled with clang, gives for these inputs.
    #[test]
    fn jhash_matches_katrans() {
        assert_eq!(jhash_2words(0, 0, 0), 1_489_077_439);
        assert_eq!(jhash_2words(0x0101_cc0a, 0x5000_e9c3, JHASH_SEED), 2_722_637_123);
        assert_eq!(jhash_2words(0xdead_beef, 12345, 7), 4_156_413_835);
    }

    /// The VIP key is laid out as `struct vip_definition`: address, port in network order, protocol.
    #[test]
    fn vip_definitions_follow_balancer_structs() {
        let key = vip_definition(SocketAddrV4::new(Ipv4Addr::new(10, 204, 100, 1), 80), 6);
        assert_eq!(&key[..4], &[10, 204, 100, 1]);
        assert_eq!(&key[4..16], &[0; 12]);
        assert_eq!(&key[16..], &[0, 80, 6, 0]);
    }
}
