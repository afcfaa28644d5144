//! The fridges in userspace memory, stepped by the datapath's own code
//! (`pirate_common::fridge`): what replay and the simulator run.

use pirate_common::{
    ctx::PacketCtx,
    fridge::{class::Event, event, packet, Fridges, Sample, Slot, Store, MAX_FRIDGES},
};

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

    pub fn shape(&self) -> &Fridges {
        &self.shape
    }

    /// New entry probabilities (recalibrated); the slots and what waits in them stay.
    pub fn reshape(&mut self, shape: Fridges) {
        debug_assert_eq!(shape.slots(), self.shape.slots());
        self.shape = shape;
    }

    /// Requests offered to each fridge so far.
    pub fn offered(&self) -> [u64; MAX_FRIDGES] {
        self.offered
    }

    /// A parsed packet: its samples to `emit`.
    pub fn packet(&mut self, pkt: &PacketCtx, emit: impl FnMut(Sample)) {
        let shape = self.shape;
        packet(&shape, pkt, self, emit)
    }

    /// A request with pair id `id` at `ts_ns`.
    pub fn request(&mut self, id: u32, ts_ns: u64) {
        let shape = self.shape;
        event(&shape, Event { class: 0, response: false, id }, ts_ns, self);
    }

    /// A response with pair id `id` at `ts_ns`: a sample if its request waited in its slot.
    pub fn response(&mut self, id: u32, ts_ns: u64) -> Option<Sample> {
        let shape = self.shape;
        event(&shape, Event { class: 0, response: true, id }, ts_ns, self)
    }
}

impl Store for FridgeTable {
    fn slot(&mut self, index: u32) -> Option<&mut Slot> {
        self.slots.get_mut(index as usize)
    }

    fn offer(&mut self, k: usize) -> u64 {
        self.offered[k] += 1;
        self.offered[k]
    }

    fn offered(&self, k: usize) -> u64 {
        self.offered[k]
    }

    fn random(&mut self) -> u32 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 32) as u32
    }
}

#[cfg(test)]
mod tests {
    use crate::fridge::{
        estimate::{weighted, Distribution, Weights},
        synthetic::{fractions, Pairs, Trace},
    };

    use super::*;

    /// `traces` traces of pairs 1 µs apart, 40 % answered after delays log-uniform in 1 µs–64 ms,
    /// until `samples` answered each, through fridges of `shape`: the true delays; the samples
    /// corrected, with weights from the requests offered and as published (each trace's as
    /// fractions of its pairs); and the samples unweighted.
    fn through(shape: Fridges, traces: u64, samples: u64) -> [Distribution; 4] {
        let pairs = Pairs { max_ns: 64e6, answered: 0.4, tail: 0.0 };
        let mut out: [Vec<(u64, f64)>; 4] = Default::default();
        for seed in 1..=traces {
            let trace = Trace::new(pairs, samples, seed);
            let (taken, offered_per_ns) = trace.through(shape);
            out[0].extend(trace.delays);
            for (to, weights) in [(1, Weights::Expected { offered_per_ns }), (2, Weights::Paper)] {
                out[to].extend(fractions(weighted(&shape, &taken, weights)));
            }
            out[3].extend(taken.iter().map(|s| (s.delay_ns, 1.0)));
        }
        out.map(Distribution::new)
    }
    fn octaves(d: &Distribution, truth: &Distribution, q: f64) -> f64 {
        (d.quantile(q).unwrap() / truth.quantile(q).unwrap()).log2()
    }

    /// A fridge of 2^10 slots (lifetime 16 K requests, a quarter of the largest delays), over
    /// eight traces: the corrected quantiles land on the true ones, while the same samples
    /// unweighted read them low.
    #[test]
    fn corrected_samples_give_the_true_quantiles() {
        let [truth, corrected, _, raw] = through(Fridges::new(&[10], &[1.0 / 16.0]).unwrap(), 8, 160_000);
        for q in [0.5, 0.9, 0.95] {
            let (c, r) = (octaves(&corrected, &truth, q), octaves(&raw, &truth, q));
            eprintln!("p{}: corrected {c:+.3}, unweighted {r:+.3} octaves", q * 100.0);
            assert!(c.abs() < 0.1, "corrected p{q} off by {c:+.3} octaves");
            assert!(r < -1.0, "unweighted p{q} only {r:+.3} octaves low");
        }
    }

    /// Two fridges of 2^9 slots with lifetimes 16 times apart (4 ms and 64 ms of requests): the
    /// short one's rare long samples carry factors up to e^16. Weighted by their expected
    /// factors, the fridges combine to the true quantiles; weighted as published, the estimates
    /// of a fridge that drew smaller factors weigh more, and the combination reads low.
    #[test]
    fn fridges_of_unlike_lifetimes_combine_without_bias() {
        let shape = Fridges::new(&[9, 9], &[1.0 / 4.0, 1.0 / 64.0]).unwrap();
        let [truth, expected, paper, _] = through(shape, 4, 400_000);
        for q in [0.5, 0.9, 0.95] {
            let (e, p) = (octaves(&expected, &truth, q), octaves(&paper, &truth, q));
            eprintln!("p{}: expected factors {e:+.3}, paper's weights {p:+.3} octaves", q * 100.0);
            assert!(e.abs() < 0.1, "p{q} off by {e:+.3} octaves");
            assert!(p < e, "p{q}: the paper's weights read {p:+.3}, ours {e:+.3} octaves");
        }
    }
}
