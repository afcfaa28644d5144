//! pirated as its systemd unit runs it (configs/pirated.service, staged by `cargo xtask install`):
//! the unit passes `systemd-analyze verify` and installing again keeps what an operator wrote;
//! pirated, as the unit's user with the unit's capabilities and no others, attaches, measures,
//! restarts onto the pins it left and detaches; without any one of them it stops at start, saying
//! what it needs. PID 1 need not be systemd: setpriv gives the unit's user, capabilities and no
//! new privileges, a mount namespace its runtime directory, and the unit's own `ExecStartPre=`
//! commands make the pin directory.

use std::{
    collections::BTreeSet,
    ffi::CString,
    fs,
    io::{self, BufRead, BufReader},
    net::UdpSocket,
    os::{
        fd::AsRawFd,
        unix::{
            fs::{chown, MetadataExt},
            process::CommandExt,
        },
    },
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{bail, ensure, Context, Result};
use pirate_tests::{
    netns::{require_root, Netns},
    testbed::{exit_within, metric, wait_until, workspace_binary, OnePoint, CLIENT_IP, SERVER_IP, VP_CLIENT_IF},
};
use pirated::datapath::{pins::LOCK_DIR, DEFAULT_PIN_ROOT, NEEDS_ROOT};
use xtask::install::{install, settings, verify, Layout};

/// pirated's /metrics, in the testbed's `vp` namespace.
const LISTEN: &str = "127.0.0.1:9464";
const MEASURED: &str = "pirated_packets_total{outcome=\"measured\"}";

/// The service installed into a directory of its own, with a pin root of its own under
/// /sys/fs/bpf; both removed on drop (which detaches whatever stayed pinned).
struct Staged {
    dir: PathBuf,
    layout: Layout,
    unit: String,
    pin_root: PathBuf,
}

impl Staged {
    fn install(name: &str) -> Result<Staged> {
        require_root()?;
        let tag = format!("pirated-service-{name}-{}", std::process::id());
        let dir = std::env::temp_dir().join(&tag);
        let layout = Layout { prefix: dir.join("usr"), sysconfdir: dir.join("etc") };
        let mut staged = Staged { dir, layout, unit: String::new(), pin_root: Path::new("/sys/fs/bpf").join(tag) };
        install(&staged.layout, &workspace_binary("pirated")?)?;
        staged.unit = fs::read_to_string(staged.layout.unit_path())?;
        Ok(staged)
    }

    /// The unit's (first) value of `key`.
    fn setting(&self, key: &str) -> Result<&str> {
        settings(&self.unit, key).next().with_context(|| format!("the unit has no {key}="))
    }

    /// The capabilities the unit grants, as setpriv and capsh name them (`net_admin`): its ambient
    /// set, which must be its bounding set too.
    fn capabilities(&self) -> Result<BTreeSet<String>> {
        let set = |key| -> Result<BTreeSet<String>> {
            let names = self.setting(key)?.split_whitespace();
            Ok(names.map(|c| c.trim_start_matches("CAP_").to_lowercase()).collect())
        };
        let ambient = set("AmbientCapabilities")?;
        ensure!(ambient == set("CapabilityBoundingSet")?, "the unit's ambient and bounding sets differ");
        Ok(ambient)
    }

    /// The runtime directory (`RuntimeDirectory=`), the user's, that pirated gets as /run/pirated.
    fn run_dir(&self) -> PathBuf {
        self.dir.join("run")
    }

    /// Readies what the unit readies for pirated, with this test's pin root: the unit's own
    /// `ExecStartPre=` commands, as root (as `+` runs them), and the runtime directory; then
    /// writes `config` as the unit's configuration.
    fn prepare(&self, config: &str) -> Result<()> {
        let pin_root = self.pin_root.to_str().context("pin root")?;
        for line in settings(&self.unit, "ExecStartPre") {
            let command = line.strip_prefix('+').with_context(|| format!("ExecStartPre={line} runs without root"))?;
            let args: Vec<&str> =
                command.split_whitespace().map(|a| if a == DEFAULT_PIN_ROOT { pin_root } else { a }).collect();
            let status = Command::new(args[0]).args(&args[1..]).status()?;
            ensure!(status.success(), "ExecStartPre={line}: {status}");
        }
        let (uid, gid) = ids(self.setting("User")?)?;
        let pins = fs::metadata(&self.pin_root)?;
        ensure!((pins.uid(), pins.mode() & 0o777) == (uid, 0o700), "the pin root is not the user's alone");
        fs::create_dir_all(self.run_dir())?;
        chown(self.run_dir(), Some(uid), Some(gid))?;
        fs::create_dir_all(LOCK_DIR)?;
        let own = format!("pin_root = \"{pin_root}\"\n[metrics]\nlisten = \"{LISTEN}\"\n");
        fs::write(self.layout.config(), format!("interface = \"{VP_CLIENT_IF}\"\n{config}{own}"))?;
        Ok(())
    }

    /// The unit's `ExecStart=` command line.
    fn exec_start(&self) -> Result<Vec<String>> {
        Ok(self.setting("ExecStart")?.split_whitespace().map(str::to_owned).collect())
    }

    /// `pirated detach` of the unit's configuration.
    fn detach_command(&self) -> Result<Vec<String>> {
        let config = self.layout.config().to_string_lossy().into_owned();
        Ok(vec![self.exec_start()?.remove(0), "detach".into(), "--config".into(), config])
    }

    /// `argv` run as the unit runs pirated, in `ns`: as the unit's user, with `caps` alone
    /// (inheritable, ambient and bounding) and no new privileges, in a mount namespace where the
    /// runtime directory is /run/pirated and /sys/fs/bpf holds the pin root alone.
    fn spawn(&self, ns: &Netns, caps: &BTreeSet<String>, argv: &[String]) -> Result<Child> {
        let user = self.setting("User")?;
        let caps: String = std::iter::once("-all".to_owned()).chain(caps.iter().map(|c| format!(",+{c}"))).collect();
        let mut cmd = Command::new("setpriv");
        cmd.args([
            format!("--reuid={user}"),
            format!("--regid={user}"),
            "--init-groups".into(),
            "--no-new-privs".into(),
        ])
        .args([format!("--inh-caps={caps}"), format!("--ambient-caps={caps}"), format!("--bounding-set={caps}")])
        .args(argv)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        let netns = fs::File::open(format!("/run/netns/{}", ns.name()))?;
        let (fd, run_dir, lock_dir) = (netns.as_raw_fd(), cstring(&self.run_dir())?, cstring(Path::new(LOCK_DIR))?);
        let pins = cstring(&self.pin_root)?;
        // SAFETY: between fork and exec the closure makes system calls alone, on a descriptor
        // `netns` holds open until `spawn` returns and on strings it owns.
        unsafe { cmd.pre_exec(move || enter(fd, &run_dir, &lock_dir, &pins)) };
        cmd.spawn().context("spawning setpriv")
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.pin_root);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// In a child about to exec: into the network namespace `netns`, and into a mount namespace of its
/// own where `run_dir` is bound on `lock_dir` and, as the unit's `TemporaryFileSystem=` and
/// `BindPaths=` make it, /sys/fs/bpf is a tmpfs holding the host's `pins` alone (the host's
/// bpffs is root's alone, mode 0700). The rest stays the host's.
fn enter(netns: i32, run_dir: &CString, lock_dir: &CString, pins: &CString) -> io::Result<()> {
    const OPEN_TREE_CLONE: libc::c_long = 1;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_long = 4;
    let ok = |rc: i32| if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) };
    let null = std::ptr::null::<libc::c_char>();
    // SAFETY: plain system calls on valid NUL-terminated paths (or none) and open descriptors.
    unsafe {
        ok(libc::setns(netns, libc::CLONE_NEWNET))?;
        ok(libc::unshare(libc::CLONE_NEWNS))?;
        ok(libc::mount(null, c"/".as_ptr(), null, libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()))?;
        ok(libc::mount(run_dir.as_ptr(), lock_dir.as_ptr(), null, libc::MS_BIND, std::ptr::null()))?;
        // The pin root, held as a detached copy of its mount while the tmpfs covers its parent.
        let tree = libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, pins.as_ptr(), OPEN_TREE_CLONE) as i32;
        if tree < 0 {
            return Err(io::Error::last_os_error());
        }
        ok(libc::mount(
            c"tmpfs".as_ptr(),
            c"/sys/fs/bpf".as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            c"mode=0755".as_ptr().cast(),
        ))?;
        ok(libc::mkdir(pins.as_ptr(), 0o700))?;
        let moved = libc::syscall(
            libc::SYS_move_mount,
            tree,
            c"".as_ptr(),
            libc::AT_FDCWD,
            pins.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        );
        ok(moved as i32)?;
        ok(libc::close(tree))
    }
}

