//! Network namespaces and veth links for testbeds, torn down by RAII.
//!
//! A [`Netns`] is a named namespace (`ip netns add`), so command-line tools can enter it with
//! `ip netns exec` and Rust code can enter it per thread with [`Netns::run_in`] /
//! [`Netns::spawn_in`]. Dropping it kills whatever still runs inside and deletes it, which also
//! destroys the veth ends it holds (and so their peers).
//!
//! ```no_run
//! use pirate_tests::netns::{veth, Netns};
//! # fn main() -> anyhow::Result<()> {
//! let client = Netns::new("cli")?;
//! let server = Netns::new("srv")?;
//! veth(&client, "eth0", &server, "eth0")?;
//! client.addr("eth0", "10.200.1.1/24")?;
//! server.addr("eth0", "10.200.1.2/24")?;
//! // A socket keeps the namespace it was created in, so create it inside and use it anywhere.
//! let sock = server.run_in(|| std::net::UdpSocket::bind("10.200.1.2:9000"))??;
//! client.run(&["bash", "-c", "echo hi > /dev/udp/10.200.1.2/9000"])?;
//! # drop(sock);
//! # Ok(())
//! # }
//! ```
//!
//! Testbeds use only 10.200.0.0/16 and fd00:200::/64-style addresses, and only inside the
//! namespaces they create. Everything here needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;
use std::thread::{self, JoinHandle};

use anyhow::{anyhow, bail, Context, Result};

/// Every namespace this library creates is named `pt-<prefix>-<pid>-<n>`, which makes names unique
/// per process and lets [`Netns::new`] recognise and remove namespaces leaked by dead processes.
const NAME_PREFIX: &str = "pt-";

/// Fails with a clear message unless the process runs as root. Testbeds cannot work otherwise,
/// and tests must fail loudly rather than pass vacuously when they cannot set up.
pub fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        bail!("testbeds need root (network namespaces, veth, raw sockets); running as uid {euid}");
    }
    Ok(())
}

