//! `cargo xtask bench datapath`: the per-packet cost of the XDP chain against a bare XDP_PASS
//! program on the same packets (BPF_PROG_TEST_RUN, measured side by side in one run): the root
//! alone (every capability slot empty), with `pirate` chained, and with `pirate` and `fridge`
//! (the packets are no requests of its classes: its cost to other traffic), with the flow table
//! already holding 64 K flows; the memory each tracked flow costs and each program's verifier
//! work. With `--pping`, ePPing's XDP program runs beside them on the same packets. Then the
//! forwarders, each alone behind the root on packets to a VIP: `pirate_lb` against Katran's
//! balancer (built from `shared/third_party/katran`).

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    os::fd::{AsFd, BorrowedFd},
    path::PathBuf,
    time::Duration,
};

use anyhow::{bail, Result};
use clap::Parser;
use pirate_common::lb::VipKey;
use pirate_tests::{
    katran::{build_balancer, Katran},
    netns::Netns,
    pping::Pping,
    removed::Removed,
};
use pirated::{
    config::Config,
    datapath::{lb::LbMaps, test_run::test_run, Capability, Datapath},
    pirate::drain::Records,
    value::Dur,
};

#[derive(Parser)]
struct Args {
    /// Flows put in the table before measuring.
    #[arg(long, default_value_t = 65536)]
    flows: u32,
    /// Measured calls per program in the one-packet-per-call pass.
    #[arg(long, default_value_t = 200_000)]
    calls: u32,
    /// Repetitions per call in the repeated-packet pass.
    #[arg(long, default_value_t = 2000)]
    repeat: u32,
    /// ePPing's BPF object (`pping_kern.o`, built in xdp-project/bpf-examples' `pping/` by its
    /// own Makefile): its XDP ingress program runs beside the chain on the same packets, with
    /// `pping`'s default configuration.
    #[arg(long)]
    pping: Option<PathBuf>,
    /// Where Katran's balancer is built.
    #[arg(long, default_value = "target/datapath-bench")]
    build_dir: PathBuf,
}

/// Where the chain's packets go: a server behind the vantage point.
const SERVER: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
/// Where the forwarders' packets go, the reals behind it, and the next hop to the reals (a
/// veth's far end, resolved for good, in a namespace of the benchmark's own, where the test
/// runs take place: `pirate_lb`'s route lookup reads the caller's namespace).
const VIP: Ipv4Addr = Ipv4Addr::new(10, 206, 100, 1);
const REALS: [Ipv4Addr; 4] = [
    Ipv4Addr::new(10, 206, 2, 10),
    Ipv4Addr::new(10, 206, 2, 11),
    Ipv4Addr::new(10, 206, 2, 12),
    Ipv4Addr::new(10, 206, 2, 13),
];
const TUNNEL_SOURCE: Ipv4Addr = Ipv4Addr::new(10, 206, 0, 1);
const NEXT_HOP: (&str, [u8; 6]) = ("10.206.0.2", [0x02, 0, 0, 0, 0, 0xfe]);
/// The `FORWARD` slot both forwarders take in turn, and how many turns each gets.
const SLOT: u32 = 2;
const TURNS: u32 = 2;

/// A client→server TCP segment to `dst` port 80 with 100 bytes of payload and the timestamp
/// option (as Linux sends them, and what ePPing matches on); flow `i` differs in source address
/// and port.
fn frame(i: u32, dst: Ipv4Addr) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + 32 + 100];
    f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&152u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&[10, 100 + (i >> 16) as u8, (i >> 8) as u8, i as u8]);
    ip[16..20].copy_from_slice(&dst.octets());
    let tcp = &mut f[34..66];
    tcp[0..2].copy_from_slice(&(20000 + (i % 40000) as u16).to_be_bytes());
    tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
    tcp[12] = 8 << 4;
    // PSH|ACK; options: NOP, NOP, timestamps (TSval, TSecr).
    tcp[13] = 0x18;
    tcp[20..24].copy_from_slice(&[1, 1, 8, 10]);
    tcp[24..28].copy_from_slice(&(1_000_000 + i).to_be_bytes());
    tcp[28..32].copy_from_slice(&(500_000 + i).to_be_bytes());
    f
}

/// Mean ns per run of `prog` on `frame`, repeated `repeat` times in the kernel.
fn ns(prog: BorrowedFd<'_>, frame: &[u8], repeat: u32) -> Result<u64> {
    Ok(test_run(prog, frame, repeat, &mut [])?.ns as u64)
}

