//! The replay source: the datapath's own per-packet code (`pirate_common`'s parser,
//! `pirate::tracker::step` and the fridges' step) run over a capture, cut into epochs as
//! the daemon cuts them.
//! Needs no privileges.

use std::collections::HashMap;

use pirate_common::{
    ctx::PacketCtx,
    fridge::{Fridges, Sample, MAX_FRIDGES},
    key::FlowKey,
    parse::parse,
    pirate::{config::Params, flow::FlowState, layout::Layout, measures, tracker::step},
    with_modes,
};

use super::EpochData;
use crate::{
    capture::{CaptureReader, Tally, JUMP_NS},
    config::Config,
    fridge::{report::FridgeEpoch, table::FridgeTable},
    pirate::flow::FlowEpoch,
};

/// What a replay read, left out and measured.
#[derive(Default)]
pub struct Summary {
    pub read: Tally,
    /// The last epoch, and how often the capture's clock stepped back (or too far ahead for an
    /// epoch number), each starting a new epoch there.
    pub epochs: u32,
    pub time_steps: u64,
    /// Flows forgotten to stay within `max_flows`, oldest first, as the kernel's table does.
    pub flows_evicted: u64,
}

impl Summary {
    /// The `"type": "capture"` JSON line.
    pub fn json(&self) -> serde_json::Value {
        self.read.json(serde_json::json!({
            "epochs": self.epochs,
            "time_steps": self.time_steps,
            "flows_evicted": self.flows_evicted,
        }))
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; {} epochs", self.read, self.epochs)?;
        if self.time_steps > 0 {
            write!(f, "; the capture's clock stepped back (or beyond any epoch) {} times", self.time_steps)?;
        }
        if self.flows_evicted > 0 {
            write!(f, "; {} flows forgotten beyond max_flows", self.flows_evicted)?;
        }
        Ok(())
    }
}

/// Runs the capture `reader` reads through the datapath's code, cut into
/// epochs every `config.epoch` from the first packet's timestamp and numbered from 1 as in the
/// daemon; the last, partial epoch too. Epochs without a packet are skipped, not closed one by
/// one: a capture's clock may jump a day. Each closed epoch goes to `on_epoch`, which may hand
/// back the fridges' new shape (recalibrated), as the daemon writes it into the datapath.
pub fn run(
    config: &Config,
    reader: CaptureReader,
    on_epoch: impl FnMut(EpochData) -> anyhow::Result<Option<Fridges>>,
) -> anyhow::Result<Summary> {
    let params = config.pirate.params(config.max_flows);
    // The fridges draw their entry decisions from a fixed seed: a replay repeats itself.
    let fridges = config.fridge.enabled.then(|| ReplayFridges {
        table: FridgeTable::new(config.fridge.shape(), 1),
        samples: Vec::new(),
        offered: [0; MAX_FRIDGES],
    });
    let replay = Replay { epoch_ns: config.epoch.as_nanos(), params: &params, max_flows: config.max_flows as usize };
    // The same state layout as the daemon's, so the same modes fit.
    with_modes!(Layout::for_modes(config.pirate.modes), M => replay.epochs::<M>(reader, fridges, on_epoch))
}

struct Replay<'a> {
    epoch_ns: u64,
    params: &'a Params,
    max_flows: usize,
}

/// The epoch being replayed and where it starts.
struct Clock {
    epoch: u32,
    start_ns: u64,
}

