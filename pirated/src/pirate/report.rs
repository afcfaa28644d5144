//! One epoch's results, computed the same way by the daemon and by replay, and their JSON lines.

use std::{collections::BTreeMap, io::Write, net::SocketAddr};

use pirate_common::key::FlowKey;
use serde::Serialize;

use crate::pirate::{
    estimate::{
        quantile::Quantile,
        servers::{per_server, Numbering, ServerEstimate},
        span::Span,
        Estimates, Estimator, FlowEstimate, NoFigure, Rule, Settings,
    },
    flow::FlowEpoch,
};

/// The per-flow vectors an epoch's report fills besides the flows, kept from one epoch to the
/// next for their memory.
#[derive(Default)]
pub struct Scratch {
    estimates: Vec<Estimates>,
    spans: Vec<Span>,
}

impl Scratch {
    /// Room for `flows` flows, faulted in now (see [`crate::buffer::populated`]): a span each,
    /// as a flow whose batches end in one mode has (more grow the vector in the first epoch).
    pub fn with_room(flows: usize) -> Scratch {
        Scratch { estimates: crate::buffer::populated(flows), spans: crate::buffer::populated(flows) }
    }
}

pub struct EpochReport {
    pub epoch: u32,
    /// The estimator the headline figures (`estimate_ns`, the metrics) come from.
    pub estimator: Estimator,
    pub flows: Vec<FlowEpoch>,
    /// Each flow's figures, in the order of `flows`.
    pub estimates: Vec<Estimates>,
    /// The flows' spans, server by server (kept for its memory).
    spans: Vec<Span>,
    /// Per server, from each estimator (the selected one's is `servers()`).
    pub servers_paper: Vec<ServerEstimate>,
    pub servers_batches: Vec<ServerEstimate>,
    /// Gaps the flows' full mode tables dropped.
    discarded: u64,
    /// Flows whose figure from the selected estimator was withheld: per server (ascending), and
    /// per reason (in the order of `NoFigure::ALL`).
    pub withheld_servers: Vec<(SocketAddr, u64)>,
    pub withheld: [u64; NoFigure::ALL.len()],
}

impl EpochReport {
    /// Estimates every flow of the epoch, on every CPU, and aggregates them per server. Only the
    /// configured estimator, unless `compare` (for the JSON lines, which carry both: they cost as
    /// much again); per-server histograms where `histograms`. The per-flow vectors are written
    /// into `scratch`'s memory.
    pub fn new(
        epoch: u32,
        flows: Vec<FlowEpoch>,
        scratch: Scratch,
        settings: &Settings,
        estimator: Estimator,
        (compare, histograms): (bool, bool),
    ) -> EpochReport {
        let wanted = |which| compare || estimator == which;
        let (want_paper, want_batches) = (wanted(Estimator::Paper), wanted(Estimator::Batches));
        let Scratch { mut estimates, mut spans } = scratch;
        // One pass over the flows, on every CPU: each flow's estimates, added to its server's,
        // and the selected estimator's withheld figures (rare) by server and by reason.
        #[derive(Default)]
        struct Share {
            servers: Numbering,
            discarded: u64,
            withheld: Vec<(SocketAddr, NoFigure)>,
        }
        let shares = crate::parallel::fold_into(&flows, &mut estimates, Share::default, |share, flow| {
            let modes = flow.modes();
            let est = settings.flow(flow, &modes, want_paper, want_batches);
            share.discarded += flow.discarded;
            let at = flow.key.server();
            if let Some(reason) = est.withheld(estimator) {
                share.withheld.push((at, reason));
            }
            Estimates { server: share.servers.add(at, &modes, &est), ..est }
        });
        let (mut servers, mut withheld) = (BTreeMap::new(), [0; NoFigure::ALL.len()]);
        for &(at, reason) in shares.iter().flat_map(|s| &s.withheld) {
            *servers.entry(at).or_insert(0) += 1;
            withheld[reason as usize] += 1;
        }
        let discarded = shares.iter().map(|s| s.discarded).sum();
        let numberings: Vec<Numbering> = shares.into_iter().map(|s| s.servers).collect();
        let [servers_paper, servers_batches] =
            per_server(&numberings, &flows, &estimates, &mut spans, settings.epsilon, histograms);
        EpochReport {
            epoch,
            estimator,
            flows,
            estimates,
            spans,
            servers_paper,
            servers_batches,
            discarded,
            withheld_servers: servers.into_iter().collect(),
            withheld,
        }
    }

