//! Choosing each fridge's entry probability (the paper leaves it to a search): a request waits
//! in fridge k for M_k/p_k requests offered to it on average, so p_k is set for that lifetime to
//! match the requests the fridge is offered while the delay it targets passes (§3.3, §5.2: the
//! best p lies there, and anything within 0.5–2× of it does nearly as well).

/// The entry probability that gives a fridge of `slots` slots, offered `offered_per_s` requests
/// a second, a lifetime of `target_s` seconds: M/(rate·target), at most 1.
pub fn entry_probability(slots: u32, offered_per_s: f64, target_s: f64) -> f64 {
    let waiting = offered_per_s * target_s;
    if waiting <= slots as f64 {
        return 1.0;
    }
    slots as f64 / waiting
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lifetime_matches_the_target_delay() {
        // The paper's Figure 3(a): 2^12 slots, 1 M requests/s, delays to 2^12 ms (4·10^6
        // requests): p ≈ 2^-10, near its best 2^-9.
        let p = entry_probability(4096, 1e6, 4.096);
        assert!((p - 4096.0 / 4.096e6).abs() < 1e-12);
        assert!((4096.0 / p / 1e6 - 4.096).abs() < 1e-9, "lifetime {} s", 4096.0 / p / 1e6);
        // Few requests: every one enters.
        assert_eq!(entry_probability(4096, 100.0, 1.0), 1.0);
    }
}
