//! The one place that loads, attaches and pins the XDP chain (`pirate_root`, which attaches, and
//! the capability programs it tail-calls through `CHAIN`), advances the epoch, and hands each
//! capability the handle of its own maps (`pirate`, `fridge`, `lb`, `segment`, `rli`: each also sizes
//! and configures its maps at load). `table` maps `pirate`'s flow table into the daemon;
//! `test_run` and `percpu` are the kernel calls pirated makes without aya (`bpf_call`).

mod bpf_call;
pub mod fridge;
pub mod lb;
pub mod memlock;
mod mmap;
mod object;
pub mod percpu;
pub mod pins;
pub mod pirate;
mod privileges;
pub mod ring;
pub mod rli;
pub mod segment;
pub mod spec;
pub mod table;
pub mod test_run;

use std::{
    fs,
    os::fd::AsFd,
    path::Path,
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{anyhow, bail, Context};
use aya::{
    maps::{Array, ProgramArray},
    programs::{
        links::{FdLink, PinnedLink},
        xdp::{XdpLink, XdpLinkId},
        ProgramError, ProgramFd, Xdp, XdpFlags,
    },
    Ebpf, EbpfLoader,
};
use pirate_common::{
    counters,
    ctx::{CHAIN_FRIDGE, CHAIN_PIRATE, CHAIN_RLI, CHAIN_SEGMENT},
    maps,
    pirate::layout::Layout,
};
use tracing::{info, warn};

use fridge::FridgeMaps;
use lb::LbMaps;
use percpu::CounterReader;
use pins::PinDir;
use pirate::PirateMaps;
pub use privileges::NEEDS_ROOT;
use privileges::{has_capability, CAP_PERFMON};
use rli::RliMaps;
use segment::SegmentMaps;
pub use spec::{AttachMode, OnExit, Spec};

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
/// The RLI capability's program.
const RLI: &str = "rli";

/// A measuring program of the chain, at its `CHAIN` slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capability {
    Rli,
    Pirate,
    Fridge,
    Segment,
}