    /// The per-flow vectors, for the next epoch to fill: a million flows' worth is hundreds of
    /// MiB, which the allocator would otherwise hand back to the kernel and fault in again,
    /// zeroed, every epoch.
    pub fn into_buffers(self) -> (Vec<FlowEpoch>, Scratch) {
        (self.flows, Scratch { estimates: self.estimates, spans: self.spans })
    }

    /// Each flow's key and figure from the configured estimator (its mean latency in ns and the
    /// batches behind it), `None` without one: what the balancer weighs reals by.
    pub fn figures(&self) -> impl Iterator<Item = (&FlowKey, Option<(f64, u64)>)> {
        let figure = |e: &Estimates| e.of(self.estimator).map(|e| (e.estimate_ns, e.batches));
        self.flows.iter().zip(&self.estimates).map(move |(flow, e)| (&flow.key, figure(e)))
    }

    /// Per server, from the selected estimator.
    pub fn servers(&self) -> &[ServerEstimate] {
        match self.estimator {
            Estimator::Paper => &self.servers_paper,
            Estimator::Batches => &self.servers_batches,
        }
    }

    pub fn discarded(&self) -> u64 {
        self.discarded
    }

    /// One JSON line per flow (ordered by flow key), then one per server.
    pub fn write_json(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut order: Vec<(&FlowEpoch, &Estimates)> = self.flows.iter().zip(&self.estimates).collect();
        order.sort_unstable_by_key(|(f, _)| f.key);
        for (f, r) in order {
            let est = r.of(self.estimator);
            let line = FlowLine {
                kind: "flow",
                epoch: self.epoch,
                proto: f.key.proto_name(),
                client: f.key.client().to_string(),
                server: f.key.server().to_string(),
                estimate_ns: est.map(|e| e.estimate_ns.round() as u64),
                batches: est.map_or(0, |e| e.batches),
                no_figure: r.withheld(self.estimator).map(NoFigure::name),
                evidence: r.rule(self.estimator).map(Evidence::of),
                estimates: Both {
                    paper: r.paper.as_ref().map(Figure::from),
                    batches: r.batches.as_ref().map(Figure::from),
                },
                samples: f.samples,
                causal_mean_ns: (f.samples > 0).then(|| f.samples_sum_ns / f.samples),
                batch_gap_ns: (f.batch_gap_ns > 0).then_some(f.batch_gap_ns),
                packets: f.packets,
                modes: f
                    .modes()
                    .iter()
                    .map(|m| [m.min_ns as u64, m.max_ns as u64, m.count as u64, m.candidates as u64, m.sum_ns])
                    .collect(),
                discarded: f.discarded,
                idle_gaps: f.idle_gaps,
                acked_gaps: f.acked_gaps,
                handshake_rtt_ns: (f.handshake_rtt_ns > 0).then_some(f.handshake_rtt_ns),
            };
            serde_json::to_writer(&mut *out, &line)?;
            out.write_all(b"\n")?;
        }
        let find = |list: &[ServerEstimate], at| list.iter().find(|s| s.server == at).map(Figure::from);
        let withheld =
            |at| self.withheld_servers.binary_search_by_key(&at, |w| w.0).map_or(0, |i| self.withheld_servers[i].1);
        // Servers with a figure, then those whose every flow had its figure withheld.
        let without =
            self.withheld_servers.iter().filter(|w| self.servers().binary_search_by_key(&w.0, |s| s.server).is_err());
        let lines = self.servers().iter().map(|s| (s.server, Some(s))).chain(without.map(|w| (w.0, None)));
        for (at, s) in lines {
            let line = ServerLine {
                kind: "server",
                epoch: self.epoch,
                server: at.to_string(),
                estimate_ns: s.map(|s| s.estimate_ns.round() as u64),
                flows: s.map_or(0, |s| s.flows),
                flows_without_figure: withheld(at),
                batches: s.map_or(0, |s| s.batches),
                quantiles: s.map_or(Vec::new(), |s| s.quantiles.iter().map(QuantileLine::from).collect()),
                estimates: Both { paper: find(&self.servers_paper, at), batches: find(&self.servers_batches, at) },
            };
            serde_json::to_writer(&mut *out, &line)?;
            out.write_all(b"\n")?;
        }
        out.flush()
    }
}