/// Per-packet ns of each program, two passes: one call per packet cycling through every flow
/// (cache-cold flow entries), and the same packet repeated in the kernel (a hot flow entry, 64
/// flows).
fn measure(progs: &[BorrowedFd<'_>], frames: &[Vec<u8>], calls: u32, repeat: u32) -> Result<[Vec<f64>; 2]> {
    Ok([per_call(progs, frames, calls)?, repeated(progs, &sample(frames), repeat)?])
}

/// Mean ns per packet of each program, one call per packet cycling through `frames`: cold flow
/// entries where the frames are many flows. The programs are interleaved so that machine noise
/// hits them alike.
fn per_call(progs: &[BorrowedFd<'_>], frames: &[Vec<u8>], calls: u32) -> Result<Vec<f64>> {
    let mut sums = vec![0u64; progs.len()];
    for k in 0..calls as usize {
        let f = &frames[(k * 7919) % frames.len()];
        for (sum, &p) in sums.iter_mut().zip(progs) {
            *sum += ns(p, f, 1)?;
        }
    }
    Ok(sums.into_iter().map(|s| s as f64 / calls as f64).collect())
}

/// Mean ns per packet of each program, each frame run `repeat` times in one call. The kernel
/// does not restore the frame between repetitions: only for programs that leave it as they
/// found it (not the forwarders, whose second run would meet the encapsulated packet).
fn repeated(progs: &[BorrowedFd<'_>], frames: &[Vec<u8>], repeat: u32) -> Result<Vec<f64>> {
    let mut sums = vec![0u64; progs.len()];
    for f in frames {
        for (sum, &p) in sums.iter_mut().zip(progs) {
            *sum += ns(p, f, repeat)?;
        }
    }
    Ok(sums.into_iter().map(|s| s as f64 / frames.len() as f64).collect())
}

/// 64 of the frames, spread over them: hot flows.
fn sample(frames: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let samples = 64.min(frames.len());
    frames.iter().step_by(frames.len() / samples).take(samples).cloned().collect()
}

/// The benchmark's programs that each do one part of the work of the root and of the chain's
/// first program (`pirate-ebpf`'s `bench.rs`), and what they do.
const PARTS: [(&str, &str); 5] = [
    ("bench_clock", "the clock read"),
    ("bench_parse", "the context's lookup and the parse"),
    ("bench_read", "the first program's read: parse, clock, flow hash and id"),
    ("bench_count", "a counter's increment"),
    ("bench_empty_slots", "7 tail calls into empty slots, and the counter"),
];

fn main() -> Result<()> {
    let args = Args::parse();
    // The same bytes run again and again: with the retransmission check on, every run after a
    // flow's first would be skipped as a retransmission instead of measured; and a flow comes
    // round again after up to a second of cycling, which must not be an idle gap either.
    let reals: Vec<String> = REALS.iter().map(|r| format!("\"{r}\"")).collect();
    let mut config = Config::parse(&format!(
        "[lb]\nforwarder = \"builtin\"\ntunnel_source = \"{TUNNEL_SOURCE}\"\n\
         vips = [{{ address = \"{VIP}:80\", proto = \"tcp\", reals = [{}] }}]\n",
        reals.join(", ")
    ))?;
    config.max_flows = args.flows.max(1);
    config.pirate.skip_retransmissions = false;
    config.pirate.idle_floor = Dur(Duration::from_secs(4));
    config.validate()?;
    let mut dp = Datapath::load(&config.datapath())?;
    let frames: Vec<Vec<u8>> = (0..args.flows).map(|i| frame(i, SERVER)).collect();
    let root = dp.root_fd()?.try_clone_to_owned()?;
    let bare = dp.load_bench("bare_pass")?.try_clone_to_owned()?;
    let (root, bare) = (root.as_fd(), bare.as_fd());

    let pping = args.pping.as_deref().map(Pping::load).transpose()?;
    // Each program's flow state filled before measuring: every flow seen once.
    let chain_and_peer: Vec<BorrowedFd<'_>> = [root].into_iter().chain(pping.iter().map(|p| p.fd().as_fd())).collect();
    for f in &frames {
        for &prog in &chain_and_peer {
            let verdict = test_run(prog, f, 1, &mut [])?.verdict;
            if verdict != 2 {
                bail!("a program under test returned {verdict}, not XDP_PASS");
            }
        }
    }
    // The epoch drain over the full table (pirated does this once per epoch).
    let started = std::time::Instant::now();
    let mut records = Records::take(&mut dp)?;
    let tracked = records.drain(0, Vec::new())?.tracked;
    let drain = started.elapsed();

    let [cold, hot] = measure(&[&[root, bare][..], &chain_and_peer[1..]].concat(), &frames, args.calls, args.repeat)?;
    dp.chain(Capability::Fridge, false)?;
    let [cold_pirate, hot_pirate] = measure(&[root, bare], &frames, args.calls, args.repeat)?;
    dp.chain(Capability::Pirate, false)?;
    let [cold_root, hot_root] = measure(&[root, bare], &frames, args.calls, args.repeat)?;
    // The parts, each against the bare program, with every slot empty.
    let mut parts = Vec::new();
    for (name, what) in PARTS {
        let part = dp.load_bench(name)?.try_clone_to_owned()?;
        parts.push((what, measure(&[part.as_fd(), bare], &frames, args.calls, args.repeat)?));
    }
    let [cold_lb, hot_lb, cold_katran, hot_katran] = forwarders(&mut dp, &config, &args, root, bare)?;
    dp.chain(Capability::Pirate, true)?;
    dp.chain(Capability::Fridge, true)?;

    let counters = dp.counters()?;
    let (pirate, memlock) = (records.maps(), records.maps().table_memlock()?);
    println!(
        "datapath benchmark: BPF_PROG_TEST_RUN, {tracked} flows in the table (max {}), layout {:?}",
        config.max_flows,
        pirate.layout()
    );
    println!("{:<60} {:>10} {:>10} {:>10} {:>7}", "", "chain ns", "bare ns", "added ns", "ratio");
    let same = format!("x{} per call, 64 flows", args.repeat);
    for (name, m) in [
        (format!("root + pirate + fridge, one call per packet, {} flows", frames.len()), &cold),
        (format!("root + pirate + fridge, same packet {same}"), &hot),
        ("root + pirate, one call per packet".to_string(), &cold_pirate),
        (format!("root + pirate, same packet {same}"), &hot_pirate),
        ("root alone, one call per packet".to_string(), &cold_root),
        (format!("root alone, same packet {same}"), &hot_root),
    ] {
        let (p, b) = (m[0], m[1]);
        println!("{name:<60} {p:>10.1} {b:>10.1} {:>10.1} {:>7.2}", p - b, p / b);
    }
    if pping.is_some() {
        println!("peers on the same packets (ns added to the bare program; ratio to the bare program, and to pirated's chain):");
        for (name, m) in [("one call per packet", &cold), ("same packet", &hot)] {
            let (chain, bare, peer) = (m[0], m[1], m[2]);
            println!(
                "  ePPing's XDP ingress, {name:<19} {peer:>10.1} ns {:>10.1} added {:>7.2} x bare {:>7.2} x pirated",
                peer - bare,
                peer / bare,
                peer / chain
            );
        }
    }
    println!("the forwarders, each alone behind the root, one call per packet to a VIP from {} flows or 64 (ns added to the bare XDP_PASS; ratio to it, and to pirate_lb):", frames.len());
    for (name, lb, katran) in [("every flow", &cold_lb, &cold_katran), ("64 flows", &hot_lb, &hot_katran)] {
        let (bare, lb, katran) = (lb[1], lb[0], katran[0]);
        for (who, ns) in [("pirate_lb", lb), ("Katran's balancer", katran)] {
            println!(
                "  {who:<18} {name:<19} {ns:>10.1} ns {:>10.1} added {:>7.2} x bare {:>7.2} x pirate_lb",
                ns - bare,
                ns / bare,
                ns / lb
            );
        }
    }
    println!("the parts of the root's and the first program's work, each alone, added to the bare program (one call per packet / same packet {same}):");
    for (what, [cold, hot]) in &parts {
        println!("  {what:<58} {:>10.1} {:>10.1}", cold[0] - cold[1], hot[0] - hot[1]);
    }
    println!(
        "memory per flow: id+state {} B; kernel memlock / max_flows {:.1} B; hand-over ring {:.1} B",
        pirate.layout().entry_size(),
        memlock as f64 / config.max_flows as f64,
        pirate.ring_bytes() as f64 / config.max_flows as f64,
    );
    println!(
        "epoch drain of {tracked} flows: {:.1} ms (the table read in place, includes a 1 ms grace period)",
        drain.as_secs_f64() * 1e3
    );
    for (program, walked) in dp.verified_instructions()? {
        match walked {
            Some(n) => println!("verifier: {program}: {n} of its 1000000 instructions walked to accept it"),
            None => println!("verifier: {program}: the kernel does not report the instructions it walked"),
        }
    }
    let outcomes = pirate_common::counters::NAMES.iter().zip(counters).take(pirate_common::counters::OUTCOMES as usize);
    let outcomes: Vec<String> = outcomes.filter(|(_, n)| *n > 0).map(|(name, n)| format!("{n} {name}")).collect();
    println!("packets: {}", outcomes.join(", "));
    Ok(())
}

/// `pirate_lb` and Katran's balancer, in turns in the same `FORWARD` slot behind the root (every
/// measuring slot empty), on packets to [`VIP`], one call per packet: per-packet ns of the root
/// with each and of the bare program, over every flow (cold) and over 64 (hot),
/// `[pirate_lb cold, hot, Katran cold, hot]`.
fn forwarders(
    dp: &mut Datapath,
    config: &Config,
    args: &Args,
    root: BorrowedFd<'_>,
    bare: BorrowedFd<'_>,
) -> Result<[Vec<f64>; 4]> {
    let ns = Netns::new("dpb")?;
    ns.ip(&["link", "add", "f0", "type", "veth", "peer", "name", "f1"])?;
    for dev in ["f0", "f1"] {
        ns.ip(&["link", "set", "dev", dev, "up"])?;
    }
    ns.addr("f0", &format!("{TUNNEL_SOURCE}/24"))?;
    let mac = NEXT_HOP.1.map(|b| format!("{b:02x}")).join(":");
    ns.neighbour("f0", NEXT_HOP.0, &mac)?;
    ns.route("10.206.2.0/24", NEXT_HOP.0)?;
    ns.sysctl("net.ipv4.ip_forward", "1")?;

    let mut lb = dp.take_lb()?;
    let indexed: Vec<(u32, Ipv4Addr)> = (1..).zip(REALS).collect();
    let vip = VipKey { addr: VIP.octets(), port: 80, proto: libc::IPPROTO_TCP as u8, _pad: 0 };
    lb.install(config.lb.shape(), &indexed, &[(vip, 0)])?;
    let ring: Vec<u32> = (0..config.lb.ring_size).map(|p| 1 + p % REALS.len() as u32).collect();
    lb.write_ring(0, &ring)?;
    let katran = Katran::load(&build_balancer(&args.build_dir.join("katran"))?)?;
    katran.set_default_router_mac(NEXT_HOP.1)?;
    katran.add_vip(SocketAddrV4::new(VIP, 80), libc::IPPROTO_TCP as u8, 0, 0)?;
    for (id, real) in &indexed {
        katran.set_real(*id, *real)?;
    }
    katran.fill_ring(0, &indexed.iter().map(|&(id, _)| id).collect::<Vec<_>>())?;
    let pin = Removed(PathBuf::from(format!("/sys/fs/bpf/pirate-bench-forward-{}", std::process::id())));
    lb.pin_forward(&pin.0)?;

    let frames: Vec<Vec<u8>> = (0..args.flows).map(|i| frame(i, VIP)).collect();
    let register = |lb: &mut LbMaps, which: usize| match which {
        0 => lb.register_forwarder(SLOT),
        _ => katran.register(&pin.0, SLOT),
    };
    let mut sums: [Vec<f64>; 4] = std::array::from_fn(|_| vec![0.0; 2]);
    for turn in 0..TURNS {
        for which in 0..2 {
            register(&mut lb, which)?;
            let frames = &frames;
            let [cold, hot] = ns.run_in(move || -> Result<[Vec<f64>; 2]> {
                // One CPU for every turn: Katran keeps its connections per CPU.
                pin_to_last_cpu()?;
                if turn == 0 {
                    // Each forwarder's connection table filled: every flow seen once.
                    for f in frames {
                        let verdict = test_run(root, f, 1, &mut [])?.verdict;
                        if !matches!(verdict, 3 | 4) {
                            bail!("forwarder {which} returned {verdict}, not XDP_TX or XDP_REDIRECT");
                        }
                    }
                }
                let calls = args.calls / TURNS;
                Ok([per_call(&[root, bare], frames, calls)?, per_call(&[root, bare], &sample(frames), calls)?])
            })??;
            for (sum, m) in sums[2 * which..].iter_mut().zip([cold, hot]) {
                sum.iter_mut().zip(m).for_each(|(s, v)| *s += v / TURNS as f64);
            }
        }
    }
    Ok(sums)
}

fn pin_to_last_cpu() -> Result<()> {
    let last = std::thread::available_parallelism()?.get() - 1;
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes within it.
    let ok = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(last, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) == 0
    };
    match ok {
        true => Ok(()),
        false => bail!("pinning the benchmark's thread to CPU {last}: {}", std::io::Error::last_os_error()),
    }
}
