//! From flows to servers: each server's batch-weighted mean and quantiles from its flows'
//! estimates. The flows' spans (for the quantiles) are laid out server by server in one vector
//! kept from epoch to epoch, written in a pass over the flows in their own order: with a million
//! flows, gathering them per server any other way costs a cache miss or a reallocation per flow.

use std::{collections::HashMap, mem::MaybeUninit, net::SocketAddr, ops::Range};

use foldhash::fast::RandomState;
use pirate_common::pirate::modes::Epsilon;

use super::{
    quantile::{self, Quantile, QUANTILES},
    span::Span,
    Estimates, Estimator,
};
use crate::pirate::flow::{FlowEpoch, Mode};

#[derive(Clone, Debug, PartialEq)]
pub struct ServerEstimate {
    pub server: SocketAddr,
    /// Batch-weighted mean over the server's flows: Σ kept / Σ batches.
    pub estimate_ns: f64,
    pub flows: usize,
    pub batches: u64,
    /// Response-latency quantiles (`QUANTILES`) over the server's batches.
    pub quantiles: Vec<Quantile>,
    /// Its batches at or below each of [`histogram_bounds_ns`]'s, as the quantiles read them,
    /// and last all of them (empty without histograms).
    pub at_or_below: Vec<f64>,
}

/// The estimators, in the order of the per-estimator arrays here.
const WHICH: [Estimator; 2] = [Estimator::Paper, Estimator::Batches];

/// One server's sums over some of its flows' estimates by one estimator.
#[derive(Clone, Copy, Default)]
struct Sums {
    kept_ns: u64,
    batches: u64,
    flows: usize,
    spans: usize,
}

impl Sums {
    fn merge(&mut self, other: &Sums) {
        self.kept_ns += other.kept_ns;
        self.batches += other.batches;
        self.flows += other.flows;
        self.spans += other.spans;
    }
}

/// The bounds of the per-server latency histograms, ns: [`crate::histogram::latency_bounds`]'s
/// up to 2³ s (8 s, beyond any idle floor a response is told from).
pub fn histogram_bounds_ns() -> impl Iterator<Item = f64> {
    crate::histogram::latency_bounds(PIRATE_TOP_OCTAVE).map(|s| s * 1e9)
}

/// The top of the per-server histograms' bounds: 2³ s.
pub const PIRATE_TOP_OCTAVE: i32 = 3;

/// The servers of a consecutive share of the flows, numbered in the order they were met, with
/// their sums over the share's flows.
#[derive(Default)]
pub struct Numbering {
    /// Keyed by what traffic chooses: seeded per process, so that crafted addresses cannot
    /// pile into one bucket.
    numbers: HashMap<SocketAddr, u32, RandomState>,
    sums: Vec<[Sums; 2]>,
    /// Flows in the share.
    len: usize,
}

impl Numbering {
    /// Adds the share's next flow (its server, modes and estimates); its server's number.
    pub fn add(&mut self, server: SocketAddr, modes: &[Mode], est: &Estimates) -> u32 {
        let next = self.sums.len() as u32;
        let n = *self.numbers.entry(server).or_insert(next);
        if n == next {
            self.sums.push(Default::default());
        }
        for (sums, which) in self.sums[n as usize].iter_mut().zip(WHICH) {
            if let Some(e) = est.of(which) {
                sums.kept_ns += e.kept_ns;
                sums.batches += e.batches;
                sums.flows += 1;
                sums.spans += e.ends.of(modes).count();
            }
        }
        self.len += 1;
        n
    }
}

