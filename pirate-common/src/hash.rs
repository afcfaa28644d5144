//! The flow hash the root writes into every packet's context, and userspace recomputes: one
//! function for both, so a flow lands in the same fridge, bank or backend on either side.

use crate::key::FlowKey;

/// A 32-bit hash of the whole key (murmur3's word mixing and finaliser).
#[inline(always)]
pub fn flow_hash(key: &FlowKey) -> u32 {
    const WORDS: usize = size_of::<FlowKey>() / 4;
    // SAFETY: FlowKey is 4-byte aligned, WORDS · 4 bytes long and plain data.
    let words = unsafe { &*(key as *const FlowKey as *const [u32; WORDS]) };
    let mut h: u32 = 0x5049_5241; // "PIRA"
    for w in words {
        let k = w.wrapping_mul(0xcc9e_2d51).rotate_left(15).wrapping_mul(0x1b87_3593);
        h = (h ^ k).rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    h ^= size_of::<FlowKey>() as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
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
