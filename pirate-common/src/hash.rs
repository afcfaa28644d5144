//! The hashes of the datapath, over 64-bit words: the flow hash the chain's parse writes into
//! every packet's context (and userspace recomputes: one function for both, so a flow lands in the
//! same fridge, bank or backend on either side), the fridges' and Maglev's seeded hashes, the
//! segment's (SplitMix64, and the reduction to a range without a division), and the digest of an
//! IPv6 flow's addresses. A leaf: `key` reads its words through these.

/// The flow seed where nothing draws one: replay and the tests ("PIRATED!"). The datapath
/// draws its own when it creates its maps (`maps::SEED`) and keeps it with them across
/// restarts, so that traffic cannot choose flows that share a set of the flow table, a Maglev
/// pick or an IPv6 digest: it does not know the hash.
pub const FLOW_SEED: u64 = 0x5049_5241_5445_4421;

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

/// An 80-bit digest of `words` under `seed` (64 bits, then 16 more): two independent 64-bit
/// mixes. A flow id keeps it of an IPv6 flow's four address words.
#[inline(always)]
pub fn digest(seed: u64, words: &[u64]) -> (u64, u16) {
    let a = words.iter().fold(0x5049_5241_5445_4436 ^ seed, mix);
    // The 16 more bits from a mix of their own (other constant, other shift).
    let b = words.iter().fold(0x7631_7265_7365_7276 ^ seed.rotate_left(32), |b, w| {
        let b = (b ^ w).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
        b ^ (b >> 31)
    });
    (a, b as u16)
}

/// A 64-bit hash of `x` under `seed`: SplitMix64's finalizer, whose output bits are each
/// uniform, as leading-zero sampling and modulo indexing need.
#[inline(always)]
pub fn seeded(seed: u64, x: u64) -> u64 {
    let mut z = (x ^ seed).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `h` reduced to `0..n` without a division (Lemire's multiply-shift): the kernel path pays no
/// 64-bit modulo.
#[inline(always)]
pub fn reduce(h: u64, n: u32) -> u32 {
    (((h >> 32) * n as u64) >> 32) as u32
}

/// SipHash-2-4 of `words` (each read as its eight little-endian bytes) under the 128-bit `key`:
/// a keyed pseudorandom function, so that a tag over a message cannot be made without the key
/// (RLI's reference packets carry one). Whole words only, the length folded into the last block
/// as the specification does.
#[inline(always)]
pub fn sip24(key: [u64; 2], words: &[u64]) -> u64 {
    let mut v = [
        key[0] ^ 0x736f_6d65_7073_6575,
        key[1] ^ 0x646f_7261_6e64_6f6d,
        key[0] ^ 0x6c79_6765_6e65_7261,
        key[1] ^ 0x7465_6462_7974_6573,
    ];
    for w in words {
        sip_block(&mut v, *w);
    }
    sip_block(&mut v, ((words.len() as u64 * 8) & 0xff) << 56);
    v[2] ^= 0xff;
    for _ in 0..4 {
        sip_round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// One message word through two rounds.
#[inline(always)]
fn sip_block(v: &mut [u64; 4], m: u64) {
    v[3] ^= m;
    sip_round(v);
    sip_round(v);
    v[0] ^= m;
}

#[inline(always)]
fn sip_round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13) ^ v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16) ^ v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21) ^ v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17) ^ v[2];
    v[2] = v[2].rotate_left(32);
}

#[cfg(test)]
mod tests {
    use core::hash::Hasher;

    use super::sip24;

    /// Agrees with the reference implementation (the `siphasher` crate) on whole words.
    #[test]
    fn sip24_is_siphash_2_4() {
        let key = [0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908];
        let words = [0x1122_3344_5566_7788u64, u64::MAX, 0, 0xdead_beef];
        for n in 0..=words.len() {
            let mut h = siphasher::sip::SipHasher24::new_with_keys(key[0], key[1]);
            for w in &words[..n] {
                h.write(&w.to_le_bytes());
            }
            assert_eq!(sip24(key, &words[..n]), h.finish(), "{n} words");
        }
        // The specification's vector for the empty message under key 00..0f.
        assert_eq!(sip24(key, &[]), 0x726f_db47_dd0e_0e31);
    }
}
