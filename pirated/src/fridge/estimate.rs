//! From samples to a delay distribution, as pure functions: each sample's correction factor (the
//! inverse of the probability that its pair was sampled and kept), the fridges' estimates
//! combined per delay bin by inverse-variance weights (§4.2), and the corrected distribution's
//! quantiles and tail fractions, read with linear interpolation as the paper reads its CDFs.

use std::collections::HashMap;

use pirate_common::fridge::{Fridges, Sample, MAX_FRIDGES};

/// Bins per octave of delay within which the fridges' estimates are weighted against each other:
/// the paper weighs them per delay value, which samples of a continuous delay never share.
pub const BINS_PER_OCTAVE: f64 = 8.0;

/// p⁻¹(1 − p/M)^(−x) for a sample of fridge `k` that survived `x` requests, over the fridge's
/// share of the pairs: the pairs one sample stands for.
pub fn correction(shape: &Fridges, k: usize, survived: u64) -> f64 {
    ln_factor(shape, k, survived as f64).exp()
}

/// ln of fridge `k`'s correction factor for `survived` requests, which may be fractional (the
/// requests expected during a delay): computed in logarithms, so that none overflows.
fn ln_factor(shape: &Fridges, k: usize, survived: f64) -> f64 {
    let (p, m) = (shape.p(k), (1u64 << shape.slots_log2[k]) as f64);
    -survived * (-p / m).ln_1p() - (p * shape.share(k)).ln()
}

/// How fridges' estimates in one delay bin are weighted against each other.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Weights {
    /// Inverse of the variance estimate Σc² over the fridge's samples in the bin (eq. 7), as
    /// published; a fridge without samples there has no weight. The weight moves with the
    /// estimate (a fridge that drew fewer samples, or ones that survived fewer requests, reads
    /// lower and weighs more), so the combination leans low.
    Paper,
    /// Inverse of the fridge's expected correction factor at the bin's delay, from the requests
    /// offered to each fridge per nanosecond: eq. 5's variance, f(t)·c_k(t), with the f(t) all
    /// fridges share left out. Fixed before any sample is drawn, so the combination of unbiased
    /// estimates stays unbiased; a fridge without samples in the bin estimates zero there.
    Expected { offered_per_ns: [f64; MAX_FRIDGES] },
}

/// Each sample's delay and weight: its correction factor, times its fridge's inverse-variance
/// weight in the sample's delay bin (see [`Weights`]; one fridge: every weight is 1).
pub fn weighted(shape: &Fridges, samples: &[Sample], weights: Weights) -> Vec<(u64, f64)> {
    let bin = |delay_ns: u64| ((delay_ns.max(1) as f64).log2() * BINS_PER_OCTAVE).floor() as i32;
    let factor = |s: &Sample| correction(shape, s.fridge as usize, s.survived);
    let fridges = shape.count as usize;
    let mut per_bin: HashMap<i32, [f64; MAX_FRIDGES]> = HashMap::new();
    match weights {
        Weights::Paper => {
            for s in samples {
                per_bin.entry(bin(s.delay_ns)).or_default()[s.fridge as usize] += factor(s).powi(2);
            }
            for w in per_bin.values_mut() {
                *w = w.map(|v| if v > 0.0 { 1.0 / v } else { 0.0 });
            }
        }
        Weights::Expected { offered_per_ns } => {
            for s in samples {
                per_bin.entry(bin(s.delay_ns)).or_insert_with_key(|&b| {
                    let delay_ns = ((b as f64 + 0.5) / BINS_PER_OCTAVE).exp2();
                    let ln: [f64; MAX_FRIDGES] = std::array::from_fn(|k| match k < fridges {
                        // The requests it survives: those offered during the delay.
                        true => ln_factor(shape, k, offered_per_ns[k] * delay_ns),
                        false => f64::INFINITY,
                    });
                    // 1/c_k, scaled by the smallest c so that none overflows.
                    let least = ln.iter().copied().fold(f64::INFINITY, f64::min);
                    ln.map(|l| (least - l).exp())
                });
            }
        }
    }
    for w in per_bin.values_mut() {
        let total: f64 = w.iter().sum();
        *w = w.map(|v| v / total);
    }
    samples.iter().map(|s| (s.delay_ns, per_bin[&bin(s.delay_ns)][s.fridge as usize] * factor(s))).collect()
}

/// A delay distribution from weighted delays: the delays ascending with their weights' running
/// sums, the distribution function linear between them.
#[derive(Clone, Debug, Default)]
pub struct Distribution {
    points: Vec<(f64, f64)>,
}

impl Distribution {
    pub fn new(mut weighted: Vec<(u64, f64)>) -> Distribution {
        weighted.sort_unstable_by_key(|&(delay, _)| delay);
        let mut sum = 0.0;
        let points = weighted
            .into_iter()
            .filter(|&(_, w)| w > 0.0)
            .map(|(delay, w)| {
                sum += w;
                (delay as f64, sum)
            })
            .collect();
        Distribution { points }
    }