/// Each estimator's figures per server, in address order (a server appears for an estimator
/// with a figure for any of its flows), from the numberings of consecutive shares of `flows`
/// (in order) and each flow's server's number (`Estimates::server`), with histograms where
/// `histograms` (a few searches a span). The spans are written into `spans`' memory.
pub fn per_server(
    shares: &[Numbering],
    flows: &[FlowEpoch],
    estimates: &[Estimates],
    spans: &mut Vec<Span>,
    eps: Epsilon,
    histograms: bool,
) -> [Vec<ServerEstimate>; 2] {
    // Every share's servers, renumbered over all of them, and their sums merged.
    let mut numbers: HashMap<SocketAddr, usize, RandomState> = HashMap::default();
    let mut sums: Vec<[Sums; 2]> = Vec::new();
    // For each server, the shares with flows of it and its number in each.
    let mut members: Vec<Vec<(usize, u32)>> = Vec::new();
    for (t, share) in shares.iter().enumerate() {
        for (&server, &n) in &share.numbers {
            let next = sums.len();
            let g = *numbers.entry(server).or_insert(next);
            if g == next {
                sums.push(Default::default());
                members.push(Vec::new());
            }
            sums[g].iter_mut().zip(&share.sums[n as usize]).for_each(|(all, one)| all.merge(one));
            members[g].push((t, n));
        }
    }
    let mut servers: Vec<(SocketAddr, usize)> = numbers.into_iter().collect();
    servers.sort_unstable();

    // The spans: each estimator's, server after server, each server's share after share. Every
    // share's flows get the slices their servers' spans go to.
    let total: usize = sums.iter().flatten().map(|s| s.spans).sum();
    spans.clear();
    spans.reserve(total);
    let mut rest = &mut spans.spare_capacity_mut()[..total];
    let mut slots: Vec<Vec<[&mut [MaybeUninit<Span>]; 2]>> =
        shares.iter().map(|s| s.sums.iter().map(|_| [&mut [][..], &mut [][..]]).collect()).collect();
    let mut ranges: Vec<[Range<usize>; 2]> = vec![[0..0, 0..0]; servers.len()];
    let mut at = 0;
    for k in 0..WHICH.len() {
        for (j, &(_, g)) in servers.iter().enumerate() {
            let start = at;
            for &(t, n) in &members[g] {
                let len = shares[t].sums[n as usize][k].spans;
                let (slice, after) = std::mem::take(&mut rest).split_at_mut(len);
                slots[t][n as usize][k] = slice;
                rest = after;
                at += len;
            }
            ranges[j][k] = start..at;
        }
    }
    let mut first = 0;
    let parts = shares.iter().zip(slots).map(|(share, slots)| {
        let range = first..first + share.len;
        first = range.end;
        (&flows[range.clone()], &estimates[range], slots)
    });
    let filled = crate::parallel::on_every_cpu(parts, |(flows, estimates, mut slots)| {
        for (flow, est) in flows.iter().zip(estimates) {
            let found = WHICH.map(|which| est.of(which));
            if found.iter().all(Option::is_none) {
                continue;
            }
            let modes = flow.modes();
            for (slot, e) in slots[est.server as usize].iter_mut().zip(found) {
                for span in e.into_iter().flat_map(|e| quantile::spans(&modes, e, eps)) {
                    let (first, after) = std::mem::take(slot).split_first_mut().expect("a span counted");
                    first.write(span);
                    *slot = after;
                }
            }
        }
        slots.iter().flatten().all(|slot| slot.is_empty())
    });
    assert!(filled.into_iter().all(|f| f), "spans counted but not written");
    // SAFETY: the `total` slots were carved into the shares' slices, and each slice was filled
    // (asserted above).
    unsafe { spans.set_len(total) };

    let spans = &spans[..];
    let bounds: Option<Vec<f64>> = histograms.then(|| histogram_bounds_ns().collect());
    let listed: Vec<_> = servers.into_iter().zip(ranges).collect();
    let both = crate::parallel::map(&listed, |((server, g), ranges)| {
        std::array::from_fn::<_, 2, _>(|k| {
            let s = &sums[*g][k];
            (s.flows > 0).then(|| ServerEstimate {
                server: *server,
                estimate_ns: s.kept_ns as f64 / s.batches as f64,
                flows: s.flows,
                batches: s.batches,
                quantiles: quantile::quantiles(&spans[ranges[k].clone()], &QUANTILES),
                at_or_below: bounds
                    .as_ref()
                    .map_or_else(Vec::new, |b| quantile::at_or_below(&spans[ranges[k].clone()], b)),
            })
        })
    });
    let mut out = [Vec::new(), Vec::new()];
    for pair in both {
        out.iter_mut().zip(pair).for_each(|(list, s)| list.extend(s));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use pirate_common::{
        key::{FlowKey, FAMILY_V4},
        parse::IPPROTO_UDP,
        pirate::{config::MODES_COMPACT, flow::FlowState},
    };

    use super::{super::FlowEstimate, *};
    use crate::pirate::config::PirateConfig;

    /// Flows of 37 servers in three shares, through the numberings and the laid-out spans, give
    /// each server what its flows give gathered one server at a time in the flows' order.
    #[test]
    fn shares_laid_out_by_server_give_each_server_its_own_flows() {
        let settings = PirateConfig::default().settings();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        let flows: Vec<FlowEpoch> = (0..600u32)
            .map(|i| {
                let mut st = FlowState::<MODES_COMPACT>::new(1);
                let service = 1_000_000 + next(8) as u32 * 700_000;
                for _ in 0..20 + next(40) {
                    let gap = if next(3) == 0 { 20_000 + next(30_000) as u32 } else { service + next(300_000) as u32 };
                    st.modes.insert(gap, false, settings.epsilon, MODES_COMPACT as u32);
                }
                let mut key =
                    FlowKey { sport: i as u16, dport: 80, proto: IPPROTO_UDP, family: FAMILY_V4, ..FlowKey::default() };
                key.dst[..4].copy_from_slice(&[10, 0, 0, next(37) as u8]);
                FlowEpoch::from_state(key, &st)
            })
            .collect();
        let estimates: Vec<Estimates> = flows
            .iter()
            .map(|f| {
                let (paper, batches) = settings.estimate(IPPROTO_UDP, &f.modes(), true, true);
                Estimates { paper, batches, ..Estimates::default() }
            })
            .collect();
        let (mut shares, mut numbered) = (Vec::new(), Vec::new());
        for part in [0..150, 150..420, 420..600] {
            let mut share = Numbering::default();
            for i in part {
                let est = estimates[i];
                numbered.push(Estimates { server: share.add(flows[i].key.server(), &flows[i].modes(), &est), ..est });
            }
            shares.push(share);
        }
        let got = per_server(&shares, &flows, &numbered, &mut Vec::new(), settings.epsilon, true);
        let bounds: Vec<f64> = histogram_bounds_ns().collect();

        let mut by_server: BTreeMap<SocketAddr, Vec<usize>> = BTreeMap::new();
        (0..flows.len()).for_each(|i| by_server.entry(flows[i].key.server()).or_default().push(i));
        for (k, which) in WHICH.into_iter().enumerate() {
            let want: Vec<ServerEstimate> = by_server
                .iter()
                .filter_map(|(&at, members)| {
                    let found: Vec<(usize, &FlowEstimate)> =
                        members.iter().filter_map(|&i| Some((i, estimates[i].of(which)?))).collect();
                    let spans: Vec<Span> = found
                        .iter()
                        .flat_map(|&(i, e)| quantile::spans(&flows[i].modes(), e, settings.epsilon).collect::<Vec<_>>())
                        .collect();
                    let (kept, batches) = found.iter().fold((0, 0), |(k, b), (_, e)| (k + e.kept_ns, b + e.batches));
                    (!found.is_empty()).then(|| ServerEstimate {
                        server: at,
                        estimate_ns: kept as f64 / batches as f64,
                        flows: found.len(),
                        batches,
                        quantiles: quantile::quantiles(&spans, &QUANTILES),
                        at_or_below: quantile::at_or_below(&spans, &bounds),
                    })
                })
                .collect();
            assert!(want.len() > 30, "{which:?}: {} servers", want.len());
            assert_eq!(got[k], want, "{which:?}");
        }
    }
}
