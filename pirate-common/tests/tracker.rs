//! The per-packet step (`pirate_common::pirate::tracker::on_packet`): Alg. 1 (fixed-threshold causal
//! pairs), Alg. 2 insertion and the §3.4 heuristics, driven with hand-made timestamps. The XDP
//! program calls the same function, so this is the specification of the kernel's bookkeeping.
//!
//! Expected values are computed from the timestamps and payloads the tests feed in.

use pirate_common::{
    pirate::batch_break::BreakRules,
    pirate::config::{
        Params, FLAG_ADAPTIVE_DELTA, FLAG_MARK_ACKED, FLAG_MARK_AFTER_SHORT, FLAG_SKIP_PURE_ACKS,
        FLAG_SKIP_RETRANSMISSIONS, MAX_GAP_NS, MIN_FULL_PAYLOAD,
    },
    pirate::flow::{FlowState, ACTIVE, PREV_SHORT, RESTARTED, STARTED, SUM_SHIFT},
    pirate::grid,
    pirate::modes::{Modes, Placed},
    pirate::tracker::{on_packet, PacketInfo, Step},
};
use proptest::{
    prelude::*,
    test_runner::{Config as ProptestConfig, RngSeed},
};

type St = FlowState<10>;

/// A plausible monotonic clock reading (1000 s after boot): far from 0 and from overflow.
const T0: u64 = 1_000_000_000_000;
const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const MSS: u16 = 1448;

const BOTH: u32 = FLAG_SKIP_PURE_ACKS | FLAG_MARK_AFTER_SHORT;
/// 5 % in Q20.
const REL_5PCT: u32 = (1 << 20) / 20;

fn params(flags: u32) -> Params {
    Params {
        delta_ns: MS,
        idle_floor_ns: 1_000 * MS,
        epsilon_ns: 50_000,
        epsilon_rel_q20: 0,
        max_modes: 10,
        mode_span: 0,
        flags,
        rules: BreakRules {
            intra_batch_max_ns: 2 * MS as u32,
            min_ratio_q10: 3 << 10,
            min_share_q20: (1 << 20) / 50,
            straggler_share_q20: (1 << 20) / 20,
        },
        table_sets: 1,
        _pad: 0,
    }
}

fn data(payload: u16) -> PacketInfo {
    PacketInfo { payload, pure_ack: false, ack: None, data_end: 0, syn: false, quic: false }
}

const PURE_ACK: PacketInfo = PacketInfo { payload: 0, pure_ack: true, ack: None, data_end: 0, syn: false, quic: false };

/// An Alg. 1 sample as the sample sum holds it: rounded to 2^SUM_SHIFT ns.
fn rounded(g: u64) -> u64 {
    ((g + (1 << (SUM_SHIFT - 1))) >> SUM_SHIFT) << SUM_SHIFT
}

/// A gap as the mode bounds hold it: its grid value (exact below 4096 ns, saturating at
/// `grid::MAX`).
fn on_grid(g: u64) -> u32 {
    grid::decode(grid::encode(g.min(MAX_GAP_NS) as u32))
}

/// Arrival of the first packet of the current batch (Alg. 1's last batch start).
fn last_batch(st: &St) -> u64 {
    st.last_pkt.get() - st.batch_age_ns as u64
}

/// (min, max, count, candidates) of each initialised mode.
fn modes(st: &St) -> Vec<(u32, u32, u32, u32)> {
    let m = &st.modes;
    (0..m.len as usize)
        .map(|i| {
            let (lo, hi) = m.bounds(i);
            (lo, hi, m.count[i] as u32, m.candidates[i] as u32)
        })
        .collect()
}

/// Mode `i`'s mean in ns, at the precision it is kept at.
fn mean(st: &St, i: usize) -> f64 {
    st.modes.mean_q16(i) as f64 / 65536.0
}

/// How far the mean of a mode that took `gaps` in this order (opened by the first, never merged)
/// may lie from their true mean. The mean is rounded to res = (hi − lo + 1)/65536 ns with a
/// dither on every gap, so it drifts with σ ≤ res·√(n/12): 7σ are allowed. The mean is kept
/// within the bounds [lo, hi + 1 − res] of the moment, and these are grid values: where the
/// running mean of the exact gaps lay outside them by d after k gaps (a singleton-width mode of
/// gaps off their grid value), the clamp kept it d away, which weighs k/n by the end. The
/// running mean's quotient truncates by less than 2^-16 ns per gap.
fn mean_tolerance(gaps: &[u64]) -> f64 {
    let n = gaps.len() as f64;
    let (mut lo, mut hi, mut sum) = (u32::MAX, 0u32, 0u64);
    let mut clamped = 0f64;
    for (k, &g) in gaps.iter().enumerate() {
        (lo, hi, sum) = (lo.min(on_grid(g)), hi.max(on_grid(g)), sum + g);
        let res = (hi - lo + 1) as f64 / 65536.0;
        let t = sum as f64 / (k + 1) as f64;
        let d = (lo as f64 - t).max(t - (hi as f64 + 1.0 - res)).max(0.0);
        clamped = clamped.max(d * (k + 1) as f64 / n);
    }
    let res = (hi - lo + 1) as f64 / 65536.0;
    7.0 * res * (n / 12.0).sqrt() + clamped + n / 65536.0
}

fn total_count(st: &St) -> u64 {
    (0..st.modes.len as usize).map(|i| st.modes.count[i] as u64).sum()
}

fn gap_of(step: Step) -> u64 {
    match step {
        Step::Gap { gap_ns, .. } => gap_ns,
        other => panic!("expected a gap, got {other:?}"),
    }
}

/// Feeds (time, packet) pairs and returns the steps.
fn feed(st: &mut St, p: &Params, pkts: &[(u64, PacketInfo)]) -> Vec<Step> {
    pkts.iter().map(|&(t, pkt)| on_packet(st, t, pkt, p)).collect()
}

/// Deterministic jitter.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

// ---------------------------------------------------------------------------------------------
// Gap stream
// ---------------------------------------------------------------------------------------------

#[test]
fn first_packet_starts_the_gap_stream() {
    let p = params(BOTH);
    let mut st = St::new(3);
    assert_eq!(on_packet(&mut st, T0, data(MSS), &p), Step::First);
    assert_eq!((st.last_pkt.get(), st.batch_age_ns, last_batch(&st)), (T0, 0, T0));
    assert_eq!((st.packets(), st.samples, st.samples_sum_ns(), st.epoch), (1, 0, 0, 3));
    assert_eq!(st.max_payload, MSS);
    assert!(!st.has(PREV_SHORT));
    // It started the stream and this epoch's measurement, with no gap before it.
    assert_eq!(st.status, STARTED | ACTIVE | RESTARTED);
    assert!(st.measured(3) && st.hand_over_due(4));
    assert_eq!(st.modes, Modes::new());

    // A short first packet is remembered as short.
    let mut st = St::new(1);
    assert_eq!(on_packet(&mut st, T0, data(100), &p), Step::First);
    assert_eq!((st.has(PREV_SHORT), st.max_payload), (true, 100));
}

