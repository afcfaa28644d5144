//! The latency-aware weight controller of the Pirate paper's §4, as a pure step from one
//! interval's per-real figures to the next weights:
//! 1. reals slower than `alpha_high` × the fastest real's mean latency give weight up, each in
//!    proportion to its latency; reals faster than `alpha_low` × it may take weight;
//! 2. of those, only the ones whose freshness (requests in the interval per connection active at
//!    its end) is at least every slow real's take it, in equal shares, each at most `max_step`;
//! 3. after `regress_after` intervals without a move, weights regress towards equal.
//!
//! Weights are in units of an equal share (n reals: they sum to n), and stay at or above
//! `min_weight`, so that a slow real keeps receiving the new flows that measure its recovery.

/// The controller's constants (`[lb.control]`); the defaults are the paper's.
#[derive(Clone, Debug, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Control {
    /// The high watermark, × the lowest mean latency (paper: 1.5).
    pub alpha_high: f64,
    /// The low watermark, × the lowest mean latency (paper: 1.2).
    pub alpha_low: f64,
    /// Weight a slow real gives up per interval, per unit of its latency over the lowest.
    pub shift: f64,
    /// The most weight one real takes in an interval.
    pub max_step: f64,
    /// The least weight a real keeps.
    pub min_weight: f64,
    /// Intervals without a move before weights regress to equal (paper: k = 3).
    pub regress_after: u32,
    /// The fraction of its distance to an equal share a weight regresses per interval.
    pub regress: f64,
}

impl Default for Control {
    fn default() -> Control {
        Control {
            alpha_high: 1.5,
            alpha_low: 1.2,
            shift: 0.05,
            max_step: 0.25,
            min_weight: 0.05,
            regress_after: 3,
            regress: 0.1,
        }
    }
}

impl Control {
    /// Why the constants cannot work, if they cannot: the key at fault and what is wrong.
    pub fn problem(&self) -> Option<(&'static str, String)> {
        let positive = [("shift", self.shift), ("max_step", self.max_step), ("regress", self.regress)];
        if let Some(&(name, v)) = positive.iter().find(|(_, v)| !(*v > 0.0 && v.is_finite())) {
            return Some((name, format!("{name} = {v}: must be above 0")));
        }
        if self.regress > 1.0 {
            return Some(("regress", format!("regress = {}: at most 1", self.regress)));
        }
        if !(self.alpha_low >= 1.0 && self.alpha_high > self.alpha_low && self.alpha_high.is_finite()) {
            return Some((
                "alpha_low",
                format!(
                    "alpha_low = {} and alpha_high = {}: need 1 <= alpha_low < alpha_high",
                    self.alpha_low, self.alpha_high
                ),
            ));
        }
        if !(0.0..1.0).contains(&self.min_weight) {
            return Some(("min_weight", format!("min_weight = {}: must be in 0..1", self.min_weight)));
        }
        None
    }
}

/// One real's figures over the last interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RealStats {
    /// Mean response latency of the flows mapped to it (s); `None` without an estimate.
    pub latency_s: Option<f64>,
    /// Requests (Pirate's batches) its flows carried in the interval.
    pub requests: u64,
    /// Its flows active at the interval's end.
    pub active: u64,
}

impl RealStats {
    /// Requests in the interval per connection active at its end (a real with requests and no
    /// connection left is as fresh as can be).
    pub fn freshness(&self) -> f64 {
        match self.active {
            0 if self.requests > 0 => f64::INFINITY,
            0 => 0.0,
            n => self.requests as f64 / n as f64,
        }
    }
}

/// What the controller carries from interval to interval.
#[derive(Clone, Debug, PartialEq)]
pub struct Controller {
    pub weights: Vec<f64>,
    /// Intervals since weight last moved.
    pub quiet: u32,
}

/// What one step did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Step {
    /// Weight taken from slow reals and given to fast ones.
    pub moved: f64,
    /// Whether the weights regressed towards equal instead.
    pub regressed: bool,
}

impl Controller {
    /// `n` reals at equal weights.
    pub fn new(n: usize) -> Controller {
        Controller { weights: vec![1.0; n], quiet: 0 }
    }

