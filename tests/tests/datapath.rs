//! The XDP program on a real veth in the one-point testbed: it passes every packet, counts each
//! by outcome, and the gaps it measures match the sender's own clock.

use std::{
    net::UdpSocket,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};
use pirate_common::{
    ctx::PacketCtx,
    hash::FLOW_SEED,
    key::FlowKey,
    parse::parse,
    pirate::table::{sets_for, sets_of, WAYS},
};
use pirate_tests::testbed::{workspace_binary, OnePoint, PinRoot, Pirated, CLIENT_IP, SERVER_IP, VP_CLIENT_IF};
use serde_json::Value;

const CONFIG: &str = "epoch = \"200ms\"\n";

/// A UDP sink in the server namespace counting datagrams, so "passed" is observed at the far end.
fn udp_sink(tb: &OnePoint, port: u16) -> Result<Arc<AtomicU64>> {
    let sock = tb.server.run_in(|| UdpSocket::bind((SERVER_IP, port)))??;
    sock.set_read_timeout(Some(Duration::from_millis(200)))?;
    let received = Arc::new(AtomicU64::new(0));
    let r = received.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let idle_limit = Instant::now() + Duration::from_secs(60);
        while Instant::now() < idle_limit {
            if sock.recv(&mut buf).is_ok() {
                r.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    Ok(received)
}

/// A counter or gauge from a /metrics page, as a whole number.
fn metric(text: &str, name_and_labels: &str) -> u64 {
    pirate_tests::testbed::metric(text, name_and_labels) as u64
}

fn flow_lines<'a>(lines: &'a [Value], client: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    lines.iter().filter(move |v| v["type"] == "flow" && v["client"] == client)
}

/// The gaps of `client`'s flow lines, as the kernel's modes ([min, max, count, candidates,
/// sum]) hold them: how many, and their mean (ns).
fn mean_gap(lines: &[Value], client: &str) -> (f64, f64) {
    let modes = flow_lines(lines, client).flat_map(|f| f["modes"].as_array().into_iter().flatten());
    let (gaps, sum) =
        modes.fold((0.0, 0.0), |(n, s), m| (n + m[2].as_f64().unwrap_or(0.0), s + m[4].as_f64().unwrap_or(0.0)));
    (gaps, sum / gaps)
}

#[test]
fn counts_every_packet_and_passes_it() -> Result<()> {
    let tb = OnePoint::new()?;
    let received = udp_sink(&tb, 9000)?;
    let mut pirated = Pirated::start(&tb.vp, VP_CLIENT_IF, CONFIG)?;

    let sock = tb.client.run_in(|| UdpSocket::bind((CLIENT_IP, 0)))??;
    let sport = sock.local_addr()?.port();
    const N: u64 = 300;
    for i in 0..N {
        sock.send_to(&i.to_be_bytes(), (SERVER_IP, 9000))?;
        std::thread::sleep(Duration::from_micros(500));
    }
    // Non-UDP/TCP traffic: counted as unsupported, passed on too.
    tb.client.run(&["ping", "-c", "5", "-i", "0.05", "-q", SERVER_IP])?;
    std::thread::sleep(Duration::from_millis(700));
    let metrics = pirated.metrics(&tb.vp)?;
    let lines = pirated.stop()?;

    assert_eq!(received.load(Ordering::Relaxed), N, "every datagram must reach the server");
    let measured = metric(&metrics, "pirated_packets_total{outcome=\"measured\"}");
    let new_flows = metric(&metrics, "pirated_packets_total{outcome=\"new_flow\"}");
    assert_eq!(measured + new_flows, N, "UDP packets are the only measurable ones sent");
    assert_eq!(new_flows, 1);
    let epochs: Vec<(u64, u64)> = flow_lines(&lines, &format!("{CLIENT_IP}:{sport}"))
        .map(|v| (v["epoch"].as_u64().unwrap(), v["packets"].as_u64().unwrap()))
        .collect();
    let packets: u64 = epochs.iter().map(|e| e.1).sum();
    assert_eq!(packets, N, "the flow's packets over all epochs, (epoch, packets): {epochs:?}\n{metrics}");
    assert!(metric(&metrics, "pirated_packets_total{outcome=\"unsupported\"}") >= 5, "ICMP echo requests");
    assert_eq!(metric(&metrics, "pirated_packets_total{outcome=\"malformed\"}"), 0);
    Ok(())
}

/// One datagram per "request", spaced by a known interval, and nothing back: the flow's gaps, as
/// the kernel's modes hold them, average the sender's own mean spacing, timed on the sender's
/// clock, and no epoch of it has a figure (`udp`: nothing says a response came).
#[test]
fn udp_gaps_match_the_sender_clock_and_have_no_figure() -> Result<()> {
    let tb = OnePoint::new()?;
    let _received = udp_sink(&tb, 9001)?;
    let mut pirated = Pirated::start(&tb.vp, VP_CLIENT_IF, CONFIG)?;
    let sock = tb.client.run_in(|| UdpSocket::bind((CLIENT_IP, 0)))??;
    let sport = sock.local_addr()?.port();
    let spacing = Duration::from_millis(3);
    let mut sent = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1500) {
        sock.send_to(b"request", (SERVER_IP, 9001))?;
        sent.push(Instant::now());
        std::thread::sleep(spacing);
    }
    std::thread::sleep(Duration::from_millis(500));
    let lines = pirated.stop()?;
    let truth_ns = (sent[sent.len() - 1] - sent[0]).as_nanos() as f64 / (sent.len() - 1) as f64;
    let client = format!("{CLIENT_IP}:{sport}");
    let flows: Vec<&Value> = flow_lines(&lines, &client).collect();
    ensure!(flows.iter().all(|f| f["no_figure"] == "udp" && f["estimate_ns"].is_null()), "a figure: {flows:?}");
    // Every mode, [min, max, count, candidates, sum]: the gaps' count and sum.
    let modes = flows.iter().flat_map(|f| f["modes"].as_array().into_iter().flatten());
    let (gaps, sum) =
        modes.fold((0.0, 0.0), |(n, s), m| (n + m[2].as_f64().unwrap_or(0.0), s + m[4].as_f64().unwrap_or(0.0)));
    ensure!(gaps as usize >= sent.len() * 9 / 10, "{gaps} gaps of {}", sent.len() - 1);
    let err = (sum / gaps - truth_ns) / truth_ns;
    eprintln!("sender mean gap {truth_ns:.0} ns, the modes' {:.0} ns, error {:.3} %", sum / gaps, err * 100.0);
    ensure!(err.abs() < 0.01, "the modes' mean gap {:.0} ns vs the sender's {truth_ns:.0} ns", sum / gaps);
    Ok(())
}

