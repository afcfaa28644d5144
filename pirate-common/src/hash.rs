//! The flow hash the root writes into every packet's context, and userspace recomputes: one
//! function for both, so a flow lands in the same fridge, bank or backend on either side.

use crate::key::FlowKey;

/// A 32-bit hash of the whole key: each 64-bit word multiplied in (a Fibonacci-hashing
/// constant), the high bits folded down. Five multiplies: the root computes it for every packet.
#[inline(always)]
pub fn flow_hash(key: &FlowKey) -> u32 {
    words_hash(0x5049_5241_5445_4421, key.words()) // "PIRATED!"
}

/// A 32-bit hash of `words` from `seed`: each word multiplied in, the high bits folded down.
#[inline(always)]
pub fn words_hash(seed: u64, words: &[u64]) -> u32 {
    let h = words.iter().fold(seed, mix);
    (h ^ (h >> 32)) as u32
}

/// One word multiplied into `h` (a Fibonacci-hashing constant), high bits folded down.
#[inline(always)]
fn mix(h: u64, w: &u64) -> u64 {
    let h = (h ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^ (h >> 29)
}

/// An 80-bit digest of an IPv6 key's two addresses (64 bits, then 16 more), for [`FlowId`]: two
/// independent 64-bit mixes of the four address words.
///
/// [`FlowId`]: crate::key::FlowId
#[inline(always)]
pub fn address_digest(key: &FlowKey) -> (u64, u16) {
    let words = &key.words()[..4];
    let a = words.iter().fold(0x5049_5241_5445_4436, mix);
    // The 16 more bits from a mix of their own (other constant, other shift).
    let b = words.iter().fold(0x7631_7265_7365_7276u64, |b, w| {
        let b = (b ^ w).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
        b ^ (b >> 31)
    });
    (a, b as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys that differ in one field only hash apart, and the hash spreads them evenly over
    /// buckets (what fridges and Maglev lookups rely on).
    #[test]
    fn spreads_keys_that_differ_in_one_field() {
        const BUCKETS: usize = 64;
        const KEYS: u32 = 64 * 1024;
        let mut per_bucket = [0u32; BUCKETS];
        for i in 0..KEYS {
            let mut key = FlowKey { sport: (i & 0xffff) as u16, dport: 80, proto: 6, family: 4, ..FlowKey::default() };
            key.src[..4].copy_from_slice(&[10, 0, (i >> 16) as u8, 1]);
            per_bucket[flow_hash(&key) as usize % BUCKETS] += 1;
        }
        let expected = KEYS / BUCKETS as u32;
        // Binomial std-dev is sqrt(1024 · 63/64) ≈ 32: 5 σ either side.
        for (b, n) in per_bucket.iter().enumerate() {
            assert!(n.abs_diff(expected) < 160, "bucket {b}: {n} keys, expected about {expected}");
        }
    }
}
