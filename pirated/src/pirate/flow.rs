//! A flow's finished epoch as plain data: what the datapath hands over (from either state
//! layout), what replay produces, and what the estimators read.

use std::{
    fmt,
    ops::{Deref, DerefMut},
};

use pirate_common::{
    key::FlowKey,
    pirate::{
        batch_break::ModeView,
        config::MODES_WIDE,
        flow::{FlowState, QUIC},
        modes::Modes,
        protocol::MULTIPLEXING,
    },
};

/// One mode of a flow's gap distribution. Bounds and counts are 32-bit as in the datapath
/// (bounds below the idle floor, counts saturating per epoch), so that a million flows' modes fit
/// in memory without a heap allocation each.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Mode {
    pub min_ns: u32,
    pub max_ns: u32,
    pub count: u32,
    /// Marked gaps: after a non-full-size packet, or (TCP, `mark_acked`) across which the client's
    /// acknowledgement number advanced.
    pub candidates: u32,
    pub sum_ns: u64,
}

impl Mode {
    /// A mode as drained with every gap marked (tests build modes from dumps this way).
    #[cfg(test)]
    pub fn all_marked(min_ns: u32, max_ns: u32, count: u32, sum_ns: u64) -> Mode {
        Mode { min_ns, max_ns, count, candidates: count, sum_ns }
    }

    pub fn mean_ns(&self) -> f64 {
        self.sum_ns as f64 / self.count.max(1) as f64
    }
}

/// A flow's modes, ascending, held in place (at most the wide layout's count).
#[derive(Clone, Copy, Default, PartialEq)]
pub struct ModeList {
    len: u8,
    modes: [Mode; MODES_WIDE],
}

impl ModeList {
    /// Appends `m`. Panics past `MODES_WIDE`: no layout holds more.
    pub fn push(&mut self, m: Mode) {
        self.modes[self.len as usize] = m;
        self.len += 1;
    }
}

impl Deref for ModeList {
    type Target = [Mode];
    fn deref(&self) -> &[Mode] {
        &self.modes[..self.len as usize]
    }
}

impl DerefMut for ModeList {
    fn deref_mut(&mut self) -> &mut [Mode] {
        &mut self.modes[..self.len as usize]
    }
}

impl FromIterator<Mode> for ModeList {
    fn from_iter<I: IntoIterator<Item = Mode>>(iter: I) -> ModeList {
        let mut list = ModeList::default();
        iter.into_iter().for_each(|m| list.push(m));
        list
    }
}

impl fmt::Debug for ModeList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Modes as the shared break finder reads them.
pub struct ModeSlice<'a>(pub &'a [Mode]);