#[test]
fn gaps_are_timestamp_differences() {
    // ε = 0 and distinct gaps: each gap gets a mode of its own, so every one can be checked.
    let p = Params { epsilon_ns: 0, ..params(0) };
    let deltas = [1, 15, 999, MS, 12_345_678, 0, 3, 77 * US, 2 * MS + 1];
    let mut ts = vec![T0];
    for d in deltas {
        ts.push(ts.last().unwrap() + d);
    }
    let mut st = St::new(1);
    assert_eq!(on_packet(&mut st, ts[0], data(MSS), &p), Step::First);
    for (i, &t) in ts.iter().enumerate().skip(1) {
        let step = on_packet(&mut st, t, data(MSS), &p);
        assert_eq!(step, Step::Gap { gap_ns: deltas[i - 1], placed: Placed::Opened }, "packet {i}");
        assert_eq!(st.last_pkt.get(), t);
    }
    assert_eq!(st.packets() as usize, ts.len());
    let mut sorted = deltas.to_vec();
    sorted.sort_unstable();
    let m = modes(&st);
    assert_eq!(m.len(), deltas.len());
    for (i, (&g, &(min, max, count, _))) in sorted.iter().zip(&m).enumerate() {
        // Bounds on the grid: exact below 4096 ns, and 1 ms, 2 ms + 1 ns, 12.3 ms within half a
        // step of theirs.
        assert_eq!((min, max, count), (on_grid(g), on_grid(g), 1), "mode {i}");
        // A mode of one gap has the width of one grid value: its mean is that value.
        assert_eq!(st.modes.mean_ns(i), on_grid(g) as u64, "mode {i}");
    }
    // The small ones exactly.
    assert_eq!(m[..5].iter().map(|&(min, ..)| min).collect::<Vec<_>>(), vec![0, 1, 3, 15, 999]);
}

#[test]
fn equal_timestamps_give_a_zero_gap() {
    let p = params(0);
    let mut st = St::new(1);
    on_packet(&mut st, T0, data(MSS), &p);
    assert_eq!(on_packet(&mut st, T0, data(MSS), &p), Step::Gap { gap_ns: 0, placed: Placed::Opened });
    assert_eq!(modes(&st), vec![(0, 0, 1, 1)]);
    assert_eq!(st.samples, 0);
}

#[test]
fn pure_acks_are_skipped_only_with_the_flag() {
    let pkts = [(T0, data(MSS)), (T0 + 100 * US, PURE_ACK), (T0 + 200 * US, PURE_ACK), (T0 + 2 * MS, data(MSS))];

    // Skipped: they do not move last_pkt_ns, so the next gap spans them (coalescing).
    let p = params(FLAG_SKIP_PURE_ACKS);
    let mut st = St::new(1);
    assert_eq!(on_packet(&mut st, pkts[0].0, pkts[0].1, &p), Step::First);
    for &(t, pkt) in &pkts[1..3] {
        let before = st;
        assert_eq!(on_packet(&mut st, t, pkt, &p), Step::SkippedPureAck);
        assert_eq!(st, before, "a skipped pure ACK changes nothing");
    }
    assert_eq!(gap_of(on_packet(&mut st, pkts[3].0, pkts[3].1, &p)), pkts[3].0 - pkts[0].0);
    assert_eq!(st.packets(), 2);
    assert_eq!(total_count(&st), 1);

    // Not skipped without the flag: three gaps.
    for flags in [0, FLAG_MARK_AFTER_SHORT] {
        let p = params(flags);
        let mut st = St::new(1);
        let steps = feed(&mut st, &p, &pkts);
        assert_eq!(steps[0], Step::First);
        let gaps: Vec<u64> = steps[1..].iter().map(|&s| gap_of(s)).collect();
        assert_eq!(gaps, vec![pkts[1].0 - pkts[0].0, pkts[2].0 - pkts[1].0, pkts[3].0 - pkts[2].0]);
        assert_eq!(st.packets(), 4);
        assert_eq!(total_count(&st), 3);
    }

    // A segment with no payload that is not a pure ACK (SYN, FIN, RST) is never skipped.
    let p = params(BOTH);
    let mut st = St::new(1);
    on_packet(&mut st, T0, data(MSS), &p);
    assert_eq!(gap_of(on_packet(&mut st, T0 + 5 * US, data(0), &p)), 5 * US);
}

/// A TCP segment with `payload` bytes of data ending at sequence number `end`.
fn segment(payload: u16, end: u32) -> PacketInfo {
    PacketInfo { payload, pure_ack: false, ack: Some(1), data_end: end, syn: false, quic: false }
}

#[test]
fn retransmissions_are_skipped_and_their_wait_stays_one_gap() {
    let p = params(BOTH | FLAG_SKIP_RETRANSMISSIONS);
    let mut st = St::new(1);
    // Near the wrap of the sequence space, to check that comparisons are modular.
    let s = u32::MAX - 150;
    let steps = feed(
        &mut st,
        &p,
        &[
            // Two pipelined requests, the first retransmitted 3 ms into the wait for responses.
            (T0, segment(100, s.wrapping_add(100))),
            (T0 + 20 * US, segment(100, s.wrapping_add(200))),
            (T0 + 3 * MS, segment(100, s.wrapping_add(100))),
            // The next batch, then keepalive probes: one byte behind, or none.
            (T0 + 6 * MS, segment(100, s.wrapping_add(300))),
            (T0 + 8 * MS, segment(1, s.wrapping_add(300))),
            (T0 + 9 * MS, segment(0, s.wrapping_add(299))),
        ],
    );
    let skipped = Step::SkippedRetransmission;
    assert_eq!(steps.iter().filter(|&&s| s == skipped).count(), 3, "{steps:?}");
    assert_eq!((steps[2], steps[4], steps[5]), (skipped, skipped, skipped));
    // The wait for responses is one gap: from the last request to the next batch.
    assert_eq!(gap_of(steps[3]), 6 * MS - 20 * US);
    assert_eq!((st.packets(), total_count(&st), st.high_seq), (3, 2, s.wrapping_add(300)));

    // Without the flag, the retransmission splits the wait in two.
    let mut st = St::new(1);
    let steps = feed(
        &mut st,
        &params(BOTH),
        &[
            (T0, segment(100, 100)),
            (T0 + 20 * US, segment(100, 200)),
            (T0 + 3 * MS, segment(100, 100)),
            (T0 + 6 * MS, segment(100, 300)),
        ],
    );
    assert_eq!(gap_of(steps[2]), 3 * MS - 20 * US);
    assert_eq!(total_count(&st), 3);
}

#[test]
fn a_pure_ack_before_any_data_leaves_the_flow_untouched() {
    let p = params(FLAG_SKIP_PURE_ACKS);
    let mut st = St::new(1);
    assert_eq!(on_packet(&mut st, T0, PURE_ACK, &p), Step::SkippedPureAck);
    assert_eq!(st, St::new(1));
    assert_eq!(on_packet(&mut st, T0 + MS, data(10), &p), Step::First);
    assert_eq!(st.last_pkt.get(), T0 + MS);
}

#[test]
fn skipped_pure_acks_do_not_count_as_short_packets() {
    let pkts =
        [(T0, data(MSS)), (T0 + 10 * US, PURE_ACK), (T0 + 2 * MS, data(MSS)), (T0 + 2 * MS + 10 * US, data(MSS))];
    // Skipped: the 2 ms gap follows a full-size segment, so it is not a candidate.
    let mut st = St::new(1);
    feed(&mut st, &params(BOTH), &pkts);
    // 10 µs is a grid value, 2 ms lies 128 ns above its.
    assert_eq!(modes(&st), vec![(10_000, 10_000, 1, 0), (on_grid(2 * MS), on_grid(2 * MS), 1, 0)]);
    // Kept: the ACK (no payload) is short, so the gap after it is a candidate.
    let mut st = St::new(1);
    feed(&mut st, &params(FLAG_MARK_AFTER_SHORT), &pkts);
    // Gaps: 10 µs after a full segment; 1.99 ms after the ACK; 10 µs after a full segment.
    let g = on_grid(1_990_000);
    assert_eq!(modes(&st), vec![(10_000, 10_000, 2, 0), (g, g, 1, 1)]);
}

