//! The balancer as the daemon runs it: per VIP, its reals, weighted Maglev ring and controller.
//! At start it installs the VIPs, reals and rings into the datapath and registers `pirate_lb`
//! (or drives Katran's balancer from when it is found in the slot); every epoch it attributes
//! Pirate's per-flow estimates to the reals the flows are held on (the forwarder's connection
//! table, or Katran's ring), steps each VIP's controller and rewrites a ring whose weights moved.

use std::{collections::HashMap, net::Ipv4Addr};

use pirate_common::{
    key::FlowKey,
    lb::{LbShape, RealCounters, VipKey},
};
use serde::Serialize;

use super::{
    config::{Forwarder as Kind, LbConfig},
    controller::{Control, RealStats},
    katran_driver::Driver,
    pool::Pool,
};
use crate::datapath::lb::LbMaps;

pub struct Balancer {
    /// The forwarder's maps (and its `FORWARD` slots, where Katran registers too).
    maps: LbMaps,
    pools: Vec<Pool>,
    /// Each VIP's pool.
    vips: HashMap<VipKey, usize>,
    shape: LbShape,
    control: Control,
    adaptive: bool,
    position: u32,
    forwarder: Forwarder,
}

/// Where the rings go, and how a flow's real is known.
enum Forwarder {
    /// `pirate_lb`, in the datapath: its connection table says.
    Builtin,
    /// Katran's balancer.
    Katran(Box<Driver>),
}

/// One real's figures in an epoch, for the JSON lines and the metrics.
#[derive(Clone, Debug, Serialize)]
pub struct RealEpoch {
    /// The VIP, as `address:port/proto`.
    pub vip: String,
    pub real: Ipv4Addr,
    /// In equal shares (the VIP's reals sum to their number).
    pub weight: f64,
    /// Its share of the ring's entries.
    pub share: f64,
    pub latency_s: Option<f64>,
    pub requests: u64,
    pub active: u64,
    pub freshness: f64,
    /// What the forwarder sent it so far.
    pub packets: u64,
    pub bytes: u64,
    pub connections: u64,
}

/// What one epoch of balancing did.
#[derive(Clone, Debug, Default)]
pub struct LbEpoch {
    pub reals: Vec<RealEpoch>,
    /// The VIPs whose weights moved.
    pub moves: Vec<Move>,
    /// Whether the forwarder is in its slot (Katran, once registered and found).
    pub forwarder_up: bool,
    /// Calls to Katran's gRPC server that failed so far.
    pub control_failures: u64,
}

/// A move of one VIP's weights.
#[derive(Clone, Debug, Serialize)]
pub struct Move {
    pub vip: String,
    /// Weight the controller moved (in equal shares), 0 when the weights regressed to equal.
    pub weight: f64,
    /// Ring entries that changed real.
    pub entries: u64,
}

impl LbEpoch {
    /// A JSON line per real (`"type": "real"`), then one per VIP whose weights moved
    /// (`"type": "lb_move"`).
    pub fn write_json(&self, epoch: u32, out: &mut impl std::io::Write) -> std::io::Result<()> {
        #[derive(Serialize)]
        struct Line<'a, T> {
            #[serde(rename = "type")]
            kind: &'static str,
            epoch: u32,
            #[serde(flatten)]
            of: &'a T,
        }
        for r in &self.reals {
            serde_json::to_writer(&mut *out, &Line { kind: "real", epoch, of: r })?;
            out.write_all(b"\n")?;
        }
        for m in &self.moves {
            serde_json::to_writer(&mut *out, &Line { kind: "lb_move", epoch, of: m })?;
            out.write_all(b"\n")?;
        }
        Ok(())
    }
}

impl Balancer {
    /// Every VIP's ring at equal weights, installed in `maps` (`Balancer::install`).
    pub fn start(config: &LbConfig, maps: LbMaps) -> anyhow::Result<Balancer> {
        let mut first = 1; // real index 0 is "no real"
        let mut pools = Vec::with_capacity(config.vips.len());
        for vip in &config.vips {
            pools.push(Pool::new(vip, first, config.ring_size)?);
            first += vip.reals.len() as u32;
        }
        let forwarder = match config.forwarder {
            Kind::Builtin => Forwarder::Builtin,
            Kind::Katran => {
                Forwarder::Katran(Box::new(Driver::new(config.position, &config.katran_grpc, pools.len())?))
            }
        };
        let vips = pools.iter().enumerate().map(|(v, p)| (p.key(), v)).collect();
        let mut balancer = Balancer {
            maps,
            pools,
            vips,
            shape: config.shape(),
            control: config.control.clone(),
            adaptive: config.adaptive,
            position: config.position,
            forwarder,
        };
        balancer.install()?;
        Ok(balancer)
    }

    /// Installs the VIPs, reals and rings and registers the built-in forwarder in its slot,
    /// from when on packets to the VIPs are forwarded; Katran registers itself, and is driven
    /// from when it is found there.
    fn install(&mut self) -> anyhow::Result<()> {
        match &mut self.forwarder {
            Forwarder::Builtin => {
                let reals: Vec<(u32, Ipv4Addr)> = self
                    .pools
                    .iter()
                    .flat_map(|p| p.reals.iter().enumerate().map(|(i, &r)| (p.first + i as u32, r)))
                    .collect();
                let vips: Vec<(VipKey, u32)> = self.vips.iter().map(|(&k, &v)| (k, v as u32)).collect();
                self.maps.install(self.shape, &reals, &vips)?;
                for (v, pool) in self.pools.iter().enumerate() {
                    self.maps.write_ring(v as u32, &pool.ring_of_indices())?;
                }
                self.maps.register_forwarder(self.position)
            }
            Forwarder::Katran(driver) => driver.refresh(&self.maps, &self.pools),
        }
    }

