//! `cargo xtask demo`: builds the one-point testbed (client, vantage point, server; replies
//! return on a direct link, as behind a DSR load balancer), drives real clients against real
//! servers through it, and shows pirated's estimates — made from client→server packets only —
//! beside the latencies the clients measured themselves. Tears everything down on exit.

use std::time::Duration;

use anyhow::Result;
use pirate_tests::{
    clients::{redis_benchmark, wrk, ClientLatency},
    linkem::LinkSpec,
    servers::{nginx, redis},
    testbed::{batch_weighted_mean, By, Links, Of, OnePoint, Pirated, SERVER_IP, VP_CLIENT_IF},
};

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
            metrics = tb.vp.run(&["curl", "-sf", &format!("http://{}/metrics", pirated.listen)])?;
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
    Ok(())
}
