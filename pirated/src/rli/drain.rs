//! What the downstream point reads of RLI each interval, live and in replay: the references
//! taken in it, summarised, and every flow's counters, per CPU, turned into the interval's
//! figures (what each counter gained since the last read, the datapath's own counters the
//! baseline). An ended flow's packets still waiting for the reference after theirs are settled
//! here, and the flow let go of (see [`Drain::read`]).

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
    /// Why the figures are withheld, if they are.
    pub withheld: Option<&'static str>,
}

/// RLI's figures are withheld when more than this share of the flow's packets in the interval
/// could not be interpolated: those are the packets far from any reference (a burst of more than
/// `MAX_WAITING` of them, a span of lost references), often the slowest, whose absence would
/// read the flow low. RLI-L still has them all.
pub const MAX_UNSETTLED: f64 = 0.01;

/// RLI's figures are withheld when the packets interpolated over a widened span could have moved
/// the flow's mean by more than this share of it. A widened packet's delay is interpolated
/// between references further apart than its own, whose delays bound it, as they bound the
/// packet's own (RLI's premise): it is off by at most the spread of the delays over the span
/// (see [`widened_spread`]), and the flow's mean by that times the widened share of its packets.
pub const MAX_WIDENED_ERROR: f64 = 0.02;

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
    /// Packets RLI interpolated over a widened span (sampled references whose delays were
    /// slow to come: see `pirate_common::rli::flow`).
    pub widened: u64,
}

/// The downstream point's intervals, live or replayed: the references taken, by the interval
/// they arrived in, and the flows' counters read when an interval is closed.
pub struct Intervals {
    interval_ns: u64,
    drain: Drain,
    arrivals: BTreeMap<u64, Vec<Arrival>>,
    /// The last interval closed's, where the spans widened in this one may start.
    closed: Vec<Arrival>,
    /// References sampled from the traffic: RLI-L is withheld (see [`LEFT_SAMPLED`]).
    sampled: bool,
}

/// Why RLI-L's figures are withheld with sampled references: they are packets, densest in the
/// bursts that fill a queue, and the last one's delay stands for the whole gap after it while
/// the queue drains: flows read 7–26 % high on the testbed (docs/accuracy.md). Its packet
/// counts stay.
pub const LEFT_SAMPLED: &str = "sampled_references";

/// A reference as the downstream point took it: its arrival, when its delay was known (a
/// sampled one's once matched, an injected one's on arrival), the delay (`None`: void).
#[derive(Clone, Copy, Debug)]
pub struct Arrival {
    at_ns: u64,
    known_ns: u64,
    delay: Option<f64>,
}

/// The flow table as read (each flow's counters per CPU) and the references the ring holds.
pub type TableRead = (Vec<(FlowKey, Vec<RliFlow>)>, Vec<Reference>);

/// What one interval gave.
pub struct Closed {
    pub interval: u64,
    pub references: Option<Summary>,
    pub flows: Vec<FlowFigures>,
    /// Flows found ended: the table should let go of them.
    pub ended: Vec<FlowKey>,
}

