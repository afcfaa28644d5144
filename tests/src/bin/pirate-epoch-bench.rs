//! `cargo xtask bench epoch`: what one epoch costs the daemon as the flow table grows. The kernel
//! table is filled (through its mapping) with flows whose state comes from the datapath's own
//! per-packet code (`pirate::tracker::step`) run over request/response traffic, then each stage
//! of an epoch is timed as the daemon runs it: drain, estimate (the configured estimator, and
//! both for JSON), report (metrics; JSON lines to a sink). Printed for each table size side by
//! side, with the daemon's resident memory.

use std::{io::sink, time::Instant};

use anyhow::{bail, Result};
use clap::Parser;
use pirate_common::{
    ctx::PacketCtx,
    key::{FlowId, FlowKey, FAMILY_V4},
    parse::{IPPROTO_TCP, TCP_ACK},
    pirate::{
        config::MODES_COMPACT,
        flow::FlowState,
        table::{Set, WAYS},
        tracker::step,
    },
};
use pirated::{
    buffer,
    config::Config,
    datapath::Datapath,
    metrics::Metrics,
    pirate::{drain::Records, report::Scratch, step::Step},
    source::Kernel,
};

#[derive(Parser)]
struct Args {
    /// Flow-table sizes to measure, each filled completely (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "65536,1048576")]
    flows: Vec<u32>,
    /// Distinct servers the flows talk to.
    #[arg(long, default_value_t = 1000)]
    servers: u32,
    /// Epochs drained, estimated and published per table size (at least 2): the first, and
    /// the median of the others.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(2..))]
    epochs: u32,
    /// The share of the table's flows with packets in the epoch drained; the others were last
    /// active in the one before (a table of long-lived connections, most of them idle).
    #[arg(long, default_value_t = 1.0)]
    active: f64,
    /// Per-server latency histograms in the metrics (`metrics.histograms`).
    #[arg(long)]
    histograms: bool,
}

/// Distinct per-flow traffic shapes; flows reuse them under their own keys.
const TEMPLATES: u32 = 256;
/// The epoch every flow's state belongs to, closed by the drain.
const EPOCH: u32 = 1;

/// One TCP flow's epoch: batches of 1–3 requests paced 20–60 µs apart, each batch waiting
/// 1–16 ms for its response, acknowledged by its first request (the shape depends on `t`),
/// about 100 gaps.
fn template(t: u32, config: &Config) -> FlowState<MODES_COMPACT> {
    let params = config.pirate.params(config.max_flows);
    let mut st = FlowState::new(EPOCH);
    // HTTP/1.1 requests (what `pirate` reads of a flow's protocol: its first data) after an
    // Ethernet, IPv4 and TCP header.
    let mut frame = vec![0u8; 14 + 20 + 20];
    frame[14 + 20 + 12] = 5 << 4;
    frame.extend_from_slice(&[&b"GET / HTTP/1.1\r\n"[..], &[b'x'; 84]].concat());
    let mut pkt = PacketCtx { payload: 100, tcp_flags: TCP_ACK, l4_off: 34, ..PacketCtx::default() };
    pkt.key.proto = IPPROTO_TCP;
    let mut now = 1_000_000u64;
    let mut seed = 0x9e37_79b9u32.wrapping_mul(t + 1);
    let mut rand = move |n: u32| {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed % n
    };
    let service = 1_000_000 + (t % 16) as u64 * 1_000_000;
    for _ in 0..40 {
        pkt.ack = pkt.ack.wrapping_add(1000);
        for _ in 0..1 + rand(3) {
            now += 20_000 + rand(40_000) as u64;
            pkt.ts_ns = now;
            pkt.seq = pkt.seq.wrapping_add(100);
            step(&mut st, EPOCH, &pkt, &frame[..], &params, |_| {});
        }
        now += service + rand(200_000) as u64;
    }
    st
}

fn key(i: u32, servers: u32) -> FlowKey {
    let mut k = FlowKey {
        sport: 1024 + (i % 60000) as u16,
        dport: 80,
        proto: IPPROTO_TCP,
        family: FAMILY_V4,
        ..FlowKey::default()
    };
    k.src[..4].copy_from_slice(&[10, 100 + (i >> 24) as u8, (i >> 16) as u8, (i >> 8) as u8]);
    let s = i % servers;
    k.dst[..4].copy_from_slice(&[10, 200, (s >> 8) as u8, s as u8]);
    k
}

/// The process's resident and peak resident memory, MiB (/proc/self/status).
fn rss_mib() -> Result<(f64, f64)> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let field = |name: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .map_or(f64::NAN, |kib| kib / 1024.0)
    };
    Ok((field("VmRSS:"), field("VmHWM:")))
}

