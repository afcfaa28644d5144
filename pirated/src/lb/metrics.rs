//! The balancer's Prometheus families: per real its weight, ring share, latency, freshness and
//! what the forwarder sent it; per VIP the weight moves; whether the forwarder is there.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::balancer::LbEpoch;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RealLabel {
    vip: String,
    real: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VipLabel {
    vip: String,
}

type GaugeF = Gauge<f64, AtomicU64>;

#[derive(Default)]
pub struct Metrics {
    weight: Family<RealLabel, GaugeF>,
    share: Family<RealLabel, GaugeF>,
    latency: Family<RealLabel, GaugeF>,
    freshness: Family<RealLabel, GaugeF>,
    packets: Family<RealLabel, Counter>,
    bytes: Family<RealLabel, Counter>,
    connections: Family<RealLabel, Counter>,
    moves: Family<VipLabel, Counter>,
    entries_moved: Family<VipLabel, Counter>,
    forwarder_up: Gauge,
    katran_grpc_failures: Counter,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics::default();
        let lb = registry.sub_registry_with_prefix("lb");
        lb.register(
            "real_weight",
            "A real's weight, in equal shares (a VIP's reals sum to their number)",
            m.weight.clone(),
        );
        lb.register("real_ring_share", "A real's share of its VIP's Maglev ring", m.share.clone());
        lb.register(
            "real_latency_seconds",
            "Mean response latency of the flows held on a real in the last epoch (Pirate's estimates, per request)",
            m.latency.clone(),
        );
        lb.register(
            "real_freshness",
            "Requests in the last epoch per flow active on a real (the controller feeds only reals at least as fresh as every slow one)",
            m.freshness.clone(),
        );
        lb.register("real_packets", "Packets the forwarder sent to a real", m.packets.clone());
        lb.register("real_bytes", "Bytes (inner IP packets) the forwarder sent to a real", m.bytes.clone());
        lb.register("real_connections", "Flows the forwarder assigned to a real", m.connections.clone());
        lb.register(
            "weight_moves",
            "Epochs in which a VIP's weights moved (or regressed towards equal)",
            m.moves.clone(),
        );
        lb.register("ring_entries_moved", "Ring entries that changed real when weights moved", m.entries_moved.clone());
        lb.register(
            "forwarder_up",
            "1 while the forwarder is in its slot (Katran: registered and its maps found), else 0",
            m.forwarder_up.clone(),
        );
        lb.register(
            "katran_grpc_failures",
            "Calls to Katran's gRPC server that failed (each retried a second later)",
            m.katran_grpc_failures.clone(),
        );
        m
    }

    /// Publishes one epoch; the forwarder's counters are absolute, so counters advance to them.
    pub fn publish(&mut self, epoch: &LbEpoch) {
        self.forwarder_up.set(epoch.forwarder_up.into());
        let failures = &self.katran_grpc_failures;
        failures.inc_by(epoch.control_failures.saturating_sub(failures.get()));
        self.latency.clear();
        for r in &epoch.reals {
            let label = RealLabel { vip: r.vip.clone(), real: r.real.to_string() };
            self.weight.get_or_create(&label).set(r.weight);
            self.share.get_or_create(&label).set(r.share);
            if let Some(l) = r.latency_s {
                self.latency.get_or_create(&label).set(l);
            }
            self.freshness.get_or_create(&label).set(r.freshness);
            for (family, total) in
                [(&self.packets, r.packets), (&self.bytes, r.bytes), (&self.connections, r.connections)]
            {
                let c = family.get_or_create(&label);
                c.inc_by(total.saturating_sub(c.get()));
            }
        }
        for m in &epoch.moves {
            let label = VipLabel { vip: m.vip.clone() };
            self.moves.get_or_create(&label).inc();
            self.entries_moved.get_or_create(&label).inc_by(m.entries);
        }
    }
}
