//! A synthetic segment for the RLI benchmark: flows of Pareto sizes through one FIFO bottleneck,
//! with on/off bursts that fill its queue for milliseconds (delay locality, as the paper's
//! queueing model has it), and reference packets chosen three ways: injected 1-in-n or
//! 1-in-τ (they join the queue), or regular packets sampled by hash (they add nothing).
//! Every packet's true delay is known.

use pirate_common::hash::seeded;

use super::interpolate::Arrival;
use crate::rng::uniform;

/// The bottleneck and the traffic through it.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub seconds: f64,
    /// Link rate, bits per second.
    pub link_bps: f64,
    /// Mean offered load of the flows, a share of the link.
    pub load: f64,
    /// Every `burst_every_ns`, a burst at `burst_load` of the link for `burst_ns`.
    pub burst_every_ns: u64,
    pub burst_ns: u64,
    pub burst_load: f64,
    /// Propagation delay, added to every packet's.
    pub base_ns: u64,
}

impl Spec {
    /// 1 Gb/s at `load`, bursts of 2 ms at 1.5 times the link every 50 ms, 100 µs of propagation.
    pub fn gigabit(seconds: f64, load: f64) -> Spec {
        Spec {
            seconds,
            link_bps: 1e9,
            load,
            burst_every_ns: 50_000_000,
            burst_ns: 2_000_000,
            burst_load: 1.5,
            base_ns: 100_000,
        }
    }
}

/// How reference packets are chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum References {
    /// One injected after every `n` regular packets.
    EveryN(u64),
    /// One injected every `ns` nanoseconds.
    EveryNs(u64),
    /// Regular packets whose identity hash falls in 1 of `n`: their timestamps at U are sent to
    /// D, nothing is injected.
    Sampled(u64),
}

/// Bytes of an injected reference (a minimal UDP datagram with a sequence, a timestamp and a
/// tag), on the wire.
pub const REFERENCE_BYTES: u64 = 84;

/// One trace: what D saw, in arrival order, and every regular packet's true delay by flow.
pub struct Trace {
    pub arrivals: Vec<Arrival>,
    /// Per flow: (packets, Σ delay, Σ delay²) of the true delays (ns).
    pub truth: Vec<super::interpolate::Sums>,
    /// Every regular packet's arrival at D (ns) and true delay (ns), in arrival order.
    pub delays: Vec<(u64, f64)>,
    /// References, and the bytes they added to the link (0 when sampled).
    pub references: u64,
    pub reference_bytes: u64,
    pub bytes: u64,
}

/// A packet entering the queue: when (ns), its size, its flow (`u32::MAX`: a reference).
struct Sent {
    at_ns: u64,
    bytes: u64,
    flow: u32,
}

impl Trace {
    /// The trace of `spec` under `references`, its random draws from `seed`.
    pub fn new(spec: &Spec, references: References, seed: u64) -> Trace {
        let mut rng = seed | 1;
        let duration = (spec.seconds * 1e9) as u64;
        let (mut sent, n) = flows(spec, duration, &mut rng);
        sent.extend(bursts(spec, duration, &mut rng, n));
        sent.sort_unstable_by_key(|p| p.at_ns);
        let sent = with_references(sent, references, duration);
        let ns_per_byte = 8e9 / spec.link_bps;
        let flows = sent.iter().filter(|p| p.flow != u32::MAX).map(|p| p.flow + 1).max().unwrap_or(0) as usize;
        let mut truth = vec![super::interpolate::Sums::default(); flows];
        let (mut free_at, mut arrivals, mut references_n, mut reference_bytes, mut bytes) = (0u64, Vec::new(), 0, 0, 0);
        let mut delays = Vec::new();
        for p in &sent {
            // FIFO: served once the link is free, then sent in size × rate.
            let start = free_at.max(p.at_ns);
            free_at = start + (p.bytes as f64 * ns_per_byte) as u64;
            let delay = (free_at - p.at_ns + spec.base_ns) as f64;
            let at_ns = free_at + spec.base_ns;
            bytes += p.bytes;
            let sampled = match references {
                References::Sampled(n) => {
                    p.flow != u32::MAX && seeded(seed, p.at_ns ^ (p.flow as u64) << 40).is_multiple_of(n)
                }
                _ => false,
            };
            if p.flow == u32::MAX || sampled {
                references_n += 1;
                if p.flow == u32::MAX {
                    reference_bytes += p.bytes;
                }
                arrivals.push(Arrival { at_ns, flow: 0, reference: Some(delay) });
            }
            if p.flow != u32::MAX {
                truth[p.flow as usize].add(delay);
                delays.push((at_ns, delay));
                arrivals.push(Arrival { at_ns, flow: p.flow, reference: None });
            }
        }
        Trace { arrivals, truth, delays, references: references_n, reference_bytes, bytes }
    }
}