fn cstring(path: &Path) -> Result<CString> {
    Ok(CString::new(path.as_os_str().as_encoded_bytes())?)
}

/// The uid and gid of `user`.
fn ids(user: &str) -> Result<(u32, u32)> {
    let name = CString::new(user)?;
    // SAFETY: a NUL-terminated name; the entry is read before any other getpw* call.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    ensure!(!entry.is_null(), "no user {user}");
    // SAFETY: not null: a valid passwd entry.
    Ok(unsafe { ((*entry).pw_uid, (*entry).pw_gid) })
}

/// pirated's stderr, read as it comes so that it never blocks on a full pipe.
struct Log {
    lines: Arc<Mutex<Vec<String>>>,
    reader: JoinHandle<()>,
}

impl Log {
    fn of(child: &mut Child) -> Result<Log> {
        let stderr = BufReader::new(child.stderr.take().context("stderr")?);
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader =
            std::thread::spawn(move || stderr.lines().map_while(Result::ok).for_each(|l| sink.lock().unwrap().push(l)));
        Ok(Log { lines, reader })
    }

    /// The first line holding `what`, once logged; an error if pirated exits first.
    fn wait_for(&self, child: &mut Child, what: &str) -> Result<String> {
        let found = || self.lines.lock().unwrap().iter().find(|l| l.contains(what)).cloned();
        wait_until(Duration::from_secs(30), &format!("pirated logged no {what:?}"), || {
            if let Some(status) = child.try_wait()? {
                bail!("pirated exited with {status}: {:#?}", self.lines.lock().unwrap());
            }
            Ok(found().is_some())
        })?;
        Ok(found().unwrap())
    }

