//! `cargo xtask bench wire`: packets per second through XDP on a wire, not in test runs. trafgen
//! (netsniff-ng) sends TCP segments of many flows from `gen` into a veth pair whose other end, in
//! `dut`, runs each program in native XDP. That end's NAPI runs in a kernel thread of its own,
//! pinned to the last CPU, and trafgen on the first: the rate per core is the packets XDP took
//! over the CPU time that thread spent, so it holds whether or not the generator saturated it.
//! Side by side in one run: a bare XDP_PASS against pirated's measuring chain (frames passed to
//! the kernel's stack, as on a middlebox), and a bare XDP_TX against `pirate_lb` and Katran's
//! balancer forwarding a VIP's packets (IPIP, sent back out of the same port), behind the same
//! chain.

use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use pirate_tests::{
    balancing::{attach_xdp, build_xdp},
    katran::{build_balancer, Katran},
    netns::{require_root, veth, Netns},
    testbed::{wait_until, Pirated},
};

#[derive(Parser)]
#[command(about = "Packets per second per core through XDP on a veth pair driven by trafgen (needs root)")]
struct Args {
    /// Seconds each program is measured, after a second of warm-up.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Flows the generator cycles through: source ports from 1024, so at most 64 000.
    #[arg(long, default_value_t = 64_000, value_parser = clap::value_parser!(u32).range(1..=64_000))]
    flows: u32,
    /// Runs of the whole table.
    #[arg(long, default_value_t = 1)]
    runs: u32,
    /// Where the test XDP programs and Katran's balancer are built.
    #[arg(long, default_value = "target/wire-bench")]
    build_dir: PathBuf,
}

const GEN_IF: &str = "w-g";
const DUT_IF: &str = "w-d";
const GEN_IP: &str = "10.205.1.1";
const DUT_IP: &str = "10.205.1.2";
const CLIENT_NET: &str = "10.206";
const SERVER: &str = "10.205.9.1";
const VIP: &str = "10.205.100.1";
const REALS: [&str; 4] = ["10.205.2.10", "10.205.2.11", "10.205.2.12", "10.205.2.13"];

/// The pair, and the generator's and the device's ends.
struct Wire {
    gen: Netns,
    dut: Netns,
    gen_mac: String,
    dut_mac: String,
}

impl Wire {
    fn new(drop: &Path) -> Result<Wire> {
        let (gen, dut) = (Netns::new("wgen")?, Netns::new("wdut")?);
        veth(&gen, GEN_IF, &dut, DUT_IF)?;
        gen.addr(GEN_IF, &format!("{GEN_IP}/24"))?;
        dut.addr(DUT_IF, &format!("{DUT_IP}/24"))?;
        // Frames as on a wire: no super-frames, and the forwarders' encapsulated packets fit.
        for (ns, ifname) in [(&gen, GEN_IF), (&dut, DUT_IF)] {
            ns.offloads_off(ifname)?;
            ns.ip(&["link", "set", "dev", ifname, "mtu", "1600"])?;
        }
        let (gen_mac, dut_mac) = (gen.mac(GEN_IF)?, dut.mac(DUT_IF)?);
        // The reals are behind the generator's end, resolved for good: `pirate_lb` sends from XDP
        // only to a neighbour it finds, else leaves the packet to the kernel.
        dut.neighbour(DUT_IF, GEN_IP, &gen_mac)?;
        dut.route("10.205.2.0/24", GEN_IP)?;
        dut.sysctl(&format!("net.ipv4.conf.{DUT_IF}.send_redirects"), "0")?;
        attach_xdp(&gen, GEN_IF, drop)?;
        // What the forwarders send back is dropped on the generator's CPU, not in a softirq on
        // the device end's (which its thread's CPU time would count).
        napi_thread(&gen, GEN_IF, 0)?;
        Ok(Wire { gen, dut, gen_mac, dut_mac })
    }

