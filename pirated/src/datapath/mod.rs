//! The one place that loads, attaches and pins the XDP chain (`pirate_root`, which attaches, and
//! the capability programs it tail-calls through `CHAIN`), advances the epoch and hands out the
//! maps the capabilities drain. `table` maps `pirate`'s flow table into the daemon; `test_run`
//! and `percpu` are the kernel calls pirated makes without aya (`bpf_call`).

mod bpf_call;
mod lb;
pub mod memlock;
mod mmap;
pub mod percpu;
pub mod pins;
mod privileges;
pub mod segment;
pub mod spec;
pub mod table;
pub mod test_run;

use std::{
    fs,
    os::fd::{AsFd, AsRawFd},
    path::Path,
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{anyhow, bail, Context};
use aya::{
    maps::{Array, Map, MapData, ProgramArray},
    programs::{
        links::{FdLink, PinnedLink},
        xdp::{XdpLink, XdpLinkId},
        ProgramError, ProgramFd, Xdp, XdpFlags,
    },
    Ebpf, EbpfLoader,
};
use pirate_common::{
    counters,
    ctx::{CHAIN_FRIDGE, CHAIN_PIRATE, CHAIN_SEGMENT},
    fridge::{Fridges, MAX_FRIDGES},
    maps,
    pirate::{layout::Layout, table::sets_for},
    segment::SegmentShape,
};
use tracing::{info, warn};

use pins::PinDir;
pub use privileges::NEEDS_ROOT;
use privileges::{has_capability, CAP_PERFMON};
pub use spec::{AttachMode, OnExit, Spec};
use table::FlowTable;

/// The XDP object built from `pirate-ebpf` by build.rs.
static OBJECT: &[u8] = aya::include_bytes_aligned!(env!("PIRATE_EBPF_OBJ"));

/// Where instances pin their maps and links unless `pin_root` says otherwise.
pub const DEFAULT_PIN_ROOT: &str = "/sys/fs/bpf/pirated";

/// The program attached to the interface: parses once, then tail-calls the chain.
const ROOT: &str = "pirate_root";
/// The fridge capability's program.
const FRIDGE: &str = "fridge";
/// The segment capability's program.
const SEGMENT: &str = "segment";

/// A measuring program of the chain, at its `CHAIN` slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capability {
    Pirate,
    Fridge,
    Segment,
}

pub struct Datapath {
    ebpf: Ebpf,
    layout: Layout,
    /// The capabilities' programs, to put into (or take out of) their `CHAIN` slots.
    pirate: ProgramFd,
    fridge: ProgramFd,
    segment: ProgramFd,
    /// Size of `pirate`'s hand-over ring buffer.
    ring_bytes: u32,
    /// `pirate`'s flow table, mapped.
    table: FlowTable,
    /// The epoch the datapath was in when loaded (the pinned one, on a restart).
    epoch: u32,
    /// Where the maps and the link are pinned, once attached, and what to do with them at exit.
    pins: Option<(PinDir, OnExit)>,
    pub attached_mode: &'static str,
    /// Possible CPUs: the per-CPU maps' value count.
    cpus: usize,
    /// The forwarder's rings, mapped.
    rings: mmap::Mapped,
}

/// The epoch the datapath starts in, from load.
pub const FIRST_EPOCH: u32 = 1;

impl Datapath {
    /// Loads the chain `spec` asks for into the kernel, writes its parameters and fills `CHAIN`,
    /// without attaching it anywhere, and with maps of its own (pinned while loading, in a
    /// directory removed at once): for benchmarks and tests. Errors say what to do: privileges,
    /// verifier log.
    pub fn load(spec: &Spec) -> anyhow::Result<Datapath> {
        static LOADS: AtomicU32 = AtomicU32::new(0);
        let root = Path::new(DEFAULT_PIN_ROOT);
        pins::ensure_bpffs(root)?;
        let n = LOADS.fetch_add(1, Ordering::Relaxed);
        // bpffs refuses names with dots.
        let dir = root.join(format!("load-{}-{n}", std::process::id()));
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let dp = Self::load_pinned(spec, &dir, false);
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        dp
    }

