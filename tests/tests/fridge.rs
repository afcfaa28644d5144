//! The `fridge` program in the kernel (BPF_PROG_TEST_RUN through the whole chain): each class's
//! request and response frames make one sample of the class, with the delay between the two
//! runs; what matches nothing makes none; a full sample ring is counted, never silent; and every
//! frame passes unchanged.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use pirate_common::{
    counters,
    ctx::PacketCtx,
    fridge::{
        class::{DNS, ICMP_ECHO_CLASS, NAMES, TCP_FLOW, TCP_HANDSHAKE},
        Sample,
    },
    parse::{parse, TCP_ACK, TCP_SYN},
};
use pirate_tests::{
    capture::{Capture, Pcap},
    linkem::LinkSpec,
    servers::nginx,
    testbed::{metric, Links, OnePoint, Pirated, CLIENT_IF, SERVER_IP, VP_CLIENT_IF},
};
use pirated::{
    config::Config,
    datapath::{test_run::test_run, Datapath},
    fridge::config::FridgeClass,
    fridge::{samples::Samples, table::FridgeTable},
};

const XDP_PASS: u32 = 2;
const CLIENT: [u8; 4] = [10, 9, 0, 1];
const SERVER: [u8; 4] = [10, 9, 0, 2];
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const FIN: u8 = 0x01;

/// An Ethernet + IPv4 frame carrying `l4` as protocol `proto`.
fn ipv4(proto: u8, src: [u8; 4], dst: [u8; 4], l4: &[u8]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00, 0x45, 0];
    f.extend_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x40, 0, 64, proto, 0, 0]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    f.extend_from_slice(l4);
    f
}

fn tcp(src: ([u8; 4], u16), dst: ([u8; 4], u16), flags: u8, seq: u32, ack: u32) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(&src.1.to_be_bytes());
    h.extend_from_slice(&dst.1.to_be_bytes());
    h.extend_from_slice(&seq.to_be_bytes());
    h.extend_from_slice(&ack.to_be_bytes());
    h.extend_from_slice(&[0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
    ipv4(6, src.0, dst.0, &h)
}

/// A DNS message header (and a question's worth of bytes) over UDP.
fn dns(src: ([u8; 4], u16), dst: ([u8; 4], u16), txid: u16, response: bool) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(&src.1.to_be_bytes());
    h.extend_from_slice(&dst.1.to_be_bytes());
    h.extend_from_slice(&(8u16 + 29).to_be_bytes());
    h.extend_from_slice(&[0, 0]);
    h.extend_from_slice(&txid.to_be_bytes());
    h.extend_from_slice(&if response { [0x81, 0x80] } else { [0x01, 0x00] });
    h.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    h.extend_from_slice(b"\x07example\x03com\x00\x00\x01\x00\x01");
    ipv4(17, src.0, dst.0, &h)
}

fn echo(src: [u8; 4], dst: [u8; 4], reply: bool, ident: u16, seq: u16) -> Vec<u8> {
    let mut h = vec![if reply { 0 } else { 8 }, 0, 0, 0];
    h.extend_from_slice(&ident.to_be_bytes());
    h.extend_from_slice(&seq.to_be_bytes());
    h.extend_from_slice(&[0x5a; 16]);
    ipv4(1, src, dst, &h)
}

/// Runs the chain on each frame in turn, `gap` apart; each must pass unchanged.
fn run(dp: &Datapath, frames: &[Vec<u8>], gap: Duration) -> Result<()> {
    for (i, f) in frames.iter().enumerate() {
        if i > 0 {
            std::thread::sleep(gap);
        }
        let mut out = vec![0u8; 4096];
        let r = test_run(dp.root_fd()?, f, 1, &mut out)?;
        ensure!(r.verdict == XDP_PASS && out[..r.out_len] == f[..], "frame {i} did not pass unchanged");
    }
    Ok(())
}

