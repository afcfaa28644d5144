//! The synthetic traces' generator: xorshift64*, seeded, no dependency.

/// Uniform in [0, 1) from xorshift64* state `state` (never 0).
pub fn uniform(state: &mut u64) -> f64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
}
