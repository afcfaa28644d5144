//! The fridges in userspace memory, stepped by the datapath's own code
//! (`pirate_common::fridge`): what replay and the simulator run.

use pirate_common::fridge::{request, response, Fridges, Sample, Slot, MAX_FRIDGES};

pub struct FridgeTable {
    shape: Fridges,
    slots: Vec<Slot>,
    /// Requests offered to each fridge.
    offered: [u64; MAX_FRIDGES],
    /// splitmix64 state: the datapath draws `bpf_get_prandom_u32` instead.
    rng: u64,
}

impl FridgeTable {
    pub fn new(shape: Fridges, seed: u64) -> FridgeTable {
        FridgeTable {
            shape,
            slots: vec![Slot::default(); shape.slots() as usize],
            offered: [0; MAX_FRIDGES],
            rng: seed,
        }
    }

    /// A request with pair id `id` at `ts_ns`.
    pub fn request(&mut self, id: u32, ts_ns: u64) {
        let (k, at) = self.shape.place(id);
        self.offered[k] += 1;
        let rand = self.next_u32();
        request(&self.shape, k, &mut self.slots[at as usize], id, ts_ns, self.offered[k], rand);
    }

    /// A response with pair id `id` at `ts_ns`: a sample if its request waited in its slot.
    pub fn response(&mut self, id: u32, ts_ns: u64) -> Option<Sample> {
        let (k, at) = self.shape.place(id);
        response(k, &mut self.slots[at as usize], id, ts_ns, self.offered[k])
    }

    fn next_u32(&mut self) -> u32 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 32) as u32
    }
}

#[cfg(test)]
mod tests {
    use pirate_common::fridge::pair_hash;

    use super::*;
    use crate::fridge::estimate::{weighted, Distribution, Weights};

    /// Pairs 1 µs apart, 40 % answered after delays log-uniform in 1 µs–64 ms, through a fridge
    /// of 2^10 slots (lifetime 16 K requests, a quarter of the largest delays), over eight traces
    /// combined as the paper combines its runs: the corrected quantiles land on the true ones,
    /// while the same samples unweighted read them low.
    #[test]
    fn corrected_samples_give_the_true_quantiles() {
        let shape = Fridges::new(&[10], &[1.0 / 16.0]).unwrap();
        let (mut truth, mut corrected, mut raw) = (Vec::new(), Vec::new(), Vec::new());
        for seed in 1..=8u64 {
            let mut state = seed.wrapping_mul(0x2545_f491_4f6c_dd1d);
            let mut uniform = move || {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                (state >> 11) as f64 / (1u64 << 53) as f64
            };
            let (lo, hi) = (1_000f64.ln(), 64e6f64.ln());
            let mut events = Vec::new();
            for i in 0..400_000u64 {
                let id = pair_hash(&[seed, i]);
                events.push((i * 1_000, false, id));
                if uniform() < 0.4 {
                    let delay = (lo + (hi - lo) * uniform()).exp() as u64;
                    events.push((i * 1_000 + delay, true, id));
                    truth.push((delay, 1.0));
                }
            }
            events.sort_unstable();
            let mut table = FridgeTable::new(shape, seed);
            let mut samples = Vec::new();
            for (ts, response, id) in events {
                match response {
                    true => samples.extend(table.response(id, ts)),
                    false => table.request(id, ts),
                }
            }
            // Each trace's weights as fractions of its pairs, so that every trace counts alike.
            let w = weighted(&shape, &samples, Weights::MeanFactor);
            let sum: f64 = w.iter().map(|x| x.1).sum();
            corrected.extend(w.into_iter().map(|(d, x)| (d, x / sum)));
            raw.extend(samples.iter().map(|s| (s.delay_ns, 1.0)));
        }
        let (truth, corrected, raw) = (Distribution::new(truth), Distribution::new(corrected), Distribution::new(raw));
        let octaves = |d: &Distribution, q| (d.quantile(q).unwrap() / truth.quantile(q).unwrap()).log2();
        for q in [0.5, 0.9, 0.95] {
            let (c, r) = (octaves(&corrected, q), octaves(&raw, q));
            eprintln!("p{}: corrected {c:+.3}, unweighted {r:+.3} octaves", q * 100.0);
            assert!(c.abs() < 0.1, "corrected p{q} off by {c:+.3} octaves");
            assert!(r < -1.0, "unweighted p{q} only {r:+.3} octaves low");
        }
    }
}