    /// The real (a position in VIP `v`'s pool) flow `key` is held on, if known.
    fn real_of(&mut self, v: usize, key: &FlowKey, epoch: u32) -> anyhow::Result<Option<usize>> {
        let pool = &self.pools[v];
        match &mut self.forwarder {
            Forwarder::Builtin => Ok(self
                .maps
                .connection(key)?
                .and_then(|index| index.checked_sub(pool.first).map(|r| r as usize).filter(|&r| r < pool.reals.len()))),
            Forwarder::Katran(driver) => driver.real_of(v, pool, key, epoch),
        }
    }

    fn write_ring(&mut self, v: usize, old: &[u32]) -> anyhow::Result<()> {
        let pool = &self.pools[v];
        match &mut self.forwarder {
            Forwarder::Builtin => self.maps.write_ring(v as u32, &pool.ring_of_indices()),
            Forwarder::Katran(driver) => driver.reweigh(v, pool, old),
        }
    }

    fn real_counters(&self, pool: &Pool, real: usize) -> anyhow::Result<RealCounters> {
        match &self.forwarder {
            Forwarder::Builtin => self.maps.real_counters(pool.first + real as u32),
            Forwarder::Katran(driver) => driver.real_counters(pool, real),
        }
    }

    /// One epoch: each real's latency and freshness from the epoch's flows (each with its
    /// latency estimate and batches, if it has one), a step of each VIP's controller (if
    /// adaptive), its ring rewritten if the weights moved.
    pub fn step<'a>(
        &mut self,
        epoch: u32,
        flows: impl IntoIterator<Item = (&'a FlowKey, Option<(f64, u64)>)>,
    ) -> anyhow::Result<LbEpoch> {
        let mut out = LbEpoch::default();
        if let Forwarder::Katran(driver) = &mut self.forwarder {
            driver.refresh(&self.maps, &self.pools)?;
        }
        // Each pool's flows, in one pass over the epoch's: (real, estimate and batches).
        let mut per_pool: Vec<Vec<FlowFigure>> = vec![Vec::new(); self.pools.len()];
        for (key, figure) in flows {
            let Some(&v) = VipKey::of(key).and_then(|k| self.vips.get(&k)) else { continue };
            let Some(real) = self.real_of(v, key, epoch)? else { continue };
            per_pool[v].push((real, figure));
        }
        for (v, flows) in per_pool.iter().enumerate() {
            let stats = per_real(flows, self.pools[v].reals.len());
            let name = self.pools[v].name();
            if self.adaptive {
                let pool = &mut self.pools[v];
                let step = pool.controller.step(&self.control, &stats);
                if step.moved > 0.0 || step.regressed {
                    let old = pool.ring_of_indices();
                    let moved = pool.ring.reweigh(&pool.ring_weights())?;
                    self.write_ring(v, &old)?;
                    out.moves.push(Move { vip: name.clone(), weight: step.moved, entries: moved });
                }
            }
            let pool = &self.pools[v];
            let counts = pool.ring.counts();
            let size: u64 = counts.iter().sum();
            for (i, s) in stats.iter().enumerate() {
                let RealCounters { packets, bytes, connections } = self.real_counters(pool, i)?;
                out.reals.push(RealEpoch {
                    vip: name.clone(),
                    real: pool.reals[i],
                    weight: pool.controller.weights[i],
                    share: counts[i] as f64 / size as f64,
                    latency_s: s.latency_s,
                    requests: s.requests,
                    active: s.active,
                    freshness: s.freshness(),
                    packets,
                    bytes,
                    connections,
                });
            }
        }
        match &mut self.forwarder {
            Forwarder::Builtin => out.forwarder_up = true,
            Forwarder::Katran(driver) => {
                driver.end_epoch(epoch);
                out.forwarder_up = driver.is_up();
                out.control_failures = driver.failures();
            }
        }
        Ok(out)
    }
}

/// A flow of one epoch: its real (the position in its pool) and its estimate (ns) and batches,
/// `None` without an estimate.
type FlowFigure = (usize, Option<(f64, u64)>);

/// Each real's figures from its flows of one epoch: the latency is the batch-weighted mean of
/// the flows' estimates (a mean over requests), the requests their batches, the active flows
/// all of them.
pub fn per_real(flows: &[FlowFigure], reals: usize) -> Vec<RealStats> {
    let mut sums = vec![(0.0, 0u64, 0u64); reals];
    for &(real, figure) in flows {
        let (weighted, batches, active) = &mut sums[real];
        *active += 1;
        if let Some((estimate_ns, b)) = figure {
            *weighted += estimate_ns * b as f64;
            *batches += b;
        }
    }
    sums.into_iter()
        .map(|(weighted, batches, active)| RealStats {
            latency_s: (batches > 0).then(|| weighted / batches as f64 / 1e9),
            requests: batches,
            active,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real's latency is the mean over its requests, not over its flows; flows without an
    /// estimate count as active and carry no requests.
    #[test]
    fn reals_average_over_requests() {
        let flows = [(0, Some((1e6, 3))), (0, Some((4e6, 1))), (0, None), (2, Some((2e6, 5)))];
        let stats = per_real(&flows, 3);
        assert_eq!(stats[0].requests, 4);
        assert_eq!(stats[0].active, 3);
        assert!((stats[0].latency_s.unwrap() - 1.75e-3).abs() < 1e-12);
        assert_eq!(stats[1], RealStats::default());
        assert_eq!((stats[2].latency_s, stats[2].requests, stats[2].active), (Some(2e-3), 5, 1));
    }
}
