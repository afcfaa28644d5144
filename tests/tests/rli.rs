//! RLI's datapath at the downstream point, run in the kernel with BPF_PROG_TEST_RUN: references
//! with a valid tag are taken (their delay kept, the packet dropped); forged, replayed and
//! stale ones are dropped and counted, never used; every other packet passes unchanged into its
//! flow's counters, interpolated between the references around it. Live on the two-point
//! testbed: each flow's delay through a queue against captures at both points.

use std::{
    net::UdpSocket,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use anyhow::{ensure, Result};
use pirate_common::{counters, rli::reference::seal};
use pirate_tests::{
    capture::Capture,
    linkem::{probe::Probes, EmuLink, LinkSpec, EMU_B},
    netns::Netns,
    pairs::quantile,
    rli::{self, merged, moments, Truth},
    testbed::{metric, Pirated},
    twopoint::{replay_segment, TwoPoint, TwoPorts, DOWN_IF, RECEIVER_IP, SENDER_IP, UP_IF},
};
use pirated::{
    capture::read_all,
    clock,
    config::Config,
    datapath::{test_run::test_run, Datapath},
    rli::drain::Drain,
};
use serde_json::Value;

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const KEY: [u64; 2] = [0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210];
const PORT: u16 = 9466;

/// An Ethernet + IPv4 + UDP frame from 10.0.0.1:`sport` to 10.0.0.2:`dport`.
fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00, 0x45, 0];
    f.extend_from_slice(&((28 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

/// A downstream point's datapath with RLI on, its references tagged under `KEY`.
fn downstream() -> Result<Datapath> {
    let config = Config::parse(&format!(
        "[segment]\nrole = \"down\"\nkey_file = \"/nonexistent\"\n[rli]\nenabled = true\nport = {PORT}\n"
    ))?;
    let mut spec = config.datapath();
    ensure!(spec.rli.enabled, "the downstream point chains rli");
    ensure!(Datapath::load(&spec).is_err(), "rli chained without a key");
    spec.rli.shape.key = KEY;
    Datapath::load(&spec)
}

/// Runs the chain on `frame`; its verdict and what each counter gained.
fn run(dp: &Datapath, frame: &[u8]) -> Result<(u32, [u64; counters::COUNT as usize])> {
    let before = dp.counters()?;
    let mut out = vec![0u8; 2048];
    let r = test_run(dp.root_fd()?, frame, 1, &mut out)?;
    if r.verdict == XDP_PASS {
        ensure!(&out[..r.out_len] == frame, "a regular packet left changed");
    }
    let after = dp.counters()?;
    Ok((r.verdict, std::array::from_fn(|i| after[i] - before[i])))
}

/// Runs `frame` and expects it dropped with `counter` counted once.
fn dropped_as(dp: &Datapath, frame: &[u8], counter: u32) -> Result<()> {
    let (verdict, d) = run(dp, frame)?;
    ensure!(verdict == XDP_DROP, "verdict {verdict} for a {}", counters::NAMES[counter as usize]);
    ensure!(d[counter as usize] == 1, "not counted {}: {d:?}", counters::NAMES[counter as usize]);
    Ok(())
}

#[test]
fn references_are_checked_taken_and_used_and_nothing_else_is_dropped() -> Result<()> {
    let mut dp = downstream()?;
    let mut maps = dp.take_rli()?;
    let sent_ago = |ms: u64| clock::now() - ms * 1_000_000;
    let reference = |key, seq, sent| udp(40000, PORT, &seal(key, seq, sent));
    let regular = udp(1234, 80, b"request");

    // Before any reference: passes, counted nowhere.
    ensure!(run(&dp, &regular)?.0 == XDP_PASS);
    let seq = 1_000;
    dropped_as(&dp, &reference(KEY, seq, sent_ago(3)), counters::EVENT_RLI_TAKEN)?;
    // Another key, a cut payload, a bit flipped: forged.
    dropped_as(&dp, &reference([1, 2], seq + 1, sent_ago(3)), counters::EVENT_RLI_FORGED)?;
    dropped_as(&dp, &udp(40000, PORT, &seal(KEY, seq + 1, sent_ago(3))[..31]), counters::EVENT_RLI_FORGED)?;
    let mut flipped = reference(KEY, seq + 1, sent_ago(3));
    let last = flipped.len() - 9;
    flipped[last] ^= 1;
    dropped_as(&dp, &flipped, counters::EVENT_RLI_FORGED)?;
    // The same reference again, one from 5 s ago (beyond max_delay), one from the future.
    dropped_as(&dp, &reference(KEY, seq, sent_ago(3)), counters::EVENT_RLI_REPLAYED)?;
    dropped_as(&dp, &reference(KEY, seq + 1, sent_ago(5000)), counters::EVENT_RLI_STALE)?;
    dropped_as(&dp, &reference(KEY, seq + 1, clock::now() + 2_000_000_000), counters::EVENT_RLI_STALE)?;

    // Two packets of the flow after the first reference, then the second (1 ms later sent, 1
    // ms of delay), then one more packet: it settles the two on the line between them.
    for _ in 0..2 {
        ensure!(run(&dp, &regular)?.0 == XDP_PASS);
    }
    dropped_as(&dp, &reference(KEY, seq + 1, sent_ago(1)), counters::EVENT_RLI_TAKEN)?;
    let (verdict, d) = run(&dp, &regular)?;
    ensure!(verdict == XDP_PASS && d[counters::EVENT_RLI_FLOW_INSERTED as usize] == 0, "{d:?}");

    let mut taken = Vec::new();
    maps.drain_taken(|t| taken.push(t));
    ensure!(taken.len() == 2, "{} references taken: {taken:?}", taken.len());
    let (first, second) = (taken[0].reference, taken[1].reference);
    ensure!((first.seq, second.seq) == (seq, seq + 1), "{taken:?}");
    // Each delay as stamped (3 ms and 1 ms), plus what the test took to run it.
    for (r, ms) in [(first, 3), (second, 1)] {
        let late = r.delay_ns - ms * 1_000_000;
        ensure!((0..50_000_000).contains(&late), "reference {} delay {} ns", r.seq, r.delay_ns);
    }
    let figures = Drain::default().read(maps.flows()?, &maps.references()?, false).figures;
    ensure!(figures.len() == 1, "{figures:?}");
    let f = &figures[0];
    ensure!(f.key.dport == 80 && f.unsettled == 0, "{f:?}");
    // RLI-L: the two after the first reference at its delay, the last at the second's.
    ensure!(f.left.packets == 3, "{f:?}");
    let left = (2.0 * first.delay_ns as f64 + second.delay_ns as f64) / 3.0;
    ensure!((f.left.mean_ns.unwrap() - left).abs() < 1.0, "RLI-L {f:?}, expected {left}");
    // RLI: the two between the references, on the line between their delays.
    ensure!(f.rli.packets == 2, "{f:?}");
    let (lo, hi) = (first.delay_ns.min(second.delay_ns) as f64, first.delay_ns.max(second.delay_ns) as f64);
    let mean = f.rli.mean_ns.unwrap();
    ensure!(mean >= lo - 16.0 && mean <= hi + 16.0, "RLI {f:?} outside {lo}..{hi}");
    Ok(())
}

/// With [`TwoPorts`], an address routed through the segment's link (a neighbour entry on `u-d`
/// resolving to the other port): where its references go.
const TWO_PORTS_FAR_END: &str = "10.204.2.2";

/// Flows measured on the testbed, one per destination port from this one on.
const FLOW_PORT: u16 = 9000;
const FLOWS: u16 = 4;

/// RLI's keys for the live tests: references every millisecond (5 % of the 20 Mbit/s queue).
const LIVE_RLI: &str = "period = \"1ms\"\nlink_bps = 20000000\nmax_share = 0.05\n";

/// A point's configuration for the live tests.
fn live_config(role: &str, extra: &str, target: &str) -> Result<String> {
    rli::config(role, extra, target, LIVE_RLI)
}

/// Where the test runs: the namespaces traffic enters and leaves by, the ports the points
/// measure on (U's, D's), the namespace holding U's egress `u-d` (the queue goes there) and
/// the link emulator behind it.
struct Segment<'a> {
    sender: &'a Netns,
    receiver: &'a Netns,
    up: (&'a Netns, &'a str),
    down: (&'a Netns, &'a str),
    queue: &'a Netns,
    link: &'a EmuLink,
}

/// The pirated instances measuring a [`Segment`]: the one reporting D's figures with its
/// configuration, and U's where it is another.
struct Points {
    reporter: Pirated,
    config: String,
    up: Option<Pirated>,
}

/// Two pirated instances on the two-point testbed, a 20 Mbit/s token bucket on the segment
/// filled by bursts of cross traffic (queueing delay rising by 34 ms and falling every 100 ms)
/// and four probe flows through it, references every ms: see [`through_a_queue`].
#[test]
fn per_flow_delay_through_a_queue_matches_the_captures() -> Result<()> {
    let tb = TwoPoint::new()?;
    let segment = Segment {
        sender: &tb.sender,
        receiver: &tb.receiver,
        up: (&tb.up, UP_IF),
        down: (&tb.down, DOWN_IF),
        queue: &tb.up,
        link: &tb.segment,
    };
    through_a_queue(&segment, || {
        let config = live_config("down", "", RECEIVER_IP)?;
        let reporter = Pirated::start(&tb.down, DOWN_IF, &config)?;
        let up = Some(Pirated::start(&tb.up, UP_IF, &live_config("up", "", RECEIVER_IP)?)?);
        Ok(Points { reporter, config, up })
    })
}

/// One pirated on two ports of the host the segment starts and ends at (role "both"), its
/// references to the far end of the segment's link: the same as two instances.
#[test]
fn one_pirated_on_two_ports_measures_each_flow_through_a_queue() -> Result<()> {
    let tb = TwoPorts::new()?;
    let segment = Segment {
        sender: &tb.sender,
        receiver: &tb.receiver,
        up: (&tb.mid, UP_IF),
        down: (&tb.mid, DOWN_IF),
        queue: &tb.mid,
        link: &tb.segment,
    };
    through_a_queue(&segment, || {
        let both = format!("down_interface = \"{DOWN_IF}\"\n");
        let config = live_config("both", &both, TWO_PORTS_FAR_END)?;
        Ok(Points { reporter: Pirated::start(&tb.mid, UP_IF, &config)?, config, up: None })
    })
}

/// Each flow's one-way delay, merged over its `segment_flow` lines, within 2 % (mean) and 5 %
/// (std-dev) of the captures at both points, by RLI and RLI-L, every packet counted; replayed
/// from captures that hold the references, within 0.2 % and 0.5 % of live; the segment's p99
/// and std-dev from the references within 10 % of the probes' in every interval the probes
/// fill (they take a third of the link), its mean within 10 % (the probes are not quite
/// uniform in time: their senders compete with the cross traffic's for the CPU); no reference
/// refused, none reaching the receiver; the metrics an interval's figures, never a flow's.
fn through_a_queue(seg: &Segment, start: impl FnOnce() -> Result<Points>) -> Result<()> {
    let emulator = seg.link.start(&"delay=1ms".parse()?, &LinkSpec::default(), 3)?;
    rli::queue(seg.queue, "20mbit")?;
    let Points { reporter: mut down, config, mut up } = start()?;
    seg.sender.run(&["ping", "-c", "1", "-W", "2", RECEIVER_IP])?;
    down.wait_for(Duration::from_secs(30), |l| {
        l["type"] == "segment_references" && l["references"].as_u64() > Some(0)
    })?;
    // Anything reaching the receiver on the reference port would be a reference D let through.
    let leaked = seg.receiver.run_in(|| UdpSocket::bind(format!("{RECEIVER_IP}:9466")))??;
    leaked.set_nonblocking(true)?;
    let filter = ["-Q", "in", "udp", "dst", "portrange", "9000-9003"];
    // Where the references still are: leaving the link for D's port (D's XDP drops them before
    // a capture there could see them), for the replay.
    let before_d = ["-Q", "out", "udp", "and", "(dst", "portrange", "9000-9003", "or", "dst", "port", "9466)"];
    let mut captures = [
        Capture::start(seg.up.0, seg.up.1, &filter)?,
        Capture::start(seg.down.0, seg.down.1, &filter)?,
        Capture::start(seg.link.ns(), EMU_B, &before_d)?,
    ];
    let probes =
        Probes { count: 3000, gap: Duration::from_millis(1), payload: 200, settle: Duration::from_millis(300) };
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| -> Result<()> {
        // Cross traffic: 60 datagrams of 1400 bytes at once every 100 ms (34 ms of the queue),
        // from half a second before the probes to half a second after them.
        let cross = s.spawn(|| rli::cross_traffic(seg.sender, 60, &stop));
        // The queue's cycle half a second long before the probes start.
        std::thread::sleep(Duration::from_millis(500));
        let runs: Vec<_> = (0..FLOWS)
            .map(|i| {
                let probes = probes.clone();
                let dst = format!("{RECEIVER_IP}:{}", FLOW_PORT + i);
                s.spawn(move || probes.run(seg.sender, SENDER_IP.parse()?, seg.receiver, dst.parse()?))
            })
            .collect();
        for run in runs {
            run.join().expect("a probe run panicked")?;
        }
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        cross.join().expect("the cross traffic panicked")
    })?;
    for c in &mut captures {
        c.stop()?;
    }
    let after = (clock::now() / 1_000_000_000) as i64 + 1;
    down.wait_for(Duration::from_secs(5), |l| {
        l["type"] == "segment_references" && l["interval"].as_i64() >= Some(after)
    })?;
    // U first: references it sends once D stopped and detached would go through.
    if let Some(up) = &mut up {
        up.stop()?;
    }
    std::thread::sleep(Duration::from_millis(50));
    let metrics = down.metrics(seg.down.0)?;
    let lines = down.stop()?;
    emulator.stop()?;
    ensure!(leaked.recv(&mut [0u8; 64]).is_err(), "a reference reached the receiver");
    let taken = metric(&metrics, "pirated_rli_references_total{outcome=\"taken\"}");
    ensure!(taken > 3000.0, "{taken} references taken over the probes' 3 s and more");
    for outcome in ["forged", "replayed", "stale"] {
        let refused = metric(&metrics, &format!("pirated_rli_references_total{{outcome=\"{outcome}\"}}"));
        ensure!(refused == 0.0, "{refused} references refused as {outcome}");
    }
    // Prometheus's view: the p99 gauge is an interval's, one observation per flow and interval
    // went into the histogram of flows' means, and no series is a flow's.
    let p99 = metric(&metrics, "pirated_rli_delay_quantile_seconds{q=\"0.99\"}");
    let p99s: Vec<f64> = lines.iter().filter_map(|l| l["quantiles"][2]["delay_ns"].as_f64()).collect();
    ensure!(p99s.iter().any(|v| (v * 1e-9 - p99).abs() < 1e-12), "the p99 gauge {p99} s is no interval's");
    let observed = metric(&metrics, "pirated_rli_flow_delay_mean_seconds_count");
    let with_mean = |l: &&Value| l["type"] == "segment_flow" && l["rli"]["mean_ns"].is_number();
    let published = lines.iter().filter(with_mean).filter(|l| l["interval"].as_i64() <= Some(after)).count();
    ensure!(observed >= published as f64 && observed <= lines.iter().filter(with_mean).count() as f64);
    ensure!(!metrics.lines().any(|l| l.starts_with("pirated_rli") && l.contains("client")), "a series per flow");

    let Truth { flows: truth, intervals, .. } =
        Truth::of(read_all(captures[0].path())?, read_all(captures[1].path())?, FLOW_PORT..FLOW_PORT + FLOWS);
    let replayed = replay_segment(&config, captures[0].path(), captures[2].path())?;
    ensure!(truth.len() == FLOWS as usize, "captured flows: {:?}", truth.keys());
    // The segment's delay per interval from the references, against every probe's in it (the
    // probes, like the references, spread evenly over time).
    // Only the intervals the probes fill: they take a third of the link, so the queue runs
    // longer while they are on.
    let full = intervals.values().map(Vec::len).max().unwrap_or(0) * 9 / 10;
    let mut judged = 0;
    for line in lines.iter().filter(|l| l["type"] == "segment_references") {
        let Some(delays) = intervals.get(&line["interval"].as_i64().unwrap()) else { continue };
        if delays.len() < full {
            continue;
        }
        let mut delays = delays.clone();
        let (mean, std) = moments(&delays);
        let p99 = quantile(&mut delays, 0.99);
        let refs = |k: &str| line[k].as_f64().unwrap();
        let ref_p99 = line["quantiles"][2]["delay_ns"].as_f64().unwrap();
        println!(
            "interval {}: {} probes {:.3} ± {:.3} ms, p99 {:.3} ms; {} references {:.3} ± {:.3} ms, p99 {:.3} ms",
            line["interval"],
            delays.len(),
            mean / 1e6,
            std / 1e6,
            p99 / 1e6,
            line["references"],
            refs("mean_ns") / 1e6,
            refs("std_dev_ns") / 1e6,
            ref_p99 / 1e6
        );
        let off = |x: f64, t: f64| (x / t - 1.0).abs();
        ensure!(off(ref_p99, p99) < 0.1, "p99 off in interval {}", line["interval"]);
        ensure!(off(refs("std_dev_ns"), std) < 0.1 && off(refs("mean_ns"), mean) < 0.1, "{line}");
        judged += 1;
    }
    ensure!(judged >= 1, "no interval judged");
    for (&ports, delays) in &truth {
        let (mean, std) = moments(delays);
        let (n, rli_mean, rli_std) = merged(&lines, ports, "rli");
        let (n_l, left_mean, left_std) = merged(&lines, ports, "rli_l");
        let err = |x: f64, t: f64| (x / t - 1.0) * 100.0;
        println!(
            "flow to {}: {} packets, {:.3} ± {:.3} ms; RLI {n}: {:.3} ± {:.3} ms ({:+.2} %, {:+.1} %); RLI-L {n_l}: {:.3} ± {:.3} ms ({:+.2} %, {:+.1} %)",
            ports.1,
            delays.len(),
            mean / 1e6,
            std / 1e6,
            rli_mean / 1e6,
            rli_std / 1e6,
            err(rli_mean, mean),
            err(rli_std, std),
            left_mean / 1e6,
            left_std / 1e6,
            err(left_mean, mean),
            err(left_std, std),
        );
        ensure!(n as f64 >= 0.99 * delays.len() as f64, "RLI interpolated {n} of {} packets", delays.len());
        ensure!(n_l as usize == delays.len(), "RLI-L counted {n_l} of {} packets", delays.len());
        ensure!(err(rli_mean, mean).abs() < 2.0 && err(rli_std, std).abs() < 5.0, "RLI off");
        ensure!(err(left_mean, mean).abs() < 2.0 && err(left_std, std).abs() < 5.0, "RLI-L off");
        // Replayed from the captures before D: the same references, the packets stamped a few
        // µs earlier than D's XDP did.
        let (n_r, replayed_mean, replayed_std) = merged(&replayed, ports, "rli");
        println!(
            "  replayed: RLI {n_r}: {:.3} ± {:.3} ms ({:+.3} %, {:+.3} % of live)",
            replayed_mean / 1e6,
            replayed_std / 1e6,
            err(replayed_mean, rli_mean),
            err(replayed_std, rli_std)
        );
        ensure!(n_r == n && err(replayed_mean, rli_mean).abs() < 0.2 && err(replayed_std, rli_std).abs() < 0.5);
    }
    Ok(())
}
