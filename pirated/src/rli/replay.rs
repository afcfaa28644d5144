//! RLI over a capture at the downstream point, taken where the references still are (before
//! D's XDP, which drops them: a mirror port, the link's far end): each frame through the
//! datapath's step (`pirate_common::rli::packet`, the one copy), each interval closed when the
//! capture passes the time the live point would read it, so the lines are those the live point
//! would have printed. The frame's capture time stands for both of the datapath's clocks.

use std::{
    collections::{BTreeSet, HashMap},
    io::Write,
};

use pirate_common::{
    ctx::PacketCtx,
    key::FlowKey,
    parse::parse,
    rli::{
        flow::RliFlow,
        packet,
        reference::{RliShape, Window},
        Flows, Reference, References, Taken, Verdict, RING,
    },
};

use super::{
    config::{Point, RliConfig},
    drain::{Intervals, TableRead},
    report,
    sampled::Matcher,
};
use crate::capture::CaptureReader;

/// The references as the datapath's maps hold them.
struct Refs {
    ring: Vec<Reference>,
    newest: u64,
    window: Window,
    taken: Vec<Taken>,
}

impl References for Refs {
    fn newest(&self) -> u64 {
        self.newest
    }

    fn get(&self, seq: u64) -> Option<Reference> {
        self.ring.get((seq % RING as u64) as usize).copied().filter(|r| r.seq == seq && seq != 0)
    }

    fn put(&mut self, reference: Reference) {
        self.ring[(reference.seq % RING as u64) as usize] = reference;
        self.newest = self.newest.max(reference.seq);
    }

    fn number(&mut self) -> u64 {
        self.newest + 1
    }

    fn window(&mut self) -> Option<&mut Window> {
        Some(&mut self.window)
    }

    fn taken(&mut self, taken: Taken) -> bool {
        self.taken.push(taken);
        true
    }
}

/// The flow table: `max_flows` flows, the least recently seen making room, as the datapath's
/// LRU does (one CPU's); the flows by when they were last seen, so that making room is a
/// lookup, not a walk of the table.
#[derive(Default)]
struct Table {
    flows: HashMap<FlowKey, (RliFlow, u64)>,
    by_seen: BTreeSet<(u64, FlowKey)>,
    max_flows: usize,
    now: u64,
}

impl Table {
    fn remove(&mut self, key: &FlowKey) {
        if let Some((_, seen)) = self.flows.remove(key) {
            self.by_seen.remove(&(seen, *key));
        }
    }

    fn clear(&mut self) {
        self.flows.clear();
        self.by_seen.clear();
    }
}

impl Flows for Table {
    fn flow(&mut self, key: &FlowKey) -> Option<&mut RliFlow> {
        if !self.flows.contains_key(key) && self.flows.len() >= self.max_flows {
            if let Some((_, oldest)) = self.by_seen.pop_first() {
                self.flows.remove(&oldest);
            }
        }
        let (flow, seen) = self.flows.entry(*key).or_default();
        self.by_seen.remove(&(*seen, *key));
        *seen = self.now;
        self.by_seen.insert((self.now, *key));
        Some(flow)
    }
}

impl Refs {
    fn new() -> Refs {
        Refs {
            ring: vec![Reference::default(); RING as usize],
            newest: 0,
            window: Window::default(),
            taken: Vec::new(),
        }
    }
}

/// With sampled references, the upstream capture read ahead of the downstream one: each frame
/// through the upstream point's step (`packet`, as its datapath runs it), the times of its
/// sampled packets to the matcher, so that a reference's time is in when it arrives at D.
pub struct Upstream {
    reader: CaptureReader,
    shape: RliShape,
    tai_offset_ns: i64,
    pkt: PacketCtx,
    refs: Refs,
    /// The last frame's time, and whether the capture has ended.
    last_ns: u64,
    ended: bool,
}

impl Upstream {
    /// The upstream capture `reader`, its clock `tai_offset_ns` from TAI, the upstream point's
    /// step as `config` has it under `key`.
    pub fn new(config: &RliConfig, key: [u64; 2], reader: CaptureReader, tai_offset_ns: i64) -> Upstream {
        let shape = config.spec(Point::Upstream).shape.keyed(key);
        Upstream {
            reader,
            shape,
            tai_offset_ns,
            pkt: PacketCtx::default(),
            refs: Refs::new(),
            last_ns: 0,
            ended: false,
        }
    }

    /// Reads the capture up to a frame after `tai_ns`, its sampled packets' times to `matcher`.
    fn read_to(&mut self, tai_ns: u64, matcher: &mut Matcher, out: &mut Vec<Taken>) -> anyhow::Result<()> {
        let mut none = Table::default();
        while !self.ended && self.last_ns <= tai_ns {
            let Some((ts, frame)) = self.reader.frame()? else {
                self.ended = true;
                break;
            };
            if parse(frame, &mut self.pkt).is_err() {
                continue;
            }
            let ts = ts.saturating_add_signed(self.tai_offset_ns);
            self.last_ns = ts;
            self.pkt.ts_ns = ts;
            packet(&self.shape, &self.pkt, frame, || ts, &mut self.refs, &mut none);
            for t in self.refs.taken.drain(..) {
                matcher.upstream(t.id, t.tai_ns, out);
            }
        }
        Ok(())
    }
}

