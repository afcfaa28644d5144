//! Pirate's estimates against the clients' own measurements, through the one-point testbed with
//! the response delay emulated on the direct return link.

use std::time::Duration;

use anyhow::Result;
use pirate_tests::{
    clients::wrk,
    linkem::LinkSpec,
    servers::nginx,
    testbed::{Links, OnePoint, Pirated, SERVER_IP, VP_CLIENT_IF},
};
use serde_json::Value;

/// The batch-weighted mean of pirated's per-server estimates for `server` over a run, seconds.
fn server_mean(lines: &[Value], server: &str) -> Option<f64> {
    let (mut total, mut batches) = (0.0, 0u64);
    for v in lines.iter().filter(|v| v["type"] == "server" && v["server"] == server) {
        let b = v["batches"].as_u64()?;
        total += v["estimate_ns"].as_f64()? * b as f64;
        batches += b;
    }
    (batches > 0).then(|| total / batches as f64 / 1e9)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One request in flight (wrk, one connection) and single-packet responses from nginx, at
/// emulated response delays of 1–20 ms: median |relative error| ≤ 1 %.
#[test]
fn one_in_flight_single_packet_responses() -> Result<()> {
    let tb = OnePoint::with(Links { return_path: true, ..Links::default() })?;
    let _nginx = nginx(&tb.server, &[("small", 100)])?;
    let mut errors = Vec::new();
    for delay_ms in [1u64, 2, 5, 10, 20] {
        let emu = tb.return_path.as_ref().unwrap().start(
            &LinkSpec::delay(Duration::from_millis(delay_ms)),
            &LinkSpec::default(),
            delay_ms,
        )?;
        let mut pirated = Pirated::start(&tb.vp, VP_CLIENT_IF, "")?;
        let truth = wrk(&tb.client, &format!("http://{SERVER_IP}/small"), 1, Duration::from_secs(3))?;
        let lines = pirated.stop()?;
        emu.stop()?;
        if std::env::var_os("PIRATE_TEST_DUMP").is_some() {
            lines.iter().for_each(|l| eprintln!("{l}"));
        }
        let est = server_mean(&lines, &format!("{SERVER_IP}:80")).expect("no server estimate");
        let err = (est - truth.mean) / truth.mean;
        eprintln!(
            "delay {delay_ms:>2} ms: wrk mean {:.3} ms over {} requests, pirated {:.3} ms, error {:+.2} %",
            truth.mean * 1e3,
            truth.requests,
            est * 1e3,
            err * 100.0
        );
        errors.push(err.abs());
    }
    let m = median(errors.clone());
    eprintln!("median |relative error| {:.2} %", m * 100.0);
    assert!(m <= 0.01, "median |relative error| {:.2} % > 1 % ({errors:?})", m * 100.0);
    Ok(())
}
