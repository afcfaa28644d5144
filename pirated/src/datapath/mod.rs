//! The one place that loads, attaches and pins the XDP chain (`pirate_root`, which attaches, and
//! the capability programs it tail-calls through `CHAIN`), advances the epoch and hands out the
//! maps the capabilities drain. `map_batch` and `test_run` are the kernel calls aya 0.13 lacks.

pub mod map_batch;
pub mod test_run;

use std::{
    fs,
    os::fd::{AsFd, AsRawFd},
    path::{Path, PathBuf},
};

use anyhow::{anyhow, bail, Context};
use aya::{
    maps::{Array, Map, MapData, PerCpuArray, ProgramArray},
    programs::{ProgramError, ProgramFd, Xdp, XdpFlags},
    Ebpf, EbpfLoader,
};
use pirate_common::{counters, ctx::CHAIN_PIRATE, maps, pirate::layout::Layout};
use tracing::{info, warn};

use crate::config::{AttachMode, Config};

/// The XDP object built from `pirate-ebpf` by build.rs.
static OBJECT: &[u8] = aya::include_bytes_aligned!(env!("PIRATE_EBPF_OBJ"));

pub const PIN_ROOT: &str = "/sys/fs/bpf/pirated";

/// The program attached to the interface: parses once, then tail-calls the chain.
const ROOT: &str = "pirate_root";

pub struct Datapath {
    ebpf: Ebpf,
    layout: Layout,
    /// `pirate`'s program, to put into (or take out of) its `CHAIN` slot.
    pirate: ProgramFd,
    /// Size of `pirate`'s hand-over ring buffer.
    ring_bytes: u32,
    /// Where the maps are pinned, once attached.
    pin_dir: Option<PathBuf>,
    /// Held while attached: one daemon per instance name.
    lock: Option<fs::File>,
    pub attached_mode: &'static str,
}

/// The epoch the datapath starts in, from load.
pub const FIRST_EPOCH: u32 = 1;

impl Datapath {
    /// Loads the chain for `config` into the kernel, writes its parameters and fills `CHAIN`,
    /// without attaching it anywhere. Errors say what to do: privileges, verifier log.
    pub fn load(config: &Config) -> anyhow::Result<Datapath> {
        let layout = Layout::for_modes(config.pirate.modes);
        let ring_bytes = ring_size(config.max_flows as usize, layout)?;
        let mut ebpf = EbpfLoader::new()
            .set_max_entries(layout.flows_map(), config.max_flows)
            .set_max_entries(layout.unused_flows_map(), 1)
            .set_max_entries(maps::RECORDS, ring_bytes)
            .load(OBJECT)
            .map_err(|e| match e {
                aya::EbpfError::MapError(aya::maps::MapError::CreateError { ref io_error, .. })
                    if io_error.raw_os_error() == Some(libc::EPERM) =>
                {
                    anyhow!("creating BPF maps was refused (EPERM): pirated needs root, or CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN")
                }
                e => anyhow!(e).context("loading the BPF object"),
            })?;
        if let Some(missing) = maps::ALL.iter().find(|name| ebpf.map(name).is_none()) {
            bail!("the XDP object has no map {missing}: pirated and its datapath were built apart");
        }
        Array::<_, pirate_common::pirate::config::Params>::try_from(ebpf.map_mut(maps::CONFIG).unwrap())?
            .set(0, config.params(), 0)
            .context("writing CONFIG")?;
        // Before the program can see a packet: state tagged with an epoch before the first one
        // is never drained (a flow's first packet was lost so when traffic beat the daemon's loop).
        Array::<_, u32>::try_from(ebpf.map_mut(maps::EPOCH).unwrap())?
            .set(0, FIRST_EPOCH, 0)
            .context("writing EPOCH")?;
        // The root first: it owns the program arrays, whose later members must match it.
        for name in [ROOT, layout.program()] {
            let program: &mut Xdp = ebpf.program_mut(name).unwrap().try_into()?;
            program.load().map_err(|e| verifier_error(name, e))?;
        }
        let pirate_program: &Xdp = ebpf.program(layout.program()).unwrap().try_into()?;
        let pirate = pirate_program.fd()?.try_clone().context("duplicating the pirate program's descriptor")?;
        let mut dp = Datapath { ebpf, layout, pirate, ring_bytes, pin_dir: None, lock: None, attached_mode: "none" };
        dp.chain_pirate(true)?;
        Ok(dp)
    }

    /// Puts `pirate` into its `CHAIN` slot, or empties the slot (the datapath benchmark measures
    /// the root alone so).
    pub fn chain_pirate(&mut self, on: bool) -> anyhow::Result<()> {
        let mut chain = ProgramArray::try_from(self.ebpf.map_mut(maps::CHAIN).unwrap())?;
        if on {
            chain.set(CHAIN_PIRATE, &self.pirate, 0).context("chaining pirate")?;
        } else {
            chain.clear_index(&CHAIN_PIRATE).context("unchaining pirate")?;
        }
        Ok(())
    }

