//! Where the gaps of merged modes lie. A full table merges two adjacent modes into one wider
//! than the span cap, and its min/max/count/mean cannot say where in it its gaps are: under loss,
//! one mode holds the top of a server's responses and the loss-recovery tail far above it, with
//! nothing between. The server's other modes can say: each merged mode's gaps are placed where the
//! server's gaps lie within its range, with a mode's share tilted exponentially to keep its mean,
//! and one gap at each bound (a mode holds its min and max). Iterated over the merged modes
//! together, this is Turnbull's self-consistent estimator for interval-censored data, with means;
//! a few rounds settle it. Cost: the merged modes times the bins they cover, per round.

use super::span::{Part, Span};

/// Log-spaced bins over the merged modes' range (0.6 % wide over 4–20 ms).
const BINS: usize = 256;

/// Rounds of placing every merged mode by the others (the first by the unmerged modes and the
/// merged ones spread evenly).
const ROUNDS: usize = 3;

/// The gaps of `spans`' merged ones as parts, one per bin holding any (at its middle); none
/// without any merged.
pub fn place(spans: &[Span]) -> Vec<Part> {
    let merged: Vec<&Span> = spans.iter().filter(|s| s.merged && s.hi_ns > s.lo_ns && s.count > 0).collect();
    let Some(grid) = Grid::over(&merged) else {
        return Vec::new();
    };
    // The unmerged modes' gaps within the range, each spread evenly over its bins.
    let mut steps = vec![0.0; BINS + 1];
    for s in spans.iter().filter(|s| !s.merged && s.hi_ns >= grid.lo && s.lo_ns <= grid.hi) {
        let (a, b) = (grid.bin(s.lo_ns), grid.bin(s.hi_ns));
        let each = s.count as f64 / (b - a + 1) as f64;
        steps[a] += each;
        steps[b + 1] -= each;
    }
    let others: Vec<f64> = steps[..BINS]
        .iter()
        .scan(0.0, |run, d| {
            *run += d;
            Some(*run)
        })
        .collect();

    // Each merged mode: a gap at each bound, the rest inside with the mean they leave (a lone
    // gap, a mode's only batch-ending one, at its mean). Modes over
    // the same bins with means within 1/1024 of their width are placed as one (a large server's
    // flows repeat their modes), so that the cost is bounded by the grid, not the flows.
    let mut bounds = vec![0.0; BINS];
    let mut inner: Vec<Inner> = merged
        .iter()
        .map(|s| {
            let (a, b) = (grid.bin(s.lo_ns), grid.bin(s.hi_ns));
            if s.count == 1 {
                bounds[grid.bin(s.mean_ns)] += 1.0;
            } else {
                bounds[a] += 1.0;
                bounds[b] += 1.0;
            }
            let rest = s.count as f64 - 2.0;
            let mean = s.inner_mean_ns();
            let class = ((mean - s.lo_ns) / (s.hi_ns - s.lo_ns) * 1024.0) as u32;
            Inner { a, b, class, count: rest.max(0.0), mean }
        })
        .filter(|m| m.count > 0.0)
        .collect();
    inner.sort_unstable_by_key(|m| (m.a, m.b, m.class));
    inner.dedup_by(|m, kept| {
        let same = (m.a, m.b, m.class) == (kept.a, kept.b, kept.class);
        if same {
            kept.mean = (kept.mean * kept.count + m.mean * m.count) / (kept.count + m.count);
            kept.count += m.count;
        }
        same
    });
    let mut placed: Vec<f64> = bounds.clone();
    for m in &inner {
        let each = m.count / (m.b - m.a + 1) as f64;
        placed[m.a..=m.b].iter_mut().for_each(|p| *p += each);
    }
    for _ in 0..ROUNDS {
        let density: Vec<f64> = others.iter().zip(&placed).map(|(o, p)| o + p).collect();
        let mut next = bounds.clone();
        for m in &inner {
            let shares = tilted(&density[m.a..=m.b], &grid.centers[m.a..=m.b], m.mean);
            next[m.a..=m.b].iter_mut().zip(shares).for_each(|(n, s)| *n += m.count * s);
        }
        placed = next;
    }
    placed
        .iter()
        .enumerate()
        .filter(|&(_, &n)| n > 0.0)
        .map(|(i, &count)| {
            let (lo_ns, hi_ns) = (grid.edge(i), grid.edge(i + 1));
            Part { lo_ns, hi_ns, mean_ns: 0.5 * (lo_ns + hi_ns), count }
        })
        .collect()
}

