//! Alg. 2 (mode maintenance) against its invariants, on arbitrary gap streams.

use pirate_common::pirate::{
    grid,
    modes::{Epsilon, Modes, Placed},
};
use proptest::prelude::*;

/// The grid value a gap's mode bounds take (values below 4096 ns are exact).
fn on_grid(g: u32) -> u32 {
    grid::decode(grid::encode(g))
}

/// Half the grid's step at `v` (≤ [`grid::MAX`]): the furthest a gap lies from its grid value.
fn half_step(v: u32) -> u32 {
    if v < 4096 {
        0
    } else {
        // [2^k, 2^(k+1)) has a step of 2^(k − 11).
        1 << (31 - v.leading_zeros() - 12)
    }
}

/// Mode `i`'s mean in ns, at the precision it is kept at.
fn mean(m: &Modes<16>, i: usize) -> f64 {
    m.mean_q16(i) as f64 / 65536.0
}

/// How far mode `i`'s mean may lie from the true mean of its gaps, whatever the order they came
/// in and the merges they went through. The mean is kept to res = (hi − lo + 1)/65536 ns and
/// rounded to it with a dither, so it drifts with σ ≤ res·√(n/12) over n gaps (merges weigh the
/// drifts of the two modes by their counts); 7σ are allowed. Kept within [lo, hi + 1 − res],
/// it is clamped where the exact gaps lie below lo or above hi (each at most half a grid step
/// from its grid value): up to half a step at hi, plus res. Fixed point truncates by less than
/// 2^-16 ns per gap and 2^-7 ns per merge (fewer than n).
fn mean_tolerance(m: &Modes<16>, i: usize) -> f64 {
    let (lo, hi) = m.bounds(i);
    let res = (hi - lo + 1) as f64 / 65536.0;
    let n = m.count[i] as f64;
    7.0 * res * (n / 12.0).sqrt() + half_step(hi) as f64 + res + n / 128.0
}

fn check_invariants<const M: usize>(m: &Modes<M>, eps: Epsilon, max_modes: u32) {
    let len = m.len as usize;
    assert!(len <= max_modes as usize && len <= M);
    assert_eq!(m.used(), len);
    for i in 0..len {
        let (lo, hi) = m.bounds(i);
        assert!(lo <= hi, "mode {i}: lo > hi");
        assert!(m.count[i] > 0 && m.candidates[i] <= m.count[i]);
        // The mean lies within the mode: [lo, hi + 1) at the precision it is kept at.
        let q16 = m.mean_q16(i);
        assert!(q16 >= (lo as u64) << 16 && q16 < (hi as u64 + 1) << 16, "mode {i}: mean {q16} off [{lo}, {hi}]");
        let mean = m.mean_ns(i);
        assert!(lo as u64 <= mean && mean <= hi as u64 + 1, "mode {i}: mean {mean} off [{lo}, {hi}]");
    }
    for i in 1..len {
        // Ascending and more than ε apart, or too wide together for the span cap: otherwise
        // they would have been merged.
        let ((prev_lo, prev_hi), (lo, hi)) = (m.bounds(i - 1), m.bounds(i));
        let gap = lo.checked_sub(prev_hi).expect("modes out of order");
        assert!(gap > 0, "modes {} and {i} overlap", i - 1);
        assert!(
            gap > eps.at(prev_hi) || !eps.spans(prev_lo, hi),
            "modes {} and {i} lie within ε and would fit one span",
            i - 1
        );
    }
    for i in len..M {
        assert_eq!(
            (m.lo[i], m.hi[i], m.count[i], m.candidates[i], m.mean[i]),
            (0, 0, 0, 0, 0),
            "slot {i} beyond len is not clear"
        );
    }
}

