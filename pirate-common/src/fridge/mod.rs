//! Fridges (Zheng et al., "Unbiased Delay Measurement in the Data Plane"): request→response
//! delays sampled from hash-indexed slots, each sample carrying how many requests it survived,
//! so that pirated can undo the bias against long delays. The per-request and per-response step
//! lives here once, for the XDP program and for replay and the simulator.
//!
//! Up to [`MAX_FRIDGES`] fridges split the pairs by hash (a share of the hash space each, in
//! proportion to its slots). Fridge k's counter counts the requests offered to it; a request
//! enters with probability p_k, overwriting its slot, so each later request offered evicts it
//! with probability p_k/M_k, and a sample that survived x of them was kept with probability
//! p_k·(1 − p_k/M_k)^x: its correction factor is the inverse, over the fridge's share.

pub mod class;

use crate::ctx::PacketCtx;
use class::Event;

/// Fridges a configuration may have.
pub const MAX_FRIDGES: usize = 4;

/// One slot: a waiting request. `ts_ns` 0 marks an empty slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    /// The request's pair id (see [`pair_hash`](class::pair_hash)).
    pub id: u32,
    pub _pad: u32,
    pub ts_ns: u64,
    /// The fridge's counter once this request was offered (itself counted).
    pub offered: u64,
}

// SAFETY: plain data, no padding.
#[cfg(feature = "user")]
unsafe impl aya::Pod for Slot {}

/// A response's match: the delay and the requests offered to its fridge meanwhile; the record
/// the datapath sends pirated.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    pub delay_ns: u64,
    pub survived: u64,
    pub fridge: u8,
    /// The pair's class (`class::NAMES`).
    pub class: u8,
    pub _pad: [u8; 6],
}

// SAFETY: plain data, no padding.
#[cfg(feature = "user")]
unsafe impl aya::Pod for Sample {}

/// The fridges' shape, as the datapath reads it (one entry of a config map).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fridges {
    /// Fridges in use (1..=[`MAX_FRIDGES`]); fridge k's slots follow fridge k−1's.
    pub count: u32,
    /// The enabled classes, a bit each (`class::TCP_HANDSHAKE` …).
    pub classes: u32,
    /// log2 of each fridge's slots.
    pub slots_log2: [u32; MAX_FRIDGES],
    /// Where each fridge's slots start in the slot array.
    pub first_slot: [u32; MAX_FRIDGES],
    /// A request enters when a uniform u32 is below this: p · 2^32 (2^32: always).
    pub threshold: [u64; MAX_FRIDGES],
    /// The upper end (exclusive, over 2^32) of each fridge's share of the hash space.
    pub share_end: [u64; MAX_FRIDGES],
}

// SAFETY: plain data, no padding.
#[cfg(feature = "user")]
unsafe impl aya::Pod for Fridges {}

impl Fridges {
    /// Fridge k with 2^`slots_log2[k]` slots and entry probability `p[k]`, shares of the hash
    /// space in proportion to the slots. `None` for 0 or more than [`MAX_FRIDGES`] fridges, or
    /// a p outside (0, 1].
    pub fn new(slots_log2: &[u32], p: &[f64]) -> Option<Fridges> {
        let n = slots_log2.len();
        let valid = (1..=MAX_FRIDGES).contains(&n) && p.len() == n;
        if !valid || p.iter().any(|&p| !(p > 0.0 && p <= 1.0)) || slots_log2.iter().any(|&s| s > 24) {
            return None;
        }
        let mut f = Fridges { count: n as u32, ..Fridges::default() };
        let total: u64 = slots_log2.iter().map(|&s| 1u64 << s).sum();
        let mut seen = 0u64;
        for k in 0..n {
            f.slots_log2[k] = slots_log2[k];
            f.first_slot[k] = seen as u32;
            f.threshold[k] = ((p[k] * 4_294_967_296.0) as u64).clamp(1, 1 << 32);
            seen += 1 << slots_log2[k];
            f.share_end[k] = (seen << 32) / total;
        }
        Some(f)
    }

    /// Slots over all fridges.
    pub fn slots(&self) -> u32 {
        (0..self.count as usize).map(|k| 1u32 << self.slots_log2[k]).sum()
    }

    /// Fridge k's entry probability.
    pub fn p(&self, k: usize) -> f64 {
        self.threshold[k] as f64 / 4_294_967_296.0
    }

    /// Fridge k's share of the pairs.
    pub fn share(&self, k: usize) -> f64 {
        let start = if k == 0 { 0 } else { self.share_end[k - 1] };
        (self.share_end[k] - start) as f64 / 4_294_967_296.0
    }

