//! One interval's reconciliation at the downstream point: both points' records, the packets
//! only one of them saw (RDA's decode), their timestamps from the caches, and the figures.
//! A packet sent late in interval i may reach D in i + 1: U saw it in i, D in i + 1, so the
//! decode of i lists it as lost. D's cache of i + 1 then holds its arrival, and its delay is
//! known exactly; it counts as reordered (across the boundary), not lost.

use std::time::Duration;

use pirate_common::segment::SegmentShape;

use super::{
    lda::{self, LdaEstimate},
    rda::{self, RdaEstimate},
    wire::Record,
};

/// What the RDA made of an interval.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RdaFigures {
    pub estimate: RdaEstimate,
    /// Sent in the interval, never seen at D (in it or the next).
    pub lost: u64,
    /// Sent in the interval, seen at D in the next one.
    pub reordered: u64,
    /// Seen at D only, not sent in the interval (reordered from the last one, or a packet that
    /// skipped U).
    pub extra: u64,
    /// Whether the decode listed every packet only one point saw: if not, the buckets it could
    /// not peel are left out (fewer samples, no bias).
    pub decoded: bool,
    /// Packets listed whose timestamp no cache held (their buckets stay unusable).
    pub unrepaired: u64,
}

/// One interval at the segment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SegmentReport {
    pub interval: u64,
    /// Why the interval has no figures, if it has none.
    pub unmeasured: Option<&'static str>,
    pub packets_up: u64,
    pub packets_down: u64,
    pub lda: Option<LdaEstimate>,
    pub rda: Option<RdaFigures>,
    /// From the interval's end to this report.
    pub took: Duration,
}

/// Why an interval has no figures.
pub const NO_UPSTREAM: &str = "no_upstream_record";
pub const UPSTREAM_UNMEASURED: &str = "upstream_incomplete";
pub const DOWNSTREAM_UNMEASURED: &str = "downstream_incomplete";
/// The upstream point never answered for the packets only it saw (it stopped, or the link
/// dropped): without their timestamps the packets late across the boundary, the slowest, would
/// be left out of the delay.
pub const NO_UPSTREAM_STAMPS: &str = "upstream_stamps_missing";

impl SegmentReport {
    /// One JSON line (`"type": "segment"`); delays in nanoseconds.
    pub fn write_json(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        use serde_json::json;
        let figures = |f: &super::Figures| json!({ "mean_ns": f.mean, "std_dev_ns": f.std_dev, "bound_ns": f.bound });
        let line = json!({
            "type": "segment",
            "interval": self.interval,
            "measured": self.unmeasured.is_none(),
            "reason": self.unmeasured,
            "packets_up": self.packets_up,
            "packets_down": self.packets_down,
            "lda": self.lda.as_ref().map(|l| json!({
                "delay": figures(&l.figures),
                "samples": l.samples,
                "lost_estimated": l.lost,
            })),
            "rda": self.rda.as_ref().map(|r| json!({
                "delay": figures(&r.estimate.figures),
                "samples": r.estimate.samples,
                "usable": r.estimate.usable,
                "lost": r.lost,
                "reordered": r.reordered,
                "extra": r.extra,
                "decoded": r.decoded,
                "unrepaired": r.unrepaired,
            })),
            "took_s": self.took.as_secs_f64(),
        });
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")
    }
}

/// Where reconcile finds timestamps: U's answer for the packets only it saw, D's own cache of
/// the interval and of the next.
pub trait Caches {
    fn up(&self, id: u64) -> Option<u64>;
    fn down(&self, id: u64) -> Option<u64>;
    fn down_next(&self, id: u64) -> Option<u64>;
}

/// The interval's report from U's and D's records (`None` for U's: it never arrived).
pub fn reconcile(shape: &SegmentShape, up: Option<Record>, down: Record, caches: &impl Caches) -> SegmentReport {
    let mut report = SegmentReport { interval: down.interval, packets_down: down.packets, ..Default::default() };
    let Some(mut up) = up else {
        report.unmeasured = Some(NO_UPSTREAM);
        return report;
    };
    report.packets_up = up.packets;
    report.unmeasured = match (up.measured, down.measured) {
        (false, _) => Some(UPSTREAM_UNMEASURED),
        (_, false) => Some(DOWNSTREAM_UNMEASURED),
        _ => None,
    };
    if report.unmeasured.is_some() {
        return report;
    }
    if shape.flags & pirate_common::segment::LDA != 0 {
        report.lda = Some(lda::estimate(&shape.lda, &up.lda, &down.lda));
    }
    if shape.flags & pirate_common::segment::RDA != 0 {
        let mut down = down;
        report.rda = Some(repaired(&shape.rda, &mut up.rda, &mut down.rda, caches));
    }
    report
}

