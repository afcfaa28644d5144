//! Gap values as 16-bit codes: a 12-bit significand and a 5-bit exponent, so a mode bound costs
//! two bytes instead of four. Values below 4096 ns are exact; above, the grid's step is 1/2048 to
//! 1/4096 of the value (0.05 % at most), far inside ε. Codes order as their values do, so modes
//! whose bounds lie on the grid stay ascending and disjoint as integers.

/// Bits of the significand below its leading one.
const FRACTION_BITS: u32 = 11;
const FRACTION_MASK: u32 = (1 << FRACTION_BITS) - 1;
/// The largest exponent a `u32` value needs: `(0xfff << 20)` is the largest grid value below 2^32.
const MAX_EXPONENT: u32 = 21;

/// The grid value of `code`. Branch-free: the verifier walks it once per mode bound read.
#[inline(always)]
pub fn decode(code: u16) -> u32 {
    let e = code as u32 >> FRACTION_BITS;
    // 1 for every exponent but 0 (e ≤ 31): the implicit leading one, and how far the shift
    // falls short of e.
    let implicit = (e + 31) >> 5;
    ((code as u32 & FRACTION_MASK) | (implicit << FRACTION_BITS)) << (e - implicit)
}

/// The largest grid value: gaps above it take its code.
pub const MAX: u32 = ((1 << (FRACTION_BITS + 1)) - 1) << (MAX_EXPONENT - 1);

/// The code of the grid value nearest `v` (ties up). Branch-free but for the clamp to [`MAX`],
/// so that the verifier walks what follows once, not once per branch.
#[inline(always)]
pub fn encode(v: u32) -> u16 {
    let v = if v > MAX { MAX } else { v };
    // How far v must shift down to fit 12 bits: bits beyond 12, or 0.
    let excess = (32 - v.leading_zeros()) as i32 - (FRACTION_BITS as i32 + 1);
    let shift = (excess & !(excess >> 31)) as u32;
    let wide = v as u64;
    let significand = (wide >> shift) + ((wide << 1 >> shift) & 1);
    // Below 4096 the code is the value; above, a significand of 2048..4096 at exponent
    // shift + 1 is (shift << 11) + significand, and one that rounded up to 4096 is the next
    // exponent's first code: the same sum.
    ((shift << FRACTION_BITS) as u64 + significand) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_are_exact_and_the_grid_is_fine_and_ordered() {
        for v in 0..8192u32 {
            let g = decode(encode(v));
            assert!(g.abs_diff(v) <= 1, "{v} → {g}");
            if v < 4096 {
                assert_eq!(g, v);
            }
        }
        let mut prev = 0;
        for code in 1..=encode(u32::MAX) {
            let v = decode(code);
            assert!(v > prev, "code {code}: {v} after {prev}");
            assert_eq!(encode(v), code, "{v}");
            prev = v;
        }
        for v in [4096u32, 4097, 99_999, 1_000_000, 123_456_789, 4_000_000_000, u32::MAX] {
            let g = decode(encode(v));
            assert!((g as f64 - v as f64).abs() <= v as f64 / 4096.0 + 1.0, "{v} → {g}");
        }
    }
}