/// A named network namespace, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates a fresh namespace named after `prefix` (kept short and readable in `ip netns list`)
    /// and brings its loopback up.
    ///
    /// The first call in a process also deletes namespaces left behind by dead processes that used
    /// this library (a test killed by SIGKILL cannot run destructors).
    pub fn new(prefix: &str) -> Result<Netns> {
        static STALE: Once = Once::new();
        static COUNTER: AtomicU32 = AtomicU32::new(0);

        require_root()?;
        STALE.call_once(|| {
            if let Err(e) = remove_stale() {
                eprintln!("netns: removing stale namespaces: {e:#}");
            }
        });
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{NAME_PREFIX}{prefix}-{}-{n}", std::process::id());
        run_checked(Command::new("ip").args(["netns", "add", &name]))?;
        // From here on Drop cleans up, also when the next step fails.
        let ns = Netns { name };
        ns.ip(&["link", "set", "dev", "lo", "up"])?;
        Ok(ns)
    }

    /// The name to use with `ip netns exec` / `ip -n`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip netns exec <name> <args…>` as a [`Command`] for full control over stdio and environment.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).args(args);
        cmd
    }

    /// Runs `args` inside the namespace and returns its stdout. A non-zero exit is an error that
    /// carries the command line and its stderr.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        run_checked(&mut self.command(args))
    }

    /// Starts `args` inside the namespace in the background, with stdin and stdout connected to
    /// /dev/null (a pipe nobody reads would eventually block a chatty server) and stderr inherited
    /// so its complaints show up in the test output. Use [`Netns::command`] to capture output.
    /// Whatever still runs in the namespace when it is dropped is killed.
    pub fn spawn(&self, args: &[&str]) -> Result<Child> {
        self.command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("spawning `{}` in netns {}", args.join(" "), self.name))
    }

    /// `ip -n <name> <args…>`, returning stdout.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        run_checked(Command::new("ip").args(["-n", &self.name]).args(args))
    }

    /// Adds an address (`10.200.1.1/24`, `fd00:200::1/64`) to an interface. IPv6 addresses are
    /// added with `nodad` so that they are usable at once instead of after duplicate detection.
    pub fn addr(&self, ifname: &str, cidr: &str) -> Result<()> {
        let mut args = vec!["addr", "add", cidr, "dev", ifname];
        if cidr.contains(':') {
            args.push("nodad");
        }
        self.ip(&args).map(drop)
    }

    /// Makes `addr` (without prefix length) reachable through `ifname` at `mac` for good, with no
    /// address resolution.
    pub fn neighbour(&self, ifname: &str, addr: &str, mac: &str) -> Result<()> {
        self.ip(&["neigh", "replace", addr, "lladdr", mac, "dev", ifname, "nud", "permanent"]).map(drop)
    }

    /// Adds a route to `dest` (a prefix or `default`) via the gateway `via`.
    pub fn route(&self, dest: &str, via: &str) -> Result<()> {
        self.ip(&["route", "add", dest, "via", via]).map(drop)
    }

    /// Sets a sysctl inside the namespace, e.g. `sysctl("net.ipv4.ip_forward", "1")`.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        self.run(&["sysctl", "-qw", &format!("{key}={value}")]).map(drop)
    }

    /// Turns off the offloads that break relaying frames through userspace, on one interface.
    ///
    /// - `tso`/`gso` off: veth hands TSO/GSO super-frames (up to 64 KiB) to its peer unsegmented;
    ///   a raw socket would read one oversized frame that cannot be sent on a 1500-byte link, and
    ///   an emulator would delay or drop 40 segments as one. Off, every frame is MTU-sized.
    /// - `gro` off: likewise, so frames are not merged on receive.
    /// - `tx` off: with checksum offload a veth frame carries only the pseudo-header sum
    ///   (CHECKSUM_PARTIAL) and the receiving stack trusts it; copied out through AF_PACKET and
    ///   sent again it would arrive with a wrong checksum. Off, the sender's stack fills in real
    ///   checksums.
    /// - `rx` off: veth marks frames it receives as already verified when the receiving end has rx
    ///   checksumming on; off, the receiving stack verifies them, so a bad checksum is a visible
    ///   drop instead of being silently accepted.
    pub fn offloads_off(&self, ifname: &str) -> Result<()> {
        self.run(&["ethtool", "-K", ifname, "tx", "off", "rx", "off", "tso", "off", "gso", "off", "gro", "off"])
            .map(drop)
    }

    /// The interface's index inside the namespace.
    pub fn ifindex(&self, ifname: &str) -> Result<u32> {
        let link = self.link_json(ifname)?;
        let index = link["ifindex"].as_u64().context("no ifindex in `ip -j link`")?;
        Ok(u32::try_from(index)?)
    }

    /// The interface's MAC address, as `ip` prints it (`aa:bb:cc:dd:ee:ff`).
    pub fn mac(&self, ifname: &str) -> Result<String> {
        let link = self.link_json(ifname)?;
        let mac = link["address"].as_str().context("no address in `ip -j link`")?;
        Ok(mac.to_owned())
    }

    fn link_json(&self, ifname: &str) -> Result<serde_json::Value> {
        let out = self.ip(&["-j", "link", "show", "dev", ifname])?;
        let mut links: Vec<serde_json::Value> =
            serde_json::from_str(&out).with_context(|| format!("parsing `ip -j link`: {out}"))?;
        links.pop().ok_or_else(|| anyhow!("no interface {ifname} in netns {}", self.name))
    }

    /// Runs `f` on a new thread that has entered this namespace, waits for it and returns its
    /// result; a panic in `f` is propagated. Sockets created inside `f` stay in this namespace
    /// after they are returned, so the usual pattern is to create them here and use them from
    /// any thread.
    pub fn run_in<T: Send, F: FnOnce() -> T + Send>(&self, f: F) -> Result<T> {
        let ns = self.open()?;
        thread::scope(|scope| {
            let handle = scope.spawn(move || -> Result<T> {
                enter(&ns)?;
                Ok(f())
            });
            handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
        .with_context(|| format!("entering netns {}", self.name))
    }

    /// Starts `f` on a new thread inside this namespace and returns at once. Network namespaces
    /// are per thread on Linux, so this does not affect other threads. Entering cannot fail once
    /// the namespace file is open (as root), so a failure there panics the thread.
    pub fn spawn_in<T, F>(&self, f: F) -> Result<JoinHandle<T>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let ns = self.open()?;
        let name = self.name.clone();
        thread::Builder::new()
            .name(format!("in-{name}"))
            .spawn(move || {
                if let Err(e) = enter(&ns) {
                    panic!("entering netns {name}: {e:#}");
                }
                f()
            })
            .context("spawning thread")
    }

    fn open(&self) -> Result<File> {
        let path = format!("/run/netns/{}", self.name);
        File::open(&path).with_context(|| format!("opening {path}"))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = delete(&self.name) {
            eprintln!("netns: deleting {}: {e:#}", self.name);
        }
    }
}

