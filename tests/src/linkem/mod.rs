//! The link emulator that stands in for netem (which this kernel lacks): `pirate-linkem`, a
//! transparent userspace bridge between two interfaces that delays, jitters, drops and reorders
//! Ethernet frames per direction, with departure times counted from the kernel's receive
//! timestamps (see [`relay`] for the design and its accuracy).
//!
//! Tests use it through [`EmuLink`], which splices an emulator namespace into a link:
//!
//! ```text
//!   x ──veth── [emu netns: a | pirate-linkem | b] ──veth── y
//!              ab: frames x → y        ba: frames y → x
//! ```
//!
//! ```no_run
//! use pirate_tests::linkem::{EmuLink, LinkSpec};
//! use pirate_tests::netns::Netns;
//! # fn main() -> anyhow::Result<()> {
//! let (client, server) = (Netns::new("cli")?, Netns::new("srv")?);
//! let link = EmuLink::between(&client, "eth0", &server, "eth0")?;
//! client.addr("eth0", "10.200.1.1/24")?;
//! server.addr("eth0", "10.200.1.2/24")?;
//! let emulator = link.start(&"delay=5ms,jitter=1ms".parse()?, &LinkSpec::default(), 1)?;
//! // … traffic between client and server now sees 5 ± 1 ms from client to server …
//! let counters = emulator.stop()?;
//! assert_eq!(counters.ab.dropped_queue_full, 0);
//! # Ok(())
//! # }
//! ```
//!
//! The binary must have been built (`cargo build -p pirate-tests`); [`linkem_binary`] finds it.
//! [`probe`] measures one-way delays independently of the emulator, as ground truth.

pub mod probe;
pub mod relay;
pub(crate) mod rng;
mod spec;
mod sys;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::netns::{veth, Netns};

pub use spec::{parse_duration, Dist, LinkSpec};

/// Name of the emulator namespace's interface towards `x` in [`EmuLink::between`].
pub const EMU_A: &str = "a";
/// Name of the emulator namespace's interface towards `y` in [`EmuLink::between`].
pub const EMU_B: &str = "b";

/// What the emulator did in one direction. Every received frame ends up in exactly one of
/// `sent`, `send_errors`, `dropped_*` or `unsent_at_exit` (see [`DirCounters::unaccounted`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirCounters {
    /// Frames read from the input interface.
    pub received: u64,
    /// Frames sent on the output interface.
    pub sent: u64,
    /// Dropped by the `loss` impairment.
    pub dropped_loss: u64,
    /// Frames that took the `reorder` path (whether or not they overtook anything).
    pub reordered: u64,
    /// Frames the kernel refused to send (e.g. larger than the output MTU).
    pub send_errors: u64,
    /// Frames too large for the relay's buffer: unsegmented GSO/GRO frames, i.e. offloads left on.
    pub dropped_oversize: u64,
    /// Dropped because the direction's queue was full.
    pub dropped_queue_full: u64,
    /// Still queued when the emulator stopped.
    pub unsent_at_exit: u64,
    /// Frames the kernel dropped before the relay read them (socket buffer full); not in
    /// `received`.
    pub kernel_drops: u64,
    /// Frames relayed with their checksum not filled in (the sender had tx checksum offload on);
    /// the receiver will see bad checksums unless it trusts them.
    pub csum_partial: u64,
    /// Frames read only after their departure time had passed (delay shorter than the relay's
    /// own latency); they left as soon as they were read.
    pub late_on_arrival: u64,
    /// Frames read in time but sent more than 50 µs after their departure time.
    pub sent_late: u64,
    /// The largest lateness of frames read in time, in ns.
    pub max_send_lateness_ns: u64,
}

impl DirCounters {
    /// Received frames whose fate the counters do not explain; 0 unless the emulator is broken.
    pub fn unaccounted(&self) -> i128 {
        i128::from(self.received)
            - i128::from(
                self.sent
                    + self.send_errors
                    + self.dropped_loss
                    + self.dropped_oversize
                    + self.dropped_queue_full
                    + self.unsent_at_exit,
            )
    }
}

/// The counters `pirate-linkem` prints as one JSON line on exit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Frames from side A to side B.
    pub ab: DirCounters,
    /// Frames from side B to side A.
    pub ba: DirCounters,
}

/// The `pirate-linkem` binary: `$PIRATE_LINKEM` if set, else the first `pirate-linkem` found in
/// the directory of the running executable or its parents up to the target profile directory
/// (a test binary runs from `target/<profile>/deps/`, next to which cargo puts binaries).
/// Builds nothing: run `cargo build -p pirate-tests` (with the same profile) first. Falls back to
/// the bare name, i.e. a lookup in `$PATH`.
pub fn linkem_binary() -> PathBuf {
    const NAME: &str = "pirate-linkem";
    if let Some(path) = std::env::var_os("PIRATE_LINKEM") {
        return path.into();
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().skip(1).take(2).map(|dir| dir.join(NAME)).find(|candidate| candidate.is_file()))
        .unwrap_or_else(|| PathBuf::from(NAME))
}

