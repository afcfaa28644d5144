//! A tiny seeded generator: SplitMix64 (Steele, Lea, Flood 2014) passes BigCrush, needs one
//! word of state and makes runs reproducible from `--seed` without pulling in `rand`.

#[derive(Debug, Clone)]
pub(crate) struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), from the top 53 bits.
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal by Box–Muller. The second value of each pair is discarded: simpler than
    /// caching, and the generator is far from being a bottleneck.
    pub(crate) fn next_normal(&mut self) -> f64 {
        // 1 - u is in (0, 1], so the logarithm is finite.
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean_sd(xs: &[f64]) -> (f64, f64) {
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (xs.len() - 1) as f64;
        (mean, var.sqrt())
    }

    #[test]
    fn same_seed_same_stream() {
        let a: Vec<u64> = (0..8).scan(SplitMix64::new(7), |r, _| Some(r.next_u64())).collect();
        let b: Vec<u64> = (0..8).scan(SplitMix64::new(7), |r, _| Some(r.next_u64())).collect();
        let c: Vec<u64> = (0..8).scan(SplitMix64::new(8), |r, _| Some(r.next_u64())).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn moments() {
        let mut rng = SplitMix64::new(1);
        let u: Vec<f64> = (0..200_000).map(|_| rng.next_f64()).collect();
        let (m, sd) = mean_sd(&u);
        assert!((m - 0.5).abs() < 0.005 && (sd - (1.0 / 12f64).sqrt()).abs() < 0.005, "{m} {sd}");
        assert!(u.iter().all(|x| (0.0..1.0).contains(x)));
        let n: Vec<f64> = (0..200_000).map(|_| rng.next_normal()).collect();
        let (m, sd) = mean_sd(&n);
        assert!(m.abs() < 0.01 && (sd - 1.0).abs() < 0.01, "{m} {sd}");
    }
}