    /// Loads the chain with its maps pinned by name in `dir`: the ones there are reused, with the
    /// epoch they hold, if `reuse` (a restart); else created and pinned.
    fn load_pinned(spec: &Spec, dir: &Path, reuse: bool) -> anyhow::Result<Datapath> {
        let (pirate, fridge, segment) = (&spec.pirate, &spec.fridge, &spec.segment);
        let layout = pirate.layout;
        let ring_bytes = ring_size(pirate.max_flows as usize, layout);
        // Before 5.11 the maps count against the locked-memory limit.
        let memlock = memlock::raise().ok().flatten();
        let mut ebpf = EbpfLoader::new()
            .map_pin_path(dir)
            .set_max_entries(layout.flows_map(), sets_for(pirate.max_flows))
            .set_max_entries(layout.unused_flows_map(), 1)
            .set_max_entries(maps::V6_NAMES, pirate.max_flows)
            .set_max_entries(maps::RECORDS, ring_bytes)
            .set_max_entries(maps::FRIDGE_SLOTS, fridge.shape.slots())
            .set_max_entries(maps::FRIDGE_SAMPLES, fridge.ring_bytes)
            .set_max_entries(maps::LB_RINGS, spec.lb.ring_entries)
            .set_max_entries(maps::LB_CONNS, spec.lb.max_connections)
            .set_max_entries(maps::SEGMENT_LDA, segment.lda_entries)
            .set_max_entries(maps::SEGMENT_RDA, segment.rda_entries)
            .set_max_entries(maps::SEGMENT_CACHE, segment.cache_ring_bytes)
            .load(OBJECT)
            .map_err(|e| match e {
                aya::EbpfError::MapError(aya::maps::MapError::CreateError { ref io_error, .. })
                    if io_error.raw_os_error() == Some(libc::EPERM) =>
                {
                    match (memlock, memlock::release().map(|r| memlock::charged(&r))) {
                        (Some(bytes), Ok(true)) => anyhow!(
                            "creating BPF maps was refused (EPERM): this kernel (before 5.11) charges them to \
                             the locked-memory limit, {bytes} bytes, which pirated could not raise: run it with \
                             CAP_SYS_RESOURCE or a higher limit (`ulimit -l unlimited`, systemd LimitMEMLOCK=infinity)"
                        ),
                        _ => anyhow!("creating BPF maps was refused (EPERM): {NEEDS_ROOT}"),
                    }
                }
                e => anyhow!(e).context("loading the BPF object"),
            })?;
        if let Some(missing) = maps::ALL.iter().find(|name| ebpf.map(name).is_none()) {
            bail!("the XDP object has no map {missing}: pirated and its datapath were built apart");
        }
        Array::<_, pirate_common::pirate::config::Params>::try_from(ebpf.map_mut(maps::CONFIG).unwrap())?
            .set(0, pirate.params, 0)
            .context("writing CONFIG")?;
        let mut epochs = Array::<_, u32>::try_from(ebpf.map_mut(maps::EPOCH).unwrap())?;
        let epoch = if reuse {
            epochs.get(&0, 0).context("reading the pinned EPOCH")?.max(FIRST_EPOCH)
        } else {
            // Before the program can see a packet: state tagged with an epoch before the first
            // one is never drained.
            epochs.set(0, FIRST_EPOCH, 0).context("writing EPOCH")?;
            FIRST_EPOCH
        };
        // The root first: it owns the program arrays, whose later members must match it.
        for name in programs(layout) {
            let program: &mut Xdp = ebpf.program_mut(name).unwrap().try_into()?;
            program.load().map_err(|e| verifier_error(name, e))?;
        }
        let roll_over: &Xdp = ebpf.program(layout.flow_program()).unwrap().try_into()?;
        let roll_over = roll_over.fd()?.try_clone().context("duplicating the epoch program's descriptor")?;
        ProgramArray::try_from(ebpf.map_mut(maps::PIRATE_FLOW).unwrap())?
            .set(0, &roll_over, 0)
            .context("filling PIRATE_FLOW")?;
        let pirate_program: &Xdp = ebpf.program(layout.program()).unwrap().try_into()?;
        let pirate = pirate_program.fd()?.try_clone().context("duplicating the pirate program's descriptor")?;
        let fridge_program: &Xdp = ebpf.program(FRIDGE).unwrap().try_into()?;
        let fridge = fridge_program.fd()?.try_clone().context("duplicating the fridge program's descriptor")?;
        let segment_program: &Xdp = ebpf.program(SEGMENT).unwrap().try_into()?;
        let segment = segment_program.fd()?.try_clone().context("duplicating the segment program's descriptor")?;
        let table = FlowTable::map(array(&ebpf, layout.flows_map())?).context("mapping the flow table")?;
        let cpus = aya::util::nr_cpus().map_err(|(path, e)| anyhow!("reading {path}: {e}"))?;
        let rings = mmap::Mapped::of(array(&ebpf, maps::LB_RINGS)?).context("mapping LB_RINGS")?;
        let mut dp = Datapath {
            ebpf,
            layout,
            pirate,
            fridge,
            segment,
            ring_bytes,
            table,
            epoch,
            pins: None,
            attached_mode: "none",
            cpus,
            rings,
        };
        // Before the fridge is chained: it reads its shape from the first packet on.
        dp.set_fridge_shape(spec.fridge.shape)?;
        dp.chain(Capability::Pirate, true)?;
        dp.chain(Capability::Fridge, spec.fridge.enabled)?;
        Array::<_, SegmentShape>::try_from(dp.ebpf.map_mut(maps::SEGMENT_SHAPE).unwrap())?
            .set(0, spec.segment.shape, 0)
            .context("writing SEGMENT_SHAPE")?;
        dp.chain(Capability::Segment, spec.segment.enabled)?;
        Ok(dp)
    }

