//! The fridge paper's synthetic traces (§5.2): requests 1 µs apart, a share of them answered
//! after delays log-uniform from 1 µs to T (optionally a tail out to 16 T), and a trace's run
//! through fridges. What the simulator's benchmark and the estimators' tests measure on.

use pirate_common::fridge::{class::pair_hash, Fridges, Sample, MAX_FRIDGES};

use super::table::FridgeTable;
use crate::rng::uniform;

/// Between consecutive requests: 1 M requests a second.
pub const REQUEST_GAP_NS: u64 = 1_000;
const MIN_DELAY_NS: f64 = 1_000.0;

/// What a trace's pairs look like.
#[derive(Clone, Copy, Debug)]
pub struct Pairs {
    /// T, the largest delay (but for the tail).
    pub max_ns: f64,
    pub answered: f64,
    /// The fraction of delays log-uniform in (T, 16 T) instead.
    pub tail: f64,
}

#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub ts_ns: u64,
    pub id: u32,
    pub response: bool,
}

pub struct Trace {
    /// What the trace, its ids and the fridges' entry draws come from.
    pub seed: u64,
    /// From the first request to the last.
    pub span_ns: u64,
    /// Requests and responses in time order.
    pub events: Vec<Event>,
    /// The true delays, weighted 1.
    pub delays: Vec<(u64, f64)>,
}

impl Trace {
    /// Requests until `samples` of them are answered.
    pub fn new(pairs: Pairs, samples: u64, seed: u64) -> Trace {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let (lo, hi) = (MIN_DELAY_NS.ln(), pairs.max_ns.ln());
        let tail_hi = hi + 16f64.ln();
        let (mut events, mut delays) = (Vec::new(), Vec::new());
        let mut i = 0u64;
        while (delays.len() as u64) < samples {
            let ts_ns = i * REQUEST_GAP_NS;
            let id = pair_hash(&[seed, i]) ^ seed as u32;
            events.push(Event { ts_ns, id, response: false });
            if uniform(&mut state) < pairs.answered {
                let (from, to) = if uniform(&mut state) < pairs.tail { (hi, tail_hi) } else { (lo, hi) };
                let delay = (from + (to - from) * uniform(&mut state)).exp() as u64;
                events.push(Event { ts_ns: ts_ns + delay, id, response: true });
                delays.push((delay, 1.0));
            }
            i += 1;
        }
        events.sort_by_key(|e| (e.ts_ns, e.response));
        Trace { seed, span_ns: i * REQUEST_GAP_NS, events, delays }
    }

    /// The samples fridges of `shape` take from the trace, and the requests offered to each
    /// per nanosecond (what `Weights::Expected` weighs them by).
    pub fn through(&self, shape: Fridges) -> (Vec<Sample>, [f64; MAX_FRIDGES]) {
        let mut table = FridgeTable::new(shape, self.seed);
        let mut samples = Vec::new();
        for e in &self.events {
            match e.response {
                true => samples.extend(table.response(e.id, e.ts_ns)),
                false => table.request(e.id, e.ts_ns),
            }
        }
        (samples, table.offered().map(|n| n as f64 / self.span_ns as f64))
    }
}

/// Weighted delays as fractions of their total: runs combined so count alike, as the paper
/// combines its runs.
pub fn fractions(weighted: Vec<(u64, f64)>) -> impl Iterator<Item = (u64, f64)> {
    let total: f64 = weighted.iter().map(|w| w.1).sum();
    weighted.into_iter().map(move |(d, w)| (d, w / total))
}
