//! Estimators: pure functions from a flow's modes (one epoch) to its mean response latency, and
//! from flows to servers.

pub mod batches;
pub mod chains;
mod figure;
mod merged;
pub mod paper;
pub mod quantile;
pub mod servers;
pub mod span;

use std::cell::OnceCell;

use serde::{Deserialize, Serialize};

use chains::Chains;
pub use figure::{Ends, FlowEstimate};
use pirate_common::{parse::IPPROTO_TCP, pirate::modes::Epsilon};

use crate::pirate::flow::{FlowEpoch, Mode};

/// Which estimator turns modes into a latency.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Estimator {
    /// The paper's proportional mode sum: the largest de-noised mode is the inter-batch gap.
    Paper,
    /// Gap time over the number of gaps that end a batch (every gap above the break between
    /// intra- and inter-batch gaps): right where the paper's is not, when service times vary
    /// within an epoch or reordering splits the inter-batch gaps over several modes.
    #[default]
    Batches,
}

/// Everything the estimators need besides the modes.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub paper: paper::Denoise,
    pub batches: batches::Break,
    /// TCP gaps are marked by the client's acknowledgement number (`FLAG_MARK_ACKED`): a marked
    /// gap held a response, so it ends a batch.
    pub acked_marks: bool,
    /// A flow's estimate below this share of its handshake's round trip is withheld
    /// ([`NoFigure::BelowRoundTrip`]); 0: never.
    pub round_trip_floor: f64,
    /// Taken off that floor: a handshake is one round trip, timed once, and at sub-millisecond
    /// round trips the noise of the hosts' scheduling is as large (a cold first exchange).
    pub round_trip_slack_ns: f64,
    /// A multiplexed flow's figure is withheld ([`NoFigure::Interleaved`]) when its gaps from a
    /// tenth to a half of its latency hold more than this share of its time: the most by which
    /// the estimate can be too high, from cycles of its streams split three ways or more
    /// ([`batches::half_latency`]); 1: never. Also how far that count may lie from the reading
    /// of one request in flight before it is withheld as [`NoFigure::Ambiguous`].
    pub multiplexed_short_share: f64,
    /// Alg. 2's ε and span cap: modes closer than ε form the chains the estimators read.
    pub epsilon: Epsilon,
    /// A figure from fewer batches is withheld ([`NoFigure::FewBatches`]).
    pub min_batches: u64,
}

impl Settings {
    /// One flow's epoch (its IP protocol and modes) through the estimators asked for: (paper,
    /// batches), `None` for one not asked for or without a figure.
    pub fn estimate(
        &self,
        proto: u8,
        modes: &[Mode],
        paper: bool,
        batches: bool,
    ) -> (Option<FlowEstimate>, Option<FlowEstimate>) {
        let chains = Chains::new(modes, self.epsilon);
        let on_chains = |est: Option<FlowEstimate>| est.map(|e| chains.expand(e));
        let b = &self.batches;
        let batches = match batches {
            false => None,
            true if self.acked_marks && proto == IPPROTO_TCP => batches::marked(modes, b),
            true => match batches::with_break(&chains.modes, b) {
                (est, true) => on_chains(est),
                // Over a long epoch of spread gaps (reordering, loss), the span-capped modes can
                // fill every interval and chain into one: only the narrow ones still show the
                // break.
                (chained, false) => match batches::with_break(modes, b) {
                    (narrow, true) => narrow,
                    (_, false) => on_chains(chained),
                },
            },
        };
        let paper = paper.then(|| on_chains(paper::proportional_mode_sum(&chains.modes, &self.paper))).flatten();
        (paper, batches)
    }

    /// One flow's epoch through the estimators asked for, each figure held to what its batches
    /// can support, or withheld with the reason: one below [`Settings::round_trip_floor`] of the
    /// flow's round trip is, unless the batches estimator finds the flow's figure with the floor
    /// as its break (one request in flight). Where an estimate's batches say the flow is
    /// [`multiplexed`], its batches are counted at half its latency instead
    /// ([`Settings::multiplexed_figure`]), and the paper's figure stands only where that one does
    /// and agrees with it: its one mode of inter-batch gaps holds the longer halves of cycles
    /// split between groups of streams, or the shorter, as the groups drift.
    ///
    /// Whatever the estimator, a figure needs evidence that its batches are the flow's waits for
    /// responses ([`Settings::supported`]).
    pub fn flow(&self, flow: &FlowEpoch, modes: &[Mode], paper: bool, batches: bool) -> Estimates {
        // The batches estimator's count tells multiplexed streams (below), for the paper's
        // figure too: that one takes nearly every gap for a batch end when streams interleave,
        // as many as the gaps that acknowledge new data, and cannot.
        let want_batches = batches;
        let (paper, batches) = self.estimate(flow.key.proto, modes, paper, batches || paper);
        let floor = self.floor_ns(flow);
        let halves = OnceCell::new();
        let half =
            || *halves.get_or_init(|| self.multiplexed_figure(flow, modes, floor).map(|h| (h, Rule::HalfLatency)));
        let mux = |e: &FlowEstimate| multiplexed(flow, e.batches);
        let streams = batches.as_ref().is_some_and(mux);
        let batches = batches.filter(|_| want_batches);
        let first = match self.acked_marks && flow.key.proto == IPPROTO_TCP {
            true => Rule::Marked,
            false => Rule::Break,
        };
        let batches = batches.map(|e| match e {
            e if below(floor, modes, &e) => match batches::from_floor(modes, &self.batches, floor) {
                Some(f) if mux(&f) => half(),
                Some(f) if !below(floor, modes, &f) => Ok((f, Rule::FloorBreak)),
                _ => Err(NoFigure::BelowRoundTrip),
            },
            e if mux(&e) => half(),
            e => Ok((e, first)),
        });
        let paper = paper.map(|p| match p {
            p if below(floor, modes, &p) => Err(NoFigure::BelowRoundTrip),
            p if mux(&p) || streams => half().and_then(|(h, _)| match (p.estimate_ns / h.estimate_ns - 1.0).abs() {
                off if off > self.multiplexed_short_share => Err(NoFigure::Interleaved),
                _ => Ok((p, Rule::ModeSumHalfLatency)),
            }),
            p => Ok((p, Rule::ModeSum)),
        });
        let split = |r: Option<Result<(FlowEstimate, Rule), NoFigure>>| match r
            .map(|r| in_flight_told(flow).and(r).and_then(|f| self.supported(flow, modes, f)))
        {
            Some(Ok((e, rule))) => (Some(e), Some(rule), None),
            Some(Err(why)) => (None, None, Some(why)),
            None => (None, None, None),
        };
        let ((paper, paper_rule, paper_withheld), (batches, batches_rule, batches_withheld)) =
            (split(paper), split(batches));
        Estimates { paper, batches, paper_withheld, batches_withheld, paper_rule, batches_rule, server: 0 }
    }

