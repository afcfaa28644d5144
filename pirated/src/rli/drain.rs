//! What the downstream point reads of RLI each interval, live and in replay: the references
//! taken in it, summarised, and every flow's counters, per CPU, turned into the interval's
//! figures (what each counter gained since the last read). A flow's
//! packets waiting for the reference after theirs are settled here on a copy when that
//! reference has come (the datapath settles them only at the flow's next packet, which an ended
//! flow never sends); the datapath's own settling later gives the same sums, which the copy
//! kept as the baseline, so nothing is counted twice.

use std::collections::{BTreeMap, HashMap};

use pirate_common::{
    key::FlowKey,
    rli::{
        flow::{Counters, RliFlow, SQ_SHIFT},
        Reference, Taken,
    },
};

use super::quantiles::Summary;

/// Delay figures of one estimator over a flow's packets of the interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Figures {
    pub packets: u64,
    pub mean_ns: Option<f64>,
    pub std_dev_ns: Option<f64>,
}

/// One flow's interval.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowFigures {
    pub key: FlowKey,
    /// By interpolation between the references around each packet.
    pub rli: Figures,
    /// By the reference before each packet (RLI-L): it counts the packets still waiting too.
    pub left: Figures,
    /// Packets RLI could not interpolate in the interval (RLI-L counted them).
    pub unsettled: u64,
}

/// The downstream point's intervals, live or replayed: the references taken, by the interval
/// they arrived in, and the flows' counters read when an interval is closed.
pub struct Intervals {
    interval_ns: u64,
    drain: Drain,
    delays: BTreeMap<u64, Vec<f64>>,
}

/// What one interval gave.
pub struct Closed {
    pub interval: u64,
    pub references: Option<Summary>,
    pub flows: Vec<FlowFigures>,
}

impl Intervals {
    pub fn new(interval_ns: u64) -> Intervals {
        Intervals { interval_ns, drain: Drain::default(), delays: BTreeMap::new() }
    }

    /// The interval `tai_ns` lies in.
    pub fn interval(&self, tai_ns: u64) -> u64 {
        tai_ns / self.interval_ns
    }

    /// When interval `interval` is read: a little after its end, for packets stamped just
    /// before it are still on their way through the program.
    pub fn due(&self, interval: u64) -> u64 {
        (interval + 1) * self.interval_ns + (self.interval_ns / 100).clamp(5_000_000, 100_000_000)
    }

    /// A reference taken.
    pub fn taken(&mut self, t: Taken) {
        self.delays.entry(self.interval(t.tai_ns)).or_default().push(t.reference.delay_ns as f64);
    }

    /// Closes `interval`: its references summarised (late ones of earlier intervals dropped),
    /// and what every flow's counters gained since the last close.
    pub fn close(&mut self, interval: u64, flows: Vec<(FlowKey, Vec<RliFlow>)>, references: &[Reference]) -> Closed {
        let mut taken = self.delays.remove(&interval).unwrap_or_default();
        self.delays.retain(|i, _| *i > interval);
        Closed { interval, references: Summary::of(&mut taken), flows: self.drain.read(flows, references) }
    }
}

/// The counters as last read, per flow and CPU.
#[derive(Default)]
pub struct Drain {
    previous: HashMap<FlowKey, Vec<RliFlow>>,
}

impl Drain {
    /// The interval's figures of every flow that had packets in it, from the table as read
    /// now and the references the ring holds.
    pub fn read(&mut self, flows: Vec<(FlowKey, Vec<RliFlow>)>, references: &[Reference]) -> Vec<FlowFigures> {
        let refs: HashMap<u64, Reference> = references.iter().map(|r| (r.seq, *r)).collect();
        let mut out = Vec::new();
        let mut previous = HashMap::with_capacity(flows.len());
        for (key, mut cpus) in flows {
            for flow in &mut cpus {
                let reference = |seq| refs.get(&seq).copied();
                if flow.waiting > 0 && flow.right(&reference).is_some() {
                    flow.settle(reference);
                }
            }
            let before = self.previous.remove(&key).unwrap_or_default();
            let (mut rli, mut left, mut unsettled) = (Merge::default(), Merge::default(), 0);
            for (cpu, now) in cpus.iter().enumerate() {
                let was = before.get(cpu).copied().unwrap_or_default();
                rli.add(&gained(&now.rli, &was.rli));
                left.add(&gained(&now.left, &was.left));
                unsettled += now.unsettled.saturating_sub(was.unsettled);
            }
            if left.packets > 0 || rli.packets > 0 {
                out.push(FlowFigures { key, rli: rli.figures(), left: left.figures(), unsettled });
            }
            previous.insert(key, cpus);
        }
        self.previous = previous;
        out
    }
}

