//! The per-packet step of a flow: Alg. 1 (threshold causal pairs) and Alg. 2 (gap modes),
//! with the §3.4 heuristics and the acknowledgement mark. The `pirate` XDP program and replay
//! both call [`step`], the one copy of what a packet does to its flow.

use super::{
    config::{
        Params, FLAG_ADAPTIVE_DELTA, FLAG_MARK_ACKED, FLAG_MARK_AFTER_SHORT, FLAG_SKIP_PURE_ACKS,
        FLAG_SKIP_RETRANSMISSIONS, MAX_GAP_NS, MIN_FULL_PAYLOAD,
    },
    flow::{FlowState, ACK_SEEN, ACTIVE, PREV_SHORT, QUIC, RESTARTED, SEQ_SEEN, STARTED, SUM_SHIFT, SYN_SENT},
    grid,
    modes::Placed,
    protocol,
};
use crate::{
    ctx::PacketCtx,
    parse::{Frame, IPPROTO_TCP, IPPROTO_UDP, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
};

/// What a packet is, as far as the trackers care (read off the packet context).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacketInfo {
    /// Transport payload bytes (TCP data, UDP datagram body).
    pub payload: u16,
    /// A TCP segment with ACK set, no payload and none of SYN, FIN, RST.
    pub pure_ack: bool,
    /// A TCP segment's acknowledgement number (ACK set): how much of the server's data the
    /// client had received when it sent this.
    pub ack: Option<u32>,
    /// TCP (with `ack`): the sequence number just past the segment's data.
    pub data_end: u32,
    /// A TCP SYN without ACK: the client opening the connection.
    pub syn: bool,
    /// A UDP datagram to port 443 (HTTP/3's), or one that starts as a QUIC long header of
    /// version 1, 2 or a draft does (the form bits, then a version whose first three bytes are
    /// those of 0x00000001, 0x6b3343cf or 0xff0000xx): QUIC.
    pub quic: bool,
}

impl PacketInfo {
    #[inline(always)]
    pub fn of(pkt: &PacketCtx) -> PacketInfo {
        if pkt.key.proto != IPPROTO_TCP {
            let long = pkt.head >> 30 == 0b11 && matches!(pkt.head & 0x00ff_ffff, 0 | 0x6b_3343 | 0xff_0000);
            let quic = pkt.key.proto == IPPROTO_UDP && (pkt.key.dport == 443 || (long && pkt.payload >= 5));
            return PacketInfo { payload: pkt.payload, pure_ack: false, ack: None, data_end: 0, syn: false, quic };
        }
        let flags = pkt.tcp_flags;
        let pure_ack = pkt.payload == 0 && flags & TCP_ACK != 0 && flags & (TCP_SYN | TCP_FIN | TCP_RST) == 0;
        // Sequence space is mod 2^32: the payload's length wraps with it. A FIN takes a number
        // too: the first one is new (it ends the last batch), a retransmitted one is not.
        let data_end = pkt.seq.wrapping_add(pkt.payload as u32).wrapping_add((flags & TCP_FIN != 0) as u32);
        let ack = (flags & TCP_ACK != 0).then_some(pkt.ack);
        let syn = flags & TCP_SYN != 0 && ack.is_none();
        PacketInfo { payload: pkt.payload, pure_ack, ack, data_end, syn, quic: false }
    }
}

/// What one packet did to its flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Left out of the gap stream (pure ACK heuristic).
    SkippedPureAck,
    /// Left out of the gap stream: TCP data the client had already sent.
    SkippedRetransmission,
    /// The first packet in the flow's gap stream: no gap yet.
    First,
    /// A gap was measured; `placed` tells whether Alg. 2 kept it.
    Gap { gap_ns: u64, placed: Placed },
    /// A gap at or above the idle floor: counted, kept out of the modes.
    Idle { gap_ns: u64 },
}

/// A packet of epoch `epoch` on a flow (parsed into `pkt` from `frame`): [`roll_epoch`], then
/// [`packet`]. The datapath runs the two in separate programs (each has its own verifier
/// budget); replay runs this.
#[inline(always)]
pub fn step<const M: usize, F: Frame + ?Sized>(
    st: &mut FlowState<M>,
    epoch: u32,
    pkt: &PacketCtx,
    frame: &F,
    p: &Params,
    hand_over: impl FnOnce(&FlowState<M>),
) -> Step {
    roll_epoch(st, epoch, p, hand_over);
    packet(st, pkt, frame, p)
}

/// A state still holding an earlier epoch than `epoch` first gives it to `hand_over` (when
/// [`FlowState::hand_over_due`]) and starts `epoch`.
#[inline(always)]
pub fn roll_epoch<const M: usize>(
    st: &mut FlowState<M>,
    epoch: u32,
    p: &Params,
    hand_over: impl FnOnce(&FlowState<M>),
) {
    if st.epoch != epoch {
        if st.hand_over_due(epoch) {
            hand_over(st);
        }
        st.start_epoch(epoch, p);
    }
}

/// [`on_packet`] for a packet parsed into `pkt` from `frame`, whose data may first tell the
/// flow's protocol ([`protocol::sniff`]).
#[inline(always)]
pub fn packet<const M: usize, F: Frame + ?Sized>(
    st: &mut FlowState<M>,
    pkt: &PacketCtx,
    frame: &F,
    p: &Params,
) -> Step {
    protocol::sniff(st, pkt, frame);
    on_packet(st, pkt.ts_ns, PacketInfo::of(pkt), p)
}

