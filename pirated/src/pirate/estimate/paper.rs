//! Pirate's proportional mode sum (§3.3): the inter-batch gap (IBG) is the largest de-noised
//! mode, and the mean response latency is Σ_{m_i ≤ IBG} Pr(m_i)/Pr(IBG)·m_i — the total of
//! the gaps up to the IBG over the number of IBG gaps (batches).

use super::figure::{Ends, FlowEstimate};
use crate::pirate::flow::Mode;

/// De-noising and heuristics that apply at estimation time.
#[derive(Clone, Copy, Debug)]
pub struct Denoise {
    /// Modes whose mean is at or above this are retransmission timeouts or idle periods.
    pub idle_floor_ns: u64,
    /// Modes holding less than this share of the epoch's gaps cannot be the IBG: one outlier
    /// gap above the real IBG would otherwise multiply the estimate.
    pub min_mode_share: f64,
    /// Nor can modes holding less than this share of the time the epoch's gaps span: the IBG
    /// is where a request-response flow spends its time, outliers are not.
    pub min_time_share: f64,
    /// Prefer modes with gaps that followed a non-full-size packet as the IBG (§3.4).
    pub prefer_candidates: bool,
    /// Prefer modes of at least this many gaps as the IBG: a lone gap above the rest is a
    /// hiccup far more often than the only batch boundary. 1 is the paper's rule.
    pub min_ibg_gaps: u64,
}