impl Intervals {
    /// Intervals of `interval_ns`; `sampled`: the references are sampled from the traffic.
    pub fn new(interval_ns: u64, sampled: bool) -> Intervals {
        Intervals { interval_ns, drain: Drain::default(), arrivals: BTreeMap::new(), closed: Vec::new(), sampled }
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

    /// A reference taken, its delay known (or void) at `known_ns`: on arrival for an injected
    /// one, once matched for a sampled one.
    pub fn taken(&mut self, t: Taken, known_ns: u64) {
        let arrival = Arrival { at_ns: t.tai_ns, known_ns, delay: t.reference.delay().map(|d| d as f64) };
        self.arrivals.entry(self.interval(t.tai_ns)).or_default().push(arrival);
    }

    /// The table as it stands is no interval's (see [`Drain::baseline`]).
    pub fn baseline(&mut self, flows: Vec<(FlowKey, Vec<RliFlow>)>) {
        self.drain.baseline(flows);
    }

    /// Closes `interval`: its references summarised (late ones of earlier intervals dropped),
    /// and what every flow's counters gained since the last close, from the table as read now
    /// (`None`: it could not be read; the flows count in the next interval that reads it).
    /// With `over`, the flows are all taken as ended (a replayed capture's end).
    pub fn close(&mut self, interval: u64, table: Option<TableRead>, over: bool) -> Closed {
        let arrivals = self.arrivals.remove(&interval).unwrap_or_default();
        self.arrivals.retain(|i, _| *i > interval);
        let mut taken: Vec<f64> = arrivals.iter().filter_map(|a| a.delay).collect();
        let mut around = std::mem::replace(&mut self.closed, arrivals);
        around.extend_from_slice(&self.closed);
        // Where no references waited together, nothing widened: but should some have, the
        // interval's whole spread bounds them.
        let spread = widened_spread(&mut around).or_else(|| spread(taken.iter().copied()));
        let mut read = table.map(|(flows, refs)| self.drain.read(flows, &refs, over, spread)).unwrap_or_default();
        if self.sampled {
            for f in &mut read.figures {
                f.left = Figures { packets: f.left.packets, withheld: Some(LEFT_SAMPLED), ..Figures::default() };
            }
        }
        Closed { interval, references: Summary::of(&mut taken), flows: read.figures, ended: read.ended }
    }
}

/// The counters as last read, per flow and CPU, as the datapath holds them.
#[derive(Default)]
pub struct Drain {
    previous: HashMap<FlowKey, Vec<RliFlow>>,
}

/// What one read of the table gives: the interval's figures, and the flows found ended (their
/// counters unchanged over a whole interval), whose last packets have just been settled here
/// and which the table should let go of.
#[derive(Default)]
pub struct Read {
    pub figures: Vec<FlowFigures>,
    pub ended: Vec<FlowKey>,
}

impl Drain {
    /// The counters as they stand, as the baseline of the next read (a restarted pirated's
    /// first look at a table its predecessor filled: what is in it belongs to no interval).
    pub fn baseline(&mut self, flows: Vec<(FlowKey, Vec<RliFlow>)>) {
        self.previous = flows.into_iter().collect();
    }