    /// Puts a capability into its `CHAIN` slot, or empties the slot (the datapath benchmark
    /// measures the root alone so).
    pub fn chain(&mut self, capability: Capability, on: bool) -> anyhow::Result<()> {
        let (slot, program) = match capability {
            Capability::Pirate => (CHAIN_PIRATE, &self.pirate),
            Capability::Fridge => (CHAIN_FRIDGE, &self.fridge),
            Capability::Segment => (CHAIN_SEGMENT, &self.segment),
        };
        let mut chain = ProgramArray::try_from(self.ebpf.map_mut(maps::CHAIN).unwrap())?;
        if on {
            return chain.set(slot, program, 0).with_context(|| format!("chaining {capability:?}"));
        }
        match chain.clear_index(&slot) {
            // Empty already.
            Err(aya::maps::MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            cleared => cleared.with_context(|| format!("unchaining {capability:?}")),
        }
    }

    /// Writes the fridges' shape (pirated recalibrates their entry probabilities so).
    pub fn set_fridge_shape(&mut self, shape: Fridges) -> anyhow::Result<()> {
        Array::<_, Fridges>::try_from(self.ebpf.map_mut(maps::FRIDGE_SHAPE).unwrap())?
            .set(0, shape, 0)
            .context("writing FRIDGE_SHAPE")
    }

    /// The requests offered to each fridge so far.
    pub fn fridge_offered(&self) -> anyhow::Result<[u64; MAX_FRIDGES]> {
        let offered = Array::<_, u64>::try_from(self.ebpf.map(maps::FRIDGE_OFFERED).unwrap())?;
        let mut out = [0; MAX_FRIDGES];
        for (k, slot) in out.iter_mut().enumerate() {
            *slot = offered.get(&(k as u32), 0).context("reading FRIDGE_OFFERED")?;
        }
        Ok(out)
    }

    /// Loads the chain, pins it under `<pin_root>/<instance>` and attaches it to
    /// `spec.interface`. What a previous run left there is taken over: maps of the same layout
    /// are reused (every flow keeps its epoch) and a chain still attached to the interface gets
    /// the new root in place (`bpf_link_update`), so no packet goes unmeasured. Errors say what
    /// to do: missing interface, privileges, verifier log.
    pub fn attach(spec: &Spec) -> anyhow::Result<Datapath> {
        let iface = &spec.interface;
        if iface.is_empty() {
            bail!("no interface: set `interface` in the config or pass --interface");
        }
        let c_iface = std::ffi::CString::new(iface.as_str()).context("interface name")?;
        // SAFETY: a valid NUL-terminated string. (Not /sys/class/net: sysfs may belong to
        // another network namespace than the one pirated runs in.)
        if unsafe { libc::if_nametoindex(c_iface.as_ptr()) } == 0 {
            bail!("interface {iface:?} does not exist in this network namespace (see `ip link`)");
        }
        let layout = spec.layout_tag();
        let (pins, reuse) = PinDir::open(Path::new(&spec.pin_root), &spec.instance, &layout)?;
        let mut dp = Self::load_pinned(spec, pins.path(), reuse)?;
        if !reuse {
            pins.mark(&layout)?;
        }
        for other in pins.other_links(iface)? {
            // Unpinned, the link goes (and the chain leaves that interface) once nothing holds it.
            fs::remove_file(&other).with_context(|| format!("removing {}", other.display()))?;
            info!(link = %other.display(), "the instance moved to {iface}: detached its chain from the old interface");
        }
        let link = pins.link(iface);
        let root: &mut Xdp = dp.ebpf.program_mut(ROOT).unwrap().try_into()?;
        dp.attached_mode = if link.exists() {
            let pinned = PinnedLink::from_pin(&link).with_context(|| format!("opening {}", link.display()))?;
            let xdp = XdpLink::try_from(FdLink::from(pinned)).context("the pinned link is not an XDP link")?;
            root.attach_to_link(xdp).context("replacing the attached root program")?;
            "replaced in place"
        } else {
            let (id, mode) = match attach(root, iface, spec.attach_mode) {
                Ok(attached) => attached,
                Err(e) => {
                    if !reuse {
                        // Nothing of this instance runs: its fresh pins would only be left over.
                        pins.remove()?;
                    }
                    return Err(e);
                }
            };
            let fd_link = FdLink::try_from(root.take_link(id)?)
                .context("XDP attached without a bpf_link (Linux before 5.9): restarts cannot keep it")?;
            fd_link.pin(&link).with_context(|| format!("pinning the XDP link at {}", link.display()))?;
            mode
        };
        info!(
            interface = %iface,
            mode = dp.attached_mode,
            chained = dp.layout.program(),
            epoch = dp.epoch,
            maps = if reuse { "reused" } else { "new" },
            "attached"
        );
        dp.pins = Some((pins, spec.on_exit));
        Ok(dp)
    }

    /// Detaches what `instance` left attached and pinned under `pin_root` (`pirated detach`);
    /// whether there was anything.
    pub fn detach(spec: &Spec) -> anyhow::Result<bool> {
        pins::remove_instance(Path::new(&spec.pin_root), &spec.instance)
    }

    /// The epoch the datapath was in when loaded.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The root program, the chain's entry, e.g. to run it with BPF_PROG_TEST_RUN.
    pub fn root_fd(&self) -> anyhow::Result<std::os::fd::BorrowedFd<'_>> {
        let program: &Xdp = self.ebpf.program(ROOT).unwrap().try_into()?;
        Ok(program.fd()?.as_fd())
    }