/// A merged mode's bins and the gaps inside it (all but its bounds), with their mean (and its
/// place in the mode, in 1/1024ths).
struct Inner {
    a: usize,
    b: usize,
    class: u32,
    count: f64,
    mean: f64,
}

/// The bins: geometric from `lo` to `hi`.
struct Grid {
    lo: f64,
    hi: f64,
    /// ln of a bin's ratio.
    step: f64,
    centers: Vec<f64>,
}

impl Grid {
    fn over(merged: &[&Span]) -> Option<Grid> {
        let lo = merged.iter().map(|s| s.lo_ns).fold(f64::INFINITY, f64::min).max(1.0);
        let hi = merged.iter().map(|s| s.hi_ns).fold(0.0, f64::max);
        if hi <= lo {
            return None;
        }
        let step = (hi / lo).ln() / BINS as f64;
        let mut grid = Grid { lo, hi, step, centers: Vec::new() };
        grid.centers = (0..BINS).map(|i| 0.5 * (grid.edge(i) + grid.edge(i + 1))).collect();
        Some(grid)
    }

    fn edge(&self, i: usize) -> f64 {
        if i >= BINS {
            self.hi
        } else {
            self.lo * (i as f64 * self.step).exp()
        }
    }

    /// The bin holding `x`, clamped to the grid.
    fn bin(&self, x: f64) -> usize {
        let at = ((x.max(self.lo) / self.lo).ln() / self.step).floor();
        (at as usize).min(BINS - 1)
    }
}

