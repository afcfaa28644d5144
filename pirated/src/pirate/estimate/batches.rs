//! The batch-count estimator. The paper's estimator counts batches as the gaps of one mode, the
//! largest: right while every batch ends in a gap of that mode, badly wrong when service times
//! vary within an epoch (batches then end in gaps of several modes, and all but the largest are
//! taken for time inside batches), or when reordering splits the inter-batch gaps.
//!
//! Here every gap above the break between intra- and inter-batch gaps ends a batch, so the mean
//! time between batch starts is the epoch's gap time over the number of such gaps. Intra-batch
//! gaps are the client's own pacing (microseconds to a fraction of a millisecond); inter-batch
//! gaps carry a network round trip and the server's time. The break is found in the chains of
//! modes as `pirate_common::pirate::batch_break` says (the datapath's adaptive δ applies the same rules
//! to its modes unchained); with none (one request in flight) every gap ends a batch. Modes
//! holding few of the gaps (a late packet, two reordered ones) are not sides of the break, so
//! that they do not bridge it; their gaps still count on whichever side they fall.

use pirate_common::{
    pirate::batch_break::{self, BreakRules},
    pirate::config::MODES_WIDE,
};

use super::figure::{Ends, FlowEstimate};
use crate::pirate::flow::{Mode, ModeSlice};

#[derive(Clone, Copy, Debug)]
pub struct Break {
    /// Gaps (modes) at or above this are idle periods or retransmission timeouts: left out.
    pub idle_floor_ns: u64,
    pub rules: BreakRules,
    /// The gaps above a found break must hold at least this share of the time: a flow spends
    /// its time waiting for responses, not pacing, so a few noisy gaps above a server's responses
    /// are not taken for the responses, and the responses for pacing. Checked here, not by the
    /// datapath's δ, which has no verifier budget left for it.
    pub min_upper_time_share: f64,
    /// A fixed break instead of one found in the modes: modes starting at or above it end batches.
    pub fixed_ns: Option<u64>,
}

/// The mean time between batch starts over one flow's chains of modes (ascending,
/// [`super::chains::Chains`]), or `None` without gaps.
///
/// Every gap above the break ends a batch, rare long ones too: with retransmissions out of the
/// gap stream, a batch that waited for a retransmitted request is one long gap, not time inside
/// a batch.
pub fn batch_count_mean(chains: &[Mode], b: &Break) -> Option<FlowEstimate> {
    with_break(chains, b).0
}

/// [`batch_count_mean`], and whether the modes showed a break between intra- and inter-batch
/// gaps (a fixed one counts).
pub fn with_break(modes: &[Mode], b: &Break) -> (Option<FlowEstimate>, bool) {
    let kept = kept(modes, b);
    let total = batch_break::gaps::<_, MODES_WIDE>(&ModeSlice(kept), kept.len());
    let threshold = break_at(kept, total, b);
    let first = kept.partition_point(|m| (m.min_ns as u64) < threshold);
    (estimate(kept, Ends::all(first..kept.len())), threshold > 0)
}

/// The mean time between batch starts when the modes' marks say which gaps held a response:
/// gaps across which the client's acknowledgement number advanced (TCP, `mark_acked`), whatever
/// their length. Read off the modes as they are: marks need no break.
pub fn marked(modes: &[Mode], b: &Break) -> Option<FlowEstimate> {
    let kept = kept(modes, b);
    estimate(kept, Ends::marked(kept))
}

/// The mean time between batch starts with every mode that reaches `floor_ns` ending batches:
/// where no response comes back sooner (the handshake's round trip, one request in flight), the
/// gaps wholly below it are the client's pacing, whatever break the modes alone show.
pub fn from_floor(modes: &[Mode], b: &Break, floor_ns: f64) -> Option<FlowEstimate> {
    let kept = kept(modes, b);
    let first = kept.partition_point(|m| (m.max_ns as f64) < floor_ns);
    estimate(kept, Ends::all(first..kept.len()))
}

/// A multiplexed flow's estimate, [`half_latency`], and what bounds its error.
#[derive(Clone, Copy, Debug)]
pub struct Halves {
    pub estimate: FlowEstimate,
    /// The share of the kept time in gaps from [`SHORT_FROM`] of the estimate to half of it: the
    /// estimate is at most `short / (1 − short)` too high.
    pub short: f64,
    /// Batch ends below [`LONGER_HALF_BELOW`] of the estimate in excess of the short gaps, over
    /// the batches: the longer half of a split cycle has its shorter half among the short gaps,
    /// while two batch ends in one cycle (the estimate too low) have none.
    pub unpaired: f64,
    /// The share of the kept time in gaps of [`LONG_FROM`] times the estimate or more: no wait
    /// outlasts the latency by much, so such gaps say the estimate is a fraction of it (a cycle
    /// split three ways or more, its groups meeting now and then in one wait of a latency).
    pub long: f64,
}