pub struct Datapath {
    ebpf: Ebpf,
    /// What it was loaded for: each capability's handle takes its maps of this shape.
    spec: Spec,
    /// The capabilities' programs, to put into (or take out of) their `CHAIN` slots.
    pirate: ProgramFd,
    fridge: ProgramFd,
    segment: ProgramFd,
    rli: ProgramFd,
    /// The epoch the datapath was in when loaded (the pinned one, on a restart).
    epoch: u32,
    /// The flow seed: drawn with the maps, the pinned one on a restart.
    seed: u64,
    /// Where the maps and the link are pinned, once attached, and what to do with them at exit.
    pins: Option<(PinDir, OnExit)>,
    pub attached_mode: &'static str,
    /// Possible CPUs: the per-CPU maps' value count.
    cpus: usize,
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
        let layout = spec.pirate.layout;
        if spec.rli.enabled && spec.rli.shape.key == [0; 2] {
            bail!("rli without the references' key: the datapath would take references anyone can forge");
        }
        // Before 5.11 the maps count against the locked-memory limit.
        let memlock = memlock::raise().ok().flatten();
        let mut loader = EbpfLoader::new();
        loader.map_pin_path(dir);
        pirate::size(&mut loader, &spec.pirate);
        fridge::size(&mut loader, &spec.fridge);
        lb::size(&mut loader, &spec.lb);
        segment::size(&mut loader, &spec.segment);
        rli::size(&mut loader, &spec.rli);
        let mut ebpf = loader.load(OBJECT).map_err(|e| match e {
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
        let seed = seed(&mut ebpf, reuse)?;
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
        pirate::configure(&mut ebpf, &spec.pirate)?;
        // Before the fridge and the segment are chained: they read their shapes from the first
        // packet on.
        fridge::configure(&mut ebpf, &spec.fridge)?;
        segment::configure(&mut ebpf, &spec.segment)?;
        rli::configure(&mut ebpf, &spec.rli)?;
        let pirate_program: &Xdp = ebpf.program(layout.program()).unwrap().try_into()?;
        let pirate = pirate_program.fd()?.try_clone().context("duplicating the pirate program's descriptor")?;
        let fridge_program: &Xdp = ebpf.program(FRIDGE).unwrap().try_into()?;
        let fridge = fridge_program.fd()?.try_clone().context("duplicating the fridge program's descriptor")?;
        let segment_program: &Xdp = ebpf.program(SEGMENT).unwrap().try_into()?;
        let segment = segment_program.fd()?.try_clone().context("duplicating the segment program's descriptor")?;
        let rli_program: &Xdp = ebpf.program(RLI).unwrap().try_into()?;
        let rli = rli_program.fd()?.try_clone().context("duplicating the rli program's descriptor")?;
        let cpus = aya::util::nr_cpus().map_err(|(path, e)| anyhow!("reading {path}: {e}"))?;
        let mut dp = Datapath {
            ebpf,
            spec: spec.clone(),
            pirate,
            fridge,
            segment,
            rli,
            epoch,
            seed,
            pins: None,
            attached_mode: "none",
            cpus,
        };
        dp.chain(Capability::Pirate, true)?;
        dp.chain(Capability::Fridge, spec.fridge.enabled)?;
        dp.chain(Capability::Segment, spec.segment.enabled)?;
        dp.chain(Capability::Rli, spec.rli.enabled)?;
        Ok(dp)
    }

    /// Puts a capability into its `CHAIN` slot, or empties the slot (the datapath benchmark
    /// measures the root alone so).
    pub fn chain(&mut self, capability: Capability, on: bool) -> anyhow::Result<()> {
        let (slot, program) = match capability {
            Capability::Pirate => (CHAIN_PIRATE, &self.pirate),
            Capability::Fridge => (CHAIN_FRIDGE, &self.fridge),
            Capability::Segment => (CHAIN_SEGMENT, &self.segment),
            Capability::Rli => (CHAIN_RLI, &self.rli),
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
        if let Some(why) = pins.volatile() {
            warn!(pins = %pins.path().display(), "the pins will not outlive this pirated, whatever on_exit says: {why}");
        }
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
            chained = dp.spec.pirate.layout.program(),
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

    /// The interface the chain is attached to (empty if only loaded).
    pub fn interface(&self) -> &str {
        &self.spec.interface
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
        programs(self.spec.pirate.layout)
            .into_iter()
            .map(|name| {
                let program: &Xdp = self.ebpf.program(name).unwrap().try_into()?;
                Ok((name, program.info()?.verified_instruction_count()))
            })
            .collect()
    }

    /// Loads one of the object's programs that only the datapath benchmark runs: `bare_pass`
    /// (its baseline) or a part of the work of the root and of the chain's first program
    /// (`bench_clock`, `bench_parse`, …).
    pub fn load_bench(&mut self, name: &str) -> anyhow::Result<std::os::fd::BorrowedFd<'_>> {
        let program: &mut Xdp =
            self.ebpf.program_mut(name).with_context(|| format!("no program {name} in the object"))?.try_into()?;
        program.load().map_err(|e| verifier_error(name, e))?;
        Ok(program.fd()?.as_fd())
    }

    /// From now on the datapath tags flow state with `epoch`.
    pub fn set_epoch(&mut self, epoch: u32) -> anyhow::Result<()> {
        Array::<_, u32>::try_from(self.ebpf.map_mut(maps::EPOCH).unwrap())?.set(0, epoch, 0)?;
        Ok(())
    }

    /// The datapath's counters, summed over CPUs, indexed like `pirate_common::counters`.
    pub fn counters(&self) -> anyhow::Result<[u64; counters::COUNT as usize]> {
        percpu::counters(object::per_cpu_array(&self.ebpf, maps::COUNTERS)?.fd().as_fd(), self.cpus)
    }

    /// A reader of the counters apart from the datapath, for a capability's own task.
    pub fn counter_reader(&self) -> anyhow::Result<CounterReader> {
        let fd = object::per_cpu_array(&self.ebpf, maps::COUNTERS)?.fd().as_fd();
        Ok(CounterReader { fd: fd.try_clone_to_owned().context("duplicating COUNTERS")?, cpus: self.cpus })
    }

    /// Pirate's maps, for its drain (once).
    pub fn take_pirate(&mut self) -> anyhow::Result<PirateMaps> {
        PirateMaps::take(&mut self.ebpf, &self.spec.pirate, self.seed)
    }

    /// The fridges' maps, for the reader of their samples (once).
    pub fn take_fridge(&mut self) -> anyhow::Result<FridgeMaps> {
        FridgeMaps::take(&mut self.ebpf, &self.spec.fridge)
    }

    /// The forwarder's maps, for the balancer (once).
    pub fn take_lb(&mut self) -> anyhow::Result<LbMaps> {
        LbMaps::take(&mut self.ebpf, self.cpus, self.seed)
    }

    /// RLI's maps, for the downstream point (once).
    pub fn take_rli(&mut self) -> anyhow::Result<RliMaps> {
        let counters = self.counter_reader()?;
        RliMaps::take(&mut self.ebpf, counters)
    }

    /// The segment's maps, for the point that reads its banks (once).
    pub fn take_segment(&mut self) -> anyhow::Result<SegmentMaps> {
        SegmentMaps::take(&mut self.ebpf, self.spec.segment.shape, self.cpus)
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
            Some((pins, OnExit::Keep)) => match pins.volatile() {
                Some(why) => warn!(
                    pins = %pins.path().display(),
                    "nothing stays attached or pinned: {why}"
                ),
                None => info!(
                    pins = %pins.path().display(),
                    "left the chain attached and its maps pinned: a restart resumes every flow's epoch; `pirated detach` removes them"
                ),
            },
            None => {}
        }
    }
}

/// The flow seed: the pinned one when the maps are reused, else one drawn from the kernel's
/// random source (never 0, which says "none yet"), written before any program can see a packet.
fn seed(ebpf: &mut aya::Ebpf, reuse: bool) -> anyhow::Result<u64> {
    let mut seeds = Array::<_, u64>::try_from(ebpf.map_mut(maps::SEED).unwrap())?;
    let pinned = match reuse {
        true => seeds.get(&0, 0).context("reading the pinned SEED")?,
        false => 0,
    };
    if pinned != 0 {
        return Ok(pinned);
    }
    let mut seed = 0;
    while seed == 0 {
        let mut bytes = [0u8; 8];
        crate::rng::fill_random(&mut bytes).context("drawing the flow seed")?;
        seed = u64::from_le_bytes(bytes);
    }
    seeds.set(0, seed, 0).context("writing SEED")?;
    Ok(seed)
}

/// Every program of the chain pirated loads, the root first.
fn programs(layout: Layout) -> [&'static str; 7] {
    [ROOT, layout.program(), layout.flow_program(), FRIDGE, SEGMENT, RLI, lb::LB]
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