    /// The device end's XDP statistics: packets its program took, and those it sent back
    /// (XDP_TX, whether or not the generator's end had room for them).
    fn xdp_stats(&self) -> Result<(u64, u64)> {
        let out = self.dut.run(&["ethtool", "-S", DUT_IF])?;
        let stat = |name: &str| -> Result<u64> {
            let line = out.lines().find(|l| l.trim().starts_with(&format!("{name}:")));
            let value = line.and_then(|l| l.split(':').nth(1)).with_context(|| format!("no {name} in ethtool -S"))?;
            Ok(value.trim().parse()?)
        };
        Ok((stat("rx_queue_0_xdp_packets")?, stat("rx_queue_0_xdp_tx")? + stat("rx_queue_0_xdp_tx_errors")?))
    }

    /// trafgen on CPU 0, sending `flows` flows' segments to `dst`:`port` as fast as it can.
    fn generate(&self, dir: &Path, flows: u32, dst: &str, port: u16) -> Result<Child> {
        let conf = dir.join(format!("{dst}.trafgen"));
        let last = 1024 + flows - 1;
        // A client→server segment of 100 bytes; each packet the next source port (flow) and a
        // later sequence number, so that `pirate` measures it rather than skip it as a
        // retransmission.
        std::fs::write(
            &conf,
            format!(
                "{{\n  eth(da={}, sa={}, type=0x0800),\n  ipv4(saddr={CLIENT_NET}.0.1, daddr={dst}, ttl=64),\n  \
                 tcp(sp=dinc(1024, {last}), dp={port}, seq=dinc(), ack, psh, win=1024),\n  fill(0x41, 100)\n}}\n",
                self.dut_mac, self.gen_mac
            ),
        )?;
        let child = self
            .gen
            .command(&["taskset", "-c", "0", "trafgen", "--dev", GEN_IF, "--conf"])
            .arg(&conf)
            // sendto(2), not the TX ring: in a namespace trafgen cannot raise the socket memory
            // the ring needs, and a full ring fails its send there.
            .args(["--cpus", "1", "--notouch-irq", "--gap", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            // trafgen sends from a child it forks: the group takes the signal that stops both.
            .process_group(0)
            .spawn()
            .context("spawning trafgen (apt package netsniff-ng; scripts/setup.sh installs it)")?;
        Ok(child)
    }
}

/// Runs `ifname`'s NAPI in a kernel thread of its own, pinned to `cpu`; returns the thread's pid.
fn napi_thread(ns: &Netns, ifname: &str, cpu: usize) -> Result<u32> {
    ns.run(&["sh", "-c", &format!("echo 1 > /sys/class/net/{ifname}/threaded")])?;
    let prefix = format!("napi/{ifname}-");
    let mut found = None;
    wait_until(Duration::from_secs(5), &format!("no NAPI thread for {ifname}"), || {
        found = std::fs::read_dir("/proc")?.filter_map(|e| e.ok()).find_map(|e| {
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            comm.starts_with(&prefix).then(|| e.file_name().to_str()?.parse::<u32>().ok()).flatten()
        });
        Ok(found.is_some())
    })?;
    let pid = found.context("NAPI thread")?;
    pin(&["-p"], pid, cpu)?;
    Ok(pid)
}

/// `taskset <how> -c cpu pid`: `-p` one thread, `-a -p` every thread of a process.
fn pin(how: &[&str], pid: u32, cpu: usize) -> Result<()> {
    let pinned = std::process::Command::new("taskset")
        .args(how)
        .args(["-c", &cpu.to_string(), &pid.to_string()])
        .stdout(Stdio::null())
        .status()?;
    ensure!(pinned.success(), "taskset {how:?} could not pin {pid} to CPU {cpu}");
    Ok(())
}

/// CPU time a thread has run, from /proc.
fn cpu_time(pid: u32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command's closing parenthesis; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').context("/proc/pid/stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Ok(Duration::from_nanos(ticks * 1_000_000_000 / hz))
}

/// One program's run: packets per second, per core, the NAPI thread's busy share, and the share
/// of packets sent back from XDP.
struct Rate {
    mpps: f64,
    mpps_per_core: f64,
    busy: f64,
    sent_back: f64,
}

fn measure(wire: &Wire, dir: &Path, args: &Args, dst: &str, port: u16) -> Result<Rate> {
    let cpus = std::thread::available_parallelism()?.get();
    ensure!(cpus >= 2, "the benchmark pins the generator and the device end to CPUs of their own: needs 2 CPUs");
    let napi = napi_thread(&wire.dut, DUT_IF, cpus - 1)?;
    let mut gen = wire.generate(dir, args.flows, dst, port)?;
    std::thread::sleep(Duration::from_secs(1));
    if let Some(status) = gen.try_wait()? {
        bail!("trafgen exited at once ({status}): {}", stderr(&mut gen));
    }
    let ((packets, sent), cpu, started) = (wire.xdp_stats()?, cpu_time(napi)?, Instant::now());
    std::thread::sleep(Duration::from_secs(args.seconds));
    let ((packets2, sent2), cpu2, wall) = (wire.xdp_stats()?, cpu_time(napi)?, started.elapsed());
    // SAFETY: signalling our own child's process group.
    unsafe { libc::kill(-(gen.id() as i32), libc::SIGINT) };
    gen.wait()?;
    let (n, busy) = ((packets2 - packets) as f64, (cpu2 - cpu).as_secs_f64());
    ensure!(n > 0.0 && busy > 0.0, "no packet reached the device end's XDP program");
    Ok(Rate {
        mpps: n / wall.as_secs_f64() / 1e6,
        mpps_per_core: n / busy / 1e6,
        busy: busy / wall.as_secs_f64(),
        sent_back: (sent2 - sent) as f64 / n,
    })
}

fn stderr(child: &mut Child) -> String {
    use std::io::Read;
    let mut s = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

fn lb_section(forwarder: &str) -> String {
    let reals: Vec<String> = REALS.iter().map(|r| format!("\"{r}\"")).collect();
    format!(
        "[lb]\nforwarder = \"{forwarder}\"\nvips = [{{ address = \"{VIP}:80\", proto = \"tcp\", reals = [{}] }}]\n\
         tunnel_source = \"{DUT_IP}\"\n",
        reals.join(", ")
    )
}

/// Waits until pirated's forwarder is in its slot, as its metrics say after an epoch (the
/// packets' share sent back from XDP, checked after, says whether it forwarded them).
fn forwarder_up(pirated: &Pirated, ns: &Netns) -> Result<()> {
    wait_until(Duration::from_secs(10), "pirated's forwarder is not in its slot", || {
        Ok(pirated.metrics(ns)?.lines().any(|l| l == "pirated_lb_forwarder_up 1"))
    })
}

/// pirated on the device end with `lb`'s section, printing no line per flow, every thread of it
/// on CPU 0 with the generator: the device end's core runs the XDP programs only.
fn start_pirated(wire: &Wire, lb: &str) -> Result<Pirated> {
    let pirated = Pirated::start_with_output(&wire.dut, DUT_IF, lb, "prometheus")?;
    pin(&["-a", "-p"], pirated.pid(), 0)?;
    Ok(pirated)
}

fn main() -> Result<()> {
    let args = Args::parse();
    require_root()?;
    let dir = std::path::absolute(&args.build_dir)?;
    let (pass, tx, sink) = (build_xdp(&dir, "xdp_pass")?, build_xdp(&dir, "xdp_tx")?, build_xdp(&dir, "xdp_drop")?);
    let katran_object = build_balancer(&dir.join("katran"))?;
    let wire = Wire::new(&sink)?;
    let detach = |w: &Wire| w.dut.ip(&["link", "set", "dev", DUT_IF, "xdpdrv", "off"]).map(drop);
    let mut table: Vec<(String, Vec<Rate>)> = Vec::new();
    let mut record = |name: &str, rate: Rate| match table.iter_mut().find(|(n, _)| n == name) {
        Some((_, rates)) => rates.push(rate),
        None => table.push((name.to_string(), vec![rate])),
    };
    // Forwarding on only for the forwarders (`pirate_lb`'s route lookup needs it): passed
    // frames, to no address of the device's, are then dropped by the stack, not routed.
    let forwarding = |on: bool| wire.dut.sysctl("net.ipv4.ip_forward", if on { "1" } else { "0" });
    for _ in 0..args.runs {
        forwarding(false)?;
        attach_xdp(&wire.dut, DUT_IF, &pass)?;
        record("bare XDP_PASS", measure(&wire, &dir, &args, SERVER, 80)?);
        detach(&wire)?;

        let mut pirated = start_pirated(&wire, "")?;
        record("pirated's chain (root, pirate, fridge), XDP_PASS", measure(&wire, &dir, &args, SERVER, 80)?);
        pirated.stop()?;

        forwarding(true)?;
        attach_xdp(&wire.dut, DUT_IF, &tx)?;
        record("bare XDP_TX", measure(&wire, &dir, &args, VIP, 80)?);
        detach(&wire)?;

        let mut pirated = start_pirated(&wire, &lb_section("builtin"))?;
        forwarder_up(&pirated, &wire.dut)?;
        record("the chain + pirate_lb, IPIP, XDP_TX", measure(&wire, &dir, &args, VIP, 80)?);
        pirated.stop()?;

        let katran = Katran::load(&katran_object)?;
        katran.set_default_router_mac(wire.gen.mac_octets(GEN_IF)?)?;
        let mut pirated = start_pirated(&wire, &lb_section("katran"))?;
        katran.register(&pirated.forward(&wire.dut), 2)?;
        forwarder_up(&pirated, &wire.dut)?;
        record("the chain + Katran's balancer, IPIP, XDP_TX", measure(&wire, &dir, &args, VIP, 80)?);
        pirated.stop()?;
    }

    // A forwarder's packets all leave from XDP, or the row timed something else.
    for (name, rates) in table.iter().filter(|(n, _)| n.contains("XDP_TX")) {
        let least = rates.iter().map(|r| r.sent_back).fold(1.0, f64::min);
        ensure!(least > 0.99, "{name}: only {:.1} % of the packets were sent back from XDP", least * 100.0);
    }
    println!(
        "wire benchmark: trafgen on CPU 0, the device end's NAPI thread on CPU {}, {} flows, {} s a program, {} run(s)",
        std::thread::available_parallelism()?.get() - 1,
        args.flows,
        args.seconds,
        args.runs
    );
    println!(
        "{:<52} {:>9} {:>14} {:>8} {:>9} {:>10} {:>11}",
        "", "Mpps", "Mpps per core", "busy", "sent back", "vs bare", "vs pirated"
    );
    let per_core =
        |name: &str| table.iter().find(|(n, _)| n.starts_with(name)).map(|(_, r)| median(r, |r| r.mpps_per_core));
    for (name, rates) in &table {
        let (bare, ours) = match name.contains("XDP_TX") {
            true => (per_core("bare XDP_TX"), per_core("the chain + pirate_lb")),
            false => (per_core("bare XDP_PASS"), per_core("pirated's chain")),
        };
        let core = median(rates, |r| r.mpps_per_core);
        println!(
            "{name:<52} {:>9.3} {:>14.3} {:>7.0}% {:>8.1}% {:>10.2} {:>11.2}",
            median(rates, |r| r.mpps),
            core,
            median(rates, |r| r.busy) * 100.0,
            median(rates, |r| r.sent_back) * 100.0,
            core / bare.unwrap_or(f64::NAN),
            core / ours.unwrap_or(f64::NAN),
        );
    }
    Ok(())
}

/// The median of one field over the runs.
fn median(rates: &[Rate], field: impl Fn(&Rate) -> f64) -> f64 {
    let mut v: Vec<f64> = rates.iter().map(field).collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
