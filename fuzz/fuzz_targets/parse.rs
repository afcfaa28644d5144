//! The frame parser and the segment's packet identity over any bytes: no panic, and the
//! offsets a parsed frame hands the per-packet steps lie inside it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pirate_common::{ctx::PacketCtx, identity::identity, parse::parse};

fuzz_target!(|frame: &[u8]| {
    let mut pkt = PacketCtx::default();
    if parse(frame, &mut pkt).is_ok() {
        assert!(pkt.l3_off < pkt.l4_off && usize::from(pkt.l4_off) < frame.len(), "{pkt:?}");
        identity(frame, &pkt);
    }
});
