//! The frame parser, the segment's packet identity and Pirate's look at a client's first data
//! (`protocol::sniff`, a hostile ClientHello's lengths included) over any bytes: no panic, and
//! the offsets a parsed frame hands the per-packet steps lie inside it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pirate_common::{
    ctx::PacketCtx,
    identity::identity,
    parse::parse,
    pirate::{config::MODES_COMPACT, flow::FlowState, protocol::sniff},
};

fuzz_target!(|frame: &[u8]| {
    let mut pkt = PacketCtx::default();
    if parse(frame, &mut pkt).is_ok() {
        assert!(pkt.l3_off < pkt.l4_off && usize::from(pkt.l4_off) < frame.len(), "{pkt:?}");
        identity(frame, &pkt);
        sniff(&mut FlowState::<MODES_COMPACT>::new(1), &pkt, frame);
    }
});