/// What `now` gained over `was`: the whole of it if the counter started again (its flow was
/// evicted and came back, on another centre).
fn gained(now: &Counters, was: &Counters) -> Counters {
    if now.packets < was.packets || (was.packets > 0 && now.centre_ns != was.centre_ns) {
        return *now;
    }
    Counters {
        packets: now.packets - was.packets,
        sum_ns: now.sum_ns.wrapping_sub(was.sum_ns),
        sum_sq: now.sum_sq.saturating_sub(was.sum_sq),
        centre_ns: now.centre_ns,
    }
}

/// Counters of several CPUs, each around its own centre, merged around the first one's.
#[derive(Default)]
struct Merge {
    packets: u64,
    sum: f64,
    /// Σ (d − centre)², ns².
    sq: f64,
    centre: Option<f64>,
}

impl Merge {
    fn add(&mut self, c: &Counters) {
        if c.packets == 0 {
            return;
        }
        let (n, sum, ci) = (c.packets as f64, c.sum_ns as f64, c.centre_ns as f64);
        let sq = c.sum_sq as f64 * (1u64 << (2 * SQ_SHIFT)) as f64;
        let centre = *self.centre.get_or_insert(ci);
        // Σ (d − c)² = Σ (d − cᵢ)² + 2 (cᵢ − c) Σ (d − cᵢ) + n (cᵢ − c)².
        let shift = ci - centre;
        self.sq += sq + 2.0 * shift * (sum - n * ci) + n * shift * shift;
        self.sum += sum;
        self.packets += c.packets;
    }

    fn figures(&self) -> Figures {
        let Some(centre) = self.centre.filter(|_| self.packets > 0) else { return Figures::default() };
        let n = self.packets as f64;
        let mean = self.sum / n;
        let variance = (self.sq / n - (mean - centre).powi(2)).max(0.0);
        Figures { packets: self.packets, mean_ns: Some(mean), std_dev_ns: (self.packets > 1).then(|| variance.sqrt()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(port: u16) -> FlowKey {
        FlowKey { sport: port, dport: 80, proto: 6, family: 4, ..Default::default() }
    }

    /// Each read gives what the counters gained since the last, merged over CPUs whatever
    /// their centres; an ended flow's waiting packets count once the reference after them is
    /// in the ring, and not again when the datapath settles them itself.
    #[test]
    fn each_interval_counts_what_it_gained_once() {
        let refs =
            [Reference { seq: 1, at_ns: 0, delay_ns: 1000 }, Reference { seq: 2, at_ns: 64_000, delay_ns: 3000 }];
        let mut flow = RliFlow::default();
        let newest = |n: u64| refs.iter().copied().find(|r| r.seq == n);
        // Two packets a quarter and three quarters of the way: 1500 and 2500 ns.
        flow.on_packet(16_000, newest(1), newest);
        flow.on_packet(48_000, newest(1), newest);
        let mut other = RliFlow::default();
        other.on_packet(32_000, newest(1), newest);
        let mut drain = Drain::default();
        // Only the first reference has come: RLI-L counts, RLI waits.
        let first = drain.read(vec![(key(1), vec![flow, other])], &refs[..1]);
        assert_eq!((first[0].left.packets, first[0].left.mean_ns), (3, Some(1000.0)));
        assert_eq!(first[0].rli.packets, 0);
        // The second has: the three settle here (1500, 2500 and 2000 ns, two CPUs).
        let second = drain.read(vec![(key(1), vec![flow, other])], &refs);
        let rli = second[0].rli;
        assert_eq!((rli.packets, second[0].left.packets), (3, 0));
        assert!((rli.mean_ns.unwrap() - 2000.0).abs() < 1.0, "{rli:?}");
        assert!((rli.std_dev_ns.unwrap() - (500_000.0f64 / 3.0).sqrt()).abs() < 16.0, "{rli:?}");
        // The datapath settles them later itself: nothing new.
        for f in [&mut flow, &mut other] {
            f.settle(newest);
        }
        assert_eq!(drain.read(vec![(key(1), vec![flow, other])], &refs), vec![]);
    }
}