/// One estimator's figure.
#[derive(Serialize)]
struct Figure {
    estimate_ns: u64,
    batches: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    quantiles: Vec<QuantileLine>,
}

impl From<&FlowEstimate> for Figure {
    fn from(e: &FlowEstimate) -> Figure {
        Figure { estimate_ns: e.estimate_ns.round() as u64, batches: e.batches, quantiles: Vec::new() }
    }
}

impl From<&ServerEstimate> for Figure {
    fn from(e: &ServerEstimate) -> Figure {
        Figure {
            estimate_ns: e.estimate_ns.round() as u64,
            batches: e.batches,
            quantiles: e.quantiles.iter().map(QuantileLine::from).collect(),
        }
    }
}

/// A response-latency quantile and its bounds (see `estimate::quantile`).
#[derive(Serialize)]
struct QuantileLine {
    q: f64,
    estimate_ns: u64,
    lower_ns: u64,
    upper_ns: u64,
}

impl From<&Quantile> for QuantileLine {
    fn from(q: &Quantile) -> QuantileLine {
        QuantileLine {
            q: q.q,
            estimate_ns: q.estimate_ns.round() as u64,
            lower_ns: q.lower_ns.round() as u64,
            upper_ns: q.upper_ns.round() as u64,
        }
    }
}

#[derive(Serialize)]
struct Both {
    paper: Option<Figure>,
    batches: Option<Figure>,
}

#[derive(Serialize)]
struct FlowLine {
    #[serde(rename = "type")]
    kind: &'static str,
    epoch: u32,
    proto: &'static str,
    client: String,
    server: String,
    /// The configured estimator's figure; null when it has none for this flow and epoch.
    estimate_ns: Option<u64>,
    batches: u64,
    /// Why the configured estimator's figure was withheld (`NoFigure::name`); null otherwise.
    no_figure: Option<&'static str>,
    /// What the configured estimator's figure rests on; null without a figure.
    evidence: Option<Evidence>,
    /// Both estimators' figures, for comparison.
    estimates: Both,
    /// Alg. 1 causal-pair samples and their mean.
    samples: u64,
    causal_mean_ns: Option<u64>,
    /// Alg. 1's adaptive δ this epoch (gaps from this long started a batch); null: the fixed δ.
    batch_gap_ns: Option<u64>,
    packets: u64,
    /// The flow's modes, ascending: [min_ns, max_ns, count, candidates, sum_ns].
    modes: Vec<[u64; 5]>,
    discarded: u64,
    /// Gaps at or above the idle floor (idle periods, retransmission timeouts), not in `modes`.
    idle_gaps: u64,
    /// Gaps across which the client's acknowledgement number advanced (TCP).
    acked_gaps: u16,
    /// The TCP handshake's round trip; null where pirated did not see it.
    handshake_rtt_ns: Option<u32>,
}

/// A figure's evidence: the rule that produced it, and the requests in flight it shows.
#[derive(Serialize)]
struct Evidence {
    rule: &'static str,
    /// Null where the evidence shows no number.
    streams_in_flight: Option<u32>,
    /// [lower, upper]; upper null where unbounded.
    streams_bounds: [Option<u32>; 2],
}

impl Evidence {
    fn of(rule: Rule) -> Evidence {
        let s = rule.streams();
        Evidence { rule: rule.name(), streams_in_flight: s.in_flight, streams_bounds: [Some(s.lower), s.upper] }
    }
}

#[derive(Serialize)]
struct ServerLine {
    #[serde(rename = "type")]
    kind: &'static str,
    epoch: u32,
    server: String,
    /// Null when every flow's figure was withheld.
    estimate_ns: Option<u64>,
    /// Flows with a figure, and flows whose figure was withheld (`no_figure` on their lines).
    flows: usize,
    flows_without_figure: u64,
    batches: u64,
    /// The configured estimator's response-latency quantiles over the server's batches.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    quantiles: Vec<QuantileLine>,
    estimates: Both,
}
