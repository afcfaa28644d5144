//! Per-flow Pirate state, exactly as it sits in the `FLOWS` map, and the record that hands a
//! finished epoch to pirated.

use super::{
    batch_break,
    config::{Params, FLAG_ADAPTIVE_DELTA, MIN_GAPS_FOR_BREAK},
    grid,
    modes::Modes,
};
use crate::key::FlowId;

/// `FlowState::status` bits. `ACTIVE` and `RESTARTED` are the epoch's, the others the flow's.
/// A packet has entered the gap stream (0 is a valid timestamp in replay).
pub const STARTED: u8 = 1;
/// `last_ack` holds an acknowledgement number (any value, 0 included).
pub const ACK_SEEN: u8 = 2;
/// `high_seq` holds a sequence number.
pub const SEQ_SEEN: u8 = 4;
/// The last packet in the gap stream was shorter than full size.
pub const PREV_SHORT: u8 = 8;
/// A packet of `epoch` entered the gap stream.
pub const ACTIVE: u8 = 16;
/// A packet of `epoch` entered the gap stream with no gap before it (the flow's first, or one
/// earlier than the last).
pub const RESTARTED: u8 = 32;
/// The last packet in the gap stream was the client's SYN: the next one carrying an ACK ends
/// the handshake, and the time between them is its round trip.
pub const SYN_SENT: u8 = 64;
/// The flow is QUIC (see `tracker::PacketInfo::quic`): its acknowledgements are encrypted, so
/// nothing in its packets tells how many requests it has in flight.
pub const QUIC: u8 = 128;

/// A `u64` timestamp as two 32-bit halves: 4-byte aligned.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nanos {
    lo: u32,
    hi: u32,
}

impl Nanos {
    pub const ZERO: Nanos = Nanos { lo: 0, hi: 0 };

    #[inline(always)]
    pub fn get(&self) -> u64 {
        ((self.hi as u64) << 32) | self.lo as u64
    }

    #[inline(always)]
    pub fn set(&mut self, ns: u64) {
        self.lo = ns as u32;
        self.hi = (ns >> 32) as u32;
    }
}

/// Alg. 1's sample sum is kept in units of 2^SUM_SHIFT ns (rounded) so that a `u32` holds 68 s:
/// an epoch (≤ 60 s) plus one batch below the idle floor. ±8 ns per sample, zero-mean.
pub const SUM_SHIFT: u32 = 4;

/// Per-flow state, 148 bytes with 10 modes. Timestamps are the datapath's monotonic clock
/// (`bpf_ktime_get_ns`, or the capture's clock in replay). The continuity fields survive an
/// epoch change; the measurement fields (`modes`, counters) belong to `epoch` and are handed
/// over and reset when it ends. Counters saturate. 4-byte aligned (see [`Nanos`]) so that no
/// padding follows the modes of either layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowState<const M: usize> {
    /// Arrival of the last packet in the gap stream (valid once `STARTED`).
    pub last_pkt: Nanos,
    /// Alg. 1: time from the first packet of the current batch to the last packet (saturating
    /// beyond 4.29 s, above any idle floor).
    pub batch_age_ns: u32,
    /// Alg. 1 samples of this epoch below the idle floor: their sum (2^SUM_SHIFT ns units).
    pub samples_sum: u32,
    /// Adaptive δ: gaps from this long start a new batch in this epoch (0: not derived yet, the
    /// configured δ applies).
    pub batch_gap_ns: u32,
    /// The highest acknowledgement number the client has sent in the gap stream (TCP).
    pub last_ack: u32,
    /// The sequence number just past the furthest data the client has sent (TCP).
    pub high_seq: u32,
    /// The epoch the measurement fields belong to.
    pub epoch: u32,
    /// Alg. 1 samples of this epoch below the idle floor (the sum stops when this saturates).
    pub samples: u16,
    /// Largest payload seen on the flow (full-size heuristic).
    pub max_payload: u16,
    /// Gaps of this epoch at or above the idle floor, kept out of the modes.
    pub idle_gaps: u16,
    /// Gaps of this epoch below the idle floor across which a TCP client's acknowledgement
    /// number advanced: server data arrived in each. More of them than batches means responses
    /// arrive while batches are sent: streams multiplexed on the connection.
    pub acked_gaps: u16,
    /// The TCP handshake's round trip as the vantage point saw it, SYN to the client's ACK, as
    /// a [`grid`] code (0: not seen). No response comes back faster, which tells the gaps
    /// between interleaved streams' requests from batches.
    pub handshake_rtt: u16,
    /// The `STARTED` … `RESTARTED` bits.
    pub status: u8,
    /// What the client's first data says of its protocol: the `protocol::OPENED` … bits.
    pub protocol: u8,
    pub modes: Modes<M>,
}

