//! RLI live on the two-point testbed: pirated U and D, a 50 Mbit/s token bucket on the segment
//! that bursts of cross traffic fill by 34 ms every 100 ms, and flows of Pareto sizes from the
//! sender (a packet a millisecond each, starting at random) through it. Per injection scheme and
//! reference budget, the live per-flow figures against the captures at both points; and from
//! the same captures, what as many hash-sampled references would read (their delays exact from
//! the captures, the interpolation pirated's, `rli::interpolate`); and sampled references live,
//! as many as 1-in-τ takes at the paper's budget: the comparison of the two kinds on the same
//! traffic.

use std::{
    collections::HashMap,
    net::UdpSocket,
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use pirate_tests::{
    capture::Capture,
    linkem::LinkSpec,
    netns::require_root,
    pairs::quantile,
    rli::{self, merged, Ports, Truth},
    testbed::{metric, Pirated},
    twopoint::{TwoPoint, DOWN_IF, RECEIVER_IP, SENDER_IP, UP_IF},
};
use pirated::{
    capture::read_all,
    rli::{
        config::WIRE_BYTES,
        interpolate::{estimate, Arrival},
    },
};
use serde_json::Value;

use super::{median, median_p90, pct};

/// The segment's capacity (the token bucket's rate).
const LINK_BPS: u64 = 50_000_000;
/// The measured flows' destination port.
const PORT: u16 = 9000;
/// Payload bytes of a measured packet.
const PAYLOAD: usize = 200;

/// One run's flows: per flow, its source port, its first packet's offset from the run's start
/// and its packet count (a packet a ms).
fn flows(count: usize, seed: u64) -> Vec<(u16, Duration, u64)> {
    // SplitMix64: the project's hash of a counter stepping by its constant.
    let mut state = seed;
    let mut uniform = || {
        let z = pirate_common::hash::seeded(0, state);
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        (z >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..count)
        .map(|i| {
            // Pareto, shape 1.2, from 10 packets, at most 3 000.
            let packets = (10.0 / (1.0 - uniform()).powf(1.0 / 1.2)).min(3000.0) as u64;
            let start = Duration::from_secs_f64(uniform() * (5.0 - packets as f64 / 1000.0).max(0.0));
            (20_000 + i as u16, start, packets)
        })
        .collect()
}

/// Sends `flows` from the sender, each packet's payload its sequence number within its flow.
fn send(tb: &TwoPoint, flows: &[(u16, Duration, u64)]) -> Result<()> {
    let sockets = flows
        .iter()
        .map(|&(port, ..)| {
            let s = tb.sender.run_in(|| UdpSocket::bind((SENDER_IP, port)))??;
            s.connect((RECEIVER_IP, PORT))?;
            Ok(s)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut events: Vec<(Duration, usize, u64)> = flows
        .iter()
        .enumerate()
        .flat_map(|(f, &(_, start, packets))| (0..packets).map(move |k| (start + Duration::from_millis(k), f, k)))
        .collect();
    events.sort_unstable();
    let begun = Instant::now();
    let mut payload = [0u8; PAYLOAD];
    for (at, f, k) in events {
        if let Some(wait) = at.checked_sub(begun.elapsed()) {
            thread::sleep(wait);
        }
        payload[..8].copy_from_slice(&k.to_le_bytes());
        let _ = sockets[f].send(&payload);
    }
    Ok(())
}

/// A way of placing references, as `[rli]` says it.
struct Scheme {
    name: String,
    /// Sampled references, not injected ones.
    sampled: bool,
    /// The link emulator's impairments (`LinkSpec`'s syntax).
    link: &'static str,
    /// The ceiling on the references' share of the link.
    max_share: f64,
    rli: String,
}

/// One run's outcome.
struct Run {
    lines: Vec<Value>,
    truth: Truth,
    /// Frames at D in arrival order: time, flow, sequence number.
    down: Vec<(u64, Ports, u64)>,
    references: f64,
    seconds: f64,
    /// Leaving U (after its queue), the 1st percentile of the time since a reference's stamp,
    /// and since a measured packet's at U's port (ns): what the two stamps miss.
    stamps: (f64, f64),
}

fn run(scheme: &Scheme, flows: &[(u16, Duration, u64)]) -> Result<Run> {
    let tb = TwoPoint::new()?;
    let emulator = tb.segment.start(&scheme.link.parse()?, &LinkSpec::default(), 5)?;
    rli::queue(&tb.up, "50mbit")?;
    let down_config = rli::config("down", "", RECEIVER_IP, &scheme.rli)?;
    let mut down = Pirated::start(&tb.down, DOWN_IF, &down_config)?;
    let mut up = Pirated::start(&tb.up, UP_IF, &rli::config("up", "", RECEIVER_IP, &scheme.rli)?)?;
    tb.sender.run(&["ping", "-c", "1", "-W", "2", RECEIVER_IP])?;
    down.wait_for(Duration::from_secs(30), |l| l["type"] == "segment_references")?;
    let _sink = tb.receiver.run_in(|| UdpSocket::bind((RECEIVER_IP, PORT)))??;
    let filter = ["-Q", "in", "udp", "dst", "port", "9000"];
    // Leaving U, after its queue: the references and the measured packets.
    let leaving = ["-Q", "out", "udp", "and", "(dst", "port", "9000", "or", "dst", "port", "9466)"];
    let mut captures = [
        Capture::start(&tb.up, UP_IF, &filter)?,
        Capture::start(&tb.down, DOWN_IF, &filter)?,
        Capture::start(&tb.up, "u-d", &leaving)?,
    ];
    let outcome = if scheme.sampled { "matched" } else { "taken" };
    let taken = |d: &Pirated| -> Result<f64> {
        Ok(metric(&d.metrics(&tb.down)?, &format!("pirated_rli_references_total{{outcome=\"{outcome}\"}}")))
    };
    let (stop, begun) = (AtomicBool::new(false), Instant::now());
    let before = taken(&down)?;
    thread::scope(|s| -> Result<()> {
        let cross = s.spawn(|| rli::cross_traffic(&tb.sender, 150, &stop));
        thread::sleep(Duration::from_millis(500));
        let sent = send(&tb, flows);
        thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        cross.join().expect("the cross traffic panicked")?;
        sent
    })?;
    let seconds = begun.elapsed().as_secs_f64();
    for c in &mut captures {
        c.stop()?;
    }
    // Two interval reports later every counter is in.
    let last = down.lines().iter().filter_map(|l| l["interval"].as_i64()).max().unwrap_or(0);
    down.wait_for(Duration::from_secs(5), |l| {
        l["type"] == "segment_references" && l["interval"].as_i64() >= Some(last + 2)
    })?;
    let references = taken(&down)? - before;
    up.stop()?;
    let lines = down.stop()?;
    emulator.stop()?;
    let (up_frames, down_frames) = (read_all(captures[0].path())?, read_all(captures[1].path())?);
    let stamps = stamps(&up_frames, &read_all(captures[2].path())?);
    let order = down_frames
        .iter()
        .filter(|(_, f)| f.len() >= 50)
        .map(|(ts, f)| {
            let port = |i: usize| u16::from_be_bytes([f[i], f[i + 1]]);
            (*ts, (port(34), port(36)), u64::from_le_bytes(f[42..50].try_into().unwrap()))
        })
        .collect();
    let truth = Truth::of(up_frames, down_frames, PORT..PORT + 1);
    Ok(Run { lines, truth, down: order, references, seconds, stamps })
}

/// What stamping a reference before `send` costs beside stamping a forwarded packet at U's
/// port: leaving U (`leaving`, captured after the queue), the 1st percentile (the queue empty)
/// of the time since each reference's stamp (its payload, TAI), and since each measured packet
/// passed U's port (`up`).
fn stamps(up: &[(u64, Vec<u8>)], leaving: &[(u64, Vec<u8>)]) -> (f64, f64) {
    let offset = pirated::clock::tai_offset_ns();
    let key = |f: &[u8]| (u16::from_be_bytes([f[34], f[35]]), u64::from_le_bytes(f[42..50].try_into().unwrap()));
    let passed: HashMap<(u16, u64), u64> =
        up.iter().filter(|(_, f)| f.len() >= 50).map(|(ts, f)| (key(f), *ts)).collect();
    let (mut references, mut forwarded) = (Vec::new(), Vec::new());
    for (ts, f) in leaving.iter().filter(|(_, f)| f.len() >= 74) {
        if u16::from_be_bytes([f[36], f[37]]) == 9466 {
            let stamp = u64::from_be_bytes(f[58..66].try_into().unwrap());
            references.push((*ts as i64 + offset) as f64 - stamp as f64);
        } else if let Some(at) = passed.get(&key(f)) {
            forwarded.push(*ts as f64 - *at as f64);
        }
    }
    let p1 = |v: &mut Vec<f64>| if v.is_empty() { f64::NAN } else { quantile(v, 0.01) };
    (p1(&mut references), p1(&mut forwarded))
}

/// Per flow of `min..max` packets, the relative error of the mean (signed) and the std-dev
/// (absolute), for the figures `of` gives it (packets, mean, std-dev) against the delays of its
/// packets they stand for (those of the intervals with a figure, live).
fn errors(
    truth: &Truth,
    min: usize,
    max: usize,
    of: impl Fn(Ports) -> ((u64, f64, f64), Vec<f64>),
) -> (Vec<f64>, Vec<f64>) {
    let (mut means, mut stds) = (Vec::new(), Vec::new());
    for (&ports, delays) in &truth.flows {
        if !(min..max).contains(&delays.len()) {
            continue;
        }
        let ((n, mean, std), behind) = of(ports);
        if n == 0 {
            continue;
        }
        let (t_mean, t_std) = rli::moments(&behind);
        means.push((mean - t_mean) / t_mean);
        if t_std > 0.0 {
            stds.push(((std - t_std) / t_std).abs());
        }
    }
    (means, stds)
}

/// What `count` hash-sampled references would read on `run`'s traffic: per flow, RLI's figures
/// with the sampled packets' delays (exact, from the captures) as references.
fn sampled(run: &Run, count: f64) -> HashMap<Ports, (u64, f64, f64)> {
    let threshold = ((count / run.down.len().max(1) as f64).min(1.0) * u64::MAX as f64) as u64;
    let flows: Vec<Ports> = run.truth.flows.keys().copied().collect();
    let index: HashMap<Ports, u32> = flows.iter().enumerate().map(|(i, p)| (*p, i as u32)).collect();
    let arrivals: Vec<Arrival> = run
        .down
        .iter()
        .filter_map(|&(at_ns, ports, seq)| {
            let (flow, delay) = (*index.get(&ports)?, *run.truth.packets.get(&(ports, seq))?);
            let h = pirate_common::hash::seeded(0x5341_4d50_4c45_4421, (ports.0 as u64) << 32 | seq);
            Some(Arrival { at_ns, flow, reference: (h < threshold).then_some(delay) })
        })
        .collect();
    let e = estimate(&arrivals, flows.len());
    let figures = |s: &pirated::rli::interpolate::Sums| {
        (s.packets, s.mean().unwrap_or(f64::NAN), s.std_dev().unwrap_or(f64::NAN))
    };
    flows.iter().zip(&e.rli).map(|(p, s)| (*p, figures(s))).collect()
}

/// Runs every scheme at every budget (shares of the link) and prints the table.
pub fn bench(shares: &[f64], flow_count: usize) -> Result<()> {
    require_root()?;
    let flows = flows(flow_count, 0x524c_4954);
    let packets: u64 = flows.iter().map(|f| f.2).sum();
    let big = flows.iter().filter(|f| f.2 >= 100).count();
    println!(
        "\nRLI live on the two-point testbed: {LINK_BPS} b/s token bucket, cross traffic filling it by 34 ms every \
         100 ms, {flow_count} flows of Pareto sizes ({packets} packets, {big} flows of ≥100), a packet a ms each; per-flow \
         relative error against the captures at U and D, median / p90 over flows of ≥100 packets (and 10–99); the \
         segment's p99 per interval from the references against every measured packet's, median / worst; leaving U, \
         the time since a reference's stamp / since a measured packet passed U's port (1st percentile)\n"
    );
    println!(
        "{:>10} {:>9} {:>8} | {:>15} {:>15} | {:>15} | {:>15} | {:>15} | {:>15} | {:>11}",
        "scheme",
        "max share",
        "link %",
        "RLI mean",
        "RLI std",
        "RLI-L mean",
        "RLI mean 10–99",
        "sampled mean",
        "p99",
        "stamps µs"
    );
    for &share in shares {
        let ceiling = ceiling(share);
        // 1-in-n at the budget for the packets the link carries on average (the flows', the
        // cross traffic's 1 500 a second).
        let pps = packets as f64 / 5.0 + 1500.0;
        let n = (pps * ceiling).round().max(1.0) as u64;
        let period = format!("{}us", (ceiling * 1e6).ceil() as u64);
        let base = format!("link_bps = {LINK_BPS}\nmax_share = {share}\n");
        // Adaptive: up to 4× the budget on an idle link, one every 4 ceilings when full; about
        // twice the budget at this link's average utilisation (a half).
        let adaptive = (share * 4.0).min(0.1);
        let schemes = [
            Scheme {
                name: format!("1-in-τ {period}"),
                sampled: false,
                link: CLEAN,
                max_share: share,
                rli: format!("{base}injection = \"period\"\nperiod = \"{period}\"\n"),
            },
            Scheme {
                name: format!("1-in-{n}"),
                sampled: false,
                link: CLEAN,
                max_share: share,
                rli: format!("{base}injection = \"packets\"\npackets = {n}\n"),
            },
            Scheme {
                name: "adaptive".into(),
                sampled: false,
                link: CLEAN,
                max_share: adaptive,
                rli: format!(
                    "link_bps = {LINK_BPS}\nmax_share = {adaptive}\ninjection = \"adaptive\"\nperiod = \"{}us\"\n",
                    (ceiling * 4e6).ceil() as u64
                ),
            },
        ];
        for scheme in &schemes {
            println!("{}", row(scheme, &flows).with_context(|| format!("{} at {share}", scheme.name))?);
        }
    }
    // The paper's budget through a lossy link that reorders: references lost (the packets
    // after one wait for the next: RLI-L has them meanwhile) or overtaken.
    let period = format!("{}us", (ceiling(0.002) * 1e6).ceil() as u64);
    let lossy = Scheme {
        name: "1-in-τ, 1 % lost, 1 % reordered".into(),
        sampled: false,
        link: "delay=1ms,loss=0.01,reorder=0.01,reorder_delay=0",
        max_share: 0.002,
        rli: format!("link_bps = {LINK_BPS}\nmax_share = 0.002\ninjection = \"period\"\nperiod = \"{period}\"\n"),
    };
    println!("{}", row(&lossy, &flows).context("the lossy link")?);
    // Sampled references live: as many as 1-in-τ at the paper's budget takes (one every
    // ceiling) from the packets the link carries, and the most rli.sample_share allows (a
    // tenth). Nothing injected: their times cross the segment's channel (16 bytes each, and 42
    // a message a ms).
    let pps = packets as f64 / 5.0 + 1500.0;
    for share in [1.0 / (ceiling(0.002) * pps), 0.1] {
        let sampled = Scheme {
            name: format!("sampled {:.2} %", share * 100.0),
            sampled: true,
            link: CLEAN,
            max_share: 0.0,
            rli: format!("references = \"sampled\"\nsample_share = {share}\n"),
        };
        println!("{}", row(&sampled, &flows).context("sampled references")?);
    }
    Ok(())
}

/// The shortest gap between references that keeps them within `share` of the link, s.
fn ceiling(share: f64) -> f64 {
    WIRE_BYTES as f64 * 8.0 / (share * LINK_BPS as f64)
}

/// The link without impairments but its propagation delay.
const CLEAN: &str = "delay=1ms";

/// One scheme's run as a row of the table.
fn row(scheme: &Scheme, flows: &[(u16, Duration, u64)]) -> Result<String> {
    let r = run(scheme, flows)?;
    let lines = &r.lines;
    let truth = &r.truth;
    let live = |est: &'static str| move |p: Ports| (merged(lines, p, est), rli::behind(truth, lines, p, est));
    let (rli_m, rli_s) = errors(&r.truth, 100, usize::MAX, live("rli"));
    let (left_m, _) = errors(&r.truth, 100, usize::MAX, live("rli_l"));
    let (small, _) = errors(&r.truth, 10, 100, live("rli"));
    let sampled = sampled(&r, r.references);
    let all = |p: Ports| truth.flows.get(&p).cloned().unwrap_or_default();
    let (sampled_m, _) = errors(&r.truth, 100, usize::MAX, |p| (sampled.get(&p).copied().unwrap_or_default(), all(p)));
    let p99 = p99_errors(&r);
    let worst = p99.iter().copied().map(f64::abs).fold(f64::NAN, f64::max);
    Ok(format!(
        "{:>10} {:>8.2}% {:>8.3} | {:>15} {:>15} | {:>15} | {:>15} | {:>15} | {:6.2} / {:6.2} | {:4.0} / {:4.0}",
        scheme.name,
        scheme.max_share * 100.0,
        // Sampled references add nothing to the link.
        if scheme.sampled {
            0.0
        } else {
            r.references * WIRE_BYTES as f64 * 8.0 / (LINK_BPS as f64 * r.seconds) * 100.0
        },
        pct(median_p90(&rli_m)),
        pct(median_p90(&rli_s)),
        pct(median_p90(&left_m)),
        pct(median_p90(&small)),
        pct(median_p90(&sampled_m)),
        median(&p99) * 100.0,
        worst * 100.0,
        r.stamps.0 / 1e3,
        r.stamps.1 / 1e3,
    ))
}

/// Per interval the measured packets fill, the relative error of the references' p99.
fn p99_errors(r: &Run) -> Vec<f64> {
    let full = r.truth.intervals.values().map(Vec::len).max().unwrap_or(0) * 9 / 10;
    r.lines
        .iter()
        .filter(|l| l["type"] == "segment_references")
        .filter_map(|l| {
            let mut truth = r.truth.intervals.get(&l["interval"].as_i64()?)?.clone();
            let p99 = l["quantiles"][2]["delay_ns"].as_f64()?;
            if truth.len() < full {
                return None;
            }
            let t = quantile(&mut truth, 0.99);
            Some((p99 - t) / t)
        })
        .collect()
}
