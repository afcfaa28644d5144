//! Two-point one-way latency between an upstream point U and a downstream point D: the LDA and
//! RDA estimators, pure functions of the two points' banks (`pirate_common::segment` holds what
//! each point records per packet), and the synthetic traces the benchmarks run on.

pub mod channel;
pub mod config;
pub mod lda;
pub mod live;
pub mod metrics;
pub mod peer;
pub mod point;
pub mod rda;
pub mod reconcile;
pub mod replay;
pub mod synthetic;
pub mod wire;

/// `down - up` of two wrapping timestamp sums, as a signed number: exact while the true
/// difference (a sum of delays) is within ±2^63 units.
fn difference(up: u64, down: u64) -> f64 {
    down.wrapping_sub(up) as i64 as f64
}

/// What both estimators add up: the delays over the packets in usable cells, and the squared
/// differences of delay sums over pairs of usable cells. Packets land in either cell of a pair
/// (a, b) at random, so E[(Sₐ − S_b)²] = (nₐ + n_b) σ² + (nₐ − n_b)² μ². Two variances follow:
/// - over pairs of equal counts the mean cancels altogether, which is what sparse cells (a
///   packet or two each, a live interval's RDA) need: the paper's E[w²] − μ² (eq. 3) loses σ in
///   the noise of μ² whenever σ ≪ μ, as a few ms of jitter on a long path is;
/// - dense cells (thousands of packets) seldom hold equal counts: over every pair, with the mean's
///   part taken out.
#[derive(Default)]
struct Sums {
    delays: f64,
    samples: u64,
    /// Every pair: Σ (Sₐ − S_b)², Σ (nₐ − n_b)², Σ (nₐ + n_b).
    squares: f64,
    imbalance: f64,
    square_samples: u64,
    /// The pairs of equal counts: Σ (Sₐ − S_b)², Σ 2n, and how many.
    even_squares: f64,
    even_samples: u64,
    even_pairs: u64,
}

/// Pairs of equal counts enough for their variance (relative error about √(2/pairs)).
const MIN_EVEN_PAIRS: u64 = 100;

/// Mean, standard deviation and the mean's 98 % Hoeffding half-width.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Figures {
    pub mean: Option<f64>,
    pub std_dev: Option<f64>,
    pub bound: Option<f64>,
}

impl Sums {
    /// Adds a pair of usable cells: their delay sums and packet counts.
    fn pair(&mut self, (a, na): (f64, u64), (b, nb): (f64, u64)) {
        let square = (a - b).powi(2);
        self.squares += square;
        self.imbalance += (na as f64 - nb as f64).powi(2);
        self.square_samples += na + nb;
        if na == nb {
            self.even_squares += square;
            self.even_samples += na + nb;
            self.even_pairs += 1;
        }
    }

    /// The figures, the bound for `independent` of the samples.
    fn figures(&self, independent: u64) -> Figures {
        let mut out = Figures::default();
        if self.samples > 0 {
            let mean = self.delays / self.samples as f64;
            out.mean = Some(mean);
            if self.square_samples > 0 {
                let variance = match self.even_pairs >= MIN_EVEN_PAIRS {
                    true => self.even_squares / self.even_samples as f64,
                    false => (self.squares - self.imbalance * mean * mean) / self.square_samples as f64,
                };
                let std_dev = variance.max(0.0).sqrt();
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