// ---------------------------------------------------------------------------------------------
// Alg. 1
// ---------------------------------------------------------------------------------------------

#[test]
fn alg1_samples_run_from_batch_start_to_batch_start() {
    let p = params(0); // δ = 1 ms, idle floor 1 s
    let delta = p.delta_ns;
    // (arrival, starts a batch?)
    let b1 = T0;
    let b2 = b1 + 300 * US + 4_700 * US; // after a 4.7 ms gap
    let b3 = b2 + 200 * US + delta + delta + 1; // after δ (same batch), then δ + 1 ns
    let pkts = [
        (b1, true),
        (b1 + 100 * US, false),
        (b1 + 300 * US, false),
        (b2, true),
        (b2 + 200 * US, false),
        (b2 + 200 * US + delta, false), // a gap of exactly δ does not end the batch
        (b3, true),
        (b3 + delta - 1, false),
    ];
    let mut st = St::new(1);
    let mut want_samples = 0;
    let mut want_sum = 0;
    let mut batch_start = 0;
    for (i, &(t, starts)) in pkts.iter().enumerate() {
        on_packet(&mut st, t, data(MSS), &p);
        if starts {
            if i > 0 {
                want_samples += 1;
                want_sum += rounded(t - batch_start);
            }
            batch_start = t;
        }
        assert_eq!((st.samples, st.samples_sum_ns()), (want_samples, want_sum), "after packet {i}");
        assert_eq!(last_batch(&st), batch_start, "after packet {i}");
        assert_eq!(st.batch_age_ns as u64, t - batch_start, "after packet {i}");
    }
    // 5 ms and 2.2 ms + 1 ns, each rounded to 16 ns.
    assert_eq!((st.samples, st.samples_sum_ns()), (2, b3 - b1 - 1));
}

#[test]
fn alg1_samples_at_or_above_the_idle_floor_are_not_summed() {
    let floor = 10 * MS;
    let p = Params { idle_floor_ns: floor, ..params(0) };
    let t1 = T0 + floor; // sample = floor: not summed
    let t2 = t1 + floor - 1; // sample = floor − 1: summed
    let t3 = t2 + 30 * MS; // sample far above: not summed
    let mut st = St::new(1);
    on_packet(&mut st, T0, data(MSS), &p);
    on_packet(&mut st, t1, data(MSS), &p);
    assert_eq!((st.samples, st.samples_sum_ns(), last_batch(&st)), (0, 0, t1));
    on_packet(&mut st, t2, data(MSS), &p);
    // floor − 1 ns, rounded to 16 ns: floor.
    assert_eq!((st.samples, st.samples_sum_ns(), last_batch(&st)), (1, rounded(floor - 1), t2));
    assert_eq!(rounded(floor - 1), floor);
    on_packet(&mut st, t3, data(MSS), &p);
    assert_eq!((st.samples, st.samples_sum_ns(), last_batch(&st)), (1, floor, t3));
    // The gap below the floor goes to the modes; the two at or above it are idle.
    assert_eq!((total_count(&st), st.idle_gaps), (1, 2));

    // An idle floor of 0 sums nothing.
    let p = Params { idle_floor_ns: 0, ..params(0) };
    let mut st = St::new(1);
    feed(&mut st, &p, &[(T0, data(MSS)), (T0 + 2 * MS, data(MSS)), (T0 + 4 * MS, data(MSS))]);
    assert_eq!((st.samples, st.samples_sum_ns(), last_batch(&st)), (0, 0, T0 + 4 * MS));
}

// ---------------------------------------------------------------------------------------------
// Inter-batch-gap candidates
// ---------------------------------------------------------------------------------------------

/// Feeds packets `payloads[i]` spaced by distinct gaps (ε = 0, so one mode per gap) and returns,
/// for each gap in order, whether it was counted as a candidate.
fn candidate_flags(payloads: &[u16], flags: u32) -> Vec<bool> {
    assert!(payloads.len() <= 11, "one mode per gap");
    let p = Params { epsilon_ns: 0, ..params(flags) };
    let mut st = St::new(1);
    let mut t = T0;
    let mut gaps = Vec::new();
    for (i, &pl) in payloads.iter().enumerate() {
        if i > 0 {
            let g = 10 * US * i as u64;
            gaps.push(g);
            t += g;
        }
        on_packet(&mut st, t, data(pl), &p);
    }
    gaps.iter()
        .map(|&g| {
            let i = (0..st.modes.len as usize).find(|&i| st.modes.bounds(i).0 == on_grid(g)).expect("gap has a mode");
            assert_eq!(st.modes.count[i], 1);
            st.modes.candidates[i] == 1
        })
        .collect()
}

#[test]
fn a_gap_is_a_candidate_only_after_a_short_packet() {
    // A packet is short if smaller than the largest payload so far (itself included), or if that
    // largest payload is below MIN_FULL_PAYLOAD. Gap i follows packet i.
    let f = false;
    let t = true;
    // 600: largest so far, ≥ 536 → full. 1448: full. 600 < 1448 → short. 100 → short.
    assert_eq!(candidate_flags(&[600, MSS, 600, MSS, MSS, 100, MSS], FLAG_MARK_AFTER_SHORT), vec![f, f, t, f, f, t]);
    // Growing payloads below the floor are all short, even as the largest so far.
    let low = MIN_FULL_PAYLOAD - 1;
    assert_eq!(
        candidate_flags(&[100, 200, low, low, MIN_FULL_PAYLOAD, 100], FLAG_MARK_AFTER_SHORT),
        vec![t, t, t, t, f]
    );
    // A flow that never sends more than 535 bytes: every gap is a candidate.
    assert_eq!(candidate_flags(&[low; 6], FLAG_MARK_AFTER_SHORT), vec![t; 5]);
    // Exactly 536 every time: none is.
    assert_eq!(candidate_flags(&[MIN_FULL_PAYLOAD; 6], FLAG_MARK_AFTER_SHORT), vec![f; 5]);
    // Zero-payload non-ACK packets are short.
    assert_eq!(candidate_flags(&[MSS, 0, MSS], FLAG_MARK_AFTER_SHORT), vec![f, t]);
    // Without the flag every gap is a candidate.
    assert_eq!(candidate_flags(&[600, MSS, 600, MSS, MSS, 100, MSS], 0), vec![t; 6]);
    assert_eq!(candidate_flags(&[MIN_FULL_PAYLOAD; 6], FLAG_SKIP_PURE_ACKS), vec![t; 5]);
}

#[test]
fn only_the_gap_after_a_batch_tail_is_marked() {
    // Batches of three full segments and a 100-byte tail, 10 µs apart within a batch, ~3 ms
    // between batches.
    const BATCHES: u32 = 6;
    const FULL: u32 = 3;
    let mut pkts = Vec::new();
    let mut t = T0;
    for b in 0..BATCHES {
        if b > 0 {
            t += 3 * MS + b as u64 * US;
        }
        for s in 0..=FULL {
            if s > 0 {
                t += 10 * US;
            }
            pkts.push((t, data(if s < FULL { MSS } else { 100 })));
        }
    }
    let intra = BATCHES * FULL;
    let inter = BATCHES - 1;

    // The inter-batch gaps, 3.001 to 3.005 ms, on the grid (a step of 1024 ns there).
    let (ibg_min, ibg_max) = (on_grid(3_001_000), on_grid(3_000_000 + inter as u64 * 1_000));

    let mut st = St::new(1);
    feed(&mut st, &params(BOTH), &pkts);
    assert_eq!(modes(&st), vec![(10_000, 10_000, intra, 0), (ibg_min, ibg_max, inter, inter)]);

    let mut st = St::new(1);
    feed(&mut st, &params(FLAG_SKIP_PURE_ACKS), &pkts);
    assert_eq!(modes(&st), vec![(10_000, 10_000, intra, intra), (ibg_min, ibg_max, inter, inter)]);
}

