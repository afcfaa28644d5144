//! One epoch's results, computed the same way by the daemon and by replay, and their JSON lines.

use std::io::Write;

use serde::Serialize;

use crate::{
    estimate::pirate::{per_server, proportional_mode_sum, Denoise, FlowEstimate, ServerEstimate},
    flow::{client, proto_name, server, FlowEpoch},
};

pub struct EpochReport {
    pub epoch: u32,
    pub flows: Vec<(FlowEpoch, Option<FlowEstimate>)>,
    pub servers: Vec<ServerEstimate>,
}

impl EpochReport {
    pub fn new(epoch: u32, mut flows: Vec<FlowEpoch>, denoise: &Denoise) -> EpochReport {
        flows.sort_by_key(|f| f.key);
        let flows: Vec<_> = flows
            .into_iter()
            .map(|f| {
                let est = proportional_mode_sum(&f.modes, denoise);
                (f, est)
            })
            .collect();
        let servers = per_server(flows.iter().filter_map(|(f, e)| e.as_ref().map(|e| (f, e))));
        EpochReport { epoch, flows, servers }
    }

    pub fn discarded(&self) -> u64 {
        self.flows.iter().map(|(f, _)| f.discarded).sum()
    }

    /// One JSON line per flow, then one per server.
    pub fn write_json(&self, out: &mut impl Write) -> std::io::Result<()> {
        for (f, est) in &self.flows {
            let line = FlowLine {
                kind: "flow",
                epoch: self.epoch,
                proto: proto_name(&f.key),
                client: client(&f.key).to_string(),
                server: server(&f.key).to_string(),
                estimate_ns: est.map(|e| e.estimate_ns.round() as u64),
                batches: est.map_or(0, |e| e.batches),
                samples: f.samples,
                causal_mean_ns: (f.samples > 0).then(|| f.samples_sum_ns / f.samples),
                packets: f.packets,
                modes: f.modes.iter().map(|m| [m.min_ns, m.max_ns, m.count, m.candidates, m.sum_ns]).collect(),
                discarded: f.discarded,
            };
            serde_json::to_writer(&mut *out, &line)?;
            out.write_all(b"\n")?;
        }
        for s in &self.servers {
            let line = ServerLine {
                kind: "server",
                epoch: self.epoch,
                server: s.server.to_string(),
                estimate_ns: s.estimate_ns.round() as u64,
                flows: s.flows,
                batches: s.batches,
            };
            serde_json::to_writer(&mut *out, &line)?;
            out.write_all(b"\n")?;
        }
        out.flush()
    }
}

#[derive(Serialize)]
struct FlowLine {
    #[serde(rename = "type")]
    kind: &'static str,
    epoch: u32,
    proto: &'static str,
    client: String,
    server: String,
    /// Proportional mode sum; null when no mode qualified as the inter-batch gap.
    estimate_ns: Option<u64>,
    batches: u64,
    /// Alg. 1 causal-pair samples and their mean.
    samples: u64,
    causal_mean_ns: Option<u64>,
    packets: u64,
    /// The flow's modes, ascending: [min_ns, max_ns, count, candidates, sum_ns].
    modes: Vec<[u64; 5]>,
    discarded: u64,
}

#[derive(Serialize)]
struct ServerLine {
    #[serde(rename = "type")]
    kind: &'static str,
    epoch: u32,
    server: String,
    estimate_ns: u64,
    flows: usize,
    batches: u64,
}