/// Every gap the modes counted lies in exactly one mode, the one whose bounds hold its grid value
/// (bounds only widen and modes never overlap); each mode's count, candidates and mean are those
/// of the gaps it so holds.
fn check_contents(m: &Modes<16>, counted: &[(u32, bool)]) -> Result<(), TestCaseError> {
    let len = m.len as usize;
    let mut held = vec![(0u64, 0u64, 0u64); len];
    for &(g, cand) in counted {
        let at = on_grid(g);
        let holding: Vec<usize> = (0..len)
            .filter(|&i| {
                let (lo, hi) = m.bounds(i);
                lo <= at && at <= hi
            })
            .collect();
        prop_assert_eq!(holding.len(), 1, "gap {} (grid {}) in modes {:?} of {:?}", g, at, holding, m);
        let h = &mut held[holding[0]];
        *h = (h.0 + 1, h.1 + cand as u64, h.2 + g as u64);
    }
    for (i, &(count, cands, sum)) in held.iter().enumerate() {
        prop_assert_eq!((m.count[i] as u64, m.candidates[i] as u64), (count, cands), "mode {}", i);
        let want = sum as f64 / count as f64;
        let tol = mean_tolerance(m, i);
        prop_assert!(
            (mean(m, i) - want).abs() <= tol,
            "mode {} of {:?}: mean {}, its gaps' {}, tolerance {}",
            i,
            m,
            mean(m, i),
            want,
            tol
        );
    }
    Ok(())
}

proptest! {
    // Integration tests have no lib.rs beside them for proptest to persist failures next to.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_and_nothing_is_lost(
        gaps in prop::collection::vec((0u32..20_000_000, any::<bool>()), 1..400),
        abs in 0u32..200_000,
        rel_q20 in prop_oneof![Just(0u32), 0u32..200_000],
        max_modes in 1u32..=16,
        span in prop_oneof![Just(0u32), 1u32..8],
    ) {
        let eps = Epsilon { abs_ns: abs, rel_q20, span };
        let mut m = Modes::<16>::new();
        let mut counted = Vec::new();
        for &(g, cand) in &gaps {
            if m.insert(g, cand, eps, max_modes) != Placed::Discarded {
                counted.push((g, cand));
            } else {
                // Discarded only as Alg. 2 discards: a gap near no mode of a full table, which
                // with a span cap only a single mode can be. Closeness is judged at the gap's
                // grid value, as the bounds are.
                let len = m.len as usize;
                prop_assert_eq!(len, max_modes as usize);
                prop_assert!(span == 0 || len < 2, "a capped table of {} discarded", len);
                let at = on_grid(g);
                let near = |i: usize| {
                    let (lo, hi) = m.bounds(i);
                    match at {
                        at if at < lo => eps.close(at, lo),
                        at if at > hi => eps.close(hi, at),
                        _ => true,
                    }
                };
                prop_assert!(!(0..len).any(near), "{} near a mode of {:?}", g, m);
            }
            check_invariants(&m, eps, max_modes);
        }
        check_contents(&m, &counted)?;
        let total: u64 = (0..m.len as usize).map(|i| m.count[i] as u64).sum();
        prop_assert_eq!(total, counted.len() as u64);
        prop_assert_eq!(total + m.discarded as u64, gaps.len() as u64);
    }

    /// With room for every distinct cluster, no gap is discarded and every gap is in the mode
    /// whose range holds it (its grid value).
    #[test]
    fn gaps_land_in_the_mode_that_spans_them(
        gaps in prop::collection::vec(0u32..1_000_000, 1..200),
        abs in 1u32..50_000,
        rel_q20 in 0u32..100_000,
        span in prop_oneof![Just(0u32), 1u32..8],
    ) {
        let eps = Epsilon { abs_ns: abs, rel_q20, span };
        let mut m = Modes::<16>::new();
        for &g in &gaps {
            m.insert(g, false, eps, 16);
        }
        for &g in &gaps {
            let at = on_grid(g);
            let holding = (0..m.len as usize)
                .filter(|&i| {
                    let (lo, hi) = m.bounds(i);
                    lo <= at && at <= hi
                })
                .count();
            // A discarded gap may lie in no mode; a counted one lies in exactly one.
            prop_assert!(holding <= 1);
            if m.discarded == 0 {
                prop_assert_eq!(holding, 1);
            }
        }
    }
}