// ---------------------------------------------------------------------------------------------
// Epochs, saturation, odd clocks
// ---------------------------------------------------------------------------------------------

#[test]
fn start_epoch_resets_the_measurements_and_keeps_the_timing() {
    let p = params(BOTH);
    let mut st = St::new(1);
    // A batch of two full segments and a short tail, then another batch 3 ms later.
    let first_epoch = [
        (T0, data(MSS)),
        (T0 + 10 * US, data(MSS)),
        (T0 + 20 * US, data(100)),
        (T0 + 3 * MS, data(MSS)),
        (T0 + 3 * MS + 10 * US, data(200)),
    ];
    feed(&mut st, &p, &first_epoch);
    assert_eq!((st.samples, st.samples_sum_ns()), (1, 3 * MS));
    assert_eq!(st.packets(), 5);
    assert!(st.measured(1) && st.has(RESTARTED));
    st.last_ack = 77;
    st.batch_gap_ns = 5;
    let before = st;

    st.start_epoch(2, &p);
    // The flow's continuity survives (δ too: this epoch had too few gaps to move it).
    assert_eq!((st.last_ack, st.batch_gap_ns), (77, 5));
    assert_eq!(st.epoch, 2);
    assert_eq!((st.samples, st.samples_sum_ns(), st.packets(), st.idle_gaps), (0, 0, 0, 0));
    assert_eq!(st.modes, Modes::new());
    // No packet of the new epoch yet: nothing to hand over, the stream goes on.
    assert!(!st.measured(2) && !st.hand_over_due(3));
    assert_eq!(st.status & (ACTIVE | RESTARTED), 0);
    assert!(st.has(STARTED));
    assert_eq!(
        (st.last_pkt.get(), last_batch(&st), st.max_payload, st.has(PREV_SHORT)),
        (T0 + 3 * MS + 10 * US, T0 + 3 * MS, MSS, true)
    );
    assert_eq!(
        (st.last_pkt, st.batch_age_ns, st.max_payload, st.has(PREV_SHORT)),
        (before.last_pkt, before.batch_age_ns, before.max_payload, before.has(PREV_SHORT))
    );

    // The first gap of the new epoch is measured across the boundary, is a candidate (it follows
    // the 200-byte tail) and ends the batch that started at T0 + 3 ms.
    let t = T0 + 5 * MS;
    let gap = t - before.last_pkt.get();
    assert_eq!(gap_of(on_packet(&mut st, t, data(MSS), &p)), gap);
    assert_eq!(modes(&st), vec![(on_grid(gap), on_grid(gap), 1, 1)]);
    // One packet of this epoch, counted by its gap: it did not start the stream.
    assert_eq!((st.samples, st.samples_sum_ns(), st.packets()), (1, rounded(t - last_batch(&before)), 1));
    assert!(st.measured(2) && !st.has(RESTARTED));
    // max_payload survived: 1000 bytes is short in the new epoch, so the gap after it is marked.
    on_packet(&mut st, t + 10 * US, data(1000), &p);
    on_packet(&mut st, t + 4 * MS, data(MSS), &p);
    assert_eq!(st.modes.candidates[..st.modes.len as usize].iter().map(|&c| c as u32).sum::<u32>(), 2);
    assert_eq!(st.max_payload, MSS);
}

/// A request with acknowledgement number `ack`.
fn acked(ack: u32) -> PacketInfo {
    PacketInfo { payload: 100, pure_ack: false, ack: Some(ack), data_end: 0, syn: false, quic: false }
}

#[test]
fn gaps_across_which_the_ack_advanced_are_the_candidates() {
    let p = params(FLAG_MARK_ACKED | FLAG_SKIP_PURE_ACKS);
    let mut st = St::new(1);
    // Near the wrap of the sequence space, to check that comparisons are modular.
    let a = u32::MAX - 1_000;
    let pkts = [
        (T0, acked(a)),
        // Three pipelined requests: no response in between, the same ack.
        (T0 + 20 * US, acked(a)),
        (T0 + 40 * US, acked(a)),
        // The responses arrive (a pure ACK for them is left out), then the next batch.
        (T0 + 5 * MS, PacketInfo { ack: Some(a.wrapping_add(3_000)), ..PURE_ACK }),
        (T0 + 5 * MS + 30 * US, acked(a.wrapping_add(3_000))),
        // A segment overtaken on the way: an older ack is not a response.
        (T0 + 5 * MS + 600 * US, acked(a.wrapping_add(1_000))),
        (T0 + 11 * MS, acked(a.wrapping_add(6_000))),
    ];
    feed(&mut st, &p, &pkts);
    assert_eq!(st.last_ack, a.wrapping_add(6_000));
    // Gaps: 20 µs, 20 µs, 4.99 ms (ack advanced), 570 µs (older ack), 5.4 ms (advanced).
    let marked: Vec<(u32, u16)> =
        (0..st.modes.len as usize).map(|i| (st.modes.bounds(i).0, st.modes.candidates[i])).collect();
    let want = [(20_000, 0), (570_000, 0), (4_990_000, 1), (5_400_000, 1)];
    assert_eq!(marked, want.map(|(g, c)| (on_grid(g), c)));
    // Through 0 and beyond: an ack of 0 is a number like any other.
    let mut st = St::new(1);
    feed(
        &mut st,
        &p,
        &[(T0, acked(u32::MAX - 5)), (T0 + MS, acked(0)), (T0 + 3 * MS, acked(0)), (T0 + 6 * MS, acked(7))],
    );
    let marks: Vec<u16> = (0..st.modes.len as usize).map(|i| st.modes.candidates[i]).collect();
    assert_eq!(marks, vec![1, 0, 1], "1 ms: advanced to 0; 2 ms: the same 0; 3 ms: advanced to 7");
    // Without the pure-ACK skip, a response's pure ACKs neither mark nor hide it.
    let p_all = params(FLAG_MARK_ACKED);
    let mut st = St::new(1);
    let pure = |ack: u32| PacketInfo { ack: Some(ack), ..PURE_ACK };
    feed(
        &mut st,
        &p_all,
        &[(T0, acked(100)), (T0 + MS, pure(1_548)), (T0 + 2 * MS, pure(2_996)), (T0 + 5 * MS, acked(2_996))],
    );
    let marks: Vec<u16> = (0..st.modes.len as usize).map(|i| st.modes.candidates[i]).collect();
    assert_eq!(marks, vec![0, 1], "two 1 ms gaps ending in pure ACKs, then the 3 ms gap before the request");

    // The first ack is taken as it is, whatever its half of the sequence space, 0 included.
    for first in [0u32, 1, 1 << 31, u32::MAX] {
        let mut st = St::new(1);
        feed(&mut st, &p, &[(T0, acked(first)), (T0 + MS, acked(first.wrapping_add(10)))]);
        assert_eq!((st.last_ack, st.modes.candidates[0]), (first.wrapping_add(10), 1), "first ack {first}");
    }

    // UDP carries no ack: the short-packet mark applies (every gap follows a short datagram).
    let p = params(FLAG_MARK_ACKED | FLAG_MARK_AFTER_SHORT);
    let mut st = St::new(1);
    feed(&mut st, &p, &[(T0, data(100)), (T0 + MS, data(100)), (T0 + 2 * MS, data(100))]);
    assert_eq!(st.modes.candidates[0], 2);
}