    /// Per loaded program of the chain, how many instructions the verifier walked to accept it:
    /// it rejects a program past 1 000 000, so this is the headroom left for its per-packet code.
    pub fn verified_instructions(&self) -> anyhow::Result<Vec<(&'static str, Option<u32>)>> {
        programs(self.layout)
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
        let fd = per_cpu_array(&self.ebpf, maps::COUNTERS)?.fd().as_fd();
        let mut out = [0u64; counters::COUNT as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = percpu::sum(fd, i as u32, self.cpus).context("reading COUNTERS")?;
        }
        Ok(out)
    }

    /// The kernel's memlock accounting of the flow table, in bytes.
    pub fn flow_table_memlock(&self) -> anyhow::Result<u64> {
        memlock_of_fd(array(&self.ebpf, self.layout.flows_map())?.fd().as_fd().as_raw_fd())
    }

    /// Size of `pirate`'s hand-over ring buffer, in bytes.
    pub fn ring_bytes(&self) -> u64 {
        self.ring_bytes as u64
    }

    /// `pirate`'s flow table (the configured layout's), mapped.
    pub fn table(&self) -> &FlowTable {
        &self.table
    }

    /// Takes map `name` out of the datapath, for the one reader that consumes it (a ring buffer).
    pub fn take_map(&mut self, name: &str) -> anyhow::Result<Map> {
        self.ebpf.take_map(name).ok_or_else(|| anyhow!("map {name} was taken already"))
    }
}

