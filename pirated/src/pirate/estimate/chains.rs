//! A flow's span-capped modes joined into the modes Alg. 2 itself would have made, which the
//! estimators read, and the way back from an estimate on them to the narrow modes.

use pirate_common::pirate::{config::MODES_WIDE, modes::Epsilon};

use super::figure::{Ends, FlowEstimate};
use crate::pirate::flow::{Mode, ModeList};

/// A flow's modes joined where they lie within ε of each other: with a span cap
/// (`pirate_common::pirate::modes::Epsilon::span`), the modes Alg. 2 itself would have made, which the
/// estimators were built on; without one, the modes as they are.
pub struct Chains {
    pub modes: ModeList,
    /// Past the last of the flow's modes each chain joins.
    past: [u8; MODES_WIDE],
}

impl Chains {
    pub fn new(modes: &[Mode], eps: Epsilon) -> Chains {
        let mut c = Chains { modes: ModeList::default(), past: [0; MODES_WIDE] };
        for (i, m) in modes.iter().enumerate() {
            match c.modes.last_mut() {
                Some(last) if eps.close(last.max_ns, m.min_ns) => {
                    last.max_ns = m.max_ns;
                    last.count += m.count;
                    last.candidates += m.candidates;
                    last.sum_ns += m.sum_ns;
                }
                _ => c.modes.push(*m),
            }
            c.past[c.modes.len() - 1] = i as u8 + 1;
        }
        c
    }

    /// An estimate over the chains, with its batch ends moved to the flow's own modes (each chain
    /// that ends batches ends them with all its gaps), where the quantiles read them narrow.
    pub fn expand(&self, est: FlowEstimate) -> FlowEstimate {
        let first = |c: usize| if c == 0 { 0 } else { self.past[c - 1] as usize };
        let ends = (0..self.modes.len())
            .filter(|&c| est.ends.has(c))
            .fold(Ends::default(), |ends, c| ends.with(Ends::all(first(c)..self.past[c] as usize)));
        FlowEstimate { ends, ..est }
    }
}