/// The mean time between batch starts of a flow whose streams are multiplexed on its connection.
///
/// Streams fall into groups: in step, one cycle of them is one wait of a latency `L`; two groups
/// out of step split it into two gaps, `x` and `L − x`. Either way exactly one gap of each cycle
/// is at least `L/2`, so the estimate is the largest `e` for which the kept time over the gaps of
/// the modes whose mean is at least `e/2` is `e` itself. A cycle split three ways or more may
/// have no such gap and go uncounted, its time held by its shorter gaps ([`Halves::short`]); a
/// cycle split near its middle may have two ([`Halves::unpaired`]).
pub fn half_latency(modes: &[Mode], b: &Break) -> Option<Halves> {
    let kept = kept(modes, b);
    let time = kept.iter().map(|m| m.sum_ns).sum::<u64>() as f64;
    let mut gaps = 0u64;
    let first = (0..kept.len()).rev().find(|&i| {
        gaps += kept[i].count as u64;
        let half = time / gaps as f64 / 2.0;
        kept[i].mean_ns() >= half && (i == 0 || kept[i - 1].mean_ns() < half)
    })?;
    let estimate = estimate(kept, Ends::all(first..kept.len()))?;
    let short_from = SHORT_FROM * estimate.estimate_ns;
    let short = kept[..first].iter().filter(|m| m.mean_ns() >= short_from);
    let (short_ns, short_gaps) = short.fold((0, 0), |(t, n), m| (t + m.sum_ns, n + m.count as u64));
    let longer = kept[first..].iter().filter(|m| m.mean_ns() < LONGER_HALF_BELOW * estimate.estimate_ns);
    let longer_gaps = longer.map(|m| m.count as u64).sum::<u64>();
    let long = kept.iter().filter(|m| m.mean_ns() >= LONG_FROM * estimate.estimate_ns);
    let long_ns = long.map(|m| m.sum_ns).sum::<u64>();
    Some(Halves {
        estimate,
        short: short_ns as f64 / time,
        unpaired: longer_gaps.saturating_sub(short_gaps) as f64 / estimate.batches as f64,
        long: long_ns as f64 / time,
    })
}

/// Gaps shorter than this share of a multiplexed flow's latency are its client's pacing inside a
/// burst of requests, not parts of a cycle split between groups of streams.
const SHORT_FROM: f64 = 0.1;

/// Batch ends of a multiplexed flow shorter than this share of its latency are the longer halves
/// of split cycles (or two halves of one): streams in step wait about the latency itself.
const LONGER_HALF_BELOW: f64 = 0.8;

/// Gaps this many times a multiplexed flow's estimate or more are longer than any of its waits
/// should be: the modes of flows whose figure was right reach it by chance only.
const LONG_FROM: f64 = 1.5;

/// The modes below the idle floor.
fn kept<'a>(modes: &'a [Mode], b: &Break) -> &'a [Mode] {
    &modes[..batch_break::kept::<_, MODES_WIDE>(&ModeSlice(modes), b.idle_floor_ns)]
}

fn estimate(kept: &[Mode], ends: Ends) -> Option<FlowEstimate> {
    let batches: u64 = ends.of(kept).map(|e| e.1).sum();
    let kept_ns: u64 = kept.iter().map(|m| m.sum_ns).sum();
    (batches > 0).then(|| FlowEstimate { estimate_ns: kept_ns as f64 / batches as f64, batches, kept_ns, ends })
}

