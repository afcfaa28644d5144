//! A Prometheus histogram filled a batch at a time: an epoch observes a value per flow, and
//! `prometheus_client`'s histogram takes a lock and scans its buckets for each one (about
//! 45 ms for a million flows); here the buckets are found on every CPU and added under one lock.
//! Observations may carry weights (a fridge sample stands for the pairs its correction factor
//! says): counts are kept as reals and exposed rounded.

use std::sync::{Arc, Mutex};

use prometheus_client::{
    encoding::{EncodeMetric, MetricEncoder, NoLabelSet},
    metrics::{MetricType, TypedMetric},
};

/// Cumulative sum, count and per-bucket counts; upper bounds ascending, the last +Inf.
#[derive(Debug)]
struct Inner {
    sum: f64,
    count: f64,
    buckets: Vec<(f64, f64)>,
}

/// Buckets a factor of two is cut into, in the histograms meant to sum across pirateds: 2.2 %
/// apart, a fifth of a Pirate mode's width or less, so that within a bucket the distribution is
/// nearly linear and a quantile read off the buckets as `histogram_quantile` does lies within 1 %
/// of the estimate's (16 a factor of two do not, for a skewed mode's median).
pub const PER_OCTAVE: i32 = 32;
/// Their lowest bound: 2⁻¹⁷ s, 7.6 µs.
pub const LOWEST_OCTAVE: i32 = -17;

/// The bounds (seconds) of the latency histograms that sum across pirateds: [`PER_OCTAVE`] a
/// factor of two from 2^[`LOWEST_OCTAVE`] s to 2^`top` s. Fixed, the same in every pirated and
/// every family (their ranges differ only in `top`), so that Prometheus can add their buckets.
pub fn latency_bounds(top: i32) -> impl Iterator<Item = f64> {
    (LOWEST_OCTAVE * PER_OCTAVE..=top * PER_OCTAVE).map(|k| (k as f64 / PER_OCTAVE as f64).exp2())
}

/// What Prometheus's `histogram_quantile` reads at `rank` off cumulative counts (`at_or_below[j]`
/// at or below `bounds[j]`, ascending): linearly within the bucket the rank falls in.
#[cfg(test)]
pub fn read_at_rank(bounds: &[f64], at_or_below: &[f64], rank: f64) -> f64 {
    let j = at_or_below.partition_point(|&c| c < rank);
    let (lo, below) = if j == 0 { (0.0, 0.0) } else { (bounds[j - 1], at_or_below[j - 1]) };
    lo + (bounds[j] - lo) * (rank - below) / (at_or_below[j] - below)
}

#[derive(Clone, Debug)]
pub struct BatchHistogram {
    inner: Arc<Mutex<Inner>>,
}

impl BatchHistogram {
    /// Buckets with these upper bounds (ascending), and one for the rest (+Inf).
    pub fn new(bounds: impl IntoIterator<Item = f64>) -> BatchHistogram {
        let mut buckets: Vec<(f64, f64)> = bounds.into_iter().map(|b| (b, 0.0)).collect();
        buckets.push((f64::INFINITY, 0.0));
        BatchHistogram { inner: Arc::new(Mutex::new(Inner { sum: 0.0, count: 0.0, buckets })) }
    }

    /// Observes each (value, weight): the value's bucket and the count grow by the weight, the
    /// sum by value × weight.
    pub fn observe_weighted(&self, items: impl IntoIterator<Item = (f64, f64)>) {
        let mut inner = self.inner.lock().unwrap();
        for (v, w) in items {
            let last = inner.buckets.len() - 1;
            let bucket = if v.is_nan() { last } else { inner.buckets.partition_point(|b| b.0 < v).min(last) };
            inner.buckets[bucket].1 += w;
            inner.sum += v * w;
            inner.count += w;
        }
    }

    /// Adds a distribution given as its counts at or below each bound, +Inf's last (the count),
    /// and the `sum` of its values: each bucket grows by its share.
    pub fn add_at_or_below(&self, at_or_below: &[f64], sum: f64) {
        let mut inner = self.inner.lock().unwrap();
        let mut below = 0.0;
        for (bucket, &upto) in inner.buckets.iter_mut().zip(at_or_below) {
            bucket.1 += (upto - below).max(0.0);
            below = below.max(upto);
        }
        inner.sum += sum;
        inner.count += below;
    }

    /// Observes every value (a value on a bound falls in that bound's bucket; NaN in +Inf's).
    pub fn observe_all<T: Sync>(&self, items: &[T], value: impl Fn(&T) -> Option<f64> + Sync) {
        let bounds: Vec<f64> = self.inner.lock().unwrap().buckets.iter().map(|b| b.0).collect();
        let partial = crate::parallel::chunks(items, |chunk| {
            let (mut sum, mut count, mut counts) = (0.0, 0.0, vec![0.0; bounds.len()]);
            for v in chunk.iter().filter_map(&value) {
                sum += v;
                count += 1.0;
                let bucket = if v.is_nan() { bounds.len() - 1 } else { bounds.partition_point(|&b| b < v) };
                counts[bucket.min(bounds.len() - 1)] += 1.0;
            }
            (sum, count, counts)
        });
        let mut inner = self.inner.lock().unwrap();
        for (sum, count, counts) in partial {
            inner.sum += sum;
            inner.count += count;
            inner.buckets.iter_mut().zip(counts).for_each(|(b, n)| b.1 += n);
        }
    }
}

