//! The datapath's map names, as `pirate-ebpf` declares them (`#[map]` takes the static's name,
//! a literal) and pirated looks them up: pirated checks at load that each is in the object. All
//! but `BLANK` and `RECORDS` are pinned by name in the instance's pin directory.

/// The version of the maps' key and value layouts, part of the layout a restarted pirated must
/// match to reuse pinned maps: bump it whenever a map's type, key or value changes.
pub const LAYOUT_VERSION: u32 = 2;

/// Parameters pirated writes once (`pirate::config::Params`).
pub const CONFIG: &str = "CONFIG";
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
/// `pirate`'s flow tables, one per state layout, and the blank state new flows start from.
pub const FLOWS: &str = "FLOWS";
pub const FLOWS_WIDE: &str = "FLOWS_WIDE";
pub const BLANK: &str = "BLANK";
/// `pirate`'s epoch roll-over program for the layout in use (one slot): it runs once per flow
/// and epoch, apart so that each program has its own verifier budget.
pub const PIRATE_EPOCH: &str = "PIRATE_EPOCH";
/// `pirate`'s hand-over ring buffer of finished flow epochs.
pub const RECORDS: &str = "RECORDS";

pub const ALL: [&str; 11] =
    [CONFIG, EPOCH, COUNTERS, CTX, CHAIN, FORWARD, FLOWS, FLOWS_WIDE, BLANK, PIRATE_EPOCH, RECORDS];