/// Sends raw Ethernet frames out of `ifname` (from inside the calling thread's namespace).
fn send_frames(ifname: &str, frames: &[Vec<u8>]) -> Result<()> {
    // SAFETY: plain socket calls on a descriptor we own; addresses are valid for their lengths.
    unsafe {
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
        anyhow::ensure!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
        let name = std::ffi::CString::new(ifname)?;
        let mut addr: libc::sockaddr_ll = std::mem::zeroed();
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
        addr.sll_halen = 6;
        for f in frames {
            let sa = &addr as *const libc::sockaddr_ll as *const libc::sockaddr;
            let n = libc::sendto(fd, f.as_ptr().cast(), f.len(), 0, sa, size_of::<libc::sockaddr_ll>() as u32);
            anyhow::ensure!(n == f.len() as isize, "sendto: {}", std::io::Error::last_os_error());
        }
        libc::close(fd);
    }
    Ok(())
}

fn snmp_counter(tb_ns: &pirate_tests::netns::Netns, proto: &str, field: &str) -> Result<u64> {
    let text = tb_ns.run(&["cat", "/proc/net/snmp"])?;
    let mut rows = text.lines().filter(|l| l.starts_with(&format!("{proto}:")));
    let (names, values) = (rows.next().unwrap(), rows.next().unwrap());
    let i = names.split_whitespace().position(|n| n == field).unwrap();
    Ok(values.split_whitespace().nth(i).unwrap().parse()?)
}

