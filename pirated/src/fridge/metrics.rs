//! The fridges' Prometheus families: per class the corrected delay quantiles, SLA shares, the
//! pairs per second and a histogram whose counts are the pairs the samples stand for; per
//! fridge its entry probability, lifetime and the requests offered to it.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use pirate_common::{counters, fridge::class::NAMES};

use super::report::{FridgeReport, QUANTILES};
use crate::histogram::{latency_bounds, BatchHistogram};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabel {
    class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuantileLabel {
    class: &'static str,
    /// Not `quantile`, which Prometheus keeps for summaries.
    q: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SlaLabel {
    class: &'static str,
    sla_seconds: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FridgeLabel {
    fridge: String,
}

type GaugeF = Gauge<f64, AtomicU64>;

pub struct Metrics {
    quantile: Family<QuantileLabel, GaugeF>,
    above_sla: Family<SlaLabel, GaugeF>,
    pairs: Family<ClassLabel, GaugeF>,
    delay: Family<ClassLabel, BatchHistogram, fn() -> BatchHistogram>,
    samples: Family<ClassLabel, Counter>,
    samples_lost: Counter,
    entry_probability: Family<FridgeLabel, GaugeF>,
    lifetime: Family<FridgeLabel, GaugeF>,
    slots: Family<FridgeLabel, Gauge>,
    offered: Family<FridgeLabel, Counter>,
    recalibrations: Counter,
}

/// The delay histograms' buckets: [`latency_bounds`]'s up to 2⁷ s (128 s), the same as every
/// pirated's, so that a fleet's add up.
fn delay_histogram() -> BatchHistogram {
    BatchHistogram::new(latency_bounds(7))
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics {
            quantile: Family::default(),
            above_sla: Family::default(),
            pairs: Family::default(),
            delay: Family::new_with_constructor(delay_histogram),
            samples: Family::default(),
            samples_lost: Counter::default(),
            entry_probability: Family::default(),
            lifetime: Family::default(),
            slots: Family::default(),
            offered: Family::default(),
            recalibrations: Counter::default(),
        };
        let r = registry.sub_registry_with_prefix("fridge");
        r.register(
            "delay_quantile_seconds",
            "Request-to-response delay quantiles per class (0.5, 0.9, 0.95, 0.99, 0.999) over fridge.window, corrected for the fridges' bias against long delays",
            m.quantile.clone(),
        );
        r.register(
            "sla_exceeded_ratio",
            "Share of request-response pairs per class slower than each fridge.sla threshold, over fridge.window (corrected)",
            m.above_sla.clone(),
        );
        r.register(
            "pairs_per_second",
            "Answered requests per second per class the window's samples stand for (corrected)",
            m.pairs.clone(),
        );
        r.register(
            "delay_seconds",
            "Request-to-response delays per class; counts are the pairs the samples stand for (each weighted by its correction factor), rounded; fixed buckets, 32 a factor of two from 2^-17 s to 128 s, the same in every pirated, so that histogram_quantile over the sum of many pirateds' rates is theirs together",
            m.delay.clone(),
        );
        r.register("samples", "Responses matched to their waiting request, per class", m.samples.clone());
        r.register(
            "samples_lost",
            "Samples the datapath could not send to pirated (fridge.ring_bytes full)",
            m.samples_lost.clone(),
        );
        r.register(
            "entry_probability",
            "Each fridge's entry probability (calibrated where p = \"auto\")",
            m.entry_probability.clone(),
        );
        r.register(
            "lifetime_seconds",
            "How long a request waits in each fridge before another evicts it, on average (slots / (p x requests offered per second))",
            m.lifetime.clone(),
        );
        r.register("slots", "Each fridge's slots", m.slots.clone());
        r.register("requests_offered", "Requests offered to each fridge", m.offered.clone());
        r.register(
            "recalibrations",
            "Times the entry probabilities were recalibrated (the request rate or the largest delay moved more than 2x)",
            m.recalibrations.clone(),
        );
        m
    }

    /// Publishes one epoch (`delta`: the kernel's counters since the last one).
    pub fn publish(&mut self, report: &FridgeReport, delta: &[u64; counters::COUNT as usize]) {
        self.quantile.clear();
        self.above_sla.clear();
        for c in &report.classes {
            let class = NAMES[c.class as usize];
            let label = ClassLabel { class };
            for (q, ns) in QUANTILES.iter().zip(c.quantiles_ns.iter().flatten()) {
                self.quantile.get_or_create(&QuantileLabel { class, q: q.to_string() }).set(ns * 1e-9);
            }
            for (t, share) in report.sla_s.iter().zip(&c.above_sla) {
                self.above_sla.get_or_create(&SlaLabel { class, sla_seconds: t.to_string() }).set(*share);
            }
            self.pairs.get_or_create(&label).set(c.pairs_per_s);
            self.delay.get_or_create(&label).observe_weighted(c.weighted_s.iter().copied());
            self.samples.get_or_create(&label).inc_by(c.samples as u64);
        }
        for (k, f) in report.fridges.iter().enumerate() {
            let label = FridgeLabel { fridge: k.to_string() };
            self.entry_probability.get_or_create(&label).set(f.p);
            self.slots.get_or_create(&label).set(f.slots as i64);
            if let Some(s) = f.lifetime_s {
                self.lifetime.get_or_create(&label).set(s);
            } else {
                self.lifetime.remove(&label);
            }
        }
        for (k, n) in report.offered.iter().enumerate() {
            self.offered.get_or_create(&FridgeLabel { fridge: k.to_string() }).inc_by(*n);
        }
        self.samples_lost.inc_by(delta[counters::EVENT_FRIDGE_SAMPLE_LOST as usize]);
        if report.recalibrated.is_some() {
            self.recalibrations.inc();
        }
    }
}
