//! The one-point testbed (DESIGN.md §5): `client ─ vp ─ server`, with the server's replies
//! returning on a direct `server ─ client` link, as behind a DSR load balancer. pirated runs in
//! `vp` on its client-facing interface and sees client→server packets only.
//!
//! ```text
//!  client c-vp 10.201.1.1 ──── 10.201.1.2 vp-c [vp] vp-s 10.201.2.1 ──── 10.201.2.2 s-vp server
//!     c-s 10.201.3.1 ◄─────────────── direct return link ──────────────── 10.201.3.2 s-c
//! ```
//! IPv6 mirrors it in fd00:201:N::/64. The client routes the server's subnet via vp; the server
//! routes the client's subnets over the direct link; rp_filter is off everywhere.
//!
//! With [`Links::span`] there is no direct link: replies return through vp, which copies every
//! frame it receives on `vp-c` and `vp-s` to a monitor port (tc `mirred`, as a switch's SPAN
//! port does), and pirated runs on [`MONITOR_IF`] in the `monitor` namespace, seeing both
//! directions of every conversation.
//!
//! ```text
//!  client c-vp ──── vp-c [vp] vp-s ──── s-vp server
//!                     mon-a ──── mon-b [monitor]
//! ```

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Stdio},
    sync::{Arc, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::{
    linkem::EmuLink,
    netns::{require_root, veth, Netns},
};

pub const CLIENT_IP: &str = "10.201.1.1";
pub const SERVER_IP: &str = "10.201.2.2";
pub const CLIENT_IP6: &str = "fd00:201:1::1";
pub const SERVER_IP6: &str = "fd00:201:2::2";
/// The client's interface towards the vantage point.
pub const CLIENT_IF: &str = "c-vp";
/// pirated's interface in `vp`.
pub const VP_CLIENT_IF: &str = "vp-c";
/// pirated's interface in the `monitor` namespace of a [`Links::span`] testbed.
pub const MONITOR_IF: &str = "mon-b";

/// Which links get a link emulator spliced in (started separately, with the specs a test wants).
#[derive(Clone, Copy, Debug, Default)]
pub struct Links {
    /// client → vp: loss and reordering before the vantage point (`ab` = client→vp).
    pub client_side: bool,
    /// The direct return link: response delay (`ab` = server→client).
    pub return_path: bool,
    /// vp → server: loss after the vantage point, which sees the original and the
    /// retransmission (`ab` = vp→server); with `span`, also the replies' delay (`ba`).
    pub server_side: bool,
    /// Replies return through vp, which mirrors both directions to the monitor port (no direct
    /// return link, so `return_path` is ignored).
    pub span: bool,
}

/// pirated's default idle floor: batches stalled by a retransmission timeout are not response
/// latency (Pirate leaves such gaps out by design, §3.3), so neither are they in the truth.
pub const IDLE_FLOOR: Duration = Duration::from_millis(200);

pub struct OnePoint {
    pub client: Netns,
    pub vp: Netns,
    pub server: Netns,
    pub client_side: Option<EmuLink>,
    pub return_path: Option<EmuLink>,
    pub server_side: Option<EmuLink>,
    /// With [`Links::span`]: the namespace of the monitor port [`MONITOR_IF`].
    pub monitor: Option<Netns>,
}

impl OnePoint {
    /// The testbed with plain veth links.
    pub fn new() -> Result<OnePoint> {
        Self::with(Links::default())
    }

    pub fn with(links: Links) -> Result<OnePoint> {
        require_root()?;
        let client = Netns::new("cli")?;
        let vp = Netns::new("vp")?;
        let server = Netns::new("srv")?;
        // Without duplicate address detection the link-local addresses neighbour discovery
        // speaks from are usable at once, instead of after a second in which first packets vanish.
        for ns in [&client, &vp, &server] {
            ns.sysctl("net.ipv6.conf.all.accept_dad", "0")?;
            ns.sysctl("net.ipv6.conf.default.accept_dad", "0")?;
        }
        let link = |emulated: bool, x: &Netns, x_if: &str, y: &Netns, y_if: &str| -> Result<Option<EmuLink>> {
            if emulated {
                EmuLink::between(x, x_if, y, y_if).map(Some)
            } else {
                veth(x, x_if, y, y_if).map(|_| None)
            }
        };
        let client_side = link(links.client_side, &client, CLIENT_IF, &vp, VP_CLIENT_IF)?;
        let server_side = link(links.server_side, &vp, "vp-s", &server, "s-vp")?;
        let return_path = match links.span {
            true => None,
            false => link(links.return_path, &server, "s-c", &client, "c-s")?,
        };
        // (namespace, interface, IPv4, IPv6): the direct link's two ends come last.
        let mut addrs: Vec<(&Netns, &str, &str, &str)> = vec![
            (&client, CLIENT_IF, "10.201.1.1/24", "fd00:201:1::1/64"),
            (&vp, VP_CLIENT_IF, "10.201.1.2/24", "fd00:201:1::2/64"),
            (&vp, "vp-s", "10.201.2.1/24", "fd00:201:2::1/64"),
            (&server, "s-vp", "10.201.2.2/24", "fd00:201:2::2/64"),
            (&server, "s-c", "10.201.3.2/24", "fd00:201:3::2/64"),
            (&client, "c-s", "10.201.3.1/24", "fd00:201:3::1/64"),
        ];
        if links.span {
            addrs.truncate(4);
        }
        for ns in [&client, &vp, &server] {
            ns.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
            ns.sysctl("net.ipv4.conf.default.rp_filter", "0")?;
        }
        for &(ns, ifname, v4, v6) in &addrs {
            ns.sysctl(&format!("net.ipv4.conf.{ifname}.rp_filter"), "0")?;
            // Real wires carry MTU-sized frames, not TSO/GRO super-frames (DESIGN.md §6).
            ns.offloads_off(ifname)?;
            ns.addr(ifname, v4)?;
            ns.addr(ifname, v6)?;
        }
        // Each link's ends know each other's addresses for good: address resolution through an
        // emulated delay would add it to a connection's first round trip (its handshake's), which
        // pirated holds latencies to, as a router's long-resolved neighbours do not.
        for pair in addrs.chunks(2) {
            let [a, b] = pair else { unreachable!("links come in pairs") };
            for (x, y) in [(a, b), (b, a)] {
                let mac = y.0.mac(y.1)?;
                for cidr in [y.2, y.3] {
                    x.0.neighbour(x.1, cidr.split('/').next().unwrap_or(cidr), &mac)?;
                }
            }
        }
        vp.sysctl("net.ipv4.ip_forward", "1")?;
        vp.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        client.route("10.201.2.0/24", "10.201.1.2")?;
        client.route("fd00:201:2::/64", "fd00:201:1::2")?;
        let monitor = match links.span {
            true => {
                server.route("10.201.1.0/24", "10.201.2.1")?;
                server.route("fd00:201:1::/64", "fd00:201:2::1")?;
                Some(span_port(&vp)?)
            }
            false => {
                server.route("10.201.1.0/24", "10.201.3.1")?;
                server.route("fd00:201:1::/64", "fd00:201:3::1")?;
                None
            }
        };
        Ok(OnePoint { client, vp, server, client_side, return_path, server_side, monitor })
    }
}

/// The monitor namespace, its port [`MONITOR_IF`] receiving a copy of every frame `vp` receives
/// on either side.
fn span_port(vp: &Netns) -> Result<Netns> {
    let monitor = Netns::new("mon")?;
    veth(vp, "mon-a", &monitor, MONITOR_IF)?;
    vp.offloads_off("mon-a")?;
    monitor.offloads_off(MONITOR_IF)?;
    for ifname in [VP_CLIENT_IF, "vp-s"] {
        vp.run(&["tc", "qdisc", "add", "dev", ifname, "clsact"])?;
        #[rustfmt::skip]
        vp.run(&["tc", "filter", "add", "dev", ifname, "ingress", "protocol", "all", "prio", "1",
            "u32", "match", "u32", "0", "0", "action", "mirred", "egress", "mirror", "dev", "mon-a"])?;
    }
    Ok(monitor)
}

/// Finds a binary of this workspace next to the running test executable (target/<profile>/).
pub fn workspace_binary(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test> → target/<profile>/<name>
    for dir in exe.ancestors().skip(1).take(3) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "{name} is not built next to {}: run `cargo build --workspace --bins` first (cargo xtask test does)",
        exe.display()
    )
}

