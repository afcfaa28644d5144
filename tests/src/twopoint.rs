//! The two-point testbed (DESIGN.md §5): a segment from an upstream point U to a downstream
//! point D, each a namespace routing the sender's traffic on, with the link emulator between
//! them, and a control link (no emulator) the two pirated instances peer over.
//!
//! ```text
//!  snd s-u 10.204.1.1 ── 10.204.1.2 u-s [up] u-d ══ emulator ══ d-u [down] d-r 10.204.3.1 ── 10.204.3.2 r-d rcv
//!                                   u-m 10.204.9.1 ───────────────── 10.204.9.2 d-m
//! ```
//! pirated U measures on `u-s` (the sender's packets entering U), pirated D on `d-u` (the same
//! packets entering D after the emulator).
//!
//! [`TwoPorts`] is the segment between two ports of one host instead, for one pirated on both:
//!
//! ```text
//!  snd s-u ── u-s [mid] u-d ══ emulator ══ d-u [mid] d-r ── r-d rcv
//! ```

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex,
    },
};

use anyhow::{ensure, Result};
use pirated::psk::Psk;

use serde_json::Value;

use crate::{
    linkem::EmuLink,
    netns::{require_root, veth, Netns},
    testbed::workspace_binary,
};

pub const SENDER_IP: &str = "10.204.1.1";
pub const RECEIVER_IP: &str = "10.204.3.2";
/// Where pirated D listens for pirated U.
pub const PEER_ADDR: &str = "10.204.9.2:9465";
/// A key file both points of a test read (`segment.key_file`): written once, owner-only, and
/// written again when what is there does not read as a key.
pub fn key_file() -> Result<PathBuf> {
    static WRITING: Mutex<()> = Mutex::new(());
    let path = std::env::temp_dir().join("pirated-tests-segment.key");
    let _one = WRITING.lock().unwrap_or_else(|p| p.into_inner());
    if Psk::read(&path).is_err() {
        let _ = std::fs::remove_file(&path);
        Psk::write_new(&path)?;
    }
    Ok(path)
}

/// The interfaces the points measure on.
pub const UP_IF: &str = "u-s";
pub const DOWN_IF: &str = "d-u";

pub struct TwoPoint {
    pub sender: Netns,
    pub up: Netns,
    pub down: Netns,
    pub receiver: Netns,
    /// U → D (`ab`), D → U (`ba`).
    pub segment: EmuLink,
}

impl TwoPoint {
    pub fn new() -> Result<TwoPoint> {
        require_root()?;
        let (sender, up, down, receiver) =
            (Netns::new("snd")?, Netns::new("up")?, Netns::new("down")?, Netns::new("rcv")?);
        veth(&sender, "s-u", &up, UP_IF)?;
        let segment = EmuLink::between(&up, "u-d", &down, DOWN_IF)?;
        veth(&down, "d-r", &receiver, "r-d")?;
        veth(&up, "u-m", &down, "d-m")?;
        for (ns, ifname, cidr) in [
            (&sender, "s-u", "10.204.1.1/24"),
            (&up, UP_IF, "10.204.1.2/24"),
            (&up, "u-d", "10.204.2.1/24"),
            (&down, DOWN_IF, "10.204.2.2/24"),
            (&down, "d-r", "10.204.3.1/24"),
            (&receiver, "r-d", "10.204.3.2/24"),
            (&up, "u-m", "10.204.9.1/24"),
            (&down, "d-m", "10.204.9.2/24"),
        ] {
            ns.offloads_off(ifname)?;
            ns.addr(ifname, cidr)?;
        }
        routing(&up)?;
        routing(&down)?;
        sender.route("10.204.3.0/24", "10.204.1.2")?;
        up.route("10.204.3.0/24", "10.204.2.2")?;
        receiver.route("10.204.1.0/24", "10.204.3.1")?;
        down.route("10.204.1.0/24", "10.204.2.1")?;
        Ok(TwoPoint { sender, up, down, receiver, segment })
    }
}

/// A point forwards the sender's packets, which may come back in on another interface.
fn routing(ns: &Netns) -> Result<()> {
    ns.sysctl("net.ipv4.ip_forward", "1")?;
    ns.sysctl("net.ipv4.conf.all.rp_filter", "0")
}

/// One host at both ends of the segment: the sender's packets enter `mid` on `u-s`, leave on
/// `u-d` (routed by input interface) through the emulator, enter `mid` again on `d-u` and go
/// on to the receiver; one pirated measures on `u-s` and `d-u`.
pub struct TwoPorts {
    pub sender: Netns,
    pub mid: Netns,
    pub receiver: Netns,
    /// `u-d` → `d-u` (`ab`).
    pub segment: EmuLink,
}

impl TwoPorts {
    pub fn new() -> Result<TwoPorts> {
        require_root()?;
        let (sender, mid, receiver) = (Netns::new("snd")?, Netns::new("mid")?, Netns::new("rcv")?);
        veth(&sender, "s-u", &mid, UP_IF)?;
        let segment = EmuLink::between(&mid, "u-d", &mid, DOWN_IF)?;
        veth(&mid, "d-r", &receiver, "r-d")?;
        for (ns, ifname, cidr) in [
            (&sender, "s-u", "10.204.1.1/24"),
            (&mid, UP_IF, "10.204.1.2/24"),
            (&mid, "u-d", "10.204.2.1/24"),
            (&mid, DOWN_IF, "10.204.5.1/24"),
            (&mid, "d-r", "10.204.3.1/24"),
            (&receiver, "r-d", "10.204.3.2/24"),
        ] {
            ns.offloads_off(ifname)?;
            ns.addr(ifname, cidr)?;
        }
        routing(&mid)?;
        // From the sender, towards the receiver through the segment: via a neighbour entry that
        // resolves to the other port.
        let other_port = mid.mac(DOWN_IF)?;
        mid.ip(&["neigh", "add", "10.204.2.2", "lladdr", &other_port, "dev", "u-d", "nud", "permanent"])?;
        mid.ip(&["route", "add", "10.204.3.0/24", "via", "10.204.2.2", "dev", "u-d", "table", "100"])?;
        mid.ip(&["rule", "add", "iif", UP_IF, "lookup", "100"])?;
        sender.route("10.204.3.0/24", "10.204.1.2")?;
        receiver.route("10.204.1.0/24", "10.204.3.1")?;
        Ok(TwoPorts { sender, mid, receiver, segment })
    }
}

/// `pirated replay-segment` over the two captures, with a point's configuration: its lines.
pub fn replay_segment(config: &str, up: &Path, down: &Path) -> Result<Vec<Value>> {
    // One file per call: the tests run side by side and each removes its own.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("pirated-replay-segment-{}-{call}.toml", std::process::id()));
    std::fs::write(&path, format!("interface = \"{UP_IF}\"\n{config}"))?;
    let out = Command::new(workspace_binary("pirated")?)
        .arg("replay-segment")
        .args([OsStr::new("--config"), path.as_os_str(), OsStr::new("--up"), up.as_os_str()])
        .args([OsStr::new("--down"), down.as_os_str()])
        .output()?;
    std::fs::remove_file(&path)?;
    ensure!(out.status.success(), "pirated replay-segment: {}", String::from_utf8_lossy(&out.stderr));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    Ok(out
        .stdout
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(serde_json::from_slice)
        .collect::<Result<_, _>>()?)
}
