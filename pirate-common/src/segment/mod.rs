//! Two-point one-way latency (LDA and RDA): what the upstream and downstream points record per
//! packet, computed identically at both, in the kernel and in replay.
//!
//! A packet is known at both points by its 64-bit identity (a hash of fields that do not change
//! in flight); every choice a point makes for a packet (sampled or not, which bank, row or
//! bucket, which sign) is a hash of that identity, so both points make the same choices.

pub mod lda;
pub mod rda;

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