/// Batches of three requests 1.5 ms apart, 10 ms between batches, from `t`: returns the time
/// after the last batch.
fn paced_batches(st: &mut St, p: &Params, mut t: u64, batches: usize) -> u64 {
    for _ in 0..batches {
        for k in 0..3 {
            on_packet(st, t + k * 1_500 * US, data(100), p);
        }
        t += 13 * MS;
    }
    t
}

#[test]
fn adaptive_delta_takes_the_break_of_the_previous_epoch() {
    // Pacing longer than the fixed δ (1 ms): Alg. 1 then counts every request as a batch.
    let fixed = params(0);
    let mut st = St::new(1);
    paced_batches(&mut st, &fixed, T0, 10);
    assert_eq!(st.samples, 29);

    // Adaptive: the first epoch runs on the fixed δ, the next one across the break found in it,
    // midway between the pacing mode's maximum (1.5 ms) and the batch gaps' minimum (10 ms).
    let p = params(FLAG_ADAPTIVE_DELTA);
    let mut st = St::new(1);
    let t = paced_batches(&mut st, &p, T0, 10);
    assert_eq!((st.samples, st.batch_gap_ns), (29, 0));
    st.start_epoch(2, &p);
    // The modes' bounds, and so the break, lie on the grid.
    assert_eq!(st.batch_gap_ns, (on_grid(1_500 * US) + on_grid(10 * MS)) / 2);
    paced_batches(&mut st, &p, t, 10);
    // The first sample runs from where the fixed δ put the last batch start: its third request.
    // (Multiples of 16 ns: exact in the sum.)
    assert_eq!((st.samples, st.samples_sum_ns()), (10, 9 * 13 * MS + 10 * MS));

    // One request in flight (no break): every gap starts a batch.
    st.start_epoch(3, &p);
    let mut t = T0 + 1_000 * MS;
    for i in 0..20u64 {
        t += (5 + i % 3) * MS;
        on_packet(&mut st, t, data(100), &p);
    }
    st.start_epoch(4, &p);
    assert_eq!(st.batch_gap_ns, 1);
    // An epoch of fewer than 8 gaps leaves δ as it is.
    on_packet(&mut st, t + 5 * MS, data(100), &p);
    st.start_epoch(5, &p);
    assert_eq!(st.batch_gap_ns, 1);
}

#[test]
fn gaps_beyond_u32_saturate_in_the_modes() {
    // An idle floor beyond them, which pirated's configuration never sets (at most 4 s).
    let p = Params { epsilon_ns: 0, idle_floor_ns: u64::MAX, ..params(0) };
    let max = MAX_GAP_NS;
    let deltas = [max + 1, 10_000 * MS, max, u64::MAX / 4];
    let mut st = St::new(1);
    let mut t = T0;
    on_packet(&mut st, t, data(MSS), &p);
    for d in deltas {
        t += d;
        // The step reports the true gap; the mode holds the saturated one.
        assert_eq!(gap_of(on_packet(&mut st, t, data(MSS), &p)), d);
    }
    // Saturated at u32::MAX, then on the grid, whose largest value is 1 MiB below it.
    let top = grid::MAX;
    assert_eq!(on_grid(max), top);
    assert_eq!(modes(&st), vec![(top, top, 4, 4)]);
    // The mean stays within the mode, at most 1 ns above it: it cannot follow the gaps beyond.
    assert!((top as u64..=top as u64 + 1).contains(&st.modes.mean_ns(0)), "{}", st.modes.mean_ns(0));
    // Alg. 1's batch age saturates likewise (these samples are below no floor but u64::MAX).
    assert_eq!((st.samples, st.samples_sum_ns(), st.batch_age_ns), (4, 4 * rounded(max), 0));

    // The grid value below the top is kept as is; gaps between it and the top take the nearer.
    let below = grid::decode(grid::encode(top) - 1);
    let mut st = St::new(1);
    let mut t = T0;
    on_packet(&mut st, t, data(MSS), &p);
    for d in [below as u64, below as u64 + 1, max - 1] {
        t += d;
        on_packet(&mut st, t, data(MSS), &p);
    }
    assert_eq!(modes(&st), vec![(below, below, 2, 2), (top, top, 1, 1)]);
    assert_eq!(st.modes.mean_ns(1), top as u64);
}

#[test]
fn alg1_samples_and_mode_counts_saturate() {
    // δ = 0: every 1 µs gap ends a batch and is a sample, 1008 ns in the sum (rounded to 16 ns).
    let p = Params { delta_ns: 0, ..params(0) };
    let mut st = St::new(1);
    let mut t = T0;
    on_packet(&mut st, t, data(MSS), &p);
    let max = u16::MAX as u64;
    for _ in 0..max {
        t += US;
        on_packet(&mut st, t, data(MSS), &p);
    }
    assert_eq!((st.samples as u64, st.samples_sum_ns()), (max, max * rounded(US)));
    assert_eq!(rounded(US), 1008);
    let before = st;
    for _ in 0..5 {
        t += US;
        on_packet(&mut st, t, data(MSS), &p);
    }
    // Samples stop at u16::MAX, and their sum with them; the mode's count and candidates
    // saturate too (the derived packet count is exact only until then); its mean holds.
    assert_eq!((st.samples, st.samples_sum), (before.samples, before.samples_sum));
    assert_eq!(modes(&st), vec![(1_000, 1_000, max as u32, max as u32)]);
    assert_eq!(st.packets(), max + 1);
    assert_eq!(st.modes.mean_ns(0), 1_000);
    assert_eq!((st.last_pkt.get(), last_batch(&st)), (t, t));

    // The sum (in 16 ns units, a u32: 68.7 s) saturates before the samples do: 4 s samples,
    // below an idle floor pirated never sets, fill it at the 18th.
    let p = Params { idle_floor_ns: u64::MAX, ..params(0) };
    let mut st = St::new(1);
    let mut t = T0;
    on_packet(&mut st, t, data(MSS), &p);
    for i in 1..=20u64 {
        t += 4_000 * MS;
        on_packet(&mut st, t, data(MSS), &p);
        let want = if i < 18 { i * 4_000 * MS } else { (u32::MAX as u64) << SUM_SHIFT };
        assert_eq!((st.samples as u64, st.samples_sum_ns()), (i, want), "sample {i}");
    }
}

#[test]
fn a_timestamp_going_backwards_restarts_the_stream() {
    let p = params(0);
    let mut st = St::new(1);
    feed(&mut st, &p, &[(T0, data(MSS)), (T0 + 2 * MS, data(MSS))]);
    let (modes_before, samples_before) = (st.modes, (st.samples, st.samples_sum_ns()));
    assert_eq!(st.packets(), 2);

    let back = T0 + MS;
    assert_eq!(on_packet(&mut st, back, data(MSS), &p), Step::First);
    assert_eq!((st.last_pkt.get(), st.batch_age_ns), (back, 0));
    assert_eq!(st.modes, modes_before);
    assert_eq!((st.samples, st.samples_sum_ns()), samples_before);
    // The packet count is derived (a packet per gap, and one for starting the stream in this
    // epoch): a restart within an epoch that already started the stream adds none.
    assert_eq!(st.packets(), 2);
    // The stream continues from the earlier time; Alg. 1 measures from it too.
    assert_eq!(gap_of(on_packet(&mut st, back + 300 * US, data(MSS), &p)), 300 * US);
    assert_eq!(gap_of(on_packet(&mut st, back + 5 * MS, data(MSS), &p)), 5 * MS - 300 * US);
    assert_eq!((st.samples, st.samples_sum_ns()), (samples_before.0 + 1, samples_before.1 + 5 * MS));
    assert_eq!(st.packets(), 4);

    // Extremes: from near u64::MAX back to 1, without panicking or underflowing.
    let mut st = St::new(1);
    assert_eq!(on_packet(&mut st, u64::MAX, data(MSS), &p), Step::First);
    assert_eq!(on_packet(&mut st, 1, data(MSS), &p), Step::First);
    assert_eq!(gap_of(on_packet(&mut st, 11, data(MSS), &p)), 10);
    assert_eq!(on_packet(&mut st, u64::MAX, data(MSS), &p), Step::Idle { gap_ns: u64::MAX - 11 });
}