/// The shortest gap that ends a batch: the configured one, or where the break found in the
/// modes ends (0: every gap ends a batch).
fn break_at(kept: &[Mode], total: u64, b: &Break) -> u64 {
    if let Some(fixed) = b.fixed_ns {
        return fixed;
    }
    let found = batch_break::find::<_, MODES_WIDE>(&ModeSlice(kept), kept.len(), total, &b.rules);
    let time = |modes: &[Mode]| modes.iter().map(|m| m.sum_ns).sum::<u64>() as f64;
    let holds = |at: u64| {
        time(&kept[kept.partition_point(|m| (m.min_ns as u64) < at)..]) >= b.min_upper_time_share * time(kept)
    };
    found.map(|b| b.upper_min_ns).filter(|&at| holds(at)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(mean_us: f64, spread: f64, count: u32) -> Mode {
        let ns = mean_us * 1000.0;
        let (min_ns, max_ns) = ((ns * (1.0 - spread)) as u32, (ns * (1.0 + spread)) as u32);
        Mode::all_marked(min_ns, max_ns, count, (ns * count as f64) as u64)
    }

    const BREAK: Break = Break {
        idle_floor_ns: 200_000_000,
        rules: BreakRules {
            intra_batch_max_ns: 2_000_000,
            min_ratio_q10: 3 << 10,
            min_share_q20: (1 << 20) / 50,
            straggler_share_q20: (1 << 20) / 20,
        },
        min_upper_time_share: 0.25,
        fixed_ns: None,
    };

    #[test]
    fn marked_gaps_are_the_batch_ends_whatever_their_length() {
        // 30 sequential requests to a fast server (~210 µs) and the 3.5 ms handshake gap: the
        // break would take the responses for pacing; the acknowledgement marks do not.
        let mut fast = mode(211.0, 0.5, 30);
        let mut slow = mode(3_500.0, 0.0, 1);
        assert_eq!(batch_count_mean(&[fast, slow], &BREAK).unwrap().batches, 1);
        let est = marked(&[fast, slow], &BREAK).unwrap();
        let ends = |est: FlowEstimate, modes: &[Mode]| est.ends.of(modes).collect::<Vec<_>>();
        assert_eq!((est.batches, ends(est, &[fast, slow])), (31, vec![(0, 30), (1, 1)]));
        // Pipelined requests (unmarked) inside a mode of responses count as time only.
        fast.candidates = 10;
        slow.candidates = 0;
        let est = marked(&[fast, slow], &BREAK).unwrap();
        assert_eq!((est.batches, ends(est, &[fast, slow])), (10, vec![(0, 10)]));
    }

    #[test]
    fn varying_service_times_all_end_batches() {
        // One request in flight, service times of 2, 5 and 20 ms: every gap is a batch.
        let modes = [mode(2_100.0, 0.02, 50), mode(5_100.0, 0.02, 30), mode(20_100.0, 0.02, 20)];
        let est = batch_count_mean(&modes, &BREAK).unwrap();
        assert_eq!(est.batches, 100);
        let truth = (50.0 * 2.1 + 30.0 * 5.1 + 20.0 * 20.1) / 100.0 * 1e6;
        assert!((est.estimate_ns - truth).abs() < 1.0, "{} vs {truth}", est.estimate_ns);
    }

    #[test]
    fn intra_batch_gaps_are_time_not_batches() {
        // Batches of four requests 20 µs apart, batches every ~5 ms (split by reordering).
        let modes = [mode(20.0, 0.5, 300), mode(4_000.0, 0.02, 25), mode(5_000.0, 0.02, 50), mode(6_000.0, 0.02, 25)];
        let est = batch_count_mean(&modes, &BREAK).unwrap();
        assert_eq!(est.batches, 100);
        let truth = (300.0 * 0.02 + 25.0 * 4.0 + 50.0 * 5.0 + 25.0 * 6.0) / 100.0 * 1e6;
        assert!((est.estimate_ns - truth).abs() < 1.0);
    }

    #[test]
    fn idle_gaps_are_left_out_and_empty_flows_have_no_estimate() {
        let modes = [mode(5_000.0, 0.02, 10), mode(900_000.0, 0.0, 2)];
        let est = batch_count_mean(&modes, &BREAK).unwrap();
        assert_eq!((est.batches, est.estimate_ns), (10, 5_000_000.0));
        assert!(batch_count_mean(&[], &BREAK).is_none());
        assert!(batch_count_mean(&[mode(900_000.0, 0.0, 2)], &BREAK).is_none());
    }

    #[test]
    fn rare_modes_do_not_bridge_the_break() {
        // Reordering spreads some intra-batch gaps to ~1 ms and leaves a lone 2 ms gap between
        // them and the inter-batch gaps from 4 ms: still one break, below 4 ms.
        let modes = [mode(300.0, 0.98, 90), mode(1_000.0, 0.2, 35), mode(2_031.0, 0.0, 1), mode(6_000.0, 0.3, 170)];
        let est = batch_count_mean(&modes, &BREAK).unwrap();
        assert_eq!(est.batches, 170);
        // Even counted as significant, the lone gap is a straggler (thin, less than 3× above the
        // 1 ms mode): the break stays below 6 ms. Were it the lower side, there would be no
        // break 3× wide below 6 ms, the highest left would be below 1 ms, and the reordered
        // gaps would become batches (206).
        let all = Break { rules: BreakRules { min_share_q20: 0, ..BREAK.rules }, ..BREAK };
        assert_eq!(batch_count_mean(&modes, &all).unwrap().batches, 170);
        let no_stragglers = BreakRules { min_share_q20: 0, straggler_share_q20: 0, ..BREAK.rules };
        assert_eq!(batch_count_mean(&modes, &Break { rules: no_stragglers, ..BREAK }).unwrap().batches, 206);
    }

    #[test]
    fn gaps_stretched_by_reordering_stay_inside_batches() {
        // Web-like batches, 25 % of packets 1 ms early: intra-batch gaps of tens of µs and of
        // ~1 ms (a batch's first request early), inter-batch gaps of 4–8 ms.
        let modes = [mode(38.0, 0.8, 84), mode(979.0, 0.15, 29), mode(5_332.0, 0.3, 127)];
        assert_eq!(batch_count_mean(&modes, &BREAK).unwrap().batches, 127);
    }

    #[test]
    fn a_long_epoch_keeps_its_break() {
        // Five seconds of web-like traffic with reordering: the intra-batch mode's maximum and
        // the inter-batch mode's minimum are less than 3× apart, their means 16× apart.
        let modes = [
            Mode::all_marked(6_000, 1_335_000, 579, 199_176_000),
            Mode::all_marked(1_446_000, 1_578_000, 3, 4_527_000),
            Mode::all_marked(3_997_000, 8_158_000, 750, 4_053_750_000),
        ];
        assert_eq!(batch_count_mean(&modes, &BREAK).unwrap().batches, 750);
    }

    #[test]
    fn rare_long_gaps_end_batches() {
        // 200 batches of ~5 ms; one slow response at 6.5 ms, two batches whose request was
        // retransmitted (one 12 ms gap each, the retransmission skipped).
        let modes = [mode(20.0, 0.5, 400), mode(5_000.0, 0.05, 200), mode(6_500.0, 0.0, 1), mode(12_000.0, 0.0, 2)];
        let est = batch_count_mean(&modes, &BREAK).unwrap();
        assert_eq!(est.batches, 203);
        // A flow whose only gaps above the break are rare still has batches.
        let modes = [mode(20.0, 0.5, 400), mode(5_000.0, 0.0, 3)];
        assert_eq!(batch_count_mean(&modes, &BREAK).unwrap().batches, 3);
        // One request in flight (no break): a rare long gap is a slow response, a batch.
        let modes = [mode(1_100.0, 0.2, 3000), mode(1_900.0, 0.0, 20), mode(3_000.0, 0.0, 5)];
        assert_eq!(batch_count_mean(&modes, &BREAK).unwrap().batches, 3025);
    }

    #[test]
    fn the_gaps_above_a_break_hold_the_time() {
        // One request in flight at 1 ms under scheduling noise: 2 % of the gaps at 3.5–5.9 ms,
        // 8 % of the time. Responses all, not pacing and responses.
        let noisy = [
            Mode::all_marked(1_046_000, 1_417_000, 3_236, 3_559_600_000),
            Mode::all_marked(3_476_000, 5_884_000, 71, 312_400_000),
        ];
        assert_eq!(batch_count_mean(&noisy, &BREAK).unwrap().batches, 3_307);
        // Without the rule, the break between them makes 71 batches of the 3 307.
        let any = Break { min_upper_time_share: 0.0, ..BREAK };
        assert_eq!(batch_count_mean(&noisy, &any).unwrap().batches, 71);
    }

    #[test]
    fn a_break_needs_a_short_lower_side_and_a_wide_ratio() {
        // 300 µs and 3 ms responses: the lower side is short but the ratio is 10: a break.
        let modes = [mode(300.0, 0.01, 10), mode(3_000.0, 0.01, 10)];
        assert_eq!(batch_count_mean(&modes, &BREAK).unwrap().batches, 10);
        // With a 200 µs ceiling on intra-batch gaps they are both responses.
        let strict = Break { rules: BreakRules { intra_batch_max_ns: 200_000, ..BREAK.rules }, ..BREAK };
        assert_eq!(batch_count_mean(&modes, &strict).unwrap().batches, 20);
        // Modes only 2× apart never form a break.
        let modes = [mode(50.0, 0.01, 10), mode(100.0, 0.01, 10)];
        assert_eq!(batch_count_mean(&modes, &BREAK).unwrap().batches, 20);
        // Unless one is configured between them.
        let fixed = Break { fixed_ns: Some(75_000), ..BREAK };
        assert_eq!(batch_count_mean(&modes, &fixed).unwrap().batches, 10);
    }
}
