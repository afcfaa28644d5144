//! Replay runs the datapath's own code: a capture of the packets the XDP program saw, replayed
//! through `pirated replay`, must give the same flows, the same packet counts, the same
//! estimates and the same fridge samples (up to the capture's timestamps differing from the XDP
//! program's by microseconds). The same capture in every form replay reads (pcapng, either byte
//! order, µs, an FCS, cooked and raw-IP link types, VLAN tags, standard input) must give exactly
//! the same figures; corrupt and distant timestamps, a truncated file, a capture with nothing to
//! measure and one too large to hold are each met as `pirated replay` promises.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{self, BufWriter, Read, Write},
    net::SocketAddrV4,
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        atomic::{AtomicU32, Ordering},
        OnceLock,
    },
    time::{Duration, Instant},
};

use anyhow::{anyhow, ensure, Context, Result};
use pirate_tests::{
    capture::{Capture, Pcap, PcapFormat, Record, Tcp4, LINKTYPE_ETHERNET, PCAP_HEADER_LEN, RECORD_HEADER_LEN},
    linkem::LinkSpec,
    removed::Removed,
    servers::nginx,
    stalls::undisturbed,
    testbed::{exit_within_polling, workspace_binary, Links, OnePoint, Pirated, SERVER_IP, VP_CLIENT_IF},
};
use serde_json::Value;

/// One long epoch, closed when pirated stops: both sides then cover exactly the same packets.
const CONFIG: &str = "epoch = \"60s\"\n";
/// Epochs short enough for a day to hold millions: a replay that stepped through the empty ones,
/// or allocated for them, would show it.
const SHORT_EPOCHS: &str = "epoch = \"10ms\"\n";
/// How long a replay of the live capture (or less) may take; the 2 GiB one gets `LARGE_LIMIT`.
const QUICK: Duration = Duration::from_secs(10);
const LARGE_LIMIT: Duration = Duration::from_secs(300);
/// A replay's peak resident memory, whatever the capture's size.
const MAX_RSS_KIB: u64 = 100 * 1024;
const DAY_NS: u64 = 86_400_000_000_000;
/// A corrupt timestamp: 50 years ahead (still within pcap's 32-bit seconds).
const FAR_NS: u64 = 50 * 365 * DAY_NS;
const ETH_HEADER_LEN: usize = 14;
const ETH_MACS_LEN: usize = 12;
const LINKTYPE_RAW: u32 = 101;
const LINKTYPE_LINUX_SLL: u32 = 113;
const LINKTYPE_LINUX_SLL2: u32 = 276;
/// Connections made of one capture's are numbered over these client ports of each address.
const FIRST_PORT: u64 = 1024;
const PORTS: u64 = 65_536 - FIRST_PORT;

fn by_flow(lines: &[Value]) -> BTreeMap<String, Value> {
    lines
        .iter()
        .filter(|v| v["type"] == "flow")
        .map(|v| (format!("{} {} {}", v["proto"], v["client"], v["server"]), v.clone()))
        .collect()
}

/// What the live scenario left: the kernel's JSON lines and tcpdump's capture (the file's bytes).
struct Live {
    kernel: Vec<Value>,
    pcap: Vec<u8>,
}

/// The live scenario is run again, [`LIVE_RUNS`] times at most, while the host stalled for more
/// than this share of it ([`undisturbed`]): tcpdump may then have stamped packets milliseconds
/// after the kernel's program did, and replay reads tcpdump's stamps; its estimates, within
/// 2 %, move by at most that share.
const STALLED_SHARE: f64 = 0.005;
const LIVE_RUNS: usize = 3;

/// The live scenario, run once per test binary: every test here replays its capture.
fn live() -> &'static Live {
    static LIVE: OnceLock<Live> = OnceLock::new();
    LIVE.get_or_init(|| {
        undisturbed(STALLED_SHARE, LIVE_RUNS, run_live).unwrap_or_else(|e| panic!("the live scenario: {e:#}"))
    })
}

/// Keep-alive HTTP with small and multi-packet responses (the client ACKs the large ones), on
/// three connections one after another, responses 5 ms late (delays far above the microseconds
/// between the XDP program's clock and tcpdump's), measured by pirated and captured by tcpdump on
/// the same interface.
fn run_live() -> Result<Live> {
    let tb = OnePoint::with(Links { return_path: true, ..Links::default() })?;
    let emu =
        tb.return_path.as_ref().unwrap().start(&LinkSpec::delay(Duration::from_millis(5)), &LinkSpec::default(), 1)?;
    let _nginx = nginx(&tb.server, &[("small", 200), ("large", 30_000)])?;
    let mut pirated = Pirated::start(&tb.vp, VP_CLIENT_IF, CONFIG)?;
    let mut capture = Capture::start(&tb.vp, VP_CLIENT_IF, &["-Q", "in"])?;
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
    let kernel = pirated.stop()?;
    emu.stop()?;
    capture.stop()?;
    Ok(Live { kernel, pcap: std::fs::read(capture.path())? })
}

