//! Research beside the estimators (issue 43): the per-stream cycle of a connection's requests,
//! read off the vantage point's capture. Closed-loop streams each send their next request when
//! their response arrives, so the requests repeat at the latency whatever the streams' phases:
//! the requests' conditional intensity (requests τ after one, over their rate) peaks at L, 2L,
//! 3L… above the flat background the other streams make. pirated's datapath keeps gap modes,
//! not request times, so this is the bench's, to see where the signal holds before it moves in.
//!
//! What the timing cannot tell, the cycle withholds: requests that come in groups (streams in
//! step, groups of them out of step, a server that answers one at a time) repeat at the cycle's
//! fractions as well as at the cycle, so only where the other streams' requests fall anywhere
//! (the intensity between the harmonics near the rate's) is the one peak a stream's own cycle.

use std::net::SocketAddr;

use pirate_common::{
    ctx::PacketCtx,
    key::{IPPROTO_TCP, IPPROTO_UDP},
    parse::{parse, TCP_SYN},
};

/// Requests closer than this are one event: the segments of one burst.
const MERGE_NS: u64 = 200_000;
/// The lag histogram's bins, and its range.
const BIN_NS: u64 = 50_000;
const MAX_LAG_NS: u64 = 150_000_000;
/// The shortest cycle looked for, and the share of the handshake's round trip below which none
/// is (a response takes a round trip).
const MIN_CYCLE_NS: u64 = 500_000;
const ROUND_TRIP_SHARE: f64 = 0.8;
/// Bins either side the intensity is smoothed over.
const SMOOTH: usize = 4;
/// UDP payloads at least this long are requests: QUIC's acknowledgement-only packets are shorter.
const MIN_UDP_REQUEST: usize = 60;
/// Harmonics the cycle's score sums (L, 2L, 3L).
const HARMONICS: usize = 3;
/// Fewest request events to look for a cycle in.
const MIN_EVENTS: usize = 100;
/// The least intensity between a cycle's harmonics (over 0.25–0.75 of it, the median) for the
/// other streams' requests to count as falling anywhere: half the rate's, midway between a
/// comb (0: every request in step with others) and streams out of step (1).
const MIN_BACKGROUND: f64 = 0.5;
/// Standard errors the cycle's peak must stand above that background by.
const MIN_SIGMA: f64 = 5.0;

/// A connection's cycle (ns) and, where the timing cannot support it, why.
pub struct Cycle {
    pub ns: f64,
    pub withheld: Option<&'static str>,
}

/// A client→server packet of the capture: when, from which client, and what it carries.
struct Packet {
    at_ns: u64,
    client: SocketAddr,
    kind: Kind,
}

enum Kind {
    Syn,
    /// TCP without SYN: its sequence number and payload length.
    Tcp {
        seq: u32,
        len: u32,
    },
    Udp {
        len: usize,
    },
}

/// The busiest client connection's cycle to `server` in `frames` (Ethernet, ns), if its
/// requests show one.
pub fn of(frames: &[(u64, Vec<u8>)], server: SocketAddr) -> Option<Cycle> {
    let mut ctx = PacketCtx::default();
    let packets: Vec<Packet> = frames.iter().filter_map(|(at, f)| to(server, *at, f, &mut ctx)).collect();
    let mut clients: Vec<SocketAddr> = packets.iter().map(|p| p.client).collect();
    clients.sort();
    clients.dedup();
    let busiest = clients.into_iter().max_by_key(|c| packets.iter().filter(|p| p.client == *c).count())?;
    let mine: Vec<&Packet> = packets.iter().filter(|p| p.client == busiest).collect();
    cycle(&events(&mine), round_trip(&mine))
}

/// The client's SYN to its first packet after it (its ACK of the handshake), ns.
fn round_trip(packets: &[&Packet]) -> u64 {
    let syn = packets.iter().position(|p| matches!(p.kind, Kind::Syn));
    syn.and_then(|i| Some(packets.get(i + 1)?.at_ns - packets[i].at_ns)).unwrap_or(0)
}

/// Request events: TCP segments with data beyond the highest the client sent so far, UDP
/// datagrams of a request's size; merged within `MERGE_NS`.
fn events(packets: &[&Packet]) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    let mut highest: Option<u32> = None;
    for p in packets {
        let request = match p.kind {
            Kind::Syn => false,
            Kind::Tcp { seq, len } => {
                let end = seq.wrapping_add(len);
                let new = len > 0 && highest.is_none_or(|h| (end.wrapping_sub(h) as i32) > 0);
                if new {
                    highest = Some(end);
                }
                new
            }
            Kind::Udp { len } => len >= MIN_UDP_REQUEST,
        };
        if request && out.last().is_none_or(|&last| p.at_ns - last >= MERGE_NS) {
            out.push(p.at_ns);
        }
    }
    out
}