    /// The pairs the weights stand for.
    pub fn total(&self) -> f64 {
        self.points.last().map_or(0.0, |p| p.1)
    }

    /// The delay (ns) below which a fraction `q` of the pairs lie; `None` without samples.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let rank = q.clamp(0.0, 1.0) * self.total();
        let i = self.points.partition_point(|p| p.1 < rank);
        let &(t, f) = self.points.get(i).or(self.points.last())?;
        let Some(&(t0, f0)) = i.checked_sub(1).and_then(|j| self.points.get(j)) else {
            return Some(t);
        };
        Some(t0 + (t - t0) * ((rank - f0) / (f - f0)).clamp(0.0, 1.0))
    }

    /// The fraction of pairs slower than `t_ns`.
    pub fn fraction_above(&self, t_ns: f64) -> f64 {
        let total = self.total();
        if total == 0.0 {
            return 0.0;
        }
        let j = self.points.partition_point(|p| p.0 <= t_ns);
        let below = match (j.checked_sub(1).map(|i| self.points[i]), self.points.get(j)) {
            (None, _) => 0.0,
            (Some((_, f)), None) => f,
            (Some((t0, f0)), Some(&(t1, f1))) => f0 + (f1 - f0) * (t_ns - t0) / (t1 - t0),
        };
        1.0 - below / total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrections_are_the_inverse_of_being_kept() {
        let one = Fridges::new(&[10], &[0.25]).unwrap();
        assert!((correction(&one, 0, 0) - 4.0).abs() < 1e-12);
        let kept = 0.25 * (1.0 - 0.25 / 1024.0f64).powi(5000);
        assert!((correction(&one, 0, 5000) * kept - 1.0).abs() < 1e-9);
        // Two equal fridges: each sees half the pairs.
        let two = Fridges::new(&[10, 10], &[1.0, 0.5]).unwrap();
        assert!((correction(&two, 1, 0) - 4.0).abs() < 1e-12);
    }

    #[test]
    fn inverse_variance_weights_favour_the_fridge_with_smaller_factors() {
        let two = Fridges::new(&[10, 10], &[1.0, 1.0]).unwrap();
        let s = |fridge, survived| Sample { fridge, delay_ns: 1_000_000, survived, ..Sample::default() };
        // Same bin: fridge 0's sample stands for 2 pairs (variance 4), fridge 1's two samples
        // for 2·e^(1024·ln(1024/1023)) ≈ 5.44 each (variance 59.2).
        let w = weighted(&two, &[s(0, 0), s(1, 1024), s(1, 1024)], Weights::Paper);
        let (c0, c1) = (correction(&two, 0, 0), correction(&two, 1, 1024));
        let (v0, v1) = (c0 * c0, 2.0 * c1 * c1);
        let w0 = (1.0 / v0) / (1.0 / v0 + 1.0 / v1);
        assert!((w[0].1 - w0 * c0).abs() < 1e-9 && (w[1].1 - (1.0 - w0) * c1).abs() < 1e-9, "{w:?}");
        // A sample alone in its bin keeps its whole factor.
        let alone = weighted(&two, &[Sample { delay_ns: 10, ..s(1, 1024) }], Weights::Paper);
        assert!((alone[0].1 - c1).abs() < 1e-9);
        // Expected factors: fridge 1 offered 1 request per µs, fridge 0 none, over the bin of
        // 1 ms; the weights follow from those rates whatever the samples.
        let mut offered_per_ns = [0.0; MAX_FRIDGES];
        offered_per_ns[1] = 1e-3;
        let w = weighted(&two, &[s(0, 0), s(1, 5)], Weights::Expected { offered_per_ns });
        let center = ((((1e6f64).log2() * BINS_PER_OCTAVE).floor() + 0.5) / BINS_PER_OCTAVE).exp2();
        let e1 = 2.0 * (1.0 - 1.0 / 1024.0f64).powf(-1e-3 * center);
        let w0 = (1.0 / 2.0) / (1.0 / 2.0 + 1.0 / e1);
        assert!((w[0].1 - w0 * c0).abs() < 1e-9, "{w:?}");
        assert!((w[1].1 - (1.0 - w0) * correction(&two, 1, 5)).abs() < 1e-9, "{w:?}");
    }

    #[test]
    fn quantiles_and_tails_interpolate_between_samples() {
        let d = Distribution::new(vec![(30, 1.0), (10, 1.0), (20, 2.0)]);
        assert_eq!(d.total(), 4.0);
        assert_eq!(d.quantile(0.25), Some(10.0));
        assert_eq!(d.quantile(0.5), Some(15.0));
        assert_eq!(d.quantile(0.75), Some(20.0));
        assert_eq!(d.quantile(1.0), Some(30.0));
        assert_eq!(d.fraction_above(5.0), 1.0);
        assert_eq!(d.fraction_above(15.0), 1.0 - 2.0 / 4.0);
        assert_eq!(d.fraction_above(30.0), 0.0);
        assert_eq!(Distribution::default().quantile(0.5), None);
    }
}