    /// Loads the program, attaches it to `config.interface` and pins the maps under
    /// /sys/fs/bpf/pirated/<instance>. Errors say what to do: missing interface, privileges,
    /// verifier log.
    pub fn attach(config: &Config) -> anyhow::Result<Datapath> {
        let iface = &config.interface;
        if iface.is_empty() {
            bail!("no interface: set `interface` in the config or pass --interface");
        }
        let c_iface = std::ffi::CString::new(iface.as_str()).context("interface name")?;
        // SAFETY: a valid NUL-terminated string. (Not /sys/class/net: sysfs may belong to
        // another network namespace than the one pirated runs in.)
        if unsafe { libc::if_nametoindex(c_iface.as_ptr()) } == 0 {
            bail!("interface {iface:?} does not exist in this network namespace (see `ip link`)");
        }
        let mut dp = Self::load(config)?;
        dp.lock = Some(lock_instance(&config.instance)?);
        let program: &mut Xdp = dp.ebpf.program_mut(ROOT).unwrap().try_into()?;
        dp.attached_mode = attach(program, iface, config.attach_mode)?;
        let pin_dir = Path::new(PIN_ROOT).join(&config.instance);
        pin_maps(&dp.ebpf, &pin_dir, dp.layout)?;
        dp.pin_dir = Some(pin_dir);
        info!(interface = %iface, mode = dp.attached_mode, chained = dp.layout.program(), "attached");
        Ok(dp)
    }

    /// The root program, the chain's entry, e.g. to run it with BPF_PROG_TEST_RUN.
    pub fn root_fd(&self) -> anyhow::Result<std::os::fd::BorrowedFd<'_>> {
        let program: &Xdp = self.ebpf.program(ROOT).unwrap().try_into()?;
        Ok(program.fd()?.as_fd())
    }

    /// Per loaded program of the chain, how many instructions the verifier walked to accept it:
    /// it rejects a program past 1 000 000, so this is the headroom left for its per-packet code.
    pub fn verified_instructions(&self) -> anyhow::Result<Vec<(&'static str, Option<u32>)>> {
        [ROOT, self.layout.program()]
            .into_iter()
            .map(|name| {
                let program: &Xdp = self.ebpf.program(name).unwrap().try_into()?;
                Ok((name, program.info()?.verified_instruction_count()))
            })
            .collect()
    }

    /// Loads the object's bare `XDP_PASS` program (the baseline of the datapath benchmark).
    pub fn load_bare_pass(&mut self) -> anyhow::Result<std::os::fd::BorrowedFd<'_>> {
        let program: &mut Xdp = self.ebpf.program_mut("bare_pass").unwrap().try_into()?;
        program.load().map_err(|e| verifier_error("bare_pass", e))?;
        Ok(program.fd()?.as_fd())
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// From now on the datapath tags flow state with `epoch`.
    pub fn set_epoch(&mut self, epoch: u32) -> anyhow::Result<()> {
        Array::<_, u32>::try_from(self.ebpf.map_mut(maps::EPOCH).unwrap())?.set(0, epoch, 0)?;
        Ok(())
    }

    /// The datapath's counters, summed over CPUs, indexed like `pirate_common::counters`.
    pub fn counters(&self) -> anyhow::Result<[u64; counters::COUNT as usize]> {
        let map = PerCpuArray::<_, u64>::try_from(self.ebpf.map(maps::COUNTERS).unwrap())?;
        let mut out = [0u64; counters::COUNT as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = map.get(&(i as u32), 0)?.iter().sum();
        }
        Ok(out)
    }

    /// The kernel's memlock accounting of the flow table, in bytes.
    pub fn flow_table_memlock(&self) -> anyhow::Result<u64> {
        memlock_of_fd(self.flows()?.fd().as_fd().as_raw_fd())
    }

    /// Size of `pirate`'s hand-over ring buffer, in bytes.
    pub fn ring_bytes(&self) -> u64 {
        self.ring_bytes as u64
    }

    /// `pirate`'s flow table (the configured layout's).
    pub fn flows(&self) -> anyhow::Result<&MapData> {
        map_data(self.ebpf.map(self.layout.flows_map()).unwrap())
    }

    /// Takes map `name` out of the datapath, for the one reader that consumes it (a ring buffer).
    pub fn take_map(&mut self, name: &str) -> anyhow::Result<Map> {
        self.ebpf.take_map(name).ok_or_else(|| anyhow!("map {name} was taken already"))
    }
}

impl Drop for Datapath {
    fn drop(&mut self) {
        // The XDP link goes with `ebpf`; the pins would otherwise keep the maps alive.
        if let Some(dir) = &self.pin_dir {
            if let Err(e) = fs::remove_dir_all(dir) {
                warn!(dir = %dir.display(), "removing pins: {e}");
            }
        }
    }
}