    /// The interval's figures of every flow that had packets in it: what its counters gained
    /// since the last read. A flow whose counters have not moved since then has ended: the
    /// packets it left waiting for the reference after theirs are settled here, on the
    /// references the ring holds (the datapath settles them only at the flow's next packet,
    /// which an ended flow never sends), counted in this interval, and the flow is let go of
    /// (so that, should it come back, its counters start afresh rather than settle them twice).
    /// A flow read twice in one walk counts once.
    /// With `over` (the capture replayed has ended), every flow is taken as ended. `spread`:
    /// what a widened packet's delay can be off by at most (`None`: nothing bounds it), see
    /// [`MAX_WIDENED_ERROR`] and [`widened_spread`].
    pub fn read(
        &mut self,
        flows: Vec<(FlowKey, Vec<RliFlow>)>,
        references: &[Reference],
        over: bool,
        spread: Option<f64>,
    ) -> Read {
        let refs: HashMap<u64, Reference> = references.iter().map(|r| (r.seq, *r)).collect();
        let reference = |seq| refs.get(&seq).copied();
        let newest = refs.keys().max().copied().unwrap_or(0);
        let mut out = Read::default();
        let mut previous = HashMap::with_capacity(flows.len());
        for (key, cpus) in flows {
            if previous.contains_key(&key) {
                continue;
            }
            let before = self.previous.remove(&key).unwrap_or_default();
            let ended = over || (!before.is_empty() && before == cpus);
            // Its waiting packets can be settled (or never will: their reference is gone).
            if ended && !cpus.iter().all(|f| f.resolved(newest, reference)) {
                // The reference after them is yet to come: read again next interval.
                previous.insert(key, cpus);
                continue;
            }
            let (mut rli, mut left, mut unsettled, mut widened) = (Merge::default(), Merge::default(), 0, 0);
            for (cpu, raw) in cpus.iter().enumerate() {
                let was = before.get(cpu).copied().unwrap_or_default();
                let mut now = *raw;
                if ended {
                    now.settle(reference);
                }
                rli.add(&gained(&now.rli, &was.rli));
                left.add(&gained(&now.left, &was.left));
                unsettled += now.unsettled.saturating_sub(was.unsettled);
                widened += now.widened.saturating_sub(was.widened);
            }
            match ended {
                true => out.ended.push(key),
                false => {
                    previous.insert(key, cpus);
                }
            }
            if left.packets > 0 || rli.packets > 0 || unsettled > 0 {
                let mut interpolated = rli.figures();
                let withheld = match interpolated.mean_ns {
                    _ if unsettled as f64 > MAX_UNSETTLED * (rli.packets + unsettled) as f64 => Some("unsettled"),
                    Some(mean) if widened > 0 && !widened_within(widened, rli.packets, mean, spread) => Some("widened"),
                    _ => None,
                };
                if withheld.is_some() {
                    interpolated = Figures { packets: rli.packets, withheld, ..Figures::default() };
                }
                out.figures.push(FlowFigures { key, rli: interpolated, left: left.figures(), unsettled, widened });
            }
        }
        self.previous = previous;
        out
    }
}

/// The spread (largest less smallest) of reference delays, if there are any.
fn spread(delays: impl IntoIterator<Item = f64>) -> Option<f64> {
    delays
        .into_iter()
        .fold(None, |range, d| match range {
            None => Some((d, d)),
            Some((lo, hi)) => Some((f64::min(lo, d), f64::max(hi, d))),
        })
        .map(|(lo, hi)| hi - lo)
}

/// What bounds a widened packet's error: the largest spread of the reference delays over a run
/// of references that waited for their delays at once (each arriving before the one before it
/// was known; a flow's groups widen only then), the reference before the run and the one after
/// it included, as a widened span's ends. `None`: no references waited together.
fn widened_spread(arrivals: &mut [Arrival]) -> Option<f64> {
    arrivals.sort_unstable_by_key(|a| a.at_ns);
    let mut widest: Option<f64> = None;
    let mut start = 0;
    while start < arrivals.len() {
        let (mut end, mut known) = (start + 1, arrivals[start].known_ns);
        while end < arrivals.len() && arrivals[end].at_ns < known {
            known = known.max(arrivals[end].known_ns);
            end += 1;
        }
        if end - start >= 2 {
            let span = &arrivals[start.saturating_sub(1)..(end + 1).min(arrivals.len())];
            if let Some(s) = spread(span.iter().filter_map(|a| a.delay)) {
                widest = Some(widest.map_or(s, |w| w.max(s)));
            }
        }
        start = end;
    }
    widest
}

/// Whether `widened` of a flow's `packets`, its mean `mean` ns, could have moved the mean by at
/// most [`MAX_WIDENED_ERROR`] of it, each off by at most `spread`.
fn widened_within(widened: u64, packets: u64, mean: f64, spread: Option<f64>) -> bool {
    spread.is_some_and(|spread| widened as f64 * spread <= MAX_WIDENED_ERROR * mean.abs() * packets as f64)
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
        Figures {
            packets: self.packets,
            mean_ns: Some(mean),
            std_dev_ns: (self.packets > 1).then(|| variance.sqrt()),
            withheld: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two references 64 µs apart, their delays 1000 and 3000 ns.
    const REFS: [Reference; 2] =
        [Reference { seq: 1, at_ns: 0, delay_ns: 1000 }, Reference { seq: 2, at_ns: 64_000, delay_ns: 3000 }];

    fn newest(n: u64) -> Option<Reference> {
        REFS.iter().copied().find(|r| r.seq == n)
    }

    fn key(port: u16) -> FlowKey {
        FlowKey { sport: port, dport: 80, proto: 6, family: 4, ..Default::default() }
    }

    /// Each read gives what the counters gained since the last, merged over CPUs whatever
    /// their centres. A flow whose counters stood still over an interval has ended: its
    /// waiting packets count once the reference after them is in the ring, once, and the flow
    /// is let go of; one still moving waits for the datapath to settle them. A flow read twice
    /// in a walk counts once; what a table held before the first read counts nowhere.
    #[test]
    fn each_interval_counts_what_it_gained_once() {
        let refs = REFS;
        // Two packets a quarter and three quarters of the way: 1500 and 2500 ns; on another
        // CPU one half-way, 2000 ns.
        let mut flow = RliFlow::default();
        flow.on_packet(16_000, newest(1), newest);
        flow.on_packet(48_000, newest(1), newest);
        let mut other = RliFlow::default();
        other.on_packet(32_000, newest(1), newest);
        let table = |a: RliFlow, b: RliFlow| vec![(key(1), vec![a, b]), (key(1), vec![a, b])];
        let mut drain = Drain::default();
        // Only the first reference has come: RLI-L counts, RLI waits; counted once.
        let first = drain.read(table(flow, other), &refs[..1], false, None).figures;
        assert_eq!(first.len(), 1);
        assert_eq!((first[0].left.packets, first[0].left.mean_ns, first[0].rli.packets), (3, Some(1000.0), 0));
        // Unchanged, but the reference after them is yet to come: nothing, kept.
        let waiting = drain.read(table(flow, other), &refs[..1], false, None);
        assert_eq!((waiting.figures.len(), waiting.ended.len()), (0, 0));
        // It has come: the three settle here, once, and the flow is let go of.
        let ended = drain.read(table(flow, other), &refs, false, None);
        let rli = ended.figures[0].rli;
        assert_eq!((rli.packets, ended.figures[0].left.packets, ended.ended.len()), (3, 0, 1));
        assert!((rli.mean_ns.unwrap() - 2000.0).abs() < 1.0, "{rli:?}");
        assert!((rli.std_dev_ns.unwrap() - (500_000.0f64 / 3.0).sqrt()).abs() < 16.0, "{rli:?}");

        // A flow that moves on instead: the datapath settles its packets, counted then.
        let mut drain = Drain::default();
        drain.baseline(table(flow, other));
        let (mut moved, stayed) = (flow, other);
        moved.on_packet(70_000, newest(2), newest);
        let read = drain.read(table(moved, stayed), &refs, false, None);
        assert_eq!(read.ended.len(), 0);
        assert_eq!((read.figures[0].rli.packets, read.figures[0].left.packets), (2, 1));
        // Nothing of what the baseline held counted.
        assert_eq!(drain.read(table(moved, stayed), &refs, false, None).figures.len(), 0);

        // An ended flow whose references the ring no longer holds: its waiting packets count
        // as unsettled, once (and withhold RLI's figure), and the flow is let go of.
        let mut drain = Drain::default();
        drain.baseline(table(flow, other));
        let gone = drain.read(table(flow, other), &[], false, None);
        assert_eq!(
            (gone.figures[0].unsettled, gone.figures[0].rli.withheld, gone.ended.len()),
            (3, Some("unsettled"), 1)
        );
    }

    /// A flow some of whose packets were interpolated over widened spans keeps its figure only
    /// while they could not have moved its mean by more than `MAX_WIDENED_ERROR`: their share
    /// times the spread that bounds them, against the mean.
    #[test]
    fn widened_packets_withhold_a_figure_they_could_move() {
        let refs = REFS;
        let mut flow = RliFlow::default();
        for at in (0..100).map(|i| 640 * i) {
            flow.on_packet(at, newest(1), newest);
        }
        flow.on_packet(64_000, newest(2), newest);
        flow.widened = 1;
        let read = |spread| {
            let mut drain = Drain::default();
            drain.read(vec![(key(1), vec![flow])], &refs, false, spread).figures[0].rli
        };
        // 100 packets interpolated, mean 1990 ns: the widened one may be off by 2 % of the
        // mean times 100, 3980 ns.
        let exact = read(Some(0.0));
        assert_eq!(exact.packets, 100);
        let limit = MAX_WIDENED_ERROR * exact.mean_ns.unwrap() * 100.0;
        assert!((limit - 3980.0).abs() < 1.0, "{exact:?}");
        assert_eq!(read(Some(limit * 0.999)), exact);
        assert_eq!(
            read(Some(limit * 1.001)),
            Figures { packets: 100, withheld: Some("widened"), ..Figures::default() }
        );
        // No reference delay known in the interval: nothing bounds them.
        assert_eq!(read(None).withheld, Some("widened"));
        assert_eq!(spread([3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(spread([]), None);
    }

    /// The spread that bounds widened packets is over the references that waited for their
    /// delays together, with the one before and the one after them: not the interval's.
    #[test]
    fn widened_spans_are_bounded_by_the_references_that_waited_together() {
        let a = |at_ns, known_ns, delay: f64| Arrival { at_ns, known_ns, delay: Some(delay) };
        // Each known on arrival (injected): none waited together.
        let mut injected = [a(0, 0, 1.0), a(10, 10, 50.0), a(20, 20, 3.0)];
        assert_eq!(widened_spread(&mut injected), None);
        // 30 and 40 arrive while 20 waits: 10 … 50 (delays 4, 6, 9, 12, 13); 0 and 60 are
        // further off, and their delays (100, 0) count nowhere.
        let mut sampled = [
            a(60, 61, 0.0),
            a(0, 1, 100.0),
            a(10, 11, 4.0),
            a(20, 45, 6.0),
            a(30, 35, 9.0),
            a(40, 41, 12.0),
            a(50, 51, 13.0),
        ];
        assert_eq!(widened_spread(&mut sampled), Some(9.0));
    }
}
