//! Alg. 2 (mode maintenance) against its invariants, on arbitrary gap streams.

use pirate_common::pirate::modes::{Epsilon, Modes, Placed, SUM_SHIFT};
use proptest::prelude::*;

fn check_invariants<const M: usize>(m: &Modes<M>, eps: Epsilon, max_modes: u32) {
    let len = m.len as usize;
    assert!(len <= max_modes as usize && len <= M);
    for i in 0..len {
        assert!(m.min[i] <= m.max[i], "mode {i}: min > max");
        assert!(m.count[i] > 0 && m.candidates[i] <= m.count[i]);
        // The sum lies between count·min and count·max, up to the ±8 ns rounding per gap.
        let sum = m.sum_ns(i) as f64;
        let slack = m.count[i] as f64 * (1u64 << (SUM_SHIFT - 1)) as f64;
        assert!(sum + slack >= m.count[i] as f64 * m.min[i] as f64, "mode {i}: sum below count·min");
        assert!(sum - slack <= m.count[i] as f64 * m.max[i] as f64, "mode {i}: sum above count·max");
    }
    for i in 1..len {
        // Ascending and more than ε apart, or too wide together for the span cap: otherwise
        // they would have been merged.
        let gap = m.min[i].checked_sub(m.max[i - 1]).expect("modes out of order");
        assert!(gap > 0, "modes {} and {i} overlap", i - 1);
        assert!(
            gap > eps.at(m.max[i - 1]) || !eps.spans(m.min[i - 1], m.max[i]),
            "modes {} and {i} lie within ε and would fit one span",
            i - 1
        );
    }
    for i in len..M {
        assert_eq!((m.min[i], m.max[i], m.count[i], m.sum[i]), (0, 0, 0, 0), "slot {i} beyond len is not clear");
    }
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
        let mut counted = 0u64;
        for &(g, cand) in &gaps {
            if m.insert(g, cand, eps, max_modes) != Placed::Discarded {
                counted += 1;
            } else {
                // Discarded only as Alg. 2 discards: a gap near no mode of a full table, which
                // with a span cap only a single mode can be.
                let len = m.len as usize;
                prop_assert_eq!(len, max_modes as usize);
                prop_assert!(span == 0 || len < 2, "a capped table of {} discarded", len);
                let near = |i: usize| match g {
                    g if g < m.min[i] => eps.close(g, m.min[i]),
                    g if g > m.max[i] => eps.close(m.max[i], g),
                    _ => true,
                };
                prop_assert!(!(0..len).any(near), "{} near a mode of {:?}", g, m);
            }
            check_invariants(&m, eps, max_modes);
        }
        let total: u64 = (0..m.len as usize).map(|i| m.count[i] as u64).sum();
        prop_assert_eq!(total, counted);
        prop_assert_eq!(total + m.discarded as u64, gaps.len() as u64);
    }

    /// With room for every distinct cluster, no gap is discarded and every gap is in the mode
    /// whose range holds it.
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
            let holding = (0..m.len as usize).filter(|&i| m.min[i] <= g && g <= m.max[i]).count();
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
fn listed(m: &Modes<10>) -> Vec<(u32, u32, u32)> {
    (0..m.len as usize).map(|i| (m.min[i], m.max[i], m.count[i])).collect()
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
    assert_eq!((m.min[0], m.max[0], m.count[0], m.candidates[0]), (100, 118, 3, 1));
    // Each gap rounded to 16 ns: 100 → 96, 118 → 112, 109 → 112.
    assert_eq!(m.sum_ns(0), 96 + 112 + 112);
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
    assert_eq!(&m.min[..3], &[1000, 3000, 5000]);
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
    assert_eq!((m.min[2], m.max[2], m.count[2]), (10_000_000, 10_400_000, 2));
    assert_eq!((m.min[0], m.max[0], m.count[0]), (100_000, 104_000, 2));
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
    assert_eq!((alg2.len, alg2.min[0], alg2.max[0]), (1, 100, 160));
    // Full (3 modes): a far gap gets a mode of its own, and the neighbours whose union is
    // narrowest for the gaps it holds merge.
    assert_eq!(m.insert(1_000, false, eps, 3), Placed::Opened);
    let modes = listed(&m);
    assert_eq!(modes, vec![(100, 120, 5), (125, 160, 8), (1_000, 1_000, 1)]);
    assert_eq!(m.discarded, 0);
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
    assert_eq!((one.len, one.min[0], one.max[0], one.count[0], one.discarded), (1, 100, 130, 4, 0));
    assert_eq!(one.insert(200, false, eps, 1), Placed::Discarded);
}
