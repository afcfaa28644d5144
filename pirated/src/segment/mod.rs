//! Two-point one-way latency between an upstream point U and a downstream point D: the LDA and
//! RDA estimators, pure functions of the two points' banks (`pirate_common::segment` holds what
//! each point records per packet), and the synthetic traces the benchmarks run on.

pub mod lda;
pub mod rda;
pub mod synthetic;

/// `down - up` of two wrapping timestamp sums, as a signed number: exact while the true
/// difference (a sum of delays) is within ±2^63 units.
fn difference(up: u64, down: u64) -> f64 {
    down.wrapping_sub(up) as i64 as f64
}

/// What both estimators add up: the delays over the packets in usable cells, and the squares
/// of the ± collapsed pairs with their packets.
#[derive(Default)]
struct Sums {
    delays: f64,
    samples: u64,
    squares: f64,
    square_samples: u64,
}

/// Mean, standard deviation (`E[w²] − mean²`, eq. 3) and the mean's 98 % Hoeffding half-width.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Figures {
    pub mean: Option<f64>,
    pub std_dev: Option<f64>,
    pub bound: Option<f64>,
}

impl Sums {
    /// The figures, the bound for `independent` of the samples.
    fn figures(&self, independent: u64) -> Figures {
        let mut out = Figures::default();
        if self.samples > 0 {
            let mean = self.delays / self.samples as f64;
            out.mean = Some(mean);
            if self.square_samples > 0 {
                let std_dev = (self.squares / self.square_samples as f64 - mean * mean).max(0.0).sqrt();
                out.std_dev = Some(std_dev);
                out.bound = Some(hoeffding_bound(std_dev, independent.max(1)));
            }
        }
        out
    }
}

/// The half-width of the interval the mean of `samples` delays of standard deviation `std_dev`
/// lies in with probability 98 %, by Hoeffding's inequality (LDA's eq. 1:
/// P[|D − μ| ≥ εμ] ≤ 2 exp(−ε² S μ² / 2σ²)).
fn hoeffding_bound(std_dev: f64, samples: u64) -> f64 {
    const FAILURE: f64 = 0.02;
    std_dev * (2.0 * (2.0 / FAILURE).ln() / samples as f64).sqrt()
}
