//! Katran's balancer behind pirated: found in the forwarder slot each epoch (until it registers,
//! and again when another program takes the slot), given the VIPs, reals and weights, through its
//! maps or its own gRPC server, and read for each flow's real and each real's counters.

use std::{
    collections::{HashMap, HashSet},
    net::Ipv4Addr,
};

use pirate_common::{key::FlowKey, lb::RealCounters};
use tracing::{info, warn};

use super::{
    katran::{self, Katran},
    katran_grpc::{Client, VipWeights},
    pool::Pool,
};
use crate::datapath::lb::LbMaps;

/// Epochs a flow is remembered without packets (Katran's LRU keeps it on its real meanwhile).
const FORGET_AFTER: u32 = 64;

pub struct Driver {
    position: u32,
    /// Katran's server, when it controls Katran (pirated then only reads the maps).
    grpc: Option<Client>,
    /// The program in the slot and its maps, once found.
    found: Option<(u32, Box<Katran>)>,
    /// The program last refused as not Katran's, to warn once.
    refused: Option<u32>,
    /// Each pool's `vip_num`, once Katran has the VIP.
    vip_nums: Vec<Option<u32>>,
    /// Real ids read this epoch, and (with Katran's server, which numbers the reals) each
    /// address's id.
    addresses: HashMap<u32, Ipv4Addr>,
    ids: HashMap<Ipv4Addr, u32>,
    /// Each flow's real (its position in the pool) and the epoch it was last seen.
    seen: HashMap<FlowKey, (usize, u32)>,
}

impl Driver {
    /// Writes Katran's maps itself without `grpc_url`, else through the server there.
    pub fn new(position: u32, grpc_url: &str, pools: usize) -> anyhow::Result<Driver> {
        let grpc = (!grpc_url.is_empty()).then(|| Client::spawn(grpc_url)).transpose()?;
        Ok(Driver {
            position,
            grpc,
            found: None,
            refused: None,
            vip_nums: vec![None; pools],
            addresses: HashMap::new(),
            ids: HashMap::new(),
            seen: HashMap::new(),
        })
    }

    /// Whether Katran is in the slot, its maps open.
    pub fn is_up(&self) -> bool {
        self.found.is_some()
    }

    /// gRPC calls that failed so far.
    pub fn failures(&self) -> u64 {
        self.grpc.as_ref().map_or(0, Client::failures)
    }

    /// Follows the program in the slot: a new one, if Katran's, gets every VIP, real and ring
    /// (or weight) from the start; then the VIP numbers and real ids Katran lacked so far are
    /// looked for (its server adds them when it gets there).
    pub fn refresh(&mut self, forwarder: &LbMaps, pools: &[Pool]) -> anyhow::Result<()> {
        let id = forwarder.forwarder_program(self.position)?;
        // A program refused once is not looked at again: a new one has a new id.
        if id != self.found.as_ref().map(|(id, _)| *id) && (id.is_none() || id != self.refused) {
            if let Some((old, _)) = self.found.take() {
                warn!(program = old, slot = self.position, "Katran's balancer left the forwarder slot");
            }
            self.vip_nums.iter_mut().for_each(|v| *v = None);
            self.ids.clear();
            self.seen.clear();
            if let Some(id) = id {
                match Katran::of_program(id) {
                    Ok(maps) => {
                        info!(program = id, slot = self.position, "found Katran's balancer in the forwarder slot");
                        self.found = Some((id, Box::new(maps)));
                        self.install(pools)?;
                    }
                    Err(e) => {
                        warn!(program = id, "not driving the forwarder slot's program: {e:#}");
                        self.refused = Some(id);
                    }
                }
            }
        }
        let Some((_, maps)) = &self.found else { return Ok(()) };
        for (v, pool) in pools.iter().enumerate() {
            if self.vip_nums[v].is_none() {
                self.vip_nums[v] = maps.vip_num(pool.address, pool.proto.number())?;
            }
        }
        if self.grpc.is_some() && pools.iter().flat_map(|p| &p.reals).any(|r| !self.ids.contains_key(r)) {
            let ours: HashSet<Ipv4Addr> = pools.iter().flat_map(|p| p.reals.iter().copied()).collect();
            for (id, addr) in maps.reals()? {
                if ours.contains(&addr) {
                    self.ids.entry(addr).or_insert(id);
                }
            }
        }
        Ok(())
    }