/// Frames the parser must reject are counted as malformed and still handed to the kernel's
/// stack (which then counts them as its own header errors): pirated never drops a packet.
#[test]
fn malformed_frames_are_counted_and_passed() -> Result<()> {
    let tb = OnePoint::new()?;
    let mut pirated = Pirated::start(&tb.vp, VP_CLIENT_IF, CONFIG)?;
    let vp_mac: Vec<u8> = tb.vp.mac(VP_CLIENT_IF)?.split(':').map(|h| u8::from_str_radix(h, 16).unwrap()).collect();
    let mut base = Vec::new();
    base.extend_from_slice(&vp_mac);
    base.extend_from_slice(&[0x02, 0, 0, 0, 0, 9, 0x08, 0x00]);
    // IPv4 with IHL 3 (below the minimum of 5), then one whose total length is below its IHL.
    let mut bad_ihl = base.clone();
    bad_ihl.extend_from_slice(&[0x43, 0, 0, 40, 0, 0, 0, 0, 64, 6, 0, 0, 10, 201, 1, 1, 10, 201, 2, 2]);
    bad_ihl.resize(60, 0);
    let mut short_total = base.clone();
    short_total.extend_from_slice(&[0x45, 0, 0, 12, 0, 0, 0, 0, 64, 17, 0, 0, 10, 201, 1, 1, 10, 201, 2, 2]);
    short_total.resize(60, 0);
    let frames: Vec<Vec<u8>> = (0..50).flat_map(|_| [bad_ihl.clone(), short_total.clone()]).collect();
    let before = snmp_counter(&tb.vp, "Ip", "InHdrErrors")?;
    tb.client.run_in(|| send_frames("c-vp", &frames))??;
    std::thread::sleep(Duration::from_millis(500));
    let metrics = pirated.metrics(&tb.vp)?;
    let after = snmp_counter(&tb.vp, "Ip", "InHdrErrors")?;
    pirated.stop()?;
    assert_eq!(metric(&metrics, "pirated_packets_total{outcome=\"malformed\"}"), 100);
    assert_eq!(after - before, 100, "the kernel's IP layer saw every malformed frame");
    Ok(())
}

/// IPv6 end to end: TCP over IPv6 through the vantage point is measured like IPv4.
#[test]
fn ipv6_flows_are_measured() -> Result<()> {
    let tb = OnePoint::new()?;
    let _nginx = pirate_tests::servers::nginx(&tb.server, &[("small", 100)])?;
    // The responses here take ~0.1–0.4 ms, the handshake gap before them can take 3 ms: the
    // break between modes would take the responses for pacing; acknowledgement marks do not.
    let config = format!("{CONFIG}[pirate]\nmark_acked = true\n");
    let mut pirated = Pirated::start(&tb.vp, VP_CLIENT_IF, &config)?;
    let url = format!("http://[{}]/small", pirate_tests::testbed::SERVER_IP6);
    let urls: Vec<&str> = std::iter::repeat_n(url.as_str(), 30).collect();
    let mut args = vec!["curl", "-sf", "-o", "/dev/null"];
    args.extend(urls);
    tb.client.run(&args)?;
    std::thread::sleep(Duration::from_millis(300));
    let lines = pirated.stop()?;
    let server = format!("[{}]:80", pirate_tests::testbed::SERVER_IP6);
    let flows: Vec<&Value> = lines.iter().filter(|v| v["type"] == "flow" && v["server"] == server.as_str()).collect();
    assert!(!flows.is_empty(), "no IPv6 flow in {lines:?}");
    assert!(flows.iter().all(|v| v["client"].as_str().unwrap().starts_with("[fd00:201:1::1]:")));
    let packets: u64 = flows.iter().map(|v| v["packets"].as_u64().unwrap()).sum();
    // One connection: SYN, 30 requests, FIN; the pure ACKs between them are skipped.
    assert_eq!(packets, 32, "{flows:?}");
    let batches: u64 = flows.iter().filter_map(|v| v["batches"].as_u64()).sum();
    assert!(batches >= 28, "the requests' gaps are the batches: {flows:?}");
    let marked: u64 = flows.iter().flat_map(|v| v["modes"].as_array().unwrap()).map(|m| m[3].as_u64().unwrap()).sum();
    assert!(marked >= 29, "each request after a response has its ack advanced: {flows:?}");
    Ok(())
}