fn attach(program: &mut Xdp, iface: &str, mode: AttachMode) -> anyhow::Result<&'static str> {
    let generic = |program: &mut Xdp| {
        program_attach(program, iface, XdpFlags::SKB_MODE).context("attaching in generic mode").map(|_| "generic")
    };
    match mode {
        AttachMode::Native => program_attach(program, iface, XdpFlags::DRV_MODE)
            .context("attaching in native (driver) mode")
            .map(|_| "native"),
        AttachMode::Generic => generic(program),
        AttachMode::Auto => match program_attach(program, iface, XdpFlags::DRV_MODE) {
            Ok(()) => Ok("native"),
            Err(e) => {
                warn!("native XDP attach failed ({e:#}); falling back to generic mode");
                generic(program)
            }
        },
    }
}

fn program_attach(program: &mut Xdp, iface: &str, flags: XdpFlags) -> anyhow::Result<()> {
    program.attach(iface, flags).map(|_| ()).map_err(|e| anyhow!(e))
}

fn verifier_error(name: &str, e: ProgramError) -> anyhow::Error {
    match e {
        ProgramError::LoadError { io_error, verifier_log } => {
            anyhow!("the kernel verifier rejected the XDP program {name} ({io_error}). Verifier log:\n{verifier_log}")
        }
        e => anyhow!(e).context(format!("loading the XDP program {name}")),
    }
}

/// Pins the maps an operator may inspect or another program may share (the flow table, counters,
/// configuration, epoch, and the program arrays: `FORWARD` is where a balancer registers, and the
/// kernel empties a program array when its last descriptor or pin goes). Not the per-CPU
/// scratch maps, nor the hand-over ring buffer, which is pirated's alone to consume.
fn pin_maps(ebpf: &Ebpf, dir: &Path, layout: Layout) -> anyhow::Result<()> {
    if dir.exists() {
        // A previous run that died without cleaning up; its pins hold nothing we reuse.
        fs::remove_dir_all(dir).with_context(|| format!("removing stale pins in {}", dir.display()))?;
    }
    ensure_bpffs()?;
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, map) in ebpf.maps() {
        let unused = [maps::BLANK, maps::CTX, maps::RECORDS, layout.unused_flows_map()].contains(&name);
        if !unused {
            map.pin(dir.join(name)).with_context(|| format!("pinning {name} in {}", dir.display()))?;
        }
    }
    Ok(())
}

pub const LOCK_DIR: &str = "/run/pirated";

/// Takes /run/pirated/<instance>.lock, so that a second daemon with the same instance name (and
/// pin directory) fails instead of removing the first one's pins.
fn lock_instance(instance: &str) -> anyhow::Result<fs::File> {
    use std::os::fd::AsRawFd;
    fs::create_dir_all(LOCK_DIR).with_context(|| format!("creating {LOCK_DIR}"))?;
    let path = Path::new(LOCK_DIR).join(format!("{instance}.lock"));
    let file = fs::File::create(&path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        bail!(
            "instance {instance:?} is already running ({} is locked): give this daemon another `instance`",
            path.display()
        );
    }
    Ok(file)
}

/// Mounts bpffs on /sys/fs/bpf unless it is there: a fresh boot has none, and `ip netns exec`
/// gives its commands a new /sys without it.
fn ensure_bpffs() -> anyhow::Result<()> {
    const BPF_FS_MAGIC: i64 = 0xcafe4a11;
    let path = std::ffi::CString::new("/sys/fs/bpf").unwrap();
    // SAFETY: statfs writes into the zeroed struct; the path is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } == 0 && st.f_type as i64 == BPF_FS_MAGIC {
        return Ok(());
    }
    let fstype = std::ffi::CString::new("bpf").unwrap();
    // SAFETY: all pointers are valid NUL-terminated strings; no data argument.
    let rc = unsafe { libc::mount(fstype.as_ptr(), path.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        bail!("/sys/fs/bpf is not a bpffs mount and mounting one failed: {}", std::io::Error::last_os_error());
    }
    info!("mounted bpffs on /sys/fs/bpf");
    Ok(())
}

/// Ring buffer size: a power of two of at least one page holding one record (and the kernel's
/// 8-byte header) per flow. Records only accumulate between an epoch flip and the drain that
/// follows; pirated discards the stale ones as they arrive in between.
fn ring_size(flows: usize, layout: Layout) -> anyhow::Result<u32> {
    let bytes = (flows * (layout.record_size() + 8)).max(4096).next_power_of_two();
    if bytes > 1 << 30 {
        bail!("max_flows = {flows} needs a {bytes}-byte hand-over ring buffer, over the 1 GiB limit");
    }
    Ok(bytes as u32)
}

fn map_data(map: &Map) -> anyhow::Result<&MapData> {
    match map {
        Map::LruHashMap(d) | Map::HashMap(d) => Ok(d),
        _ => bail!("not a hash map"),
    }
}

/// Reads `memlock:` from /proc/self/fdinfo/<fd>, which the kernel fills for BPF maps.
fn memlock_of_fd(fd: i32) -> anyhow::Result<u64> {
    let info = fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))?;
    info.lines()
        .find_map(|l| l.strip_prefix("memlock:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow!("no memlock in fdinfo"))
}
