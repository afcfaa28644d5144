//! The break between a flow's intra-batch gaps (a client's own pacing, µs to about a reordering
//! delay) and its inter-batch gaps (a round trip plus the server's time), found in its modes.
//! pirated's batches estimator counts every gap above it as the end of a batch; the datapath's
//! Alg. 1 takes the break of a flow's previous epoch as its δ, so that δ needs no tuning.

use super::modes::Modes;

/// What makes a break: the highest one between significant modes whose means are at least
/// `min_ratio` apart and whose lower mean is short enough to be pacing. The highest, not the
/// widest: reordering by Δ stretches some intra-batch gaps from µs to ~Δ, into a mode whose
/// break from the µs ones can be wider than its break from the inter-batch gaps, yet those gaps
/// are still inside batches. Means, not extremes: the extremes drift apart as an epoch collects
/// gaps. Integers (fixed point), as the datapath has no floating point.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakRules {
    /// The longest mean gap of a mode that can still be pacing inside a batch (below the idle
    /// floor, which is at most 4 s: a `u32`).
    pub intra_batch_max_ns: u32,
    /// The upper mode's mean must be at least `min_ratio_q10 / 2^10` times the lower one's.
    pub min_ratio_q10: u32,
    /// Modes holding less than `min_share_q20 / 2^20` of the gaps below the idle floor are not
    /// sides of a break, but for the first mode above the last significant one, so that a few
    /// long batches after many short gaps still form a break; that one must also stand
    /// `min_ratio` clear of the significant mode's longest gap, or it is that mode's tail.
    pub min_share_q20: u32,
    /// A significant mode holding less than `straggler_share_q20 / 2^20` of the gaps, less than
    /// `min_ratio` above the lower side, is a straggler (a busy client's late writes): the lower
    /// side stays, and a break above it puts it on the lower side. Otherwise it would sit between
    /// pacing and responses, less than `min_ratio` from either, and hide the break.
    pub straggler_share_q20: u32,
}

impl BreakRules {
    /// Whether a mode of `count` gaps out of `total` is significant.
    #[inline(always)]
    pub fn significant(&self, count: u64, total: u64) -> bool {
        (count << 20) >= self.min_share_q20 as u64 * total
    }

    /// Whether a mode of `count` gaps out of `total` is thin enough to be a straggler.
    #[inline(always)]
    pub fn straggler(&self, count: u64, total: u64) -> bool {
        (count << 20) < self.straggler_share_q20 as u64 * total
    }
}

/// Read access to ascending, disjoint modes: the datapath's arrays and pirated's records.
pub trait ModeView {
    /// How many modes there are.
    fn modes(&self) -> usize;
    fn count(&self, i: usize) -> u64;
    fn mean_ns(&self, i: usize) -> u64;
    fn min_ns(&self, i: usize) -> u64;
    fn max_ns(&self, i: usize) -> u64;
}

impl<const M: usize> ModeView for Modes<M> {
    fn modes(&self) -> usize {
        self.used()
    }
    fn count(&self, i: usize) -> u64 {
        if i < M {
            self.count[i] as u64
        } else {
            0
        }
    }
    fn mean_ns(&self, i: usize) -> u64 {
        Modes::mean_ns(self, i)
    }
    fn min_ns(&self, i: usize) -> u64 {
        self.bounds(i).0 as u64
    }
    fn max_ns(&self, i: usize) -> u64 {
        self.bounds(i).1 as u64
    }
}

/// Modes `0..kept` lie below the idle floor (by mean; modes are ascending, so it is a prefix);
/// `LIMIT` bounds the loop for the verifier.
pub fn kept<V: ModeView, const LIMIT: usize>(v: &V, idle_floor_ns: u64) -> usize {
    let len = v.modes();
    for i in 0..LIMIT {
        if i >= len || v.mean_ns(i) >= idle_floor_ns {
            return i;
        }
    }
    len.min(LIMIT)
}