/// A flow table far smaller than the traffic: the table evicts, every packet still passes, and
/// the table never holds more than its capacity (the ways of the sets `max_flows` asks for).
#[test]
fn a_full_flow_table_evicts_and_passes() -> Result<()> {
    let tb = OnePoint::new()?;
    let received = udp_sink(&tb, 9002)?;
    let mut pirated = Pirated::start(&tb.vp, VP_CLIENT_IF, "epoch = \"200ms\"\nmax_flows = 16\n")?;
    const FLOWS: u64 = 200;
    // All sockets stay open, so no source port (and no flow) repeats.
    let mut socks = Vec::new();
    for _ in 0..3 * FLOWS {
        let sock = tb.client.run_in(|| UdpSocket::bind((CLIENT_IP, 0)))??;
        sock.send_to(b"x", (SERVER_IP, 9002))?;
        socks.push(sock);
    }
    std::thread::sleep(Duration::from_millis(500));
    let metrics = pirated.metrics(&tb.vp)?;
    pirated.stop()?;
    assert_eq!(received.load(Ordering::Relaxed), 3 * FLOWS, "every datagram reaches the server");
    let tracked = metric(&metrics, "pirated_flows_tracked");
    let capacity = (sets_for(16) as usize * WAYS) as u64;
    assert!((1..=capacity).contains(&tracked), "{tracked} flows tracked in a {capacity}-way table");
    // 600 distinct flows were each inserted into a small table: it evicted, never refused.
    assert_eq!(metric(&metrics, "pirated_packets_total{outcome=\"new_flow\"}"), 3 * FLOWS);
    assert_eq!(metric(&metrics, "pirated_packets_total{outcome=\"map_full\"}"), 0);
    // Every flow no longer in the table was evicted, and counted.
    assert_eq!(metric(&metrics, "pirated_flows_evicted_total"), 3 * FLOWS - tracked);
    Ok(())
}

/// The key the datapath parses from a UDP datagram from the client's port `sport` to the
/// server's port `dport`.
fn udp_key(sport: u16, dport: u16) -> Result<FlowKey> {
    let addr = |ip: &str| ip.parse::<std::net::Ipv4Addr>().map(|a| a.octets());
    let mut frame = vec![0u8; 12];
    frame.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 29, 0, 1, 0x40, 0, 64, 17, 0, 0]);
    frame.extend_from_slice(&addr(CLIENT_IP)?);
    frame.extend_from_slice(&addr(SERVER_IP)?);
    for word in [sport, dport, 9, 0] {
        frame.extend_from_slice(&word.to_be_bytes());
    }
    frame.push(b'x');
    let mut pkt = PacketCtx::default();
    parse(&frame[..], &mut pkt).map_err(|e| anyhow::anyhow!("the datagram does not parse: {e:?}"))?;
    Ok(pkt.key)
}

