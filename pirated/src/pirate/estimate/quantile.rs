//! Response-latency quantiles, with bounds, from the modes the estimator took as batch ends.
//! The modes say where a flow's batch-ending gaps lie (each mode's [min, max], count and sum);
//! the time inside batches is known per flow only as a mean, added to every batch. With the span
//! cap (`pirate_common::pirate::modes::Epsilon::span`) modes are at most `mode_span` ε wide unless
//! a full table had to merge them, so their counts place the tail and the spread assumed within
//! a mode matters little; the merged ones are placed by the server's other modes
//! ([`super::merged`]). Cost: linear in a server's flows and batch-ending modes, per epoch.

use pirate_common::pirate::modes::Epsilon;

use super::{
    figure::FlowEstimate,
    merged,
    span::{Part, Span},
};
use crate::pirate::flow::Mode;

/// The quantiles reported per server.
pub const QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];

/// One quantile's estimate and the bounds on it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quantile {
    pub q: f64,
    pub estimate_ns: f64,
    /// Bounds that hold wherever the gaps lie inside their modes: the same quantile over the
    /// modes' minima and over their maxima. The error from the gaps' spread is thus at most the
    /// width of the mode (or modes) the quantile falls in; estimate and bounds share the one
    /// approximation that every batch spends its flow's mean time inside a batch.
    pub lower_ns: f64,
    pub upper_ns: f64,
}

/// Where one flow's batch-to-batch times lie, from the modes `est` took as batch ends: each
/// batch-ending gap plus the flow's mean time inside a batch (exact with one request in flight,
/// where it is zero). `eps` is the modes' ε and span cap.
pub fn spans<'a>(modes: &'a [Mode], est: &'a FlowEstimate, eps: Epsilon) -> impl Iterator<Item = Span> + 'a {
    // A mode only some of whose gaps end batches: those are taken to lie as its gaps do.
    let ends_ns: f64 = est.ends.of(modes).map(|(i, n)| modes[i].mean_ns() * n as f64).sum();
    let inside = (est.kept_ns as f64 - ends_ns).max(0.0) / est.batches.max(1) as f64;
    est.ends.of(modes).map(move |(i, count)| {
        let m = &modes[i];
        Span {
            lo_ns: m.min_ns as f64 + inside,
            hi_ns: m.max_ns as f64 + inside,
            mean_ns: m.mean_ns().clamp(m.min_ns as f64, m.max_ns as f64) + inside,
            count,
            merged: !eps.spans(m.min_ns, m.max_ns),
            whole: count == u64::from(m.count),
        }
    })
}

