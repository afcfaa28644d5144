//! `cargo xtask bench datapath`: the per-packet cost of the `pirate` XDP program against a bare
//! XDP_PASS program on the same packets (BPF_PROG_TEST_RUN, measured side by side in one run),
//! with the flow table already holding 64 K flows, and the memory each tracked flow costs.

use std::{
    os::fd::{AsRawFd, BorrowedFd},
    time::Duration,
};

use anyhow::{bail, Result};
use clap::Parser;
use pirated::{
    config::{Config, Dur},
    datapath::Datapath,
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
}

/// `union bpf_attr` as BPF_PROG_TEST_RUN reads it.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// Runs `prog` on `frame` `repeat` times in the kernel; returns (mean ns per run, XDP verdict).
fn test_run(prog: BorrowedFd<'_>, frame: &[u8], repeat: u32) -> Result<(u32, u32)> {
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: frame.len() as u32,
        data_in: frame.as_ptr() as u64,
        repeat,
        ..Default::default()
    };
    // SAFETY: attr is a valid bpf_attr prefix for this command; data_in outlives the call.
    let rc = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_PROG_TEST_RUN, &mut attr as *mut TestRunAttr, size_of::<TestRunAttr>())
    };
    if rc != 0 {
        bail!("BPF_PROG_TEST_RUN: {}", std::io::Error::last_os_error());
    }
    Ok((attr.duration, attr.retval))
}

/// A client→server TCP segment with 100 bytes of payload; flow `i` differs in source address
/// and port.
fn frame(i: u32) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + 20 + 100];
    f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&140u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&[10, 100 + (i >> 16) as u8, (i >> 8) as u8, i as u8]);
    ip[16..20].copy_from_slice(&[10, 99, 0, 1]);
    let tcp = &mut f[34..54];
    tcp[0..2].copy_from_slice(&(20000 + (i % 40000) as u16).to_be_bytes());
    tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = 0x18; // PSH|ACK
    f
}

fn main() -> Result<()> {
    let args = Args::parse();
    // The same bytes run again and again: with the retransmission check on, every run after a
    // flow's first would be skipped as a retransmission instead of measured; and a flow comes
    // round again after up to a second of cycling, which must not be an idle gap either.
    let mut config = Config { max_flows: args.flows.max(1), ..Config::default() };
    config.pirate.skip_retransmissions = false;
    config.pirate.idle_floor = Dur(Duration::from_secs(4));
    config.validate()?;
    let mut dp = Datapath::load(&config)?;
    let frames: Vec<Vec<u8>> = (0..args.flows).map(frame).collect();
    let pirate = dp.program_fd()?.try_clone_to_owned()?;
    let bare = dp.load_bare_pass()?.try_clone_to_owned()?;
    use std::os::fd::AsFd;
    let (pirate, bare) = (pirate.as_fd(), bare.as_fd());

    for f in &frames {
        let (_, verdict) = test_run(pirate, f, 1)?;
        if verdict != 2 {
            bail!("pirate returned {verdict}, not XDP_PASS");
        }
    }
    // The epoch drain over the full table (pirated does this once per epoch).
    let started = std::time::Instant::now();
    let tracked = dp.drain(0)?.tracked;
    let drain = started.elapsed();

    // Pass 1: one call per packet, cycling through every flow (lookup + update on a cold-ish
    // entry), the two programs interleaved so machine noise hits both alike.
    let (mut sum_p, mut sum_b) = (0u64, 0u64);
    for k in 0..args.calls {
        let f = &frames[(k as usize * 7919) % frames.len()];
        sum_p += test_run(pirate, f, 1)?.0 as u64;
        sum_b += test_run(bare, f, 1)?.0 as u64;
    }
    let one_p = sum_p as f64 / args.calls as f64;
    let one_b = sum_b as f64 / args.calls as f64;

    // Pass 2: the same packet repeated in the kernel (a hot flow), over 64 flows.
    let (mut rep_p, mut rep_b) = (0u64, 0u64);
    let samples = 64.min(frames.len());
    for f in frames.iter().step_by(frames.len() / samples).take(samples) {
        rep_p += test_run(pirate, f, args.repeat)?.0 as u64;
        rep_b += test_run(bare, f, args.repeat)?.0 as u64;
    }
    let rep_p = rep_p as f64 / samples as f64;
    let rep_b = rep_b as f64 / samples as f64;

    let counters = dp.counters()?;
    let memlock = dp.flow_table_memlock()?;
    println!(
        "datapath benchmark: BPF_PROG_TEST_RUN, {tracked} flows in the table (max {}), layout {:?}",
        config.max_flows,
        dp.layout()
    );
    println!("{:<38} {:>12} {:>12} {:>10} {:>7}", "", "pirate ns", "bare ns", "added ns", "ratio");
    for (name, p, b) in [
        ("one call per packet, flows cycling", one_p, one_b),
        (&*format!("same packet x{} per call (64 flows)", args.repeat), rep_p, rep_b),
    ] {
        println!("{name:<38} {p:>12.1} {b:>12.1} {:>10.1} {:>7.2}", p - b, p / b);
    }
    println!(
        "memory per flow: key+value {} B; kernel memlock / max_entries {:.1} B; hand-over ring {:.1} B",
        dp.layout().entry_size(),
        memlock as f64 / config.max_flows as f64,
        dp.ring_bytes() as f64 / config.max_flows as f64,
    );
    println!(
        "epoch drain of {tracked} flows: {:.1} ms (BPF_MAP_LOOKUP_BATCH, includes a 1 ms grace period)",
        drain.as_secs_f64() * 1e3
    );
    match dp.verified_instructions()? {
        Some(n) => println!("verifier: {n} of its 1000000 instructions walked to accept the program"),
        None => println!("verifier: the kernel does not report the instructions it walked"),
    }
    let outcomes = pirate_common::counters::NAMES.iter().zip(counters).take(pirate_common::counters::OUTCOMES as usize);
    let outcomes: Vec<String> = outcomes.filter(|(_, n)| *n > 0).map(|(name, n)| format!("{n} {name}")).collect();
    println!("packets: {}", outcomes.join(", "));
    Ok(())
}
