//! The paper's two estimators over the packets as the downstream point sees them, in arrival
//! order: a reference's delay is known exactly; a regular packet's is the left reference's
//! (RLI-L), or the line through the references before and after it, over arrival time (RLI).
//! Per flow, three counters each (packets, Σ delay, Σ delay²), as the paper keeps them.

/// A packet at the downstream point: its arrival (ns), its flow, and, for a reference, its
/// delay (ns) as measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arrival {
    pub at_ns: u64,
    pub flow: u32,
    pub reference: Option<f64>,
}

/// The paper's three counters.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sums {
    pub packets: u64,
    pub sum: f64,
    pub sum_sq: f64,
}

impl Sums {
    pub fn add(&mut self, delay: f64) {
        self.packets += 1;
        self.sum += delay;
        self.sum_sq += delay * delay;
    }

    pub fn mean(&self) -> Option<f64> {
        (self.packets > 0).then(|| self.sum / self.packets as f64)
    }

    /// The population standard deviation (clamped at 0 against rounding).
    pub fn std_dev(&self) -> Option<f64> {
        let mean = self.mean()?;
        Some((self.sum_sq / self.packets as f64 - mean * mean).max(0.0).sqrt())
    }
}

/// Per flow (indexed by `Arrival::flow`), what each estimator gives.
#[derive(Clone, Debug, Default)]
pub struct PerFlow {
    /// Interpolation between the left and right references.
    pub rli: Vec<Sums>,
    /// The left reference alone.
    pub left: Vec<Sums>,
    /// Regular packets before the first reference or after the last: no estimate.
    pub unreferenced: u64,
}

/// Both estimators over `arrivals` (ascending by arrival), for `flows` flows. References are
/// not counted as their flows' packets: they are the measurement's own.
pub fn estimate(arrivals: &[Arrival], flows: usize) -> PerFlow {
    let mut out = PerFlow { rli: vec![Sums::default(); flows], left: vec![Sums::default(); flows], unreferenced: 0 };
    let mut left: Option<(u64, f64)> = None;
    // The regular packets since the left reference, waiting for the right one.
    let mut pending: Vec<(u64, u32)> = Vec::new();
    for a in arrivals {
        match (a.reference, left) {
            (Some(delay), Some((at_l, d_l))) => {
                let span = a.at_ns.saturating_sub(at_l).max(1) as f64;
                for &(at, flow) in &pending {
                    let d = d_l + (delay - d_l) * (at - at_l) as f64 / span;
                    out.rli[flow as usize].add(d);
                }
                pending.clear();
                left = Some((a.at_ns, delay));
            }
            (Some(delay), None) => left = Some((a.at_ns, delay)),
            (None, Some((_, d_l))) => {
                out.left[a.flow as usize].add(d_l);
                pending.push((a.at_ns, a.flow));
            }
            (None, None) => out.unreferenced += 1,
        }
    }
    out.unreferenced += pending.len() as u64;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regular(at_ns: u64, flow: u32) -> Arrival {
        Arrival { at_ns, flow, reference: None }
    }

    fn reference(at_ns: u64, delay: f64) -> Arrival {
        Arrival { at_ns, flow: 0, reference: Some(delay) }
    }

    /// A delay that rises linearly between two references is exact by interpolation, and the
    /// left reference's by RLI-L; packets outside the references have no estimate.
    #[test]
    fn interpolation_is_exact_on_a_ramp() {
        let arrivals = [
            regular(0, 1),
            reference(100, 10.0),
            regular(125, 1),
            regular(150, 2),
            regular(175, 1),
            reference(200, 20.0),
            regular(250, 2),
        ];
        let e = estimate(&arrivals, 3);
        assert_eq!(e.rli[1].packets, 2);
        assert_eq!(e.rli[1].mean(), Some(15.0));
        assert!((e.rli[1].std_dev().unwrap() - 2.5).abs() < 1e-9);
        assert_eq!(e.rli[2].mean(), Some(15.0));
        assert_eq!((e.left[1].mean(), e.left[2].packets, e.left[2].mean()), (Some(10.0), 2, Some(15.0)));
        assert_eq!(e.unreferenced, 2);
    }
}