/// Feeds one packet arriving at `now` (ns) to its flow's state.
pub fn on_packet<const M: usize>(st: &mut FlowState<M>, now: u64, pkt: PacketInfo, p: &Params) -> Step {
    if pkt.quic {
        st.status |= QUIC;
    }
    // The handshake's ACK (pure or not) after the client's SYN, the latest one if it was
    // retransmitted: the gap between them is the round trip.
    if st.status & SYN_SENT != 0 && pkt.ack.is_some() {
        st.status &= !SYN_SENT;
        let rtt = now.saturating_sub(st.last_pkt.get());
        st.handshake_rtt = grid::encode(if rtt > MAX_GAP_NS { MAX_GAP_NS as u32 } else { rtt as u32 });
    }
    if pkt.pure_ack && p.has(FLAG_SKIP_PURE_ACKS) {
        return Step::SkippedPureAck;
    }
    // A segment that brings no data beyond what the client already sent is a retransmission (or
    // an original that a later segment overtook): it was not triggered by a response, and a
    // request retransmitted while its batch waits would otherwise split that wait into two
    // batch-ending gaps. Leaving it out joins them, so the time stays and the batch counts once.
    // Nor does a keepalive probe (one byte behind) or an RST. (A pure ACK never does: it is
    // left to its own heuristic.)
    if pkt.ack.is_some() && !pkt.pure_ack && p.has(FLAG_SKIP_RETRANSMISSIONS) {
        if st.status & SEQ_SEEN != 0 && (pkt.data_end.wrapping_sub(st.high_seq) as i32) <= 0 {
            return Step::SkippedRetransmission;
        }
        st.high_seq = pkt.data_end;
        st.status |= SEQ_SEEN;
    }
    st.status |= ACTIVE;

    // Full size: as long as the largest payload the flow has sent, and long enough to be an MSS.
    if pkt.payload > st.max_payload {
        st.max_payload = pkt.payload;
    }
    let short = pkt.payload < st.max_payload || st.max_payload < MIN_FULL_PAYLOAD;
    let after_short = st.status & PREV_SHORT != 0 || !p.has(FLAG_MARK_AFTER_SHORT);
    st.status = if short { st.status | PREV_SHORT } else { st.status & !PREV_SHORT };
    // The gap before a TCP segment whose acknowledgement number advanced held the arrival of
    // server data: a response, so the gap ends a batch. Reordered segments (an older ack) and
    // the client's pacing within a batch (the same ack) do not. Pure ACKs (when they are in the
    // gap stream at all) acknowledge the segments of a response as they arrive: they neither
    // mark nor move the reference, so the next request still sees the whole response.
    let acked = match pkt.ack {
        Some(_) if pkt.pure_ack => Some(false),
        Some(ack) => {
            let advanced = st.status & ACK_SEEN == 0 || (ack.wrapping_sub(st.last_ack) as i32) > 0;
            if advanced {
                st.last_ack = ack;
                st.status |= ACK_SEEN;
            }
            Some(advanced)
        }
        None => None,
    };
    let candidate = match acked {
        Some(advanced) if p.has(FLAG_MARK_ACKED) => advanced,
        _ => after_short,
    };

    if pkt.syn {
        st.status |= SYN_SENT;
    }
    let last = st.last_pkt.get();
    if st.status & STARTED == 0 || now < last {
        st.status |= STARTED | RESTARTED;
        st.last_pkt.set(now);
        st.batch_age_ns = 0;
        return Step::First;
    }
    let gap_ns = now - last;
    st.last_pkt.set(now);
    let g = if gap_ns > MAX_GAP_NS { MAX_GAP_NS as u32 } else { gap_ns as u32 };
    st.batch_age_ns = st.batch_age_ns.saturating_add(g);

    // Alg. 1: a gap above δ (or from the adaptive δ on) ends the batch; the time since the
    // previous batch start is a sample.
    let ends_batch = if st.batch_gap_ns != 0 && p.has(FLAG_ADAPTIVE_DELTA) {
        gap_ns >= st.batch_gap_ns as u64
    } else {
        gap_ns > p.delta_ns
    };
    if ends_batch {
        let sample = st.batch_age_ns;
        st.batch_age_ns = 0;
        if (sample as u64) < p.idle_floor_ns && st.samples < u16::MAX {
            st.samples += 1;
            let units = (sample as u64 + (1 << (SUM_SHIFT - 1))) >> SUM_SHIFT;
            st.samples_sum = st.samples_sum.saturating_add(units as u32);
        }
    }

    // Idle periods and retransmission timeouts carry no response latency (§3.3's floor): they
    // stay out of the modes, where a full table could merge them with shorter gaps into a mode
    // whose mean lies below the floor, and so count their time as response latency.
    if gap_ns >= p.idle_floor_ns {
        st.idle_gaps = st.idle_gaps.saturating_add(1);
        return Step::Idle { gap_ns };
    }

    if acked == Some(true) {
        st.acked_gaps = st.acked_gaps.saturating_add(1);
    }
    // Alg. 2 on the gap (below the floor, at most 4 s: it fits).
    let placed = st.modes.insert(g, candidate, p.epsilon(), p.max_modes as u32);
    Step::Gap { gap_ns, placed }
}
