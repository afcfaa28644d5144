//! `pirate`, the `CHAIN_PIRATE` capability: feeds each parsed packet to its flow's Pirate state
//! (Alg. 1 and 2, `pirate_common::pirate::tracker`) in the flow table (`pirate_common::pirate::table`)
//! and hands finished epochs to pirated. One program per flow-state layout; pirated chains the
//! one it configured. A flow's first packet, and its first in each epoch, take a detour through
//! `pirate_flow` (in `PIRATE_FLOW`), which puts the flow into the table or hands its finished
//! epoch over and starts the new one, then re-enters `pirate`: what happens once per flow and
//! epoch and what happens per packet each get a verifier budget of their own.

use aya_ebpf::{macros::xdp, maps::Array, programs::XdpContext};
use pirate_common::{
    counters,
    ctx::{PacketCtx, CHAIN_PIRATE},
    key::{FlowId, FAMILY_V6},
    pirate::{
        config::Params,
        flow::{EpochRecord, FlowState},
        measures,
        table::{sets_of, Set, WAYS},
        tracker::{packet, roll_epoch, Step},
    },
};

use crate::{
    chain,
    maps::{count, CONFIG, EPOCH, FLOWS, FLOWS_WIDE, PIRATE_FLOW, RECORDS, V6_NAMES},
    root::{parsed, Packet},
};

#[xdp]
pub fn pirate(ctx: XdpContext) -> u32 {
    let Some(pkt) = parsed(&ctx) else { return chain::forward(&ctx) };
    measure(&ctx, pkt, &FLOWS);
    chain::from(&ctx, CHAIN_PIRATE + 1)
}

#[xdp]
pub fn pirate_wide(ctx: XdpContext) -> u32 {
    let Some(pkt) = parsed(&ctx) else { return chain::forward(&ctx) };
    measure(&ctx, pkt, &FLOWS_WIDE);
    chain::from(&ctx, CHAIN_PIRATE + 1)
}

#[xdp]
pub fn pirate_flow(ctx: XdpContext) -> u32 {
    let Some(pkt) = parsed(&ctx) else { return chain::forward(&ctx) };
    enter(pkt, &FLOWS);
    chain::from(&ctx, CHAIN_PIRATE)
}

#[xdp]
pub fn pirate_flow_wide(ctx: XdpContext) -> u32 {
    let Some(pkt) = parsed(&ctx) else { return chain::forward(&ctx) };
    enter(pkt, &FLOWS_WIDE);
    chain::from(&ctx, CHAIN_PIRATE)
}

/// What every `pirate` program starts from: the packet, the parameters, the epoch, and where
/// the packet's flow sits: `way` of `set` (the first of its two sets, or the second, whose
/// index is `other`), or `way` = [`WAYS`] if in neither.
struct Found<'a, const M: usize> {
    pkt: &'a mut PacketCtx,
    params: &'a Params,
    epoch: u32,
    id: FlowId,
    set: &'a mut Set<M>,
    other: u32,
    way: usize,
}

/// Set `index` of the table. Looked up again rather than kept: a reference chosen between two
/// becomes, compiled, a stack address the verifier refuses.
#[inline(always)]
fn set<const M: usize>(flows: &Array<Set<M>>, index: u32) -> Option<&'static mut Set<M>> {
    // SAFETY: a live map value; a flow's packets are processed on one CPU at a time.
    flows.get_ptr_mut(index).map(|p| unsafe { &mut *p })
}

#[inline(always)]
fn find<const M: usize>(pkt: &'static mut PacketCtx, flows: &Array<Set<M>>) -> Option<Found<'static, M>> {
    let params = CONFIG.get(0)?;
    let epoch = EPOCH.get(0).copied().unwrap_or(0);
    let (a, b) = sets_of(pkt.hash, params.table_sets);
    let id = pkt.id;
    // Indices, not references, out of the choice: see `set`.
    let mut at = (a, b, set(flows, a)?.find(&id));
    if at.2 >= WAYS {
        at = (b, a, set(flows, b)?.find(&id));
    }
    let (index, other, way) = at;
    Some(Found { pkt, params, epoch, id, set: set(flows, index)?, other, way })
}

/// The state in `way` of `set`, through the context's scratch: read back from map memory, the
/// way is a value in 0..WAYS to the verifier, not one constant per way it took.
#[inline(always)]
fn state<'a, const M: usize>(pkt: &mut PacketCtx, set: &'a mut Set<M>, way: usize) -> &'a mut FlowState<M> {
    pkt.way = way as u32;
    // SAFETY: a field of the per-CPU context, just written.
    let way = unsafe { core::ptr::read_volatile(&pkt.way) } as usize & (WAYS - 1);
    &mut set.states[way]
}