/// The proportional mode sum of one flow's modes (ascending), or `None` if no mode qualifies.
pub fn proportional_mode_sum(modes: &[Mode], d: &Denoise) -> Option<FlowEstimate> {
    let total: u64 = modes.iter().map(|m| m.count as u64).sum();
    if total == 0 {
        return None;
    }
    let below_floor = |m: &Mode| m.mean_ns() < d.idle_floor_ns as f64;
    let time: u64 = modes.iter().filter(|m| below_floor(m)).map(|m| m.sum_ns).sum();
    let qualifies = |m: &Mode| {
        below_floor(m)
            && m.count as f64 >= d.min_mode_share * total as f64
            && m.sum_ns as f64 >= d.min_time_share * time as f64
    };
    // The IBG is the largest qualifying mode whose estimate is itself a response latency (below
    // the idle floor: a mode of outlier gaps above the real IBG would otherwise make the epoch one
    // "batch"), preferring modes with candidate gaps (if asked) and modes of `min_ibg_gaps`.
    let pick = |need_candidates: bool, min_count: u64| {
        let eligible = |i: &usize| {
            let m = &modes[*i];
            qualifies(m) && m.count as u64 >= min_count && (!need_candidates || m.candidates > 0)
        };
        (0..modes.len()).rev().filter(eligible).find_map(|ibg| {
            let kept_ns: u64 = modes[..=ibg].iter().map(|m| m.sum_ns).sum();
            let batches = modes[ibg].count as u64;
            let estimate_ns = kept_ns as f64 / batches as f64;
            (estimate_ns < d.idle_floor_ns as f64).then_some(FlowEstimate {
                estimate_ns,
                batches,
                kept_ns,
                ends: Ends::all(ibg..ibg + 1),
            })
        })
    };
    [(true, d.min_ibg_gaps), (false, d.min_ibg_gaps), (true, 1), (false, 1)]
        .into_iter()
        .filter(|(need_candidates, _)| d.prefer_candidates || !need_candidates)
        .find_map(|(need_candidates, min_count)| pick(need_candidates, min_count))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(mean_us: u32, count: u32, candidates: u32) -> Mode {
        let ns = mean_us * 1000;
        Mode { min_ns: ns, max_ns: ns, count, candidates, sum_ns: ns as u64 * count as u64 }
    }

    const PLAIN: Denoise = Denoise {
        idle_floor_ns: 200_000_000,
        min_mode_share: 0.0,
        min_time_share: 0.0,
        prefer_candidates: false,
        min_ibg_gaps: 1,
    };

    #[test]
    fn papers_example_gives_950us() {
        // §3.3: modes 100/150/250 µs with probabilities 0.4/0.2/0.1.
        let modes = [mode(100, 4, 0), mode(150, 2, 0), mode(250, 1, 0)];
        let est = proportional_mode_sum(&modes, &PLAIN).unwrap();
        assert_eq!(est.estimate_ns, 950_000.0);
        assert_eq!(est.batches, 1);
    }

    #[test]
    fn idle_and_rare_modes_are_not_the_ibg() {
        let modes = [mode(100, 40, 0), mode(5_000, 10, 0), mode(9_000, 1, 0), mode(300_000, 3, 0)];
        // The idle mode (300 ms) is above the floor; the 9 ms outlier is 1/54 of the gaps.
        let d = Denoise { min_mode_share: 0.05, ..PLAIN };
        let est = proportional_mode_sum(&modes, &d).unwrap();
        assert_eq!(est.batches, 10);
        assert_eq!(est.estimate_ns, (40.0 * 100_000.0 + 10.0 * 5_000_000.0) / 10.0);
        // Without the share rule the outlier is taken as the IBG and inflates the estimate.
        let naive = proportional_mode_sum(&modes, &PLAIN).unwrap();
        assert!(naive.estimate_ns > 5.0 * est.estimate_ns);
    }

    #[test]
    fn an_outlier_mode_that_would_make_the_epoch_one_batch_is_not_the_ibg() {
        // 48 gaps of 10 ms and two of 10.6 ms, 4 % of the gaps: taken as the IBG they would give
        // two 250 ms "responses", above the 200 ms floor.
        let modes = [mode(10_000, 48, 48), mode(10_600, 2, 2)];
        let d = Denoise { min_mode_share: 0.02, min_ibg_gaps: 2, ..PLAIN };
        let est = proportional_mode_sum(&modes, &d).unwrap();
        assert_eq!((est.batches, est.estimate_ns), (48, 10_000_000.0));
        // A lone outlier gap is passed over even where its estimate would look plausible.
        let modes = [mode(1_000, 14, 14), mode(1_900, 1, 1)];
        let est = proportional_mode_sum(&modes, &d).unwrap();
        assert_eq!((est.batches, est.estimate_ns), (14, 1_000_000.0));
        // …but a single gap is an estimate when it is all there is.
        assert_eq!(proportional_mode_sum(&[mode(1_900, 1, 1)], &d).unwrap().estimate_ns, 1_900_000.0);
    }

    #[test]
    fn modes_where_little_time_is_spent_are_not_the_ibg() {
        // 430 one-in-flight gaps of 2.2 ms and a mode of 9 gaps at 3.4 ms (2 % of the gaps,
        // 3 % of the time): taken as the IBG it would give 110 ms, under the idle floor.
        let modes = [mode(2_200, 430, 430), mode(3_400, 9, 9)];
        let count_only = Denoise { min_mode_share: 0.02, min_ibg_gaps: 2, ..PLAIN };
        assert_eq!(proportional_mode_sum(&modes, &count_only).unwrap().batches, 9);
        let d = Denoise { min_time_share: 0.1, ..count_only };
        let est = proportional_mode_sum(&modes, &d).unwrap();
        assert_eq!((est.batches, est.estimate_ns), (430, 2_200_000.0));
    }

    #[test]
    fn candidates_pick_the_ibg_when_preferred() {
        // Largest mode never follows a short packet: it is a gap inside a batch of full segments.
        let modes = [mode(100, 20, 0), mode(2_000, 10, 10), mode(3_000, 10, 0)];
        let d = Denoise { prefer_candidates: true, ..PLAIN };
        let est = proportional_mode_sum(&modes, &d).unwrap();
        assert_eq!(est.batches, 10);
        assert_eq!(est.kept_ns, 20 * 100_000 + 10 * 2_000_000);
        assert_eq!(
            proportional_mode_sum(&modes, &PLAIN).unwrap().kept_ns,
            20 * 100_000 + 10 * 2_000_000 + 10 * 3_000_000
        );
    }

    #[test]
    fn nothing_to_estimate() {
        assert!(proportional_mode_sum(&[], &PLAIN).is_none());
        assert!(proportional_mode_sum(&[mode(500_000, 3, 3)], &PLAIN).is_none());
    }
}
