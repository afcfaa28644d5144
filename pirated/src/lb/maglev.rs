//! Maglev consistent hashing with weights (Eisenbud et al., NSDI 2016, §3.4): a ring of a prime
//! number of entries, each naming a backend; a new flow takes the entry its hash points at.
//! Each backend has its own permutation of the entries (an offset and a skip from hashes of its
//! identity) and fills the ring by taking its next preferred free entry, backends taking turns
//! in proportion to their weights (the weighted population Katran uses).
//!
//! Beyond the paper, a weight change does not rebuild the ring: the entries are apportioned to
//! the weights exactly (largest remainders), a backend that must give entries up gives the ones
//! it prefers least, and the backends that gain take the freed entries by the same turns over
//! their own permutations. Only as many entries move as the change requires, where a rebuild
//! moves some that neither backend's weight asked for.

use pirate_common::hash::words_hash;

/// The default ring size, a prime (so every skip reaches every entry), as Katran's.
pub const DEFAULT_SIZE: u32 = 65_537;

const OFFSET_SEED: u64 = 0x6d61_676c_6576_6f66; // "maglevof"
const SKIP_SEED: u64 = 0x6d61_676c_6576_736b; // "maglevsk"

/// One backend's permutation of the ring's entries: the j-th preferred is offset + j·skip.
#[derive(Clone, Copy, Debug)]
struct Permutation {
    offset: u64,
    skip: u64,
    /// skip⁻¹ mod size: the rank of an entry in the permutation.
    skip_inv: u64,
}

impl Permutation {
    fn new(id: &[u64], size: u64) -> Permutation {
        let offset = words_hash(OFFSET_SEED, id) as u64 % size;
        let skip = words_hash(SKIP_SEED, id) as u64 % (size - 1) + 1;
        Permutation { offset, skip, skip_inv: pow_mod(skip, size - 2, size) }
    }

    fn entry(&self, rank: u64, size: u64) -> usize {
        ((self.offset + rank % size * self.skip) % size) as usize
    }

    fn rank(&self, entry: usize, size: u64) -> u64 {
        (entry as u64 + size - self.offset) % size * self.skip_inv % size
    }
}

/// b^e mod m, for the inverse of a skip by Fermat's little theorem (m prime).
fn pow_mod(mut b: u64, mut e: u64, m: u64) -> u64 {
    let mut r = 1;
    b %= m;
    while e > 0 {
        if e & 1 == 1 {
            r = r * b % m;
        }
        b = b * b % m;
        e >>= 1;
    }
    r
}

/// Whether `n` is prime (trial division: ring sizes are below 2^32).
pub fn is_prime(n: u32) -> bool {
    n >= 2 && (2..).take_while(|d: &u64| d * d <= n as u64).all(|d| !(n as u64).is_multiple_of(d))
}

/// A weighted Maglev ring over backends `0..n`; `entries()[hash % size]` is a flow's backend.
#[derive(Clone, Debug)]
pub struct Ring {
    /// Backend per entry; `FREE` while being filled.
    entries: Vec<u32>,
    perms: Vec<Permutation>,
}

const FREE: u32 = u32::MAX;

impl Ring {
    /// The ring of `size` (a prime) entries for backends identified by `ids` (any words: an
    /// address, a name's hash) with `weights`, of which at least one is above zero.
    pub fn new(ids: &[&[u64]], weights: &[u32], size: u32) -> anyhow::Result<Ring> {
        anyhow::ensure!(is_prime(size), "a Maglev ring's size must be a prime, not {size}");
        anyhow::ensure!(ids.len() == weights.len() && !ids.is_empty(), "one weight per backend, at least one backend");
        let perms = ids.iter().map(|id| Permutation::new(id, size as u64)).collect();
        let mut ring = Ring { entries: vec![FREE; size as usize], perms };
        ring.reweigh(weights)?;
        Ok(ring)
    }

    pub fn entries(&self) -> &[u32] {
        &self.entries
    }