impl ModeView for ModeSlice<'_> {
    fn modes(&self) -> usize {
        self.0.len()
    }
    fn count(&self, i: usize) -> u64 {
        self.0[i].count as u64
    }
    fn mean_ns(&self, i: usize) -> u64 {
        self.0[i].sum_ns.checked_div(self.0[i].count as u64).unwrap_or(0)
    }
    fn min_ns(&self, i: usize) -> u64 {
        self.0[i].min_ns as u64
    }
    fn max_ns(&self, i: usize) -> u64 {
        self.0[i].max_ns as u64
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlowEpoch {
    pub key: FlowKey,
    pub epoch: u32,
    /// The modes as the datapath keeps them (10 bytes each), in the wide layout's arrays:
    /// [`FlowEpoch::modes`] decodes them where they are read, so that a million flows' epochs
    /// take a fixed 224 bytes each and no allocation.
    codes: Modes<MODES_WIDE>,
    pub discarded: u64,
    /// Gaps at or above the idle floor (not in the modes).
    pub idle_gaps: u64,
    pub packets: u64,
    /// Alg. 1 causal-pair samples below the idle floor.
    pub samples: u64,
    pub samples_sum_ns: u64,
    /// Alg. 1's adaptive δ in this epoch: gaps from this long started a batch (0: the fixed δ).
    pub batch_gap_ns: u64,
    /// The TCP handshake's round trip (0: not seen).
    pub handshake_rtt_ns: u32,
    /// Gaps across which the client's acknowledgement number advanced (saturating at 65535).
    pub acked_gaps: u16,
    /// QUIC: nothing in its packets tells how many requests it has in flight.
    pub quic: bool,
    /// A TCP client that speaks, offers or may speak a protocol that multiplexes requests
    /// (`protocol::MULTIPLEXING`): nor do its packets.
    pub multiplexing: bool,
}

impl FlowEpoch {
    pub fn from_state<const M: usize>(key: FlowKey, st: &FlowState<M>) -> FlowEpoch {
        let (m, mut codes) = (&st.modes, Modes::new());
        let used = m.used();
        let wide = [&mut codes.lo, &mut codes.hi, &mut codes.count, &mut codes.candidates, &mut codes.mean];
        for (to, from) in wide.into_iter().zip([&m.lo, &m.hi, &m.count, &m.candidates, &m.mean]) {
            to[..used].copy_from_slice(&from[..used]);
        }
        codes.len = used as u8;
        FlowEpoch {
            key,
            epoch: st.epoch,
            codes,
            discarded: m.discarded as u64,
            idle_gaps: st.idle_gaps as u64,
            packets: st.packets(),
            samples: st.samples as u64,
            samples_sum_ns: st.samples_sum_ns(),
            batch_gap_ns: st.batch_gap_ns as u64,
            handshake_rtt_ns: st.handshake_rtt_ns() as u32,
            acked_gaps: st.acked_gaps,
            quic: st.has(QUIC),
            multiplexing: st.protocol & MULTIPLEXING != 0,
        }
    }

    /// The modes, ascending by `min_ns`.
    pub fn modes(&self) -> ModeList {
        let m = &self.codes;
        (0..m.used())
            .map(|i| {
                let (lo, hi) = m.bounds(i);
                let count = m.count[i] as u32;
                let sum_q16 = count as u128 * m.mean_q16(i) as u128;
                Mode {
                    min_ns: lo,
                    max_ns: hi,
                    count,
                    candidates: m.candidates[i] as u32,
                    sum_ns: ((sum_q16 + (1 << 15)) >> 16) as u64,
                }
            })
            .collect()
    }

    /// Whether the modes are internally consistent: a copy read while the datapath rewrote
    /// the entry may not be. Read off the codes, which order as the bounds they stand for.
    pub fn is_consistent(&self) -> bool {
        let m = &self.codes;
        let n = m.used();
        (0..n).all(|i| m.lo[i] <= m.hi[i] && m.count[i] > 0 && m.candidates[i] <= m.count[i])
            && (1..n).all(|i| m.hi[i - 1] < m.lo[i])
    }
}

#[cfg(test)]
mod tests {
    use pirate_common::{
        pirate::batch_break::{find, gaps, kept, BreakRules},
        pirate::config::MODES_WIDE,
        pirate::modes::Epsilon,
    };

    use super::*;

    /// The default ε (100 µs, 5 %) and span cap (2 ε).
    const EPS: Epsilon = Epsilon { abs_ns: 100_000, rel_q20: 52_429, span: 2 };

    /// The kernel reads its δ's break off its mode arrays; the same modes drained into records
    /// must read the same through `ModeSlice` (the conversion, not the estimator, which reads
    /// chains).
    #[test]
    fn the_break_is_the_same_from_the_kernel_arrays_and_from_records() {
        let rules = BreakRules {
            intra_batch_max_ns: 2_000_000,
            min_ratio_q10: 3 << 10,
            min_share_q20: 20_971,
            straggler_share_q20: 52_428,
        };
        // Pacing, reorder-stretched gaps, responses, a rare slow one and an idle gap.
        let stream: Vec<u32> = (0..400u32)
            .map(|i| match i % 8 {
                0..=2 => 20_000 + i * 37,
                3 => 900_000 + i * 100,
                7 if i % 64 == 7 => 9_000_000,
                7 if i == 399 => 900_000_000,
                _ => 5_000_000 + (i % 5) * 40_000,
            })
            .collect();
        let mut st = FlowState::<MODES_WIDE>::new(1);
        for g in stream {
            st.modes.insert(g, true, EPS, MODES_WIDE as u32);
        }
        let kernel: &Modes<MODES_WIDE> = &st.modes;
        let modes = FlowEpoch::from_state(FlowKey::default(), &st).modes();
        let records = ModeSlice(&modes);
        let floor = 200_000_000;
        let (k, r) = (kept::<_, MODES_WIDE>(kernel, floor), kept::<_, MODES_WIDE>(&records, floor));
        assert_eq!(k, r);
        let total = gaps::<_, MODES_WIDE>(kernel, k);
        assert_eq!(total, gaps::<_, MODES_WIDE>(&records, r));
        let found = find::<_, MODES_WIDE>(kernel, k, total, &rules);
        assert!(found.is_some(), "{modes:?}");
        assert_eq!(found, find::<_, MODES_WIDE>(&records, r, total, &rules));
    }
}