/// Flows crafted to share one pair of the flow table's sets under the published seed (what one
/// who read the source would aim with) spread over the table as any others do: the datapath
/// draws a seed of its own. (With the published seed, 48 such flows had the 16 ways of their
/// two sets between them, and evicted each other.)
#[test]
fn flows_aimed_at_one_set_with_the_published_seed_spread_out() -> Result<()> {
    const AIMED: usize = 48;
    let tb = OnePoint::new()?;
    let received = udp_sink(&tb, 9004)?;
    let mut pirated = Pirated::start(&tb.vp, VP_CLIENT_IF, "epoch = \"200ms\"\nmax_flows = 64\n")?;
    let sets = sets_for(64);
    let pair = |port: u16| -> Result<(u32, u32)> { Ok(sets_of(udp_key(port, 9004)?.flow_hash(FLOW_SEED), sets)) };
    let target = pair(20000)?;
    let mut ports = Vec::new();
    for port in 20000..=u16::MAX {
        let (a, b) = pair(port)?;
        if (a, b) == target || (b, a) == target {
            ports.push(port);
        }
        if ports.len() == AIMED {
            break;
        }
    }
    ensure!(ports.len() == AIMED, "only {} ports aim at sets {target:?} of {sets}", ports.len());
    for &port in &ports {
        let sock = tb.client.run_in(|| UdpSocket::bind((CLIENT_IP, port)))??;
        sock.send_to(b"x", (SERVER_IP, 9004))?;
    }
    std::thread::sleep(Duration::from_millis(500));
    let metrics = pirated.metrics(&tb.vp)?;
    pirated.stop()?;
    assert_eq!(received.load(Ordering::Relaxed), AIMED as u64, "every datagram reaches the server");
    let (tracked, evicted) =
        (metric(&metrics, "pirated_flows_tracked"), metric(&metrics, "pirated_flows_evicted_total"));
    eprintln!("{AIMED} flows aimed at 2 of {sets} sets: {tracked} tracked, {evicted} evicted");
    assert!(tracked as usize > 2 * WAYS + AIMED / 2, "{tracked} of {AIMED} aimed flows tracked: they hit their sets");
    Ok(())
}

/// The pins of `instance` under `root`, sorted.
fn pins(root: &std::path::Path, instance: &str) -> Result<Vec<String>> {
    let mut pins: Vec<String> = std::fs::read_dir(root.join(instance))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    pins.sort();
    Ok(pins)
}

fn attached(tb: &OnePoint) -> Result<bool> {
    Ok(tb.vp.ip(&["-d", "link", "show", VP_CLIENT_IF])?.contains("prog/xdp"))
}

/// pirated pins its maps and XDP link under <pin_root>/<instance> with the marker of their
/// layout; stopping it leaves the chain attached (`on_exit = "keep"`), and `pirated detach`
/// removes it.
#[test]
fn stopping_keeps_the_chain_attached_and_detach_removes_it() -> Result<()> {
    let tb = OnePoint::new()?;
    let root = PinRoot::new()?;
    let config = format!("{CONFIG}pin_root = \"{}\"\n", root.path.display());
    let mut pirated = Pirated::start(&tb.vp, VP_CLIENT_IF, &config)?;
    ensure!(attached(&tb)?, "no XDP program on {VP_CLIENT_IF}");
    let found = pins(&root.path, tb.vp.name())?;
    // Every map but the ring buffers, the layout marker and the link on the interface.
    let maps = [
        "CHAIN",
        "CONFIG",
        "COUNTERS",
        "CTX",
        "EPOCH",
        "FLOWS",
        "FLOWS_WIDE",
        "FORWARD",
        "FRIDGE_OFFERED",
        "FRIDGE_SHAPE",
        "FRIDGE_SLOTS",
        "LB_CONNS",
        "LB_COUNTERS",
        "LB_HALVES",
        "LB_REALS",
        "LB_RINGS",
        "LB_SHAPE",
        "LB_VIPS",
        "PIRATE_FLOW",
        "RLI_FLOWS",
        "RLI_REFS",
        "RLI_SHAPE",
        "RLI_WINDOW",
        "SEED",
        "SEGMENT_LDA",
        "SEGMENT_RDA",
        "SEGMENT_SEEN",
        "SEGMENT_SHAPE",
        "V6_NAMES",
    ];
    let (listed, rest) = found.split_at(maps.len().min(found.len()));
    ensure!(listed == maps, "pins: {found:?}");
    ensure!(rest.len() == 2 && rest[0].starts_with("layout-v"), "pins: {found:?}");
    ensure!(rest[1] == format!("link-{VP_CLIENT_IF}"), "pins: {found:?}");
    pirated.stop()?;
    ensure!(attached(&tb)?, "stopping detached the chain");
    ensure!(pins(&root.path, tb.vp.name())? == found, "stopping changed the pins");

    let file = std::env::temp_dir().join(format!("pirated-detach-{}.toml", std::process::id()));
    std::fs::write(&file, format!("instance = \"{}\"\n{config}", tb.vp.name()))?;
    tb.vp.run(&[workspace_binary("pirated")?.to_str().unwrap(), "detach", "--config", file.to_str().unwrap()])?;
    std::fs::remove_file(&file)?;
    ensure!(!attached(&tb)?, "`pirated detach` left the chain attached");
    ensure!(!root.path.join(tb.vp.name()).exists(), "`pirated detach` left pins");
    Ok(())
}