impl Replay<'_> {
    fn epochs<const M: usize>(
        &self,
        mut reader: CaptureReader,
        mut fridges: Option<ReplayFridges>,
        mut on_epoch: impl FnMut(EpochData) -> anyhow::Result<Option<Fridges>>,
    ) -> anyhow::Result<Summary> {
        let mut flows: HashMap<FlowKey, FlowState<M>> = HashMap::new();
        let mut summary = Summary::default();
        // An epoch closes before any packet of the next one: no state is handed over early, as in
        // the kernel for every flow that stays quiet until the drain.
        let mut close = |flows: &HashMap<FlowKey, FlowState<M>>,
                         fridges: &mut Option<ReplayFridges>,
                         closed: u32,
                         span_ns: u64|
         -> anyhow::Result<()> {
            let fridge = fridges.as_mut().map(|f| f.close(span_ns));
            let flows = flows
                .iter()
                .filter(|(_, st)| st.measured(closed))
                .map(|(k, st)| FlowEpoch::from_state(*k, st))
                .collect();
            if let (Some(shape), Some(f)) = (on_epoch(EpochData { epoch: closed, flows, fridge })?, fridges.as_mut()) {
                f.table.reshape(shape);
            }
            Ok(())
        };
        let mut clock: Option<Clock> = None;
        let (mut pkt, mut last_ns) = (PacketCtx::default(), 0);
        loop {
            let (ts, frame) = match reader.frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(e) => {
                    summary.read.error = Some(e);
                    break;
                }
            };
            let c = clock.get_or_insert(Clock { epoch: 1, start_ns: ts });
            if ts >= c.start_ns + self.epoch_ns || ts.saturating_add(JUMP_NS) < c.start_ns {
                close(&flows, &mut fridges, c.epoch, self.epoch_ns)?;
                if !self.skip_to(c, ts) {
                    summary.time_steps += 1;
                    *c = Clock { epoch: c.epoch.saturating_add(1), start_ns: ts };
                }
            }
            if let Err(reject) = parse(frame, &mut pkt) {
                summary.read.refused.add(reject.name());
                continue;
            }
            summary.read.replayed += 1;
            last_ns = ts;
            pkt.ts_ns = ts;
            if let Some(f) = &mut fridges {
                f.table.packet(&pkt, |s| f.samples.push(s));
            }
            if measures(&pkt) {
                if flows.len() >= self.max_flows + self.max_flows / 4 && !flows.contains_key(&pkt.key) {
                    summary.flows_evicted += evict(&mut flows, self.max_flows);
                }
                let st = flows.entry(pkt.key).or_insert_with(|| FlowState::new(c.epoch));
                step(st, c.epoch, &pkt, frame, self.params, |_| {});
            }
        }
        if let Some(c) = clock {
            close(&flows, &mut fridges, c.epoch, last_ns.saturating_sub(c.start_ns).max(1))?;
            summary.epochs = c.epoch;
        }
        summary.read.finish(reader);
        Ok(summary)
    }

    /// Moves `clock` forward to the epoch `ts` falls in, past any empty ones; false if `ts` is
    /// before it or too far ahead to number.
    fn skip_to(&self, clock: &mut Clock, ts: u64) -> bool {
        let Some(ahead) = ts.checked_sub(clock.start_ns).map(|d| d / self.epoch_ns) else { return false };
        let Some(epoch) = u32::try_from(ahead).ok().and_then(|n| clock.epoch.checked_add(n)) else { return false };
        *clock = Clock { epoch, start_ns: clock.start_ns + ahead * self.epoch_ns };
        true
    }
}

/// Keeps the `keep` flows heard from last (the kernel's table likewise forgets its oldest);
/// how many it forgot. Flows heard from at the same instant go in their keys' order, so that
/// exactly `keep` stay whatever the ties (a capture's coarse timestamps tie often), and a replay
/// forgets the same flows every time.
fn evict<const M: usize>(flows: &mut HashMap<FlowKey, FlowState<M>>, keep: usize) -> u64 {
    let mut last: Vec<(u64, FlowKey)> = flows.iter().map(|(k, st)| (st.last_pkt.get(), *k)).collect();
    let forget = last.len().saturating_sub(keep);
    if forget == 0 {
        return 0;
    }
    last.select_nth_unstable(forget - 1);
    for (_, key) in &last[..forget] {
        flows.remove(key);
    }
    forget as u64
}

/// The fridges in replay: the userspace table, the epoch's samples, and the requests offered
/// when the last epoch closed (what `fridge::samples::Samples` keeps live).
struct ReplayFridges {
    table: FridgeTable,
    samples: Vec<Sample>,
    offered: [u64; MAX_FRIDGES],
}

impl ReplayFridges {
    /// Closes the fridges' epoch of `span_ns`.
    fn close(&mut self, span_ns: u64) -> FridgeEpoch {
        let now = self.table.offered();
        let epoch = FridgeEpoch {
            samples: std::mem::take(&mut self.samples),
            offered: std::array::from_fn(|k| now[k] - self.offered[k]),
            span_ns,
            shape: *self.table.shape(),
        };
        self.offered = now;
        epoch
    }
}

#[cfg(test)]
mod tests {
    use pirate_common::pirate::config::MODES_COMPACT;

    use super::*;

    /// Flows heard from at one instant (a capture's coarse clock) are forgotten as others are:
    /// down to what is kept, the same ones every time, and the latest kept whatever the ties.
    #[test]
    fn flows_tied_on_their_last_packet_are_evicted_down_to_the_limit() {
        let key =
            |i: u32| FlowKey { sport: i as u16, dport: (i >> 16) as u16, proto: 6, family: 4, ..FlowKey::default() };
        let table = |n: u32| -> HashMap<FlowKey, FlowState<MODES_COMPACT>> {
            (0..n)
                .map(|i| {
                    let mut st = FlowState::new(1);
                    st.last_pkt.set(if i < n - 10 { 7 } else { 9 });
                    (key(i), st)
                })
                .collect()
        };
        let mut flows = table(5000);
        assert_eq!(evict(&mut flows, 1000), 4000);
        assert_eq!(flows.len(), 1000);
        assert!((4990..5000).all(|i| flows.contains_key(&key(i))), "the latest flows were forgotten");
        let mut again = table(5000);
        evict(&mut again, 1000);
        assert_eq!(again.keys().collect::<std::collections::BTreeSet<_>>(), flows.keys().collect());
        assert_eq!(evict(&mut flows, 1000), 0);
    }
}
