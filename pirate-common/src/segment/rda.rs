//! The Reconcilable Difference Aggregator (Sun et al., §V): `banks` banks of `buckets` buckets,
//! each the XOR of its packets' identities, the sum of their timestamps and their count. A packet
//! goes to one bucket of every bank, by an independent hash per bank, so that the difference of
//! two points' RDAs can be peeled packet by packet.

use crate::hash::{reduce, seeded};

/// Most banks an RDA has (the paper's choice is 2).
pub const MAX_BANKS: usize = 4;

/// Seed of bank `j`'s hash: this plus `j`.
const BANK_SEED: u64 = 0x5244_4162_616e_6b30; // "RDAbank0"

/// An RDA's dimensions, the same at both points.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RdaShape {
    pub buckets: u32,
    pub banks: u32,
}

/// One bucket. The count is signed: a difference of two buckets is one too.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RdaBucket {
    pub id_xor: u64,
    pub ts_sum: u64,
    pub count: i64,
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for RdaShape {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for RdaBucket {}

impl RdaShape {
    /// Packet `id`'s bucket in bank `bank`, as an index into the whole array.
    #[inline(always)]
    pub fn bucket(&self, bank: u32, id: u64) -> u32 {
        bank * self.buckets + reduce(seeded(BANK_SEED + bank as u64, id), self.buckets)
    }

    pub fn len(&self) -> usize {
        (self.buckets * self.banks) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl RdaBucket {
    /// This bucket and `other` as one (the same bucket on two CPUs).
    pub fn merge(self, other: RdaBucket) -> RdaBucket {
        RdaBucket {
            id_xor: self.id_xor ^ other.id_xor,
            ts_sum: self.ts_sum.wrapping_add(other.ts_sum),
            count: self.count + other.count,
        }
    }

    /// Adds (`sign` 1) or removes (-1) packet `id` seen at `ts`.
    #[inline(always)]
    pub fn update(&mut self, id: u64, ts: u64, sign: i64) {
        self.id_xor ^= id;
        self.ts_sum = match sign {
            1 => self.ts_sum.wrapping_add(ts),
            _ => self.ts_sum.wrapping_sub(ts),
        };
        self.count += sign;
    }
}
