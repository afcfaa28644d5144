//! Indices of the per-CPU packet counters (`COUNTERS` map), one array for every program of the
//! chain: every packet lands in exactly one outcome (a parse rejection, counted by the program
//! that parsed it, or what `pirate` did with it), plus the `EVENT_*` tallies of things that happen beside it.

/// The packet's gap went into its flow's modes.
pub const MEASURED: u32 = 0;
/// A pure TCP ACK, left out of the gap stream.
pub const PURE_ACK: u32 = 1;
/// Not IPv4/IPv6 (ARP, LLDP, …).
pub const NOT_IP: u32 = 2;
/// Truncated or inconsistent headers.
pub const MALFORMED: u32 = 3;
/// IP but neither TCP nor UDP, an IP fragment, or ESP: nothing to key a flow on. ICMP echoes
/// reach the fridge, then `pirate` counts them here.
pub const UNSUPPORTED: u32 = 4;
/// The flow table could not take a new flow.
pub const MAP_FULL: u32 = 5;
/// First packet of a flow: a state was created, there is no gap yet.
pub const NEW_FLOW: u32 = 6;
/// A TCP segment carrying only data the client had already sent (a retransmission, or an
/// original overtaken by a later segment), left out of the gap stream.
pub const RETRANSMISSION: u32 = 7;
/// The packet's gap was at or above the idle floor (an idle period, a retransmission timeout):
/// counted in its flow, kept out of the modes.
pub const IDLE: u32 = 8;
/// Event: a flow's finished epoch could not be handed over (ring buffer full).
pub const EVENT_RECORD_LOST: u32 = 9;
/// Event: a flow's finished epoch was handed over through the ring buffer.
pub const EVENT_RECORD_SENT: u32 = 10;
/// Event: no forwarder slot (`FORWARD`) took the packet at the end of the chain: it went to
/// XDP_PASS.
pub const EVENT_NO_TAIL_CALL: u32 = 11;
/// Event: a flow-table entry was inserted (the first packet the table saw of the flow, pure
/// ACKs included); pirated never deletes entries, so those inserted but gone were evicted.
pub const EVENT_FLOW_INSERTED: u32 = 12;
/// Event: `pirate_flow` could not be reached (missing from `PIRATE_FLOW`): a new flow's packet
/// went unmeasured (`map_full`), a known flow's into the epoch the flow held.
pub const EVENT_NO_FLOW_PROGRAM: u32 = 13;
/// Event: `fridge` matched a response to its waiting request and sent the sample.
pub const EVENT_FRIDGE_SAMPLE_SENT: u32 = 14;
/// Event: a fridge sample could not be sent (its ring buffer full).
pub const EVENT_FRIDGE_SAMPLE_LOST: u32 = 15;

/// Event: `pirate_lb` sent a VIP's packet to its real itself (XDP_TX or a redirect).
pub const EVENT_LB_FORWARDED: u32 = 16;
/// Event: `pirate_lb` encapsulated a VIP's packet and left it to the kernel to route (no
/// neighbour entry yet, or a link too small for it: the kernel resolves or fragments).
pub const EVENT_LB_ROUTED: u32 = 17;
/// Event: a VIP's packet whose ring entry names no real, or that cannot be encapsulated (a
/// tagged frame, no room): passed on unchanged.
pub const EVENT_LB_UNFORWARDED: u32 = 18;

/// Event: `segment` recorded the packet (into its interval's banks).
pub const EVENT_SEGMENT_RECORDED: u32 = 19;
/// Event: a packet the RDA took could not be handed to pirated's packet cache (its ring buffer
/// full): if only one point saw it, its buckets cannot be repaired.
pub const EVENT_SEGMENT_CACHE_LOST: u32 = 20;

/// Event: `rli` took a reference (its delay kept, the packet dropped) and handed it to pirated.
pub const EVENT_RLI_TAKEN: u32 = 21;
/// Event: a reference taken could not be handed to pirated (its ring full): interpolation used
/// it, the segment's quantiles miss it.
pub const EVENT_RLI_TAKEN_LOST: u32 = 22;
/// Event: a packet to the reference port without a valid tag under the segment key (or too
/// short to carry one): dropped, never used.
pub const EVENT_RLI_FORGED: u32 = 23;
/// Event: a reference whose sequence number was taken before (or is older than the window):
/// dropped, never used.
pub const EVENT_RLI_REPLAYED: u32 = 24;
/// Event: a reference whose delay was beyond `rli.max_delay` either way: dropped, never used.
pub const EVENT_RLI_STALE: u32 = 25;
/// Event: a flow entered `rli`'s flow table; pirated deletes none, so those inserted but gone
/// were evicted.
pub const EVENT_RLI_FLOW_INSERTED: u32 = 26;
/// Event: a packet sampled as a reference (`rli.references = "sampled"`): at the upstream point
/// its time handed to pirated, at the downstream point kept as a reference whose delay is
/// pending; the packet goes on either way.
pub const EVENT_RLI_SAMPLED: u32 = 27;
/// Event: a sampled packet could not be handed to pirated (its ring full): at the downstream
/// point its reference's delay never comes, the packets around it count as unsettled.
pub const EVENT_RLI_SAMPLED_LOST: u32 = 28;

pub const COUNT: u32 = 29;

/// Names used for metrics labels, indexed like the constants above.
pub const NAMES: [&str; COUNT as usize] = [
    "measured",
    "pure_ack",
    "not_ip",
    "malformed",
    "unsupported",
    "map_full",
    "new_flow",
    "retransmission",
    "idle",
    "record_lost",
    "record_sent",
    "no_tail_call",
    "flow_inserted",
    "no_flow_program",
    "fridge_sample_sent",
    "fridge_sample_lost",
    "lb_forwarded",
    "lb_routed",
    "lb_unforwarded",
    "segment_recorded",
    "segment_cache_lost",
    "rli_taken",
    "rli_taken_lost",
    "rli_forged",
    "rli_replayed",
    "rli_stale",
    "rli_flow_inserted",
    "rli_sampled",
    "rli_sampled_lost",
];

/// How many of the counters are packet outcomes (the rest are events).
pub const OUTCOMES: u32 = 9;