/// The quantiles `qs` (each in (0, 1]) of the batch-to-batch times in `spans`; empty without any.
pub fn quantiles(spans: &[Span], qs: &[f64]) -> Vec<Quantile> {
    let total: u64 = spans.iter().map(|s| s.count).sum();
    if total == 0 {
        return Vec::new();
    }
    let sorted = |key: fn(&Span) -> f64| {
        let mut v: Vec<(f64, u64)> = spans.iter().map(|s| (key(s), s.count)).collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    let (los, his) = (sorted(|s| s.lo_ns), sorted(|s| s.hi_ns));
    // The unmerged spans as they are, the merged ones' gaps where the server's gaps lie.
    let parts: Vec<Part> =
        spans.iter().filter(|s| !s.merged).flat_map(Part::within).chain(merged::place(spans)).collect();
    qs.iter()
        .map(|&q| {
            let rank = q * total as f64;
            let (lower_ns, upper_ns) = (weighted_rank(&los, rank), weighted_rank(&his, rank));
            // The bisection stays inside the bounds: a part wholly below them counts all its gaps
            // there, one wholly above none; only the parts across them need their shape.
            let mut below = 0.0;
            let across: Vec<Fit> = parts
                .iter()
                .filter(|s| {
                    let wholly_below = s.hi_ns <= lower_ns;
                    below += if wholly_below { s.count } else { 0.0 };
                    !wholly_below && s.lo_ns < upper_ns
                })
                .map(Fit::new)
                .collect();
            let estimate_ns = mixture_quantile(&across, rank - below, lower_ns, upper_ns);
            Quantile { q, estimate_ns, lower_ns, upper_ns }
        })
        .collect()
}

/// How many of the batch-to-batch times in `spans` lie at or below each of `bounds` (ns,
/// ascending), as the quantiles read them, and last all of them: a histogram's cumulative
/// buckets, +Inf's last. Cost: the bounds within each span's, and a search per span.
pub fn at_or_below(spans: &[Span], bounds: &[f64]) -> Vec<f64> {
    let mut below = vec![0.0; bounds.len() + 1];
    // A part's every gap, from the first bound at or above its maximum on.
    let mut whole = vec![0.0; bounds.len() + 1];
    let parts = spans.iter().filter(|s| !s.merged).flat_map(Part::within).chain(merged::place(spans));
    for part in parts {
        let (first, end) = (bounds.partition_point(|&b| b < part.lo_ns), bounds.partition_point(|&b| b < part.hi_ns));
        if first < end {
            let fit = Fit::new(&part);
            (first..end).for_each(|j| below[j] += fit.at(bounds[j]).0);
        }
        whole[end] += part.count;
    }
    let mut all = 0.0;
    for (b, w) in below.iter_mut().zip(&whole) {
        all += w;
        *b += all;
    }
    below
}

/// The smallest value (of ascending `values` with counts) whose cumulative count reaches `rank`.
fn weighted_rank(values: &[(f64, u64)], rank: f64) -> f64 {
    let mut seen = 0.0;
    for (x, n) in values {
        seen += *n as f64;
        if seen >= rank {
            return *x;
        }
    }
    values.last().map_or(f64::NAN, |l| l.0)
}

/// Where the spans' summed distribution functions reach `rank`, between the bounds (which
/// bracket it), to 10⁻⁴ of the value (or 1 ns): Newton steps on the summed densities, kept
/// inside the bracket, else halving it. A few steps where bisection takes fifteen, each step one
/// exponential per span.
fn mixture_quantile(fits: &[Fit], rank: f64, mut lo: f64, mut hi: f64) -> f64 {
    let tolerance = |x: f64| (1e-4 * x).max(1.0);
    let mut x = 0.5 * (lo + hi);
    for _ in 0..64 {
        if hi - lo <= tolerance(hi) {
            break;
        }
        let (below, density) = fits.iter().fold((0.0, 0.0), |(b, d), f| {
            let (fb, fd) = f.at(x);
            (b + fb, d + fd)
        });
        if below >= rank {
            hi = x;
        } else {
            lo = x;
        }
        let newton = x - (below - rank) / density;
        if !(newton > lo && newton < hi) {
            x = 0.5 * (lo + hi);
        } else if (newton - x).abs() <= 0.25 * tolerance(x) {
            return newton;
        } else {
            x = newton;
        }
    }
    hi
}

/// A span's density: ∝ y·e^(t·y) on y = (x − lo) / width ∈ [0, 1], t set so that the mean is
/// right: a peak above the minimum with an exponential tail towards the maximum. That is the
/// shape of a mode of one latency regime: a single early gap below the bulk is its minimum, and
/// late gaps chain on to it through ε up to a maximum far out. A uniform spread, or the
/// maximum-entropy exponential from the minimum, puts the bulk too low and the tail too heavy.
///
/// Its distribution function is G(t·y)/G(t), G(s) = ∫₀ˢ u·eᵘ du = eˢ(s − 1) + 1, kept scaled
/// by e^(−max(t, 0)) so that no exponential overflows.
struct Fit {
    lo: f64,
    width: f64,
    t: f64,
    /// max(t, 0): the scale.
    c: f64,
    /// e^(−c).
    e_c: f64,
    /// G(t)·e^(−c): the normalisation.
    norm: f64,
    count: f64,
}

impl Fit {
    fn new(s: &Part) -> Fit {
        let width = s.hi_ns - s.lo_ns;
        let r = if width > 0.0 { ((s.mean_ns - s.lo_ns) / width).clamp(0.0, 1.0) } else { 0.0 };
        let t = exponent_for_mean(r);
        let c = t.max(0.0);
        let e_c = (-c).exp();
        let mut fit = Fit { lo: s.lo_ns, width, t, c, e_c, norm: 1.0, count: s.count };
        fit.norm = fit.scaled_g(t, (t - c).exp());
        fit
    }

    /// G(s)·e^(−c), given e^(s − c): its series where the closed form cancels.
    fn scaled_g(&self, s: f64, e_s_c: f64) -> f64 {
        if s.abs() < 1e-3 {
            // Σ sⁿ(n − 1)/n!, n ≥ 2: relative error below 10⁻¹⁰ here.
            self.e_c * s * s * (0.5 + s * (1.0 / 3.0 + s / 8.0))
        } else {
            e_s_c * (s - 1.0) + self.e_c
        }
    }

    /// How many of the span's gaps are at or below `x`, and their density there (per ns).
    fn at(&self, x: f64) -> (f64, f64) {
        if x >= self.lo + self.width {
            return (self.count, 0.0);
        }
        if x <= self.lo {
            return (0.0, 0.0);
        }
        let y = (x - self.lo) / self.width;
        if self.t.abs() < 1e-9 {
            return (self.count * y * y, self.count * 2.0 * y / self.width);
        }
        let s = self.t * y;
        let e_s_c = (s - self.c).exp();
        let below = self.scaled_g(s, e_s_c) / self.norm;
        let density = self.t * self.t * y * e_s_c / self.norm / self.width;
        (self.count * below, self.count * density)
    }
}

/// ln Iⱼ(t), Iⱼ(t) = ∫₀¹ uʲ·e^(t·u) du, for j = 1, 2: by its series near 0, in closed form
/// (scaled so that neither overflows nor cancels badly) elsewhere.
fn ln_moment(j: i32, t: f64) -> f64 {
    if t.abs() < 1.0 {
        // Σ tⁿ / (n!·(n + j + 1)): 20 terms are exact to f64 for |t| < 1.
        let (mut sum, mut term) = (0.0, 1.0);
        for n in 0..20 {
            sum += term / f64::from(n + j + 1);
            term *= t / f64::from(n + 1);
        }
        return sum.ln();
    }
    let e = t.exp();
    let ln_abs_t = t.abs().ln();
    match (j, t > 0.0) {
        // (eᵗ(t − 1) + 1) / t²
        (1, true) => t + (t + (-t).exp_m1()).ln() - 2.0 * ln_abs_t,
        (1, false) => (t * e - t.exp_m1()).ln() - 2.0 * ln_abs_t,
        // (eᵗ(t² − 2t + 2) − 2) / t³
        (_, true) => t + (t * t - 2.0 * t + 2.0 - 2.0 * (-t).exp()).ln() - 3.0 * ln_abs_t,
        (_, false) => (2.0 - e * (t * t - 2.0 * t + 2.0)).ln() - 3.0 * ln_abs_t,
    }
}

/// The t whose density ∝ y·e^(t·y) on [0, 1] has mean `r`, from a table of t·r·(1 − r) (smooth,
/// from −2 at r = 0 to 1 at r = 1) built once: a bisection per span would cost microseconds.
fn exponent_for_mean(r: f64) -> f64 {
    const STEPS: usize = 4096;
    static TABLE: std::sync::OnceLock<Vec<f64>> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        (0..=STEPS)
            .map(|i| {
                let r = i as f64 / STEPS as f64;
                match i {
                    0 => -2.0,
                    STEPS => 1.0,
                    _ => solve_exponent(r) * r * (1.0 - r),
                }
            })
            .collect()
    });
    let r = r.clamp(1e-9, 1.0 - 1e-9);
    let at = r * STEPS as f64;
    let i = (at as usize).min(STEPS - 1);
    let scaled = table[i] + (table[i + 1] - table[i]) * (at - i as f64);
    scaled / (r * (1.0 - r))
}