#[test]
fn a_packet_at_time_zero_starts_the_stream() {
    let p = params(0);
    let mut st = St::new(1);
    assert_eq!(on_packet(&mut st, 0, data(MSS), &p), Step::First);
    assert_eq!(gap_of(on_packet(&mut st, 5 * US, data(MSS), &p)), 5 * US);
}

#[test]
fn the_relative_epsilon_reaches_the_modes() {
    // 10 ms then 10.4 ms gaps: 400 µs apart, beyond the fixed 50 µs but within 5 % of 10 ms.
    let pkts = [(T0, data(MSS)), (T0 + 10 * MS, data(MSS)), (T0 + 20_400 * US, data(MSS))];
    let mut st = St::new(1);
    feed(&mut st, &params(0), &pkts);
    let (a, b) = (on_grid(10 * MS), on_grid(10_400 * US));
    assert_eq!(modes(&st), vec![(a, a, 1, 1), (b, b, 1, 1)]);
    let mut st = St::new(1);
    feed(&mut st, &Params { epsilon_rel_q20: REL_5PCT, ..params(0) }, &pkts);
    assert_eq!(modes(&st), vec![(a, b, 2, 2)]);
}

#[test]
fn max_modes_from_the_params_caps_the_histogram() {
    let p = Params { epsilon_ns: 0, max_modes: 2, ..params(0) };
    let mut st = St::new(1);
    let steps = feed(
        &mut st,
        &p,
        &[
            (T0, data(MSS)),
            (T0 + US, data(MSS)),
            (T0 + 3 * US, data(MSS)),
            (T0 + 6 * US, data(MSS)),
            (T0 + 7 * US, data(MSS)),
        ],
    );
    let placed: Vec<Placed> = steps[1..]
        .iter()
        .map(|s| match *s {
            Step::Gap { placed, .. } => placed,
            other => panic!("{other:?}"),
        })
        .collect();
    // Gaps 1, 2, 3, 1 µs: the third distinct gap finds no room; the repeat of the first joins.
    assert_eq!(placed, vec![Placed::Opened, Placed::Opened, Placed::Discarded, Placed::Joined]);
    assert_eq!(st.modes.discarded, 1);
    assert_eq!(modes(&st), vec![(1_000, 1_000, 2, 2), (2_000, 2_000, 1, 1)]);
    assert_eq!(st.packets(), 5);
}

// ---------------------------------------------------------------------------------------------
// Scenario: request/response with one request in flight
// ---------------------------------------------------------------------------------------------

struct Trace {
    pkts: Vec<(u64, PacketInfo)>,
    /// First segment of each request.
    starts: Vec<u64>,
    /// Last segment (the short tail) of each request.
    tails: Vec<u64>,
    /// Arrival of the client's ACK of each response.
    acks: Vec<u64>,
    /// Every gap between consecutive data segments, pure ACKs left out.
    data_gaps: Vec<u64>,
}

impl Trace {
    /// Tail of each request to the first segment of the next: the inter-batch gaps.
    fn ibgs(&self) -> Vec<u64> {
        self.starts[1..].iter().zip(&self.tails).map(|(s, t)| s - t).collect()
    }

    /// Tail of each request to the ACK of its response.
    fn to_ack(&self) -> Vec<u64> {
        self.acks.iter().zip(&self.tails).map(|(a, t)| a - t).collect()
    }
}

/// A client→server flow as seen at the server: each request is three full segments and a short
/// tail 1.0–1.4 µs apart; the response takes `latency`; the client's ACK of it arrives 20–40 µs
/// after that and the next request 50–150 µs after it (think time).
fn one_request_in_flight(requests: usize, latency: u64) -> Trace {
    let mut rng = Lcg(0x9e37_79b9_7f4a_7c15);
    let mut tr = Trace { pkts: vec![], starts: vec![], tails: vec![], acks: vec![], data_gaps: vec![] };
    let mut t = T0;
    for r in 0..requests {
        if r > 0 {
            t = tr.tails[r - 1] + latency + 50 * US + rng.below(100 * US);
            tr.data_gaps.push(t - tr.tails[r - 1]);
        }
        tr.starts.push(t);
        for s in 0..4 {
            if s > 0 {
                let g = 1_000 + rng.below(400);
                tr.data_gaps.push(g);
                t += g;
            }
            tr.pkts.push((t, data(if s < 3 { MSS } else { 300 })));
        }
        tr.tails.push(t);
        let ack = t + latency + 20 * US + rng.below(20 * US);
        tr.acks.push(ack);
        tr.pkts.push((ack, PURE_ACK));
    }
    tr
}

#[test]
fn scenario_largest_mode_is_the_response_latency() {
    const REQUESTS: usize = 300;
    const L: u64 = 2 * MS;
    let tr = one_request_in_flight(REQUESTS, L);
    // As configs/pirated.toml: δ 500 µs, ε 100 µs or 5 % of the gap.
    let p = Params { delta_ns: 500 * US, epsilon_ns: 100_000, epsilon_rel_q20: REL_5PCT, ..params(BOTH) };
    let mut st = St::new(1);
    let steps = feed(&mut st, &p, &tr.pkts);
    assert_eq!(steps.iter().filter(|s| **s == Step::SkippedPureAck).count(), REQUESTS);
    assert_eq!(st.packets() as usize, REQUESTS * 4);
    assert_eq!(st.modes.discarded, 0);

    // Two modes: intra-request gaps (~1.2 µs) and the inter-batch gaps (L + think time).
    assert_eq!(st.modes.len, 2);
    let ibgs = tr.ibgs();
    let intra: Vec<u64> = tr.data_gaps.iter().copied().filter(|&g| g < 500 * US).collect();
    assert_eq!(intra.len() + ibgs.len(), tr.data_gaps.len());
    assert_eq!(intra.len(), REQUESTS * 3);
    let ibg = 1;
    assert_eq!(st.modes.count[ibg] as usize, REQUESTS - 1);
    assert_eq!(st.modes.candidates[ibg] as usize, REQUESTS - 1, "every IBG follows the short tail");
    assert_eq!(st.modes.candidates[0], 0, "no intra-request gap follows a short packet");
    assert_eq!(st.modes.count[0] as usize, intra.len());
    let range = |g: &[u64]| (on_grid(*g.iter().min().unwrap()), on_grid(*g.iter().max().unwrap()));
    assert_eq!(st.modes.bounds(ibg), range(&ibgs));
    // 1.0–1.4 µs: exact.
    assert_eq!(st.modes.bounds(0), (*intra.iter().min().unwrap() as u32, *intra.iter().max().unwrap() as u32));

    // Each mode's mean is the mean of its simulated gaps, to within what the mean keeps (the
    // IBG mode's 2.05–2.15 ms on a grid of 512 and 1024 ns steps, kept to ~1.5 ns).
    let true_mean = |g: &[u64]| g.iter().sum::<u64>() as f64 / g.len() as f64;
    for (i, gaps) in [(0, &intra), (ibg, &ibgs)] {
        let (got, want, tol) = (mean(&st, i), true_mean(gaps), mean_tolerance(gaps));
        assert!((got - want).abs() <= tol, "mode {i}: mean {got}, simulated {want}, tolerance {tol}");
    }
    // And the IBG mode's lies within the think time of L.
    let ibg_mean = mean(&st, ibg);
    assert!(ibg_mean >= (L + 50 * US) as f64 && ibg_mean < (L + 150 * US) as f64, "mean {ibg_mean}");

    // Proportional mode sum: all gaps up to the IBG mode (count × mean of each) over the IBG
    // count — the first to the last data segment, per request-to-request interval.
    let kept = st.modes.count[0] as f64 * mean(&st, 0) + st.modes.count[ibg] as f64 * ibg_mean;
    let slack = intra.len() as f64 * mean_tolerance(&intra) + ibgs.len() as f64 * mean_tolerance(&ibgs);
    let all = tr.data_gaps.iter().sum::<u64>() as f64;
    assert!((kept - all).abs() <= slack, "kept {kept}, simulated {all}, slack {slack}");
    let estimate = kept / (REQUESTS - 1) as f64;
    let want = (tr.tails.last().unwrap() - tr.starts[0]) as f64 / (REQUESTS - 1) as f64;
    let slack = slack / (REQUESTS - 1) as f64;
    assert!((estimate - want).abs() <= slack, "estimate {estimate}, simulated {want}");

    // Alg. 1: every request start is a batch start.
    assert_eq!(st.samples as usize, REQUESTS - 1);
    let samples = tr.starts.windows(2).map(|w| rounded(w[1] - w[0])).sum::<u64>();
    assert_eq!(st.samples_sum_ns(), samples);
    assert!(samples.abs_diff(tr.starts.last().unwrap() - tr.starts[0]) <= 8 * (REQUESTS - 1) as u64);
    assert_eq!(last_batch(&st), *tr.starts.last().unwrap());
}

