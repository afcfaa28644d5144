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
pub mod synthetic;

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use pirate_common::rli::{
        flow::{RliFlow, SQ_SHIFT},
        Reference,
    };

    use super::{
        interpolate::estimate,
        synthetic::{References, Spec, Trace},
    };

    /// The datapath's integer counters (`pirate_common::rli`), fed a synthetic trace packet by
    /// packet with a ring of the last references, give every flow the mean and standard
    /// deviation the estimators in floating point give, RLI and RLI-L alike.
    #[test]
    fn the_datapaths_counters_agree_with_the_estimators() {
        let spec = Spec::gigabit(0.5, 0.6);
        let trace = Trace::new(&spec, References::EveryN(31), 11);
        let exact = estimate(&trace.arrivals, trace.truth.len());
        let (mut flows, mut ring, mut newest) = (vec![RliFlow::default(); trace.truth.len()], HashMap::new(), None);
        for a in &trace.arrivals {
            match a.reference {
                Some(delay) => {
                    let seq = newest.map_or(1, |r: Reference| r.seq + 1);
                    let r = Reference { seq, at_ns: a.at_ns, delay_ns: delay as i64 };
                    ring.insert(seq, r);
                    newest = Some(r);
                }
                None => flows[a.flow as usize].on_packet(a.at_ns, newest, |seq| ring.get(&seq).copied()),
            }
        }
        let (mut compared, mut unsettled) = (0, 0);
        for (i, flow) in flows.iter_mut().enumerate() {
            // As the drain does: the waiting packets settle on the reference after theirs; those
            // after the last one cannot, and the estimators leave them out too.
            flow.settle(|seq| ring.get(&seq).copied());
            unsettled += flow.unsettled;
            let counted = |c: &pirate_common::rli::flow::Counters| {
                let n = c.packets as f64;
                let mean = c.sum_ns as f64 / n;
                let sq = c.sum_sq as f64 * (1u64 << (2 * SQ_SHIFT)) as f64 / n;
                let off = mean - c.centre_ns as f64;
                (c.packets, mean, (sq - off * off).max(0.0).sqrt())
            };
            for (ours, theirs) in [(&flow.rli, &exact.rli[i]), (&flow.left, &exact.left[i])] {
                if theirs.packets < 10 {
                    continue;
                }
                let (n, mean, std) = counted(ours);
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
}
