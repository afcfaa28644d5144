//! Every map of the datapath, named as `pirated` looks them up. All but the per-CPU blank state
//! and the ring buffers are pinned by name, so that a restarted pirated's programs share them
//! with the running ones. Each daemon consumes a ring of its own: what the old ring holds when a
//! new daemon starts is stale (its first epoch flip comes after its programs are in place), and
//! aya 0.13's reader cannot resume a ring another reader consumed from.

use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, BPF_F_NO_PREALLOC},
    macros::map,
    maps::{Array, HashMap, LruHashMap, LruPerCpuHashMap, PerCpuArray, ProgramArray, RingBuf},
};
use pirate_common::{
    counters,
    ctx::{PacketCtx, CHAIN_SLOTS, FORWARD_SLOTS},
    fridge::{Fridges, Slot, MAX_FRIDGES},
    key::{FlowId, FlowKey},
    lb::{LbShape, RealCounters, VipKey, MAX_REALS, MAX_VIPS},
    pirate::{
        config::{Params, MODES_COMPACT, MODES_WIDE},
        table::Set,
    },
    rli::{
        flow::RliFlow,
        reference::{RliShape, Window},
        Reference, RING,
    },
    segment::{lda::LdaCell, rda::RdaBucket, Seen, SegmentShape},
};

/// Written once by pirated before attaching.
#[map]
pub static CONFIG: Array<Params> = Array::pinned(1, 0);
/// The flow seed pirated drew when it created the maps (`pirate_common::hash::FLOW_SEED`).
#[map]
pub static SEED: Array<u64> = Array::pinned(1, 0);
/// The current epoch; pirated advances it, the datapath tags flow state with it.
#[map]
pub static EPOCH: Array<u32> = Array::pinned(1, 0);
/// Packet outcomes and events, indexed by `pirate_common::counters`.
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::pinned(counters::COUNT, 0);
/// The packet being processed on this CPU, written by `pirate_root`, read down the chain.
#[map]
pub static CTX: PerCpuArray<PacketCtx> = PerCpuArray::pinned(1, 0);
/// The capabilities, at their `pirate_common::ctx::CHAIN_*` slots; a disabled one is empty.
#[map]
pub static CHAIN: ProgramArray = ProgramArray::pinned(CHAIN_SLOTS, 0);
/// Forwarders (Katran's balancer, `pirate_lb`), registered by position as in Katran's root array.
#[map]
pub static FORWARD: ProgramArray = ProgramArray::pinned(FORWARD_SLOTS, 0);
/// Flow tables (`pirate_common::pirate::table`), one per state layout; pirated sizes the one it
/// uses and shrinks the other to one set. Mmapable: pirated reads them in place.
#[map]
pub static FLOWS: Array<Set<MODES_COMPACT>> = Array::pinned(1, BPF_F_MMAPABLE);
#[map]
pub static FLOWS_WIDE: Array<Set<MODES_WIDE>> = Array::pinned(1, BPF_F_MMAPABLE);
/// IPv6 flows' addresses (source, destination) by id, written as a flow enters the table;
/// allocated as used, and emptied by pirated as it learns them.
#[map]
pub static V6_NAMES: HashMap<FlowId, [u8; 32]> = HashMap::pinned(65536, BPF_F_NO_PREALLOC);
/// `pirate_flow` or `pirate_flow_wide`, whichever matches the layout in use.
#[map]
pub static PIRATE_FLOW: ProgramArray = ProgramArray::pinned(1, 0);
/// Finished epochs of flows that saw a packet after the epoch changed.
#[map]
pub static RECORDS: RingBuf = RingBuf::with_byte_size(1 << 22, 0);

/// The fridges' shape and enabled classes, written by pirated (it recalibrates the entry
/// probabilities here).
#[map]
pub static FRIDGE_SHAPE: Array<Fridges> = Array::pinned(1, 0);
/// Every fridge's slots; pirated sizes it.
#[map]
pub static FRIDGE_SLOTS: Array<Slot> = Array::pinned(1, 0);
/// Requests offered to each fridge, over all CPUs.
#[map]
pub static FRIDGE_OFFERED: Array<u64> = Array::pinned(MAX_FRIDGES as u32, 0);
/// Samples, to pirated; pirated sizes it.
#[map]
pub static FRIDGE_SAMPLES: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// `pirate_lb`'s shape, written by pirated.
#[map]
pub static LB_SHAPE: Array<LbShape> = Array::pinned(1, 0);
/// VIP → its number (its rings and half).
#[map]
pub static LB_VIPS: HashMap<VipKey, u32> = HashMap::pinned(MAX_VIPS, 0);
/// Two rings per VIP (`pirate_common::lb::ring_index`); pirated sizes it and writes it in place.
#[map]
pub static LB_RINGS: Array<u32> = Array::pinned(1, BPF_F_MMAPABLE);
/// Per VIP, the half of its rings in use.
#[map]
pub static LB_HALVES: Array<u32> = Array::pinned(MAX_VIPS, 0);
/// Real index → IPv4 address.
#[map]
pub static LB_REALS: Array<[u8; 4]> = Array::pinned(MAX_REALS, 0);
/// Flow → real index; pirated sizes it.
#[map]
pub static LB_CONNS: LruHashMap<FlowId, u32> = LruHashMap::pinned(1, 0);
/// What each real was sent.
#[map]
pub static LB_COUNTERS: PerCpuArray<RealCounters> = PerCpuArray::pinned(MAX_REALS, 0);

/// The segment's shape, written by pirated (`interval_ns` 0: off).
#[map]
pub static SEGMENT_SHAPE: Array<SegmentShape> = Array::pinned(1, 0);
/// Per half, the packets this CPU recorded and their interval.
#[map]
pub static SEGMENT_SEEN: PerCpuArray<Seen> = PerCpuArray::pinned(2, 0);
/// LDA cells, both halves; pirated sizes it. Per CPU: every sum adds up across CPUs.
#[map]
pub static SEGMENT_LDA: PerCpuArray<LdaCell> = PerCpuArray::pinned(1, 0);
/// RDA buckets, both halves; pirated sizes it. Per CPU: XORs and sums merge across CPUs.
#[map]
pub static SEGMENT_RDA: PerCpuArray<RdaBucket> = PerCpuArray::pinned(1, 0);
/// Packets the RDA took, to pirated's cache; pirated sizes it.
#[map]
pub static SEGMENT_CACHE: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// RLI's reference check and sampling, written by pirated.
#[map]
pub static RLI_SHAPE: Array<RliShape> = Array::pinned(1, 0);
/// The sequence numbers of the references taken.
#[map]
pub static RLI_WINDOW: Array<Window> = Array::pinned(1, 0);
/// The last `RING` references by sequence number modulo `RING`; entry `RING` holds the newest's
/// sequence number, entry `RING + 1` the last number a sampled reference took.
#[map]
pub static RLI_REFS: Array<Reference> = Array::pinned(RING + 2, 0);
/// Per-flow counters, per CPU (a flow's packets on one CPU settle on their own); pirated sizes it.
#[map]
pub static RLI_FLOWS: LruPerCpuHashMap<FlowKey, RliFlow> = LruPerCpuHashMap::pinned(1, 0);
/// The references taken, to pirated (the segment's delay quantiles).
#[map]
pub static RLI_TAKEN: RingBuf = RingBuf::with_byte_size(1 << 18, 0);

#[inline(always)]
pub fn count(index: u32) {
    if let Some(c) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer.
        unsafe { *c += 1 };
    }
}