/// The cycle of `events` (ns, ascending): the lag whose harmonics the requests' conditional
/// intensity rises to most, from the shortest cycle a round trip of `round_trip_ns` allows and
/// one request event a cycle (a stream's own, at least); refined to the centroid of the
/// intensity's excess over its background around it. Withheld as `comb` where the intensity
/// between the harmonics is below [`MIN_BACKGROUND`], as `no peak` where the peak is within
/// [`MIN_SIGMA`] standard errors of it.
fn cycle(events: &[u64], round_trip_ns: u64) -> Option<Cycle> {
    let (first, last) = (*events.first()?, *events.last()?);
    // Reference events with the whole range of lags after them.
    let refs = events.iter().take_while(|&&t| t + MAX_LAG_NS <= last).count();
    if refs < MIN_EVENTS {
        return None;
    }
    let bins = (MAX_LAG_NS / BIN_NS) as usize;
    let mut counts = vec![0u64; bins];
    for (i, &t) in events[..refs].iter().enumerate() {
        for &u in events[i + 1..].iter().take_while(|&&u| u - t < MAX_LAG_NS) {
            counts[((u - t) / BIN_NS) as usize] += 1;
        }
    }
    // Requests per bin after a request, over what the rate alone gives: 1 where nothing repeats.
    let rate = events.len() as f64 / (last - first) as f64;
    let per_bin = refs as f64 * BIN_NS as f64 * rate;
    let intensity: Vec<f64> = counts.iter().map(|&c| c as f64 / per_bin).collect();
    let smooth: Vec<f64> = (0..bins)
        .map(|b| {
            let window = &intensity[b.saturating_sub(SMOOTH)..(b + SMOOTH + 1).min(bins)];
            window.iter().sum::<f64>() / window.len() as f64
        })
        .collect();
    let lowest = MIN_CYCLE_NS.max((ROUND_TRIP_SHARE * round_trip_ns as f64) as u64).max((1.0 / rate) as u64);
    let score = |b: usize| (1..=HARMONICS).map(|k| smooth[b * k]).sum::<f64>() / HARMONICS as f64;
    let best = ((lowest / BIN_NS) as usize).max(1)..bins / HARMONICS;
    let best = best.max_by(|&a, &b| score(a).total_cmp(&score(b)))?;
    // The peak's centroid: the excess within a fifth of it either side.
    let (lo, hi) = (best * 4 / 5, (best * 6 / 5).min(bins - 1));
    let (mass, moment) = (lo..=hi).fold((0.0, 0.0), |(m, x), b| {
        let excess = (smooth[b] - 1.0).max(0.0);
        (m + excess, x + excess * (b as f64 + 0.5))
    });
    if mass <= 0.0 {
        return None;
    }
    let mut between = intensity[best / 4..=best * 3 / 4].to_vec();
    between.sort_unstable_by(f64::total_cmp);
    let background = between[between.len() / 2];
    let error = (background.max(1.0 / per_bin) / (per_bin * (2 * SMOOTH + 1) as f64)).sqrt();
    let withheld = match (background >= MIN_BACKGROUND, smooth[best] - background >= MIN_SIGMA * error) {
        (false, _) => Some("comb"),
        (true, false) => Some("no peak"),
        (true, true) => None,
    };
    Some(Cycle { ns: moment / mass * BIN_NS as f64, withheld })
}

/// A TCP or UDP packet to `server` in an Ethernet frame, if it is one (parsed as the datapath
/// parses, into `ctx`).
fn to(server: SocketAddr, at_ns: u64, frame: &[u8], ctx: &mut PacketCtx) -> Option<Packet> {
    parse(frame, ctx).ok()?;
    if ctx.key.server() != server {
        return None;
    }
    let kind = match ctx.key.proto {
        IPPROTO_TCP if ctx.tcp_flags & TCP_SYN != 0 => Kind::Syn,
        IPPROTO_TCP => Kind::Tcp { seq: ctx.seq, len: ctx.payload.into() },
        IPPROTO_UDP => Kind::Udp { len: ctx.payload.into() },
        _ => return None,
    };
    Some(Packet { at_ns, client: ctx.key.client(), kind })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A xorshift generator: uniform in [0, 1), three decimals.
    fn uniform(seed: u64) -> impl FnMut() -> f64 {
        let mut x = seed;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 1000) as f64 / 1000.0
        }
    }

    /// `streams` closed-loop streams of cycle `cycle_ns` (each jittered by a few percent), their
    /// phases spread at random: the cycle found within 2 %, whatever the streams; withheld as a
    /// comb for one stream (requests alone in their cycle are what a stream and a server
    /// answering several streams one at a time both make), standing for several.
    #[test]
    fn the_cycle_of_interleaved_streams_is_their_latency() {
        let cycle_ns = 6_000_000;
        for streams in [1, 4, 16] {
            let mut random = uniform(12345 + streams);
            let mut events = Vec::new();
            for _ in 0..streams {
                let mut t = (random() * cycle_ns as f64) as u64;
                while t < 3_000_000_000 {
                    events.push(t);
                    t += (cycle_ns as f64 * (0.97 + 0.06 * random())) as u64;
                }
            }
            events.sort_unstable();
            events.dedup_by(|a, b| *a - *b < MERGE_NS);
            let found = cycle(&events, 0).expect("a cycle");
            assert!((found.ns / cycle_ns as f64 - 1.0).abs() < 0.02, "{streams} streams: {}", found.ns);
            assert_eq!(found.withheld, (streams == 1).then_some("comb"), "{streams} streams");
        }
    }

    /// Requests at random (exponential gaps, no cycle): whatever lag scores best is no peak.
    #[test]
    fn requests_without_a_cycle_have_none() {
        let mut random = uniform(777);
        let mut events = vec![0u64];
        while *events.last().unwrap() < 3_000_000_000 {
            let gap = -(1.0 - random()).max(1e-3).ln() * 1_000_000.0;
            events.push(events.last().unwrap() + MERGE_NS + gap as u64);
        }
        assert_eq!(cycle(&events, 0).and_then(|c| c.withheld), Some("no peak"));
    }
}