    /// One interval: `stats[i]` is real i's.
    pub fn step(&mut self, c: &Control, stats: &[RealStats]) -> Step {
        debug_assert_eq!(stats.len(), self.weights.len());
        let lowest = stats.iter().filter_map(|s| s.latency_s).filter(|&l| l > 0.0).fold(f64::INFINITY, f64::min);
        let slow: Vec<usize> =
            (0..stats.len()).filter(|&i| stats[i].latency_s.is_some_and(|l| l > c.alpha_high * lowest)).collect();
        let freshest_slow = slow.iter().map(|&i| stats[i].freshness()).fold(0.0, f64::max);
        let fast: Vec<usize> = (0..stats.len())
            .filter(|&i| stats[i].latency_s.is_some_and(|l| l < c.alpha_low * lowest))
            .filter(|&i| stats[i].freshness() >= freshest_slow)
            .collect();
        // What each slow real can give, and what the fast ones can take.
        let give: Vec<f64> = slow
            .iter()
            .map(|&i| {
                let ratio = stats[i].latency_s.unwrap_or(0.0) / lowest;
                (c.shift * ratio).min(self.weights[i] - c.min_weight).max(0.0)
            })
            .collect();
        let offered: f64 = give.iter().sum();
        let moved = offered.min(c.max_step * fast.len() as f64);
        if moved > 0.0 {
            for (&i, g) in slow.iter().zip(&give) {
                self.weights[i] -= g * moved / offered;
            }
            for &i in &fast {
                self.weights[i] += moved / fast.len() as f64;
            }
            self.quiet = 0;
            return Step { moved, regressed: false };
        }
        self.quiet = self.quiet.saturating_add(1);
        if self.quiet < c.regress_after {
            return Step::default();
        }
        for w in &mut self.weights {
            *w += c.regress * (1.0 - *w);
        }
        Step { moved: 0.0, regressed: true }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn real(latency_ms: f64, requests: u64, active: u64) -> RealStats {
        RealStats { latency_s: Some(latency_ms * 1e-3), requests, active }
    }

    #[test]
    fn the_papers_constants_are_the_defaults_and_valid() {
        let c = Control::default();
        assert_eq!((c.alpha_high, c.alpha_low, c.regress_after), (1.5, 1.2, 3));
        assert_eq!(c.problem(), None);
        assert!(Control { alpha_low: 1.6, ..c.clone() }.problem().is_some());
        assert!(Control { shift: 0.0, ..c.clone() }.problem().is_some());
        assert!(Control { min_weight: 1.0, ..c }.problem().is_some());
    }

    /// One real at 4× the others' latency gives up weight in proportion to its latency (4 ×
    /// shift), shared equally by the three fast ones; the total stays.
    #[test]
    fn a_slow_real_gives_weight_to_the_fast_ones() {
        let c = Control::default();
        let mut ctl = Controller::new(4);
        let stats = [real(10.0, 100, 10), real(10.0, 100, 10), real(40.0, 20, 10), real(11.0, 100, 10)];
        let step = ctl.step(&c, &stats);
        assert!((step.moved - 0.2).abs() < 1e-12, "{step:?}");
        assert!((ctl.weights[2] - 0.8).abs() < 1e-12);
        for i in [0, 1, 3] {
            assert!((ctl.weights[i] - (1.0 + 0.2 / 3.0)).abs() < 1e-12, "{:?}", ctl.weights);
        }
        assert!((ctl.weights.iter().sum::<f64>() - 4.0).abs() < 1e-12);
    }

    /// Between the watermarks a real neither gives nor takes; a fast real less fresh than the
    /// slow one takes nothing; the per-real cap holds what the fast ones may take.
    #[test]
    fn watermarks_freshness_and_the_cap() {
        let c = Control { shift: 0.5, ..Control::default() };
        let mut ctl = Controller::new(4);
        // Real 1 is between the watermarks (1.3×); real 3 is fast but stale (fewer requests
        // per connection than the slow real 2).
        let stats = [real(10.0, 100, 10), real(13.0, 100, 10), real(30.0, 50, 10), real(10.0, 40, 10)];
        let step = ctl.step(&c, &stats);
        // Real 2 offers 0.5 × 3 = 1.5, capped by its floor at 0.95, then by the one taker's 0.25.
        assert!((step.moved - 0.25).abs() < 1e-12, "{step:?}");
        assert_eq!(ctl.weights[1], 1.0);
        assert_eq!(ctl.weights[3], 1.0);
        assert!((ctl.weights[0] - 1.25).abs() < 1e-12 && (ctl.weights[2] - 0.75).abs() < 1e-12);
    }

    /// Nothing slow: weights hold for k − 1 quiet intervals, then regress towards equal.
    #[test]
    fn quiet_intervals_regress_to_equal() {
        let c = Control::default();
        let mut ctl = Controller { weights: vec![1.5, 0.5], quiet: 0 };
        let even = [real(10.0, 10, 1), real(10.0, 10, 1)];
        assert_eq!(ctl.step(&c, &even), Step::default());
        assert_eq!(ctl.step(&c, &even), Step::default());
        assert_eq!(ctl.weights, vec![1.5, 0.5]);
        assert!(ctl.step(&c, &even).regressed);
        assert!((ctl.weights[0] - 1.45).abs() < 1e-12 && (ctl.weights[1] - 0.55).abs() < 1e-12);
    }

    /// A real without an estimate is left alone, and with no estimate at all nothing moves.
    #[test]
    fn reals_without_estimates_are_left_alone() {
        let c = Control::default();
        let mut ctl = Controller::new(3);
        let stats = [real(10.0, 10, 1), RealStats::default(), real(50.0, 5, 1)];
        ctl.step(&c, &stats);
        assert_eq!(ctl.weights[1], 1.0);
        assert!(ctl.weights[0] > 1.0 && ctl.weights[2] < 1.0);
        let mut none = Controller::new(2);
        assert_eq!(none.step(&c, &[RealStats::default(); 2]), Step::default());
    }
}