fn ms(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1e3
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mut base = Config::default();
    base.metrics.histograms = args.histograms;
    let templates: Vec<FlowState<MODES_COMPACT>> = (0..TEMPLATES).map(|t| template(t, &base)).collect();
    println!(
        "epoch benchmark: {} servers, {} gaps in {} modes per flow (template 0), {:.0} % of the flows active; {} CPUs",
        args.servers,
        templates[0].packets().saturating_sub(1),
        templates[0].modes.len,
        args.active * 100.0,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "{:>9} {:>8} {:>6} {:>9} {:>11} {:>11} {:>10} {:>10} {:>11} {:>10} {:>10}",
        "flows",
        "start ms",
        "epoch",
        "drain ms",
        "estimate ms",
        "metrics ms",
        "total ms",
        "json est",
        "json write",
        "RSS MiB",
        "peak MiB"
    );
    for &n in &args.flows {
        let config = Config { max_flows: n, ..base.clone() };
        config.validate()?;
        let mut dp = Datapath::load(&config.datapath())?;
        // The flows fill the sets' ways in order (where each lands does not matter to the
        // drain); the table's spare quarter stays empty.
        let mut records = Records::take(&mut dp)?;
        let table = records.maps().table();
        // Every flow whose spread index falls below the share is active.
        let active = |i: u32| (i.wrapping_mul(0x9e37_79b9) as f64) < args.active * u32::MAX as f64;
        let measured = (0..n).filter(|&i| active(i)).count();
        for i in 0..(n as usize).div_ceil(WAYS) {
            let flow = |w: usize| (i * WAYS + w) as u32;
            let set = Set::<MODES_COMPACT> {
                ids: std::array::from_fn(|w| match flow(w) < n {
                    true => table.id(&key(flow(w), args.servers)),
                    false => FlowId::default(),
                }),
                states: std::array::from_fn(|w| {
                    let mut state = templates[(flow(w) % TEMPLATES) as usize];
                    if !active(flow(w)) {
                        state.epoch = EPOCH - 1;
                    }
                    state
                }),
            };
            table.write(i, &set);
        }
        let counters = dp.counters()?;

        // As the daemon's loop runs it without JSON: the configured estimator's figures only,
        // each epoch filling the last one's vectors, sized at start for the table it finds.
        let (pipeline, mut metrics) =
            (Step::new(&config.pirate, false, config.metrics.histograms), Metrics::new(&config.metrics));
        let started = Instant::now();
        let tracked = records.tracked();
        let (mut flows, mut scratch) = (buffer::populated(tracked), Scratch::with_room(tracked));
        let start = ms(started);
        let mut runs = Vec::new();
        for _ in 0..args.epochs {
            let started = Instant::now();
            let drained = records.drain(EPOCH, flows)?;
            let drain = ms(started);
            if drained.flows.len() != measured {
                bail!("drained {} flows of {measured}", drained.flows.len());
            }
            let kernel = Kernel::new(counters, &drained);
            let started = Instant::now();
            let report = pipeline.run(EPOCH, drained.flows, scratch);
            let estimate = ms(started);
            let started = Instant::now();
            metrics.publish(&report, None, None, &kernel);
            let publish = ms(started);
            (flows, scratch) = report.into_buffers();
            runs.push([drain, estimate, publish]);
        }
        // With --output json: both estimators' figures, and every line written.
        let flows = records.drain(EPOCH, flows)?.flows;
        let started = Instant::now();
        let report = Step::new(&config.pirate, true, false).run(EPOCH, flows, scratch);
        let json_estimate = ms(started);
        let started = Instant::now();
        report.write_json(&mut sink())?;
        let json_write = ms(started);
        let (rss, peak) = rss_mib()?;
        // The first epoch after the start (which sized the vectors), and the median of the later
        // ones by total.
        let total = |r: &[f64; 3]| r.iter().sum::<f64>();
        let mut later = runs[1..].to_vec();
        later.sort_by(|a, b| total(a).total_cmp(&total(b)));
        let start = format!("{start:.1}");
        for (start, which, [drain, estimate, publish]) in
            [(start.as_str(), "first", runs[0]), ("", "later", later[later.len() / 2])]
        {
            println!(
                "{n:>9} {start:>8} {which:>6} {drain:>9.1} {estimate:>11.1} {publish:>11.1} {:>10.1} {json_estimate:>10.1} {json_write:>11.1} {rss:>10.0} {peak:>10.0}",
                drain + estimate + publish
            );
        }
    }
    Ok(())
}
