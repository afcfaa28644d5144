//! RLI's Prometheus families so far: what became of the packets to the reference port, and the
//! flows its table took, from the datapath's counters each epoch. Bounded: one series per
//! outcome, none per flow.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use pirate_common::counters;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

pub struct Metrics {
    references: Family<OutcomeLabel, Counter>,
    flows_inserted: Counter,
}

/// The counters behind `references`, and their outcome labels.
const OUTCOMES: [(u32, &str); 5] = [
    (counters::EVENT_RLI_TAKEN, "taken"),
    (counters::EVENT_RLI_TAKEN_LOST, "taken_unreported"),
    (counters::EVENT_RLI_FORGED, "forged"),
    (counters::EVENT_RLI_REPLAYED, "replayed"),
    (counters::EVENT_RLI_STALE, "stale"),
];

impl Metrics {
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics { references: Family::default(), flows_inserted: Counter::default() };
        let r = registry.sub_registry_with_prefix("rli");
        r.register(
            "references",
            "Packets to rli.port at the downstream point, by outcome: taken (used), taken_unreported (used, but the ring to pirated was full: missing from the quantiles), forged (no valid tag), replayed (sequence number seen), stale (delay beyond rli.max_delay); all dropped",
            m.references.clone(),
        );
        r.register(
            "flows_inserted",
            "Flows that entered RLI's flow table (it holds rli.max_flows: beyond, the least recent one is evicted)",
            m.flows_inserted.clone(),
        );
        m
    }

    /// Publishes one epoch (`delta`: the kernel's counters since the last one).
    pub fn publish(&self, delta: &[u64; counters::COUNT as usize]) {
        for (counter, outcome) in OUTCOMES {
            self.references.get_or_create(&OutcomeLabel { outcome }).inc_by(delta[counter as usize]);
        }
        self.flows_inserted.inc_by(delta[counters::EVENT_RLI_FLOW_INSERTED as usize]);
    }
}
