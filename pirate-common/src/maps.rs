//! The datapath's map names, as `pirate-ebpf` declares them (`#[map]` takes the static's name,
//! a literal) and pirated looks them up: pirated checks at load that each is in the object. All
//! but the ring buffers are pinned by name in the instance's pin directory.

/// The version of the maps' key and value layouts, part of the layout a restarted pirated must
/// match to reuse pinned maps: bump it whenever a map's type, key or value changes.
pub const LAYOUT_VERSION: u32 = 11;

/// Parameters pirated writes once (`pirate::config::Params`).
pub const CONFIG: &str = "CONFIG";
/// The flow seed (`u64`, `hash::FLOW_SEED` says why) pirated draws when it creates the maps.
pub const SEED: &str = "SEED";
/// The current epoch (`u32`), advanced by pirated.
pub const EPOCH: &str = "EPOCH";
/// Per-CPU packet outcomes and events (`counters`).
pub const COUNTERS: &str = "COUNTERS";
/// The per-CPU packet context (`ctx::PacketCtx`).
pub const CTX: &str = "CTX";
/// The capability programs, at their `ctx::CHAIN_*` slots.
pub const CHAIN: &str = "CHAIN";
/// The forwarder slots (Katran's root array): the same layout in every version, so its pin
/// (where balancers register) outlives layout changes.
pub const FORWARD: &str = "FORWARD";
/// `pirate`'s flow tables (`pirate::table`), one per state layout: mmapable arrays of sets.
pub const FLOWS: &str = "FLOWS";
pub const FLOWS_WIDE: &str = "FLOWS_WIDE";
/// The addresses of IPv6 flows (`key::FlowId` → source and destination), written when a flow
/// enters the table; pirated reads and deletes them.
pub const V6_NAMES: &str = "V6_NAMES";
/// `pirate_flow` for the layout in use (one slot): it puts new flows into the table and rolls
/// flows over to a new epoch, once per flow and epoch, apart from the per-packet `pirate` so
/// that each has its own verifier budget.
pub const PIRATE_FLOW: &str = "PIRATE_FLOW";
/// `pirate`'s hand-over ring buffer of finished flow epochs.
pub const RECORDS: &str = "RECORDS";

/// The fridges' shape and enabled classes (`fridge::Fridges`), written by pirated.
pub const FRIDGE_SHAPE: &str = "FRIDGE_SHAPE";
/// Every fridge's slots, one array (`fridge::Slot`), fridge k's from `Fridges::first_slot[k]`.
pub const FRIDGE_SLOTS: &str = "FRIDGE_SLOTS";
/// The requests offered to each fridge (`u64`, shared by all CPUs, added atomically).
pub const FRIDGE_OFFERED: &str = "FRIDGE_OFFERED";
/// The fridges' samples (`fridge::Sample`), to pirated.
pub const FRIDGE_SAMPLES: &str = "FRIDGE_SAMPLES";

/// `pirate_lb`'s shape (`lb::LbShape`), written once by pirated.
pub const LB_SHAPE: &str = "LB_SHAPE";
/// The VIPs (`lb::VipKey` → VIP number).
pub const LB_VIPS: &str = "LB_VIPS";
/// Every VIP's two rings of real indices (`lb::ring_index`), mmapable: pirated writes the half
/// not in use in place.
pub const LB_RINGS: &str = "LB_RINGS";
/// Per VIP, the half of its rings in use.
pub const LB_HALVES: &str = "LB_HALVES";
/// Real index → IPv4 address (zero: no real).
pub const LB_REALS: &str = "LB_REALS";
/// The connection table (LRU, `key::FlowId` → real index): an established flow keeps its real
/// whatever the rings say later.
pub const LB_CONNS: &str = "LB_CONNS";
/// Per-CPU `lb::RealCounters` by real index.
pub const LB_COUNTERS: &str = "LB_COUNTERS";

/// The segment's shape (`segment::SegmentShape`), written by pirated.
pub const SEGMENT_SHAPE: &str = "SEGMENT_SHAPE";
/// Per-CPU, per half: the packets recorded and their interval (`segment::Seen`).
pub const SEGMENT_SEEN: &str = "SEGMENT_SEEN";
/// Per-CPU LDA cells, both halves (`segment::lda::LdaCell`).
pub const SEGMENT_LDA: &str = "SEGMENT_LDA";
/// Per-CPU RDA buckets, both halves (`segment::rda::RdaBucket`).
pub const SEGMENT_RDA: &str = "SEGMENT_RDA";
/// The packets the RDA took (`segment::CacheEntry`), to pirated's packet cache.
pub const SEGMENT_CACHE: &str = "SEGMENT_CACHE";

/// RLI's reference check (`rli::reference::RliShape`), written by pirated.
pub const RLI_SHAPE: &str = "RLI_SHAPE";
/// The sequence numbers of the references taken (`rli::reference::Window`).
pub const RLI_WINDOW: &str = "RLI_WINDOW";
/// The last `rli::RING` references (`rli::Reference`, by sequence number modulo the ring), and
/// in entry `rli::RING` the newest's sequence number.
pub const RLI_REFS: &str = "RLI_REFS";
/// Per-CPU per-flow counters (LRU, `key::FlowKey` → `rli::flow::RliFlow`).
pub const RLI_FLOWS: &str = "RLI_FLOWS";
/// The references taken (`rli::Taken`), to pirated.
pub const RLI_TAKEN: &str = "RLI_TAKEN";

pub const ALL: [&str; 33] = [
    CONFIG,
    SEED,
    EPOCH,
    COUNTERS,
    CTX,
    CHAIN,
    FORWARD,
    FLOWS,
    FLOWS_WIDE,
    V6_NAMES,
    PIRATE_FLOW,
    RECORDS,
    FRIDGE_SHAPE,
    FRIDGE_SLOTS,
    FRIDGE_OFFERED,
    FRIDGE_SAMPLES,
    LB_SHAPE,
    LB_VIPS,
    LB_RINGS,
    LB_HALVES,
    LB_REALS,
    LB_CONNS,
    LB_COUNTERS,
    SEGMENT_SHAPE,
    SEGMENT_SEEN,
    SEGMENT_LDA,
    SEGMENT_RDA,
    SEGMENT_CACHE,
    RLI_SHAPE,
    RLI_WINDOW,
    RLI_REFS,
    RLI_FLOWS,
    RLI_TAKEN,
];
