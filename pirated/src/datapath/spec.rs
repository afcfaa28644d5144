//! What the datapath is asked to load: a plain specification built from the configuration above
//! it (the datapath never reads `Config`): where it attaches and pins, and each capability's map
//! shapes and parameters. The pin layout's tag and longest path follow from it.

use pirate_common::{
    fridge::Fridges,
    maps,
    pirate::{config::Params, layout::Layout},
    rli::reference::RliShape,
    segment::SegmentShape,
};
use serde::{Deserialize, Serialize};

use super::pins;

/// One instance's chain.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Names the pin directory `<pin_root>/<instance>`.
    pub instance: String,
    /// Where the chain attaches (empty: only `Datapath::load`, which attaches nowhere).
    pub interface: String,
    pub attach_mode: AttachMode,
    /// The bpffs directory holding each instance's pins.
    pub pin_root: String,
    pub on_exit: OnExit,
    pub pirate: Pirate,
    pub fridge: Fridge,
    pub lb: Lb,
    pub segment: Segment,
    pub rli: Rli,
}

/// Pirate's flow table and parameters.
#[derive(Clone, Copy, Debug)]
pub struct Pirate {
    pub params: Params,
    pub layout: Layout,
    pub max_flows: u32,
}

/// The fridges' slots, shape and sample ring.
#[derive(Clone, Copy, Debug)]
pub struct Fridge {
    /// Chained: a fridge measures.
    pub enabled: bool,
    pub shape: Fridges,
    pub ring_bytes: u32,
}

/// The forwarder's rings and connection table.
#[derive(Clone, Copy, Debug)]
pub struct Lb {
    pub ring_entries: u32,
    pub max_connections: u32,
}

/// The segment's banks, shape and packet cache ring.
#[derive(Clone, Copy, Debug)]
pub struct Segment {
    /// Chained: this host is a point of a segment.
    pub enabled: bool,
    pub shape: SegmentShape,
    pub lda_entries: u32,
    pub rda_entries: u32,
    pub cache_ring_bytes: u32,
}

/// RLI's reference check and flow table at the downstream point.
#[derive(Clone, Copy, Debug)]
pub struct Rli {
    /// Chained: this host is a segment's downstream point with RLI on.
    pub enabled: bool,
    pub shape: RliShape,
    pub max_flows: u32,
    pub ring_bytes: u32,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AttachMode {
    /// Driver (native) mode, falling back to generic if the driver lacks XDP support.
    Auto,
    /// Driver mode only: fail if the driver has no XDP support.
    Native,
    /// Generic (skb) mode: works on any interface, costs more per packet.
    Generic,
}

/// What pirated leaves behind when it stops.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnExit {
    /// The chain stays attached, measuring into its pinned maps: a restart takes over with no
    /// flow losing its epoch. `pirated detach` removes it.
    Keep,
    /// Detach the chain and remove the pins.
    Detach,
}

impl Spec {
    /// The layout asked of the pinned maps, as the pin directory's marker names it: maps pinned
    /// with another one cannot be reused.
    pub fn layout_tag(&self) -> String {
        let (lda, rda) = (self.segment.lda_entries, self.segment.rda_entries);
        format!(
            "v{}-{:?}-flows{}-fridge{}-lb{}x{}-segment{lda}x{rda}-rli{}",
            maps::LAYOUT_VERSION,
            self.pirate.layout,
            self.pirate.max_flows,
            self.fridge.shape.slots(),
            self.lb.ring_entries,
            self.lb.max_connections,
            self.rli.max_flows,
        )
        .to_lowercase()
    }

    /// The longest path pirated makes under `pin_root`: the layout marker in the instance's
    /// directory, whose name (`pins::MARKER_PREFIX` and the tag) is longer than any map's (at
    /// most 15 bytes) or link's (`link-` and an interface name: at most 20). The kernel refuses
    /// a path of `PATH_MAX` bytes or more.
    pub fn longest_pin_path(&self) -> usize {
        self.pin_root.len() + 1 + self.instance.len() + 1 + pins::MARKER_PREFIX.len() + self.layout_tag().len()
    }
}
