//! LDA's estimators (Kompella et al. §III-D, III-E): the mean delay over the usable rows (the
//! same packets at both points), the variance over usable ± collapsed row pairs (rows 2i and
//! 2i + 1 of a bank, the row hash's low bit as the side), and the loss the banks saw, scaled by
//! their sampling probabilities.

use pirate_common::segment::lda::{LdaCell, LdaShape, MAX_BANKS};

use super::{difference, Figures, Sums};

/// One interval's figures, in the timestamps' unit.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LdaEstimate {
    /// Mean (if a row was usable), standard deviation (if a collapsed pair was) and bound.
    pub figures: Figures,
    /// Effective sample size: the packets in usable rows.
    pub samples: u64,
    /// Packets the banks sampled at each point.
    pub sampled_up: u64,
    pub sampled_down: u64,
    /// Lost packets, estimated: each bank's sampled loss over its sampling probability.
    pub lost: f64,
}

/// Banks of `rows` rows, one tuned for each of `losses` (loss rates of `packets` packets an
/// interval): sampling probability p = α m / (L + 1), L the expected losses, rounded to the
/// nearest power of ½ (what the leading-zero hash samples). Banks are ordered rarest first; two
/// that round alike are one.
///
/// The paper takes α = ½, the optimum of its lower bound (eq. 2). The expected effective sample
/// size itself, p R (1 − 1/m)^(pL) ≈ p R e^(−pL/m), is largest at α = 1 ([`ALPHA`]), where it
/// is e^(−1) m R / L against the paper's ½ e^(−½) m R / L: 21 % more samples.
pub fn tuned(rows: u32, losses: &[f64], packets: f64, alpha: f64) -> LdaShape {
    let mut zeros: Vec<u8> = losses
        .iter()
        .map(|&loss| ((loss * packets + 1.0) / (alpha * rows as f64)).log2().round().clamp(0.0, 63.0) as u8)
        .collect();
    zeros.sort_unstable_by(|a, b| b.cmp(a));
    zeros.dedup();
    zeros.truncate(MAX_BANKS);
    let mut shape = LdaShape { rows, banks: zeros.len() as u32, zeros: [0; MAX_BANKS] };
    shape.zeros[..zeros.len()].copy_from_slice(&zeros);
    shape
}

/// The α that maximises the expected effective sample size (see [`tuned`]).
pub const ALPHA: f64 = 1.0;

/// The banks one point fills from its `(identity, timestamp)` packets.
pub fn record(shape: &LdaShape, packets: &[(u64, u64)]) -> Vec<LdaCell> {
    let mut cells = vec![LdaCell::default(); shape.cells()];
    for &(id, ts) in packets {
        if let Some(c) = shape.cell(id) {
            cells[c as usize].add(id, ts);
        }
    }
    cells
}

/// The estimate from U's and D's banks of one interval.
pub fn estimate(shape: &LdaShape, up: &[LdaCell], down: &[LdaCell]) -> LdaEstimate {
    let rows = shape.rows as usize;
    let (mut out, mut sums) = (LdaEstimate::default(), Sums::default());
    for bank in 0..shape.banks as usize {
        let (up, down) = (&up[bank * rows..][..rows], &down[bank * rows..][..rows]);
        let (sent, received): (u64, u64) = (up.iter().map(|c| c.count).sum(), down.iter().map(|c| c.count).sum());
        out.sampled_up += sent;
        out.sampled_down += received;
        out.lost += sent.saturating_sub(received) as f64 / shape.probability(bank);
        for (u, d) in up.iter().zip(down) {
            if u.matches(d) && u.count > 0 {
                sums.delays += difference(u.ts_sum, d.ts_sum);
                sums.samples += u.count;
            }
        }
        // Rows 2i and 2i + 1 pair up (the row hash's low bit is the side).
        for (u, d) in up.chunks_exact(2).zip(down.chunks_exact(2)) {
            if u[0].matches(&d[0]) && u[1].matches(&d[1]) && u[0].count + u[1].count > 0 {
                let side = |i: usize| (difference(u[i].ts_sum, d[i].ts_sum), u[i].count);
                sums.pair(side(0), side(1));
            }
        }
    }
    out.samples = sums.samples;
    out.figures = sums.figures(sums.samples);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paper's Fig. 2: four rows, one of them unusable after a loss; the mean is
    /// (60 + 22 + 8) / (5 + 2 + 1) = 11.25.
    #[test]
    fn the_papers_example() {
        let cell = |ts_sum, count| LdaCell { ts_sum, count, id_xor: 0 };
        let shape = LdaShape { rows: 4, banks: 1, zeros: [0; 4] };
        let up = [cell(120, 5), cell(234, 10), cell(15, 2), cell(6, 1)];
        let down = [cell(180, 5), cell(348, 9), cell(37, 2), cell(14, 1)];
        let e = estimate(&shape, &up, &down);
        assert_eq!((e.figures.mean, e.samples, e.sampled_up, e.sampled_down, e.lost), (Some(11.25), 8, 18, 17, 1.0));
    }

    /// The paper's two-bank configuration at 5 M packets: banks of 512 rows for 0.5 % and 10 %
    /// loss sample 1/2^11 and 1/2^7 of the packets at α = ½ (256/500 001 and 256/25 001,
    /// rounded), twice as many at α = 1; two banks that round alike are one.
    #[test]
    fn banks_are_tuned_to_their_loss_rates() {
        let shape = tuned(512, &[0.005, 0.1], 5e6, 0.5);
        assert_eq!((shape.banks, shape.zeros), (2, [11, 7, 0, 0]));
        assert_eq!(tuned(512, &[0.005, 0.1], 5e6, ALPHA).zeros, [10, 6, 0, 0]);
        assert_eq!(tuned(1024, &[0.0001, 0.0001], 5e6, 0.5).banks, 1);
    }

    /// Without loss, timestamp sums that wrapped past 2^64 still give the exact mean.
    #[test]
    fn wrapping_sums_give_the_exact_mean() {
        let shape = LdaShape { rows: 2, banks: 1, zeros: [0; 4] };
        let up = [LdaCell { ts_sum: u64::MAX - 5, count: 2, id_xor: 0 }, LdaCell::default()];
        let down = [LdaCell { ts_sum: 14, count: 2, id_xor: 0 }, LdaCell::default()]; // 20 later in all
        assert_eq!(estimate(&shape, &up, &down).figures.mean, Some(10.0));
    }
}
