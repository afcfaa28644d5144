//! The Prometheus registry, with the datapath-wide figures (packet outcomes, the chain's end,
//! the epoch loop); each capability registers and publishes its own families
//! (`pirate::metrics`). The exposition is encoded once per epoch (and segment interval), and
//! served from there (`http`).

pub mod http;

use std::time::Duration;

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

use pirate_common::counters;

use crate::{
    config::MetricsConfig,
    fridge::{self, report::FridgeReport},
    lb::{self, balancer::LbEpoch},
    pirate::{self, report::EpochReport},
    rli, segment,
    source::Kernel,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pirate: pirate::metrics::Metrics,
    fridge: fridge::metrics::Metrics,
    /// RLI's families: its counters published with the epoch, its intervals by its own task.
    pub rli: rli::metrics::Metrics,
    lb: lb::metrics::Metrics,
    /// The segment's families, which its own task publishes.
    pub segment: segment::metrics::Metrics,
    last_epoch: Gauge<f64, AtomicU64>,
    tail_call_misses: Counter,
    packets: Family<OutcomeLabel, Counter>,
    lb_packets: Family<OutcomeLabel, Counter>,
    epochs: Counter,
    epoch_seconds: Histogram,
    json_dropped: Counter,
    accept_errors: Counter,
    connections_refused: Counter,
    /// The exposition as last encoded, which scrapes are served.
    exposed: http::Exposed,
    /// Kernel counters are absolute; the Prometheus counters advance by the difference.
    last_kernel: [u64; counters::COUNT as usize],
}

impl Metrics {
    pub fn new(config: &MetricsConfig) -> Metrics {
        let mut registry = Registry::with_prefix("pirated");
        let pirate = pirate::metrics::Metrics::register(
            &mut registry,
            config.max_servers,
            config.idle_epochs,
            config.histograms,
        );
        let fridge = fridge::metrics::Metrics::register(&mut registry);
        let rli = rli::metrics::Metrics::register(&mut registry);
        let lb = lb::metrics::Metrics::register(&mut registry);
        let segment = segment::metrics::Metrics::register(&mut registry);
        let m = Metrics {
            pirate,
            fridge,
            rli,
            lb,
            segment,
            last_epoch: Gauge::default(),
            tail_call_misses: Counter::default(),
            packets: Family::default(),
            lb_packets: Family::default(),
            epochs: Counter::default(),
            epoch_seconds: Histogram::new(exponential_buckets(100e-6, 2.0, 16)),
            json_dropped: Counter::default(),
            accept_errors: Counter::default(),
            connections_refused: Counter::default(),
            exposed: http::Exposed::default(),
            last_kernel: [0; counters::COUNT as usize],
            registry: Registry::default(),
        };
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
        registry.register("packets", "Packets seen by the XDP chain, by outcome", m.packets.clone());
        registry.register(
            "lb_packets",
            "Packets to a VIP by what the forwarder did: sent from XDP (forwarded), encapsulated and left to the kernel to \
             route (routed), or passed unchanged (unforwarded: no real, a tagged frame)",
            m.lb_packets.clone(),
        );
        registry.register("epochs", "Epochs processed", m.epochs.clone());
        registry.register(
            "epoch_processing_seconds",
            "Time to drain, estimate and publish one epoch",
            m.epoch_seconds.clone(),
        );
        registry.register(
            "json_epochs_dropped",
            "Epochs whose JSON lines were dropped because stdout's reader was epochs behind",
            m.json_dropped.clone(),
        );
        registry.register(
            "metrics_accept_errors",
            "Connections to /metrics that could not be accepted (out of file descriptors, reset early)",
            m.accept_errors.clone(),
        );
        registry.register(
            "metrics_connections_refused",
            "Connections to /metrics closed for newer ones: more than the server holds at a time, or from one address",
            m.connections_refused.clone(),
        );
        let m = Metrics { registry, ..m };
        m.expose();
        m
    }

    pub fn json_epoch_dropped(&self) {
        self.json_dropped.inc();
    }

    /// Publishes one epoch: per-label gauges are replaced, counters advance.
    pub fn publish(
        &mut self,
        report: &EpochReport,
        fridge: Option<&FridgeReport>,
        lb: Option<&LbEpoch>,
        kernel: &Kernel,
    ) {
        let now = &kernel.counters;
        let delta: [u64; counters::COUNT as usize] =
            std::array::from_fn(|i| now[i].saturating_sub(self.last_kernel[i]));
        self.pirate.publish(report, kernel.tracked, now, &delta);
        if let Some(f) = fridge {
            self.fridge.publish(f, &delta);
        }
        if let Some(lb) = lb {
            self.lb.publish(lb);
        }
        for (d, name) in delta.iter().zip(counters::NAMES).take(counters::OUTCOMES as usize) {
            self.packets.get_or_create(&OutcomeLabel { outcome: name }).inc_by(*d);
        }
        self.tail_call_misses.inc_by(delta[counters::EVENT_NO_TAIL_CALL as usize]);
        for (event, name) in [
            (counters::EVENT_LB_FORWARDED, "forwarded"),
            (counters::EVENT_LB_ROUTED, "routed"),
            (counters::EVENT_LB_UNFORWARDED, "unforwarded"),
        ] {
            self.lb_packets.get_or_create(&OutcomeLabel { outcome: name }).inc_by(delta[event as usize]);
        }
        let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        self.last_epoch.set(wall.as_secs_f64());
        self.last_kernel = *now;
        self.epochs.inc();
    }

    pub fn observe_epoch_time(&self, d: Duration) {
        self.epoch_seconds.observe(d.as_secs_f64());
    }

    /// Encodes the exposition scrapes are served from now on: after each epoch's (or segment
    /// interval's) figures are published.
    pub fn expose(&self) {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        self.exposed.set(out);
    }

    /// What the HTTP server needs: the exposition, and its counters.
    pub fn server(&self) -> http::Server {
        http::Server {
            exposed: self.exposed.clone(),
            accept_errors: self.accept_errors.clone(),
            refused: self.connections_refused.clone(),
        }
    }
}