/// Shares of `weights` (at `at`, ascending) tilted by e^(λ·x) so that their mean is `mean`: the
/// distribution closest to the weights (in relative entropy) with that mean. By Newton's method
/// on λ, kept inside a bracket; to the lowest or highest weighted point if the mean lies beyond.
fn tilted(weights: &[f64], at: &[f64], mean: f64) -> Vec<f64> {
    let held = |w: &f64| *w > 0.0;
    let (Some(first), Some(last)) = (weights.iter().position(held), weights.iter().rposition(held)) else {
        // Nothing else there: spread evenly.
        return vec![1.0 / weights.len() as f64; weights.len()];
    };
    let point = |i: usize| (0..weights.len()).map(|j| if j == i { 1.0 } else { 0.0 }).collect();
    if mean <= at[first] {
        return point(first);
    }
    if mean >= at[last] {
        return point(last);
    }
    // On u = (x − lo)/(hi − lo) ∈ [0, 1], so that λ is scale-free.
    let (x0, width) = (at[first], at[last] - at[first]);
    let u: Vec<f64> = at.iter().map(|x| (x - x0) / width).collect();
    let target = (mean - x0) / width;
    let mut p = vec![0.0; weights.len()];
    let shares = |lambda: f64, p: &mut [f64]| {
        // Scaled by the largest exponent, so that none overflows.
        let top = lambda * if lambda > 0.0 { u[last] } else { u[first] };
        for (p, (&w, &u)) in p.iter_mut().zip(weights.iter().zip(&u)) {
            *p = if w > 0.0 { w * (lambda * u - top).exp() } else { 0.0 };
        }
        let total: f64 = p.iter().sum();
        p.iter_mut().for_each(|p| *p /= total);
    };
    let (mut low, mut high, mut lambda) = (-1e4, 1e4, 0.0);
    shares(lambda, &mut p);
    for _ in 0..40 {
        let m: f64 = p.iter().zip(&u).map(|(p, u)| p * u).sum();
        let var: f64 = p.iter().zip(&u).map(|(p, u)| p * (u - m) * (u - m)).sum();
        if (m - target).abs() <= 1e-9 {
            break;
        }
        if m < target {
            low = lambda;
        } else {
            high = lambda;
        }
        let newton = lambda - (m - target) / var;
        lambda = if var > 0.0 && newton > low && newton < high { newton } else { 0.5 * (low + high) };
        shares(lambda, &mut p);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(lo_ms: f64, hi_ms: f64, mean_ms: f64, count: u64, merged: bool) -> Span {
        Span { lo_ns: lo_ms * 1e6, hi_ns: hi_ms * 1e6, mean_ns: mean_ms * 1e6, count, merged, whole: false }
    }

    fn between(pieces: &[Part], lo_ms: f64, hi_ms: f64) -> f64 {
        pieces.iter().filter(|p| p.lo_ns >= lo_ms * 1e6 && p.hi_ns <= hi_ms * 1e6).map(|p| p.count).sum()
    }

    /// A merged mode of 8.0–17.0 ms holding 10 gaps of mean 11.6 ms, on a server whose other
    /// modes hold its responses at 7.5–8.5 ms and its loss-recovery tail at 16–17 ms: its gaps go
    /// to the two, 4 of them to the tail (a gap at 17 ms and a third of the other 8, which the
    /// mean sets), none to the 9–15 ms between, where a shape fitted to the mode alone puts them.
    #[test]
    fn a_merged_mode_across_a_cliff_is_placed_on_its_two_sides() {
        let spans =
            [span(7.5, 8.5, 8.0, 300, false), span(16.0, 17.0, 16.5, 20, false), span(8.0, 17.0, 11.6, 10, true)];
        let pieces = place(&spans);
        let total: f64 = pieces.iter().map(|p| p.count).sum();
        let mean: f64 = pieces.iter().map(|p| p.count * p.mean_ns).sum::<f64>() / total;
        assert!((total - 10.0).abs() < 1e-9, "{total}");
        assert!((mean / 11.6e6 - 1.0).abs() < 0.005, "mean {mean}");
        assert!(between(&pieces, 9.0, 15.0) < 0.05, "{pieces:?}");
        let tail = between(&pieces, 15.0, 17.0);
        assert!((tail - 4.0).abs() < 0.3, "tail {tail}");
    }

    /// Alone, a merged mode keeps its count and mean, and its bounds.
    #[test]
    fn a_merged_mode_alone_keeps_its_count_mean_and_bounds() {
        let pieces = place(&[span(2.0, 6.0, 3.0, 50, true)]);
        let total: f64 = pieces.iter().map(|p| p.count).sum();
        let mean: f64 = pieces.iter().map(|p| p.count * p.mean_ns).sum::<f64>() / total;
        assert!((total - 50.0).abs() < 1e-9 && (mean / 3.0e6 - 1.0).abs() < 0.005, "{total} {mean}");
        assert!(pieces[0].lo_ns == 2.0e6 && (pieces.last().unwrap().hi_ns / 6.0e6 - 1.0).abs() < 1e-12);
        assert!(place(&[span(2.0, 6.0, 3.0, 50, false)]).is_empty());
        // A mode only one of whose gaps ends batches (acknowledgement marks): that one, at its mean.
        let one = place(&[span(2.0, 6.0, 3.0, 1, true)]);
        assert!(one.len() == 1 && one[0].count == 1.0 && one[0].lo_ns <= 3.0e6 && one[0].hi_ns > 3.0e6, "{one:?}");
    }

    #[test]
    fn tilting_keeps_the_mean_or_goes_to_an_end() {
        let at = [1.0, 2.0, 3.0, 4.0];
        for mean in [1.2, 2.5, 3.9] {
            let p = tilted(&[1.0, 0.0, 2.0, 1.0], &at, mean);
            let m: f64 = p.iter().zip(&at).map(|(p, x)| p * x).sum();
            assert!((m - mean).abs() < 1e-6 && p[1] == 0.0, "{p:?}");
        }
        assert_eq!(tilted(&[0.0, 1.0, 1.0, 0.0], &at, 1.5), [0.0, 1.0, 0.0, 0.0]);
        assert_eq!(tilted(&[0.0, 1.0, 1.0, 0.0], &at, 3.5), [0.0, 0.0, 1.0, 0.0]);
    }
}
