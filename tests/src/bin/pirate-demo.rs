//! `cargo xtask demo`: builds the one-point testbed (client, vantage point, server; replies
//! return on a direct link, as behind a DSR load balancer), drives real clients against real
//! servers through it, and shows pirated's estimates — made from client→server packets only —
//! beside the latencies the clients measured themselves. Then the fridges: on a testbed whose
//! vantage point mirrors both directions to a monitor port, short connections, DNS queries and
//! pings answered 1–100 ms late, their delay quantiles beside the pairs in a capture at the
//! client. Last, load balancing: pirated's forwarder spreads a VIP over four backends, one of
//! them slow, and the weights move away from it as Pirate measures it. Tears everything down on
//! exit.

use std::time::Duration;

use anyhow::{Context, Result};
use pirate_tests::{
    balancing::{self, Balanced},
    capture::Capture,
    clients::{dnsperf, http_keepalive, redis_benchmark, short_connections, wrk, ClientLatency},
    linkem::LinkSpec,
    pairs::{quantile, Pairs},
    servers::{nginx, redis, think_time_http, unbound},
    testbed::{batch_weighted_mean, By, Links, Of, OnePoint, Pirated, MONITOR_IF, SERVER_IP, VP_CLIENT_IF},
};
use serde_json::Value;

struct Case {
    name: &'static str,
    delay_ms: u64,
    port: u16,
    run: fn(&OnePoint) -> Result<ClientLatency>,
}

fn main() -> Result<()> {
    println!("pirated demo: client ─▶ vp (pirated, XDP) ─▶ server, replies return client ◀─ server directly\n");
    let tb = OnePoint::with(Links { return_path: true, ..Links::default() })?;
    let _nginx = nginx(&tb.server, &[("index.html", 612)])?;
    let _redis = redis(&tb.server)?;
    let cases = [
        Case {
            name: "HTTP/1.1 wrk → nginx, 1 connection",
            delay_ms: 2,
            port: 80,
            run: |tb| wrk(&tb.client, &format!("http://{SERVER_IP}/index.html"), 1, Duration::from_secs(3)),
        },
        Case {
            name: "HTTP/1.1 wrk → nginx, 4 connections",
            delay_ms: 10,
            port: 80,
            run: |tb| wrk(&tb.client, &format!("http://{SERVER_IP}/index.html"), 4, Duration::from_secs(3)),
        },
        Case {
            name: "Redis GET, 1 client",
            delay_ms: 5,
            port: 6379,
            run: |tb| redis_benchmark(&tb.client, SERVER_IP, 1, 500, 1),
        },
    ];
    let mut rows = Vec::new();
    let mut metrics = String::new();
    for (i, case) in cases.iter().enumerate() {
        println!("running: {} with {} ms added on the return path …", case.name, case.delay_ms);
        let emu = tb.return_path.as_ref().unwrap().start(
            &LinkSpec::delay(Duration::from_millis(case.delay_ms)),
            &LinkSpec::default(),
            1,
        )?;
        let mut pirated = Pirated::start(&tb.vp, VP_CLIENT_IF, "")?;
        let truth = (case.run)(&tb)?;
        if i == cases.len() - 1 {
            metrics = pirated.metrics(&tb.vp)?;
        }
        let lines = pirated.stop()?;
        emu.stop()?;
        rows.push((
            case,
            truth,
            batch_weighted_mean(&lines, Of::Server(&format!("{SERVER_IP}:{}", case.port)), By::Configured),
        ));
    }

    println!("\n{:<40} {:>14} {:>14} {:>9} {:>9}", "case", "client mean", "pirated", "error", "batches");
    for (case, truth, est) in &rows {
        match est {
            Some((est, batches)) => println!(
                "{:<40} {:>11.3} ms {:>11.3} ms {:>+8.2}% {:>9}",
                case.name,
                truth.mean * 1e3,
                est * 1e3,
                (est - truth.mean) / truth.mean * 100.0,
                batches
            ),
            None => println!("{:<40} {:>11.3} ms {:>14} ", case.name, truth.mean * 1e3, "no estimate"),
        }
    }
    println!("\nPrometheus exposition during the last case (GET /metrics, excerpt):");
    for line in metrics.lines().filter(|l| {
        !l.starts_with('#') && !l.contains("_bucket") && (l.contains("server_") || l.contains("packets_total"))
    }) {
        println!("  {line}");
    }
    println!("\nThe clients' figures come from the clients themselves (wrk's and redis-benchmark's own");
    println!("latency statistics); pirated saw only the client→server packets, at the vantage point.");
    fridges()?;
    balancing()
}