#[test]
fn scenario_without_the_pure_ack_skip_the_ack_splits_the_ibg() {
    const REQUESTS: usize = 100;
    const L: u64 = 2 * MS;
    let tr = one_request_in_flight(REQUESTS, L);
    // As configs/pirated.toml: δ 500 µs, ε 100 µs or 5 % of the gap.
    let p = Params { delta_ns: 500 * US, epsilon_ns: 100_000, epsilon_rel_q20: REL_5PCT, ..params(0) };
    let mut st = St::new(1);
    feed(&mut st, &p, &tr.pkts);
    assert_eq!(st.packets() as usize, REQUESTS * 5);
    // The largest mode now holds tail → ACK gaps: one per request, the last one included.
    let top = st.modes.len as usize - 1;
    assert_eq!(st.modes.count[top] as usize, REQUESTS);
    let to_ack = tr.to_ack();
    let (min, max) = (*to_ack.iter().min().unwrap(), *to_ack.iter().max().unwrap());
    assert_eq!(st.modes.bounds(top), (on_grid(min), on_grid(max)));
    let want = to_ack.iter().sum::<u64>() as f64 / REQUESTS as f64;
    let (got, tol) = (mean(&st, top), mean_tolerance(&to_ack));
    assert!((got - want).abs() <= tol, "mean {got}, simulated {want}, tolerance {tol}");
    assert!(got >= (L + 20 * US) as f64 && got < (L + 40 * US) as f64, "mean {got}");
    // Each ACK now starts a batch, and the next request, 10–130 µs (< δ) later, does not.
    assert_eq!(st.samples as usize, REQUESTS);
    let starts = [&tr.starts[..1], &tr.acks[..]].concat();
    assert_eq!(st.samples_sum_ns(), starts.windows(2).map(|w| rounded(w[1] - w[0])).sum::<u64>());
    assert_eq!(last_batch(&st), *tr.acks.last().unwrap());
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 384,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(0x7ac_4e5),
        ..ProptestConfig::default()
    }
}

/// A time step: mostly forward (small, large, beyond u32), sometimes equal or backwards.
fn step() -> impl Strategy<Value = i64> {
    prop_oneof![
        6 => 0i64..2_000_000,
        2 => 2_000_000i64..20_000_000_000,
        1 => Just(0i64),
        1 => -5_000_000i64..0,
    ]
}