impl Drop for Datapath {
    fn drop(&mut self) {
        match &self.pins {
            Some((pins, OnExit::Detach)) => {
                // The link's pin goes with the rest; its last descriptor goes with `ebpf`.
                if let Err(e) = pins.remove() {
                    warn!("{e:#}");
                }
            }
            Some((pins, OnExit::Keep)) => info!(
                pins = %pins.path().display(),
                "left the chain attached and its maps pinned: a restart resumes every flow's epoch; `pirated detach` removes them"
            ),
            None => {}
        }
    }
}

/// Every program of the chain pirated loads, the root first.
fn programs(layout: Layout) -> [&'static str; 6] {
    [ROOT, layout.program(), layout.flow_program(), FRIDGE, SEGMENT, lb::LB]
}

fn attach(program: &mut Xdp, iface: &str, mode: AttachMode) -> anyhow::Result<(XdpLinkId, &'static str)> {
    let with = |program: &mut Xdp, flags, name| {
        program.attach(iface, flags).map(|id| (id, name)).map_err(|e| {
            let e = anyhow!(e).context(format!("attaching in {name} mode"));
            if !occupied(&e) {
                return e;
            }
            e.context(format!(
                "interface {iface:?} already has an XDP program, not this instance's: another pirated instance (each needs an \
                 interface of its own) or another tool. `ip -d link show {iface}` names it; `pirated detach` with that \
                 instance's configuration removes what a stopped pirated left, `ip link set dev {iface} xdp off` any"
            ))
        })
    };
    match mode {
        AttachMode::Native => with(program, XdpFlags::DRV_MODE, "native"),
        AttachMode::Generic => with(program, XdpFlags::SKB_MODE, "generic"),
        AttachMode::Auto => with(program, XdpFlags::DRV_MODE, "native").or_else(|e| {
            if occupied(&e) {
                return Err(e);
            }
            warn!("native XDP attach failed ({e:#}); falling back to generic mode");
            with(program, XdpFlags::SKB_MODE, "generic")
        }),
    }
}

/// Whether an attach failed because the interface has an XDP program already: EBUSY in the same
/// mode, EEXIST when the other mode has one.
fn occupied(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|cause| cause.downcast_ref::<std::io::Error>()?.raw_os_error())
        .any(|errno| errno == libc::EBUSY || errno == libc::EEXIST)
}