/// A path in the temporary directory for a file a tool will write, removed when dropped.
fn reserve(ext: &str) -> Removed {
    static COUNT: AtomicU32 = AtomicU32::new(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    Removed(std::env::temp_dir().join(format!("pirate-replay-{}-{n}.{ext}", std::process::id())))
}

/// A file holding `bytes`, removed when dropped.
fn temp_file(ext: &str, bytes: &[u8]) -> Result<Removed> {
    let file = reserve(ext);
    std::fs::write(&file.0, bytes)?;
    Ok(file)
}

/// What `pirated replay` reads: a file, or what a writer thread puts on its standard input.
enum Input<'a> {
    File(&'a Path),
    Stdin(Feed<'a>),
}

/// Writes a capture to replay's standard input.
type Feed<'a> = Box<dyn FnOnce(&mut dyn Write) -> io::Result<()> + Send + 'a>;

/// A finished replay: how it ended, what it printed, its peak resident memory (KiB), how long it
/// took.
struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    max_rss_kib: u64,
    elapsed: Duration,
}

impl Run {
    fn succeeded(self) -> Result<Run> {
        ensure!(self.status.success(), "replay {}: {}", self.status, self.stderr);
        Ok(self)
    }

    fn lines(&self) -> Result<Vec<Value>> {
        Ok(self.stdout.lines().map(serde_json::from_str).collect::<Result<_, _>>()?)
    }

    /// The last line: what the replay read, replayed and refused.
    fn summary(&self) -> Result<Value> {
        let last = self.stdout.lines().last().context("replay printed nothing")?;
        let summary: Value = serde_json::from_str(last)?;
        ensure!(summary["type"] == "capture", "the last line is no capture summary: {last}");
        Ok(summary)
    }

    /// Fails unless the replay's peak memory stayed under `MAX_RSS_KIB`.
    fn check_memory(&self) -> Result<()> {
        ensure!(self.max_rss_kib < MAX_RSS_KIB, "the replay peaked at {} KiB", self.max_rss_kib);
        Ok(())
    }
}

/// Runs `pirated replay` on `input` with `config` (TOML), killing it once `limit` has passed.
fn replay(input: Input, config: &str, limit: Duration) -> Result<Run> {
    let pcap = match &input {
        Input::File(path) => path.as_os_str().to_owned(),
        Input::Stdin(_) => "-".into(),
    };
    run_pirated(&["replay".as_ref(), "--pcap".as_ref(), &pcap], input, config, limit)
}

/// Runs pirated with `args` and `--config` `config` (TOML) on `input`, killing it once `limit`
/// has passed.
fn run_pirated(args: &[&std::ffi::OsStr], input: Input, config: &str, limit: Duration) -> Result<Run> {
    let cfg = temp_file("toml", config.as_bytes())?;
    let start = Instant::now();
    let mut child = Command::new(workspace_binary("pirated")?)
        .args(args)
        .arg("--config")
        .arg(&cfg.0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawning pirated replay")?;
    let stdin = child.stdin.take().unwrap();
    let (mut stdout, mut stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    std::thread::scope(|s| {
        let fed = s.spawn(move || match input {
            Input::File(_) => Ok(()),
            Input::Stdin(feed) => {
                let mut w = BufWriter::with_capacity(1 << 20, stdin);
                feed(&mut w).and_then(|()| w.flush())
            }
        });
        let out = s.spawn(move || {
            let mut text = String::new();
            stdout.read_to_string(&mut text).map(|_| text)
        });
        let err = s.spawn(move || {
            let mut text = String::new();
            stderr.read_to_string(&mut text).map(|_| text)
        });
        let reaped = reap(&mut child, limit);
        let elapsed = start.elapsed();
        let (fed, stdout, stderr) = (fed.join().unwrap(), out.join().unwrap()?, err.join().unwrap()?);
        let (status, max_rss_kib) =
            reaped.with_context(|| format!("pirated {args:?}, killed after {limit:?}; stderr: {stderr}"))?;
        // A replay that stopped reading says why in its status and stderr.
        if let Err(e) = fed {
            ensure!(e.kind() == io::ErrorKind::BrokenPipe, "feeding the capture: {e}");
        }
        Ok(Run { status, stdout, stderr, max_rss_kib, elapsed })
    })
}

/// Waits for `child`, killing it once `limit` has passed (an error): its exit status and peak
/// resident memory (KiB). The peak is the child's own high-water mark (VmHWM), read every 10 ms
/// while it runs: wait4's would include the test process's peak, which posix_spawn lends the
/// child until it execs.
fn reap(child: &mut Child, limit: Duration) -> Result<(ExitStatus, u64)> {
    let (proc_status, mut peak) = (format!("/proc/{}/status", child.id()), 0);
    let status = exit_within_polling(child, limit, || {
        let hwm = std::fs::read_to_string(&proc_status).ok().and_then(|status| {
            status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().strip_suffix("kB")?.trim().parse().ok()
        });
        peak = hwm.unwrap_or(0).max(peak);
    })?;
    Ok((status, peak))
}

/// Makes `r`, TCP segment `t` of the capture, one of connection `id`: from port
/// `FIRST_PORT + id % PORTS` of the address `id / PORTS` above its original client's.
fn renumber(r: &mut Record, t: &Tcp4, id: u64) {
    let addr = u32::from(*t.source.ip()) + (id / PORTS) as u32;
    r.data[t.addr_at..t.addr_at + 4].copy_from_slice(&addr.to_be_bytes());
    r.data[t.port_at..t.port_at + 2].copy_from_slice(&((FIRST_PORT + id % PORTS) as u16).to_be_bytes());
}

/// The frames a summary says were refused for `reason` (none where it does not name it).
fn refused(summary: &Value, reason: &str) -> u64 {
    summary["refused"][reason].as_u64().unwrap_or(0)
}

/// The figures every way of reading a capture must reproduce exactly: its flow and fridge_class
/// lines, as JSON text, as a set (lines of one epoch come in no fixed order).
fn figures(lines: &[Value]) -> BTreeSet<String> {
    lines.iter().filter(|v| v["type"] == "flow" || v["type"] == "fridge_class").map(Value::to_string).collect()
}

/// How `run`, the same capture in another form, differs from `reference`: it failed, did not
/// read to the end, replayed other frames, or gave other figures.
fn differs(reference: &Run, run: &Run) -> Result<Option<String>> {
    if !run.status.success() {
        return Ok(Some(format!("{}: {}", run.status, run.stderr.trim())));
    }
    let (want, got) = (reference.summary()?, run.summary()?);
    if got["complete"] != true || got["replayed"] != want["replayed"] {
        return Ok(Some(format!("summary {got}, not like {want}")));
    }
    let (want, got) = (figures(&reference.lines()?), figures(&run.lines()?));
    Ok((want != got).then(|| {
        let (missing, extra) = (want.difference(&got).next(), got.difference(&want).next());
        format!("{} figures differ; first missing {missing:?}, first unexpected {extra:?}", want.len())
    }))
}

/// The capture at `path` rewritten as pcapng by Wireshark's editcap.
fn editcap_pcapng(path: &Path) -> Result<Removed> {
    let out = reserve("pcapng");
    let status = Command::new("editcap")
        .args(["-F", "pcapng"])
        .arg(path)
        .arg(&out.0)
        .status()
        .map_err(|e| anyhow!("running editcap: {e} (it comes with wireshark-common: run scripts/setup.sh)"))?;
    ensure!(status.success(), "editcap -F pcapng {}: {status}", path.display());
    ensure!(std::fs::read(&out.0)?.starts_with(&[0x0a, 0x0d, 0x0d, 0x0a]), "editcap wrote no pcapng section header");
    Ok(out)
}

/// The Ethernet capture on `link_type`: each frame's Ethernet header replaced by `header(frame)`.
fn relinked(pcap: &Pcap, link_type: u32, header: fn(&Record) -> Vec<u8>) -> Pcap {
    pcap.map(link_type, |r| Some(r.reframed(ETH_HEADER_LEN, &header(r))))
}

/// The IPv4 capture's packets as IPv6 (fd00::<IPv4 address>, transport unchanged), with
/// `options` a hop-by-hop and a destination options header (8 bytes each, padding only) before
/// the transport header.
fn as_ipv6(pcap: &Pcap, options: bool) -> Pcap {
    pcap.map(pcap.link_type, |r| {
        let d = &r.data;
        let ihl = usize::from(d[ETH_HEADER_LEN] & 0x0f) * 4;
        let (total, proto) = (usize::from(u16::from_be_bytes([d[16], d[17]])), d[23]);
        let address = |at: usize| [&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0][..], &d[at..at + 4]].concat();
        let pad_n = [1, 4, 0, 0, 0, 0];
        let ext = match options {
            true => [&[60, 0][..], &pad_n, &[proto, 0], &pad_n].concat(),
            false => Vec::new(),
        };
        let next = if options { 0 } else { proto };
        let length = ((total - ihl + ext.len()) as u16).to_be_bytes();
        let head = [&d[..ETH_MACS_LEN], &[0x86, 0xdd, 0x60, 0, 0, 0], &length, &[next, 64]].concat();
        let head = [head, address(26), address(30), ext].concat();
        Some(r.reframed(ETH_HEADER_LEN + ihl, &head))
    })
}

/// A Linux cooked (v1) header for an Ethernet record: sent to us, from its source MAC, of its
/// ethertype.
fn cooked_v1(r: &Record) -> Vec<u8> {
    [&[0, 0, 0, 1, 0, 6][..], &r.data[6..12], &[0, 0], &r.data[12..14]].concat()
}

/// The same in a cooked v2 header (protocol first; interface index 2).
fn cooked_v2(r: &Record) -> Vec<u8> {
    [&r.data[12..14], &[0, 0, 0, 0, 0, 2, 0, 1, 0, 6][..], &r.data[6..12], &[0, 0]].concat()
}

/// The capture with `tags` (802.1Q or QinQ) after each frame's MACs.
fn tagged(pcap: &Pcap, tags: &[u8]) -> Pcap {
    pcap.map(pcap.link_type, |r| Some(r.reframed(ETH_MACS_LEN, &[&r.data[..ETH_MACS_LEN], tags].concat())))
}

/// The capture with a 4-byte FCS ending each frame, announced in the header, as a NIC that keeps
/// it delivers it: a frame the snapshot length cut lost its FCS with its tail. Readers do not
/// check its value.
fn with_fcs(pcap: &Pcap) -> Pcap {
    let mut out = pcap.map(pcap.link_type, |r| {
        let mut r = r.clone();
        if r.data.len() == r.len as usize {
            r.data.extend_from_slice(&[0xfc; 4]);
        }
        r.len += 4;
        Some(r)
    });
    out.format.fcs_len = 4;
    out
}

#[test]
fn replay_of_a_capture_matches_the_kernel() -> Result<()> {
    let live = live();
    let kernel = by_flow(&live.kernel);
    let file = temp_file("pcap", &live.pcap)?;
    let lines = replay(Input::File(&file.0), CONFIG, QUICK)?.succeeded()?.lines()?;
    let replayed = by_flow(&lines);

    let http: Vec<&String> = kernel.keys().filter(|k| k.contains(":80\"")).collect();
    assert_eq!(http.len(), 3, "three HTTP connections in {:?}", kernel.keys());
    // How far tcpdump's stamps lie from the kernel's on the same packets, as the handshakes'
    // round trips (SYN to the client's ACK) show it: the fridges' delays are those round trips.
    let mut stamps_apart = 0.0f64;
    for key in &http {
        let rtt = |lines: &BTreeMap<String, Value>| lines.get(*key).and_then(|f| f["handshake_rtt_ns"].as_f64());
        let (k, r) = (rtt(&kernel).context("no handshake in the kernel")?, rtt(&replayed).context("none in replay")?);
        stamps_apart = stamps_apart.max((k - r).abs());
    }
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
        (handshakes(&live.kernel).context("no fridge line live")?, handshakes(&lines).context("none in replay")?);
    eprintln!("kernel {k}\nreplay {r}");
    assert_eq!(k["window_samples"], 3, "three connections' handshakes");
    assert_eq!(k["window_samples"], r["window_samples"]);
    for q in ["p50", "p99.9"] {
        let (kq, rq) = (k["quantiles_ns"][q].as_f64().unwrap(), r["quantiles_ns"][q].as_f64().unwrap());
        assert!(
            (kq - rq).abs() < 0.02 * kq + stamps_apart,
            "handshake {q}: {kq} ns in the kernel, {rq} ns in replay, the round trips {stamps_apart} ns apart"
        );
    }
    Ok(())
}

/// tcpdump's capture (classic pcap, ns, Ethernet) rewritten in every form replay reads, each
/// replayed: the same frames replayed, exactly the same flow and fridge lines.
#[test]
fn every_capture_format_replays_to_the_same_figures() -> Result<()> {
    let live = live();
    let pcap = Pcap::parse(&live.pcap)?;
    ensure!(pcap.link_type == LINKTYPE_ETHERNET && pcap.format.nanos, "tcpdump wrote {:?}", pcap.format);
    let original = temp_file("pcap", &live.pcap)?;
    let reference = replay(Input::File(&original.0), CONFIG, QUICK)?.succeeded()?;
    ensure!(reference.lines()?.iter().any(|v| v["type"] == "flow"), "the capture replays to no flow");

    let big_endian = Pcap { format: PcapFormat { big_endian: true, ..pcap.format }, ..pcap.clone() };
    let variants = [
        ("big-endian", big_endian.to_bytes()?),
        ("Ethernet with FCS", with_fcs(&pcap).to_bytes()?),
        ("Linux cooked v1", relinked(&pcap, LINKTYPE_LINUX_SLL, cooked_v1).to_bytes()?),
        ("Linux cooked v2", relinked(&pcap, LINKTYPE_LINUX_SLL2, cooked_v2).to_bytes()?),
        ("802.1Q", tagged(&pcap, &[0x81, 0x00, 0x00, 100]).to_bytes()?),
        ("QinQ", tagged(&pcap, &[0x88, 0xa8, 0x00, 200, 0x81, 0x00, 0x00, 100]).to_bytes()?),
    ];
    let mut failures = Vec::new();
    let mut check = |name: &str, reference: &Run, run: Run| -> Result<()> {
        let verdict = differs(reference, &run)?;
        eprintln!("{name}: {}", verdict.as_deref().unwrap_or("the same figures"));
        failures.extend(verdict.map(|v| format!("{name}: {v}")));
        Ok(())
    };
    let pcapng = editcap_pcapng(&original.0)?;
    check("pcapng (editcap)", &reference, replay(Input::File(&pcapng.0), CONFIG, QUICK)?)?;
    for (name, bytes) in variants {
        let file = temp_file("pcap", &bytes)?;
        check(name, &reference, replay(Input::File(&file.0), CONFIG, QUICK)?)?;
    }
    let stdin = replay(Input::Stdin(Box::new(|w| w.write_all(&live.pcap))), CONFIG, QUICK)?;
    check("standard input", &reference, stdin)?;
    // Forms the capture cannot take unchanged, each against the Ethernet capture of the same
    // records: IPv6 with a hop-by-hop and a destination options header against plain IPv6, a
    // raw-IP capture holds IP packets only (this one lacks the ARP frames), µs timestamps are
    // whole µs.
    let ip = pcap.map(pcap.link_type, |r| matches!(r.ethertype(), 0x0800 | 0x86dd).then(|| r.clone()));
    let whole_us = pcap.map(pcap.link_type, |r| Some(Record { ts_ns: r.ts_ns / 1000 * 1000, ..r.clone() }));
    let pairs = [
        ("IPv6 extension headers", as_ipv6(&ip, false), as_ipv6(&ip, true)),
        ("raw IP", ip.clone(), relinked(&ip, LINKTYPE_RAW, |_| Vec::new())),
        ("µs timestamps", whole_us.clone(), Pcap { format: PcapFormat { nanos: false, ..pcap.format }, ..whole_us }),
    ];
    for (name, ethernet, variant) in pairs {
        let (ethernet, variant) = (temp_file("pcap", &ethernet.to_bytes()?)?, temp_file("pcap", &variant.to_bytes()?)?);
        let reference = replay(Input::File(&ethernet.0), CONFIG, QUICK)?.succeeded()?;
        ensure!(reference.lines()?.iter().any(|v| v["type"] == "flow"), "{name}: the reference replays to no flow");
        check(name, &reference, replay(Input::File(&variant.0), CONFIG, QUICK)?)?;
    }
    assert!(failures.is_empty(), "replay differs from the classic pcap's:\n{}", failures.join("\n"));
    Ok(())
}

/// A timestamp decades ahead in a record, or a day between two halves of a capture: the record
/// is refused, the halves replayed, neither in time nor memory proportional to the epochs
/// between.
#[test]
fn corrupt_and_distant_timestamps_neither_abort_nor_allocate() -> Result<()> {
    let live = live();
    let pcap = Pcap::parse(&live.pcap)?;
    let n = pcap.records.len();

    // Five TCP segments, the third stamped decades ahead: refused, quickly.
    let mut five = pcap.map(pcap.link_type, |r| r.tcp4().is_some().then(|| r.clone()));
    five.records.truncate(5);
    five.records[2].ts_ns += FAR_NS;
    let file = temp_file("pcap", &five.to_bytes()?)?;
    let run = replay(Input::File(&file.0), SHORT_EPOCHS, QUICK)?.succeeded()?;
    let summary = run.summary()?;
    eprintln!("five records, one far ahead: {summary} in {:?}", run.elapsed);
    assert_eq!(summary["frames"], 5, "{summary}");
    assert_eq!(refused(&summary, "timestamp"), 1, "{summary}");
    assert_eq!(summary["replayed"], 4, "{summary}");

    // A request in the middle of the live capture stamped decades ahead: only its flow changes,
    // by that one packet.
    let clean = replay(Input::File(&temp_file("pcap", &live.pcap)?.0), CONFIG, QUICK)?.succeeded()?;
    let mid = (n / 2..n).find(|&i| pcap.records[i].tcp4().is_some_and(|t| t.payload > 0)).context("no request")?;
    let client = pcap.records[mid].tcp4().unwrap().source.to_string();
    let mut corrupt = pcap.clone();
    corrupt.records[mid].ts_ns += FAR_NS;
    let run = replay(Input::File(&temp_file("pcap", &corrupt.to_bytes()?)?.0), CONFIG, QUICK)?.succeeded()?;
    let summary = run.summary()?;
    eprintln!("record {mid} of {n} far ahead: {summary}");
    assert_eq!((summary["frames"].as_u64(), summary["complete"].as_bool()), (Some(n as u64), Some(true)), "{summary}");
    assert_eq!(refused(&summary, "timestamp"), 1, "{summary}");
    let (want, got) = (by_flow(&clean.lines()?), by_flow(&run.lines()?));
    assert_eq!(want.keys().collect::<Vec<_>>(), got.keys().collect::<Vec<_>>());
    for (key, w) in &want {
        if w["client"] == client.as_str() {
            assert_eq!(got[key]["packets"].as_u64(), w["packets"].as_u64().map(|p| p - 1), "{key}: one packet fewer");
        } else {
            assert_eq!(&got[key], w, "{key}");
        }
    }

    // The second half a day later, in 10 ms epochs: no record refused, every connection (the
    // first only in the first half, the last only in the second) measured, in constant memory.
    let mut apart = pcap.clone();
    apart.records[n / 2..].iter_mut().for_each(|r| r.ts_ns += DAY_NS);
    let run = replay(Input::File(&temp_file("pcap", &apart.to_bytes()?)?.0), SHORT_EPOCHS, QUICK)?.succeeded()?;
    let summary = run.summary()?;
    eprintln!("halves a day apart: {summary} in {:?}, peak {} KiB", run.elapsed, run.max_rss_kib);
    assert_eq!((summary["frames"].as_u64(), summary["complete"].as_bool()), (Some(n as u64), Some(true)), "{summary}");
    assert_eq!(refused(&summary, "timestamp"), 0, "{summary}");
    let measured: BTreeSet<String> = run
        .lines()?
        .iter()
        .filter(|v| v["type"] == "flow" && v["proto"] == "tcp")
        .filter_map(|v| v["client"].as_str().map(str::to_string))
        .collect();
    let connections: BTreeSet<String> =
        pcap.records.iter().filter_map(|r| r.tcp4()).map(|t| t.source.to_string()).collect();
    assert_eq!(measured, connections, "the connections with a flow line");
    run.check_memory()
}

/// 300 000 flows whose packets carry one timestamp (a capture's coarse clock ties them) beyond
/// `max_flows` are forgotten as any others are: down to the limit, in flat memory and quickly
/// (forgetting only the strictly older ones kept them all, and scanned every flow for each new
/// one: over a minute).
#[test]
fn flows_tied_on_a_timestamp_are_evicted_as_others_are() -> Result<()> {
    const FLOWS: u64 = 300_000;
    const MAX_FLOWS: u64 = 1024;
    let pcap = Pcap::parse(&live().pcap)?;
    let request = pcap.records.iter().find(|r| r.tcp4().is_some_and(|t| t.payload > 0)).context("no request")?;
    let t = request.tcp4().unwrap();
    let feed = |out: &mut dyn Write| -> io::Result<()> {
        let mut w = pcap.writer(out)?;
        let mut r = request.clone();
        for id in 0..FLOWS {
            renumber(&mut r, &t, id);
            w.record(&r)?;
        }
        Ok(())
    };
    let run = replay(Input::Stdin(Box::new(feed)), &format!("{CONFIG}max_flows = {MAX_FLOWS}\n"), QUICK)?;
    eprintln!("{FLOWS} flows at one instant: {} in {:?}, peak {} KiB", run.status, run.elapsed, run.max_rss_kib);
    let run = run.succeeded()?;
    let summary = run.summary()?;
    let evicted = summary["flows_evicted"].as_u64().context("no flows_evicted")?;
    assert!(evicted >= FLOWS - MAX_FLOWS - MAX_FLOWS / 4, "{evicted} flows forgotten: {summary}");
    run.check_memory()
}

/// A downstream capture that starts long before the upstream one (3000 intervals of D alone):
/// `replay-segment` keeps no record of what it cannot reconcile, so its memory stays flat (it
/// kept a record of each of D's intervals until U's first: 150 KiB each here), and the
/// intervals both captures hold are measured.
#[test]
fn replay_segment_keeps_memory_flat_before_the_upstream_capture_starts() -> Result<()> {
    const INTERVAL_NS: u64 = 100_000_000;
    const ALONE: u64 = 3000;
    let pcap = Pcap::parse(&live().pcap)?;
    let requests: Vec<&Record> = pcap.records.iter().filter(|r| r.tcp4().is_some_and(|t| t.payload > 0)).collect();
    ensure!(requests.len() >= 4, "{} requests in the live capture", requests.len());
    let start = requests[0].ts_ns.next_multiple_of(INTERVAL_NS);
    let at = |r: &Record, ts_ns: u64| Record { ts_ns, ..r.clone() };
    // Both points see the requests in the last two intervals, D 1 ms after U.
    let shared = |delay: u64| -> Vec<Record> {
        let base = start + ALONE * INTERVAL_NS;
        requests
            .iter()
            .enumerate()
            .map(|(i, r)| at(r, base + i as u64 * 2 * INTERVAL_NS / requests.len() as u64 + delay))
            .collect()
    };
    let up = Pcap { records: shared(0), ..pcap.clone() };
    let mut down = pcap.clone();
    down.records =
        (0..ALONE).map(|i| at(requests[(i % requests.len() as u64) as usize], start + i * INTERVAL_NS)).collect();
    down.records.extend(shared(1_000_000));
    let (up, down) = (temp_file("pcap", &up.to_bytes()?)?, temp_file("pcap", &down.to_bytes()?)?);
    let args: [&std::ffi::OsStr; 7] = [
        "replay-segment".as_ref(),
        "--tai-offset".as_ref(),
        "0".as_ref(),
        "--up".as_ref(),
        up.0.as_os_str(),
        "--down".as_ref(),
        down.0.as_os_str(),
    ];
    // The key file is not read: replay-segment needs no key.
    let config = "[segment]\nrole = \"down\"\nkey_file = \"/nonexistent\"\ninterval = \"100ms\"\n";
    let run = run_pirated(&args, Input::File(&up.0), config, QUICK)?;
    eprintln!("D {ALONE} intervals ahead of U: {} in {:?}, peak {} KiB", run.status, run.elapsed, run.max_rss_kib);
    let run = run.succeeded()?;
    let measured = run.lines()?.iter().filter(|v| v["type"] == "segment" && v["measured"] == true).count();
    assert!(measured >= 1, "no interval measured: {}", run.stdout);
    run.check_memory()
}

/// A capture cut inside a record: the replay prints what the records before the cut give (the
/// same as a capture that ends there), then a summary saying where it stopped, and fails.
#[test]
fn truncated_capture_reports_what_it_read_then_fails() -> Result<()> {
    let live = live();
    let pcap = Pcap::parse(&live.pcap)?;
    let kept = pcap.records.len() / 2;
    let boundary =
        PCAP_HEADER_LEN + pcap.records[..kept].iter().map(|r| RECORD_HEADER_LEN + r.data.len()).sum::<usize>();
    let cut = boundary + RECORD_HEADER_LEN + pcap.records[kept].data.len() / 2;
    let (whole, truncated) = (temp_file("pcap", &live.pcap[..boundary])?, temp_file("pcap", &live.pcap[..cut])?);

    let run = replay(Input::File(&truncated.0), CONFIG, QUICK)?;
    eprintln!("cut at byte {cut}: {}; stderr: {}", run.status, run.stderr.trim());
    assert!(!run.status.success(), "a truncated capture replayed successfully");
    assert!(run.stderr.contains("truncated"), "stderr does not name the problem: {}", run.stderr);
    let summary = run.summary()?;
    assert_eq!(summary["complete"], false, "{summary}");
    assert!(summary["error"].as_str().is_some_and(|e| !e.is_empty()), "no error in {summary}");
    assert_eq!(summary["frames"], kept, "{summary}");
    let read = replay(Input::File(&whole.0), CONFIG, QUICK)?.succeeded()?;
    let (want, got) = (figures(&read.lines()?), figures(&run.lines()?));
    assert!(want.iter().any(|l| l.contains(r#""type":"flow""#)), "no flow line before the cut");
    assert_eq!(want, got, "the lines for the records before the cut");
    Ok(())
}

/// ARP requests only: nothing the parser takes, so nothing measured: the replay fails saying so.
#[test]
fn a_capture_with_nothing_to_measure_fails() -> Result<()> {
    const FRAMES: u64 = 7;
    let mac = [0x02, 0, 0, 0, 0, 1];
    // Who has 10.0.0.(2 + i)? Tell 10.0.0.1.
    let arp = |i: u64| {
        let fields = [0x08, 0x06, 0, 1, 0x08, 0x00, 6, 4, 0, 1];
        let data = [&[0xff; 6][..], &mac, &fields, &mac, &[10, 0, 0, 1], &[0; 6], &[10, 0, 0, 2 + i as u8]].concat();
        Record { ts_ns: 1_700_000_000_000_000_000 + i * 1_000_000, len: data.len() as u32, data }
    };
    let format = PcapFormat { big_endian: false, nanos: true, fcs_len: 0 };
    let pcap = Pcap { format, link_type: LINKTYPE_ETHERNET, snaplen: 256, records: (0..FRAMES).map(arp).collect() };
    let run = replay(Input::File(&temp_file("pcap", &pcap.to_bytes()?)?.0), CONFIG, QUICK)?;
    eprintln!("{}; stderr: {}", run.status, run.stderr.trim());
    assert!(!run.status.success(), "a capture with nothing to measure replayed successfully");
    assert!(run.stderr.contains("nothing measured"), "stderr: {}", run.stderr);
    let summary = run.summary()?;
    assert_eq!((summary["frames"].as_u64(), summary["replayed"].as_u64()), (Some(FRAMES), Some(0)), "{summary}");
    assert_eq!(refused(&summary, "not_ip"), FRAMES, "{summary}");
    assert_eq!(summary["complete"], true, "{summary}");
    Ok(())
}

/// 2 GiB of capture on standard input, never on disk: the live capture over and over, each
/// repetition 1 ms after the last, its connections from new clients (new flows). Every record is
/// read and replayed as the capture's own are, every connection measured, in constant memory.
#[test]
fn a_two_gigabyte_capture_replays_in_constant_memory() -> Result<()> {
    const BYTES: u64 = 2 << 30;
    let live = live();
    let pcap = Pcap::parse(&live.pcap)?;
    let reference = replay(Input::File(&temp_file("pcap", &live.pcap)?.0), CONFIG, QUICK)?.succeeded()?.summary()?;
    let (first, last) = (pcap.records[0].ts_ns, pcap.records.last().unwrap().ts_ns);
    let period = last - first + 1_000_000;
    // Each TCP segment with the number of its connection in the capture.
    let clients: BTreeSet<SocketAddrV4> = pcap.records.iter().filter_map(|r| r.tcp4()).map(|t| t.source).collect();
    let connections = clients.len() as u64;
    let segments: Vec<Option<(u64, Tcp4)>> =
        pcap.records.iter().map(|r| r.tcp4().map(|t| (clients.range(..t.source).count() as u64, t))).collect();
    let repetition: u64 = pcap.records.iter().map(|r| (RECORD_HEADER_LEN + r.data.len()) as u64).sum();
    let repetitions = BYTES.div_ceil(repetition);
    let records = repetitions * pcap.records.len() as u64;

    let feed = |out: &mut dyn Write| -> io::Result<()> {
        let mut w = pcap.writer(out)?;
        let mut copy = pcap.records.clone();
        for k in 0..repetitions {
            for ((r, original), segment) in copy.iter_mut().zip(&pcap.records).zip(&segments) {
                r.ts_ns = original.ts_ns + k * period;
                if let Some((connection, t)) = segment {
                    renumber(r, t, k * connections + connection);
                }
                w.record(r)?;
            }
        }
        Ok(())
    };
    let run = replay(Input::Stdin(Box::new(feed)), CONFIG, LARGE_LIMIT)?;
    eprintln!(
        "{records} records ({repetitions} × {}, {} MiB) replayed in {:?}: {}, peak {} KiB",
        pcap.records.len(),
        (repetitions * repetition) >> 20,
        run.elapsed,
        run.status,
        run.max_rss_kib,
    );
    let run = run.succeeded()?;
    let summary = run.summary()?;
    eprintln!("{summary}");
    assert_eq!(summary["frames"], records, "{summary}");
    assert_eq!(summary["replayed"].as_u64(), reference["replayed"].as_u64().map(|r| r * repetitions), "{summary}");
    assert_eq!((summary["complete"].as_bool(), refused(&summary, "timestamp")), (Some(true), 0), "{summary}");
    let mut measured = BTreeSet::new();
    for line in run.stdout.lines() {
        let v: Value = serde_json::from_str(line)?;
        if v["type"] == "flow" && v["proto"] == "tcp" {
            measured.insert(v["client"].as_str().context("a flow line without a client")?.to_string());
        }
    }
    assert_eq!(measured.len() as u64, repetitions * connections, "connections measured");
    run.check_memory()
}

/// An Ethernet frame of an IPv4 UDP datagram from 10.9.0.1:50000 to 10.9.0.2:`dport`.
fn udp_frame(dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; ETH_MACS_LEN];
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
    f.extend_from_slice(&(28 + payload.len() as u16).to_be_bytes());
    f.extend_from_slice(&[0, 1, 0x40, 0, 64, 17, 0, 0, 10, 9, 0, 1, 10, 9, 0, 2]);
    for word in [50_000, dport, 8 + payload.len() as u16, 0] {
        f.extend_from_slice(&word.to_be_bytes());
    }
    f.extend_from_slice(payload);
    f
}

/// One request in flight over UDP, a 5 ms wait for each response and an acknowledgement 50 µs
/// before each request, for 3 s of 1 s epochs: QUIC as its client sends it, recognised by a long
/// header (version 1) on port 4433 or by port 443 alone, has no figure (`quic`: its
/// acknowledgements are encrypted, so nothing says one request is in flight rather than
/// several); nor have the same datagrams from another UDP client (`udp`: nothing in them says a
/// response came), though their gaps hold the waits.
#[test]
fn udp_flows_have_no_figure_and_say_why() -> Result<()> {
    let capture = |dport: u16, first: u8| -> Result<Vec<Value>> {
        let mut records = Vec::new();
        for batch in 0..600u64 {
            let at = 1_000_000_000 + batch * 5_000_000;
            let head = if batch == 0 { [first, 0, 0, 0, 1] } else { [0x43, 7, 7, 7, 7] };
            for (ts_ns, len) in [(at, 40), (at + 50_000, 300)] {
                let payload = [&head[..], &vec![0x5a; len - head.len()]].concat();
                let data = udp_frame(dport, &payload);
                records.push(Record { ts_ns, len: data.len() as u32, data });
            }
        }
        let format = PcapFormat { big_endian: false, nanos: true, fcs_len: 0 };
        let pcap = Pcap { format, link_type: LINKTYPE_ETHERNET, snaplen: 65_535, records };
        let file = temp_file("pcap", &pcap.to_bytes()?)?;
        let lines = replay(Input::File(&file.0), "epoch = \"1s\"\n", QUICK)?.succeeded()?.lines()?;
        Ok(lines.into_iter().filter(|v| v["type"] == "flow").collect())
    };
    for (dport, first, what) in [(4433, 0xc3, "a long header"), (443, 0x43, "port 443")] {
        let flows = capture(dport, first)?;
        ensure!(flows.len() >= 3, "{what}: {flows:?}");
        for f in &flows {
            ensure!(f["no_figure"] == "quic" && f["estimate_ns"].is_null() && f["evidence"].is_null(), "{what}: {f}");
        }
    }
    let udp = capture(4433, 0x43)?;
    ensure!(udp.len() >= 3, "{udp:?}");
    for f in &udp {
        ensure!(f["no_figure"] == "udp" && f["estimate_ns"].is_null() && f["evidence"].is_null(), "{f}");
        // [min, max, count, candidates, sum]: the longest mode holds the 5 ms waits.
        let waits = f["modes"].as_array().and_then(|m| m.last()).context("no modes")?;
        let mean = waits[4].as_f64().context("sum")? / waits[2].as_f64().context("count")?;
        ensure!((mean / 4.95e6 - 1.0).abs() < 0.01, "{f}");
    }
    Ok(())
}
