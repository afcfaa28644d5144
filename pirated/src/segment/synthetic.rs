//! Synthetic intervals for the LDA and RDA benchmarks, as the papers simulate them: packets at a
//! fixed spacing, each delayed by a Weibull draw, some lost (seen at U only) and some reordered
//! across the interval's start (seen at D only), with the truth over the packets both saw.

use std::collections::HashSet;

use pirate_common::hash::seeded;

use crate::rng::uniform;

/// Weibull delays: P(X ≤ x) = 1 − exp(−(x/scale)^shape).
#[derive(Clone, Copy, Debug)]
pub struct Weibull {
    pub scale: f64,
    pub shape: f64,
}

impl Weibull {
    /// The delay at quantile `u`.
    pub fn at(&self, u: f64) -> f64 {
        self.scale * (-(1.0 - u).ln()).powf(1.0 / self.shape)
    }
}

/// How packets go missing at D.
#[derive(Clone, Copy, Debug)]
pub enum Loss {
    /// Each packet independently.
    Rate(f64),
    /// Exactly this many, chosen at random.
    Count(usize),
}

/// What an interval looks like, in timestamp units.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub packets: usize,
    /// Between consecutive packets at U.
    pub gap: u64,
    pub delay: Weibull,
    pub loss: Loss,
    /// Packets sent before the interval and received in it: seen at D only.
    pub reordered: usize,
}

impl Spec {
    /// The LDA paper's setting, which the RDA paper reuses, in picoseconds: packets 200 ns apart
    /// (5 M a second), Weibull delays of scale 0.133 µs and shape 0.6 (mean 0.2 µs).
    pub fn papers(packets: usize, loss: Loss, reordered: usize) -> Spec {
        Spec { packets, gap: 200_000, delay: Weibull { scale: 133_000.0, shape: 0.6 }, loss, reordered }
    }
}

/// One interval as both points saw it: (identity, timestamp), in no particular order (both
/// aggregators add up, so order does not matter to them).
pub struct Interval {
    pub up: Vec<(u64, u64)>,
    pub down: Vec<(u64, u64)>,
    /// Mean and standard deviation of the delays of the packets both saw.
    pub mean: f64,
    pub std_dev: f64,
}

/// Where intervals start: far enough from 0 that reordered packets were sent at positive times.
const START: u64 = 1 << 40;

impl Interval {
    /// An interval whose delays and losses come from `seed` and whose identities from `ids`
    /// (another `ids`, the same traffic hashed anew, as the papers' runs are).
    pub fn new(spec: Spec, seed: u64, ids: u64) -> Interval {
        let mut state = seeded(seed, 0x5345_474d) | 1;
        let lost: HashSet<usize> = match spec.loss {
            Loss::Count(n) => {
                let mut set = HashSet::with_capacity(n);
                while set.len() < n.min(spec.packets) {
                    set.insert((uniform(&mut state) * spec.packets as f64) as usize);
                }
                set
            }
            Loss::Rate(_) => HashSet::new(),
        };
        let (mut up, mut down) = (Vec::with_capacity(spec.packets), Vec::with_capacity(spec.packets));
        let (mut sum, mut squares, mut both) = (0.0, 0.0, 0u64);
        for i in 0..spec.packets {
            let (id, sent) = (seeded(ids, i as u64), START + i as u64 * spec.gap);
            let delay = spec.delay.at(uniform(&mut state)).round() as u64;
            up.push((id, sent));
            let dropped = match spec.loss {
                Loss::Rate(p) => uniform(&mut state) < p,
                Loss::Count(_) => lost.contains(&i),
            };
            if !dropped {
                down.push((id, sent + delay));
                sum += delay as f64;
                squares += (delay as f64).powi(2);
                both += 1;
            }
        }
        for j in 0..spec.reordered {
            // Sent before the interval began, by less than its delay.
            let id = seeded(ids ^ 0x5245_4f52_4445_5221, j as u64);
            down.push((id, START + spec.delay.at(uniform(&mut state)).round() as u64));
        }
        let mean = sum / both as f64;
        Interval { up, down, mean, std_dev: (squares / both as f64 - mean * mean).max(0.0).sqrt() }
    }
}