impl TypedMetric for BatchHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for BatchHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let inner = self.inner.lock().unwrap();
        // Rounded as running sums, so that the exposed cumulative counts stay within ½ of the
        // weights'.
        let (mut running, mut exposed) = (0.0, 0u64);
        let buckets: Vec<(f64, u64)> = inner
            .buckets
            .iter()
            .map(|&(bound, n)| {
                running += n;
                let upto = running.round() as u64;
                let here = upto.saturating_sub(exposed);
                exposed = exposed.max(upto);
                (bound, here)
            })
            .collect();
        encoder.encode_histogram::<NoLabelSet>(inner.sum, inner.count.round() as u64, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::{
        encoding::text::encode,
        metrics::histogram::{exponential_buckets, Histogram},
        registry::Registry,
    };

    use super::*;

    /// The same values through `prometheus_client`'s histogram, one at a time, and through this
    /// one in a batch: the same exposition, bounds, NaN and values beyond the last bound included.
    #[test]
    fn exposes_what_the_library_histogram_does() {
        let values: Vec<f64> =
            (0..10_000).map(|i| 40e-6 * 1.0007f64.powi(i)).chain([50e-6, 75e-6, f64::NAN, 1e9]).collect();
        let bounds = || exponential_buckets(50e-6, 1.5, 33);
        let (one, batch) = (Histogram::new(bounds()), BatchHistogram::new(bounds()));
        values.iter().for_each(|&v| one.observe(v));
        batch.observe_all(&values, |&v| Some(v));
        let text = |register: &dyn Fn(&mut Registry)| {
            let mut registry = Registry::default();
            register(&mut registry);
            let mut out = String::new();
            encode(&mut out, &registry).unwrap();
            out
        };
        let expected = text(&|r| r.register("latency", "help", one.clone()));
        assert!(expected.contains("latency_count 10004"), "{expected}");
        assert_eq!(text(&|r| r.register("latency", "help", batch.clone())), expected);
    }

    /// Weighted delays spread as a service's are (log-normal, a factor of 1.5 either side of
    /// 2 ms, weights 1–4 as a fridge's corrections): their p50, p90 and p99 read off the latency
    /// buckets as `histogram_quantile` does lie within 1 % of the weighted samples'.
    #[test]
    fn quantiles_read_off_the_latency_buckets_are_within_a_percent() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut uniform = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut samples: Vec<(f64, f64)> = (0..20_000)
            .map(|_| {
                // Box–Muller: a normal deviate.
                let z = (-2.0 * uniform().max(1e-12).ln()).sqrt() * (std::f64::consts::TAU * uniform()).cos();
                (2e-3 * 1.5f64.powf(z), 1.0 + (3.0 * uniform()).floor())
            })
            .collect();
        let bounds: Vec<f64> = latency_bounds(7).collect();
        let h = BatchHistogram::new(bounds.clone());
        h.observe_weighted(samples.iter().copied());
        let inner = h.inner.lock().unwrap();
        let mut run = 0.0;
        let cumulative: Vec<f64> = inner
            .buckets
            .iter()
            .map(|b| {
                run += b.1;
                run
            })
            .collect();
        samples.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total: f64 = samples.iter().map(|s| s.1).sum();
        for q in [0.5, 0.9, 0.99] {
            let rank = q * total;
            let mut seen = 0.0;
            let exact = samples.iter().find(|s| {
                seen += s.1;
                seen >= rank
            });
            let exact = exact.unwrap().0;
            let read = read_at_rank(&bounds, &cumulative, rank);
            assert!((read / exact - 1.0).abs() < 0.01, "p{}: {read} against {exact}", q * 100.0);
        }
    }

    /// Distributions given by their counts at or below each bound add up bucket by bucket: two
    /// epochs' expose their sums, rounded, the count +Inf's.
    #[test]
    fn cumulative_counts_add_up() {
        let h = BatchHistogram::new([1.0, 2.0, 4.0]);
        h.add_at_or_below(&[0.4, 2.5, 2.5, 3.0], 4.5);
        h.add_at_or_below(&[0.0, 1.2, 5.0, 6.0], 20.0);
        let mut registry = Registry::default();
        registry.register("latency", "help", h.clone());
        let mut out = String::new();
        encode(&mut out, &registry).unwrap();
        for line in [
            "latency_sum 24.5",
            "latency_count 9",
            "latency_bucket{le=\"1.0\"} 0",
            "latency_bucket{le=\"2.0\"} 4",
            "latency_bucket{le=\"4.0\"} 8",
            "latency_bucket{le=\"+Inf\"} 9",
        ] {
            assert!(out.contains(line), "{line} in {out}");
        }
    }
}