    /// A figure, if its flow's packets support it: from [`Settings::min_batches`]
    /// batches or more (one batch cannot be told from the exchanges that open and close a
    /// connection). Unless counted at half the latency of multiplexed streams: on TCP, from no
    /// more batches than gaps across which the client acknowledged new data (by
    /// [`MULTIPLEXED_ACKS`]): a batch no response started is a stream's request between others',
    /// not a wait; and with no more time inside a batch, on average, than a client's pacing takes
    /// (`intra_batch_max`): gaps that are neither pacing nor waits for responses (a connection's
    /// close, a client's pauses) make batches longer.
    fn supported(
        &self,
        flow: &FlowEpoch,
        modes: &[Mode],
        (e, rule): (FlowEstimate, Rule),
    ) -> Result<(FlowEstimate, Rule), NoFigure> {
        if e.batches < self.min_batches {
            return Err(NoFigure::FewBatches);
        }
        if rule.multiplexed() {
            return Ok((e, rule));
        }
        let acked = flow.acked_gaps;
        if acked < u16::MAX && e.batches as f64 > MULTIPLEXED_ACKS * acked as f64 {
            return Err(NoFigure::Unanswered);
        }
        let ends_ns: f64 = e.ends.of(modes).map(|(i, n)| modes[i].mean_ns() * n as f64).sum();
        if (e.kept_ns as f64 - ends_ns) / e.batches as f64 > self.batches.rules.intra_batch_max_ns as f64 {
            return Err(NoFigure::LongBatches);
        }
        Ok((e, rule))
    }

    /// A multiplexed flow's figure, [`Settings::half_latency_count`], withheld as
    /// [`NoFigure::Ambiguous`] unless the other reading of its acknowledgements agrees: more
    /// acknowledged gaps than batches also means waits below the break (a server answering in
    /// 1 ms and in 11 ms, one request at a time), where each acknowledged gap is one wait and the
    /// figure the mean over them. Acknowledged gaps shorter than the handshake's round trip do
    /// not settle it: the handshake is one sample of the path, and may have met its slow side.
    fn multiplexed_figure(&self, flow: &FlowEpoch, modes: &[Mode], floor_ns: f64) -> Result<FlowEstimate, NoFigure> {
        let h = self.half_latency_count(modes, floor_ns)?;
        let one_wait_each = h.kept_ns as f64 / flow.acked_gaps.max(1) as f64;
        match (h.estimate_ns / one_wait_each - 1.0).abs() <= self.multiplexed_short_share {
            true => Ok(h),
            false => Err(NoFigure::Ambiguous),
        }
    }

    /// Streams' batches counted at half their latency, [`batches::half_latency`]: none below the
    /// round-trip floor, where its short gaps could hide more than
    /// [`Settings::multiplexed_short_share`] of its cycles, where more than [`UNPAIRED_SHARE`]
    /// of its batch ends have no shorter half, or where more than [`LONG_SHARE`] of its time
    /// lies in gaps too long for the figure.
    fn half_latency_count(&self, modes: &[Mode], floor_ns: f64) -> Result<FlowEstimate, NoFigure> {
        match batches::half_latency(modes, &self.batches) {
            Some(h) if h.estimate.estimate_ns < floor_ns => Err(NoFigure::BelowRoundTrip),
            Some(h)
                if h.short <= self.multiplexed_short_share && h.unpaired <= UNPAIRED_SHARE && h.long <= LONG_SHARE =>
            {
                Ok(h.estimate)
            }
            _ => Err(NoFigure::Interleaved),
        }
    }

    /// The round-trip floor of a flow: [`Settings::round_trip_floor`] of its handshake's round
    /// trip less [`Settings::round_trip_slack_ns`].
    fn floor_ns(&self, flow: &FlowEpoch) -> f64 {
        self.round_trip_floor * flow.handshake_rtt_ns as f64 - self.round_trip_slack_ns
    }
}

/// Whether the flow's transport and protocol let its packets tell how many requests it has in
/// flight, which every figure rests on: on TCP, where its acknowledgement numbers say when
/// responses arrived, unless the client may multiplex requests ([`NoFigure::Multiplexing`]);
/// not on QUIC or any other UDP, whose packets say nothing of responses. Whatever an
/// estimator made of such a flow's gaps is withheld for that reason first.
fn in_flight_told(flow: &FlowEpoch) -> Result<(), NoFigure> {
    match (flow.key.proto == IPPROTO_TCP, flow.quic, flow.multiplexing) {
        (_, true, _) => Err(NoFigure::Quic),
        (false, _, _) => Err(NoFigure::Udp),
        (true, _, true) => Err(NoFigure::Multiplexing),
        (true, _, false) => Ok(()),
    }
}

/// See [`batches::Halves::unpaired`]: above what streams in step leave by the noise of their
/// waits (measured in docs/accuracy.md).
const UNPAIRED_SHARE: f64 = 0.15;

/// See [`batches::Halves::long`]: well above what flows read right hold there, well below what
/// one read at a fraction of its latency held (measured in docs/accuracy.md).
const LONG_SHARE: f64 = 0.05;

/// Whether the flow acknowledged data across [`MULTIPLEXED_ACKS`] times as many gaps as
/// `batches` (a count that saturates at 65535): responses arrived while its batches were sent.
fn multiplexed(flow: &FlowEpoch, batches: u64) -> bool {
    flow.acked_gaps as f64 >= (MULTIPLEXED_ACKS * batches as f64).min(u16::MAX as f64)
}

/// Gaps with new data acknowledged per batch from which a TCP flow counts as multiplexed: a
/// client with one request in flight acknowledges once per batch (its first request), and
/// retransmissions and reordering add none that count, while streams multiplexed on a
/// connection add some, even when they drift apart until nearly every gap ends a batch
/// (measured in docs/accuracy.md).
const MULTIPLEXED_ACKS: f64 = 1.03;

/// Batch ends shorter than the round-trip floor allowed in an epoch with a figure: scheduling
/// noise at the vantage point can shorten a gap (a request seen late, the next on time).
const SHORT_ENDS_SHARE: f64 = 0.05;