const E10: Epsilon = Epsilon::fixed(10);

/// The modes as (min, max, count).
fn listed(m: &Modes<10>) -> Vec<(u32, u32, u16)> {
    (0..m.len as usize)
        .map(|i| {
            let (lo, hi) = m.bounds(i);
            (lo, hi, m.count[i])
        })
        .collect()
}

/// ε = 10 ns, a mode at most one ε wide.
const SPAN1: Epsilon = Epsilon { span: 1, ..E10 };

/// A table of at most 4 modes under [`SPAN1`], fed `gaps`.
fn four_capped(gaps: impl IntoIterator<Item = u32>) -> Modes<10> {
    let mut m = Modes::<10>::new();
    gaps.into_iter().for_each(|g| _ = m.insert(g, false, SPAN1, 4));
    m
}

#[test]
fn merges_bridge_two_modes() {
    let mut m = Modes::<10>::new();
    assert_eq!(m.insert(100, false, E10, 10), Placed::Opened);
    assert_eq!(m.insert(118, false, E10, 10), Placed::Opened);
    assert_eq!(m.len, 2);
    // 109 widens the first mode to within ε of the second, and the two merge.
    assert_eq!(m.insert(109, true, E10, 10), Placed::Joined);
    assert_eq!(m.len, 1);
    assert_eq!((m.bounds(0), m.count[0], m.candidates[0]), ((100, 118), 3, 1));
    // The mean of 100, 118 and 109: rounded to 10/65536 ns on insertion, to 19/65536 ns on the
    // merge, which weighs the two means at 2^-8 ns (truncating both the means and the quotient).
    let mean = m.mean_q16(0) as f64 / 65536.0;
    assert!((mean - 109.0).abs() <= (10.0 + 19.0) / 65536.0 + 2.0 / 256.0, "mean {mean}");
    assert_eq!(m.mean_ns(0), 109);
}

#[test]
fn bounds_lie_on_the_grid_and_the_mean_follows_the_exact_gaps() {
    // Above 4096 ns the grid's step at 1 ms is 256 ns: 1_000_000 lies 64 ns above its grid
    // value, 1_000_200 and 1_000_300 on the next one.
    let (a, b, c) = (1_000_000u32, 1_000_200, 1_000_300);
    assert_eq!((on_grid(a), on_grid(b), on_grid(c)), (999_936, 1_000_192, 1_000_192));
    let eps = Epsilon::fixed(1_000);
    let mut m = Modes::<10>::new();
    assert_eq!(m.insert(a, false, eps, 10), Placed::Opened);
    // A mode of one gap has the width of one grid value: its mean is that value.
    assert_eq!((m.bounds(0), m.mean_ns(0)), ((999_936, 999_936), 999_936));
    // b widens it to the next grid value; c, the same grid value, leaves the bounds as they are.
    assert_eq!(m.insert(b, false, eps, 10), Placed::Joined);
    assert_eq!(m.insert(c, false, eps, 10), Placed::Joined);
    assert_eq!((m.bounds(0), m.count[0]), ((999_936, 1_000_192), 3));
    // The mean is the exact gaps', but for the 64 ns the first one's mean lost (weighing 1/3 by
    // now), to within the mean's precision, 257/65536 ns per rounding.
    let want = (a + b + c) as f64 / 3.0;
    let mean = m.mean_q16(0) as f64 / 65536.0;
    assert!((mean - want).abs() <= 64.0 / 3.0 + 2.0 * 257.0 / 65536.0, "mean {mean}, gaps {want}");
    // Gaps on one grid value keep a mean between it and the next nanosecond: it cannot follow
    // them further than the bounds hold.
    let mut m = Modes::<10>::new();
    (0..5).for_each(|_| _ = m.insert(a, false, eps, 10));
    assert_eq!((m.bounds(0), m.count[0]), ((999_936, 999_936), 5));
    assert!((999_936..=999_937).contains(&m.mean_ns(0)), "mean {}", m.mean_ns(0));
}

