//! A witness of the host's stalls: the time the hypervisor took each CPU away (steal, as the
//! kernel counts it in `/proc/stat`), read every [`PERIOD`] by a thread that sleeps otherwise.
//! Every stamp taken during a stall is late by it, and a test's ground truth (a capture, a
//! client's clock) and pirated's stamps (XDP) can be late by different amounts: a comparison
//! spanning a stall judges the host, not the code. Tests ask which of their windows saw one,
//! judge the others or take the run again, and say so.
//!
//! Not a thread that times its own wake-ups: one that wakes every millisecond at real-time
//! priority changes what it watches (softirqs yield to a woken task).

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

/// How often the steal counters are read.
const PERIOD: Duration = Duration::from_millis(20);

/// Steal seen on one CPU between two reads: `len_ns` of it within `[from_ns, to_ns)`
/// (`CLOCK_REALTIME`, what captures stamp with). The kernel counts it in ticks (10 ms), so a
/// read can show steal that began before the window.
#[derive(Clone, Copy, Debug)]
pub struct Stall {
    pub from_ns: i64,
    pub to_ns: i64,
    pub len_ns: i64,
}

/// The witness while it runs; [`Witness::stop`] returns what it saw.
pub struct Witness {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<Stall>>,
}

/// The stalls a witness saw.
#[derive(Clone, Debug, Default)]
pub struct Stalls(pub Vec<Stall>);

impl Witness {
    pub fn start() -> Witness {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || watch(&stop)
        });
        Witness { stop, thread }
    }

    pub fn stop(self) -> Stalls {
        self.stop.store(true, Ordering::Relaxed);
        Stalls(self.thread.join().unwrap_or_default())
    }
}

impl Stalls {
    /// The stalls seen in reads that overlap `[from_ns, to_ns)` (`CLOCK_REALTIME`).
    fn within(&self, from_ns: i64, to_ns: i64) -> impl Iterator<Item = &Stall> {
        self.0.iter().filter(move |s| s.from_ns < to_ns && s.to_ns > from_ns)
    }

    /// The time the host stalled around `[from_ns, to_ns)`, in ns, summed over the CPUs (a stall
    /// of all of them counts once for each: a bound, not a measure): a figure over that window
    /// and its truth, stamped on either side of the stalls, lie at most that much apart in
    /// total, so at most that over the window's length apart as means.
    pub fn total(&self, from_ns: i64, to_ns: i64) -> i64 {
        self.within(from_ns, to_ns).map(|s| s.len_ns).sum()
    }
}

/// `run`, taken again while the host stalled for more than `max_share` of it, `runs` times at
/// most: the last is kept whatever the host did, and judged as any other.
pub fn undisturbed<T>(max_share: f64, runs: usize, mut run: impl FnMut() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let mut attempt = 1;
    loop {
        let (witness, from) = (Witness::start(), realtime_ns());
        let out = run()?;
        let (stalls, to) = (witness.stop(), realtime_ns());
        let share = stalls.total(from, to) as f64 / (to - from) as f64;
        if share <= max_share || attempt >= runs {
            return Ok(out);
        }
        eprintln!("the host stalled {:.2} % of the run ({} stalls): taken again", share * 100.0, stalls.0.len());
        attempt += 1;
    }
}

/// `CLOCK_REALTIME` now, in ns.
pub fn realtime_ns() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

fn watch(stop: &AtomicBool) -> Vec<Stall> {
    // SAFETY: sysconf has no preconditions.
    let tick_ns = 1_000_000_000 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    let mut stalls = Vec::new();
    let (mut before, mut at) = (steal_ticks(), realtime_ns());
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(PERIOD);
        let (now, to) = (steal_ticks(), realtime_ns());
        for (&was, &is) in before.iter().zip(&now) {
            if is > was {
                stalls.push(Stall { from_ns: at, to_ns: to, len_ns: (is - was) as i64 * tick_ns });
            }
        }
        (before, at) = (now, to);
    }
    stalls
}

/// Each CPU's steal so far, in ticks (`/proc/stat`: the eighth number of a `cpuN` line);
/// nothing where the file cannot be read (no stall is then seen).
fn steal_ticks() -> Vec<u64> {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    stat.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .map(|l| l.split_whitespace().nth(8).and_then(|v| v.parse().ok()).unwrap_or(0))
        .collect()
}
