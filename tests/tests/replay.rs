//! Replay runs the datapath's own code: a capture of the packets the XDP program saw, replayed
//! through `pirated replay`, must give the same flows, the same packet counts, the same
//! estimates and the same fridge samples (up to the capture's timestamps differing from the XDP
//! program's by microseconds).

use std::{collections::BTreeMap, time::Duration};

use anyhow::{bail, Context, Result};
use pirate_tests::{
    capture::Capture,
    linkem::LinkSpec,
    servers::nginx,
    testbed::{workspace_binary, Links, OnePoint, Pirated, SERVER_IP, VP_CLIENT_IF},
};
use serde_json::Value;

/// One long epoch, closed when pirated stops: both sides then cover exactly the same packets.
const CONFIG: &str = "epoch = \"60s\"\n";

fn by_flow(lines: &[Value]) -> BTreeMap<String, Value> {
    lines
        .iter()
        .filter(|v| v["type"] == "flow")
        .map(|v| (format!("{} {} {}", v["proto"], v["client"], v["server"]), v.clone()))
        .collect()
}

#[test]
fn replay_of_a_capture_matches_the_kernel() -> Result<()> {
    // Responses 5 ms late: delays far above the microseconds between the two clocks.
    let tb = OnePoint::with(Links { return_path: true, ..Links::default() })?;
    let emu =
        tb.return_path.as_ref().unwrap().start(&LinkSpec::delay(Duration::from_millis(5)), &LinkSpec::default(), 1)?;
    let _nginx = nginx(&tb.server, &[("small", 200), ("large", 30_000)])?;
    let mut pirated = Pirated::start(&tb.vp, VP_CLIENT_IF, CONFIG)?;
    let mut capture = Capture::start(&tb.vp, VP_CLIENT_IF, &["-Q", "in"])?;

    // Keep-alive HTTP with small and multi-packet responses (the client ACKs the large ones),
    // on three connections one after another.
    for _ in 0..3 {
        let mut args = vec!["curl".to_string(), "-sf".into(), "-o".into(), "/dev/null".into()];
        for i in 0..40 {
            let file = if i % 3 == 0 { "large" } else { "small" };
            args.push(format!("http://{SERVER_IP}/{file}"));
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        tb.client.run(&argv)?;
    }
    std::thread::sleep(Duration::from_millis(300));
    let kernel_lines = pirated.stop()?;
    emu.stop()?;
    let kernel = by_flow(&kernel_lines);
    capture.stop()?;

    let cfg = std::env::temp_dir().join(format!("pirate-replay-{}.toml", std::process::id()));
    std::fs::write(&cfg, CONFIG)?;
    let out = std::process::Command::new(workspace_binary("pirated")?)
        .args(["replay", "--pcap", capture.path().to_str().unwrap(), "--config", cfg.to_str().unwrap()])
        .output()?;
    let _ = std::fs::remove_file(&cfg);
    if !out.status.success() {
        bail!("replay failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let lines: Vec<Value> =
        String::from_utf8(out.stdout)?.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    let replayed = by_flow(&lines);

    let http: Vec<&String> = kernel.keys().filter(|k| k.contains(":80\"")).collect();
    assert_eq!(http.len(), 3, "three HTTP connections in {:?}", kernel.keys());
    for key in http {
        let (k, r) =
            (&kernel[key], replayed.get(key).with_context(|| format!("{key} missing from replay: {replayed:?}"))?);
        eprintln!("kernel {k}\nreplay {r}");
        assert_eq!(k["packets"], r["packets"], "{key}: packets");
        // A gap within the timestamps' difference of δ may count as a causal pair on one side only.
        let (ks, rs) = (k["samples"].as_i64().unwrap(), r["samples"].as_i64().unwrap());
        assert!((ks - rs).abs() <= 2, "{key}: causal-pair samples {ks} in the kernel, {rs} in replay");
        let (ke, re) = (k["estimate_ns"].as_f64().unwrap(), r["estimate_ns"].as_f64().unwrap());
        assert!((ke - re).abs() / ke < 0.02, "{key}: estimate {ke} in the kernel, {re} in replay");
    }
    // The fridges: the same handshakes (SYN → the client's ACK), every one sampled (p starts
    // at 1), with the same delays.
    let handshakes =
        |lines: &[Value]| lines.iter().find(|v| v["type"] == "fridge_class" && v["class"] == "tcp-handshake").cloned();
    let (k, r) =
        (handshakes(&kernel_lines).context("no fridge line live")?, handshakes(&lines).context("none in replay")?);
    eprintln!("kernel {k}\nreplay {r}");
    assert_eq!(k["window_samples"], 3, "three connections' handshakes");
    assert_eq!(k["window_samples"], r["window_samples"]);
    for q in ["p50", "p99.9"] {
        let (kq, rq) = (k["quantiles_ns"][q].as_f64().unwrap(), r["quantiles_ns"][q].as_f64().unwrap());
        assert!((kq - rq).abs() / kq < 0.02, "handshake {q}: {kq} ns in the kernel, {rq} ns in replay");
    }
    Ok(())
}