    /// The fridge and slot (index into the slot array) of pair `id`.
    #[inline(always)]
    pub fn place(&self, id: u32) -> (usize, u32) {
        // A second mix of the id, so that the fridge (high bits) and the slot (low bits) do not
        // follow the id's own bits.
        let h = (id as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let (pick, at) = ((h >> 32) as u32 as u64, h as u32 ^ (h >> 47) as u32);
        let mut k = 0;
        while k + 1 < self.count as usize && k + 1 < MAX_FRIDGES && pick >= self.share_end[k] {
            k += 1;
        }
        let k = k.min(MAX_FRIDGES - 1);
        let mask = (1u32 << (self.slots_log2[k] & 31)) - 1;
        (k, self.first_slot[k] + (at & mask))
    }
}

/// Where the fridges live: BPF maps in the kernel, memory in replay and the simulator.
pub trait Store {
    /// Slot `index` of the slot array.
    fn slot(&mut self, index: u32) -> Option<&mut Slot>;
    /// Counts one more request offered to fridge `k`; the count with it.
    fn offer(&mut self, k: usize) -> u64;
    /// The requests offered to fridge `k` so far.
    fn offered(&self, k: usize) -> u64;
    /// A uniform u32.
    fn random(&mut self) -> u32;
}

/// One packet through the fridges: its requests offered, its response's sample to `emit`.
#[inline(always)]
pub fn packet<S: Store>(f: &Fridges, pkt: &PacketCtx, store: &mut S, mut emit: impl FnMut(Sample)) {
    class::events(pkt, f.classes, |e| {
        if let Some(sample) = event(f, e, pkt.ts_ns, store) {
            emit(sample);
        }
    });
}

/// One request (offered to its fridge) or response (a sample if its request waits) at `ts_ns`.
#[inline(always)]
pub fn event<S: Store>(f: &Fridges, e: Event, ts_ns: u64, store: &mut S) -> Option<Sample> {
    let (k, at) = f.place(e.id);
    if e.response {
        let offered = store.offered(k);
        let mut sample = response(k, store.slot(at)?, e.id, ts_ns, offered)?;
        sample.class = e.class;
        return Some(sample);
    }
    let offered = store.offer(k);
    let rand = store.random();
    request(f, k, store.slot(at)?, e.id, ts_ns, offered, rand);
    None
}

/// A request offered to its fridge: `offered` is the fridge's counter after counting it, `rand`
/// a uniform u32. Enters (overwriting whatever waited there) with the fridge's probability.
#[inline(always)]
pub fn request(f: &Fridges, k: usize, slot: &mut Slot, id: u32, ts_ns: u64, offered: u64, rand: u32) {
    if k < MAX_FRIDGES && (rand as u64) < f.threshold[k] {
        *slot = Slot { id, _pad: 0, ts_ns: ts_ns.max(1), offered };
    }
}

/// A response: a sample if its request waits in `slot` (which it then clears); `offered` is the
/// fridge's counter now.
#[inline(always)]
pub fn response(k: usize, slot: &mut Slot, id: u32, ts_ns: u64, offered: u64) -> Option<Sample> {
    if slot.ts_ns == 0 || slot.id != id || ts_ns < slot.ts_ns {
        return None;
    }
    let sample = Sample {
        delay_ns: ts_ns - slot.ts_ns,
        survived: offered.saturating_sub(slot.offered),
        fridge: k as u8,
        ..Sample::default()
    };
    *slot = Slot::default();
    Some(sample)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_the_slots_and_places_stay_inside_their_fridge() {
        let f = Fridges::new(&[10, 12], &[0.5, 0.125]).unwrap();
        assert_eq!(f.slots(), 1024 + 4096);
        assert!((f.share(0) - 0.2).abs() < 1e-9 && (f.share(1) - 0.8).abs() < 1e-9);
        assert!((f.p(1) - 0.125).abs() < 1e-12);
        let mut per = [0u32; 2];
        for id in 0..100_000u32 {
            let (k, slot) = f.place(class::pair_hash(&[id as u64]));
            per[k] += 1;
            let range = f.first_slot[k]..f.first_slot[k] + (1 << f.slots_log2[k]);
            assert!(range.contains(&slot), "{id}: fridge {k} slot {slot}");
        }
        // Binomial: σ = √(10⁵·0.16) ≈ 126; 5 σ.
        assert!(per[0].abs_diff(20_000) < 640, "{per:?}");
        assert!(Fridges::new(&[], &[]).is_none() && Fridges::new(&[10], &[0.0]).is_none());
        assert!(Fridges::new(&[10; 5], &[1.0; 5]).is_none() && Fridges::new(&[10], &[1.5]).is_none());
    }

    #[test]
    fn a_response_matches_its_request_once_and_counts_what_it_survived() {
        let f = Fridges::new(&[4], &[1.0]).unwrap();
        let mut slot = Slot::default();
        request(&f, 0, &mut slot, 7, 1_000, 3, u32::MAX);
        assert_eq!(response(0, &mut slot, 8, 5_000, 9), None, "another id");
        assert_eq!(
            response(0, &mut slot, 7, 5_000, 9),
            Some(Sample { delay_ns: 4_000, survived: 6, ..Sample::default() })
        );
        assert_eq!(response(0, &mut slot, 7, 6_000, 9), None, "cleared");
        let half = Fridges::new(&[4], &[0.5]).unwrap();
        request(&half, 0, &mut slot, 7, 1_000, 3, 1 << 31);
        assert_eq!(slot, Slot::default(), "rand at the threshold stays out");
        request(&half, 0, &mut slot, 7, 1_000, 3, (1 << 31) - 1);
        assert_eq!(slot.id, 7);
    }
}