/// A running `pirate-linkem`. [`Emulator::stop`] ends it and returns its counters; dropping it
/// kills it.
#[derive(Debug)]
pub struct Emulator {
    child: Child,
    /// Lines of its stdout, read by a thread so that waiting for them can time out.
    stdout: mpsc::Receiver<String>,
    stopped: bool,
}

/// How long the emulator may take to bind its sockets and to exit.
const EMULATOR_TIMEOUT: Duration = Duration::from_secs(5);

impl Emulator {
    /// Starts `pirate-linkem` in `ns` between its interfaces `a_if` and `b_if` (which must be up)
    /// and waits until it relays. Its stderr is copied to this process's stderr (and so captured
    /// by the test harness).
    pub fn start(ns: &Netns, a_if: &str, b_if: &str, ab: &LinkSpec, ba: &LinkSpec, seed: u64) -> Result<Emulator> {
        let binary = linkem_binary();
        let binary = binary.to_str().context("non-UTF-8 path of pirate-linkem")?;
        let (ab, ba, seed) = (ab.to_string(), ba.to_string(), seed.to_string());
        let mut child = ns
            .command(&[binary, "--a", a_if, "--b", b_if, "--ab", &ab, "--ba", &ba, "--seed", &seed])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {binary} (built? `cargo build -p pirate-tests`)"))?;
        let stdout = child.stdout.take().context("no stdout pipe")?;
        let stderr = child.stderr.take().context("no stderr pipe")?;
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("{line}");
            }
        });
        let mut emulator = Emulator { child, stdout: lines, stopped: false };
        match emulator.stdout.recv_timeout(EMULATOR_TIMEOUT) {
            Ok(line) if line == "ready" => Ok(emulator),
            Ok(line) => bail!("pirate-linkem said {line:?} instead of \"ready\""),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = emulator.wait(EMULATOR_TIMEOUT)?;
                bail!("pirate-linkem exited ({status}) before it was ready; its stderr is above")
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                bail!("pirate-linkem not ready after {EMULATOR_TIMEOUT:?}")
            }
        }
    }

    /// The emulator's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the emulator with SIGTERM and returns its counters. Frames still queued are lost.
    pub fn stop(mut self) -> Result<Counters> {
        // SAFETY: plain syscall on our own child, which has not been reaped yet.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let status = self.wait(EMULATOR_TIMEOUT)?;
        if !status.success() {
            bail!("pirate-linkem exited with {status}; its stderr is above");
        }
        // After exit the reader thread drains the pipe and then hangs up.
        let mut last = None;
        while let Ok(line) = self.stdout.recv_timeout(EMULATOR_TIMEOUT) {
            last = Some(line);
        }
        let line = last.context("pirate-linkem printed no counters")?;
        serde_json::from_str(&line).with_context(|| format!("parsing counters from {line:?}"))
    }

    /// Waits for the child to exit, killing it after `timeout`.
    fn wait(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                self.stopped = true;
                return Ok(status);
            }
            if Instant::now() >= deadline {
                self.child.kill()?;
                self.child.wait()?;
                self.stopped = true;
                return Err(anyhow!("pirate-linkem did not exit within {timeout:?}; killed it"));
            }
            thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// An emulator namespace spliced into a link between `x` and `y`: two veth pairs,
/// `x_if`–[`EMU_A`] and [`EMU_B`]–`y_if`, with every offload that would break relaying turned off
/// on all four ends ([`Netns::offloads_off`]) and IPv6 off inside the emulator namespace so that it
/// sends nothing of its own. Until an emulator runs ([`EmuLink::start`]), `x` and `y` are cut off
/// from each other; emulators with different impairments can be run one after another.
#[derive(Debug)]
pub struct EmuLink {
    ns: Netns,
}

impl EmuLink {
    /// Builds the splice; `x_if` and `y_if` are created, up, without addresses.
    pub fn between(x: &Netns, x_if: &str, y: &Netns, y_if: &str) -> Result<EmuLink> {
        let ns = Netns::new("emu")?;
        // Before the interfaces exist, so that they never get link-local addresses.
        ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1")?;
        ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")?;
        veth(x, x_if, &ns, EMU_A)?;
        veth(&ns, EMU_B, y, y_if)?;
        x.offloads_off(x_if)?;
        ns.offloads_off(EMU_A)?;
        ns.offloads_off(EMU_B)?;
        y.offloads_off(y_if)?;
        Ok(EmuLink { ns })
    }

    /// The emulator namespace.
    pub fn ns(&self) -> &Netns {
        &self.ns
    }

    /// Starts an emulator on the link: `ab` applies to frames from `x` to `y`, `ba` to the others.
    pub fn start(&self, ab: &LinkSpec, ba: &LinkSpec, seed: u64) -> Result<Emulator> {
        Emulator::start(&self.ns, EMU_A, EMU_B, ab, ba, seed)
    }
}