#[test]
fn full_histogram_discards() {
    let mut m = Modes::<10>::new();
    for i in 0..3 {
        assert_eq!(m.insert(1000 * (i + 1), false, E10, 3), Placed::Opened);
    }
    assert_eq!(m.insert(10_000, false, E10, 3), Placed::Discarded);
    assert_eq!(m.insert(2005, false, E10, 3), Placed::Joined);
    assert_eq!(m.discarded, 1);
    // Ascending even when inserted out of order.
    let mut m = Modes::<10>::new();
    for g in [5000, 1000, 3000] {
        m.insert(g, false, E10, 10);
    }
    assert_eq!(listed(&m), vec![(1000, 1000, 1), (3000, 3000, 1), (5000, 5000, 1)]);
}

#[test]
fn relative_epsilon_scales_with_the_gap() {
    // 5 % of the gap: 10.0 ms and 10.4 ms are one mode, 100 µs and 104 µs too, 100 µs and 200 µs not.
    let eps = Epsilon { abs_ns: 1_000, rel_q20: (0.05 * (1u64 << 20) as f64) as u32, span: 0 };
    let mut m = Modes::<10>::new();
    for g in [10_000_000, 10_400_000, 100_000, 104_000, 200_000] {
        m.insert(g, false, eps, 10);
    }
    assert_eq!(m.len, 3);
    // The 10 ms bounds lie on the grid (a step of 4096 ns there); 100 µs and 104 µs are grid
    // values (multiples of its 32 ns step).
    assert_eq!(listed(&m)[2], (on_grid(10_000_000), on_grid(10_400_000), 2));
    assert_eq!(listed(&m)[0], (100_000, 104_000, 2));
}

#[test]
fn a_span_cap_keeps_modes_narrow_and_a_full_table_merges_the_cheapest() {
    // ε = 10 ns, span 2: a mode grows to at most 20 ns; a stream creeping up 5 ns at a time
    // fills adjacent modes instead of chaining into one.
    let eps = Epsilon { span: 2, ..E10 };
    let mut m = Modes::<10>::new();
    for g in (100..=160).step_by(5) {
        m.insert(g, false, eps, 10);
    }
    let modes = listed(&m);
    assert_eq!(modes, vec![(100, 120, 5), (125, 145, 5), (150, 160, 3)]);
    // Uncapped, Alg. 2 chains them.
    let mut alg2 = Modes::<10>::new();
    (100..=160).step_by(5).for_each(|g| _ = alg2.insert(g, false, E10, 10));
    assert_eq!((alg2.len, alg2.bounds(0)), (1, (100, 160)));
    // Full (3 modes): a far gap gets a mode of its own, and the neighbours whose union costs
    // least merge: the top two, 35 ns wide against 45, though they hold the table's top.
    assert_eq!(m.insert(1_000, false, eps, 3), Placed::Opened);
    let modes = listed(&m);
    assert_eq!(modes, vec![(100, 120, 5), (125, 160, 8), (1_000, 1_000, 1)]);
    assert_eq!(m.discarded, 0);
    // The merged mode's mean is that of its eight gaps, 125 … 160 ns: 142.5, to within a
    // rounding to at most 36/65536 ns per insertion and on the merge, and the merge's 2^-7 ns.
    let mean = m.mean_q16(1) as f64 / 65536.0;
    assert!((mean - 142.5).abs() <= 9.0 * 36.0 / 65536.0 + 2.0 / 256.0, "mean {mean}");
}