/// Latency-aware balancing: 16 keep-alive clients on a VIP whose backend 0 answers in 20 ms and
/// the others in 1 ms; each epoch's weights and measured latencies, and the requests' outcome.
fn balancing() -> Result<()> {
    const BACKENDS: usize = 4;
    println!("\nrunning: 16 keep-alive HTTP clients for 4 s on a VIP that pirate_lb balances over 4 backends;");
    println!("         backend 0 answers in 20 ms, the others in 1 ms …");
    let tb = Balanced::new(BACKENDS, &std::env::temp_dir().join(format!("pirate-demo-{}", std::process::id())))?;
    for (i, b) in tb.backends.iter().enumerate() {
        let service = Duration::from_millis(if i == 0 { 20 } else { 1 });
        think_time_http(b, balancing::VIP_PORT, &[(service, 1.0)], 7)?;
    }
    let mut pirated = tb.pirated(&format!("epoch = \"500ms\"\n{}", balancing::lb_config(BACKENDS, "")))?;
    let held = (0..16)
        .map(|_| http_keepalive(&tb.client, balancing::vip(), Duration::from_secs(4)))
        .collect::<Result<Vec<_>>>()?;
    let mut requests = 0;
    for h in held {
        requests += h.join().expect("a client panicked")?.len();
    }
    let lines = pirated.stop()?;
    let reals: Vec<String> = (0..BACKENDS).map(|i| balancing::backend_ip(i).to_string()).collect();
    println!("\n{:>5}  {}", "epoch", reals.iter().map(|r| format!("{r:>24}")).collect::<String>());
    let epochs: std::collections::BTreeSet<u64> =
        lines.iter().filter(|v| v["type"] == "real").filter_map(|v| v["epoch"].as_u64()).collect();
    for epoch in epochs.into_iter().take(10) {
        let cell = |real: &str| {
            let line = lines.iter().find(|v| v["type"] == "real" && v["epoch"] == epoch && v["real"] == real);
            line.map_or("-".to_string(), |v| {
                let latency = v["latency_s"].as_f64().map_or("-".to_string(), |s| format!("{:.1} ms", s * 1e3));
                format!("weight {:.2}, {latency}", v["weight"].as_f64().unwrap_or(f64::NAN))
            })
        };
        println!("{epoch:>5}  {}", reals.iter().map(|r| format!("{:>24}", cell(r))).collect::<String>());
    }
    println!("\n{requests} requests on connections established before the weights moved; none failed: the");
    println!("forwarder's connection table keeps each on its backend, and only new connections follow the weights.");
    Ok(())
}

/// Request→response delays: pirated's fridges (its default configuration) against the pairs
/// in a capture at the client.
fn fridges() -> Result<()> {
    const RATE: u32 = 100;
    let duration = Duration::from_secs(5);
    println!("\nrunning: short TCP connections, DNS queries (dnsperf → unbound) and pings, {RATE} a second each,");
    println!("         answered 1–100 ms late (log-uniform); pirated on a port mirroring both directions …");
    let tb = OnePoint::with(Links { server_side: true, span: true, ..Links::default() })?;
    let _nginx = nginx(&tb.server, &[("index.html", 612)])?;
    let _unbound = unbound(&tb.server)?;
    let delays = "delay=1ms,jitter=99ms,dist=loguniform".parse()?;
    let emu = tb.server_side.as_ref().unwrap().start(&LinkSpec::default(), &delays, 1)?;
    let mut pirated = Pirated::start(tb.monitor.as_ref().unwrap(), MONITOR_IF, "")?;
    let mut capture = Capture::start(&tb.client, "c-vp", &[])?;
    let server = format!("{SERVER_IP}:80").parse()?;
    let (interval, count) = (format!("{}", 1.0 / RATE as f64), (RATE as u64 * duration.as_secs()).to_string());
    std::thread::scope(|scope| -> Result<()> {
        let connections = scope.spawn(|| short_connections(&tb.client, server, RATE as f64, duration));
        let pings = scope.spawn(|| tb.client.run(&["ping", "-q", "-i", &interval, "-c", &count, SERVER_IP]));
        dnsperf(&tb.client, SERVER_IP, RATE, duration)?;
        connections.join().expect("the client panicked")?;
        pings.join().expect("ping panicked")?;
        Ok(())
    })?;
    std::thread::sleep(Duration::from_millis(200));
    let metrics = pirated.metrics(tb.monitor.as_ref().unwrap())?;
    let lines = pirated.stop()?;
    emu.stop()?;
    let mut truth = Pairs::of(&capture.frames()?)?;

    println!("\n{:<15} {:>6} {:>28} {:>28}", "class", "pairs", "capture p50 / p95 / p99", "pirated p50 / p95 / p99");
    for (class, delays) in
        [("tcp-handshake", &mut truth.handshakes), ("dns", &mut truth.dns), ("icmp-echo", &mut truth.echoes)]
    {
        let line = lines
            .iter()
            .rev()
            .find(|v| v["type"] == "fridge_class" && v["class"] == class)
            .with_context(|| format!("pirated reported no {class} delays"))?;
        let ms = |v: &Value| v.as_f64().map_or("-".to_string(), |ns| format!("{:.1}", ns / 1e6));
        let ours = ["p50", "p95", "p99"].map(|q| ms(&line["quantiles_ns"][q]));
        let theirs = [0.5, 0.95, 0.99].map(|q| format!("{:.1}", quantile(delays, q) / 1e6));
        println!("{class:<15} {:>6} {:>25} ms {:>25} ms", delays.len(), theirs.join(" / "), ours.join(" / "));
    }
    println!("\nPrometheus exposition of the fridges (GET /metrics, excerpt):");
    let mut excerpt: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("pirated_fridge_delay_quantile") || l.starts_with("pirated_fridge_pairs"))
        .collect();
    excerpt.sort_unstable();
    for line in excerpt {
        println!("  {line}");
    }
    Ok(())
}
