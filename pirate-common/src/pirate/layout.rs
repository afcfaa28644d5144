//! The two flow-state layouts (N ≤ 10 and N ≤ 12 modes): which program, table and record size
//! each uses, and [`with_modes!`](crate::with_modes), the one place that turns the runtime
//! choice into the const mode capacity the state types are generic over.

use super::{config::MODES_COMPACT, flow::EpochRecord, table};
use crate::maps;

/// Evaluates `$e` with `$m` the mode capacity (a const) of the [`Layout`] `$layout`.
#[macro_export]
macro_rules! with_modes {
    ($layout:expr, $m:ident => $e:expr) => {
        match $layout {
            $crate::pirate::layout::Layout::Compact => {
                const $m: usize = $crate::pirate::config::MODES_COMPACT;
                $e
            }
            $crate::pirate::layout::Layout::Wide => {
                const $m: usize = $crate::pirate::config::MODES_WIDE;
                $e
            }
        }
    };
}

/// Flow-state layout: the compact one holds N ≤ 10 modes, the wide one N ≤ 12.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Compact,
    Wide,
}

impl Layout {
    pub fn for_modes(modes: u32) -> Layout {
        if modes as usize <= MODES_COMPACT {
            Layout::Compact
        } else {
            Layout::Wide
        }
    }

    /// The `pirate` program for this layout, chained at `CHAIN_PIRATE`.
    pub fn program(self) -> &'static str {
        match self {
            Layout::Compact => "pirate",
            Layout::Wide => "pirate_wide",
        }
    }

    /// The program that puts a flow of this layout into the table or rolls it over to a new
    /// epoch, in `PIRATE_FLOW`.
    pub fn flow_program(self) -> &'static str {
        match self {
            Layout::Compact => "pirate_flow",
            Layout::Wide => "pirate_flow_wide",
        }
    }

    pub fn flows_map(self) -> &'static str {
        match self {
            Layout::Compact => maps::FLOWS,
            Layout::Wide => maps::FLOWS_WIDE,
        }
    }

    /// The other layout's table, shrunk to one entry and never pinned.
    pub fn unused_flows_map(self) -> &'static str {
        match self {
            Layout::Compact => maps::FLOWS_WIDE,
            Layout::Wide => maps::FLOWS,
        }
    }

    /// Bytes of one record in the hand-over ring buffer.
    pub fn record_size(self) -> usize {
        with_modes!(self, M => size_of::<EpochRecord<M>>())
    }

    /// Bytes of one flow in the flow table (id and state).
    pub fn entry_size(self) -> usize {
        with_modes!(self, M => size_of::<table::Set<M>>()) / table::WAYS
    }
}
