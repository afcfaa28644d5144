//! `check` accepts exactly what `run` accepts (issue 17). For every limit `run` enforces or
//! trips over, the largest value `check` accepts is loaded by a real pirated, attached to a veth
//! in a namespace (three daemons between them hold every key at its edge, one at the smallest
//! values), and the smallest value it refuses is refused by `run` too, with the same message
//! naming the key at its line. Memory: the largest daemon takes about 6 GiB (a wide flow table
//! of 16 M flows, a connection table of 16 M, 256 MiB rings).

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Command, Output, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use pirate_tests::{
    netns::{veth, Netns},
    testbed::{exit_within, workspace_binary},
    twopoint,
};

/// The two ends of the veth pair, named with the most an interface name takes (15 bytes).
const UP_IF: &str = "lim-up-01234567";
const DOWN_IF: &str = "lim-dn-01234567";

/// A namespace with the veth pair, and the instances whose locks (in /run/pirated) to remove.
struct Bed {
    ns: Netns,
    instances: Mutex<Vec<String>>,
}

impl Bed {
    fn new() -> Result<Bed> {
        let ns = Netns::new("lim")?;
        veth(&ns, UP_IF, &ns, DOWN_IF)?;
        Ok(Bed { ns, instances: Mutex::new(Vec::new()) })
    }

    /// An instance name of `len` bytes, of this process's own.
    fn instance(&self, tag: &str, len: usize) -> String {
        let mut name = format!("lim{}-{tag}-", std::process::id());
        name.extend(std::iter::repeat_n('i', len - name.len()));
        self.instances.lock().unwrap().push(name.clone());
        name
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        for instance in self.instances.lock().unwrap().iter() {
            for name in [format!("{instance}.lock"), format!("{instance}-down.lock")] {
                let _ = std::fs::remove_file(PathBuf::from(pirated::datapath::pins::LOCK_DIR).join(name));
            }
        }
    }
}

/// Writes `config` to a file of its own, named `name`.
fn config_file(name: &str, config: &str) -> Result<PathBuf> {
    let path = std::env::temp_dir().join(format!("pirated-limits-{}-{name}.toml", std::process::id()));
    std::fs::write(&path, config)?;
    Ok(path)
}

fn pirated() -> Result<String> {
    Ok(workspace_binary("pirated")?.to_str().context("binary path")?.to_owned())
}

