//! Datapath parameters, written once by pirated into the `CONFIG` array map before attaching.

/// Leave pure TCP ACKs (ACK flag, no payload) out of the gap stream (Pirate §3.4, first heuristic).
pub const FLAG_SKIP_PURE_ACKS: u32 = 1 << 0;
/// Mark gaps that follow a non-full-size packet as inter-batch-gap candidates (§3.4, second heuristic).
pub const FLAG_MARK_AFTER_SHORT: u32 = 1 << 1;
/// Alg. 1's δ adapts per flow: each epoch takes the break found in the flow's previous epoch
/// (`delta_ns` is then only the first epoch's δ).
pub const FLAG_ADAPTIVE_DELTA: u32 = 1 << 2;
/// For TCP, mark a gap as an inter-batch-gap candidate when the client's acknowledgement number
/// advanced across it (server data arrived), instead of by the short-packet heuristic.
pub const FLAG_MARK_ACKED: u32 = 1 << 3;
/// Leave TCP segments that carry no new data (retransmissions) out of the gap stream.
pub const FLAG_SKIP_RETRANSMISSIONS: u32 = 1 << 4;

/// A flow's δ adapts only from epochs with at least this many gaps: fewer say little.
pub const MIN_GAPS_FOR_BREAK: u64 = 8;

/// A payload is "full size" only if it is at least this long and as long as the largest payload
/// seen on the flow: below it the flow never sends MSS-sized segments and every packet ends a batch.
pub const MIN_FULL_PAYLOAD: u16 = 536;

/// Gaps are kept in nanoseconds as `u32`; longer ones (> 4.29 s) are idle periods and saturate.
pub const MAX_GAP_NS: u64 = u32::MAX as u64;

/// Modes a flow state can hold in the compact layout (the default N = 10 fits).
pub const MODES_COMPACT: usize = 10;
/// Modes a flow state can hold in the wide layout (N up to 12: the verifier's walk of the
/// per-packet step grows steeply with N, and at 12 it is near its limit).
pub const MODES_WIDE: usize = 12;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Alg. 1: a gap longer than this starts a new batch (a causal pair); with
    /// `FLAG_ADAPTIVE_DELTA`, only in a flow's first epoch.
    pub delta_ns: u64,
    /// Gaps and causal samples at or above this are retransmission timeouts or idle periods.
    pub idle_floor_ns: u64,
    /// Alg. 2: a gap within ε of a mode's [min, max] joins it; ε = max(epsilon_ns,
    /// gap · epsilon_rel_q20 / 2^20).
    pub epsilon_ns: u32,
    pub epsilon_rel_q20: u32,
    /// Alg. 2: at most this many modes per flow (≤ the layout's capacity).
    pub max_modes: u16,
    /// The widest a mode grows, in ε at its lower end (0: unbounded, Alg. 2 as published).
    pub mode_span: u16,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// The break between intra- and inter-batch gaps (adaptive δ).
    pub rules: super::batch_break::BreakRules,
    /// Sets in the flow table (`table::sets_for`).
    pub table_sets: u32,
    pub _pad: u32,
}

impl Params {
    pub const fn has(&self, flag: u32) -> bool {
        self.flags & flag != 0
    }

    pub const fn epsilon(&self) -> super::modes::Epsilon {
        super::modes::Epsilon { abs_ns: self.epsilon_ns, rel_q20: self.epsilon_rel_q20, span: self.mode_span as u32 }
    }
}