/// Gaps in modes `0..kept`.
pub fn gaps<V: ModeView, const LIMIT: usize>(v: &V, kept: usize) -> u64 {
    let mut total = 0u64;
    for i in 0..LIMIT {
        if i >= kept {
            break;
        }
        total += v.count(i);
    }
    total
}

/// Where a break lies: between the lower side's longest gap and the upper side's shortest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Break {
    pub lower_max_ns: u64,
    pub upper_min_ns: u64,
}

/// The break among modes `0..kept`, which hold `total` gaps ([`gaps`]), or `None`: every gap
/// ends a batch. Modes are taken as they come: pirated's estimators pass the chains of
/// span-capped modes (Alg. 2's own modes), while the datapath's δ reads its capped modes as they
/// are (chaining them here, or bounding the loop by the idle floor instead of `kept`, costs the
/// verifier more than its million-instruction budget). One pass over data-valued state (no indices),
/// so that the verifier's state pruning keeps the datapath's copy small; `LIMIT` (≥ the number
/// of modes) bounds the loop.
pub fn find<V: ModeView, const LIMIT: usize>(v: &V, kept: usize, total: u64, r: &BreakRules) -> Option<Break> {
    // The lower side: the last significant mode that is not a straggler, if any. A flag, not a
    // sentinel mean: comparing a mean with a constant it can never reach lets the verifier
    // decide the branch, which marks the mean precise and stops it pruning states that differ
    // in it.
    let (mut lower_mean, mut has_lower) = (0u64, false);
    // The longest gap of the mode before this one.
    let mut prev_max = 0u64;
    // The highest break between significant modes, and one between the last significant mode
    // and the rare mode just above it (valid only while no significant mode follows).
    let (mut found, mut above_top) = (None, None);
    let mut after_significant = false;
    for i in 0..LIMIT {
        if i >= kept {
            break;
        }
        let count = v.count(i);
        // Judged once and kept: LLVM would otherwise compare again where it is used, and the
        // verifier, finding the repeat decided, marks the counts precise and stops pruning
        // states that differ in them (its walk of this loop grows several times over).
        let significant = core::hint::black_box(r.significant(count, total));
        if significant || after_significant {
            let mean = v.mean_ns(i);
            let qualifies = has_lower
                && lower_mean <= r.intra_batch_max_ns as u64
                && (mean << 10) >= r.min_ratio_q10 as u64 * lower_mean;
            // Stragglers below the upper side fall on the lower side.
            let here = Break { lower_max_ns: prev_max, upper_min_ns: v.min_ns(i) };
            if significant {
                if qualifies {
                    found = Some(here);
                }
                above_top = None;
                if qualifies || !has_lower || !r.straggler(count, total) {
                    lower_mean = mean;
                    has_lower = true;
                }
            } else if qualifies && (v.min_ns(i) << 10) >= r.min_ratio_q10 as u64 * prev_max {
                above_top = Some(here);
            }
        }
        prev_max = v.max_ns(i);
        after_significant = significant;
    }
    above_top.or(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Modes of (min, max, mean µs, count).
    struct Plain(Vec<(u64, u64, u64, u64)>);

    impl Plain {
        /// Modes of (mean µs, count), each 10 % wide.
        fn narrow(modes: &[(u64, u64)]) -> Plain {
            Plain(modes.iter().map(|&(mean, n)| (mean * 9 / 10, mean * 11 / 10, mean, n)).collect())
        }
    }

    impl ModeView for Plain {
        fn modes(&self) -> usize {
            self.0.len()
        }
        fn count(&self, i: usize) -> u64 {
            self.0[i].3
        }
        fn mean_ns(&self, i: usize) -> u64 {
            self.0[i].2 * 1000
        }
        fn min_ns(&self, i: usize) -> u64 {
            self.0[i].0 * 1000
        }
        fn max_ns(&self, i: usize) -> u64 {
            self.0[i].1 * 1000
        }
    }

    const RULES: BreakRules = BreakRules {
        intra_batch_max_ns: 2_000_000,
        min_ratio_q10: 3 << 10,
        min_share_q20: (1 << 20) / 50,
        straggler_share_q20: (1 << 20) / 20,
    };

    /// The break as (lower, upper) mode indices.
    fn find_in(modes: &'static [(u64, u64)]) -> Option<(usize, usize)> {
        let v = Plain::narrow(modes);
        let k = kept::<_, 16>(&v, 200_000_000);
        let b = find::<_, 16>(&v, k, gaps::<_, 16>(&v, k), &RULES)?;
        let index = |ns: u64| (0..modes.len()).find(|&i| v.max_ns(i) == ns || v.min_ns(i) == ns).unwrap();
        Some((index(b.lower_max_ns), index(b.upper_min_ns)))
    }

    #[test]
    fn the_highest_qualifying_break_wins() {
        // µs pacing, reorder-stretched ~1 ms gaps, inter-batch gaps at 5 ms.
        assert_eq!(find_in(&[(38, 84), (979, 29), (5_332, 127)]), Some((1, 2)));
        // One request in flight at varying service times: no pair 3× apart.
        assert_eq!(find_in(&[(2_100, 50), (5_100, 30), (10_100, 20), (20_100, 10)]), None);
        // A lower side too long to be pacing.
        assert_eq!(find_in(&[(2_500, 50), (9_000, 30)]), None);
    }

    #[test]
    fn rare_modes_are_not_sides_except_just_above_the_top() {
        // A lone 2 ms gap between the pacing and the responses does not bridge the break: it
        // falls on the lower side.
        assert_eq!(find_in(&[(300, 90), (2_031, 1), (6_000, 170)]), Some((1, 2)));
        // Few batches after many short gaps: the first mode above the top significant one.
        assert_eq!(find_in(&[(20, 400), (5_000, 3), (9_000, 1)]), Some((0, 1)));
        // But not a rare mode above a significant one that is not the top.
        assert_eq!(find_in(&[(20, 400), (100, 3), (1_500, 100), (2_500, 100)]), Some((1, 2)));
        // Nor the tail of a wide top mode (1.09–4.42 ms, mean 1.37 ms) just above it.
        let tail = Plain(vec![(1_090, 4_420, 1_370, 2_842), (4_920, 5_330, 5_120, 4), (5_850, 6_030, 5_960, 3)]);
        let k = kept::<_, 16>(&tail, 200_000_000);
        assert_eq!(find::<_, 16>(&tail, k, gaps::<_, 16>(&tail, k), &RULES), None);
    }

    #[test]
    fn stragglers_between_the_sides_do_not_hide_the_break() {
        // A busy client (one core, 1 % loss, 25 % reordering): µs pacing, reorder-stretched
        // 1 ms gaps, 2.6 % of the gaps at 2.2–4.2 ms, responses from 4.5 ms. Adjacent modes
        // are 2.7× and 1.7× apart; the break is below the responses.
        let busy = &[(95, 41), (1_080, 12), (2_900, 4), (4_900, 9), (5_800, 26), (7_400, 31), (9_300, 20)];
        assert_eq!(find_in(busy), Some((2, 3)));
        // A thin mode 3× above the lower side is no straggler: reorder-stretched pacing.
        assert_eq!(find_in(&[(40, 160), (1_000, 6), (5_300, 34)]), Some((1, 2)));
        assert_eq!(find_in(&[(40, 90), (1_000, 3), (2_900, 3), (5_300, 4)]), Some((2, 3)));
        // A dense mode less than 3× above the lower side is the lower side itself (here too
        // long to be pacing: no break above it).
        assert_eq!(find_in(&[(40, 70), (1_000, 10), (2_900, 10), (5_300, 10)]), Some((0, 1)));
        // The first significant mode is the lower side whatever its share.
        assert_eq!(find_in(&[(40, 3), (5_300, 97)]), Some((0, 1)));
    }

    #[test]
    fn idle_modes_are_left_out() {
        let v = Plain::narrow(&[(20, 100), (5_000, 50), (300_000, 5)]);
        assert_eq!(kept::<_, 16>(&v, 200_000_000), 2);
        assert_eq!(find_in(&[(300_000, 5)]), None);
        assert_eq!(find_in(&[]), None);
    }
}