#[test]
fn a_full_table_merges_pieces_of_one_mode_sparing_dense_ones() {
    // ε = 10 ns, span 1: pieces of one Alg. 2 mode, a dense one (100–110 ns, 11 gaps) and two
    // sparse ones (112–119, 125–131) chained on to it through ε.
    let mut m = four_capped((100..=110).chain([112, 119, 125, 131, 1_000]));
    assert_eq!(listed(&m), vec![(100, 110, 11), (112, 119, 2), (125, 131, 2), (1_000, 1_000, 1)]);
    // Full: the sparse pieces merge, though the dense one and its neighbour are as narrow.
    assert_eq!(m.insert(2_000, false, SPAN1, 4), Placed::Opened);
    assert_eq!(listed(&m), vec![(100, 110, 11), (112, 131, 4), (1_000, 1_000, 1), (2_000, 2_000, 1)]);
    // Then the last two pieces of that mode.
    assert_eq!(m.insert(3_000, false, SPAN1, 4), Placed::Opened);
    assert_eq!(listed(&m), vec![(100, 131, 15), (1_000, 1_000, 1), (2_000, 2_000, 1), (3_000, 3_000, 1)]);
    // No pieces of one mode left: two lone modes merge (the cheapest), not the dense one.
    assert_eq!(m.insert(5_000, false, SPAN1, 4), Placed::Opened);
    assert_eq!(listed(&m), vec![(100, 131, 15), (1_000, 2_000, 2), (3_000, 3_000, 1), (5_000, 5_000, 1)]);
}

#[test]
fn a_full_table_keeps_a_sparse_tail_apart_from_the_body() {
    // ε = 10 ns, span 1: a body in two pieces (100–110, 33 gaps; 112–121, 30), two slow
    // responses at 160 and two that waited for a retransmission at 400, full at 4. The sparse
    // pair 160 + 400 is the narrowest union for the gaps it holds, but it holds the table's
    // slowest 4 of 67, where p99 lies: the body's pieces merge instead, and the tail keeps its
    // count.
    let body = (100..=110).chain(112..=121).flat_map(|g| [g; 3]);
    let mut m = four_capped(body.chain([160, 160, 400, 400]));
    assert_eq!(listed(&m), vec![(100, 110, 33), (112, 121, 30), (160, 160, 2), (400, 400, 2)]);
    assert_eq!(m.insert(10, false, SPAN1, 4), Placed::Opened);
    assert_eq!(listed(&m), vec![(10, 10, 1), (100, 121, 63), (160, 160, 2), (400, 400, 2)]);
}

#[test]
fn a_full_table_never_joins_two_chains() {
    // ε = 10 ns, span 1: two chains, 100–110 (11 gaps) + 111 and 122 + 130–140 (11 gaps), full
    // at 4. Their lone ends 111 and 122 would be the cheapest union by width × gaps, but would
    // join the chains into one: the dense piece takes its neighbour instead.
    let mut m = four_capped((130..=140).chain(100..=110).chain([111, 122]));
    assert_eq!(listed(&m), vec![(100, 110, 11), (111, 111, 1), (122, 122, 1), (130, 140, 11)]);
    assert_eq!(m.insert(1_000, false, SPAN1, 4), Placed::Opened);
    assert_eq!(listed(&m), vec![(100, 111, 12), (122, 122, 1), (130, 140, 11), (1_000, 1_000, 1)]);
}

#[test]
fn one_mode_widens_as_alg2_does() {
    // `modes = 1`: nothing to merge, so a gap within ε widens the mode past the span, as Alg. 2
    // would, and one near no mode is discarded, as published.
    let eps = Epsilon { span: 2, ..E10 };
    let mut one = Modes::<10>::new();
    [100, 110, 120, 130].into_iter().for_each(|g| _ = one.insert(g, false, eps, 1));
    assert_eq!((one.len, one.bounds(0), one.count[0], one.discarded), (1, (100, 130), 4, 0));
    assert_eq!(one.insert(200, false, eps, 1), Placed::Discarded);
}