fn config(classes: &[FridgeClass]) -> Config {
    let mut c = Config::default();
    c.fridge.classes = classes.to_vec();
    c
}

/// Runs a request and its response 3 ms apart, and returns the samples they made.
fn pair(dp: &Datapath, samples: &mut Samples, request: Vec<u8>, response: Vec<u8>) -> Result<Vec<Sample>> {
    let started = Instant::now();
    run(dp, &[request, response], Duration::from_millis(3))?;
    let took = started.elapsed();
    let got = samples.close()?.samples;
    for s in &got {
        let d = Duration::from_nanos(s.delay_ns);
        ensure!(
            d >= Duration::from_millis(3) && d <= took,
            "{}: delay {d:?}, runs {took:?} apart",
            NAMES[s.class as usize]
        );
    }
    Ok(got)
}

#[test]
fn each_class_pairs_its_request_and_response() -> Result<()> {
    let all = [FridgeClass::TcpHandshake, FridgeClass::Dns, FridgeClass::IcmpEcho, FridgeClass::TcpFlow];
    let mut dp = Datapath::load(&config(&all).datapath())?;
    let mut samples = Samples::take(&mut dp)?;
    let before = dp.counters()?;
    let (c, s) = ((CLIENT, 40000), (SERVER, 80));
    let classes = |got: &[Sample]| got.iter().map(|s| s.class).collect::<Vec<_>>();

    let got = pair(&dp, &mut samples, tcp(c, s, SYN, 1000, 0), tcp(s, c, SYN | ACK, 5000, 1001))?;
    ensure!(classes(&got) == [TCP_HANDSHAKE], "SYN → SYN/ACK: {got:?}");
    // Offered meanwhile: at most the flow the SYN opened too, if it went to the same fridge.
    ensure!(got[0].survived <= 1, "{got:?}");
    let got = pair(&dp, &mut samples, tcp(c, s, SYN, 7000, 0), tcp(c, s, ACK, 7001, 5001))?;
    ensure!(classes(&got) == [TCP_HANDSHAKE], "SYN → the client's ACK: {got:?}");
    let c2 = (CLIENT, 40002);
    let got = pair(&dp, &mut samples, tcp(c2, s, SYN, 9000, 0), tcp(s, c2, FIN | ACK, 5001, 9001))?;
    ensure!(classes(&got) == [TCP_FLOW], "SYN → the server's FIN: {got:?}");
    let got = pair(
        &dp,
        &mut samples,
        dns((CLIENT, 5353), (SERVER, 53), 0xbeef, false),
        dns((SERVER, 53), (CLIENT, 5353), 0xbeef, true),
    )?;
    ensure!(classes(&got) == [DNS], "query → response: {got:?}");
    let got = pair(&dp, &mut samples, echo(CLIENT, SERVER, false, 77, 1), echo(SERVER, CLIENT, true, 77, 1))?;
    ensure!(classes(&got) == [ICMP_ECHO_CLASS], "echo → reply: {got:?}");

    // Responses to other requests, and a second response to one answered: no sample.
    let got = pair(
        &dp,
        &mut samples,
        dns((CLIENT, 5353), (SERVER, 53), 1, false),
        dns((SERVER, 53), (CLIENT, 5353), 2, true),
    )?;
    ensure!(got.is_empty(), "another transaction id: {got:?}");
    let got = pair(&dp, &mut samples, echo(CLIENT, SERVER, false, 77, 2), echo(SERVER, CLIENT, true, 78, 2))?;
    ensure!(got.is_empty(), "another echo id: {got:?}");
    let got = pair(&dp, &mut samples, echo(SERVER, CLIENT, true, 77, 1), echo(SERVER, CLIENT, true, 77, 1))?;
    ensure!(got.is_empty(), "replies already matched: {got:?}");

    let after = dp.counters()?;
    let d = |i: u32| after[i as usize] - before[i as usize];
    ensure!(d(counters::EVENT_FRIDGE_SAMPLE_SENT) == 5 && d(counters::EVENT_FRIDGE_SAMPLE_LOST) == 0, "{after:?}");
    // `pirate` leaves the ICMP echoes (6 frames) to the fridge.
    ensure!(d(counters::UNSUPPORTED) == 6, "unsupported: {}", d(counters::UNSUPPORTED));
    Ok(())
}