    /// Gives a newly found Katran the VIPs, reals and rings (the VIPs' numbers are their
    /// positions, reals' ids the datapath indices), or has its server given the weights.
    fn install(&mut self, pools: &[Pool]) -> anyhow::Result<()> {
        if let Some(grpc) = &self.grpc {
            grpc.resend(pools.iter().map(|p| p.katran_weights()).collect());
            return Ok(());
        }
        let (_, maps) = self.found.as_mut().expect("found");
        for pool in pools {
            for (i, &addr) in pool.reals.iter().enumerate() {
                maps.set_real(pool.first + i as u32, addr)?;
            }
        }
        for (v, pool) in pools.iter().enumerate() {
            maps.write_ring(v as u32, None, &pool.ring_of_indices())?;
            maps.add_vip(pool.address, pool.proto.number(), v as u32)?;
        }
        Ok(())
    }

    /// The real (a position in `pool`, VIP `v`) flow `key` is on: the one Katran's ring gave it
    /// when first seen, or now.
    pub fn real_of(&mut self, v: usize, pool: &Pool, key: &FlowKey, epoch: u32) -> anyhow::Result<Option<usize>> {
        if let Some((real, last)) = self.seen.get_mut(key) {
            *last = epoch;
            return Ok(Some(*real));
        }
        let (Some((_, maps)), Some(vip_num)) = (&self.found, self.vip_nums[v]) else { return Ok(None) };
        let src = Ipv4Addr::new(key.src[0], key.src[1], key.src[2], key.src[3]);
        let id = maps.ring_real(vip_num, katran::position(src, key.sport, key.dport))?;
        if id == 0 {
            return Ok(None);
        }
        let addr = match self.addresses.get(&id) {
            Some(&addr) => addr,
            None => {
                let addr = maps.real_address(id)?;
                self.addresses.insert(id, addr);
                addr
            }
        };
        if self.grpc.is_some() {
            self.ids.insert(addr, id);
        }
        let Some(real) = pool.reals.iter().position(|&r| r == addr) else { return Ok(None) };
        self.seen.insert(*key, (real, epoch));
        Ok(Some(real))
    }

    /// Makes VIP `v`'s new weights Katran's: its ring, by the positions that changed from `old`,
    /// or the weights, through its server.
    pub fn reweigh(&mut self, v: usize, pool: &Pool, old: &[u32]) -> anyhow::Result<()> {
        if let Some(grpc) = &self.grpc {
            grpc.set_weights(v, &pool.ring_weights());
            return Ok(());
        }
        match (&mut self.found, self.vip_nums[v]) {
            (Some((_, maps)), Some(vip_num)) => maps.write_ring(vip_num, Some(old), &pool.ring_of_indices()),
            _ => Ok(()), // installed whole when Katran is found
        }
    }

    /// What Katran sent `pool`'s real `real`, if Katran and the real are known: its id is the
    /// datapath index where pirated writes the maps, Katran's server's own otherwise.
    pub fn real_counters(&self, pool: &Pool, real: usize) -> anyhow::Result<RealCounters> {
        let id = match self.grpc {
            None => Some(pool.first + real as u32),
            Some(_) => self.ids.get(&pool.reals[real]).copied(),
        };
        match (&self.found, id) {
            (Some((_, maps)), Some(id)) => maps.real_counters(id),
            _ => Ok(RealCounters::default()),
        }
    }

    /// Forgets the flows not seen for a while, and the real ids read (Katran's server may give
    /// an id to another real).
    pub fn end_epoch(&mut self, epoch: u32) {
        self.seen.retain(|_, (_, last)| epoch.wrapping_sub(*last) < FORGET_AFTER);
        self.addresses.clear();
    }
}

impl Pool {
    /// This pool's reals with their ring weights, as Katran's server takes them.
    fn katran_weights(&self) -> VipWeights {
        VipWeights {
            address: self.address,
            proto: self.proto.number(),
            reals: self.reals.iter().copied().zip(self.ring_weights()).collect(),
        }
    }
}
