//! The segment's delay distribution over an interval from its reference packets: each
//! reference's delay is measured exactly, and references are spread over time (injected) or over
//! packets (sampled by hash), so they sample the delay every packet of the interval met, burst
//! included, where a mean and a standard deviation taken from aggregates (LDA, RDA) can read a
//! short burst low. Each quantile comes with the count behind it.

use crate::histogram::latency_bounds;

/// Quantiles this reports, and how many references each needs to say anything (a p99.9 from
/// 50 samples is their maximum, not a quantile).
pub const QUANTILES: [(f64, usize); 4] = [(0.5, 2), (0.9, 10), (0.99, 100), (0.999, 1000)];

/// The top of the delay histogram's bounds: 2³ s, beyond any `rli.max_delay` taken.
pub const TOP_OCTAVE: i32 = 3;

/// One interval's references summarised.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub mean: f64,
    pub std_dev: f64,
    /// Per `QUANTILES` entry, the quantile (nearest rank), or `None` with too few references.
    pub quantiles: [Option<f64>; QUANTILES.len()],
    /// How many references at or below each of [`latency_bounds`]`(TOP_OCTAVE)`, and last all
    /// of them: a histogram's cumulative buckets, which add up across intervals and pirateds.
    pub at_or_below: Vec<f64>,
}

impl Summary {
    /// The summary of `delays` (sorted in place); `None` for none.
    pub fn of(delays: &mut [f64]) -> Option<Summary> {
        if delays.is_empty() {
            return None;
        }
        delays.sort_by(f64::total_cmp);
        let n = delays.len();
        let mean = delays.iter().sum::<f64>() / n as f64;
        let var = delays.iter().map(|d| (d - mean) * (d - mean)).sum::<f64>() / n as f64;
        let rank = |q: f64| delays[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
        let quantiles = QUANTILES.map(|(q, needs)| (n >= needs).then(|| rank(q)));
        let at_or_below = latency_bounds(TOP_OCTAVE)
            .map(|bound| delays.partition_point(|&d| d <= bound * 1e9) as f64)
            .chain([n as f64])
            .collect();
        Some(Summary { count: n, mean, std_dev: var.sqrt(), quantiles, at_or_below })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nearest-rank quantiles, each only from enough references; the moments of all of them.
    #[test]
    fn quantiles_need_their_references() {
        let mut delays: Vec<f64> = (1..=200).rev().map(f64::from).collect();
        let s = Summary::of(&mut delays).unwrap();
        assert_eq!((s.count, s.mean), (200, 100.5));
        assert_eq!(s.quantiles, [Some(100.0), Some(180.0), Some(198.0), None]);
        assert!((s.std_dev - (((200.0f64 * 200.0) - 1.0) / 12.0).sqrt()).abs() < 1e-9);
        assert_eq!(Summary::of(&mut []), None);
    }

    /// The histogram's cumulative counts: each bound counts the delays at or below it (a delay
    /// on a bound in that bound's), the last all of them, those beyond the top included.
    #[test]
    fn the_histogram_counts_at_or_below_each_bound() {
        let bounds: Vec<f64> = latency_bounds(TOP_OCTAVE).map(|s| s * 1e9).collect();
        let mut delays = vec![5e3, bounds[40], bounds[40] + 1.0, 1e6, 20e9];
        let s = Summary::of(&mut delays).unwrap();
        assert_eq!(s.at_or_below.len(), bounds.len() + 1);
        let upto = |j: usize| s.at_or_below[j];
        assert_eq!(
            [upto(0), upto(39), upto(40), upto(41), upto(bounds.len() - 1), upto(bounds.len())],
            [1.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        );
    }
}