    /// Everything logged, once pirated has exited.
    fn all(self) -> String {
        let _ = self.reader.join();
        self.lines.lock().unwrap().join("\n")
    }
}

/// Sends a datagram from each of 8 client flows every 50 ms until pirated's /metrics count more
/// than `beyond` measured packets; returns the count.
fn measure(tb: &OnePoint, beyond: f64) -> Result<f64> {
    let socks: Vec<UdpSocket> = (0..8)
        .map(|_| tb.client.run_in(|| UdpSocket::bind((CLIENT_IP, 0)))?.map_err(Into::into))
        .collect::<Result<_>>()?;
    let mut measured = 0.0;
    wait_until(Duration::from_secs(20), &format!("no more than {beyond} packets measured"), || {
        for s in &socks {
            s.send_to(b"x", (SERVER_IP, 9005))?;
        }
        let page = tb.vp.run(&["curl", "-sf", &format!("http://{LISTEN}/metrics")])?;
        measured = if page.contains(MEASURED) { metric(&page, MEASURED) } else { 0.0 };
        Ok(measured > beyond)
    })?;
    Ok(measured)
}

/// The capabilities in set `set` (`CapEff`, `CapBnd`, …) of process `pid`, named as capsh
/// decodes them.
fn capabilities_of(pid: u32, set: &str) -> Result<BTreeSet<String>> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let hex = status.lines().find_map(|l| l.strip_prefix(&format!("{set}:"))).context("no such set")?.trim();
    let decoded = Command::new("capsh").arg(format!("--decode=0x{hex}")).output()?;
    let names = String::from_utf8(decoded.stdout)?;
    let names = names.trim().split_once('=').context("capsh --decode")?.1;
    Ok(names.split(',').filter(|n| !n.is_empty()).map(|n| n.trim_start_matches("cap_").to_owned()).collect())
}

/// SIGTERM, then a clean exit.
fn stop(child: &mut Child) -> Result<()> {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = exit_within(child, Duration::from_secs(10))?;
    ensure!(status.success(), "pirated exited with {status}");
    Ok(())
}

/// The unit, as installed with its binary and configuration, passes `systemd-analyze verify`
/// with nothing to say (`install` fails otherwise, and fails a unit systemd would warn about);
/// installing again keeps the operator's configuration and the unit as they were.
#[test]
fn the_unit_verifies_and_installing_again_keeps_the_configuration() -> Result<()> {
    let staged = Staged::install("verify")?;
    let (binary, config) = (staged.layout.binary(), staged.layout.config());
    let exec_start = format!("{} run --config {}", binary.display(), config.display());
    ensure!(staged.setting("ExecStart")? == exec_start, "ExecStart={}", staged.setting("ExecStart")?);
    let (_, gid) = ids(staged.setting("User")?)?;
    let meta = fs::metadata(&config)?;
    ensure!(
        (meta.uid(), meta.gid(), meta.mode() & 0o777) == (0, gid, 0o640),
        "the configuration is not root's and the user's group's alone"
    );

    let mine = "# the operator's\ninterface = \"eth9\"\n";
    fs::write(&config, mine)?;
    install(&staged.layout, &workspace_binary("pirated")?)?;
    ensure!(fs::read_to_string(&config)? == mine, "installing again replaced the operator's configuration");
    ensure!(fs::read_to_string(staged.layout.unit_path())? == staged.unit, "installing again changed the unit");

    let broken = staged.dir.join("broken/pirated.service");
    fs::create_dir_all(broken.parent().unwrap())?;
    fs::write(&broken, staged.unit.replace("NoNewPrivileges=yes", "NoNewPrivilege=yes"))?;
    let refused = verify(&broken).err().context("a misspelt key passed systemd-analyze verify")?;
    eprintln!("a misspelt key: {refused:#}");
    Ok(())
}

