//! Choosing each fridge's entry probability (the paper leaves it to a search): a request waits
//! in fridge k for M_k/p_k requests offered to it on average, so p_k is set for that lifetime to
//! match the requests the fridge is offered while the delay it targets passes (§3.3, §5.2: the
//! best p lies there, and anything within 0.5–2× of it does nearly as well).

/// Lifetimes a step apart: fridge k of n targets the largest delay over 16^(n−1−k), so that the
/// longest-lived one keeps requests as long as the slowest responses take and each shorter one
/// serves delays 16 times shorter with 16 times more samples.
pub const LIFETIME_STEP: f64 = 16.0;

/// The delay fridge `k` of `n` targets when the largest delay is `largest_s`.
pub fn target_s(k: usize, n: usize, largest_s: f64) -> f64 {
    largest_s / LIFETIME_STEP.powi((n - 1 - k) as i32)
}

/// What a calibration was made for: recalibrate once either moves by more than [`DRIFT`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Basis {
    pub offered_per_s: f64,
    pub largest_s: f64,
}

/// How far the request rate or the largest delay may move before the fridges are recalibrated.
pub const DRIFT: f64 = 2.0;

impl Basis {
    /// Whether `now` has drifted from this basis by more than [`DRIFT`] either way.
    pub fn drifted(&self, now: &Basis) -> bool {
        let off = |a: f64, b: f64| a > b * DRIFT || b > a * DRIFT;
        off(self.offered_per_s, now.offered_per_s) || off(self.largest_s, now.largest_s)
    }
}

/// The entry probability that gives a fridge of `slots` slots, offered `offered_per_s` requests
/// a second, a lifetime of `target_s` seconds: M/(rate·target), at most 1.
pub fn entry_probability(slots: u32, offered_per_s: f64, target_s: f64) -> f64 {
    let waiting = offered_per_s * target_s;
    if waiting <= slots as f64 {
        return 1.0;
    }
    slots as f64 / waiting
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lifetime_matches_the_target_delay() {
        // The paper's Figure 3(a): 2^12 slots, 1 M requests/s, delays to 2^12 ms (4·10^6
        // requests): p ≈ 2^-10, near its best 2^-9.
        let p = entry_probability(4096, 1e6, 4.096);
        assert!((p - 4096.0 / 4.096e6).abs() < 1e-12);
        assert!((4096.0 / p / 1e6 - 4.096).abs() < 1e-9, "lifetime {} s", 4096.0 / p / 1e6);
        // Few requests: every one enters.
        assert_eq!(entry_probability(4096, 100.0, 1.0), 1.0);
        assert_eq!([target_s(0, 2, 4.0), target_s(1, 2, 4.0), target_s(0, 1, 4.0)], [0.25, 4.0, 4.0]);
    }

    #[test]
    fn drift_beyond_twice_either_way_calls_for_recalibration() {
        let basis = Basis { offered_per_s: 1000.0, largest_s: 0.1 };
        let at = |offered_per_s, largest_s| basis.drifted(&Basis { offered_per_s, largest_s });
        assert!(!at(1999.0, 0.1) && !at(501.0, 0.051) && !at(1000.0, 0.2));
        assert!(at(2001.0, 0.1) && at(499.0, 0.1) && at(1000.0, 0.21) && at(1000.0, 0.049));
    }
}
