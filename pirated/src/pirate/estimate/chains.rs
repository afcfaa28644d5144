//! A flow's span-capped modes joined into the modes Alg. 2 itself would have made, which the
//! estimators read, and the way back from an estimate on them to the narrow modes.

use std::ops::Range;

use pirate_common::pirate::modes::Epsilon;

use super::FlowEstimate;
use crate::pirate::flow::Mode;

/// A flow's modes joined where they lie within ε of each other: with a span cap
/// (`pirate_common::pirate::modes::Epsilon::span`), the modes Alg. 2 itself would have made, which the
/// estimators were built on; without one, the modes as they are.
pub struct Chains {
    pub modes: Vec<Mode>,
    /// The range of the flow's modes each chain joins.
    pub of: Vec<Range<usize>>,
}

impl Chains {
    pub fn new(modes: &[Mode], eps: Epsilon) -> Chains {
        let mut c = Chains { modes: Vec::new(), of: Vec::new() };
        for (i, m) in modes.iter().enumerate() {
            match c.modes.last_mut() {
                Some(last) if eps.close(last.max_ns as u32, m.min_ns as u32) => {
                    last.max_ns = m.max_ns;
                    last.count += m.count;
                    last.candidates += m.candidates;
                    last.sum_ns += m.sum_ns;
                    c.of.last_mut().unwrap().end = i + 1;
                }
                _ => {
                    c.modes.push(*m);
                    c.of.push(i..i + 1);
                }
            }
        }
        c
    }

    /// An estimate over the chains, with its batch ends moved to the flow's own modes (each chain
    /// that ends batches ends them with all its gaps), where the quantiles read them narrow.
    pub fn expand(&self, est: FlowEstimate, modes: &[Mode]) -> FlowEstimate {
        let ends = est.ends.iter().flat_map(|&(c, _)| self.of[c].clone().map(|i| (i, modes[i].count))).collect();
        FlowEstimate { ends, ..est }
    }
}