/// Creates a veth pair with end `a_if` in namespace `a` and `b_if` in `b`, both up. The ends are
/// created directly inside the namespaces, so names only need to be unique per namespace.
pub fn veth(a: &Netns, a_if: &str, b: &Netns, b_if: &str) -> Result<()> {
    run_checked(Command::new("ip").args([
        "link", "add", "name", a_if, "netns", &a.name, "type", "veth", "peer", "name", b_if, "netns", &b.name,
    ]))?;
    a.ip(&["link", "set", "dev", a_if, "up"])?;
    b.ip(&["link", "set", "dev", b_if, "up"])?;
    Ok(())
}

/// Moves the calling thread into the namespace.
fn enter(ns: &File) -> Result<()> {
    // SAFETY: the fd is open for the duration of the call; setns only changes this thread.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error()).context("setns");
    }
    Ok(())
}

/// Kills what runs in the namespace (it would otherwise keep the namespace alive, unnamed, with
/// its interfaces), then deletes it.
fn delete(name: &str) -> Result<()> {
    let pids = run_checked(Command::new("ip").args(["netns", "pids", name]))?;
    let own = std::process::id();
    for pid in pids.split_whitespace().filter_map(|p| p.parse::<u32>().ok()) {
        if pid != own {
            // SAFETY: plain syscall; a pid that already exited just yields ESRCH.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
    }
    run_checked(Command::new("ip").args(["netns", "del", name])).map(drop)
}

/// Deletes namespaces named by this library whose creating process no longer exists.
fn remove_stale() -> Result<()> {
    let list = run_checked(Command::new("ip").args(["netns", "list"]))?;
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(rest) = name.strip_prefix(NAME_PREFIX) else { continue };
        // `<prefix>-<pid>-<n>`: the pid is the second field from the end.
        let Some(pid) = rest.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            delete(name)?;
        }
    }
    Ok(())
}

/// Runs a command to completion; a non-zero exit is an error with the command line and stderr.
fn run_checked(cmd: &mut Command) -> Result<String> {
    let line = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("running {line}"))?;
    if !out.status.success() {
        bail!("{line} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    String::from_utf8(out.stdout).with_context(|| format!("non-UTF-8 output from {line}"))
}

impl Netns {
    /// The interface's MAC address as bytes.
    pub fn mac_octets(&self, ifname: &str) -> Result<[u8; 6]> {
        let mac = self.mac(ifname)?;
        let bytes: Vec<u8> = mac.split(':').map(|h| u8::from_str_radix(h, 16)).collect::<Result<_, _>>()?;
        bytes.try_into().map_err(|b| anyhow::anyhow!("not a MAC address: {b:?}"))
    }

    /// TCP connections accepted in the namespace so far (`PassiveOpens` of /proc/net/snmp, which
    /// is per namespace): the server side's own count of the connections that reached it.
    pub fn tcp_passive_opens(&self) -> Result<u64> {
        let snmp = self.run(&["cat", "/proc/net/snmp"])?;
        let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
        let (names, values) = (tcp.next().context("no Tcp: header")?, tcp.next().context("no Tcp: values")?);
        let column = names.split_whitespace().position(|n| n == "PassiveOpens").context("no PassiveOpens column")?;
        values.split_whitespace().nth(column).context("short Tcp: values")?.parse().context("PassiveOpens")
    }
}
