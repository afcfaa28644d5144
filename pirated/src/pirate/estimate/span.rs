//! A server's batch-ending gaps as the quantiles read them: a span per mode (its bounds, mean
//! and count), and parts (some of a span's gaps, or a piece of merged ones, placed where they
//! lie). What `quantile` and `merged` share.

/// Batch-to-batch times of one mode of batch-ending gaps: `count` of them in [lo, hi], mean `mean`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Span {
    pub lo_ns: f64,
    pub hi_ns: f64,
    pub mean_ns: f64,
    pub count: u64,
    /// Wider than the span cap: two or more modes a full table merged.
    pub merged: bool,
    /// Every gap of its mode ends a batch, so `lo` and `hi` are two of them.
    pub whole: bool,
}

impl Span {
    /// The mean of its gaps but the two at its bounds, within them (its mean with two or fewer).
    pub(super) fn inner_mean_ns(&self) -> f64 {
        let n = self.count as f64;
        let mean = if self.count > 2 { (n * self.mean_ns - self.lo_ns - self.hi_ns) / (n - 2.0) } else { self.mean_ns };
        mean.clamp(self.lo_ns, self.hi_ns)
    }
}

/// Some of a server's gaps, spread over [lo, hi] with mean `mean`: a span, or a piece of merged
/// ones.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Part {
    pub lo_ns: f64,
    pub hi_ns: f64,
    pub mean_ns: f64,
    pub count: f64,
}

impl Part {
    /// An unmerged span's gaps. A whole mode's min and max are gaps of it, and its mean fixes the
    /// others' mean, so up to three are exact: the tail of a server's responses lies in few-gap
    /// modes, each about 2ε (10 %) wide, where p99 falls.
    pub(super) fn within(s: &Span) -> impl Iterator<Item = Part> {
        let at = |x: f64, count: f64| Part { lo_ns: x, hi_ns: x, mean_ns: x, count };
        let n = s.count as f64;
        let parts = if !s.whole || s.count == 0 {
            [Some(Part { lo_ns: s.lo_ns, hi_ns: s.hi_ns, mean_ns: s.mean_ns, count: n }), None, None]
        } else if s.count == 1 || s.hi_ns <= s.lo_ns {
            [Some(at(s.mean_ns, n)), None, None]
        } else {
            let rest = (s.count > 2).then(|| {
                let mean_ns = s.inner_mean_ns();
                if s.count == 3 {
                    at(mean_ns, 1.0)
                } else {
                    Part { lo_ns: s.lo_ns, hi_ns: s.hi_ns, mean_ns, count: n - 2.0 }
                }
            });
            [Some(at(s.lo_ns, 1.0)), Some(at(s.hi_ns, 1.0)), rest]
        };
        parts.into_iter().flatten()
    }
}