/// A program's load failure, saying what to do: the privileges, where the kernel refused them
/// (EPERM: an XDP program takes CAP_NET_ADMIN; EACCES without CAP_PERFMON: the verifier forbids
/// the chain's pointer arithmetic), else the verifier's log.
fn verifier_error(name: &str, e: ProgramError) -> anyhow::Error {
    match e {
        ProgramError::LoadError { io_error, .. } if io_error.raw_os_error() == Some(libc::EPERM) => {
            anyhow!("loading the XDP program {name} was refused (EPERM): {NEEDS_ROOT}")
        }
        ProgramError::LoadError { io_error, verifier_log } => {
            let hint = if io_error.raw_os_error() == Some(libc::EACCES) && !has_capability(CAP_PERFMON) {
                format!(": without CAP_PERFMON it forbids pointer arithmetic the chain does ({NEEDS_ROOT})")
            } else {
                String::new()
            };
            anyhow!(
                "the kernel verifier rejected the XDP program {name} ({io_error}){hint}. Verifier log:\n{verifier_log}"
            )
        }
        e => anyhow!(e).context(format!("loading the XDP program {name}")),
    }
}

/// The smallest ring buffer the kernel makes: a page (a ring's size must be a power of two and a
/// whole number of pages). 4096 bytes on x86-64; 16 or 64 KiB on some arm64 kernels.
fn min_ring_bytes() -> u32 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(page).unwrap_or(4096).max(4096)
}

/// Why `bytes` is no size for a ring buffer of at most `most` bytes (a configured one), if not.
pub fn ring_bytes_refusal(bytes: u32, most: u32) -> Option<String> {
    let least = min_ring_bytes();
    (!bytes.is_power_of_two() || !(least..=most).contains(&bytes))
        .then(|| format!("must be a power of two, {least}..={most}"))
}

/// The most a hand-over ring takes: about 1.6 M compact records (with the kernel's 8-byte header
/// each).
const MAX_RING_BYTES: usize = 256 << 20;

/// Flows per record the hand-over ring holds.
const FLOWS_PER_RECORD: usize = 4;

/// Ring buffer size: a power of two of at least one page holding a record for every
/// `FLOWS_PER_RECORD` flows, up to `MAX_RING_BYTES`. Records pile up only for the few
/// milliseconds between two reads: the drain reads the ring as it scans the table, and pirated
/// discards the stale ones as they arrive at any other time. A record that finds the ring full
/// is counted (`pirated_epoch_records_lost_total`). Its pages count twice in the daemon's
/// resident memory (the kernel maps them twice, for records that wrap around).
fn ring_size(flows: usize, layout: Layout) -> u32 {
    (flows.div_ceil(FLOWS_PER_RECORD) * (layout.record_size() + 8))
        .clamp(min_ring_bytes() as usize, MAX_RING_BYTES)
        .next_power_of_two() as u32
}

/// Map `name` of the object (checked present at load), which must be an array.
fn array<'a>(ebpf: &'a Ebpf, name: &str) -> anyhow::Result<&'a MapData> {
    match ebpf.map(name).unwrap() {
        Map::Array(d) => Ok(d),
        _ => bail!("{name} is not an array: pirated and its XDP object were built apart"),
    }
}

/// Map `name` of the object, which must be a per-CPU array.
fn per_cpu_array<'a>(ebpf: &'a Ebpf, name: &str) -> anyhow::Result<&'a MapData> {
    match ebpf.map(name).unwrap() {
        Map::PerCpuArray(d) => Ok(d),
        _ => bail!("{name} is not a per-CPU array: pirated and its XDP object were built apart"),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The ring holds a record per `FLOWS_PER_RECORD` flows up to its ceiling, so every
    /// `max_flows` that `check` accepts also loads (the kernel wants a power-of-two number of
    /// pages).
    #[test]
    fn the_ring_holds_a_record_per_four_flows_up_to_its_ceiling() {
        let record = Layout::Compact.record_size() + 8;
        for flows in [1, 100, 65_536, 1 << 20, 4_000_000, 1 << 24] {
            let bytes = ring_size(flows, Layout::Compact) as usize;
            let least = min_ring_bytes() as usize;
            assert!(bytes.is_power_of_two() && (least..=MAX_RING_BYTES).contains(&bytes), "{flows}: {bytes}");
            let want = flows.div_ceil(FLOWS_PER_RECORD) * record;
            assert!(bytes >= want.min(MAX_RING_BYTES), "{flows} flows, {bytes} bytes");
        }
    }
}