/// Whether the estimate, or more than [`SHORT_ENDS_SHARE`] of its batches' ends (modes wholly
/// below it), lie below `floor_ns`: streams out of step for the whole epoch, or for a part of it.
/// A mode across the floor is not counted: a handshake delayed by reordering raises the floor
/// into the batch ends of a client with one request in flight.
fn below(floor_ns: f64, modes: &[Mode], e: &FlowEstimate) -> bool {
    let short: u64 = e.ends.of(modes).filter(|&(i, _)| (modes[i].max_ns as f64) < floor_ns).map(|(_, n)| n).sum();
    e.estimate_ns < floor_ns || short as f64 > SHORT_ENDS_SHARE * e.batches as f64
}

/// The rule that produced a figure: its evidence, with what it says of the requests in flight
/// ([`Rule::streams`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// The batches estimator: every gap above the break between pacing and waits ends a batch.
    Break,
    /// The batches estimator on the acknowledgement marks (`mark_acked`).
    Marked,
    /// The batches estimator with the round-trip floor as its break (one request in flight,
    /// reordering below the break).
    FloorBreak,
    /// Streams multiplexed on the connection, their cycles counted at half their latency.
    HalfLatency,
    /// The paper's proportional mode sum.
    ModeSum,
    /// The paper's, agreeing with the count at half the latency of multiplexed streams.
    ModeSumHalfLatency,
}

/// What a figure's evidence says of the requests its flow had in flight: a number where it
/// shows one, and bounds (`None`: no upper bound known).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Streams {
    pub in_flight: Option<u32>,
    pub lower: u32,
    pub upper: Option<u32>,
}

impl Rule {
    pub fn name(self) -> &'static str {
        match self {
            Rule::Break => "break",
            Rule::Marked => "acknowledged",
            Rule::FloorBreak => "round_trip_break",
            Rule::HalfLatency => "half_latency",
            Rule::ModeSum => "mode_sum",
            Rule::ModeSumHalfLatency => "mode_sum_half_latency",
        }
    }

    fn multiplexed(self) -> bool {
        matches!(self, Rule::HalfLatency | Rule::ModeSumHalfLatency)
    }

    /// The requests in flight on a flow whose figure this rule gave (a TCP flow's: no other has
    /// one): one, where acknowledgements came once per batch ([`Settings::supported`] withholds
    /// where they came less often); two or more where they came more often.
    pub fn streams(self) -> Streams {
        match self.multiplexed() {
            true => Streams { in_flight: None, lower: 2, upper: None },
            false => Streams { in_flight: Some(1), lower: 1, upper: Some(1) },
        }
    }
}

/// Why a flow with gaps has no figure from an estimator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoFigure {
    /// The estimate, or more than a few of the batch ends, shorter than the connection's
    /// handshake round trip allows: no response comes back that fast, so those gaps are between
    /// the requests of streams multiplexed on the connection and interleaved in time (HTTP/2,
    /// gRPC), and the mean between batch ends is a fraction of the latency. (The batches
    /// estimator first tries the floor as its break: [`Settings::flow`].)
    BelowRoundTrip,
    /// Streams multiplexed on the connection (responses arrive while requests are sent) in three
    /// groups or more out of step: cycles of them may have no gap of half a latency, or two, so
    /// that counting them at half the latency cannot be trusted; its gaps say so
    /// ([`Settings::multiplexed_figure`]).
    Interleaved,
    /// Fewer batches than [`Settings::min_batches`].
    FewBatches,
    /// On TCP, more batches than gaps across which the client acknowledged new data: batches
    /// that no response started ([`Settings::supported`]).
    Unanswered,
    /// QUIC: nothing in the client's packets tells how many requests it has in flight.
    Quic,
    /// Any other UDP: nothing in the client's packets says that a response arrived before a
    /// request, or at all (a sink, a stream of media, a client with many queries outstanding).
    Udp,
    /// The client speaks a protocol that multiplexes requests on the connection (the HTTP/2
    /// preface; `h2` offered in its TLS ClientHello), or may (a preamble, or a connection met
    /// after its handshake that starts no HTTP/1 request or RESP command), and nothing in its
    /// packets tells how many it has in flight: streams out of step, groups of them half a
    /// cycle apart, and streams a server serves one at a time all request as one stream of a
    /// faster server would (`pirate_common::pirate::protocol`).
    Multiplexing,
    /// More time inside a batch, on average, than a client's pacing takes
    /// ([`Settings::supported`]).
    LongBatches,
    /// On TCP, more gaps acknowledged new data than the break found batches, and nothing tells
    /// which of two readings holds: streams multiplexed on the connection, counted at half their
    /// latency, or one request in flight whose shorter waits fell below the break (service
    /// times 1 and 11 ms apart), one wait per acknowledged gap. Their figures disagree
    /// ([`Settings::multiplexed_figure`]).
    Ambiguous,
}

impl NoFigure {
    pub const ALL: [NoFigure; 9] = [
        NoFigure::BelowRoundTrip,
        NoFigure::Interleaved,
        NoFigure::FewBatches,
        NoFigure::Unanswered,
        NoFigure::Quic,
        NoFigure::Udp,
        NoFigure::Multiplexing,
        NoFigure::LongBatches,
        NoFigure::Ambiguous,
    ];

    /// The reason as JSON and the metrics' `reason` label name it.
    pub fn name(self) -> &'static str {
        match self {
            NoFigure::BelowRoundTrip => "below_round_trip",
            NoFigure::Interleaved => "interleaved",
            NoFigure::FewBatches => "few_batches",
            NoFigure::Unanswered => "unanswered",
            NoFigure::Quic => "quic",
            NoFigure::Udp => "udp",
            NoFigure::Multiplexing => "multiplexing",
            NoFigure::LongBatches => "long_batches",
            NoFigure::Ambiguous => "ambiguous",
        }
    }
}

/// One flow's figures from each estimator (`None`: not asked for, or no figure).
#[derive(Clone, Copy, Debug, Default)]
pub struct Estimates {
    pub paper: Option<FlowEstimate>,
    pub batches: Option<FlowEstimate>,
    /// Why `paper` / `batches` is `None` though the estimator had a figure.
    pub paper_withheld: Option<NoFigure>,
    pub batches_withheld: Option<NoFigure>,
    /// The rule behind `paper` / `batches`.
    pub paper_rule: Option<Rule>,
    pub batches_rule: Option<Rule>,
    /// The flow's server's number in its share of the flows (see `servers::Numbering`).
    pub server: u32,
}