/// As the unit's user with the unit's capabilities alone (and all of them held, none more),
/// pirated attaches to the testbed's interface and measures its traffic; restarted, it takes over
/// the maps and the chain it left pinned; `pirated detach` as the same user removes them.
#[test]
fn pirated_runs_with_the_units_capabilities_alone() -> Result<()> {
    let tb = OnePoint::new()?;
    let staged = Staged::install("run")?;
    staged.prepare("instance = \"service\"\nepoch = \"100ms\"\n")?;
    let caps = staged.capabilities()?;
    let (uid, _) = ids(staged.setting("User")?)?;

    let mut pirated = staged.spawn(&tb.vp, &caps, &staged.exec_start()?)?;
    let log = Log::of(&mut pirated)?;
    let attached = log.wait_for(&mut pirated, "attached")?;
    eprintln!("first start: {attached}");
    let pid = pirated.id();
    for set in ["CapEff", "CapPrm", "CapBnd", "CapAmb"] {
        let held = capabilities_of(pid, set)?;
        ensure!(held == caps, "pirated's {set} is {held:?}, not the unit's {caps:?}");
    }
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let uids = status.lines().find_map(|l| l.strip_prefix("Uid:")).context("Uid")?;
    ensure!(uids.split_whitespace().all(|u| u == uid.to_string()), "pirated runs as uids {uids}, not {uid}");
    ensure!(status.lines().any(|l| l == "NoNewPrivs:\t1"), "pirated may gain privileges");
    let measured = measure(&tb, 0.0)?;
    eprintln!("{measured} packets measured");
    stop(&mut pirated)?;

    let mut pirated = staged.spawn(&tb.vp, &caps, &staged.exec_start()?)?;
    let log = Log::of(&mut pirated)?;
    let restarted = log.wait_for(&mut pirated, "attached")?;
    eprintln!("restart: {restarted}");
    ensure!(restarted.contains("replaced in place") && restarted.contains("maps=\"reused\""), "{restarted}");
    let more = measure(&tb, measured)?;
    eprintln!("{more} packets measured, counting on from the pinned counters");
    stop(&mut pirated)?;
    let chained =
        || -> Result<bool> { Ok(tb.vp.ip(&["-d", "link", "show", "dev", VP_CLIENT_IF])?.contains("prog/xdp")) };
    ensure!(chained()?, "stopping took the chain off the interface (on_exit = \"keep\")");

    let mut detach = staged.spawn(&tb.vp, &caps, &staged.detach_command()?)?;
    let log = Log::of(&mut detach)?;
    let status = exit_within(&mut detach, Duration::from_secs(10))?;
    let said = log.all();
    ensure!(status.success(), "pirated detach: {status}: {said}");
    ensure!(!staged.pin_root.join("service").exists(), "pins left after detach: {said}");
    wait_until(Duration::from_secs(5), "the chain stayed on the interface", || Ok(!chained()?))
}

/// Without the unit's capabilities, the user alone, and without any one of them, pirated stops
/// at start with exit status 1 and says what it needs; it never attaches, nor panics.
#[test]
fn without_any_of_the_units_capabilities_pirated_says_what_it_needs() -> Result<()> {
    let tb = OnePoint::new()?;
    let staged = Staged::install("nocaps")?;
    staged.prepare("instance = \"service\"\n")?;
    let caps = staged.capabilities()?;
    let mut cases = vec![("none".to_owned(), BTreeSet::new())];
    for missing in &caps {
        cases.push((format!("all but {missing}"), caps.iter().filter(|c| *c != missing).cloned().collect()));
    }
    for (what, held) in cases {
        let mut pirated = staged.spawn(&tb.vp, &held, &staged.exec_start()?)?;
        let log = Log::of(&mut pirated)?;
        let status = exit_within(&mut pirated, Duration::from_secs(30))?;
        let said = log.all();
        let error = said.lines().find(|l| l.starts_with("pirated: error")).unwrap_or_default();
        eprintln!("{what}: {status}: {error}");
        ensure!(status.code() == Some(1), "{what}: pirated exited with {status}:\n{said}");
        ensure!(error.contains(NEEDS_ROOT), "{what}: pirated did not say what it needs:\n{said}");
        ensure!(!said.contains("panicked") && !said.contains("attached"), "{what}:\n{said}");
    }
    Ok(())
}