#[inline(always)]
fn measure<const M: usize>(ctx: &XdpContext, pkt: &'static mut PacketCtx, flows: &Array<Set<M>>) {
    let Some(f) = find(pkt, flows) else { return count(counters::MAP_FULL) };
    if !measures(f.pkt) {
        return count(counters::UNSUPPORTED);
    }
    if f.way >= WAYS || f.set.states[f.way & (WAYS - 1)].epoch != f.epoch {
        // SAFETY: returns only if the slot is empty or the call fails.
        unsafe { PIRATE_FLOW.tail_call(ctx, 0) };
        count(counters::EVENT_NO_FLOW_PROGRAM);
        if f.way >= WAYS {
            // Nowhere to count the packet into.
            return count(counters::MAP_FULL);
        }
    }
    let st = state(f.pkt, f.set, f.way);
    count(match packet(st, f.pkt, &Packet(ctx), f.params) {
        Step::SkippedPureAck => counters::PURE_ACK,
        Step::SkippedRetransmission => counters::RETRANSMISSION,
        Step::First => counters::NEW_FLOW,
        Step::Gap { .. } => counters::MEASURED,
        Step::Idle { .. } => counters::IDLE,
    });
}

/// Puts the packet's flow into one of its two sets, in an empty way or in place of the flow
/// whose last packet is oldest (handing that one's closed epoch over first, if pirated has yet
/// to drain it).
#[inline(always)]
fn insert<const M: usize>(flows: &Array<Set<M>>, f: Found<'_, M>) {
    let Some(other) = set(flows, f.other) else { return };
    let ((way, cost), (other_way, other_cost)) = (f.set.victim(), other.victim());
    let set = if other_cost < cost { other } else { f.set };
    let way = if other_cost < cost { other_way } else { way } & (WAYS - 1);
    let old = set.ids[way];
    if old.family != 0 && set.states[way].hand_over_due(f.epoch) {
        hand_over(&old, &set.states[way]);
    }
    set.ids[way] = f.id;
    set.states[way] = FlowState::new(f.epoch);
    count(counters::EVENT_FLOW_INSERTED);
    if f.id.family == FAMILY_V6 {
        let mut names = [0u8; 32];
        names[..16].copy_from_slice(&f.pkt.key.src);
        names[16..].copy_from_slice(&f.pkt.key.dst);
        // A full table loses the name: pirated then counts the flow as unnamed.
        let _ = V6_NAMES.insert(&f.id, &names, 0);
    }
}

/// Puts the packet's flow into the table, or rolls it over to the current epoch
/// (`pirate_flow`).
#[inline(always)]
fn enter<const M: usize>(pkt: &'static mut PacketCtx, flows: &Array<Set<M>>) {
    let Some(f) = find(pkt, flows) else { return };
    if f.way >= WAYS {
        return insert(flows, f);
    }
    let id = f.id;
    roll_epoch(state(f.pkt, f.set, f.way), f.epoch, f.params, |finished| hand_over(&id, finished));
}

/// Sends a flow's finished epoch to pirated; counts it lost if the ring buffer is full.
#[inline(always)]
fn hand_over<const M: usize>(id: &FlowId, st: &FlowState<M>) {
    match RECORDS.reserve::<EpochRecord<M>>(0) {
        Some(mut entry) => {
            let rec = entry.as_mut_ptr();
            // SAFETY: the reservation is sized for EpochRecord<M>; fields are written in place
            // because a whole record does not fit the 512-byte stack.
            unsafe {
                core::ptr::addr_of_mut!((*rec).id).write(*id);
                core::ptr::copy_nonoverlapping(st, core::ptr::addr_of_mut!((*rec).state), 1);
            }
            entry.submit(0);
            count(counters::EVENT_RECORD_SENT);
        }
        None => count(counters::EVENT_RECORD_LOST),
    }
}