impl<const M: usize> FlowState<M> {
    pub const fn new(epoch: u32) -> Self {
        FlowState {
            last_pkt: Nanos::ZERO,
            batch_age_ns: 0,
            samples_sum: 0,
            batch_gap_ns: 0,
            last_ack: 0,
            high_seq: 0,
            epoch,
            samples: 0,
            max_payload: 0,
            idle_gaps: 0,
            acked_gaps: 0,
            handshake_rtt: 0,
            status: 0,
            protocol: 0,
            modes: Modes::new(),
        }
    }

    pub fn has(&self, bit: u8) -> bool {
        self.status & bit != 0
    }

    /// Packets of `epoch` that entered the gap stream: one per gap (in a mode, discarded or
    /// idle) and one that started the stream, if any (exact until a count saturates).
    pub fn packets(&self) -> u64 {
        let m = &self.modes;
        let counted: u64 = m.count[..m.used()].iter().map(|&c| c as u64).sum();
        counted + m.discarded as u64 + self.idle_gaps as u64 + self.has(RESTARTED) as u64
    }

    /// The handshake's round trip in ns (0: not seen).
    pub fn handshake_rtt_ns(&self) -> u64 {
        grid::decode(self.handshake_rtt) as u64
    }

    /// Alg. 1's sample sum in ns.
    pub fn samples_sum_ns(&self) -> u64 {
        (self.samples_sum as u64) << SUM_SHIFT
    }

    /// Whether the epoch this state holds must be handed over before `epoch` starts: only the
    /// epoch that just closed, and only if it saw packets. An older one was already read from the
    /// table by pirated's drain, and an empty one carries nothing.
    pub fn hand_over_due(&self, epoch: u32) -> bool {
        self.measured(epoch.wrapping_sub(1))
    }

    /// Whether this state holds packets of `epoch`.
    pub fn measured(&self, epoch: u32) -> bool {
        self.epoch == epoch && self.has(ACTIVE)
    }

    /// Starts `epoch`: the measurement fields restart, the flow's timing continues. With
    /// adaptive δ, the new epoch's δ lies midway across the break found in the finished epoch's
    /// modes (every gap ends a batch if there is none); epochs of few gaps leave it as it is.
    pub fn start_epoch(&mut self, epoch: u32, p: &Params) {
        if p.has(FLAG_ADAPTIVE_DELTA) {
            let m = &self.modes;
            let kept = batch_break::kept::<_, M>(m, p.idle_floor_ns);
            let total = batch_break::gaps::<_, M>(m, kept);
            if total >= MIN_GAPS_FOR_BREAK {
                self.batch_gap_ns = match batch_break::find::<_, M>(m, kept, total, &p.rules) {
                    // Mode bounds are u32 gaps: so is their midpoint.
                    Some(b) => ((b.lower_max_ns + b.upper_min_ns) / 2) as u32,
                    None => 1,
                };
            }
        }
        self.epoch = epoch;
        self.samples_sum = 0;
        self.samples = 0;
        self.idle_gaps = 0;
        self.acked_gaps = 0;
        self.status &= !(ACTIVE | RESTARTED);
        self.modes.clear();
    }
}

/// One flow's finished epoch, handed from the datapath to pirated through the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochRecord<const M: usize> {
    pub id: FlowId,
    pub state: FlowState<M>,
}
