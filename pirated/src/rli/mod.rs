//! RLI, reference latency interpolation (Lee, Duffield, Kompella, SIGCOMM 2010): per-flow one-way
//! latency across the segment from reference packets whose delay the downstream point measures
//! exactly, every other packet's delay estimated from the references around it. The upstream
//! point's injector and the downstream point's task (`live`), its section (`config`), each
//! interval's per-flow figures from the datapath's counters (`drain`, `pirate_common::rli`),
//! the JSON lines and metrics; the estimators over a packet trace, the segment's quantiles from
//! its references, and the synthetic queue the benchmark runs them on (docs/method.md).

pub mod config;
pub mod drain;
pub mod egress;
pub mod inject;
pub mod interpolate;
pub mod live;
pub mod metrics;
pub mod quantiles;
pub mod replay;
pub mod report;
pub mod sampled;
pub mod synthetic;

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use pirate_common::rli::{
        flow::{Counters, RliFlow, GROUPS, PENDING, SQ_SHIFT},
        Reference,
    };

    use super::{
        interpolate::estimate,
        synthetic::{References, Spec, Trace},
    };

    /// A counter's packets, mean and standard deviation (ns).
    fn moments(c: &Counters) -> (u64, f64, f64) {
        let n = c.packets as f64;
        let mean = c.sum_ns as f64 / n;
        let sq = c.sum_sq as f64 * (1u64 << (2 * SQ_SHIFT)) as f64 / n;
        let off = mean - c.centre_ns as f64;
        (c.packets, mean, (sq - off * off).max(0.0).sqrt())
    }

    /// The datapath's integer counters fed `trace` packet by packet with a ring of its
    /// references, each reference's delay known on arrival (`lag` 0, an injected one) or
    /// pending until `lag` references after it have arrived (a sampled one, its upstream time
    /// on its way); the groups of every flow settled at the end, as the drain does, after
    /// `tail` more references (a ms apart, at the last one's delay).
    fn feed(trace: &Trace, lag: u64, tail: u64) -> Vec<RliFlow> {
        let (mut flows, mut ring, mut newest) = (vec![RliFlow::default(); trace.truth.len()], HashMap::new(), None);
        let mut delays = HashMap::new();
        for a in &trace.arrivals {
            match a.reference {
                Some(delay) => {
                    let seq = newest.map_or(1, |r: Reference| r.seq + 1);
                    delays.insert(seq, delay as i64);
                    let delay_ns = if lag == 0 { delay as i64 } else { PENDING };
                    let r = Reference { seq, at_ns: a.at_ns, delay_ns };
                    ring.insert(seq, r);
                    newest = Some(r);
                    if let Some(now_in) = seq.checked_sub(lag).filter(|s| lag > 0 && *s > 0) {
                        ring.get_mut(&now_in).unwrap().delay_ns = delays[&now_in];
                    }
                }
                None => {
                    let newest = newest.map(|r| ring[&r.seq]);
                    flows[a.flow as usize].on_packet(a.at_ns, newest, |seq| ring.get(&seq).copied())
                }
            }
        }
        if let Some(last) = newest {
            for k in 1..=tail {
                let seq = last.seq + k;
                let r = Reference { seq, at_ns: last.at_ns + k * 1_000_000, delay_ns: delays[&last.seq] };
                ring.insert(seq, r);
                delays.insert(seq, r.delay_ns);
            }
        }
        for r in ring.values_mut() {
            r.delay_ns = delays[&r.seq];
        }
        for flow in &mut flows {
            flow.settle(|seq| ring.get(&seq).copied());
        }
        flows
    }

    /// The datapath's integer counters (`pirate_common::rli`), fed a synthetic trace packet by
    /// packet with a ring of the last references, give every flow the mean and standard
    /// deviation the estimators in floating point give, RLI and RLI-L alike.
    #[test]
    fn the_datapaths_counters_agree_with_the_estimators() {
        let spec = Spec::gigabit(0.5, 0.6);
        let trace = Trace::new(&spec, References::EveryN(31), 11);
        let exact = estimate(&trace.arrivals, trace.truth.len());
        let mut flows = feed(&trace, 0, 0);
        let (mut compared, mut unsettled) = (0, 0);
        for (i, flow) in flows.iter_mut().enumerate() {
            // The waiting packets after the last reference cannot settle, and the estimators
            // leave them out too.
            unsettled += flow.unsettled;
            for (ours, theirs) in [(&flow.rli, &exact.rli[i]), (&flow.left, &exact.left[i])] {
                if theirs.packets < 10 {
                    continue;
                }
                let (n, mean, std) = moments(ours);
                assert_eq!(n, theirs.packets, "flow {i}");
                assert!((mean / theirs.mean().unwrap() - 1.0).abs() < 1e-4, "flow {i}: {mean} {theirs:?}");
                // Squares in 16 ns units: a std-dev within 100 ns or 0.5 %.
                let t = theirs.std_dev().unwrap();
                assert!((std - t).abs() < 100.0 + 0.005 * t, "flow {i}: std {std} vs {t}: {ours:?} {theirs:?}");
                compared += 1;
            }
        }
        assert!(unsettled > 0 && unsettled <= exact.unreferenced, "{unsettled} of {}", exact.unreferenced);
        assert!(compared > 100, "{compared} flows compared");
    }

    /// References whose delays come later (sampled ones) give every flow the counters they
    /// give when known on arrival, while no more are pending than a flow has groups: the
    /// same packets and Σ delay exactly, Σ delay² up to its rounding (the groups settle in
    /// another order). With more pending, the most recent group widens over the newer
    /// references: every packet still interpolated, over longer spans, each flow's mean near
    /// what all the references give.
    #[test]
    fn references_pending_settle_as_those_known_on_arrival() {
        let spec = Spec::gigabit(0.5, 0.6);
        let trace = Trace::new(&spec, References::EveryN(31), 11);
        // References after the trace's end, so that every packet has one after it.
        let tail = 4 * GROUPS as u64 + 1;
        let known = feed(&trace, 0, tail);
        for lag in [1, GROUPS as u64 - 1] {
            for (i, (a, b)) in known.iter().zip(feed(&trace, lag, tail)).enumerate() {
                assert_eq!((a.unsettled, a.rli.packets, a.left.packets), (b.unsettled, b.rli.packets, b.left.packets));
                assert_eq!((a.widened, b.widened), (0, 0), "flow {i}, lag {lag}");
                assert_eq!((a.rli.sum_ns, a.left.sum_ns), (b.rli.sum_ns, b.left.sum_ns), "flow {i}, lag {lag}");
                for (x, y) in [(&a.rli, &b.rli), (&a.left, &b.left)].into_iter().filter(|(x, _)| x.packets > 1) {
                    let (sa, sb) = (moments(x).2, moments(y).2);
                    assert!((sa - sb).abs() < 16.0 + 1e-3 * sa, "flow {i}, lag {lag}: std {sa} against {sb}");
                }
            }
        }
        // Each flow's error against its true mean, with every reference and widened.
        let (mut all, mut widened, mut counted) = (Vec::new(), Vec::new(), (0, 0));
        for ((a, b), truth) in known.iter().zip(feed(&trace, 4 * GROUPS as u64, tail)).zip(&trace.truth) {
            assert_eq!((b.unsettled, b.rli.packets), (a.unsettled, a.rli.packets));
            counted = (counted.0 + b.widened, counted.1 + b.rli.packets);
            if a.rli.packets >= 100 {
                let true_mean = truth.mean().unwrap();
                all.push((moments(&a.rli).1 / true_mean - 1.0).abs());
                widened.push((moments(&b.rli).1 / true_mean - 1.0).abs());
            }
        }
        let median = |mut e: Vec<f64>| {
            e.sort_by(f64::total_cmp);
            e[e.len() / 2]
        };
        let (all, widened) = (median(all), median(widened));
        println!("median error of flows' means: {all:.4} with every reference, {widened:.4} widened");
        assert!(widened < 0.1, "widened: {widened} median error");
        // Those in widened groups say so (a third of them here).
        assert!(counted.0 > counted.1 / 5, "{} of {} packets counted widened", counted.0, counted.1);
    }
}