/// The downstream point's RLI over a capture.
pub struct Replay {
    shape: RliShape,
    refs: Refs,
    /// Sampled references: the upstream capture, and the matcher of their times.
    upstream: Option<(Upstream, Matcher)>,
    resolved: Vec<Taken>,
    table: Table,
    intervals: Intervals,
    /// The next interval to close, from the first frame's on.
    next: Option<u64>,
    /// What the frames did, by `Verdict`, for the summary.
    pub verdicts: HashMap<&'static str, u64>,
}

impl Replay {
    /// RLI as `[rli]` has it, its references' tags checked under `key`, over intervals of
    /// `interval_ns`.
    pub fn new(config: &RliConfig, key: [u64; 2], interval_ns: u64) -> Replay {
        let shape = config.spec(Point::Downstream).shape.keyed(key);
        Replay {
            shape,
            refs: Refs::new(),
            upstream: None,
            resolved: Vec::new(),
            table: Table { max_flows: config.max_flows as usize, ..Table::default() },
            intervals: Intervals::new(interval_ns, config.sampled()),
            next: None,
            verdicts: HashMap::new(),
        }
    }

    /// Sampled references (`rli.references = "sampled"`): their times from `upstream`.
    pub fn with_upstream(mut self, upstream: Upstream, max_delay_ns: u64) -> Replay {
        self.upstream = Some((upstream, Matcher::new(max_delay_ns)));
        self
    }

    /// One frame parsed into `pkt`, captured at `tai_ns`: whether the downstream point's chain
    /// goes on with it (false: anything to the reference port, which the datapath drops). The
    /// intervals the capture has passed are closed first, their lines written into `out`.
    pub fn frame(
        &mut self,
        pkt: &mut PacketCtx,
        frame: &[u8],
        tai_ns: u64,
        out: &mut impl Write,
    ) -> anyhow::Result<bool> {
        self.close_before(tai_ns, out)?;
        if let Some((upstream, matcher)) = &mut self.upstream {
            upstream.read_to(tai_ns, matcher, &mut self.resolved)?;
            matcher.expire(tai_ns, &mut self.resolved);
        }
        pkt.ts_ns = tai_ns;
        self.table.now = tai_ns;
        let verdict = packet(&self.shape, pkt, frame, || tai_ns, &mut self.refs, &mut self.table);
        for t in self.refs.taken.drain(..) {
            match &mut self.upstream {
                Some((_, matcher)) if t.id != 0 => matcher.downstream(t, &mut self.resolved),
                _ => self.intervals.taken(t, tai_ns),
            }
        }
        // Sampled references' delays, into their slots as the live point writes them.
        for t in self.resolved.drain(..) {
            if self.refs.get(t.reference.seq).is_some() {
                self.refs.put(t.reference);
            }
            self.intervals.taken(t, tai_ns);
        }
        *self.verdicts.entry(name(verdict)).or_default() += 1;
        Ok(matches!(verdict, Verdict::Regular | Verdict::Sampled | Verdict::SampledLost))
    }

    /// Closes every interval up to the capture's last, then the one after it with every flow
    /// taken as ended (the capture has, and the live point would find them so later).
    pub fn finish(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        if self.next.is_none() {
            return Ok(());
        }
        let last = self.intervals.interval(self.table.now);
        self.close_before(self.intervals.due(last), out)?;
        let closed = self.intervals.close(last + 1, Some(self.table_now()), true);
        self.table.clear();
        report::write(out, &closed)
    }

    /// The flow table and the references, as the live point's drain reads them.
    fn table_now(&self) -> TableRead {
        let flows = self.table.flows.iter().map(|(k, (f, _))| (*k, vec![*f])).collect();
        (flows, self.refs.ring.iter().copied().filter(|r| r.seq != 0).collect())
    }

    /// Closes the intervals the live point would have read by `tai_ns`.
    fn close_before(&mut self, tai_ns: u64, out: &mut impl Write) -> std::io::Result<()> {
        let mut next = *self.next.get_or_insert(self.intervals.interval(tai_ns));
        while self.intervals.due(next) <= tai_ns {
            let closed = self.intervals.close(next, Some(self.table_now()), false);
            for key in &closed.ended {
                self.table.remove(key);
            }
            report::write(out, &closed)?;
            next += 1;
        }
        self.next = Some(next);
        Ok(())
    }
}

fn name(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Regular => "regular",
        Verdict::Taken | Verdict::Lost => "taken",
        Verdict::Forged => "forged",
        Verdict::Replayed => "replayed",
        Verdict::Stale => "stale",
        Verdict::Sampled | Verdict::SampledLost => "sampled",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full table makes room by the least recently seen flow, as the datapath's LRU does.
    #[test]
    fn the_least_recently_seen_flow_makes_room() {
        let key = |port| FlowKey { sport: port, ..FlowKey::default() };
        let mut table = Table { max_flows: 2, ..Table::default() };
        for (now, port) in [(1, 1), (2, 2), (3, 1), (4, 3)] {
            table.now = now;
            table.flow(&key(port));
        }
        let mut held: Vec<u16> = table.flows.keys().map(|k| k.sport).collect();
        held.sort_unstable();
        assert_eq!((held, table.by_seen.len()), (vec![1, 3], 2));
        table.remove(&key(1));
        assert_eq!((table.flows.len(), table.by_seen.len()), (1, 1));
    }
}
