//! The fridges against ground truth on the testbed: short TCP connections and DNS queries from
//! real clients, answered by nginx and unbound after delays log-uniform over two decades, seen
//! by pirated on a monitor port (both directions); the truth is every request→response delay in
//! a capture at the client. The fridge is undersized on purpose, its requests' average lifetime
//! half the largest delays: the corrected tail must match the truth while the uncorrected one
//! falls visibly short of it.

use std::{net::SocketAddr, time::Duration};

use anyhow::{ensure, Context, Result};
use pirate_tests::{
    capture::Capture,
    clients::{dnsperf, short_connections},
    linkem::LinkSpec,
    pairs::{quantile, Pairs},
    servers::{nginx, unbound, DNS_NAME},
    testbed::{Links, OnePoint, Pirated, MONITOR_IF, SERVER_IP},
};
use serde_json::Value;

/// Requests per second of each class; with [`SLOTS`] slots entered with probability 1, a
/// request waits in the fridge 32 / 640 s = 50 ms on average.
const RATE: u32 = 320;
const SLOTS: u32 = 32;
const SECONDS: u64 = 20;
/// Responses leave the server's link after a delay log-uniform on 1 … 100 ms.
const DELAYS: &str = "delay=1ms,jitter=99ms,dist=loguniform";
const LARGEST_S: f64 = 0.1;

#[test]
fn undersized_fridge_corrects_the_tail() -> Result<()> {
    let tb = OnePoint::with(Links { server_side: true, span: true, ..Links::default() })?;
    let _nginx = nginx(&tb.server, &[("index.html", 100)])?;
    let _unbound = unbound(&tb.server)?;
    let emu = tb.server_side.as_ref().unwrap().start(&LinkSpec::default(), &DELAYS.parse()?, 7)?;
    // Neighbours resolved before the measurement starts.
    tb.client.run(&["curl", "-sf", "-o", "/dev/null", &format!("http://{SERVER_IP}/index.html")])?;
    tb.client.run(&["dig", "+short", "+tries=1", &format!("@{SERVER_IP}"), DNS_NAME])?;

    let monitor = tb.monitor.as_ref().unwrap();
    let config = format!(
        "epoch = \"1s\"\n[fridge]\nclasses = [\"tcp-handshake\", \"dns\"]\nwindow = \"120s\"\n\
         fridges = [{{ slots = {SLOTS}, p = 1.0 }}]\n"
    );
    let mut pirated = Pirated::start(monitor, MONITOR_IF, &config)?;
    let mut capture = Capture::start(&tb.client, "c-vp", &["tcp[tcpflags] & tcp-syn != 0 or (udp and port 53)"])?;
    let server: SocketAddr = format!("{SERVER_IP}:80").parse()?;
    let duration = Duration::from_secs(SECONDS);
    let (connections, queries) = std::thread::scope(|scope| {
        let connections = scope.spawn(|| short_connections(&tb.client, server, RATE as f64, duration));
        let queries = dnsperf(&tb.client, SERVER_IP, RATE, duration).map(|q| q.requests);
        (connections.join().expect("the client panicked"), queries)
    });
    let (connections, queries) = (connections?.len(), queries?);
    // The last responses (and an epoch) pass before pirated closes its window.
    std::thread::sleep(Duration::from_millis(300));
    let lines = pirated.stop()?;
    emu.stop()?;
    let mut truth = Pairs::of(&capture.frames()?)?;
    ensure!(truth.handshakes.len() == connections, "{} handshakes of {connections}", truth.handshakes.len());
    ensure!(truth.dns.len() as u64 == queries, "{} DNS pairs of {queries} queries", truth.dns.len());

    let last = |kind: &str, class: Option<&str>| -> Result<Value> {
        lines
            .iter()
            .rev()
            .find(|v| v["type"] == kind && class.is_none_or(|c| v["class"] == c))
            .cloned()
            .with_context(|| format!("no {kind} {class:?} line"))
    };
    let fridge = &last("fridges", None)?["fridges"][0];
    let lifetime_s = fridge["lifetime_s"].as_f64().context("no lifetime")?;
    eprintln!("fridge: {fridge}");
    ensure!(lifetime_s < LARGEST_S, "lifetime {lifetime_s:.3} s: the fridge is not undersized");
    for (class, delays) in [("tcp-handshake", &mut truth.handshakes), ("dns", &mut truth.dns)] {
        let line = last("fridge_class", Some(class))?;
        let pairs = delays.len();
        eprintln!("{class}: {pairs} pairs in the capture; pirated: {line}");
        let samples = line["window_samples"].as_u64().context("no samples")? as usize;
        ensure!(samples > pairs / 10 && samples < pairs * 9 / 10, "{class}: {samples} samples of {pairs} pairs");
        for (q, raw_below) in [(0.95, 0.8), (0.99, 1.0)] {
            let name = format!("p{}", q * 100.0);
            let truth_ns = quantile(delays, q);
            let corrected = line["quantiles_ns"][&name].as_f64().context("no quantile")?;
            let uncorrected = line["uncorrected_ns"][&name].as_f64().context("no uncorrected quantile")?;
            let error = corrected / truth_ns - 1.0;
            eprintln!(
                "  {name}: truth {:.2} ms, corrected {:.2} ms ({:+.1} %), uncorrected {:.2} ms ({:+.1} %)",
                truth_ns / 1e6,
                corrected / 1e6,
                error * 100.0,
                uncorrected / 1e6,
                (uncorrected / truth_ns - 1.0) * 100.0
            );
            ensure!(error.abs() < 0.10, "{class} {name}: corrected {corrected} ns against {truth_ns} ns");
            ensure!(
                uncorrected < raw_below * truth_ns,
                "{class} {name}: uncorrected {uncorrected} ns is not below {raw_below} x the truth"
            );
        }
    }
    Ok(())
}