#[test]
fn disabled_classes_make_no_samples() -> Result<()> {
    let mut dp = Datapath::load(&config(&[FridgeClass::Dns]).datapath())?;
    let mut samples = Samples::take(&mut dp)?;
    let (c, s) = ((CLIENT, 40001), (SERVER, 80));
    let got = pair(&dp, &mut samples, tcp(c, s, SYN, 1000, 0), tcp(s, c, SYN | ACK, 5000, 1001))?;
    ensure!(got.is_empty(), "{got:?}");
    let got = pair(&dp, &mut samples, echo(CLIENT, SERVER, false, 1, 1), echo(SERVER, CLIENT, true, 1, 1))?;
    ensure!(got.is_empty(), "{got:?}");
    let off = Config {
        fridge: pirated::fridge::config::FridgeConfig { enabled: false, ..Config::default().fridge },
        ..Config::default()
    };
    let mut dp = Datapath::load(&off.datapath())?;
    let mut samples = Samples::take(&mut dp)?;
    let got = pair(
        &dp,
        &mut samples,
        dns((CLIENT, 5353), (SERVER, 53), 9, false),
        dns((SERVER, 53), (CLIENT, 5353), 9, true),
    )?;
    ensure!(got.is_empty(), "fridge unchained: {got:?}");
    Ok(())
}

/// A ring too small for the samples between two reads: every sample the fridges make (as many
/// as the same frames make through the userspace fridges) is sent or counted lost.
#[test]
fn a_full_sample_ring_is_counted() -> Result<()> {
    let mut small = config(&[FridgeClass::Dns]);
    small.fridge.ring_bytes = 4096;
    let mut dp = Datapath::load(&small.datapath())?;
    let mut samples = Samples::take(&mut dp)?;
    let before = dp.counters()?;
    const PAIRS: u16 = 300;
    let queries: Vec<Vec<u8>> = (0..PAIRS).map(|i| dns((CLIENT, 5353), (SERVER, 53), i, false)).collect();
    let answers: Vec<Vec<u8>> = (0..PAIRS).map(|i| dns((SERVER, 53), (CLIENT, 5353), i, true)).collect();
    run(&dp, &queries, Duration::ZERO)?;
    run(&dp, &answers, Duration::ZERO)?;
    let after = dp.counters()?;
    let d = |i: u32| after[i as usize] - before[i as usize];
    let (sent, lost) = (d(counters::EVENT_FRIDGE_SAMPLE_SENT), d(counters::EVENT_FRIDGE_SAMPLE_LOST));
    // Every request enters (p starts at 1): only pairs whose slots collide go unmatched.
    let mut table = FridgeTable::new(small.fridge.shape(), 1);
    let mut made = 0u64;
    let mut pkt = PacketCtx::default();
    for (ts, f) in (1..).zip(queries.iter().chain(&answers)) {
        parse(f.as_slice(), &mut pkt).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        pkt.ts_ns = ts;
        table.packet(&pkt, |_| made += 1);
    }
    ensure!(sent + lost == made && lost > 0, "sent {sent}, lost {lost}; the same frames in userspace made {made}");
    let read = samples.close()?.samples.len() as u64;
    ensure!(read == sent, "read {read} of {sent} sent");
    Ok(())
}