/// A flow sending steadily while pirated restarts twice, once stopped (SIGTERM) and once killed
/// (SIGKILL), each time started again at once: the chain stays attached and the maps are reused,
/// so every packet is measured exactly once over the three daemons' epochs, the flow is created
/// once, and its gaps after the restarts still match the sender's clock.
#[test]
fn restarts_keep_every_flows_state_under_traffic() -> Result<()> {
    let tb = OnePoint::new()?;
    let _received = udp_sink(&tb, 9003)?;
    let root = PinRoot::new()?;
    let config = format!("epoch = \"500ms\"\npin_root = \"{}\"\n", root.path.display());
    let sock = tb.client.run_in(|| UdpSocket::bind((CLIENT_IP, 0)))??;
    let client = format!("{CLIENT_IP}:{}", sock.local_addr()?.port());
    let spacing = Duration::from_millis(2);
    let mut first = Pirated::start(&tb.vp, VP_CLIENT_IF, &config)?;
    let sender = std::thread::spawn(move || -> Result<Vec<Instant>> {
        let mut sent = Vec::new();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(7) {
            sock.send_to(b"request", (SERVER_IP, 9003))?;
            sent.push(Instant::now());
            std::thread::sleep(spacing);
        }
        Ok(sent)
    });
    let of_flow = |v: &Value| v["type"] == "flow" && v["client"] == client.as_str();
    first.wait_for(Duration::from_secs(5), of_flow)?;
    let mut lines = first.stop()?;
    let mut second = Pirated::start(&tb.vp, VP_CLIENT_IF, &config)?;
    // Killed right after it reported an epoch, not while it flips and drains the next one (an
    // epoch it had closed but not reported would be lost with it).
    second.wait_for(Duration::from_secs(5), of_flow)?;
    lines.extend(second.kill()?);
    let mut third = Pirated::start(&tb.vp, VP_CLIENT_IF, &format!("{config}on_exit = \"detach\"\n"))?;
    let sent = sender.join().unwrap()?;
    // The counters as published once the epoch holding the last packet has closed.
    let scrape = || third.metrics(&tb.vp);
    let open = metric(&scrape()?, "pirated_epochs_total");
    let deadline = Instant::now() + Duration::from_secs(5);
    let metrics = loop {
        let text = scrape()?;
        if metric(&text, "pirated_epochs_total") > open {
            break text;
        }
        ensure!(Instant::now() < deadline, "no epoch closed within 5 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    let after: Vec<Value> = third.stop()?;
    lines.extend(after.iter().cloned());

    let epochs: Vec<(u64, u64)> =
        flow_lines(&lines, &client).map(|v| (v["epoch"].as_u64().unwrap(), v["packets"].as_u64().unwrap())).collect();
    let packets: u64 = epochs.iter().map(|e| e.1).sum();
    ensure!(
        packets == sent.len() as u64,
        "{packets} packets measured of {} sent; (epoch, packets): {epochs:?}",
        sent.len()
    );
    let mut numbers: Vec<u64> = epochs.iter().map(|e| e.0).collect();
    numbers.dedup();
    ensure!(numbers.len() == epochs.len(), "an epoch reported twice: {epochs:?}");
    // The pinned counters span all three daemons: one flow, created once, every packet counted.
    let new_flows = metric(&metrics, "pirated_packets_total{outcome=\"new_flow\"}");
    let measured = metric(&metrics, "pirated_packets_total{outcome=\"measured\"}");
    ensure!(new_flows == 1, "the flow was created {new_flows} times");
    ensure!(new_flows + measured == sent.len() as u64, "{measured} measured + 1 of {} sent", sent.len());

    // The third daemon's epochs after its first (which holds the epoch the second was killed in),
    // against the sender's gaps before the same packets: every packet is counted once, so those
    // epochs' packets are the sender's last, each with its gap from the one before. A busy
    // machine stalls the sender while a daemon loads, which the whole run's mean would hold and
    // these epochs not.
    let first = flow_lines(&after, &client).filter_map(|v| v["epoch"].as_u64()).min().context("no epoch")?;
    let later: Vec<Value> =
        after.iter().filter(|v| !(of_flow(v) && v["epoch"].as_u64() == Some(first))).cloned().collect();
    let later_packets: u64 = flow_lines(&later, &client).filter_map(|v| v["packets"].as_u64()).sum();
    let all_gaps: Vec<f64> = sent.windows(2).map(|w| (w[1] - w[0]).as_nanos() as f64).collect();
    let gaps = &all_gaps[all_gaps.len().saturating_sub(later_packets as usize)..];
    ensure!(gaps.len() > 100, "{} gaps after the third daemon's first epoch", gaps.len());
    let truth_ns = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let (measured_gaps, mean) = mean_gap(&later, &client);
    ensure!(measured_gaps > 100.0, "{measured_gaps} gaps in the modes after the restarts");
    let err = (mean - truth_ns) / truth_ns;
    eprintln!(
        "{} packets over {} epochs of 3 daemons; after the restarts {measured_gaps} gaps in the modes, their mean {mean:.0} ns vs the sender's {truth_ns:.0} ns ({:+.3} %)",
        sent.len(),
        epochs.len(),
        err * 100.0
    );
    ensure!(err.abs() < 0.01, "the modes' mean gap after the restarts {mean:.0} ns vs the sender's {truth_ns:.0} ns");
    Ok(())
}

/// The kernel's id of the map pinned at `path`.
fn map_id(path: &std::path::Path) -> Result<u64> {
    let out = std::process::Command::new("bpftool").args(["-j", "map", "show", "pinned"]).arg(path).output()?;
    ensure!(
        out.status.success(),
        "bpftool map show pinned {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout)?["id"].as_u64().context("no map id")
}

/// A start with another map layout (a bigger flow table) begins with fresh maps under a new
/// layout marker, while `FORWARD`, where balancers registered, is the same map as before; the
/// chain stays attached throughout.
#[test]
fn a_layout_change_starts_fresh_and_keeps_forward() -> Result<()> {
    let tb = OnePoint::new()?;
    let root = PinRoot::new()?;
    let config = format!("{CONFIG}pin_root = \"{}\"\n", root.path.display());
    let dir = root.path.join(tb.vp.name());
    Pirated::start(&tb.vp, VP_CLIENT_IF, &config)?.stop()?;
    let (forward, flows) = (map_id(&dir.join("FORWARD"))?, map_id(&dir.join("FLOWS"))?);
    let before = pins(&root.path, tb.vp.name())?;
    Pirated::start(&tb.vp, VP_CLIENT_IF, &format!("{config}max_flows = 1024\n"))?.stop()?;
    let after = pins(&root.path, tb.vp.name())?;
    ensure!(attached(&tb)?, "the chain left the interface");
    ensure!(map_id(&dir.join("FORWARD"))? == forward, "FORWARD was replaced");
    ensure!(map_id(&dir.join("FLOWS"))? != flows, "the flow table of the old layout was reused");
    let marker = |pins: &[String]| pins.iter().filter(|p| p.starts_with("layout-")).cloned().collect::<Vec<_>>();
    let defaults = pirated::config::Config::default();
    let segment = defaults.segment.spec();
    let (lda, rda) = (segment.lda_entries, segment.rda_entries);
    let expected = format!(
        "layout-v{}-compact-flows1024-fridge{}-lb1x{}-segment{lda}x{rda}-rli{}",
        pirate_common::maps::LAYOUT_VERSION,
        defaults.fridge.shape().slots(),
        defaults.lb.max_connections,
        defaults.rli.spec(pirated::rli::config::Point::Neither).max_flows
    );
    ensure!(marker(&after) == [expected], "markers {:?} (before {:?})", marker(&after), marker(&before));
    ensure!(after.len() == before.len(), "pins before {before:?}, after {after:?}");
    Ok(())
}

/// A second instance on an interface the first one's chain holds fails, saying so, and leaves the
/// first one measuring.
#[test]
fn a_second_instance_on_the_interface_names_the_cause() -> Result<()> {
    let tb = OnePoint::new()?;
    let _received = udp_sink(&tb, 9004)?;
    let mut first = Pirated::start(&tb.vp, VP_CLIENT_IF, CONFIG)?;
    let file = std::env::temp_dir().join(format!("pirated-second-{}.toml", std::process::id()));
    std::fs::write(&file, format!("interface = \"{VP_CLIENT_IF}\"\ninstance = \"second\"\n"))?;
    let bin = workspace_binary("pirated")?;
    let out = tb
        .vp
        .command(&[bin.to_str().unwrap(), "run", "--config", file.to_str().unwrap(), "--listen", "127.0.0.1:9465"])
        .output()?;
    std::fs::remove_file(&file)?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.code() == Some(1), "the second instance did not fail: {err}");
    ensure!(err.contains(&format!("interface \"{VP_CLIENT_IF}\" already has an XDP program")), "{err}");
    ensure!(!err.contains("falling back"), "a busy interface is no reason to try generic mode: {err}");
    // The first instance still measures.
    let sock = tb.client.run_in(|| UdpSocket::bind((CLIENT_IP, 0)))??;
    let client = format!("{CLIENT_IP}:{}", sock.local_addr()?.port());
    for _ in 0..20 {
        sock.send_to(b"x", (SERVER_IP, 9004))?;
        std::thread::sleep(Duration::from_millis(2));
    }
    first.wait_for(Duration::from_secs(5), |v| v["type"] == "flow" && v["client"] == client.as_str())?;
    first.stop()?;
    Ok(())
}

/// Under `ip netns exec` with the default pin root, pirated mounts a bpffs of its own in the
/// command's own mount namespace, which ends with it: it says at start that nothing will be
/// kept, never that it left the chain attached, and the next start begins with new maps.
#[test]
fn a_pin_root_that_ends_with_the_process_promises_nothing() -> Result<()> {
    use std::{
        io::{BufRead, BufReader},
        process::Stdio,
    };
    let tb = OnePoint::new()?;
    let run = |instance: &str| -> Result<String> {
        let config = std::env::temp_dir().join(format!("pirated-volatile-{}-{instance}.toml", std::process::id()));
        std::fs::write(&config, format!("{CONFIG}instance = \"{instance}\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n"))?;
        let pirated = workspace_binary("pirated")?;
        let (pirated, config_path) = (pirated.to_str().context("path")?, config.to_str().context("path")?);
        let mut child = tb
            .vp
            .command(&[pirated, "run", "--interface", VP_CLIENT_IF, "--config", config_path])
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()?;
        let mut said = String::new();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        for line in lines.by_ref() {
            let line = line?;
            said.push_str(&line);
            said.push('\n');
            if line.contains("attached") || line.starts_with("pirated: error") {
                break;
            }
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        for line in lines {
            said.push_str(&line?);
            said.push('\n');
        }
        child.wait()?;
        std::fs::remove_file(&config)?;
        Ok(said)
    };
    let instance = format!("volatile{}", std::process::id());
    let first = run(&instance)?;
    ensure!(first.contains("the pins will not outlive this pirated"), "no word of it at start:\n{first}");
    ensure!(first.contains("nothing stays attached or pinned"), "no word of it at exit:\n{first}");
    ensure!(!first.contains("left the chain attached"), "a promise it cannot keep:\n{first}");
    // The namespace's mounts go when its last process has: the link with them, soon after.
    let gone = Instant::now() + Duration::from_secs(5);
    while attached(&tb)? {
        ensure!(Instant::now() < gone, "the chain outlived its bpffs");
        std::thread::sleep(Duration::from_millis(50));
    }
    let second = run(&instance)?;
    ensure!(second.contains("maps=\"new\""), "the second start found state:\n{second}");
    Ok(())
}
