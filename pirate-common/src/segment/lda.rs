//! The Lossy Difference Aggregator (Kompella et al., §III): `banks` banks of `rows` rows, each a
//! timestamp sum and a packet count. A packet goes to at most one bank, chosen by the leading
//! zeros of a uniform hash (bank `j` takes the packets with at least `zeros[j]` and fewer than
//! `zeros[j - 1]` of them, so its sampling probability is a power of ½ less the next bank's
//! share), and to one row of it by another hash, the same at both points.

use crate::hash::{reduce, seeded};

/// Most banks an LDA has.
pub const MAX_BANKS: usize = 4;

/// Seeds of the bank and row hashes.
const BANK_SEED: u64 = 0x4c44_4162_616e_6b21; // "LDAbank!"
const ROW_SEED: u64 = 0x4c44_4172_6f77_7321; // "LDArows!"

/// An LDA's dimensions, the same at both points.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LdaShape {
    /// Rows per bank: even, so that rows 2i and 2i + 1 collapse into a ± pair.
    pub rows: u32,
    pub banks: u32,
    /// Leading zeros bank `j` needs, strictly decreasing with `j`: bank 0 samples the rarest.
    pub zeros: [u8; MAX_BANKS],
}

/// One row: the sum of the timestamps of the packets hashed to it (wrapping: both points wrap
/// alike, and only differences are used), their count, and the XOR of their identities. The
/// paper's row is the first two; with them alone, a row that lost one packet and gained another
/// (one sent late in the interval before, arriving in this one) passes for usable with a delay
/// off by the interval's length. The XOR tells it apart.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LdaCell {
    pub ts_sum: u64,
    pub count: u64,
    pub id_xor: u64,
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for LdaShape {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for LdaCell {}

impl LdaShape {
    /// The cell (`bank * rows + row`) packet `id` goes to, if sampled.
    #[inline(always)]
    pub fn cell(&self, id: u64) -> Option<u32> {
        let zeros = seeded(BANK_SEED, id).leading_zeros();
        let mut bank = None;
        for j in 0..MAX_BANKS {
            if (j as u32) < self.banks && zeros >= self.zeros[j] as u32 {
                bank = Some(j as u32);
                break;
            }
        }
        Some(bank? * self.rows + reduce(seeded(ROW_SEED, id), self.rows))
    }

    /// Bank `j`'s sampling probability.
    pub fn probability(&self, j: usize) -> f64 {
        let half_to = |z: u8| 1.0 / (1u64 << z) as f64;
        match j {
            0 => half_to(self.zeros[0]),
            _ => half_to(self.zeros[j]) - half_to(self.zeros[j - 1]),
        }
    }

    pub fn cells(&self) -> usize {
        (self.rows * self.banks) as usize
    }
}

impl LdaCell {
    /// Adds packet `id` seen at `ts`.
    #[inline(always)]
    pub fn add(&mut self, id: u64, ts: u64) {
        self.ts_sum = self.ts_sum.wrapping_add(ts);
        self.count += 1;
        self.id_xor ^= id;
    }

    /// This row and `other` as one (the same row on two CPUs).
    pub fn merge(self, other: LdaCell) -> LdaCell {
        LdaCell {
            ts_sum: self.ts_sum.wrapping_add(other.ts_sum),
            count: self.count + other.count,
            id_xor: self.id_xor ^ other.id_xor,
        }
    }

    /// Whether both points' rows hold the same packets (as far as count and XOR tell).
    pub fn matches(&self, other: &LdaCell) -> bool {
        self.count == other.count && self.id_xor == other.id_xor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each bank takes its share of the packets (a power of ½ less the rarer banks'), rows are
    /// uniform, and every cell index is in range.
    #[test]
    fn banks_sample_with_their_probabilities() {
        let shape = LdaShape { rows: 64, banks: 2, zeros: [6, 2, 0, 0] };
        let (mut per_bank, mut per_row) = ([0u64; 2], [0u64; 64]);
        const N: u64 = 1 << 20;
        for id in 0..N {
            if let Some(c) = shape.cell(id) {
                assert!((c as usize) < shape.cells());
                per_bank[(c / shape.rows) as usize] += 1;
                per_row[(c % shape.rows) as usize] += 1;
            }
        }
        for j in 0..2 {
            let expected = shape.probability(j) * N as f64;
            assert!((per_bank[j] as f64 - expected).abs() < 5.0 * expected.sqrt(), "bank {j}: {per_bank:?}");
        }
        let per = per_row.iter().sum::<u64>() as f64 / 64.0;
        assert!(per_row.iter().all(|&n| (n as f64 - per).abs() < 5.0 * per.sqrt()), "{per_row:?}");
    }
}