/// Live, on the one-point testbed, where the vantage point sees client→server only (replies
/// return directly, 5 ms late): short connections' handshakes are paired SYN → client ACK, and
/// the fridges' median lands on the median handshake the client's own packets show, SYN to its
/// ACK as they left it (tcpdump at the client). curl's connect time, printed beside it, reads
/// the same and the client's scheduling besides: 1.5 ms more on a busy host.
#[test]
fn live_handshakes_pair_with_the_clients_acks() -> Result<()> {
    let tb = OnePoint::with(Links { return_path: true, ..Links::default() })?;
    let _nginx = nginx(&tb.server, &[("index.html", 100)])?;
    let emu =
        tb.return_path.as_ref().unwrap().start(&LinkSpec::delay(Duration::from_millis(5)), &LinkSpec::default(), 1)?;
    let pirated = Pirated::start(&tb.vp, VP_CLIENT_IF, "epoch = \"100ms\"\n[fridge]\nwindow = \"60s\"\n")?;
    const CONNECTIONS: usize = 60;
    let url = format!("http://{SERVER_IP}/index.html");
    let mut capture = Capture::start(&tb.client, CLIENT_IF, &["-Q", "out", "tcp"])?;
    let mut connect_s: Vec<f64> = (0..CONNECTIONS)
        .map(|_| {
            let out = tb.client.run(&["curl", "-sf", "-o", "/dev/null", "-w", "%{time_connect}", &url])?;
            out.trim().parse::<f64>().with_context(|| format!("curl printed {out:?}"))
        })
        .collect::<Result<_>>()?;
    connect_s.sort_by(f64::total_cmp);
    let curl_ms = connect_s[CONNECTIONS / 2] * 1e3;
    capture.stop()?;
    let mut handshakes = handshakes(&Pcap::parse(&std::fs::read(capture.path())?)?);
    ensure!(handshakes.len() == CONNECTIONS, "{} handshakes captured at the client", handshakes.len());
    handshakes.sort_by(f64::total_cmp);
    let truth_ms = handshakes[CONNECTIONS / 2] / 1e6;
    let line = pirated.wait_for(Duration::from_secs(5), |v| {
        v["type"] == "fridge_class"
            && v["class"] == "tcp-handshake"
            && v["window_samples"].as_u64().is_some_and(|n| n >= CONNECTIONS as u64)
    })?;
    let metrics = pirated.metrics(&tb.vp)?;
    drop(pirated);
    emu.stop()?;
    let p50_ms = line["quantiles_ns"]["p50"].as_f64().context("no p50")? / 1e6;
    eprintln!(
        "handshakes: fridge p50 {p50_ms:.3} ms, the client's packets' median {truth_ms:.3} ms, curl's median connect {curl_ms:.3} ms ({line})"
    );
    ensure!((p50_ms - truth_ms).abs() < 0.1 * truth_ms, "p50 {p50_ms:.3} ms, the client's {truth_ms:.3} ms");
    let samples = metric(&metrics, "pirated_fridge_samples_total{class=\"tcp-handshake\"}");
    ensure!(samples >= CONNECTIONS as f64, "{samples} samples in the metrics");
    // Every enabled class has its series, samples or not.
    ensure!(metric(&metrics, "pirated_fridge_pairs_per_second{class=\"dns\"}") == 0.0);
    Ok(())
}

/// Each TCP connection's handshake in a capture of a client's outgoing packets: its SYN to its
/// first ACK, in ns.
fn handshakes(pcap: &Pcap) -> Vec<f64> {
    let mut syns = std::collections::HashMap::new();
    let mut out = Vec::new();
    for r in &pcap.records {
        let Some(tcp) = r.tcp4() else { continue };
        let flags = r.data[tcp.port_at + 13];
        if flags & (TCP_SYN | TCP_ACK) == TCP_SYN {
            syns.insert(tcp.source, r.ts_ns);
        } else if flags & (TCP_SYN | TCP_ACK) == TCP_ACK {
            if let Some(syn) = syns.remove(&tcp.source) {
                out.push((r.ts_ns - syn) as f64);
            }
        }
    }
    out
}