/// Flows of Pareto sizes (shape 1.2, at least 2 packets, at most 20 000), each sending its
/// packets at its own exponential pace over 1–200 ms, arriving at the rate that offers `load`
/// (from 200 ms before the trace, so that its start is as loaded as the rest); and how many
/// flows.
fn flows(spec: &Spec, duration: u64, rng: &mut u64) -> (Vec<Sent>, u32) {
    const MEAN_PACKETS: f64 = 12.0;
    const MEAN_BYTES: f64 = 0.4 * 64.0 + 0.2 * 576.0 + 0.4 * 1500.0;
    let per_second = spec.load * spec.link_bps / 8.0 / (MEAN_PACKETS * MEAN_BYTES);
    let (mut out, mut at, mut flow) = (Vec::new(), -200e6f64, 0u32);
    loop {
        at += -uniform(rng).ln() / per_second * 1e9;
        if at >= duration as f64 {
            return (out, flow);
        }
        let packets = (2.0 * (1.0 - uniform(rng)).powf(-1.0 / 1.2)).min(20_000.0) as u64;
        let span = 1e6 + uniform(rng) * 199e6;
        let mut t = at;
        for _ in 0..packets {
            t += -uniform(rng).ln() * span / packets as f64;
            if t >= duration as f64 {
                break;
            }
            if t < 0.0 {
                continue;
            }
            let bytes = match uniform(rng) {
                u if u < 0.4 => 64,
                u if u < 0.6 => 576,
                _ => 1500,
            };
            out.push(Sent { at_ns: t as u64, bytes, flow });
        }
        flow += 1;
    }
}

/// The bursts: full-size packets back to back at `burst_load` of the link, as flows of their own
/// (one a burst), numbered from `first_flow`.
fn bursts(spec: &Spec, duration: u64, rng: &mut u64, first_flow: u32) -> Vec<Sent> {
    if spec.burst_load <= 0.0 || spec.burst_ns == 0 {
        return Vec::new();
    }
    let gap = (1500.0 * 8e9 / spec.link_bps / spec.burst_load) as u64;
    let mut out = Vec::new();
    let mut start = (uniform(rng) * spec.burst_every_ns as f64) as u64;
    let mut n = 0;
    while start < duration {
        let mut t = start;
        while t < (start + spec.burst_ns).min(duration) {
            out.push(Sent { at_ns: t, bytes: 1500, flow: first_flow + n });
            t += gap;
        }
        start += spec.burst_every_ns;
        n += 1;
    }
    out
}

/// `sent` with the injected references in it (`flow` `u32::MAX`), still in time order.
fn with_references(sent: Vec<Sent>, references: References, duration: u64) -> Vec<Sent> {
    let mut out = Vec::with_capacity(sent.len() + sent.len() / 16);
    let reference = |at_ns| Sent { at_ns, bytes: REFERENCE_BYTES, flow: u32::MAX };
    match references {
        References::EveryN(n) => {
            for (i, p) in sent.into_iter().enumerate() {
                let at = p.at_ns;
                out.push(p);
                if (i as u64 + 1).is_multiple_of(n) {
                    out.push(reference(at));
                }
            }
        }
        References::EveryNs(every) => {
            let mut next = 0;
            for p in sent {
                while next <= p.at_ns && next < duration {
                    out.push(reference(next));
                    next += every;
                }
                out.push(p);
            }
        }
        References::Sampled(_) => out = sent,
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trace offers about the load asked for, delays never fall below propagation, arrivals
    /// are in order, and each way of choosing references gives about the share asked for.
    #[test]
    fn a_trace_offers_its_load_and_its_references() {
        let spec = Spec { burst_load: 0.0, ..Spec::gigabit(0.5, 0.5) };
        for (refs, share) in [(References::EveryN(500), 1.0 / 501.0), (References::Sampled(500), 1.0 / 500.0)] {
            let t = Trace::new(&spec, refs, 7);
            let load = t.bytes as f64 * 8.0 / spec.link_bps / spec.seconds;
            assert!((load - 0.5).abs() < 0.1, "load {load}");
            assert!(t.arrivals.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
            assert!(t.arrivals.iter().filter_map(|a| a.reference).all(|d| d >= spec.base_ns as f64));
            let got = t.references as f64 / t.arrivals.len() as f64;
            assert!((got / share - 1.0).abs() < 0.15, "{refs:?}: {got}");
        }
        let every = Trace::new(&spec, References::EveryNs(1_000_000), 7);
        assert!((every.references as f64 - 500.0).abs() <= 1.0, "{}", every.references);
    }
}
