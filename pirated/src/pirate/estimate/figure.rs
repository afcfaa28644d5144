//! A flow's figure from an estimator: its mean latency, the batches and time behind it, and which
//! of its modes hold the batch-ending gaps (what the quantiles read). What every estimator returns.

use std::ops::Range;

use crate::pirate::flow::Mode;

/// One flow's figure from an estimator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlowEstimate {
    pub estimate_ns: f64,
    /// Batch-to-batch intervals measured (for the paper's estimator: gaps in the IBG mode).
    pub batches: u64,
    /// Total time of the gaps counted (estimate = kept / batches).
    pub kept_ns: u64,
    /// Where the batch-ending gaps are.
    pub ends: Ends,
}

/// Which of a flow's modes hold batch-ending gaps, and how many of each one's gaps end batches:
/// all of them, or (read off the acknowledgement marks) the marked ones. A bit set, so that an
/// estimate needs no allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ends {
    modes: u16,
    marked: bool,
}

impl Ends {
    /// Every gap of the modes in `range`.
    pub fn all(range: Range<usize>) -> Ends {
        Ends { modes: range.fold(0, |bits, i| bits | 1 << i), marked: false }
    }

    /// The marked gaps of every mode that has any.
    pub fn marked(modes: &[Mode]) -> Ends {
        let bits = modes.iter().enumerate().filter(|(_, m)| m.candidates > 0).fold(0, |bits, (i, _)| bits | 1 << i);
        Ends { modes: bits, marked: true }
    }

    /// (index into `modes`, batch-ending gaps in it), ascending.
    pub fn of<'a>(&self, modes: &'a [Mode]) -> impl Iterator<Item = (usize, u64)> + 'a {
        let Ends { modes: bits, marked } = *self;
        modes
            .iter()
            .enumerate()
            .filter(move |(i, _)| bits >> i & 1 == 1)
            .map(move |(i, m)| (i, if marked { m.candidates } else { m.count } as u64))
    }

    /// Whether mode `i` holds batch-ending gaps.
    pub fn has(&self, i: usize) -> bool {
        self.modes >> i & 1 == 1
    }

    /// These ends and `other`'s (both of every gap).
    pub(super) fn with(self, other: Ends) -> Ends {
        Ends { modes: self.modes | other.modes, marked: false }
    }
}
