//! `pirate-linkem`: the netem replacement. See `pirate_tests::linkem` for the design.

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Parser;
use pirate_tests::linkem::relay::{self, RelayConfig};
use pirate_tests::linkem::{parse_duration, LinkSpec};

/// Emulates a link between two interfaces: relays every Ethernet frame arriving on one out of the
/// other, delayed, jittered, dropped or reordered as configured per direction.
///
/// Run it in a network namespace holding both interfaces (each the end of a veth pair whose
/// other end is a host), with offloads off on all four veth ends (`ethtool -K IF tx off rx off
/// tso off gso off gro off`). It is a transparent bridge: the two hosts see each other's MACs.
/// It prints "ready" once it relays, and on SIGTERM or SIGINT prints its counters as one JSON
/// line and exits.
#[derive(Debug, Parser)]
#[command(version, after_help = SPEC_HELP)]
struct Args {
    /// Interface of side A.
    #[arg(long)]
    a: String,
    /// Interface of side B.
    #[arg(long)]
    b: String,
    /// Impairments for frames from A to B (see SPEC below).
    #[arg(long, default_value = "delay=0")]
    ab: LinkSpec,
    /// Impairments for frames from B to A (see SPEC below).
    #[arg(long, default_value = "delay=0")]
    ba: LinkSpec,
    /// Seed of the random decisions; the same seed and the same frames give the same decisions.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Stop sleeping this long before a departure and poll until it is due. It should exceed the
    /// machine's usual timer wakeup latency (35–150 µs in small VMs), or frames leave late.
    #[arg(long, default_value = "200us", value_parser = parse_duration)]
    spin: Duration,
    /// Run the relay thread with SCHED_FIFO at this priority (1–99), so that other processes do not
    /// delay its wakeups; 0 keeps the normal scheduler.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(i32).range(0..=99))]
    rt_priority: i32,
}

const SPEC_HELP: &str = "\
SPEC is a comma-separated list of key=value, each optional:
  delay=5ms          fixed delay, counted from the kernel's receive timestamp of the frame
  jitter=1ms         random variation added to delay (frames leave in order of departure
                     time, so jitter larger than the gap between frames reorders them)
  dist=uniform       jitter distribution: uniform (delay ± jitter, sd jitter/√3) or
                     normal (sd jitter, clamped at zero delay) or loguniform
                     (delay … delay + jitter, every factor of ten in between alike)
  loss=0.01          probability of dropping a frame (or loss=1%)
  reorder=0.25       probability that a frame is sent after reorder_delay instead of
                     delay ± jitter, overtaking the frames queued before it (netem's reorder)
  reorder_delay=0    delay of reordered frames
Durations take s, ms, us or ns; probabilities are fractions or percentages.

Example: pirate-linkem --a a --b b --ab \"delay=5ms,jitter=1ms,dist=normal,loss=0.01\" --ba delay=5ms";

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn request_stop(_signal: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// SIGTERM and SIGINT set STOP. Without SA_RESTART the relay's `ppoll` returns at once, and it
/// never sleeps longer than 50 ms anyway.
fn install_signal_handlers() -> std::io::Result<()> {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: an all-zero sigaction is valid (empty mask, no flags); the handler only stores
        // to an atomic, which is async-signal-safe.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = request_stop as extern "C" fn(libc::c_int) as libc::sighandler_t;
            if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = install_signal_handlers() {
        eprintln!("pirate-linkem: installing signal handlers: {e}");
        return ExitCode::FAILURE;
    }
    let config = RelayConfig {
        a: args.a,
        b: args.b,
        ab: args.ab,
        ba: args.ba,
        seed: args.seed,
        spin: args.spin,
        rt_priority: (args.rt_priority > 0).then_some(args.rt_priority),
    };
    let ready = || {
        println!("ready");
        let _ = std::io::stdout().flush();
    };
    match relay::run(&config, &STOP, ready) {
        Ok(counters) => {
            println!("{}", serde_json::to_string(&counters).expect("counters serialize"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pirate-linkem: {e:#}");
            ExitCode::FAILURE
        }
    }
}