/// `check` accepts `config`, and `run` loads it: its `chains` chains attached, everything set up
/// (its /metrics answers, which it does once the forwarder, the fridges and the segment have
/// started), and stopped by SIGTERM, cleanly.
fn loads(bed: &Bed, name: &str, config: &str, chains: usize) -> Result<()> {
    let path = config_file(name, config)?;
    let bin = pirated()?;
    let check = Command::new(&bin).args(["check", "--config", path.to_str().unwrap()]).output()?;
    ensure!(check.status.success(), "{name}: check refused it: {}", String::from_utf8_lossy(&check.stderr));
    let started = Instant::now();
    let mut child = bed
        .ns
        .command(&[&bin, "run", "--config", path.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = log.clone();
    let stderr = child.stderr.take().context("stderr")?;
    let reader = std::thread::spawn(move || {
        BufReader::new(stderr).lines().map_while(Result::ok).for_each(|l| sink.lock().unwrap().push(l))
    });
    let up = loop {
        if let Some(status) = child.try_wait()? {
            let _ = reader.join();
            bail!("{name}: run exited ({status}) before serving /metrics: {:#?}", log.lock().unwrap());
        }
        if bed.ns.run(&["curl", "-sf", "--max-time", "2", "-o", "/dev/null", "http://127.0.0.1:9464/metrics"]).is_ok() {
            break started.elapsed();
        }
        if started.elapsed() > Duration::from_secs(90) {
            child.kill()?;
            bail!("{name}: /metrics did not answer within 90 s: {:#?}", log.lock().unwrap());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = exit_within(&mut child, Duration::from_secs(30))?;
    let _ = reader.join();
    let log = log.lock().unwrap();
    ensure!(status.success(), "{name}: run exited with {status}: {log:#?}");
    let errors: Vec<&String> = log.iter().filter(|l| l.contains("ERROR") || l.starts_with("pirated: error")).collect();
    ensure!(errors.is_empty(), "{name}: {errors:#?}");
    let attached = log.iter().filter(|l| l.contains(" attached ")).count();
    ensure!(attached == chains, "{name}: {attached} chains attached, not {chains}: {log:#?}");
    let _ = std::fs::remove_file(&path);
    eprintln!("{name}: loaded, up after {:.1} s ({attached} chains attached)", up.as_secs_f64());
    Ok(())
}

/// `command`'s output, if it exits within `timeout` (a `run` that accepts what it should refuse
/// would otherwise measure on).
fn output_within(command: &mut Command, timeout: Duration) -> Result<Output> {
    let mut child = command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?;
    exit_within(&mut child, timeout).context("a refused configuration should fail at once")?;
    Ok(child.wait_with_output()?)
}

/// `check` and `run` both refuse `config`, with the same error, naming the configuration file
/// and then `want` (`line N: key = value…`); returns the error.
fn refused(bed: &Bed, name: &str, config: &str, want: &str) -> Result<String> {
    let path = config_file(name, config)?;
    let (bin, file) = (pirated()?, path.to_str().unwrap().to_owned());
    let check = output_within(Command::new(&bin).args(["check", "--config", &file]), Duration::from_secs(10))?;
    let run = output_within(&mut bed.ns.command(&[&bin, "run", "--config", &file]), Duration::from_secs(10))?;
    let error = |what: &str, out: &Output| -> Result<String> {
        ensure!(!out.status.success(), "{name}: {what} accepted it");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let line = stderr.lines().find(|l| l.starts_with("pirated: error: "));
        Ok(line.with_context(|| format!("{name}: {what} printed no error: {stderr}"))?.to_owned())
    };
    let (by_check, by_run) = (error("check", &check)?, error("run", &run)?);
    ensure!(by_check == by_run, "{name}: check and run disagree:\n  check: {by_check}\n  run:   {by_run}");
    let expected = format!("pirated: error: in {file}: {want}");
    ensure!(by_check.starts_with(&expected), "{name}: want {expected:?}\n got {by_check:?}");
    let _ = std::fs::remove_file(&path);
    Ok(by_check)
}

/// `n` VIPs, `per` reals behind each but the last (which has what is left of `total`).
fn vips(n: usize, per: usize, total: usize) -> String {
    let real = |i: usize| format!("\"10.{}.{}.{}\"", 100 + i / 65536, (i / 256) % 256, i % 256);
    let mut first = 0;
    let vips: Vec<String> = (0..n)
        .map(|v| {
            let count = if v + 1 == n { total - first } else { per };
            let reals: Vec<String> = (first..first + count).map(real).collect();
            first += count;
            format!("{{ address = \"10.0.0.{v}:80\", proto = \"udp\", reals = [{}] }}", reals.join(", "))
        })
        .collect();
    format!("vips = [{}]", vips.join(", "))
}

/// An absolute path under /sys/fs/bpf of `len` bytes, in components of the most a name takes
/// (255 bytes) and none with a dot.
fn long_path(len: usize) -> String {
    let mut path = String::from("/sys/fs/bpf");
    while path.len() < len {
        // A component of what is left after its '/', leaving none or room for another.
        let left = len - path.len() - 1;
        let name = if left == 256 { 254 } else { left.min(255) };
        path.push('/');
        path.extend(std::iter::repeat_n('p', name));
    }
    path
}

/// Every size at its largest, in one pirated with both points of a segment (so two chains, and
/// an instance name 5 bytes shorter for `<instance>-down`): a wide flow table of 16 M flows,
/// 16 M fridge slots over four fridges and a 256 MiB sample ring, a 1 048 573-entry ring of
/// 4095 reals and 16 M connections, four LDA banks of 65 536 rows, four RDA banks of 65 536
/// buckets, a 256 MiB packet cache ring; the longest epoch, window and interval; a fixed δ just
/// under the longest idle floor; interface names of 15 bytes; `pin_root` in 255-byte components,
/// as long as the deepest pin's path allows (PATH_MAX).
fn largest(instance: &str, pin_root: &str) -> String {
    let reals: Vec<String> =
        (0..4095).map(|i| format!("\"10.{}.{}.{}\"", 100 + i / 65536, (i / 256) % 256, i % 256)).collect();
    let sla: Vec<String> = (1..=16).map(|ms| format!("\"{ms}ms\"")).collect();
    format!(
        r#"interface = "{UP_IF}"
instance = "{instance}"
pin_root = "{pin_root}"
on_exit = "detach"
epoch = "60s"
max_flows = 16777216
[pirate]
modes = 12
mode_span = 64
idle_floor = "4s"
delta = "3999999999ns"
[fridge]
fridges = [{{ slots = 4194304, p = "auto" }}, {{ slots = 4194304, p = 1 }}, {{ slots = 4194304, p = 0.5 }}, {{ slots = 4194304, p = "auto" }}]
ring_bytes = 268435456
window = "3600s"
sla = [{}]
[lb]
tunnel_source = "10.1.0.254"
ring_size = 1048573
max_connections = 16777216
position = 2
vips = [{{ address = "10.0.0.1:80", reals = [{}] }}]
[segment]
role = "both"
down_interface = "{DOWN_IF}"
interval = "3600s"
lda_rows = 65536
lda_loss = [0.001, 0.01, 0.1, 0.5]
packets = 9223372036854775807
rda_buckets = 65536
rda_banks = 4
sample_zeros = 32
cache_packets = 4294967295
cache_ring_bytes = 268435456
"#,
        sla.join(", "),
        reals.join(", ")
    )
}

/// The longest `pin_root` (of [`long_path`]'s shape) that `check` accepts for `config_of`.
fn longest_pin_root(config_of: impl Fn(&str) -> String) -> usize {
    let accepted = |len: usize| pirated::config::Config::parse(&config_of(&long_path(len))).is_ok();
    let (mut ok, mut bad) = (64, libc::PATH_MAX as usize);
    assert!(accepted(ok) && !accepted(bad));
    while bad - ok > 1 {
        let mid = (ok + bad) / 2;
        if accepted(mid) {
            ok = mid;
        } else {
            bad = mid;
        }
    }
    ok
}

/// The largest sizes load (see [`largest`]), and `pin_root` a byte longer is refused by both.
#[test]
fn the_largest_sizes_load() -> Result<()> {
    let bed = Bed::new()?;
    let instance = bed.instance("max", 245);
    let len = longest_pin_root(|root| largest(&instance, root));
    loads(&bed, "largest", &largest(&instance, &long_path(len)), 2)?;
    eprintln!("largest: pin_root of {len} bytes, its deepest pin's path {} bytes", libc::PATH_MAX - 1);
    let want =
        format!("line 3: pin_root = \"{}\" ({} bytes): must be at most {len} bytes", long_path(len + 1), len + 1);
    refused(&bed, "pin-root-too-long", &largest(&instance, &long_path(len + 1)), &want).map(drop)
}

/// The other edges, in a downstream point: the longest instance name without role "both" (250
/// bytes), 64 VIPs with 4095 reals between them, one fridge of 16 M slots, the segment's
/// listener and /metrics on one port (on two addresses of two families), "auto" δ's first epoch
/// just under the idle floor, the shortest epoch.
#[test]
fn the_other_largest_values_load() -> Result<()> {
    let bed = Bed::new()?;
    let instance = bed.instance("vips", 250);
    let key = twopoint::key_file()?.display().to_string();
    let config = format!(
        r#"interface = "{UP_IF}"
instance = "{instance}"
on_exit = "detach"
epoch = "10ms"
[pirate]
delta = "auto"
idle_floor = "501us"
intra_batch_max = "500us"
[fridge]
fridges = [{{ slots = 16777216, p = "auto" }}]
[lb]
tunnel_source = "10.1.0.254"
ring_size = 6421
{}
[segment]
role = "down"
key_file = "{key}"
listen = "[::1]:9464"
[metrics]
listen = "127.0.0.1:9464"
"#,
        vips(64, 64, 4095)
    );
    loads(&bed, "other-largest", &config, 1)
}

/// The smallest values load: one flow, one mode, 16 fridge slots, a one-page ring, a 101-entry
/// ring of one real, one connection, an LDA of two rows, an RDA of one bucket, the shortest
/// interval; an upstream point whose peer is a name and the highest port.
#[test]
fn the_smallest_values_load() -> Result<()> {
    let bed = Bed::new()?;
    let instance = bed.instance("min", 24);
    let key = twopoint::key_file()?.display().to_string();
    let config = format!(
        r#"interface = "{UP_IF}"
instance = "{instance}"
on_exit = "detach"
epoch = "10ms"
max_flows = 1
[pirate]
modes = 1
mode_span = 0
[fridge]
fridges = [{{ slots = 16, p = 1 }}]
ring_bytes = 4096
window = "1ns"
sla = []
[lb]
tunnel_source = "10.1.0.254"
ring_size = 101
max_connections = 1
position = 0
vips = [{{ address = "10.0.0.1:80", reals = ["10.1.0.1"] }}]
[segment]
role = "up"
peer = "localhost:65535"
key_file = "{key}"
interval = "100ms"
lda_rows = 2
lda_loss = [0.5]
packets = 1
rda_buckets = 1
rda_banks = 1
cache_packets = 0
cache_ring_bytes = 4096
"#
    );
    loads(&bed, "smallest", &config, 1)
}

/// For each limit, the value just past it: `check` and `run` refuse it alike, at its line, by
/// key and value (and range).
#[test]
fn run_refuses_what_check_refuses_with_the_same_message() -> Result<()> {
    let bed = Bed::new()?;
    let instance = bed.instance("refused", 24);
    let head = format!("interface = \"{UP_IF}\"\ninstance = \"{instance}\"\non_exit = \"detach\"\n");
    let key = twopoint::key_file()?.display().to_string();
    let role = |role: &str| format!("[segment]\nrole = \"{role}\"\nkey_file = \"{key}\"\n");
    let sla: Vec<String> = (1..=17).map(|ms| format!("\"{ms}ms\"")).collect();
    let fridge = "{ slots = 16, p = 1 }";
    #[rustfmt::skip]
    let cases: Vec<(&str, String, String)> = vec![
        ("max-flows", "max_flows = 16777217".into(), "line 4: max_flows = 16777217: must be 1..=16777216".into()),
        ("max-servers", "[metrics]\nmax_servers = 0".into(), "line 5: metrics.max_servers = 0: must be 1..=16777216".into()),
        ("idle-epochs", "[metrics]\nidle_epochs = 0".into(), "line 5: metrics.idle_epochs = 0: must be at least 1".into()),
        ("epoch-long", "epoch = \"60000000001ns\"".into(), "line 4: epoch = 60000000001ns: must be between 10ms and 60s".into()),
        ("epoch-short", "epoch = \"9999999ns\"".into(), "line 4: epoch = 9999999ns: must be between 10ms and 60s".into()),
        ("modes", "[pirate]\nmodes = 13".into(), "line 5: pirate.modes = 13: must be 1..=12".into()),
        ("mode-span", "[pirate]\nmode_span = 65".into(), "line 5: pirate.mode_span = 65: must be 0 (unbounded) ..=64".into()),
        ("idle-floor", "[pirate]\nidle_floor = \"4000000001ns\"".into(), "line 5: pirate.idle_floor = 4000000001ns: gaps are kept up to 4.29s, so at most 4s".into()),
        // δ as configured: fixed, or "auto" by its first epoch's 500us.
        ("delta-fixed", "[pirate]\nidle_floor = \"1ms\"\ndelta = \"1ms\"".into(), "line 5: pirate.idle_floor (1ms) must be above pirate.delta (1ms)".into()),
        ("delta-auto", "[pirate]\ndelta = \"auto\"\nidle_floor = \"500us\"\nintra_batch_max = \"400us\"".into(),
            "line 6: pirate.idle_floor (500us) must be above pirate.delta (500us in a flow's first epoch with \"auto\")".into()),
        ("fridges", format!("[fridge]\nfridges = [{fridge}, {fridge}, {fridge}, {fridge}, {fridge}]"), "line 5: fridge.fridges has 5 fridges: must be 1..=4".into()),
        ("fridge-slots", "[fridge]\nfridges = [{ slots = 33554432, p = 1 }]".into(),
            "line 5: fridge.fridges[0].slots = 33554432: must be a power of two, 16..=16777216".into()),
        ("fridge-total", "[fridge]\nfridges = [{ slots = 16777216, p = 1 }, { slots = 16, p = 1 }]".into(),
            "line 5: fridge.fridges hold 16777232 slots: at most 16777216 together".into()),
        ("fridge-ring", "[fridge]\nring_bytes = 536870912".into(), "line 5: fridge.ring_bytes = 536870912: must be a power of two, 4096..=268435456".into()),
        ("fridge-ring-small", "[fridge]\nring_bytes = 2048".into(), "line 5: fridge.ring_bytes = 2048: must be a power of two, 4096..=268435456".into()),
        ("fridge-window", "[fridge]\nwindow = \"3600000000001ns\"".into(), "line 5: fridge.window = 3600000000001ns: must be above 0 and at most 1h".into()),
        ("fridge-sla", format!("[fridge]\nsla = [{}]", sla.join(", ")), "line 5: fridge.sla: at most 16 thresholds, each above 0".into()),
        ("lb-ring", "[lb]\nring_size = 1048574".into(), "line 5: lb.ring_size = 1048574: must be a prime up to 1048573".into()),
        ("lb-conns", "[lb]\nmax_connections = 16777217".into(), "line 5: lb.max_connections = 16777217: must be 1..=16777216".into()),
        ("lb-position", "[lb]\nposition = 3".into(), "line 5: lb.position = 3: the forwarder slots are 0..3".into()),
        ("lb-vips", format!("[lb]\ntunnel_source = \"10.1.0.254\"\n{}", vips(65, 1, 65)), "line 6: lb.vips has 65 VIPs: at most 64".into()),
        ("lb-reals", format!("[lb]\ntunnel_source = \"10.1.0.254\"\nring_size = 6421\n{}", vips(64, 64, 4096)),
            "line 7: lb.vips have 4096 reals together: at most 4095".into()),
        ("lda-rows", "[segment]\nlda_rows = 65538".into(), "line 5: segment.lda_rows = 65538: must be even, 2..=65536".into()),
        ("lda-loss", "[segment]\nlda_loss = [0.1, 0.2, 0.3, 0.4, 0.5]".into(), "line 5: segment.lda_loss = [0.1, 0.2, 0.3, 0.4, 0.5]: 1..=4 loss rates".into()),
        ("rda-buckets", "[segment]\nrda_buckets = 65537".into(), "line 5: segment.rda_buckets = 65537: must be 1..=65536".into()),
        ("rda-banks", "[segment]\nrda_banks = 5".into(), "line 5: segment.rda_banks = 5: must be 1..=4".into()),
        ("sample-zeros", "[segment]\nsample_zeros = 33".into(), "line 5: segment.sample_zeros = 33: must be 0..=32".into()),
        ("cache-ring", "[segment]\ncache_ring_bytes = 536870912".into(), "line 5: segment.cache_ring_bytes = 536870912: must be a power of two, 4096..=268435456".into()),
        ("interval", "[segment]\ninterval = \"3600000000001ns\"".into(), "line 5: segment.interval = 3600000000001ns: must be between 100ms and 1h".into()),
        // Limits `run` used to trip over after `check` had passed them.
        ("down-interface", format!("{}down_interface = \"{DOWN_IF}x\"", role("both")), format!("line 7: segment.down_interface = \"{DOWN_IF}x\": an interface name has 1..=15 bytes")),
        ("listen", format!("[metrics]\nlisten = \"127.0.0.1:9464\"\n{}listen = \"0.0.0.0:9464\"", role("down")),
            "line 9: segment.listen = 0.0.0.0:9464: metrics.listen (127.0.0.1:9464) binds that port too".into()),
        ("peer", format!("{}peer = \"downstream\"", role("up")), "line 7: segment.peer = \"downstream\": must be the downstream point's listen address, host:port".into()),
        ("pin-root-name", format!("pin_root = \"/sys/fs/bpf/{}\"", "p".repeat(256)),
            format!("line 4: pin_root = \"/sys/fs/bpf/{p}\": its component \"{p}\" has 256 bytes: at most 255", p = "p".repeat(256))),
        ("pin-root-dot", "pin_root = \"/sys/fs/bpf/pirated.v2\"".into(), "line 4: pin_root = \"/sys/fs/bpf/pirated.v2\": \"pirated.v2\" has a dot".into()),
    ];
    for (name, body, want) in &cases {
        let error = refused(&bed, name, &format!("{head}{body}\n"), want)?;
        // A fixed δ is named as configured, not as "auto".
        ensure!(*name != "delta-fixed" || error.ends_with(want.as_str()), "{name}: {error}");
    }
    // Names: the interface's (IFNAMSIZ) and the instance's (its lock's file name, NAME_MAX).
    let long_if = format!("{UP_IF}x");
    let text = format!("interface = \"{long_if}\"\ninstance = \"{instance}\"\n");
    refused(
        &bed,
        "interface",
        &text,
        &format!("line 1: interface = \"{long_if}\": an interface name has 1..=15 bytes"),
    )?;
    let long = bed.instance("long", 251);
    let text = format!("interface = \"{UP_IF}\"\ninstance = \"{long}\"\n");
    refused(
        &bed,
        "instance",
        &text,
        &format!("line 2: instance = \"{long}\" (251 bytes): must be 1..=250 bytes: it names the lock"),
    )?;
    let long = bed.instance("both", 246);
    let text = format!(
        "interface = \"{UP_IF}\"\ninstance = \"{long}\"\n[segment]\nrole = \"both\"\ndown_interface = \"{DOWN_IF}\"\n"
    );
    let want = format!("line 2: instance = \"{long}\" (246 bytes): must be 1..=245 bytes with segment.role = \"both\"");
    refused(&bed, "instance-both", &text, &want)?;
    eprintln!("{} refusals: check and run alike", cases.len() + 3);
    Ok(())
}
