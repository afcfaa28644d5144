//! XDP program `pirate`: measures each client→server packet into its flow's Pirate state, then
//! hands the packet on untouched (tail call into `ROOT_ARRAY[0]` if a program sits there, e.g.
//! Katran or `pirate_lb`, else `XDP_PASS`). It never drops: every failure is counted and passed.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{xdp_action, BPF_NOEXIST},
    helpers::bpf_ktime_get_ns,
    macros::{map, xdp},
    maps::{Array, LruHashMap, PerCpuArray, ProgramArray, RingBuf},
    programs::XdpContext,
};
use pirate_common::{
    config::{Params, MODES_COMPACT, MODES_WIDE},
    counters,
    flow::{EpochRecord, FlowKey, FlowState},
    parse::{parse, Frame, Reject},
    tracker::on_packet,
};

/// Written once by pirated before attaching.
#[map]
static CONFIG: Array<Params> = Array::with_max_entries(1, 0);
/// The current epoch; pirated advances it, the datapath tags flow state with it.
#[map]
static EPOCH: Array<u32> = Array::with_max_entries(1, 0);
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counters::COUNT, 0);
/// Flow tables, one per state layout; pirated sizes the one it uses and shrinks the other to 1.
#[map]
static FLOWS: LruHashMap<FlowKey, FlowState<MODES_COMPACT>> = LruHashMap::with_max_entries(65536, 0);
#[map]
static FLOWS_WIDE: LruHashMap<FlowKey, FlowState<MODES_WIDE>> = LruHashMap::with_max_entries(1, 0);
/// An all-zero flow state per CPU, the source of new flows' entries (too big for the stack).
/// Sized for the wide layout, so it covers both.
const _: () = assert!(size_of::<FlowState<MODES_COMPACT>>() <= size_of::<FlowState<MODES_WIDE>>());
#[map]
static BLANK: PerCpuArray<FlowState<MODES_WIDE>> = PerCpuArray::with_max_entries(1, 0);
/// Finished epochs of flows that saw a packet after the epoch changed.
#[map]
static RECORDS: RingBuf = RingBuf::with_byte_size(1 << 22, 0);
/// Katran-compatible chaining: slot 0 receives every packet after measurement.
#[map]
static ROOT_ARRAY: ProgramArray = ProgramArray::with_max_entries(1, 0);

struct Packet<'a>(&'a XdpContext);

impl Frame for Packet<'_> {
    #[inline(always)]
    fn read<T: Copy>(&self, off: usize) -> Option<T> {
        let start = self.0.data();
        let end = self.0.data_end();
        if start + off + core::mem::size_of::<T>() > end {
            return None;
        }
        // SAFETY: bounds checked against data_end just above.
        Some(unsafe { core::ptr::read_unaligned((start + off) as *const T) })
    }
}

#[inline(always)]
fn count(index: u32) {
    if let Some(c) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer.
        unsafe { *c += 1 };
    }
}

#[xdp]
pub fn pirate(ctx: XdpContext) -> u32 {
    measure(&ctx, &FLOWS);
    pass(&ctx)
}

#[xdp]
pub fn pirate_wide(ctx: XdpContext) -> u32 {
    measure(&ctx, &FLOWS_WIDE);
    pass(&ctx)
}

#[inline(always)]
fn pass(ctx: &XdpContext) -> u32 {
    // SAFETY: returns only if the slot is empty or the call fails.
    unsafe { ROOT_ARRAY.tail_call(ctx, 0) };
    count(counters::EVENT_NO_TAIL_CALL);
    xdp_action::XDP_PASS
}

#[inline(always)]
fn measure<const M: usize>(ctx: &XdpContext, flows: &LruHashMap<FlowKey, FlowState<M>>) {
    let (key, info) = match parse(&Packet(ctx)) {
        Ok(parsed) => parsed,
        Err(Reject::NotIp) => return count(counters::NOT_IP),
        Err(Reject::Malformed) => return count(counters::MALFORMED),
        Err(Reject::Unsupported) => return count(counters::UNSUPPORTED),
    };
    let Some(params) = CONFIG.get(0) else { return };
    let epoch = EPOCH.get(0).copied().unwrap_or(0);
    let now = unsafe { bpf_ktime_get_ns() };

    let st = match flows.get_ptr_mut(&key) {
        Some(p) => p,
        None => match new_flow(flows, &key, epoch) {
            Some(p) => p,
            None => return count(counters::MAP_FULL),
        },
    };
    // SAFETY: a live map value; the flow's packets are processed on one CPU at a time.
    let st = unsafe { &mut *st };
    if st.epoch != epoch {
        if st.hand_over_due(epoch) {
            hand_over(&key, st);
        }
        st.start_epoch(epoch, params);
    }
    let outcome = match on_packet(st, now, info, params) {
        pirate_common::tracker::Step::SkippedPureAck => counters::PURE_ACK,
        pirate_common::tracker::Step::SkippedRetransmission => counters::RETRANSMISSION,
        pirate_common::tracker::Step::First => counters::NEW_FLOW,
        pirate_common::tracker::Step::Gap { .. } => counters::MEASURED,
        pirate_common::tracker::Step::Idle { .. } => counters::IDLE,
    };
    count(outcome);
}

#[inline(always)]
fn new_flow<const M: usize>(
    flows: &LruHashMap<FlowKey, FlowState<M>>,
    key: &FlowKey,
    epoch: u32,
) -> Option<*mut FlowState<M>> {
    let blank = BLANK.get_ptr_mut(0)? as *mut FlowState<M>;
    // SAFETY: BLANK holds a FlowState<MODES_WIDE>, at least as large as FlowState<M>; only
    // `epoch` is ever written, so the rest stays zero = FlowState::new.
    unsafe {
        (*blank).epoch = epoch;
        // EEXIST means another CPU inserted it first: use that one.
        if flows.insert(key, &*blank, BPF_NOEXIST as u64).is_ok() {
            count(counters::EVENT_FLOW_INSERTED);
        }
    }
    flows.get_ptr_mut(key)
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

/// The baseline of `cargo xtask bench datapath`: an XDP program that only passes.
#[xdp]
pub fn bare_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
