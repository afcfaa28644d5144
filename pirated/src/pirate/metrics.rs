//! `pirate`'s Prometheus families: per-server latency, its quantiles and bounds, per-flow
//! estimates, and the flow table. Per-server series are bounded: at most `max_servers` servers
//! hold them at once, and a server's are removed after `idle_epochs` epochs without a figure, so
//! servers passing by for days cost no more memory than those of the last `idle_epochs` epochs.

use std::{collections::HashMap, net::SocketAddr, sync::atomic::AtomicU64};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::exponential_buckets},
    registry::Registry,
};

use pirate_common::counters;

use super::{
    estimate::{
        servers::{self, ServerEstimate},
        NoFigure,
    },
    report::EpochReport,
};
use crate::histogram::{latency_bounds, BatchHistogram};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabel {
    server: String,
}

/// `q`, not `quantile`: Prometheus keeps that label for summaries (`promtool check metrics`),
/// and these are gauges, per epoch.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuantileLabel {
    server: String,
    q: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BoundLabel {
    server: String,
    q: String,
    bound: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// A latency histogram per server, made by [`server_histogram`].
type ServerHistograms = Family<ServerLabel, BatchHistogram, fn() -> BatchHistogram>;

pub struct Metrics {
    server_latency: Family<ServerLabel, Gauge<f64, AtomicU64>>,
    server_quantile: Family<QuantileLabel, Gauge<f64, AtomicU64>>,
    server_quantile_bound: Family<BoundLabel, Gauge<f64, AtomicU64>>,
    server_flows: Family<ServerLabel, Gauge>,
    server_seconds: Family<ServerLabel, Counter<f64, AtomicU64>>,
    server_batches: Family<ServerLabel, Counter>,
    /// With `metrics.histograms`.
    server_batch_latency: Option<ServerHistograms>,
    series: Series,
    series_held: Gauge,
    series_expired: Counter,
    series_refused: Counter,
    flow_latency: BatchHistogram,
    flows_tracked: Gauge,
    flows_active: Gauge,
    flows_without_figure: Family<ReasonLabel, Gauge>,
    flows_evicted: Counter,
    records_lost: Counter,
    gaps_discarded: Counter,
}

impl Metrics {
    /// Families in `registry`; per-server series for at most `max_servers` servers at once, each
    /// removed after `idle_epochs` epochs without a figure, histograms among them where
    /// `histograms` says.
    pub fn register(registry: &mut Registry, max_servers: u32, idle_epochs: u32, histograms: bool) -> Metrics {
        let (max, idle) = (max_servers as usize, idle_epochs as u64);
        let m = Metrics {
            series: Series { last: HashMap::new(), epoch: 0, max, idle },
            series_held: Gauge::default(),
            series_expired: Counter::default(),
            series_refused: Counter::default(),
            server_latency: Family::default(),
            server_quantile: Family::default(),
            server_quantile_bound: Family::default(),
            server_flows: Family::default(),
            server_seconds: Family::default(),
            server_batches: Family::default(),
            server_batch_latency: histograms.then(|| Family::new_with_constructor(server_histogram as fn() -> _)),
            // 50 µs … ~21.6 s, ×1.5 per bucket.
            flow_latency: BatchHistogram::new(exponential_buckets(50e-6, 1.5, 33)),
            flows_tracked: Gauge::default(),
            flows_evicted: Counter::default(),
            flows_active: Gauge::default(),
            flows_without_figure: Family::default(),
            records_lost: Counter::default(),
            gaps_discarded: Counter::default(),
        };
        registry.register(
            "server_response_latency_seconds",
            "Mean response latency per server (destination address:port) over the last epoch, from the configured estimator",
            m.server_latency.clone(),
        );
        registry.register(
            "server_response_latency_quantile_seconds",
            "Response-latency quantiles (0.5, 0.9, 0.99) per server over the last epoch's batches, from the configured estimator's batch-ending modes",
            m.server_quantile.clone(),
        );
        registry.register(
            "server_response_latency_quantile_bound_seconds",
            "Where each quantile lies (bound=lower|upper) wherever the gaps are inside their modes, each batch taken to spend its flow's mean time inside a batch",
            m.server_quantile_bound.clone(),
        );
        registry.register(
            "server_flows",
            "Flows with an estimate per server in the last epoch",
            m.server_flows.clone(),
        );
        registry.register(
            "server_response_seconds",
            "Response time measured per server (sum of the per-batch latencies); rate() of it over rate() of server_batches_total is the mean latency over any window",
            m.server_seconds.clone(),
        );
        registry.register(
            "server_batches",
            "Request batches (responses waited for) measured per server",
            m.server_batches.clone(),
        );
        if let Some(family) = &m.server_batch_latency {
            registry.register(
                "server_batch_latency_seconds",
                "Response latency of each request batch per server, as the quantiles read it (a batch's share in each bucket its mode spans): fixed buckets, 32 a factor of two from 2^-17 s to 8 s, the same in every pirated, so that histogram_quantile over the sum of many pirateds' rates is theirs together (metrics.histograms)",
                family.clone(),
            );
        }
        registry.register(
            "server_series",
            "Servers holding per-server series now (at most metrics.max_servers)",
            m.series_held.clone(),
        );
        registry.register(
            "server_series_expired",
            "Servers whose series were removed after metrics.idle_epochs epochs without a figure",
            m.series_expired.clone(),
        );
        registry.register(
            "server_series_refused",
            "Per-server figures left out of the series (each server, each epoch) because metrics.max_servers servers held series; the JSON lines still carry them",
            m.series_refused.clone(),
        );
        registry.register(
            "flow_response_latency_seconds",
            "Per-flow, per-epoch response latency estimates",
            m.flow_latency.clone(),
        );
        registry.register("flows_tracked", "Entries in the datapath's flow table", m.flows_tracked.clone());
        registry.register("flows_active", "Flows with packets in the last epoch", m.flows_active.clone());
        registry.register(
            "flows_without_figure",
            "Flows of the last epoch whose figure from the configured estimator was withheld, by reason (below_round_trip: shorter than the handshake's round trip allows; interleaved: multiplexed streams out of step; few_batches: one batch; unanswered: on TCP, more batches than gaps that acknowledged new data; long_batches: more time inside a batch than a client paces; ambiguous: on TCP, waits the break missed or multiplexed streams, whose figures disagree; quic: requests in flight unknown; udp: nothing says responses arrived; multiplexing: a TCP client of a protocol that multiplexes requests, HTTP/2 or gRPC, requests in flight unknown); their servers' figures leave them out",
            m.flows_without_figure.clone(),
        );
        // Every reason's series from the start, at 0, so that a query finds it before the first.
        NoFigure::ALL.iter().for_each(|r| _ = m.flows_without_figure.get_or_create(&ReasonLabel { reason: r.name() }));
        registry.register(
            "flows_evicted",
            "Flows the flow table evicted for newer ones (the least recently active of the two sets a new flow may take); one evicted with packets in the current epoch loses that epoch (raise max_flows if it grows)",
            m.flows_evicted.clone(),
        );
        registry.register(
            "epoch_records_lost",
            "Finished flow epochs the datapath could not hand over (ring buffer full)",
            m.records_lost.clone(),
        );
        registry.register(
            "gaps_discarded",
            "Inter-packet gaps dropped because a flow had no free mode",
            m.gaps_discarded.clone(),
        );
        m
    }

    /// Publishes one epoch: per-server gauges are replaced, counters advance (`now`: the
    /// kernel's counters, `delta`: since the last epoch; `tracked`: flows in the table).
    pub fn publish(
        &mut self,
        report: &EpochReport,
        tracked: usize,
        now: &[u64; counters::COUNT as usize],
        delta: &[u64; counters::COUNT as usize],
    ) {
        self.publish_servers(report.servers());
        self.flow_latency.observe_all(&report.estimates, |e| Some(e.of(report.estimator)?.estimate_ns / 1e9));
        self.flows_tracked.set(tracked as i64);
        // pirated never deletes entries: every flow inserted and no longer in the table was
        // evicted. The counters are read before the table (`source::live`), so this never runs ahead.
        let evicted = now[counters::EVENT_FLOW_INSERTED as usize].saturating_sub(tracked as u64);
        self.flows_evicted.inc_by(evicted.saturating_sub(self.flows_evicted.get()));
        self.flows_active.set(report.flows.len() as i64);
        for (reason, &n) in NoFigure::ALL.iter().zip(&report.withheld) {
            self.flows_without_figure.get_or_create(&ReasonLabel { reason: reason.name() }).set(n as i64);
        }
        self.records_lost.inc_by(delta[counters::EVENT_RECORD_LOST as usize]);
        self.gaps_discarded.inc_by(report.discarded());
    }

    /// One epoch's per-server figures: gauges replaced, counters advanced, and the series of
    /// servers idle for `idle_epochs` removed before new servers are admitted (up to `max`).
    pub fn publish_servers(&mut self, servers: &[ServerEstimate]) {
        self.server_latency.clear();
        self.server_quantile.clear();
        self.server_quantile_bound.clear();
        self.server_flows.clear();
        let series = &mut self.series;
        series.epoch += 1;
        for s in servers {
            if let Some(seen) = series.last.get_mut(&s.server) {
                *seen = series.epoch;
            }
        }
        let (epoch, idle) = (series.epoch, series.idle);
        series.last.retain(|server, seen| {
            let keep = epoch - *seen < idle;
            if !keep {
                let label = ServerLabel { server: server.to_string() };
                self.server_seconds.remove(&label);
                self.server_batches.remove(&label);
                if let Some(family) = &self.server_batch_latency {
                    family.remove(&label);
                }
                self.series_expired.inc();
            }
            keep
        });
        for s in servers {
            if !series.last.contains_key(&s.server) {
                if series.last.len() >= series.max {
                    self.series_refused.inc();
                    continue;
                }
                series.last.insert(s.server, epoch);
            }
            let label = ServerLabel { server: s.server.to_string() };
            for q in &s.quantiles {
                let (server, quantile) = (label.server.clone(), q.q.to_string());
                let bound = |bound| BoundLabel { server: server.clone(), q: quantile.clone(), bound };
                self.server_quantile_bound.get_or_create(&bound("lower")).set(q.lower_ns / 1e9);
                self.server_quantile_bound.get_or_create(&bound("upper")).set(q.upper_ns / 1e9);
                self.server_quantile.get_or_create(&QuantileLabel { server, q: quantile }).set(q.estimate_ns / 1e9);
            }
            self.server_latency.get_or_create(&label).set(s.estimate_ns / 1e9);
            self.server_flows.get_or_create(&label).set(s.flows as i64);
            self.server_seconds.get_or_create(&label).inc_by(s.estimate_ns * s.batches as f64 / 1e9);
            self.server_batches.get_or_create(&label).inc_by(s.batches);
            if let Some(family) = &self.server_batch_latency {
                let ends = s.at_or_below.last().copied().unwrap_or(0.0);
                family.get_or_create(&label).add_at_or_below(&s.at_or_below, s.estimate_ns * ends / 1e9);
            }
        }
        self.series_held.set(series.last.len() as i64);
    }
}

/// A server's latency histogram, its buckets [`servers::histogram_bounds_ns`]'s.
fn server_histogram() -> BatchHistogram {
    BatchHistogram::new(latency_bounds(servers::PIRATE_TOP_OCTAVE))
}

/// The servers holding series, each with the last epoch it had a figure (epochs counted here).
struct Series {
    last: HashMap<SocketAddr, u64>,
    epoch: u64,
    max: usize,
    idle: u64,
}