impl Estimates {
    pub fn of(&self, which: Estimator) -> Option<&FlowEstimate> {
        match which {
            Estimator::Paper => self.paper.as_ref(),
            Estimator::Batches => self.batches.as_ref(),
        }
    }

    /// The rule behind `which`'s figure.
    pub fn rule(&self, which: Estimator) -> Option<Rule> {
        match which {
            Estimator::Paper => self.paper_rule,
            Estimator::Batches => self.batches_rule,
        }
    }

    /// Why `which` has no figure for the flow, where it had one and withheld it.
    pub fn withheld(&self, which: Estimator) -> Option<NoFigure> {
        match which {
            Estimator::Paper => self.paper_withheld,
            Estimator::Batches => self.batches_withheld,
        }
    }
}

#[cfg(test)]
mod tests {
    use pirate_common::{
        key::FlowKey,
        parse::IPPROTO_UDP,
        pirate::{
            config::MODES_COMPACT,
            flow::{FlowState, QUIC},
            grid,
        },
    };

    use super::*;
    use crate::pirate::{
        config::PirateConfig,
        flow::{FlowEpoch, Mode},
        report::{EpochReport, Scratch},
    };

    /// One request in flight at ~5.3 ms with a 3 % tail spread thinly over 5.6–8.6 ms (a slow
    /// path of the server, scheduling delays), through the datapath's modes with and without
    /// the span cap: the estimators read the same mean off both; the p99, inside the tail, only
    /// the capped modes can place.
    #[test]
    fn a_span_cap_places_the_tail_and_leaves_the_means_alone() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut uniform = move || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        let gaps: Vec<u32> = (0..2000)
            .map(|_| match uniform() {
                u if u < 0.03 => 5_600_000 + (uniform() * 3_000_000.0) as u32,
                _ => 5_200_000 + (-uniform().ln() * 100_000.0) as u32,
            })
            .collect();
        let mut sorted = gaps.clone();
        sorted.sort_unstable();
        let truth = sorted[(0.99 * sorted.len() as f64) as usize] as f64;
        let settings = PirateConfig::default().settings();
        let measure = |span: u32| {
            let eps = Epsilon { span, ..settings.epsilon };
            // A TCP flow, each gap acknowledging a response.
            let mut st = FlowState::<MODES_COMPACT>::new(1);
            gaps.iter().for_each(|&g| _ = st.modes.insert(g, true, eps, MODES_COMPACT as u32));
            st.acked_gaps = gaps.len() as u16;
            let flow = FlowEpoch::from_state(FlowKey { proto: IPPROTO_TCP, ..FlowKey::default() }, &st);
            let modes = flow.modes();
            let settings = Settings { epsilon: eps, ..settings };
            let (paper, batches) = settings.estimate(IPPROTO_TCP, &modes, true, true);
            let (paper, batches) = (paper.unwrap(), batches.unwrap());
            let report =
                EpochReport::new(1, vec![flow], Scratch::default(), &settings, Estimator::Batches, (false, false));
            let p99 = report.servers()[0].quantiles[2].estimate_ns;
            (modes.len(), paper.estimate_ns, batches.estimate_ns, p99)
        };
        let (alg2, capped) = (measure(0), measure(settings.epsilon.span));
        assert!(capped.0 > alg2.0, "the cap made no more modes: {alg2:?} {capped:?}");
        // Modes keep their means to within width·√(n/12)/65536 (random rounding): for Alg. 2's
        // one mode, 3.4 ms wide over 2000 gaps, 670 ns; twice that bounds the difference.
        let kept = 2.0 * 3_400_000.0 / 65_536.0 * (gaps.len() as f64 / 12.0).sqrt();
        assert!((capped.1 - alg2.1).abs() <= kept, "paper: {alg2:?} {capped:?}");
        assert!((capped.2 - alg2.2).abs() <= kept, "batches: {alg2:?} {capped:?}");
        let err = |p99: f64| (p99 - truth).abs() / truth;
        eprintln!(
            "modes {} → {}; p99 truth {truth}, Alg. 2 modes {:.0} ({:.1} %), capped {:.0} ({:.1} %)",
            alg2.0,
            capped.0,
            alg2.3,
            100.0 * err(alg2.3),
            capped.3,
            100.0 * err(capped.3)
        );
        assert!(err(capped.3) < 0.05, "capped p99 {} vs {truth}", capped.3);
        assert!(err(capped.3) < err(alg2.3), "p99: Alg. 2 {} capped {} truth {truth}", alg2.3, capped.3);
    }

    /// A TCP flow's epoch of `gaps` (gap in ns, how many), with its handshake's round trip (0:
    /// not seen) and its gaps across which the acknowledgement number advanced.
    fn tcp_epoch(gaps: &[(u32, usize)], rtt_ns: u32, acked_gaps: u16) -> FlowEpoch {
        let eps = PirateConfig::default().settings().epsilon;
        let mut st = FlowState::<MODES_COMPACT>::new(1);
        for &(gap, n) in gaps {
            (0..n).for_each(|_| _ = st.modes.insert(gap, true, eps, MODES_COMPACT as u32));
        }
        st.handshake_rtt = grid::encode(rtt_ns);
        st.acked_gaps = acked_gaps;
        FlowEpoch::from_state(FlowKey { proto: IPPROTO_TCP, ..FlowKey::default() }, &st)
    }

    /// The batches and the time kept when every mode from `first` on ends batches.
    fn ending_from(modes: &[Mode], first: usize) -> (u64, u64) {
        (modes[first..].iter().map(|m| m.count as u64).sum(), modes.iter().map(|m| m.sum_ns).sum())
    }

    /// Modes from a drained dump: (min, max, count, sum), every gap marked.
    fn as_drained(dump: &[(u32, u32, u32, u64)]) -> Vec<Mode> {
        dump.iter().map(|&(min_ns, max_ns, count, sum_ns)| Mode::all_marked(min_ns, max_ns, count, sum_ns)).collect()
    }

    /// Batches 2.6 ms apart on a connection whose handshake took 5.1 ms: interleaved streams,
    /// withheld by both estimators, with the reason; at 3.9 ms (above 0.8 of it less 0.3 ms),
    /// or with no handshake seen, or with the floor off, the figure stands.
    #[test]
    fn a_figure_below_the_handshakes_round_trip_is_withheld() {
        let settings = PirateConfig::default().settings();
        assert_eq!(settings.round_trip_floor, 0.8);
        // One acknowledgement a batch: one request in flight, as far as acknowledgements tell.
        let flow = |gap: u32, rtt: u32| tcp_epoch(&[(gap, 200)], rtt, 200);
        let figures = |f: &FlowEpoch, s: &Settings| {
            let e = s.flow(f, &f.modes(), true, true);
            [e.paper.map(|e| e.estimate_ns.round()), e.batches.map(|e| e.estimate_ns.round())]
        };
        let interleaved = flow(2_600_000, 5_100_000);
        let e = settings.flow(&interleaved, &interleaved.modes(), true, true);
        assert_eq!((e.paper, e.batches), (None, None));
        assert_eq!([e.withheld(Estimator::Paper), e.withheld(Estimator::Batches)], [Some(NoFigure::BelowRoundTrip); 2]);
        let off = Settings { round_trip_floor: 0.0, ..settings };
        assert!(figures(&interleaved, &off).iter().all(|f| (f.unwrap() - 2.6e6).abs() < 3e3));
        // 9 % of the batch ends short, the mean above the floor: one request in flight, the floor
        // is the break. Where each gap acknowledges data, the 2.5 ms gaps may be halves of the
        // cycles of streams out of step for a part of the epoch, or waits of their own (the
        // handshake met the path's slow side): 10 % apart, ambiguous. 3 % short is noise either
        // way.
        let mixed = |short: usize, acked: u16| {
            let f = tcp_epoch(&[(5_200_000, 1000), (2_500_000, short)], 5_100_000, acked);
            let e = settings.flow(&f, &f.modes(), false, true);
            (e.batches.map(|e| e.batches), e.batches_withheld)
        };
        assert_eq!([mixed(100, 1000), mixed(100, 1100)], [(Some(1000), None), (None, Some(NoFigure::Ambiguous))]);
        assert_eq!([mixed(30, 1000), mixed(30, 1030)], [(Some(1030), None); 2]);
        // A handshake delayed by reordering (5.8 ms): a third of the batch ends in a mode of
        // 4.25–4.45 ms, whose mean lies below the floor (4.34 ms) and whose top does not.
        let late = tcp_epoch(&[(4_250_000, 150), (4_450_000, 50), (5_200_000, 400)], 5_800_000, 600);
        assert_eq!(settings.flow(&late, &late.modes(), false, true).batches_withheld, None);
        for f in [flow(3_900_000, 5_100_000), flow(2_600_000, 0)] {
            let e = settings.flow(&f, &f.modes(), true, true);
            assert_eq!([e.paper_withheld, e.batches_withheld], [None, None]);
            assert_eq!(figures(&f, &settings), figures(&f, &off));
        }
    }

    /// Eight streams out of step at a round trip of 50 µs (h2load at 5 ms of service): the
    /// gaps spread from µs to the latency, nearly every one acknowledging new data. The paper's
    /// mode sum takes nearly all of them for batch ends (as many as the acknowledged gaps: on
    /// its own count, one request in flight) and read −58 … −74 %; the batches estimator's
    /// count shows the streams, and both figures are withheld.
    #[test]
    fn the_papers_figure_is_withheld_where_the_batches_show_interleaved_streams() {
        let settings = PirateConfig::default().settings();
        // h2load's flow of 3 531 packets as drained ("h2c 1 conn × 8 streams, 0 ms + 5 ms
        // service"; the clients' mean 5.39 ms): the paper's mode sum read 1.42 ms.
        let modes = as_drained(&[
            (11_156, 259_968, 1160, 118_197_485),
            (261_696, 817_920, 521, 270_291_620),
            (820_224, 1_352_704, 410, 437_668_630),
            (1_353_216, 2_039_808, 481, 799_695_395),
            (2_040_832, 3_090_432, 441, 1_103_319_475),
            (3_091_456, 3_885_056, 181, 628_130_563),
            (3_888_128, 4_853_760, 129, 554_059_247),
            (4_868_096, 5_539_840, 204, 1_071_493_746),
            (5_621_760, 5_638_144, 2, 11_259_989),
            (6_469_632, 6_469_632, 1, 6_469_632),
        ]);
        let f = tcp_epoch(&[], 50_576, 3499);
        let e = settings.flow(&f, &modes, true, true);
        assert_eq!((e.paper, e.batches), (None, None), "{e:?}");
        assert_eq!([e.paper_withheld, e.batches_withheld], [Some(NoFigure::Interleaved); 2]);
        // The paper's alone (its estimator configured, no JSON): withheld the same.
        let alone = settings.flow(&f, &modes, true, false);
        assert_eq!((alone.paper, alone.paper_withheld, alone.batches), (None, Some(NoFigure::Interleaved), None));
    }

    /// One web-like connection under 1 % loss and 25 % reordering, as replay drained it (its idle
    /// gaps left out), whose handshake a held ACK stretched to 5.15 ms: the break falls below 78
    /// gaps of ~1.07 ms (a request held behind the one before), 11 % of the batch ends wholly
    /// below the floor (3.82 ms). Its 613 acknowledged gaps say one request in flight, so the
    /// floor is the break and the figure stands; from the paper's estimator it is withheld.
    #[test]
    fn one_request_in_flight_breaks_at_the_round_trip_floor() {
        let drained: [(u32, u32, u32, u64); 10] = [
            (3_186, 226_368, 245, 11_201_577),
            (226_560, 226_560, 1, 226_560),
            (236_928, 461_952, 14, 4_672_244),
            (973_824, 1_353_728, 78, 83_237_102),
            (1_430_016, 4_154_368, 18, 64_247_548),
            (4_159_488, 4_970_496, 145, 650_244_311),
            (4_974_592, 5_701_632, 244, 1_307_715_605),
            (5_703_680, 6_623_232, 147, 887_990_704),
            (6_633_472, 8_978_432, 59, 425_838_468),
            (9_486_336, 19_685_376, 4, 64_471_317),
        ];
        let modes = as_drained(&drained);
        let settings = PirateConfig::default().settings();
        let found = settings.estimate(IPPROTO_TCP, &modes, false, true).1.unwrap();
        assert!(found.ends.has(3), "the break no longer falls below the held requests: {found:?}");
        let flow = |acked: u16| {
            let f = tcp_epoch(&[], 5_150_720, acked);
            settings.flow(&f, &modes, true, true)
        };
        let single = flow(613);
        let e = single.batches.expect("one request in flight withheld");
        assert_eq!(((e.batches, e.kept_ns), single.batches_withheld), (ending_from(&modes, 4), None));
        assert_eq!(single.paper_withheld, Some(NoFigure::BelowRoundTrip));
        // With a stream's worth more acknowledgements, counted at half the latency, the batches
        // take the 18 gaps of 1.43–4.15 ms, whose mean is above half of 5.67 ms, as the floor
        // counted them.
        let f = tcp_epoch(&[], 5_150_720, 700);
        let multiplexed = settings.half_latency_count(&modes, settings.floor_ns(&f)).expect("no count");
        assert_eq!((multiplexed.batches, multiplexed.kept_ns), ending_from(&modes, 4));
        // One wait per acknowledged gap reads 5.00 ms against that count's 5.67: ambiguous.
        assert_eq!(flow(700).batches_withheld, Some(NoFigure::Ambiguous));
    }

    /// A figure needs its flow's evidence. One batch is no figure, two are. On TCP, batch ends
    /// that outnumber the gaps that acknowledged new data (by more than 3 %) are not all waits
    /// for responses: withheld. A UDP flow, with no acknowledgements to count, has none (QUIC
    /// says so as its own reason); nor does a TCP client that may multiplex. Batches longer
    /// inside than a client paces are withheld. A figure says what it rests on.
    #[test]
    fn a_figure_needs_evidence_that_its_batches_are_waits() {
        let settings = PirateConfig::default().settings();
        assert_eq!(settings.min_batches, 2);
        let batches = |f: &FlowEpoch| {
            let e = settings.flow(f, &f.modes(), false, true);
            (e.batches.map(|e| e.batches), e.batches_withheld, e.batches_rule)
        };
        let pacing = (50_000, 300);
        let one = tcp_epoch(&[(50_000, 3), (5_000_000, 1)], 0, 1);
        assert_eq!(batches(&one), (None, Some(NoFigure::FewBatches), None));
        let two = tcp_epoch(&[(50_000, 6), (5_000_000, 2)], 0, 2);
        assert_eq!(batches(&two), (Some(2), None, Some(Rule::Break)));
        let answered = |acked: u16| batches(&tcp_epoch(&[pacing, (5_000_000, 100)], 0, acked));
        assert_eq!(answered(98), (Some(100), None, Some(Rule::Break)));
        assert_eq!(answered(96), (None, Some(NoFigure::Unanswered), None));
        let udp = |status: u8| {
            let eps = settings.epsilon;
            let mut st = FlowState::<MODES_COMPACT>::new(1);
            (0..300).for_each(|_| _ = st.modes.insert(50_000, true, eps, MODES_COMPACT as u32));
            (0..100).for_each(|_| _ = st.modes.insert(5_000_000, true, eps, MODES_COMPACT as u32));
            st.status |= status;
            batches(&FlowEpoch::from_state(FlowKey { proto: IPPROTO_UDP, ..FlowKey::default() }, &st))
        };
        assert_eq!(udp(0), (None, Some(NoFigure::Udp), None));
        assert_eq!(udp(QUIC), (None, Some(NoFigure::Quic), None));
        // A client that may multiplex, one acknowledgement a batch or more.
        for acked in [100, 300] {
            let mut f = tcp_epoch(&[pacing, (5_000_000, 100)], 0, acked);
            f.multiplexing = true;
            assert_eq!(batches(&f), (None, Some(NoFigure::Multiplexing), None));
        }
        // Two 1.5 ms gaps inside each batch: 3 ms a batch that is neither pacing nor a wait.
        let slow = tcp_epoch(&[(1_500_000, 200), (6_000_000, 100)], 0, 100);
        assert_eq!(batches(&slow), (None, Some(NoFigure::LongBatches), None));
        let single = Rule::Break.streams();
        assert_eq!((single.in_flight, single.lower, single.upper), (Some(1), 1, Some(1)));
        let multiplexed = Rule::HalfLatency.streams();
        assert_eq!((multiplexed.in_flight, multiplexed.lower, multiplexed.upper), (None, 2, None));
    }

    /// Requests every 100 µs, 1 ms and 4 ms apart: a break below the 4 ms gaps, which hold 75 %
    /// of the time. With an acknowledgement advancing across every gap (streams multiplexed and
    /// out of step), the 1 ms gaps are no halves of 5.3 ms cycles but thirds or less: 19 % of the
    /// time that could hold uncounted cycles, and the figure is withheld. With one
    /// acknowledgement a batch (a client pipelining) it stands. With the share allowed, the count
    /// stands, but the flow's figure not: every gap may be a wait of its own (a server answering
    /// in 0.1, 1 and 4 ms, one request at a time: 1.06 ms), ambiguous.
    #[test]
    fn a_multiplexed_flow_whose_short_gaps_hold_much_of_its_time_has_no_figure() {
        let settings = PirateConfig::default().settings();
        let with_acks =
            |acked: u16, rtt: u32| tcp_epoch(&[(100_000, 300), (1_000_000, 100), (4_000_000, 100)], rtt, acked);
        let batches = |f: &FlowEpoch, s: &Settings| s.flow(f, &f.modes(), false, true);
        let stepped = batches(&with_acks(100, 2_000_000), &settings);
        assert_eq!((stepped.batches.map(|e| e.batches), stepped.batches_withheld), (Some(100), None));
        let interleaved = batches(&with_acks(500, 2_000_000), &settings);
        assert_eq!((interleaved.batches, interleaved.batches_withheld), (None, Some(NoFigure::Interleaved)));
        let off = Settings { multiplexed_short_share: 1.0, ..settings };
        let f = with_acks(500, 2_000_000);
        assert_eq!(off.half_latency_count(&f.modes(), off.floor_ns(&f)).ok(), stepped.batches);
        assert_eq!(batches(&f, &off).batches_withheld, Some(NoFigure::Ambiguous));
    }

    /// One request at a time to a server that answers 70 % of them in 1.15 ms and the rest in
    /// 11.5 ms (cache hits and misses), every gap acknowledging its response: the break reads
    /// the short waits as pacing, 300 batches of 14.2 ms against 4.26 ms, and the acknowledged
    /// gaps, 3.3 a batch, fit streams multiplexed on the connection just as well. Withheld, even
    /// where the handshake took 2.3 ms: it may have met the path's slow side (as it does on the
    /// testbed, whose return path delays the SYN/ACK too).
    #[test]
    fn waits_the_break_missed_are_not_taken_for_streams() {
        let settings = PirateConfig::default().settings();
        let flow = |rtt: u32| {
            let f = tcp_epoch(&[(1_150_000, 700), (11_500_000, 300)], rtt, 1000);
            let e = settings.flow(&f, &f.modes(), true, true);
            (e.batches_withheld, e.batches_rule, e.paper_withheld)
        };
        let ambiguous = Some(NoFigure::Ambiguous);
        for rtt in [1_150_000, 0, 2_300_000] {
            assert_eq!(flow(rtt), (ambiguous, None, ambiguous), "{rtt}");
        }
    }

    /// Streams in step for 900 cycles of 15 ms (bursts 30 µs apart), and cycles split between
    /// two groups (5 + 10 ms) or three (5 + 5 + 5 ms). Split in two, a cycle holds one gap of
    /// half its latency or more and counts; split in three, none, and the cycle goes uncounted,
    /// its time in gaps below half: 10 % of it for 100 such cycles, above the short share
    /// allowed, and the figure that share too high is withheld.
    #[test]
    fn a_cycle_split_three_ways_is_bounded_by_the_short_share() {
        let settings = PirateConfig::default().settings();
        let epoch = |split: &[(u32, usize)]| {
            let mut gaps = vec![(30_000, 16 * 1000), (15_000_000, 900)];
            gaps.extend(split);
            let f = tcp_epoch(&gaps, 5_100_000, 4000);
            let e = |s: &Settings| s.half_latency_count(&f.modes(), s.floor_ns(&f));
            (e(&settings), e(&Settings { multiplexed_short_share: 1.0, ..settings }))
        };
        let (two, _) = epoch(&[(5_000_000, 50), (10_000_000, 50)]);
        let two = two.expect("two groups withheld");
        assert_eq!(two.batches, 950);
        assert!((two.estimate_ns / 15.0e6 - 1.0).abs() < 0.04, "{two:?}");
        let (three, allowed) = epoch(&[(5_000_000, 300)]);
        assert_eq!(three.err(), Some(NoFigure::Interleaved));
        let allowed = allowed.unwrap();
        let short = 300.0 * 5e6 / allowed.kept_ns as f64;
        assert_eq!(allowed.batches, 900);
        assert!(allowed.estimate_ns / 15.0e6 - 1.0 <= short / (1.0 - short) + 0.04, "{allowed:?}");
    }

    /// Two groups of streams a third of a cycle apart (5 and 10 ms of 15), or near its middle (7
    /// and 8 ms): the largest count at half a latency takes the longer gaps alone, not both,
    /// which would read half the latency. Where the modes leave no such count near the latency
    /// (h2c with 16 streams at 5 + 10 ms, as replay drained it: the client's mean 15.5 ms), the
    /// largest reads 9.7 ms from gaps of a third and two thirds of it, 308 of its 513 batch ends
    /// below 0.8 of it and only 149 short gaps to pair them with: withheld.
    #[test]
    fn a_cycle_split_in_two_is_not_counted_twice() {
        let allowed = Settings { multiplexed_short_share: 1.0, ..PirateConfig::default().settings() };
        let flow = |a: u32, b: u32| tcp_epoch(&[(30_000, 8000), (a, 500), (b, 500)], 5_100_000, 4000);
        for (a, b) in [(5_000_000, 10_000_000), (7_000_000, 8_000_000)] {
            let f = flow(a, b);
            assert_eq!(allowed.half_latency_count(&f.modes(), allowed.floor_ns(&f)).map(|e| e.batches), Ok(500));
        }
        let modes = as_drained(&[
            (8_552, 519_040, 1347, 84_305_191),
            (522_496, 1_476_608, 85, 82_739_445),
            (1_480_192, 1_522_176, 3, 4_513_899),
            (1_531_904, 3_757_056, 61, 149_242_698),
            (3_868_672, 5_748_736, 174, 877_451_256),
            (5_771_264, 6_318_080, 29, 176_172_883),
            (6_326_272, 9_736_192, 105, 822_005_389),
            (9_920_512, 12_836_864, 66, 703_578_497),
            (13_017_088, 15_319_040, 83, 1_237_490_031),
            (15_323_136, 15_589_376, 56, 862_714_338),
        ]);
        let e = allowed.flow(&tcp_epoch(&[], 5_124_096, 1982), &modes, false, true);
        assert_eq!((e.batches, e.batches_withheld), (None, Some(NoFigure::Interleaved)));
        let off = batches::half_latency(&modes, &allowed.batches).unwrap();
        assert_eq!((off.estimate.batches, (off.estimate.estimate_ns / 1e5).round()), (513, 97.0));
    }

    /// h2c with 16 streams on one connection at 5 + 10 ms, live (the client's mean 15.6 ms): its
    /// streams in three groups about a third of a cycle apart, so half the latency finds 765
    /// batches of 6.5 ms, with few short gaps and most batch ends paired. But 19 % of its time
    /// lies in gaps of 9.7–15.8 ms, 1.5–2.4 times that: waits no response that fast leaves, and
    /// the figure is withheld.
    #[test]
    fn gaps_much_longer_than_the_figure_withhold_it() {
        let modes = as_drained(&[
            (9_640, 9_640, 1, 9_640),
            (10_052, 301_696, 508, 40_558_336),
            (304_512, 1_337_344, 77, 52_641_882),
            (1_338_368, 2_825_216, 67, 135_876_027),
            (2_874_368, 5_005_312, 121, 494_901_528),
            (5_007_360, 6_881_280, 467, 2_490_597_841),
            (6_914_048, 9_703_424, 100, 838_841_353),
            (9_740_288, 11_735_040, 43, 450_233_429),
            (11_804_672, 13_750_272, 10, 129_443_163),
            (14_368_768, 15_785_984, 24, 367_579_534),
        ]);
        let settings = PirateConfig::default().settings();
        let half = batches::half_latency(&modes, &settings.batches).unwrap();
        assert_eq!((half.estimate.batches, (half.estimate.estimate_ns / 1e5).round()), (765, 65.0));
        assert!(half.short <= settings.multiplexed_short_share && half.unpaired <= UNPAIRED_SHARE, "{half:?}");
        assert!(half.long > 0.15, "{half:?}");
        let e = settings.flow(&tcp_epoch(&[], 5_107_712, 1390), &modes, false, true);
        assert_eq!((e.batches, e.batches_withheld), (None, Some(NoFigure::Interleaved)));
    }

    /// h2c with 16 streams on one connection at 5 ms, as the datapath drained it live (one run
    /// of `cargo xtask bench accuracy`): 873 gaps of 5.0–5.5 ms in step, and 111 of 0.2–4.7
    /// ms where groups of streams drifted apart. A break above 4.7 ms left those cycles
    /// uncounted and read 5.68 ms, 6.9 % above the client's own mean (5.309 ms); counted at
    /// half the latency, 1 % of the time is left in short gaps. Every one of its 4 304
    /// acknowledged gaps a wait of one request in flight reads 1.16 ms: ambiguous (and its
    /// HTTP/2 preface withholds it first).
    #[test]
    fn streams_drifting_apart_are_counted_at_half_their_latency() {
        let modes = as_drained(&[
            (7_518, 184_192, 3365, 104_057_038),
            (226_880, 861_952, 22, 10_368_433),
            (897_024, 1_546_752, 18, 21_676_167),
            (1_643_520, 2_306_048, 15, 30_449_272),
            (2_419_712, 3_264_512, 17, 49_078_961),
            (3_317_760, 4_683_776, 39, 163_107_138),
            (4_974_592, 5_466_112, 873, 4_574_829_951),
            (5_472_256, 5_949_440, 7, 39_120_478),
            (7_792_640, 7_792_640, 1, 7_792_640),
        ]);
        let settings = PirateConfig::default().settings();
        let (client, rtt) = (5_309e3, 5_081_088);
        let found = settings.estimate(IPPROTO_TCP, &modes, false, true).1.unwrap();
        assert!(found.estimate_ns / client - 1.0 > 0.06, "{found:?}");
        let f = tcp_epoch(&[], rtt, 4304);
        let e = settings.half_latency_count(&modes, settings.floor_ns(&f)).unwrap();
        assert_eq!(e.batches, 937);
        assert!((e.estimate_ns / client - 1.0).abs() < 0.01, "{e:?}");
        assert_eq!(settings.flow(&f, &modes, false, true).batches_withheld, Some(NoFigure::Ambiguous));
    }

    /// gRPC with 16 calls in flight on one connection (5 ms round trip, 10 ms service), as
    /// replay drained it: bursts of 16 requests, and a break that leaves the 23 gaps of 8.9–13.7
    /// ms (whole cycles of the streams) and 13 of 4.4–7.9 ms inside batches: 249 batches, 20.1
    /// ms against the client's 18.1. With 1.26 acknowledged gaps a batch it is multiplexed, and
    /// counted at half its latency the 23 are batches too: 18.4 ms. But a client with one burst
    /// in flight at a time, whose server answered a tenth of its bursts in 4–14 ms, sends the
    /// same packets, and reads 16.0 ms: no figure. Without those long gaps, the count reads
    /// 18.8 ms and one wait per acknowledged gap 14.9: no figure either.
    #[test]
    fn a_multiplexed_flow_counts_the_cycles_a_break_left_inside_batches() {
        let drained = |long: bool| {
            let mut modes = vec![
                (11_004, 228_480, 4016, 114_064_674),
                (239_808, 935_424, 30, 14_306_652),
                (997_632, 2_054_656, 9, 13_391_561),
                (2_513_920, 2_513_920, 1, 2_513_920),
                (2_515_968, 4_253_696, 14, 51_159_611),
            ];
            if long {
                modes.extend([
                    (4_419_584, 4_419_584, 1, 4_419_584),
                    (4_896_768, 7_911_424, 12, 74_337_005),
                    (8_880_128, 13_672_448, 23, 265_594_393),
                ]);
            }
            modes.extend([(14_372_864, 17_784_832, 67, 1_158_003_020), (17_793_024, 19_415_040, 182, 3_318_361_869)]);
            as_drained(&modes)
        };
        let settings = PirateConfig::default().settings();
        let flow = |long: bool, rtt: u32, acked: u16| {
            let modes = drained(long);
            settings.flow(&tcp_epoch(&[], rtt, acked), &modes, false, true)
        };
        let figure = |e: Estimates| e.batches.map(|e| (e.batches, (e.estimate_ns / 1e5).round() / 10.0));
        for rtt in [5_122_048, 0] {
            assert_eq!(flow(true, rtt, 313).batches_withheld, Some(NoFigure::Ambiguous));
        }
        // With the readings allowed 20 % apart, counted at half its latency.
        let off = Settings { multiplexed_short_share: 0.2, ..settings };
        let half = off.flow(&tcp_epoch(&[], 5_122_048, 313), &drained(true), false, true);
        assert_eq!(figure(half), Some((272, 18.4)));
        // With one acknowledgement a batch, one request in flight would spend 2.2 ms inside
        // each batch, more than a client paces: no figure.
        assert_eq!(flow(true, 5_122_048, 249).batches_withheld, Some(NoFigure::LongBatches));
        let f = tcp_epoch(&[], 5_122_048, 313);
        let count = settings.half_latency_count(&drained(false), settings.floor_ns(&f)).unwrap();
        assert_eq!((count.batches, (count.estimate_ns / 1e5).round() / 10.0), (249, 18.8));
        assert_eq!(flow(false, 5_122_048, 313).batches_withheld, Some(NoFigure::Ambiguous));
    }

    /// A 5 s epoch of one web-like connection under 1 % loss and 25 % reordering, as drained
    /// (min, max, count, sum; its 6 idle gaps left out): the span-capped modes fill every
    /// interval, so their chains join into one and show no break, while the narrow modes show
    /// it below 4.17 ms.
    #[test]
    fn the_narrow_modes_give_the_break_when_the_chains_join_into_one() {
        let drained: [(u32, u32, u32, u64); 9] = [
            (6_609, 329_158, 290, 15_356_160),
            (358_442, 1_089_026, 76, 75_671_520),
            (1_095_056, 4_163_191, 17, 39_985_248),
            (4_165_744, 5_037_259, 188, 845_041_456),
            (5_055_135, 5_601_787, 252, 1_341_302_880),
            (5_613_063, 5_618_672, 3, 16_846_992),
            (5_621_627, 6_540_761, 137, 818_940_032),
            (6_552_429, 9_297_905, 84, 600_620_384),
            (9_478_423, 19_245_800, 10, 148_576_064),
        ];
        let modes = as_drained(&drained);
        let settings = PirateConfig::default().settings();
        assert_eq!(Chains::new(&modes, settings.epsilon).modes.len(), 1, "one chain");
        let est = settings.estimate(IPPROTO_UDP, &modes, true, true).1.unwrap();
        assert_eq!((est.batches, est.kept_ns), ending_from(&modes, 3), "{est:?}");
    }
}