    /// Entries held by each backend.
    pub fn counts(&self) -> Vec<u64> {
        let mut counts = vec![0; self.perms.len()];
        for &b in self.entries.iter().filter(|&&b| b != FREE) {
            counts[b as usize] += 1;
        }
        counts
    }

    /// New weights for the same backends; returns how many entries changed backend.
    pub fn reweigh(&mut self, weights: &[u32]) -> anyhow::Result<u64> {
        anyhow::ensure!(weights.len() == self.perms.len(), "one weight per backend");
        let targets = apportion(weights, self.entries.len() as u64)
            .ok_or_else(|| anyhow::anyhow!("every backend's weight is 0"))?;
        let size = self.entries.len() as u64;
        // Each backend's entries, by its preference: those above their target give up the
        // ones they prefer least.
        let mut held: Vec<Vec<(u64, usize)>> = vec![Vec::new(); self.perms.len()];
        for (e, &b) in self.entries.iter().enumerate().filter(|&(_, &b)| b != FREE) {
            held[b as usize].push((self.perms[b as usize].rank(e, size), e));
        }
        let mut moved = 0;
        for (held, &target) in held.iter_mut().zip(&targets) {
            if held.len() as u64 > target {
                held.sort_unstable();
                for &(_, e) in &held[target as usize..] {
                    self.entries[e] = FREE;
                    moved += 1;
                }
                held.truncate(target as usize);
            }
        }
        let mut counts: Vec<u64> = held.iter().map(|h| h.len() as u64).collect();
        self.fill(&mut counts, &targets);
        Ok(moved)
    }

    /// Fills the free entries: the backends below their targets take turns, each taking its
    /// next preferred free entry, a backend short of d entries taking d/d_max turns a round.
    fn fill(&mut self, counts: &mut [u64], targets: &[u64]) {
        let size = self.entries.len() as u64;
        let deficit: Vec<u64> = counts.iter().zip(targets).map(|(&c, &t)| t.saturating_sub(c)).collect();
        let Some(&most) = deficit.iter().max().filter(|&&d| d > 0) else { return };
        let mut credit = vec![0u64; deficit.len()];
        let mut rank = vec![0u64; deficit.len()];
        let mut left: u64 = deficit.iter().sum();
        while left > 0 {
            for b in 0..deficit.len() {
                if counts[b] == targets[b] {
                    continue;
                }
                credit[b] += deficit[b];
                if credit[b] < most {
                    continue;
                }
                credit[b] -= most;
                let perm = self.perms[b];
                let mut e = perm.entry(rank[b], size);
                while self.entries[e] != FREE {
                    rank[b] += 1;
                    e = perm.entry(rank[b], size);
                }
                self.entries[e] = b as u32;
                counts[b] += 1;
                rank[b] += 1;
                left -= 1;
            }
        }
    }
}