/// pirated running in a namespace with `--output json`; its lines are collected as they come.
pub struct Pirated {
    child: Child,
    lines: Arc<Mutex<Vec<Value>>>,
    reader: Option<JoinHandle<()>>,
    pub listen: String,
}

impl Pirated {
    /// Starts pirated on `iface` in `ns` with `config` (TOML text, `interface` and `metrics.listen`
    /// are set here) and waits until it has attached.
    pub fn start(ns: &Netns, iface: &str, config: &str) -> Result<Pirated> {
        Pirated::start_with_output(ns, iface, config, "json")
    }

    /// [`Pirated::start`] with `--output output`: `prometheus` prints no line per flow, for
    /// benchmarks that must not spend a CPU on them.
    pub fn start_with_output(ns: &Netns, iface: &str, config: &str, output: &str) -> Result<Pirated> {
        let bin = workspace_binary("pirated")?;
        let dir = std::env::temp_dir().join(format!("pirated-test-{}-{}", std::process::id(), ns.name()));
        std::fs::create_dir_all(&dir)?;
        let cfg_path = dir.join("pirated.toml");
        let listen = "127.0.0.1:9464".to_string();
        std::fs::write(&cfg_path, format!("interface = \"{iface}\"\ninstance = \"{}\"\n{config}", ns.name()))?;
        let mut child = ns
            .command(&[
                bin.to_str().unwrap(),
                "run",
                "--config",
                cfg_path.to_str().unwrap(),
                "--output",
                output,
                "--listen",
                &listen,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawning pirated")?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().unwrap();
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    sink.lock().unwrap().push(v);
                }
            }
        });
        // Attached once it logs so on stderr; warnings and errors are forwarded to ours.
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("WARN") || line.contains("ERROR") || line.starts_with("pirated: error") {
                    eprintln!("[pirated] {line}");
                }
                if line.contains("attached") || line.starts_with("pirated: error") {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(line);
                    }
                }
            }
        });
        let mut p = Pirated { child, lines, reader: Some(reader), listen };
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) if line.contains("attached") => Ok(p),
            Ok(line) => {
                p.stop()?;
                bail!("pirated failed to start: {line}")
            }
            Err(_) => {
                p.stop()?;
                bail!("pirated did not attach within 30 s")
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its `FORWARD` slots' pin, by its root: it runs in `ns` under `ip netns exec`, in a mount
    /// namespace of its own.
    pub fn forward(&self, ns: &Netns) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root/sys/fs/bpf/pirated/{}/FORWARD", self.pid(), ns.name()))
    }

    /// JSON lines received so far.
    pub fn lines(&self) -> Vec<Value> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits until a line satisfying `pred` arrives, up to `timeout`.
    pub fn wait_for(&self, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = self.lines.lock().unwrap().iter().find(|v| pred(v)) {
                return Ok(v.clone());
            }
            if Instant::now() > deadline {
                bail!("no matching pirated line within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its /metrics page, fetched from `ns`, the namespace it runs in.
    pub fn metrics(&self, ns: &Netns) -> Result<String> {
        ns.run(&["curl", "-sf", &format!("http://{}/metrics", self.listen)])
    }

    /// SIGTERM, then waits for a clean exit; returns all JSON lines.
    pub fn stop(&mut self) -> Result<Vec<Value>> {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = self.child.try_wait()? {
                break s;
            }
            if Instant::now() > deadline {
                self.child.kill()?;
                bail!("pirated ignored SIGTERM for 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        if !status.success() {
            bail!("pirated exited with {status}");
        }
        Ok(self.lines())
    }
}

impl Pirated {
    /// SIGKILL, as a crash would end it; returns the JSON lines it printed before.
    pub fn kill(&mut self) -> Result<Vec<Value>> {
        self.child.kill()?;
        self.child.wait()?;
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        Ok(self.lines())
    }
}

/// A bpffs of the test's own, at a fresh directory: pirated's `ip netns exec` inherits the mount,
/// so what one pirated pins there, the next one finds (each `ip netns exec` gets a /sys, and so
/// a /sys/fs/bpf, of its own). Unmounted on drop, which also detaches what stayed pinned.
pub struct PinRoot {
    pub path: PathBuf,
}

impl PinRoot {
    pub fn new() -> Result<PinRoot> {
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("pirated-pins-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path)?;
        let c = |s: &str| std::ffi::CString::new(s).unwrap();
        let (fstype, target) = (c("bpf"), c(path.to_str().context("temp dir path")?));
        // SAFETY: valid NUL-terminated strings; no data argument.
        if unsafe { libc::mount(fstype.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) } != 0 {
            bail!("mounting bpffs on {}: {}", path.display(), std::io::Error::last_os_error());
        }
        Ok(PinRoot { path })
    }
}

impl Drop for PinRoot {
    fn drop(&mut self) {
        if let Ok(target) = std::ffi::CString::new(self.path.as_os_str().as_encoded_bytes()) {
            // SAFETY: a valid NUL-terminated path.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = std::fs::remove_dir(&self.path);
    }
}

impl Drop for Pirated {
    fn drop(&mut self) {
        if self.reader.is_some() {
            let _ = self.stop();
        }
    }
}

/// The value of `name_and_labels` (e.g. `pirated_packets_total{outcome="measured"}`) on a
/// /metrics page; panics, showing the page, if it is not there.
pub fn metric(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(name_and_labels))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or_else(|| panic!("{name_and_labels} not in metrics:\n{text}"))
}

/// Polls `done` every 50 ms until it holds; after `timeout`, an error: `what` did not happen.
pub fn wait_until(timeout: Duration, what: &str, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !done()? {
        if Instant::now() > deadline {
            bail!("{what} within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// pirated's per-epoch estimates in `lines` for one flow (`Of::Flow(client addr:port)`) or one
/// server (`Of::Server(addr:port)`), from the configured estimator or a named one, combined
/// over the run: Σ estimate·batches / Σ batches, in seconds, with the batches. Epochs without an
/// estimate are skipped.
pub fn batch_weighted_mean(lines: &[Value], of: Of<'_>, by: By) -> Option<(f64, u64)> {
    let (kind, field, value) = match of {
        Of::Flow(client) => ("flow", "client", client),
        Of::Server(server) => ("server", "server", server),
    };
    let (mut total, mut batches) = (0.0, 0u64);
    for v in lines.iter().filter(|v| v["type"] == kind && v[field] == value) {
        let figure = by.figure(v);
        let (Some(e), Some(b)) = (figure["estimate_ns"].as_f64(), figure["batches"].as_u64()) else { continue };
        total += e * b as f64;
        batches += b;
    }
    (batches > 0).then(|| (total / batches as f64 / 1e9, batches))
}

/// One server's response-latency quantiles in its last epoch in `lines`: (q, seconds). Run
/// pirated with an epoch longer than the test so that the last is the whole run.
pub fn server_quantiles(lines: &[Value], server: &str, by: By) -> Vec<(f64, f64)> {
    let Some(line) = lines.iter().rfind(|v| v["type"] == "server" && v["server"] == server) else { return Vec::new() };
    let Some(qs) = by.figure(line)["quantiles"].as_array() else { return Vec::new() };
    qs.iter().filter_map(|q| Some((q["q"].as_f64()?, q["estimate_ns"].as_f64()? / 1e9))).collect()
}

/// Which estimator's figures to read.
#[derive(Clone, Copy, Debug)]
pub enum By {
    Configured,
    Paper,
    Batches,
}

impl By {
    fn figure(self, line: &Value) -> &Value {
        match self {
            By::Configured => line,
            By::Paper => &line["estimates"]["paper"],
            By::Batches => &line["estimates"]["batches"],
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Of<'a> {
    Flow(&'a str),
    Server(&'a str),
}

/// Waits up to `timeout` for `child` to exit; kills it (and reaps it) after, an error.
pub fn exit_within(child: &mut std::process::Child, timeout: Duration) -> Result<std::process::ExitStatus> {
    exit_within_polling(child, timeout, || {})
}

/// [`exit_within`], calling `poll` every 10 ms while the child runs (and once it has exited).
pub fn exit_within_polling(
    child: &mut std::process::Child,
    timeout: Duration,
    mut poll: impl FnMut(),
) -> Result<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        poll();
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() > deadline {
            child.kill()?;
            child.wait()?;
            bail!("no exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
