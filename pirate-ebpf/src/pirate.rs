//! `pirate`, the `CHAIN_PIRATE` capability: feeds each parsed packet to its flow's Pirate state
//! (Alg. 1 and 2, `pirate_common::pirate::tracker`) and hands finished epochs to pirated. One program
//! per flow-state layout; pirated chains the one it configured. The first packet of a flow in a
//! new epoch takes a detour through `pirate_epoch` (in `PIRATE_EPOCH`), which hands the finished
//! epoch over, starts the new one and re-enters `pirate`: the roll-over and the per-packet step
//! each get a verifier budget of their own.

use aya_ebpf::{bindings::BPF_NOEXIST, macros::xdp, maps::LruHashMap, programs::XdpContext};
use pirate_common::{
    counters,
    ctx::{PacketCtx, CHAIN_PIRATE},
    key::FlowKey,
    pirate::{
        flow::{EpochRecord, FlowState},
        tracker::{packet, roll_epoch, Step},
    },
};

use crate::{
    chain,
    maps::{count, BLANK, CONFIG, CTX, EPOCH, FLOWS, FLOWS_WIDE, PIRATE_EPOCH, RECORDS},
};

#[xdp]
pub fn pirate(ctx: XdpContext) -> u32 {
    measure(&ctx, &FLOWS);
    chain::from(&ctx, CHAIN_PIRATE + 1)
}

#[xdp]
pub fn pirate_wide(ctx: XdpContext) -> u32 {
    measure(&ctx, &FLOWS_WIDE);
    chain::from(&ctx, CHAIN_PIRATE + 1)
}

#[xdp]
pub fn pirate_epoch(ctx: XdpContext) -> u32 {
    roll(&FLOWS);
    chain::from(&ctx, CHAIN_PIRATE)
}

#[xdp]
pub fn pirate_epoch_wide(ctx: XdpContext) -> u32 {
    roll(&FLOWS_WIDE);
    chain::from(&ctx, CHAIN_PIRATE)
}

#[inline(always)]
fn measure<const M: usize>(ctx: &XdpContext, flows: &LruHashMap<FlowKey, FlowState<M>>) {
    let Some(pkt) = CTX.get(0) else { return };
    let Some(params) = CONFIG.get(0) else { return };
    let epoch = EPOCH.get(0).copied().unwrap_or(0);
    let st = match flows.get_ptr_mut(&pkt.key) {
        Some(p) => p,
        None => match new_flow(flows, pkt, epoch) {
            Some(p) => p,
            None => return count(counters::MAP_FULL),
        },
    };
    // SAFETY: a live map value; the flow's packets are processed on one CPU at a time.
    let st = unsafe { &mut *st };
    if st.epoch != epoch {
        // SAFETY: returns only if the slot is empty or the call fails.
        unsafe { PIRATE_EPOCH.tail_call(ctx, 0) };
        count(counters::EVENT_NO_EPOCH_PROGRAM);
    }
    count(match packet(st, pkt, params) {
        Step::SkippedPureAck => counters::PURE_ACK,
        Step::SkippedRetransmission => counters::RETRANSMISSION,
        Step::First => counters::NEW_FLOW,
        Step::Gap { .. } => counters::MEASURED,
        Step::Idle { .. } => counters::IDLE,
    });
}

/// Rolls the packet's flow over to the current epoch (`pirate_epoch`).
#[inline(always)]
fn roll<const M: usize>(flows: &LruHashMap<FlowKey, FlowState<M>>) {
    let Some(pkt) = CTX.get(0) else { return };
    let Some(params) = CONFIG.get(0) else { return };
    let epoch = EPOCH.get(0).copied().unwrap_or(0);
    if let Some(st) = flows.get_ptr_mut(&pkt.key) {
        // SAFETY: as in `measure`.
        roll_epoch(unsafe { &mut *st }, epoch, params, |finished| hand_over(&pkt.key, finished));
    }
}

#[inline(always)]
fn new_flow<const M: usize>(
    flows: &LruHashMap<FlowKey, FlowState<M>>,
    pkt: &PacketCtx,
    epoch: u32,
) -> Option<*mut FlowState<M>> {
    let blank = BLANK.get_ptr_mut(0)? as *mut FlowState<M>;
    // SAFETY: BLANK holds a FlowState<MODES_WIDE>, at least as large as FlowState<M>; only
    // `epoch` is ever written, so the rest stays zero = FlowState::new.
    unsafe {
        (*blank).epoch = epoch;
        // EEXIST means another CPU inserted it first: use that one.
        if flows.insert(&pkt.key, &*blank, BPF_NOEXIST as u64).is_ok() {
            count(counters::EVENT_FLOW_INSERTED);
        }
    }
    flows.get_ptr_mut(&pkt.key)
}

/// Sends the flow's finished epoch to pirated; counts it lost if the ring buffer is full.
#[inline(always)]
fn hand_over<const M: usize>(key: &FlowKey, st: &FlowState<M>) {
    match RECORDS.reserve::<EpochRecord<M>>(0) {
        Some(mut entry) => {
            let rec = entry.as_mut_ptr();
            // SAFETY: the reservation is sized for EpochRecord<M>; fields are written in place
            // because a whole record does not fit the 512-byte stack.
            unsafe {
                core::ptr::addr_of_mut!((*rec).key).write(*key);
                core::ptr::copy_nonoverlapping(st, core::ptr::addr_of_mut!((*rec).state), 1);
            }
            entry.submit(0);
            count(counters::EVENT_RECORD_SENT);
        }
        None => count(counters::EVENT_RECORD_LOST),
    }
}
