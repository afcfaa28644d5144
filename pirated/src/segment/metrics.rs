//! The segment's Prometheus families. The figures are the last measured interval's; an
//! interval that could not be measured removes them (and is counted, by reason) rather than
//! leaving an older interval's numbers up as if current.

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

use super::reconcile::SegmentReport;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EstimatorLabel {
    estimator: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PointLabel {
    point: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

type GaugeF = Gauge<f64, AtomicU64>;

/// The segment's families as its live task reaches them: under the lock the exposition takes,
/// so that a scrape never reads half an interval's figures.
pub type Shared = Arc<dyn Fn(&mut dyn FnMut(&Metrics)) + Send + Sync>;

pub struct Metrics {
    mean: Family<EstimatorLabel, GaugeF>,
    std_dev: Family<EstimatorLabel, GaugeF>,
    bound: Family<EstimatorLabel, GaugeF>,
    samples: Family<EstimatorLabel, Gauge>,
    usable: GaugeF,
    packets: Family<PointLabel, Counter>,
    lost: Counter,
    lost_estimated: Counter<f64, AtomicU64>,
    reordered: Counter,
    extra: Counter,
    decode_failures: Counter,
    unrepaired: Counter,
    measured: Counter,
    unmeasured: Family<ReasonLabel, Counter>,
    processing: Histogram,
    peer_up: Gauge,
    refused: Family<ReasonLabel, Counter>,
    cache_dropped: Counter,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics {
            mean: Family::default(),
            std_dev: Family::default(),
            bound: Family::default(),
            samples: Family::default(),
            usable: GaugeF::default(),
            packets: Family::default(),
            lost: Counter::default(),
            lost_estimated: Counter::default(),
            reordered: Counter::default(),
            extra: Counter::default(),
            decode_failures: Counter::default(),
            unrepaired: Counter::default(),
            measured: Counter::default(),
            unmeasured: Family::default(),
            processing: Histogram::new(exponential_buckets(100e-6, 2.0, 16)),
            peer_up: Gauge::default(),
            refused: Family::default(),
            cache_dropped: Counter::default(),
        };
        let r = registry.sub_registry_with_prefix("segment");
        r.register(
            "delay_mean_seconds",
            "One-way delay from the upstream to the downstream point, mean over the last measured interval",
            m.mean.clone(),
        );
        r.register(
            "delay_std_dev_seconds",
            "One-way delay's standard deviation over the last measured interval",
            m.std_dev.clone(),
        );
        r.register(
            "delay_mean_bound_seconds",
            "Half-width of the interval the true mean lies in with probability 98 % (Hoeffding)",
            m.bound.clone(),
        );
        r.register(
            "samples",
            "Packets the last measured interval's mean rests on (LDA: effective sample size; RDA: per bank)",
            m.samples.clone(),
        );
        r.register(
            "rda_usable_ratio",
            "Share of the RDA's non-empty buckets usable after repair, last measured interval",
            m.usable.clone(),
        );
        r.register(
            "packets",
            "Packets recorded at each point, over measured and unmeasured intervals alike",
            m.packets.clone(),
        );
        r.register(
            "lost_packets",
            "Packets sent past the upstream point and never seen at the downstream one (RDA, exact)",
            m.lost.clone(),
        );
        r.register(
            "lost_packets_estimated",
            "Lost packets as the LDA estimates them (its banks' sampled losses over their sampling probabilities)",
            m.lost_estimated.clone(),
        );
        r.register(
            "reordered_packets",
            "Packets that reached the downstream point in the interval after the one they passed the upstream point in",
            m.reordered.clone(),
        );
        r.register(
            "extra_packets",
            "Packets seen at the downstream point only, not sent in the interval (from the one before, or not through the upstream point)",
            m.extra.clone(),
        );
        r.register(
            "decode_failures",
            "Intervals whose RDA difference did not peel completely (the unpeeled buckets are left out)",
            m.decode_failures.clone(),
        );
        r.register(
            "unrepaired_packets",
            "Packets seen at one point whose timestamp no packet cache held (their buckets are left out)",
            m.unrepaired.clone(),
        );
        r.register("intervals_measured", "Intervals with figures", m.measured.clone());
        r.register(
            "intervals_unmeasured",
            "Intervals without figures, by reason: no record from the upstream point, a point's banks not holding that interval alone (a restart, a late read), or no answer from the upstream point for the packets only it saw",
            m.unmeasured.clone(),
        );
        r.register("interval_processing_seconds", "From an interval's end to its report", m.processing.clone());
        r.register("peer_up", "Whether the other point is connected and authenticated", m.peer_up.clone());
        r.register("peer_refused", "Peer connections refused, by reason", m.refused.clone());
        r.register(
            "cache_dropped_packets",
            "Packets left out of the packet cache (its ring full, or segment.cache_packets reached)",
            m.cache_dropped.clone(),
        );
        m
    }

    /// Publishes one interval's report (downstream point).
    pub fn publish(&self, report: &SegmentReport) {
        self.packets.get_or_create(&PointLabel { point: "up" }).inc_by(report.packets_up);
        self.packets.get_or_create(&PointLabel { point: "down" }).inc_by(report.packets_down);
        self.processing.observe(report.took.as_secs_f64());
        if let Some(reason) = report.unmeasured {
            self.unmeasured.get_or_create(&ReasonLabel { reason }).inc();
            for f in [&self.mean, &self.std_dev, &self.bound] {
                f.clear();
            }
            self.samples.clear();
            return;
        }
        self.measured.inc();
        let figures = report
            .lda
            .as_ref()
            .map(|l| ("lda", l.figures, l.samples))
            .into_iter()
            .chain(report.rda.as_ref().map(|r| ("rda", r.estimate.figures, r.estimate.samples)));
        for (estimator, figures, samples) in figures {
            let label = EstimatorLabel { estimator };
            for (family, value) in
                [(&self.mean, figures.mean), (&self.std_dev, figures.std_dev), (&self.bound, figures.bound)]
            {
                match value {
                    Some(v) => {
                        family.get_or_create(&label).set(v / 1e9);
                    }
                    None => {
                        family.remove(&label);
                    }
                }
            }
            self.samples.get_or_create(&label).set(samples as i64);
        }
        if let Some(l) = &report.lda {
            self.lost_estimated.inc_by(l.lost);
        }
        if let Some(r) = &report.rda {
            self.usable.set(r.estimate.usable);
            self.lost.inc_by(r.lost);
            self.reordered.inc_by(r.reordered);
            self.extra.inc_by(r.extra);
            self.unrepaired.inc_by(r.unrepaired);
            if !r.decoded {
                self.decode_failures.inc();
            }
        }
    }

    /// The upstream point's own packets (it publishes no figures).
    pub fn recorded_upstream(&self, packets: u64) {
        self.packets.get_or_create(&PointLabel { point: "up" }).inc_by(packets);
    }

    /// The link's state, its refusals and the packets the cache dropped since the last call.
    pub fn peer(&self, up: bool, refused: impl IntoIterator<Item = (&'static str, u64)>, cache_dropped: u64) {
        self.peer_up.set(up as i64);
        for (reason, n) in refused {
            self.refused.get_or_create(&ReasonLabel { reason }).inc_by(n);
        }
        self.cache_dropped.inc_by(cache_dropped);
    }
}
