//! RLI on the two-point testbed, shared by its tests and its benchmark: a point's configuration,
//! a queue with bursty cross traffic on the segment, the truth from captures at both points
//! (every UDP datagram whose payload starts with its sequence number, matched by flow and
//! number), and a flow's figures merged over its `segment_flow` lines.

use std::{
    collections::{BTreeMap, HashMap},
    net::UdpSocket,
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::Duration,
};

use anyhow::Result;
use pirated::clock::tai_offset_ns;
use serde_json::Value;

use crate::{
    netns::Netns,
    twopoint::{self, PEER_ADDR, RECEIVER_IP, SENDER_IP},
};

/// A point's configuration with `[rli]` on (`extra` at the end of `[segment]`, `rli` the
/// section's keys besides `enabled` and `target`), references to `target`.
pub fn config(role: &str, extra: &str, target: &str, rli: &str) -> Result<String> {
    let key = twopoint::key_file()?;
    Ok(format!(
        "[fridge]\nenabled = false\n[segment]\nrole = \"{role}\"\nlisten = \"{PEER_ADDR}\"\npeer = \"{PEER_ADDR}\"\n\
         key_file = \"{}\"\ninterval = \"1s\"\n{extra}[rli]\nenabled = true\ntarget = \"{target}\"\n{rli}",
        key.display()
    ))
}

/// A token bucket of `rate` (tc's syntax, "20mbit") on `u-d` in `ns`, U's egress into the segment.
pub fn queue(ns: &Netns, rate: &str) -> Result<()> {
    ns.run(&["tc", "qdisc", "add", "dev", "u-d", "root", "tbf", "rate", rate, "burst", "8kb", "limit", "400kb"])?;
    Ok(())
}

/// The port cross traffic goes to, which no test's flows use.
pub const CROSS_PORT: u16 = 9100;

/// Cross traffic from the sender to the receiver until `stop`: `burst` datagrams of 1 400 bytes
/// at once every 100 ms, to `CROSS_PORT`, each numbered in its first 8 bytes (as the probes
/// are, for [`Truth`]).
pub fn cross_traffic(sender: &Netns, burst: usize, stop: &AtomicBool) -> Result<()> {
    let socket = sender.run_in(|| UdpSocket::bind(format!("{SENDER_IP}:0")))??;
    socket.connect(format!("{RECEIVER_IP}:{CROSS_PORT}"))?;
    let mut datagram = [0u8; 1400];
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..burst {
            n += 1;
            datagram[..8].copy_from_slice(&n.to_le_bytes());
            let _ = socket.send(&datagram);
        }
        thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// A flow as the captures know it: source and destination port.
pub type Ports = (u16, u16);

/// What the captures at U and D say of the datagrams to `ports`: each one's delay per flow, and
/// per interval (of one second, by its arrival at D on TAI).
#[derive(Default)]
pub struct Truth {
    pub flows: BTreeMap<Ports, Vec<f64>>,
    pub intervals: BTreeMap<i64, Vec<f64>>,
    /// Each datagram's, by flow and sequence number.
    pub packets: HashMap<(Ports, u64), f64>,
}

impl Truth {
    /// From the frames captured at U and at D (UTC, as captures stamp).
    pub fn of(up: Vec<(u64, Vec<u8>)>, down: Vec<(u64, Vec<u8>)>, ports: std::ops::Range<u16>) -> Truth {
        let datagrams = |frames: Vec<(u64, Vec<u8>)>| -> HashMap<(Ports, u64), u64> {
            frames
                .into_iter()
                .filter(|(_, f)| f.len() >= 50 && f[12..14] == [8, 0] && f[23] == 17)
                .map(|(ts, f)| {
                    let port = |i: usize| u16::from_be_bytes([f[i], f[i + 1]]);
                    (((port(34), port(36)), u64::from_le_bytes(f[42..50].try_into().unwrap())), ts)
                })
                .filter(|(((_, dport), _), _)| ports.contains(dport))
                .collect()
        };
        let (up, down) = (datagrams(up), datagrams(down));
        let mut truth = Truth::default();
        let offset = tai_offset_ns();
        for (id, sent) in &up {
            if let Some(arrived) = down.get(id) {
                let delay = *arrived as f64 - *sent as f64;
                truth.flows.entry(id.0).or_default().push(delay);
                let interval = (*arrived as i64 + offset) / 1_000_000_000;
                truth.intervals.entry(interval).or_default().push(delay);
                truth.packets.insert(*id, delay);
            }
        }
        truth
    }
}

/// Mean and standard deviation of `x`.
pub fn moments(x: &[f64]) -> (f64, f64) {
    let mean = x.iter().sum::<f64>() / x.len() as f64;
    (mean, (x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / x.len() as f64).sqrt())
}

/// The `segment_flow` lines of the flow `ports` (the sender's port `ports.0` to the receiver's
/// `ports.1`) among `lines`.
pub fn flow_lines(lines: &[Value], ports: Ports) -> impl Iterator<Item = &Value> {
    let (client, server) = (format!("{SENDER_IP}:{}", ports.0), format!("{RECEIVER_IP}:{}", ports.1));
    lines.iter().filter(move |l| {
        l["type"] == "segment_flow" && l["client"] == client.as_str() && l["server"] == server.as_str()
    })
}

/// The captures' delays of the packets behind `estimator`'s published figures for the flow
/// among `lines`: what [`merged`] reads, and is judged against. A line counts the packets it
/// settled, the next ones in the flow's order (packets still waiting for a reference at an
/// interval's end count in the next, so which interval a packet arrived in says little); RLI's
/// unsettled ones are passed over where they fall, and a withheld figure's packets likewise.
pub fn behind(truth: &Truth, lines: &[Value], ports: Ports, estimator: &str) -> Vec<f64> {
    let mut flow: Vec<(u64, f64)> =
        truth.packets.iter().filter(|((p, _), _)| *p == ports).map(|((_, seq), d)| (*seq, *d)).collect();
    flow.sort_unstable_by_key(|&(seq, _)| seq);
    let mut delays = flow.into_iter().map(|(_, d)| d);
    let mut published = Vec::new();
    for l in flow_lines(lines, ports) {
        let e = &l[estimator];
        let unsettled = if estimator == "rli" { l["unsettled"].as_u64().unwrap_or(0) } else { 0 };
        let settled = delays.by_ref().take((e["packets"].as_u64().unwrap_or(0) + unsettled) as usize);
        match e["mean_ns"].is_number() {
            true => published.extend(settled),
            false => settled.for_each(drop),
        }
    }
    published
}

/// A flow's `segment_flow` lines merged over a run, for `estimator` ("rli" or "rli_l"):
/// packets, mean and standard deviation, over the lines with figures.
pub fn merged(lines: &[Value], ports: Ports, estimator: &str) -> (u64, f64, f64) {
    let (mut n, mut sum, mut sq) = (0u64, 0.0, 0.0);
    for l in flow_lines(lines, ports) {
        let e = &l[estimator];
        // Withheld figures (their packets too few to say, or too many left out) count nowhere.
        let (Some(k), Some(mean)) = (e["packets"].as_u64().filter(|&k| k > 0), e["mean_ns"].as_f64()) else {
            continue;
        };
        let std = e["std_dev_ns"].as_f64().unwrap_or(0.0);
        n += k;
        sum += k as f64 * mean;
        sq += k as f64 * (std * std + mean * mean);
    }
    let mean = sum / n.max(1) as f64;
    (n, mean, (sq / n.max(1) as f64 - mean * mean).max(0.0).sqrt())
}
