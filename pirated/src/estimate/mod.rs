//! Estimators: pure functions from a flow's modes (one epoch) to its mean response latency, and
//! from flows to servers.

pub mod batches;
pub mod pirate;
pub mod quantile;

use std::{collections::BTreeMap, net::SocketAddr};

use serde::{Deserialize, Serialize};

use crate::flow::{server, FlowEpoch};
use batches::Ends;
use pirate_common::parse::IPPROTO_TCP;
use quantile::{spans, Quantile, Span, QUANTILES};

/// Which estimator turns modes into a latency.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Estimator {
    /// The paper's proportional mode sum: the largest de-noised mode is the inter-batch gap.
    Paper,
    /// Gap time over the number of gaps that end a batch (every gap above the break between
    /// intra- and inter-batch gaps): right when service times vary within an epoch, and under
    /// loss with reordering, where the paper's is off by up to 10 %.
    #[default]
    Batches,
}

/// Everything the estimators need besides the modes.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub paper: pirate::Denoise,
    pub batches: batches::Break,
    /// TCP gaps are marked by the client's acknowledgement number (`FLAG_MARK_ACKED`): a marked
    /// gap held a response, so it ends a batch.
    pub acked_marks: bool,
}

impl Settings {
    /// Both estimates of one flow's epoch: (paper, batches).
    pub fn both(&self, flow: &FlowEpoch) -> (Option<FlowEstimate>, Option<FlowEstimate>) {
        let ends = if self.acked_marks && flow.key.proto == IPPROTO_TCP { Ends::Marked } else { Ends::Break };
        (
            pirate::proportional_mode_sum(&flow.modes, &self.paper),
            batches::batch_count_mean(&flow.modes, &self.batches, ends),
        )
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct FlowEstimate {
    pub estimate_ns: f64,
    /// Batch-to-batch intervals measured (for the paper's estimator: gaps in the IBG mode).
    pub batches: u64,
    /// Total time of the gaps counted (estimate = kept / batches).
    pub kept_ns: u64,
    /// Where the batch-ending gaps are: (index into the flow's modes, how many of its gaps).
    pub ends: Vec<(usize, u64)>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ServerEstimate {
    pub server: SocketAddr,
    /// Batch-weighted mean over the server's flows: Σ kept / Σ batches.
    pub estimate_ns: f64,
    pub flows: usize,
    pub batches: u64,
    /// Response-latency quantiles (`QUANTILES`) over the server's batches (empty if not asked).
    pub quantiles: Vec<Quantile>,
}

/// Aggregates flow estimates per server (destination address and port), with `QUANTILES` if
/// `quantiles`.
pub fn per_server<'a>(
    flows: impl IntoIterator<Item = (&'a FlowEpoch, &'a FlowEstimate)>,
    quantiles: bool,
) -> Vec<ServerEstimate> {
    #[derive(Default)]
    struct Acc {
        kept_ns: u64,
        batches: u64,
        flows: usize,
        spans: Vec<Span>,
    }
    let mut acc: BTreeMap<SocketAddr, Acc> = BTreeMap::new();
    for (flow, est) in flows {
        let a = acc.entry(server(&flow.key)).or_default();
        a.kept_ns += est.kept_ns;
        a.batches += est.batches;
        a.flows += 1;
        if quantiles {
            a.spans.extend(spans(&flow.modes, est));
        }
    }
    acc.into_iter()
        .map(|(server, a)| ServerEstimate {
            server,
            estimate_ns: a.kept_ns as f64 / a.batches as f64,
            flows: a.flows,
            batches: a.batches,
            quantiles: quantile::quantiles(&a.spans, &QUANTILES),
        })
        .collect()
}