proptest! {
    #![proptest_config(config())]

    /// Bookkeeping identities on arbitrary packet streams, against a simple model of the rules.
    #[test]
    fn bookkeeping_matches_a_model(
        pkts in prop::collection::vec((
            step(),
            prop_oneof![Just(0u16), 1u16..600, Just(MSS), 1449u16..=u16::MAX],
            any::<bool>(),
            // The acknowledgement number's move (TCP): forward as responses arrive, back when
            // segments are reordered, none (UDP).
            prop::option::of(-2_000i32..5_000),
            // The move of the end of the segment's data (TCP): forward with new data, back or
            // none for a retransmission.
            -2_000i32..5_000,
        ), 1..300),
        flags in 0u32..32,
        ack0 in any::<u32>(),
        delta in 0u64..3_000_000,
        floor in 0u64..3_000_000_000,
        eps in 0u32..200_000,
        rel in prop_oneof![Just(0u32), 0u32..=(1 << 19)],
        span in prop_oneof![Just(0u16), 1u16..4],
    ) {
        let p = Params {
            delta_ns: delta,
            idle_floor_ns: floor,
            epsilon_ns: eps,
            epsilon_rel_q20: rel,
            mode_span: span,
            ..params(flags)
        };
        let mut st = St::new(1);
        let mut t: u64 = T0;
        // Model state: the stream, Alg. 1 (the batch's start, samples and their sum in rounded
        // 16 ns units, both saturating), the packets by what became of them, the kept gaps.
        let (mut started, mut last, mut batch, mut max_pl, mut prev_short) = (false, 0u64, 0u64, 0u16, false);
        let (mut samples, mut sum_units) = (0u16, 0u32);
        let (mut entered, mut firsts, mut discarded, mut idle) = (0u64, 0u64, 0u64, 0u64);
        let mut kept: Vec<(u32, bool)> = Vec::new();
        let (mut ack_now, mut last_ack) = (ack0, None::<u32>);
        let (mut seq_now, mut high_seq) = (ack0 ^ 0x5555_5555, None::<u32>);
        for &(dt, payload, pure, ack_move, seq_move) in &pkts {
            t = t.saturating_add_signed(dt);
            let ack = ack_move.map(|m| {
                ack_now = ack_now.wrapping_add_signed(m);
                ack_now
            });
            seq_now = seq_now.wrapping_add_signed(seq_move);
            let pkt = PacketInfo { payload, pure_ack: pure && payload == 0 && ack.is_some(), ack, data_end: seq_now, syn: false, quic: false };
            let step = on_packet(&mut st, t, pkt, &p);
            if pkt.pure_ack && flags & FLAG_SKIP_PURE_ACKS != 0 {
                prop_assert_eq!(step, Step::SkippedPureAck);
                continue;
            }
            if ack.is_some() && !pkt.pure_ack && flags & FLAG_SKIP_RETRANSMISSIONS != 0 {
                if high_seq.is_some_and(|h| (seq_now.wrapping_sub(h) as i32) <= 0) {
                    prop_assert_eq!(step, Step::SkippedRetransmission);
                    continue;
                }
                high_seq = Some(seq_now);
            }
            entered += 1;
            let candidate = match ack {
                Some(_) if flags & FLAG_MARK_ACKED != 0 && pkt.pure_ack => false,
                Some(a) if flags & FLAG_MARK_ACKED != 0 => {
                    let advanced = last_ack.is_none_or(|l| (a.wrapping_sub(l) as i32) > 0);
                    if advanced {
                        last_ack = Some(a);
                    }
                    advanced
                }
                _ => prev_short || flags & FLAG_MARK_AFTER_SHORT == 0,
            };
            max_pl = max_pl.max(payload);
            prev_short = payload < max_pl || max_pl < MIN_FULL_PAYLOAD;
            if !started || t < last {
                prop_assert_eq!(step, Step::First);
                (started, last, batch) = (true, t, t);
                firsts += 1;
                continue;
            }
            let g = t - last;
            last = t;
            match step {
                Step::Gap { gap_ns, placed } if g < floor => {
                    prop_assert_eq!(gap_ns, g);
                    if placed == Placed::Discarded {
                        discarded += 1;
                    } else {
                        kept.push((g.min(MAX_GAP_NS) as u32, candidate));
                    }
                }
                Step::Idle { gap_ns } if g >= floor => {
                    prop_assert_eq!(gap_ns, g);
                    idle += 1;
                }
                other => return Err(TestCaseError::fail(format!("{other:?} for a {g} ns gap"))),
            }
            if g > delta {
                // The sample is the batch's age, saturating at u32::MAX (beyond any floor
                // pirated sets, not beyond every one here).
                let sample = (t - batch).min(u32::MAX as u64);
                if sample < floor && samples < u16::MAX {
                    samples += 1;
                    sum_units = sum_units.saturating_add(((sample + 8) >> 4) as u32);
                }
                batch = t;
            }
        }
        // Every packet that entered the stream started it or made a gap; the count is derived
        // from the gaps and whether one started it in this epoch.
        prop_assert_eq!(entered, firsts + kept.len() as u64 + discarded + idle);
        prop_assert_eq!(st.packets(), kept.len() as u64 + discarded + idle + (firsts > 0) as u64);
        prop_assert_eq!((st.modes.discarded as u64, st.idle_gaps as u64), (discarded, idle));
        prop_assert_eq!((st.has(ACTIVE), st.has(RESTARTED), st.has(STARTED)), (entered > 0, firsts > 0, started));
        prop_assert_eq!(st.last_pkt.get(), last);
        prop_assert_eq!(st.batch_age_ns as u64, (last - batch).min(u32::MAX as u64));
        if last - batch < u32::MAX as u64 {
            prop_assert_eq!(last_batch(&st), batch);
        }
        prop_assert_eq!(st.max_payload, max_pl);
        prop_assert_eq!(st.has(PREV_SHORT), prev_short);
        prop_assert_eq!((st.samples, st.samples_sum), (samples, sum_units));
        prop_assert_eq!(st.samples_sum_ns(), (sum_units as u64) << SUM_SHIFT);
        // Each kept gap lies in the one mode whose bounds hold its grid value, and each mode
        // holds the count and candidates of the gaps it so holds.
        let n = st.modes.len as usize;
        let mut held = vec![(0u64, 0u64); n];
        for &(g, candidate) in &kept {
            let at = on_grid(g as u64);
            let holding: Vec<usize> = (0..n)
                .filter(|&i| {
                    let (lo, hi) = st.modes.bounds(i);
                    lo <= at && at <= hi
                })
                .collect();
            prop_assert_eq!(holding.len(), 1, "gap {} in modes {:?}", g, holding);
            held[holding[0]].0 += 1;
            held[holding[0]].1 += candidate as u64;
        }
        for (i, &(count, cands)) in held.iter().enumerate() {
            prop_assert_eq!((st.modes.count[i] as u64, st.modes.candidates[i] as u64), (count, cands), "mode {}", i);
            let (lo, hi) = st.modes.bounds(i);
            prop_assert!(hi <= on_grid(MAX_GAP_NS));
            prop_assert!((lo as u64..=hi as u64 + 1).contains(&st.modes.mean_ns(i)));
        }
    }
}

/// The client's SYN.
const SYN: PacketInfo = PacketInfo { payload: 0, pure_ack: false, ack: None, data_end: 0, syn: true, quic: false };

#[test]
fn the_handshake_round_trip_is_syn_to_the_clients_ack() {
    let p = params(BOTH | FLAG_SKIP_RETRANSMISSIONS);
    let ack = PacketInfo { ack: Some(1), ..PURE_ACK };
    // SYN, the handshake's pure ACK 5.2 ms later, then requests: measured once, kept.
    let mut st = St::new(1);
    feed(&mut st, &p, &[(T0, SYN), (T0 + 5_200 * US, ack), (T0 + 5_300 * US, segment(100, 101))]);
    assert_eq!(st.handshake_rtt_ns(), on_grid(5_200_000) as u64);
    feed(&mut st, &p, &[(T0 + 20 * MS, PacketInfo { ack: Some(500), ..segment(100, 201) })]);
    assert_eq!(st.handshake_rtt_ns(), on_grid(5_200_000) as u64, "later ACKs leave it");
    // A SYN retransmitted a second later: the round trip runs from the one answered.
    let mut st = St::new(1);
    feed(&mut st, &p, &[(T0, SYN), (T0 + 1_000 * MS, SYN), (T0 + 1_003 * MS, ack)]);
    assert_eq!(st.handshake_rtt_ns(), on_grid(3_000_000) as u64);
    // A flow met after its handshake has none.
    let mut st = St::new(1);
    feed(&mut st, &p, &[(T0, segment(100, 101)), (T0 + 5 * MS, segment(100, 201))]);
    assert_eq!(st.handshake_rtt_ns(), 0);
}

#[test]
fn gaps_across_which_the_ack_advanced_are_counted_whatever_marks_them() {
    for flags in [BOTH, BOTH | FLAG_MARK_ACKED] {
        let p = params(flags);
        let mut st = St::new(1);
        let a = 7_000;
        let pkts = [
            (T0, acked(a)),
            (T0 + 20 * US, acked(a)),
            (T0 + 5 * MS, PacketInfo { ack: Some(a + 3_000), ..PURE_ACK }),
            (T0 + 5 * MS + 30 * US, acked(a + 3_000)),
            (T0 + 5 * MS + 600 * US, acked(a + 1_000)),
            (T0 + 11 * MS, acked(a + 6_000)),
            // An idle period's gap is not counted: it is not in the modes either.
            (T0 + 2_000 * MS, acked(a + 9_000)),
        ];
        feed(&mut st, &p, &pkts);
        assert_eq!((st.acked_gaps, st.idle_gaps), (2, 1), "flags {flags:#x}");
        st.start_epoch(2, &p);
        assert_eq!(st.acked_gaps, 0, "an epoch's count");
    }
}

/// QUIC is told by HTTP/3's port, or by a long header of a known version on any port; a DNS
/// query whose id happens to start with the long form's bits is not QUIC, nor is TCP to 443.
#[test]
fn quic_is_told_by_its_port_or_its_long_header() {
    use pirate_common::{
        ctx::PacketCtx,
        key::FlowKey,
        parse::{IPPROTO_TCP, IPPROTO_UDP},
    };
    let info = |proto: u8, dport: u16, head: u32| {
        let key = FlowKey { proto, dport, sport: 50_000, ..FlowKey::default() };
        PacketInfo::of(&PacketCtx { key, head, payload: 1200, ..PacketCtx::default() }).quic
    };
    assert!(info(IPPROTO_UDP, 443, 0x4012_3456), "a short header to 443");
    for version in [0xc000_0000, 0xc36b_3343, 0xcdff_0000] {
        assert!(info(IPPROTO_UDP, 4433, version), "long header {version:#x}");
    }
    assert!(!info(IPPROTO_UDP, 53, 0xc1a2_0100), "a DNS query");
    assert!(!info(IPPROTO_UDP, 4433, 0x4000_0000), "a short header off 443");
    assert!(!info(IPPROTO_TCP, 443, 0xc000_0000), "TCP");
}
