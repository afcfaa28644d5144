//! Per-flow Pirate state, exactly as it sits in the `FLOWS` map, and the record that hands a
//! finished epoch to pirated.

use super::{
    batch_break,
    config::{Params, FLAG_ADAPTIVE_DELTA, MIN_GAPS_FOR_BREAK},
    modes::Modes,
};
use crate::key::FlowKey;

/// `FlowState::status` bits.
pub const STARTED: u8 = 1;
pub const ACK_SEEN: u8 = 2;
pub const SEQ_SEEN: u8 = 4;

/// Per-flow state. Timestamps are the datapath's monotonic clock (`bpf_ktime_get_ns`, or the
/// capture's clock in replay). The continuity fields survive an epoch change; the measurement
/// fields (`modes`, counters) belong to `epoch` and are handed over and reset when it ends.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowState<const M: usize> {
    /// Arrival of the last packet in the gap stream (valid once `STARTED`).
    pub last_pkt_ns: u64,
    /// Alg. 1: arrival of the first packet of the current batch.
    pub last_batch_ns: u64,
    /// Alg. 1 samples of this epoch below the idle floor: their sum and count.
    pub samples_sum_ns: u64,
    /// Adaptive δ: gaps from this long start a new batch in this epoch (0: not derived yet, the
    /// configured δ applies).
    pub batch_gap_ns: u32,
    /// The highest acknowledgement number the client has sent in the gap stream (TCP).
    pub last_ack: u32,
    /// The sequence number just past the furthest data the client has sent (TCP).
    pub high_seq: u32,
    pub samples: u32,
    /// The epoch the measurement fields belong to.
    pub epoch: u32,
    /// Packets of this epoch that entered the gap stream.
    pub packets: u32,
    /// Largest payload seen on the flow (full-size heuristic).
    pub max_payload: u16,
    /// Whether the last packet in the gap stream was shorter than full size.
    pub prev_short: u8,
    /// `STARTED`: a packet has entered the gap stream (0 is a valid timestamp in replay);
    /// `ACK_SEEN`: `last_ack` holds an acknowledgement number (any value, 0 included);
    /// `SEQ_SEEN`: `high_seq` holds a sequence number.
    pub status: u8,
    /// Gaps of this epoch at or above the idle floor, kept out of the modes.
    pub idle_gaps: u32,
    pub modes: Modes<M>,
}

impl<const M: usize> FlowState<M> {
    pub const fn new(epoch: u32) -> Self {
        FlowState {
            last_pkt_ns: 0,
            last_batch_ns: 0,
            samples_sum_ns: 0,
            batch_gap_ns: 0,
            last_ack: 0,
            high_seq: 0,
            samples: 0,
            epoch,
            packets: 0,
            max_payload: 0,
            prev_short: 0,
            status: 0,
            idle_gaps: 0,
            modes: Modes::new(),
        }
    }

    /// Whether the epoch this state holds must be handed over before `epoch` starts: only the
    /// epoch that just closed, and only if it saw packets. An older one was already read from the
    /// table by pirated's drain, and an empty one carries nothing.
    pub fn hand_over_due(&self, epoch: u32) -> bool {
        self.packets > 0 && self.epoch.wrapping_add(1) == epoch
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
        self.samples_sum_ns = 0;
        self.samples = 0;
        self.packets = 0;
        self.idle_gaps = 0;
        self.modes.clear();
    }
}

/// One flow's finished epoch, handed from the datapath to pirated through the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochRecord<const M: usize> {
    pub key: FlowKey,
    pub state: FlowState<M>,
}