/// RDA's decode, repair and estimate.
fn repaired(
    shape: &pirate_common::segment::rda::RdaShape,
    up: &mut [pirate_common::segment::rda::RdaBucket],
    down: &mut [pirate_common::segment::rda::RdaBucket],
    caches: &impl Caches,
) -> RdaFigures {
    // A packet only U saw is U's to confirm, or D's next interval's (it arrived late).
    let decoded = rda::decode(shape, up, down, |sign, id| match sign {
        1 => caches.down(id).is_some(),
        _ => caches.up(id).is_some() || caches.down_next(id).is_some(),
    });
    let mut exact = Vec::new();
    let mut figures =
        RdaFigures { decoded: decoded.complete, extra: decoded.reordered.len() as u64, ..Default::default() };
    // D's cache of the next interval tells late from lost; the delay also needs U's timestamp
    // (without it the packet's buckets stay unusable, counted as unrepaired).
    for &id in &decoded.lost {
        match caches.down_next(id) {
            Some(arrived) => {
                figures.reordered += 1;
                if let Some(sent) = caches.up(id) {
                    exact.push(arrived.wrapping_sub(sent) as i64 as f64);
                }
            }
            None => figures.lost += 1,
        }
    }
    figures.unrepaired = rda::remove(shape, up, &decoded.lost, |id| caches.up(id))
        + rda::remove(shape, down, &decoded.reordered, |id| caches.down(id));
    figures.estimate = rda::estimate(shape, up, down, &exact);
    figures
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use pirate_common::segment::{lda::LdaShape, rda::RdaShape, LDA, RDA};

    use super::*;

    struct Maps {
        up: HashMap<u64, u64>,
        down: HashMap<u64, u64>,
        down_next: HashMap<u64, u64>,
    }

    impl Caches for Maps {
        fn up(&self, id: u64) -> Option<u64> {
            self.up.get(&id).copied()
        }
        fn down(&self, id: u64) -> Option<u64> {
            self.down.get(&id).copied()
        }
        fn down_next(&self, id: u64) -> Option<u64> {
            self.down_next.get(&id).copied()
        }
    }

    /// 200 packets sent 1000 apart over an interval of 200 000, delayed 500 + (i mod 7) * 10:
    /// one lost, one that arrives after the interval's end, and one at D from the interval
    /// before. The lost and the late one are told apart, the late one's delay counts, and the
    /// RDA's mean is the exact mean of the 199 delivered packets.
    #[test]
    fn a_packet_late_across_the_boundary_counts_and_a_lost_one_does_not() {
        let shape = SegmentShape {
            interval_ns: 200_000,
            lda: LdaShape { rows: 64, banks: 1, zeros: [0; 4] },
            rda: RdaShape { buckets: 64, banks: 2 },
            sample_zeros: 0,
            flags: LDA | RDA,
            _pad: 0,
        };
        let id = |i: u64| (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let sent = |i: u64| 1_000_000 + i * 1000;
        let delay = |i: u64| 500 + (i % 7) * 10;
        let (lost, late) = (50, 199);
        let up: Vec<(u64, u64)> = (0..200).map(|i| (id(i), sent(i))).collect();
        let mut down: Vec<(u64, u64)> =
            (0..200).filter(|&i| i != lost && i != late).map(|i| (id(i), sent(i) + delay(i))).collect();
        down.push((id(1000), 999_990)); // sent in the interval before
        let record = |packets: &[(u64, u64)]| Record {
            interval: 5,
            measured: true,
            packets: packets.len() as u64,
            lda: lda::record(&shape.lda, packets),
            rda: rda::record(&shape.rda, packets),
        };
        let maps = Maps {
            up: up.iter().copied().collect(),
            down: down.iter().copied().collect(),
            down_next: [(id(late), sent(late) + 5000)].into_iter().collect(),
        };
        let report = reconcile(&shape, Some(record(&up)), record(&down), &maps);
        let rda = report.rda.unwrap();
        assert_eq!((rda.lost, rda.reordered, rda.extra, rda.decoded, rda.unrepaired), (1, 1, 1, true, 0));
        let delivered: Vec<f64> = (0..199).filter(|&i| i != lost).map(|i| delay(i) as f64).chain([5000.0]).collect();
        let truth = delivered.iter().sum::<f64>() / delivered.len() as f64;
        assert!((rda.estimate.figures.mean.unwrap() - truth).abs() < 1e-9, "{rda:?} vs {truth}");
        assert_eq!((report.packets_up, report.packets_down, report.unmeasured), (200, 199, None));
        // Without U's timestamp the late one is still told from the lost one by D's cache of
        // the next interval; its delay is unknown, its buckets unrepaired.
        let unstamped =
            Maps { up: maps.up.iter().filter(|&(&k, _)| k != id(late)).map(|(&k, &v)| (k, v)).collect(), ..maps };
        let rda = reconcile(&shape, Some(record(&up)), record(&down), &unstamped).rda.unwrap();
        assert_eq!((rda.lost, rda.reordered, rda.extra, rda.decoded, rda.unrepaired), (1, 1, 1, true, 1));
        // Without U's record the interval is reported unmeasured, with no figures.
        let missing = reconcile(&shape, None, record(&down), &unstamped);
        assert_eq!((missing.unmeasured, missing.lda, missing.rda), (Some(NO_UPSTREAM), None, None));
    }
}