/// exponent_for_mean by bisection: mean(t) = I₂/I₁ rises from 0 (t → −∞, where it is ≈ −2/t)
/// to 1 (≈ 1 − 1/t), through ⅔ at t = 0.
fn solve_exponent(r: f64) -> f64 {
    let mean = |t: f64| (ln_moment(2, t) - ln_moment(1, t)).exp();
    let (mut lo, mut hi) = (-2.0 / r - 2.0, 1.0 / (1.0 - r) + 2.0);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mean(mid) < r {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= 1e-12 * hi.abs().max(1.0) {
            break;
        }
    }
    0.5 * (lo + hi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pirate::estimate::Ends;

    fn span(lo: f64, hi: f64, mean: f64, count: u64) -> Span {
        Span { lo_ns: lo, hi_ns: hi, mean_ns: mean, count, merged: false, whole: false }
    }

    fn part(lo: f64, hi: f64, mean: f64) -> Part {
        Part { lo_ns: lo, hi_ns: hi, mean_ns: mean, count: 1.0 }
    }

    #[test]
    fn a_mean_near_the_minimum_is_a_peak_with_an_exponential_tail() {
        // Mean 50 above the minimum of a 1000-wide mode: nearly Gamma(2, 25) from the minimum,
        // whose quantiles are 1.678, 3.890 and 6.638 scales.
        let q = quantiles(&[span(1000.0, 2000.0, 1050.0, 1000)], &[0.5, 0.9, 0.99]);
        for (q, scales) in q.iter().zip([1.678, 3.890, 6.638]) {
            let exp = 1000.0 + 25.0 * scales;
            assert!((q.estimate_ns - exp).abs() < 0.5, "{q:?} vs {exp}");
        }
    }

    /// A server's modes, some wider than a bucket, one merged, and whole modes: the histogram
    /// holds every batch, rises with its bounds, and a quantile read off it as Prometheus's
    /// `histogram_quantile` does (linearly within the bucket it falls in) is within 1 % of the
    /// estimate's wherever the bucket is narrower than the mode it falls in.
    #[test]
    fn the_histogram_reads_the_quantiles_back() {
        let mut spans = vec![
            span(4.8e6, 5.3e6, 4.9e6, 700),
            span(5.3e6, 5.8e6, 5.5e6, 200),
            span(9.5e6, 10.4e6, 9.9e6, 90),
            Span { whole: true, ..span(30e6, 33e6, 31e6, 9) },
        ];
        spans.push(Span { merged: true, ..span(12e6, 40e6, 20e6, 11) });
        let bounds: Vec<f64> = crate::pirate::estimate::servers::histogram_bounds_ns().collect();
        let buckets = at_or_below(&spans, &bounds);
        assert_eq!(buckets.len(), bounds.len() + 1);
        assert!((buckets[bounds.len()] - 1010.0).abs() < 1e-9, "{}", buckets[bounds.len()]);
        assert!(buckets.windows(2).all(|w| w[1] >= w[0] - 1e-9));
        for q in quantiles(&spans, &QUANTILES) {
            let read = crate::histogram::read_at_rank(&bounds, &buckets, q.q * 1010.0);
            assert!((read / q.estimate_ns - 1.0).abs() < 0.01, "p{}: {read} against {q:?}", q.q * 100.0);
        }
    }

    #[test]
    fn moments_match_their_integrals() {
        for t in [-700.0, -30.0, -1.5, -1.0, -0.3, 0.0, 1e-12, 0.7, 1.0, 4.0, 600.0] {
            for j in [1, 2] {
                // Midpoint rule on a grid fine enough for the steepest t.
                let steps = 400_000;
                let h = 1.0 / steps as f64;
                let direct: f64 = (0..steps)
                    .map(|i| {
                        let u = (i as f64 + 0.5) * h;
                        (u.powi(j) * (t * u).exp()) * h
                    })
                    .sum();
                let got = ln_moment(j, t).exp();
                assert!((got / direct - 1.0).abs() < 1e-4, "I{j}({t}) = {got}, integral {direct}");
            }
        }
    }

    #[test]
    fn the_distribution_function_and_density_match_their_integrals() {
        for r in [1e-7, 0.01, 0.2, 0.4, 0.6666, 0.66667, 0.7, 0.95, 0.9999] {
            let f = Fit::new(&part(0.0, 1.0, r));
            // The density ∝ y·e^(t·y), normalised by the midpoint rule, integrated to each y.
            let steps = 200_000;
            let h = 1.0 / steps as f64;
            let shape = |y: f64| y * (f.t * y - f.c).exp();
            let total: f64 = (0..steps).map(|i| shape((i as f64 + 0.5) * h) * h).sum();
            let mut integral = 0.0;
            for i in 0..steps {
                integral += shape((i as f64 + 0.5) * h) * h;
                if (i + 1) % 20_000 == 0 && i + 1 < steps {
                    let y = (i + 1) as f64 * h;
                    let (below, density) = f.at(y);
                    let exact = integral / total;
                    assert!((below - exact).abs() < 1e-6 + 1e-4 * exact, "r {r} t {}: F({y}) {below} vs {exact}", f.t);
                    let slope = shape(y) / total;
                    assert!((density - slope).abs() < 1e-4 * slope.max(1.0), "r {r}: f({y}) {density} vs {slope}");
                }
            }
        }
    }

    #[test]
    fn the_fitted_density_keeps_the_mean() {
        for r in [1e-6, 0.001, 0.1, 0.3, 0.5, 0.7, 0.999, 1.0 - 1e-6] {
            let f = Fit::new(&part(0.0, 1.0, r));
            // ∫ (1 − F) over [0, 1] is the mean.
            let steps = 100_000;
            let mean: f64 =
                (0..steps).map(|i| 1.0 - f.at((i as f64 + 0.5) / steps as f64).0).sum::<f64>() / steps as f64;
            assert!((mean - r).abs() < 1e-4, "mean {mean} for {r}");
        }
    }

    #[test]
    fn separate_modes_give_each_quantile_its_mode() {
        // 45 % at 2 ms, 30 % at 5 ms, 17 % at 10 ms, 8 % at 20 ms (each ±2 %).
        let m = |ms: f64, n| span(ms * 0.98e6, ms * 1.02e6, ms * 1e6, n);
        let spans = [m(2.0, 45), m(5.0, 30), m(10.0, 17), m(20.0, 8)];
        let q = quantiles(&spans, &QUANTILES);
        let within = |x: f64, ms: f64| (x / (ms * 1e6) - 1.0).abs() <= 0.02;
        assert!(within(q[0].estimate_ns, 5.0) && within(q[1].estimate_ns, 10.0) && within(q[2].estimate_ns, 20.0));
        for q in &q {
            assert!(q.lower_ns <= q.estimate_ns && q.estimate_ns <= q.upper_ns, "{q:?}");
        }
    }

    #[test]
    fn point_masses_and_empty_input() {
        let q = quantiles(&[span(3.0, 3.0, 3.0, 5), span(7.0, 7.0, 7.0, 5)], &[0.5, 0.51, 1.0]);
        assert_eq!(q.iter().map(|q| q.estimate_ns).collect::<Vec<_>>(), [3.0, 7.0, 7.0]);
        assert!(quantiles(&[], &QUANTILES).is_empty());
    }

    #[test]
    fn a_whole_modes_bounds_are_gaps_of_it() {
        // 988 gaps at 5–6 ms; 9 and 11 ms (a mode of two); 9.5, 10 and 12 ms (of three, mean
        // 10.5); 7 at 16–17 ms. The 989th and 991st of the 1000 are 9 and 10 ms exactly.
        let whole = |lo: f64, hi: f64, mean: f64, count| Span { whole: true, ..span(lo, hi, mean, count) };
        let spans = [
            span(5.0e6, 6.0e6, 5.5e6, 988),
            whole(9.0e6, 11.0e6, 10.0e6, 2),
            whole(9.5e6, 12.0e6, 10.5e6, 3),
            span(16.0e6, 17.0e6, 16.5e6, 7),
        ];
        let q = quantiles(&spans, &[0.989, 0.991]);
        assert!((q[0].estimate_ns - 9.0e6).abs() < 1e3, "{:?}", q[0]);
        assert!((q[1].estimate_ns - 10.0e6).abs() < 1e3, "{:?}", q[1]);
        // Not every gap ending a batch: the bounds may be other gaps', so the shape spreads them.
        let partial: Vec<Span> = spans.iter().map(|s| Span { whole: false, ..*s }).collect();
        let q = quantiles(&partial, &[0.989]);
        assert!((q[0].estimate_ns - 9.0e6).abs() > 1e5, "{:?}", q[0]);
    }

    #[test]
    fn time_inside_batches_shifts_the_spans() {
        // Two batches per 10 gaps: 8 intra-batch gaps of 10 µs, batch ends of 1 ms.
        let modes = [
            Mode { min_ns: 10_000, max_ns: 10_000, count: 8, candidates: 0, sum_ns: 80_000 },
            Mode { min_ns: 1_000_000, max_ns: 1_000_000, count: 2, candidates: 2, sum_ns: 2_000_000 },
        ];
        let est = FlowEstimate { estimate_ns: 1_040_000.0, batches: 2, kept_ns: 2_080_000, ends: Ends::all(1..2) };
        let s: Vec<Span> = spans(&modes, &est, Epsilon { abs_ns: 100_000, rel_q20: 0, span: 2 }).collect();
        assert_eq!(s, [Span { whole: true, ..span(1_040_000.0, 1_040_000.0, 1_040_000.0, 2) }]);
    }

    /// A server's responses at 7.5–8.5 ms, its loss-recovery tail at 16–17 ms (5 gaps), and a
    /// mode a full table merged across the cliff between (10 gaps of mean 11.6 ms, about 4 of them
    /// in the tail): p99, the 10th slowest of 1000, lies at the top of the responses, not in the
    /// empty 9–15 ms where a shape fitted to the merged mode alone puts it.
    #[test]
    fn p99_below_a_cliff_that_a_merged_mode_spans_lies_below_it() {
        let merged = Span { merged: true, ..span(8.0e6, 17.0e6, 11.6e6, 10) };
        let spans = [span(7.5e6, 8.5e6, 8.0e6, 985), span(16.0e6, 17.0e6, 16.5e6, 5), merged];
        let p99 = quantiles(&spans, &[0.99])[0];
        assert!(p99.estimate_ns > 8.0e6 && p99.estimate_ns < 9.0e6, "{p99:?}");
        let unplaced = quantiles(&[spans[0], spans[1], Span { merged: false, ..merged }], &[0.99])[0];
        assert!(unplaced.estimate_ns > 9.5e6, "{unplaced:?}");
    }
}