/// `total` entries apportioned to `weights` by largest remainders (ties to the lower index);
/// `None` if every weight is 0.
pub fn apportion(weights: &[u32], total: u64) -> Option<Vec<u64>> {
    let sum: u64 = weights.iter().map(|&w| w as u64).sum();
    if sum == 0 {
        return None;
    }
    let mut counts: Vec<u64> = weights.iter().map(|&w| w as u64 * total / sum).collect();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by_key(|&b| (std::cmp::Reverse(weights[b] as u64 * total % sum), b));
    let short = total - counts.iter().sum::<u64>();
    for &b in order.iter().take(short as usize) {
        counts[b] += 1;
    }
    Some(counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ids(n: usize) -> Vec<[u64; 2]> {
        (0..n as u64).map(|i| [0x0a00_0000 + i, 0]).collect()
    }

    fn ring(weights: &[u32], size: u32) -> Ring {
        let ids = ids(weights.len());
        let refs: Vec<&[u64]> = ids.iter().map(|i| i.as_slice()).collect();
        Ring::new(&refs, weights, size).unwrap()
    }

    #[test]
    fn primes() {
        assert!(is_prime(65_537) && is_prime(2) && is_prime(13));
        assert!(!is_prime(65_536) && !is_prime(1) && !is_prime(0) && !is_prime(65_539 * 3));
    }

    #[test]
    fn ranks_invert_the_permutation() {
        let size = 65_537;
        let p = Permutation::new(&[42, 7], size);
        for rank in [0, 1, 2, 999, 65_536] {
            assert_eq!(p.rank(p.entry(rank, size), size), rank);
        }
    }

    #[test]
    fn a_size_that_is_no_prime_is_refused() {
        let ids = ids(2);
        let refs: Vec<&[u64]> = ids.iter().map(|i| i.as_slice()).collect();
        let err = Ring::new(&refs, &[1, 1], 65_536).unwrap_err();
        assert!(err.to_string().contains("prime"), "{err}");
        assert!(Ring::new(&refs, &[0, 0], 13).is_err());
    }

    /// Equal weights: an unweighted Maglev ring, every backend within one entry of M/n, and
    /// the entries spread over the ring (no backend holds a run of more than a few).
    #[test]
    fn equal_weights_share_equally() {
        let r = ring(&[1; 7], 65_537);
        for c in r.counts() {
            assert!(c.abs_diff(65_537 / 7) <= 1, "{:?}", r.counts());
        }
        let longest = r.entries().chunk_by(|a, b| a == b).map(<[u32]>::len).max().unwrap();
        assert!(longest < 12, "a run of {longest} entries of one backend");
    }

    /// One real's weight cut by 30 % among four: the entries it gives up move, and a rebuild
    /// of the ring for the new weights would move more.
    #[test]
    fn reweighing_moves_less_than_a_rebuild() {
        let (before, after) = ([100, 100, 100, 100], [100, 100, 70, 100]);
        let mut r = ring(&before, 65_537);
        let original = r.entries().to_vec();
        let moved = r.reweigh(&after).unwrap();
        let rebuilt = ring(&after, 65_537);
        let rebuild_moves = original.iter().zip(rebuilt.entries()).filter(|(a, b)| a != b).count();
        println!("reweighed: {moved} entries moved; rebuilt: {rebuild_moves}");
        assert_eq!(moved, 65_537 / 4 - apportion(&after, 65_537).unwrap()[2]);
        assert!((moved as usize) < rebuild_moves);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Shares within 1 % of the weights (within one entry where 1 % is less than that).
        #[test]
        fn shares_follow_the_weights(weights in prop::collection::vec(0u32..1000, 2..12)) {
            prop_assume!(weights.iter().any(|&w| w > 0));
            let r = ring(&weights, 65_537);
            let sum: u32 = weights.iter().sum();
            for (&w, c) in weights.iter().zip(r.counts()) {
                let expected = w as f64 / sum as f64 * 65_537.0;
                prop_assert!((c as f64 - expected).abs() <= (0.01 * expected).max(1.0), "{c} for {expected}");
            }
            prop_assert!(r.entries().iter().all(|&b| (b as usize) < weights.len() && weights[b as usize] > 0));
        }

        /// Changing one weight moves exactly the entries its backend gains or loses, and the
        /// result is the ring of the new weights' shares.
        #[test]
        fn a_weight_change_moves_only_what_it_must(
            weights in prop::collection::vec(1u32..1000, 2..10),
            which in 0usize..10,
            new in 0u32..2000,
        ) {
            let which = which % weights.len();
            let mut r = ring(&weights, 65_537);
            let before = r.entries().to_vec();
            let mut changed = weights.clone();
            changed[which] = new;
            prop_assume!(changed.iter().any(|&w| w > 0));
            let moved = r.reweigh(&changed).unwrap();
            let differ = before.iter().zip(r.entries()).filter(|(a, b)| a != b).count() as u64;
            let required: u64 = apportion(&weights, 65_537).unwrap().iter()
                .zip(&apportion(&changed, 65_537).unwrap())
                .map(|(a, b)| a.saturating_sub(*b))
                .sum();
            prop_assert_eq!(differ, moved);
            prop_assert_eq!(moved, required);
            prop_assert_eq!(r.counts(), apportion(&changed, 65_537).unwrap());
        }
    }
}
