//! Prometheus metrics and their HTTP exposition (`GET /metrics`).

use std::{sync::Arc, time::Duration};

use prometheus_client::{
    encoding::{text::encode, EncodeLabelSet},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{exponential_buckets, Histogram},
    },
    registry::Registry,
};
use std::sync::atomic::AtomicU64;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};
use tracing::{debug, warn};

use pirate_common::counters;

use crate::report::EpochReport;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabel {
    server: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuantileLabel {
    server: String,
    quantile: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BoundLabel {
    server: String,
    quantile: String,
    bound: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

pub struct Metrics {
    registry: Registry,
    server_latency: Family<ServerLabel, Gauge<f64, AtomicU64>>,
    server_quantile: Family<QuantileLabel, Gauge<f64, AtomicU64>>,
    server_quantile_bound: Family<BoundLabel, Gauge<f64, AtomicU64>>,
    server_flows: Family<ServerLabel, Gauge>,
    server_seconds: Family<ServerLabel, Counter<f64, AtomicU64>>,
    server_batches: Family<ServerLabel, Counter>,
    last_epoch: Gauge<f64, AtomicU64>,
    tail_call_misses: Counter,
    flow_latency: Histogram,
    flows_tracked: Gauge,
    flows_active: Gauge,
    flows_evicted: Counter,
    packets: Family<OutcomeLabel, Counter>,
    records_lost: Counter,
    gaps_discarded: Counter,
    epochs: Counter,
    epoch_seconds: Histogram,
    /// Kernel counters are absolute; the Prometheus counters advance by the difference.
    last_kernel: [u64; counters::COUNT as usize],
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("pirated");
        let m = Metrics {
            server_latency: Family::default(),
            server_quantile: Family::default(),
            server_quantile_bound: Family::default(),
            server_flows: Family::default(),
            server_seconds: Family::default(),
            server_batches: Family::default(),
            last_epoch: Gauge::default(),
            tail_call_misses: Counter::default(),
            // 50 µs … ~21.6 s, ×1.5 per bucket.
            flow_latency: Histogram::new(exponential_buckets(50e-6, 1.5, 33)),
            flows_tracked: Gauge::default(),
            flows_evicted: Counter::default(),
            flows_active: Gauge::default(),
            packets: Family::default(),
            records_lost: Counter::default(),
            gaps_discarded: Counter::default(),
            epochs: Counter::default(),
            epoch_seconds: Histogram::new(exponential_buckets(100e-6, 2.0, 16)),
            last_kernel: [0; counters::COUNT as usize],
            registry: Registry::default(),
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
        registry.register(
            "last_epoch_timestamp_seconds",
            "When the last epoch was published (Unix time)",
            m.last_epoch.clone(),
        );
        registry.register(
            "tail_call_misses",
            "Packets that reached the end of the chain with no forwarder in FORWARD to take them (passed)",
            m.tail_call_misses.clone(),
        );
        registry.register(
            "flow_response_latency_seconds",
            "Per-flow, per-epoch response latency estimates",
            m.flow_latency.clone(),
        );
        registry.register("flows_tracked", "Entries in the datapath's flow table", m.flows_tracked.clone());
        registry.register("flows_active", "Flows with packets in the last epoch", m.flows_active.clone());
        registry.register(
            "flows_evicted",
            "Flow-table entries the LRU table evicted for newer flows; one evicted with packets in the current epoch loses that epoch (raise max_flows if it grows)",
            m.flows_evicted.clone(),
        );
        registry.register("packets", "Packets seen by the XDP program, by outcome", m.packets.clone());
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
        registry.register("epochs", "Epochs processed", m.epochs.clone());
        registry.register(
            "epoch_processing_seconds",
            "Time to drain, estimate and publish one epoch",
            m.epoch_seconds.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Publishes one epoch: per-server gauges are replaced, counters advance.
    pub fn publish(&mut self, report: &EpochReport, kernel: &[u64; counters::COUNT as usize], tracked: usize) {
        self.server_latency.clear();
        self.server_quantile.clear();
        self.server_quantile_bound.clear();
        self.server_flows.clear();
        for s in report.servers() {
            let label = ServerLabel { server: s.server.to_string() };
            for q in &s.quantiles {
                let (server, quantile) = (label.server.clone(), q.q.to_string());
                let bound = |bound| BoundLabel { server: server.clone(), quantile: quantile.clone(), bound };
                self.server_quantile_bound.get_or_create(&bound("lower")).set(q.lower_ns / 1e9);
                self.server_quantile_bound.get_or_create(&bound("upper")).set(q.upper_ns / 1e9);
                self.server_quantile.get_or_create(&QuantileLabel { server, quantile }).set(q.estimate_ns / 1e9);
            }
            self.server_latency.get_or_create(&label).set(s.estimate_ns / 1e9);
            self.server_flows.get_or_create(&label).set(s.flows as i64);
            self.server_seconds.get_or_create(&label).inc_by(s.estimate_ns * s.batches as f64 / 1e9);
            self.server_batches.get_or_create(&label).inc_by(s.batches);
        }
        for e in report.flows.iter().filter_map(|r| r.estimate(report.estimator)) {
            self.flow_latency.observe(e.estimate_ns / 1e9);
        }
        self.flows_tracked.set(tracked as i64);
        // pirated never deletes entries: every flow inserted and no longer in the table was
        // evicted. The counters are read before the table (`epoch::run`), so this never runs ahead.
        let evicted = kernel[counters::EVENT_FLOW_INSERTED as usize].saturating_sub(tracked as u64);
        self.flows_evicted.inc_by(evicted.saturating_sub(self.flows_evicted.get()));
        self.flows_active.set(report.flows.len() as i64);
        let outcomes = counters::OUTCOMES as usize;
        for ((now, last), name) in kernel.iter().zip(&self.last_kernel).zip(counters::NAMES).take(outcomes) {
            self.packets.get_or_create(&OutcomeLabel { outcome: name }).inc_by(now.saturating_sub(*last));
        }
        let delta = |i: u32| kernel[i as usize].saturating_sub(self.last_kernel[i as usize]);
        self.records_lost.inc_by(delta(counters::EVENT_RECORD_LOST));
        self.tail_call_misses.inc_by(delta(counters::EVENT_NO_TAIL_CALL));
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        self.last_epoch.set(now.as_secs_f64());
        self.last_kernel = *kernel;
        self.gaps_discarded.inc_by(report.discarded());
        self.epochs.inc();
    }

    pub fn observe_epoch_time(&self, d: Duration) {
        self.epoch_seconds.observe(d.as_secs_f64());
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// Serves `GET /metrics` on `listener` until the task is dropped.
pub async fn serve_on(listener: TcpListener, metrics: Arc<std::sync::Mutex<Metrics>>) -> anyhow::Result<()> {
    loop {
        let (mut conn, peer) = listener.accept().await?;
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            let mut len = 0;
            // Read the request head (bounded); the body, if any, is ignored.
            while !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") && len < buf.len() {
                match tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf[len..])).await {
                    Ok(Ok(0)) | Err(_) => return,
                    Ok(Ok(n)) => len += n,
                    Ok(Err(e)) => return debug!(%peer, "metrics connection: {e}"),
                }
            }
            let head = String::from_utf8_lossy(&buf[..len]);
            let target = head.split_whitespace().nth(1).unwrap_or("");
            let (status, ctype, body) =
                if head.starts_with("GET ") && (target == "/metrics" || target.starts_with("/metrics?")) {
                    let body = metrics.lock().unwrap().encode();
                    ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", body)
                } else {
                    ("404 Not Found", "text/plain; charset=utf-8", "try GET /metrics\n".to_string())
                };
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            if let Err(e) = conn.write_all(resp.as_bytes()).await {
                warn!(%peer, "metrics response: {e}");
            }
        });
    }
}
