//! Random numbers: the kernel's, for what an attacker must not guess (keys, hash seeds), and the
//! synthetic traces' generator (xorshift64*, seeded, no dependency).

/// Fills `bytes` from the kernel's random source.
pub fn fill_random(bytes: &mut [u8]) -> std::io::Result<()> {
    // SAFETY: writes at most `bytes.len()` bytes into `bytes`.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    match usize::try_from(got) {
        Ok(n) if n == bytes.len() => Ok(()),
        Ok(_) => Err(std::io::Error::other("the kernel's random source returned too few bytes")),
        Err(_) => Err(std::io::Error::last_os_error()),
    }
}

/// Uniform in [0, 1) from xorshift64* state `state` (never 0).
pub fn uniform(state: &mut u64) -> f64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
}
