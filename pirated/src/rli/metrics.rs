//! RLI's Prometheus families, bounded whatever the traffic: what became of the packets to the
//! reference port and the flows the table took (from the downstream chain's counters); and
//! each interval, the segment's delay from its references (mean, std-dev, quantiles: removed
//! when an interval had none, or too few for a quantile), per server the mean over its flows'
//! packets (at most `MAX_SERVERS` servers, the busiest), and a histogram of the flows' means.
//! Never a series per flow.

use std::sync::{atomic::AtomicU64, Arc};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{exponential_buckets, Histogram},
    },
    registry::Registry,
};

use pirate_common::counters;

use super::{
    drain::FlowFigures,
    quantiles::{self, Summary, QUANTILES},
    sampled::Outcomes,
};
use crate::histogram::{latency_bounds, BatchHistogram};

/// Servers with a mean series at once: the ones with the most packets in the interval.
pub const MAX_SERVERS: usize = 1000;

/// How the live task reaches the families, under the registry's lock.
pub type Shared = Arc<dyn Fn(&mut dyn FnMut(&Metrics)) + Send + Sync>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuantileLabel {
    /// Not `quantile`, which Prometheus keeps for summaries.
    q: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabel {
    server: String,
}

type GaugeF = Gauge<f64, AtomicU64>;
type NoLabels = Vec<(String, String)>;

pub struct Metrics {
    references: Family<OutcomeLabel, Counter>,
    flows_inserted: Counter,
    /// Without labels: a family only so that the series can be removed.
    mean: Family<NoLabels, GaugeF>,
    std_dev: Family<NoLabels, GaugeF>,
    quantile: Family<QuantileLabel, GaugeF>,
    interval_references: Gauge,
    server_mean: Family<ServerLabel, GaugeF>,
    flow_mean: Histogram,
    delay: BatchHistogram,
}

/// The counters behind `references`, and their outcome labels.
const OUTCOMES: [(u32, &str); 7] = [
    (counters::EVENT_RLI_TAKEN, "taken"),
    (counters::EVENT_RLI_TAKEN_LOST, "taken_unreported"),
    (counters::EVENT_RLI_FORGED, "forged"),
    (counters::EVENT_RLI_REPLAYED, "replayed"),
    (counters::EVENT_RLI_STALE, "stale"),
    (counters::EVENT_RLI_SAMPLED, "sampled"),
    (counters::EVENT_RLI_SAMPLED_LOST, "sampled_unreported"),
];

impl Metrics {
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics {
            references: Family::default(),
            flows_inserted: Counter::default(),
            mean: Family::default(),
            std_dev: Family::default(),
            quantile: Family::default(),
            interval_references: Gauge::default(),
            server_mean: Family::default(),
            // 1 µs … ~8.4 s, ×2 per bucket.
            flow_mean: Histogram::new(exponential_buckets(1e-6, 2.0, 24)),
            delay: BatchHistogram::new(latency_bounds(quantiles::TOP_OCTAVE)),
        };
        let r = registry.sub_registry_with_prefix("rli");
        r.register(
            "references",
            "References at the downstream point, by outcome. Injected ones (packets to rli.port, all dropped): taken (used), taken_unreported (used, but the ring to pirated was full: missing from the quantiles), forged (no valid tag), replayed (sequence number seen), stale (delay beyond rli.max_delay). Sampled ones (packets of the traffic, which goes on): sampled (taken as a reference), sampled_unreported (the ring to pirated was full: never a delay), matched (a delay from the upstream point's time), unmatched (no upstream time within 250 ms: void), ambiguous (one identity twice at a point: void), stale_sampled (delay beyond rli.max_delay: void)",
            m.references.clone(),
        );
        r.register(
            "flows_inserted",
            "Flows that entered RLI's flow table (it holds rli.max_flows: beyond, the least recent one is evicted)",
            m.flows_inserted.clone(),
        );
        r.register(
            "delay_mean_seconds",
            "One-way delay of the segment over the last interval, from its reference packets (each measured exactly)",
            m.mean.clone(),
        );
        r.register(
            "delay_std_dev_seconds",
            "Standard deviation of the segment's one-way delay over the last interval, from its references",
            m.std_dev.clone(),
        );
        r.register(
            "delay_quantile_seconds",
            "Quantiles (0.5, 0.9, 0.99, 0.999) of the segment's one-way delay over the last interval, from its references; a quantile is absent when the interval had too few (2, 10, 100, 1000)",
            m.quantile.clone(),
        );
        r.register(
            "delay_seconds",
            "The segment's one-way delay at each reference, every interval's: fixed buckets, 32 a factor of two from 2^-17 s to 8 s, the same in every pirated, so that histogram_quantile over the sum of many pirateds' rates (many segments, or one segment's intervals) is theirs together",
            m.delay.clone(),
        );
        r.register(
            "interval_references",
            "References the last interval's delay figures rest on",
            m.interval_references.clone(),
        );
        r.register(
            "server_delay_mean_seconds",
            "Per server (destination address and port), the one-way delay across the segment over its flows' packets in the last interval, interpolated between references (RLI)",
            m.server_mean.clone(),
        );
        r.register(
            "flow_delay_mean_seconds",
            "Each flow's mean one-way delay across the segment per interval (RLI), one observation per flow and interval",
            m.flow_mean.clone(),
        );
        m
    }

    /// Publishes the datapath's counters of RLI (`delta`: what they gained since the last call)
    /// and what became of the sampled references since.
    pub fn publish_counters(&self, delta: &[u64; counters::COUNT as usize], sampled: &Outcomes) {
        for (counter, outcome) in OUTCOMES {
            self.references.get_or_create(&OutcomeLabel { outcome }).inc_by(delta[counter as usize]);
        }
        for (outcome, n) in [
            ("matched", sampled.matched),
            ("unmatched", sampled.unmatched),
            ("ambiguous", sampled.ambiguous),
            ("stale_sampled", sampled.stale),
        ] {
            self.references.get_or_create(&OutcomeLabel { outcome }).inc_by(n);
        }
        self.flows_inserted.inc_by(delta[counters::EVENT_RLI_FLOW_INSERTED as usize]);
    }

    /// Publishes one interval: its references' summary and its flows' figures.
    pub fn publish_interval(&self, references: Option<&Summary>, flows: &[FlowFigures]) {
        self.quantile.clear();
        self.interval_references.set(references.map_or(0, |s| s.count as i64));
        self.mean.clear();
        self.std_dev.clear();
        if let Some(s) = references {
            self.delay.add_at_or_below(&s.at_or_below, s.mean * s.count as f64 * 1e-9);
            self.mean.get_or_create(&Vec::new()).set(s.mean * 1e-9);
            if s.count > 1 {
                self.std_dev.get_or_create(&Vec::new()).set(s.std_dev * 1e-9);
            }
        }
        for ((q, _), v) in QUANTILES.iter().zip(references.map(|s| s.quantiles).unwrap_or_default()) {
            if let Some(v) = v {
                self.quantile.get_or_create(&QuantileLabel { q: q.to_string() }).set(v * 1e-9);
            }
        }
        let mut servers: std::collections::HashMap<std::net::SocketAddr, (u64, f64)> = Default::default();
        for f in flows {
            let Some(mean) = f.rli.mean_ns else { continue };
            self.flow_mean.observe(mean * 1e-9);
            let s = servers.entry(f.key.server()).or_default();
            s.0 += f.rli.packets;
            s.1 += f.rli.packets as f64 * mean;
        }
        let mut busiest: Vec<_> = servers.into_iter().collect();
        busiest.sort_unstable_by_key(|(_, (packets, _))| std::cmp::Reverse(*packets));
        busiest.truncate(MAX_SERVERS);
        self.server_mean.clear();
        for (server, (packets, sum)) in busiest {
            self.server_mean
                .get_or_create(&ServerLabel { server: server.to_string() })
                .set(sum / packets as f64 * 1e-9);
        }
    }
}
