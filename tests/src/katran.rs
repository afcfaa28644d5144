//! Katran's real XDP balancer as a test peer behind pirated's XDP chain.
//!
//! pirated's root program ends by tail-calling into a pinned `BPF_MAP_TYPE_PROG_ARRAY` (Katran's
//! "root array" convention, `rootMapPath`/`rootMapPos`). This module builds Katran's balancer
//! from the vendored sources in `shared/third_party/katran` (never copied into this repository),
//! loads it with `bpftool`, programs its maps in Katran's own layouts and registers it into such
//! an array, so tests can check that a packet to a VIP leaves the chain IPIP-encapsulated to a
//! real, as it would behind a production Katran.
//!
//! ```no_run
//! use std::{net::{Ipv4Addr, SocketAddrV4}, path::Path};
//! use pirate_tests::katran::{build_balancer, Katran};
//! # fn main() -> anyhow::Result<()> {
//! let katran = Katran::load(&build_balancer(Path::new("/tmp/katran"))?)?;
//! katran.set_default_router_mac([0x02, 0, 0, 0, 0, 0xfe])?;
//! katran.add_vip(SocketAddrV4::new(Ipv4Addr::new(10, 200, 9, 1), 80), libc::IPPROTO_TCP as u8, 0, 0)?;
//! katran.set_real(1, Ipv4Addr::new(10, 200, 9, 100))?;
//! katran.fill_ring(0, &[1])?;
//! katran.register(Path::new("/sys/fs/bpf/pirated/default/FORWARD"), 2)?;
//! # Ok(())
//! # }
//! ```
//!
//! Map updates go through aya on the pinned maps, in the layouts pirated writes Katran's maps in
//! (`pirated::lb::katran`), rather than one `bpftool` process per entry: the consistent-hashing
//! ring alone is 65 537 entries per VIP. Everything here needs root (CAP_BPF and CAP_SYS_ADMIN for
//! bpffs).

use std::{
    fs, io,
    net::{Ipv4Addr, SocketAddrV4},
    os::fd::AsFd,
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::{
        atomic::{AtomicU32, Ordering},
        Mutex,
    },
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, ensure, Context, Result};
use aya::{
    maps::{Array, HashMap, Map, MapData, MapError, MapType, ProgramArray},
    programs::{ProgramFd, ProgramInfo},
};
use pirated::{
    datapath::{lb::program_in_slot, percpu},
    lb::katran::{real_definition, ring_key, vip_definition, vip_meta, MAX_VIPS, RING_SIZE},
};

/// `MAX_REALS` in `balancer_consts.h`: the size of `reals`; real ids run from 1 (0 is reserved).
pub const MAX_REALS: u32 = 4096;

/// Offsets into Katran's `stats` map of its global counters, which start at index `MAX_VIPS`
/// (`balancer_consts.h`); `v1` counts packets, `v2` bytes unless noted there.
pub mod counter {
    /// `LRU_CNTRS`: v1 VIP packets, v2 LRU misses.
    pub const LRU: u32 = 0;
    /// `LRU_MISS_CNTR`: v1 misses of TCP SYNs, v2 misses of other TCP packets.
    pub const LRU_MISS: u32 = 1;
    /// `FALLBACK_LRU_CNTR`: v1 packets that used the fallback LRU (no per-CPU LRU in `lru_mapping`).
    pub const FALLBACK_LRU: u32 = 3;
    /// `ENCAP_FAIL_CNTR`: v1 IPv4, v2 IPv6 encapsulation failures.
    pub const ENCAP_FAIL: u32 = 7;
    /// `CH_DROP_STATS`: v1 drops for a ring position naming no real, v2 for real id 0.
    pub const CH_DROP: u32 = 9;
    /// `XDP_TOTAL_CNTR`: every packet the balancer saw.
    pub const XDP_TOTAL: u32 = 16;
    /// `XDP_TX_CNTR`: packets sent to a real.
    pub const XDP_TX: u32 = 17;
    /// `XDP_DROP_CNTR`: packets dropped.
    pub const XDP_DROP: u32 = 18;
    /// `XDP_PASS_CNTR`: packets passed to the kernel (not to a VIP, or not TCP/UDP).
    pub const XDP_PASS: u32 = 19;
}

const BALANCER_SRC: &str = "katran/lib/bpf/balancer.bpf.c";
const BPFFS: &str = "/sys/fs/bpf";
/// Pin directories are `/sys/fs/bpf/pirate-katran-<pid>-<n>`; the pid lets [`Katran::load`]
/// remove directories leaked by dead processes (each holds ~330 MiB of preallocated maps).
const PIN_PREFIX: &str = "pirate-katran-";
/// Name of the program's pin inside the pin directory (its maps are pinned next to it by name).
const PROG_PIN: &str = "balancer_ingress";

/// Where Katran's sources are: `$KATRAN_DIR`, else `shared/third_party/katran` beside this
/// repository's checkout, else this workplace's `/work/shared/third_party/katran` (a clean clone
/// elsewhere); an error names the places looked at.
pub fn katran_dir() -> Result<PathBuf> {
    let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/third_party/katran");
    let candidates: Vec<PathBuf> = std::env::var_os("KATRAN_DIR")
        .map(PathBuf::from)
        .into_iter()
        .chain([beside, PathBuf::from("/work/shared/third_party/katran")])
        .collect();
    match candidates.iter().find(|dir| dir.join(BALANCER_SRC).is_file()) {
        Some(dir) => dir.canonicalize().with_context(|| format!("resolving {}", dir.display())),
        None => bail!(
            "Katran's sources ({BALANCER_SRC}) are in none of {candidates:?}: set KATRAN_DIR to a checkout of \
             facebookincubator/katran"
        ),
    }
}

/// Compiles Katran's balancer into `out_dir/balancer.o` and returns that path.
///
/// The command is Katran's README's, run from the Katran folder:
/// `clang-22 -O2 -g -target bpf -I. -c katran/lib/bpf/balancer.bpf.c -o balancer.o`, plus two
/// `-idirafter` directories that only fill in what a Debian host without gcc-multilib lacks for
/// `-target bpf` (the balancer includes `<linux/in.h>` and `<string.h>`): the multiarch include
/// directory (for `<asm/types.h>`, normally reached through gcc-multilib's `/usr/include/asm`) and
/// a generated directory with an empty `gnu/stubs-32.h` (glibc's `<gnu/stubs.h>` picks the 32-bit
/// stubs for a target that is not `__x86_64__`; they only declare unimplemented functions).
/// Being searched after the system directories, neither changes a build that works without them.
/// The object is written under a temporary name and renamed, so concurrent builds never read a
/// partial file.
pub fn build_balancer(out_dir: &Path) -> Result<PathBuf> {
    let katran = katran_dir()?;
    let out_dir = std::path::absolute(out_dir).with_context(|| format!("resolving {}", out_dir.display()))?;
    let shim = out_dir.join("katran-include-shim");
    fs::create_dir_all(shim.join("gnu")).with_context(|| format!("creating {}", shim.display()))?;
    let stubs = shim.join("gnu/stubs-32.h");
    if !stubs.exists() {
        fs::write(&stubs, "/* empty: glibc's 32-bit stubs, for clang -target bpf (see pirate-tests katran.rs) */\n")
            .with_context(|| format!("writing {}", stubs.display()))?;
    }
    let object = out_dir.join("balancer.o");
    let tmp = out_dir.join(format!("balancer.o.{}.{}.tmp", std::process::id(), next_seq()));

    let mut cmd = clang_bpf();
    cmd.current_dir(&katran).args(["-g", "-I."]);
    cmd.arg("-idirafter").arg(&shim).args(["-c", BALANCER_SRC, "-o"]).arg(&tmp);
    let result = run(&mut cmd, &format!("compiling Katran's balancer in {}", katran.display()));
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fs::rename(&tmp, &object).with_context(|| format!("renaming {} to {}", tmp.display(), object.display()))?;
    Ok(object)
}

/// `clang-22 -O2 -target bpf`, with the multiarch include directory searched last (for
/// `<asm/types.h>`, which a Debian host reaches through gcc-multilib's `/usr/include/asm`
/// otherwise): what every BPF object this crate builds from C starts from.
pub(crate) fn clang_bpf() -> Command {
    let mut cmd = Command::new("clang-22");
    cmd.args(["-O2", "-target", "bpf"]);
    let multiarch = Path::new("/usr/include").join(format!("{}-linux-gnu", std::env::consts::ARCH));
    if multiarch.is_dir() {
        cmd.arg("-idirafter").arg(&multiarch);
    }
    cmd
}

/// Katran's balancer loaded from an object built by [`build_balancer`], its program and maps
/// pinned in a private directory under `/sys/fs/bpf`. Its maps are written through aya, in
/// Katran's layouts as pirated writes them (`pirated::lb::katran`).
///
/// Dropping it unregisters it from every prog array slot [`Katran::register`] put it in (if the
/// slot still holds it) and removes the pins, which frees the program and maps once nothing else
/// holds them.
pub struct Katran {
    prog: ProgramFd,
    prog_id: u32,
    /// `vip_map`: `struct vip_definition` → `struct vip_meta`.
    vips: Mutex<HashMap<MapData, [u8; 20], [u8; 8]>>,
    /// `reals`: real id → `struct real_definition`.
    reals: Mutex<Array<MapData, [u8; 20]>>,
    /// `ch_rings`: `vip_num * RING_SIZE + position` → real id.
    rings: Mutex<Array<MapData, u32>>,
    /// `ctl_array`: `struct ctl_value`.
    control: Mutex<Array<MapData, [u8; 8]>>,
    /// `stats`, per CPU: `struct lb_stats`.
    stats: MapData,
    cpus: usize,
    registrations: Mutex<Vec<(PathBuf, u32)>>,
    // Last: dropped after the program's fd, removing the pins.
    pins: PinDir,
}

impl std::fmt::Debug for Katran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Katran").field("prog_id", &self.prog_id).field("pins", &self.pins.0).finish()
    }
}

impl Katran {
    /// Loads the balancer: `bpftool prog load <object> <dir>/balancer_ingress type xdp pinmaps
    /// <dir>` into a fresh `/sys/fs/bpf/pirate-katran-<pid>-<n>`, then checks that the maps this
    /// module writes have the sizes Katran's layouts give them.
    ///
    /// bpftool, not aya, because the object has `BPF_MAP_TYPE_ARRAY_OF_MAPS` and
    /// `HASH_OF_MAPS` maps with inner-map templates (`lru_mapping`, `vip_to_down_reals_map`),
    /// which libbpf creates. Loading takes about a second: `ch_rings` (256 MiB) and
    /// `server_id_map` (64 MiB) are preallocated arrays.
    pub fn load(object: &Path) -> Result<Katran> {
        ensure!(
            Path::new(BPFFS).is_dir(),
            "{BPFFS} is missing: mount bpffs first (scripts/setup.sh does: mount -t bpf bpf {BPFFS})"
        );
        remove_stale_pin_dirs();
        let dir = Path::new(BPFFS).join(format!("{PIN_PREFIX}{}-{}", std::process::id(), next_seq()));
        fs::create_dir(&dir).with_context(|| format!("creating pin directory {}", dir.display()))?;
        let pins = PinDir(dir);
        let prog_pin = pins.0.join(PROG_PIN);
        run(
            Command::new("bpftool")
                .args(["prog", "load"])
                .arg(object)
                .arg(&prog_pin)
                .args(["type", "xdp", "pinmaps"])
                .arg(&pins.0),
            &format!("loading Katran's balancer from {}", object.display()),
        )?;
        let info = ProgramInfo::from_pin(&prog_pin).with_context(|| format!("opening {}", prog_pin.display()))?;
        let prog = info.fd().context("opening the balancer's program")?;
        // (map, key size, value size, max entries): balancer_structs.h, balancer_consts.h.
        let map = |name: &str, key: u32, value: u32, entries: u32| -> Result<MapData> {
            let pin = pins.0.join(name);
            let data = MapData::from_pin(&pin).with_context(|| format!("opening Katran's map {}", pin.display()))?;
            let info = data.info().with_context(|| format!("reading map {name}'s info"))?;
            ensure!(
                (info.key_size(), info.value_size(), info.max_entries()) == (key, value, entries),
                "Katran's map {name} has key {} B, value {} B, {} entries; its layouts say key {key} B, value \
                 {value} B, {entries} entries (balancer_structs.h/balancer_consts.h changed?)",
                info.key_size(),
                info.value_size(),
                info.max_entries()
            );
            Ok(data)
        };
        Ok(Katran {
            vips: Mutex::new(HashMap::try_from(Map::HashMap(map("vip_map", 20, 8, MAX_VIPS)?))?),
            reals: Mutex::new(Array::try_from(Map::Array(map("reals", 4, 20, MAX_REALS)?))?),
            rings: Mutex::new(Array::try_from(Map::Array(map("ch_rings", 4, 4, MAX_VIPS * RING_SIZE)?))?),
            control: Mutex::new(Array::try_from(Map::Array(map("ctl_array", 4, 8, 16)?))?),
            stats: map("stats", 4, 16, 2 * MAX_VIPS)?,
            cpus: aya::util::nr_cpus().map_err(|(path, e)| anyhow::anyhow!("reading {path}: {e}"))?,
            prog,
            prog_id: info.id(),
            registrations: Mutex::new(Vec::new()),
            pins,
        })
    }

    /// The directory its program and maps are pinned in (by their names in `balancer_maps.h`).
    pub fn pin_dir(&self) -> &Path {
        &self.pins.0
    }

    /// Sets `ctl_array[0]` (`struct ctl_value`, `control_data_maps.h`): the default router's MAC,
    /// which Katran writes as the destination MAC of every encapsulated packet. Without it the
    /// packets still leave with XDP_TX, but addressed to 00:00:00:00:00:00.
    pub fn set_default_router_mac(&self, mac: [u8; 6]) -> Result<()> {
        // struct ctl_value { union { __u64 value; __u32 ifindex; __u8 mac[6]; }; }: 8 bytes.
        let mut value = [0u8; 8];
        value[..6].copy_from_slice(&mac);
        lock(&self.control).set(0, value, 0).context("writing Katran's ctl_array[0]")
    }

    /// Adds a VIP to `vip_map`: `vip` and `proto` (e.g. `IPPROTO_TCP`) map to `vip_num`, the
    /// VIP's index into `ch_rings` and `stats`, with `flags` (`F_*` vip_meta flags of
    /// `balancer_consts.h`; 0 hashes the client's address and both ports).
    pub fn add_vip(&self, vip: SocketAddrV4, proto: u8, vip_num: u32, flags: u32) -> Result<()> {
        ensure!(vip_num < MAX_VIPS, "vip_num {vip_num} out of range: Katran has MAX_VIPS = {MAX_VIPS}");
        lock(&self.vips)
            .insert(vip_definition(vip, proto), vip_meta(flags, vip_num), 0)
            .with_context(|| format!("writing Katran's vip_map for {vip}"))
    }

    /// The `vip_num` `vip_map` gives `vip` and `proto`, if it has them.
    pub fn vip_num(&self, vip: SocketAddrV4, proto: u8) -> Result<Option<u32>> {
        match lock(&self.vips).get(&vip_definition(vip, proto), 0) {
            Ok(meta) => Ok(Some(u32::from_ne_bytes(meta[4..].try_into().unwrap()))),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(e).context("reading vip_map"),
        }
    }

    /// Sets real `id` in `reals` to IPv4 address `addr`: the outer destination of packets the ring
    /// sends to `id`. Real id 0 is reserved (Katran drops packets whose ring position holds 0).
    pub fn set_real(&self, id: u32, addr: Ipv4Addr) -> Result<()> {
        ensure!((1..MAX_REALS).contains(&id), "real id {id} out of range: ids run from 1 to {}", MAX_REALS - 1);
        lock(&self.reals).set(id, real_definition(addr), 0).with_context(|| format!("writing Katran's reals[{id}]"))
    }

    /// Fills `vip_num`'s consistent-hashing ring (`ch_rings[vip_num * RING_SIZE + pos]`, a real
    /// id) with `real_ids` in turn: position `pos` gets `real_ids[pos % len]`. One id fills every
    /// position with that real; several spread flows evenly, though not the way Katran's
    /// weighted Maglev ring would (see [`Katran::set_ring`] for an arbitrary ring).
    pub fn fill_ring(&self, vip_num: u32, real_ids: &[u32]) -> Result<()> {
        ensure!(!real_ids.is_empty(), "fill_ring needs at least one real id");
        let ring: Vec<u32> = (0..RING_SIZE as usize).map(|pos| real_ids[pos % real_ids.len()]).collect();
        self.set_ring(vip_num, &ring)
    }

    /// Writes `vip_num`'s whole ring: `ring[pos]` is the real id for hash position `pos`
    /// (`RING_SIZE` entries; Katran picks `jhash(flow) % RING_SIZE`).
    pub fn set_ring(&self, vip_num: u32, ring: &[u32]) -> Result<()> {
        ensure!(vip_num < MAX_VIPS, "vip_num {vip_num} out of range: Katran has MAX_VIPS = {MAX_VIPS}");
        ensure!(ring.len() == RING_SIZE as usize, "a ring has RING_SIZE = {RING_SIZE} positions, got {}", ring.len());
        if let Some(bad) = ring.iter().find(|&&id| id == 0 || id >= MAX_REALS) {
            bail!("ring holds real id {bad}: ids run from 1 to {} (0 is reserved)", MAX_REALS - 1);
        }
        let mut rings = lock(&self.rings);
        for (pos, &id) in ring.iter().enumerate() {
            let key = ring_key(vip_num, pos as u32);
            rings
                .set(key, id, 0)
                .with_context(|| format!("writing ch_rings[{key}] (vip_num {vip_num}, position {pos}) = {id}"))?;
        }
        Ok(())
    }

    /// One of Katran's global counters (`stats[MAX_VIPS + index]`, see [`counter`]), summed over
    /// CPUs: (v1, v2).
    pub fn counter(&self, index: u32) -> Result<(u64, u64)> {
        ensure!(index < MAX_VIPS, "counter index {index} out of range");
        let key = MAX_VIPS + index;
        // BPF_MAP_TYPE_PERCPU_ARRAY of struct lb_stats { __u64 v1; __u64 v2; }.
        let per_cpu = percpu::values::<[u64; 2]>(self.stats.fd().as_fd(), key, self.cpus)
            .with_context(|| format!("reading stats[{key}]"))?;
        Ok(per_cpu.iter().fold((0, 0), |(v1, v2), c| (v1 + c[0], v2 + c[1])))
    }

    /// A one-line summary of the global counters, for error messages when the balancer did not
    /// forward a packet.
    pub fn counters_summary(&self) -> String {
        let names = [
            ("total", counter::XDP_TOTAL),
            ("tx", counter::XDP_TX),
            ("drop", counter::XDP_DROP),
            ("pass", counter::XDP_PASS),
            ("ch_drop", counter::CH_DROP),
            ("encap_fail", counter::ENCAP_FAIL),
            ("lru_miss", counter::LRU_MISS),
        ];
        let parts: Vec<String> = names
            .iter()
            .map(|&(name, i)| match self.counter(i) {
                Ok((v1, v2)) => format!("{name}={v1}/{v2}"),
                Err(e) => format!("{name}=? ({e:#})"),
            })
            .collect();
        format!("Katran counters (v1/v2): {}", parts.join(" "))
    }

    /// Puts the balancer into slot `slot` of the pinned prog array at `forward_pin` (the equivalent
    /// of `bpftool map update pinned <forward_pin> key <slot, 4 bytes LE> value pinned
    /// <prog pin>`), so a program that tail-calls that slot continues in Katran.
    ///
    /// The kernel only accepts a program compatible with the array's owner (the first program
    /// that used the array or was put into it): same program type (XDP), same JIT state and same
    /// XDP frags flag. The balancer is plain `SEC("xdp")`, without `BPF_F_XDP_HAS_FRAGS`, so the
    /// chain's programs must not be loaded with frags either.
    pub fn register(&self, forward_pin: &Path, slot: u32) -> Result<()> {
        let mut array = prog_array(forward_pin, slot)?;
        if let Err(e) = array.set(slot, &self.prog, 0) {
            let einval = matches!(&e, MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::EINVAL));
            let hint = match einval {
                true => {
                    " (EINVAL: the array's owner program is not compatible: another program type, or the XDP \
                     frags flag differs; the balancer is XDP without frags)"
                }
                false => "",
            };
            bail!(
                "putting Katran's balancer (prog id {}) into {} slot {slot}: {e}{hint}",
                self.prog_id,
                forward_pin.display()
            );
        }
        let mut regs = lock(&self.registrations);
        if !regs.iter().any(|(p, s)| p == forward_pin && *s == slot) {
            regs.push((forward_pin.to_path_buf(), slot));
        }
        Ok(())
    }

    /// Empties slot `slot` of the prog array at `forward_pin`, which must hold this balancer
    /// (an error otherwise, so a test never removes a program it did not put there).
    pub fn unregister(&self, forward_pin: &Path, slot: u32) -> Result<()> {
        match self.in_slot(forward_pin, slot)? {
            Some(id) if id == self.prog_id => {}
            Some(id) => bail!(
                "{} slot {slot} holds program {id}, not Katran's balancer ({}): not removing it",
                forward_pin.display(),
                self.prog_id
            ),
            None => bail!("{} slot {slot} is empty: Katran's balancer is not registered there", forward_pin.display()),
        }
        prog_array(forward_pin, slot)?
            .clear_index(&slot)
            .with_context(|| format!("deleting {} slot {slot}", forward_pin.display()))?;
        lock(&self.registrations).retain(|(p, s)| !(p == forward_pin && *s == slot));
        Ok(())
    }

    /// Whether slot `slot` of the prog array at `forward_pin` holds this balancer.
    pub fn is_registered(&self, forward_pin: &Path, slot: u32) -> Result<bool> {
        Ok(self.in_slot(forward_pin, slot)? == Some(self.prog_id))
    }

    /// The id of the program in slot `slot` of the prog array at `forward_pin`, if any.
    fn in_slot(&self, forward_pin: &Path, slot: u32) -> Result<Option<u32>> {
        let array = open_prog_array(forward_pin, slot)?;
        program_in_slot(array.fd().as_fd(), slot)
            .with_context(|| format!("reading {} slot {slot}", forward_pin.display()))
    }
}

impl Drop for Katran {
    fn drop(&mut self) {
        let regs = std::mem::take(self.registrations.get_mut().unwrap_or_else(|p| p.into_inner()));
        for (pin, slot) in regs {
            // Best effort: the array may be gone already, or hold another program by now.
            if let Ok(true) = self.is_registered(&pin, slot) {
                if let Err(e) = self.unregister(&pin, slot) {
                    eprintln!("katran: unregistering from {} slot {slot}: {e:#}", pin.display());
                }
            }
        }
    }
}

/// A lock taken even if a holder panicked (a test's map writes are each whole).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A pin directory under bpffs, removed (with everything pinned in it) on drop.
#[derive(Debug)]
struct PinDir(PathBuf);

impl Drop for PinDir {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.0) {
            if e.kind() != io::ErrorKind::NotFound {
                eprintln!("katran: removing {}: {e}", self.0.display());
            }
        }
    }
}

/// Removes pin directories of earlier processes that died without dropping their [`Katran`].
fn remove_stale_pin_dirs() {
    let Ok(entries) = fs::read_dir(BPFFS) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(PIN_PREFIX)) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if pid != std::process::id() && !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// Opens the prog array pinned at `pin`, checking it is a prog array with a slot `slot`.
fn open_prog_array(pin: &Path, slot: u32) -> Result<MapData> {
    let array = MapData::from_pin(pin).with_context(|| format!("opening prog array {}", pin.display()))?;
    let info = array.info().with_context(|| format!("reading {}'s map info", pin.display()))?;
    let kind = info.map_type().with_context(|| format!("reading {}'s map type", pin.display()))?;
    ensure!(kind == MapType::ProgramArray, "{} is a {kind:?}, not a BPF_MAP_TYPE_PROG_ARRAY", pin.display());
    ensure!(slot < info.max_entries(), "{} has {} slots, no slot {slot}", pin.display(), info.max_entries());
    Ok(array)
}

/// [`open_prog_array`], to write.
fn prog_array(pin: &Path, slot: u32) -> Result<ProgramArray<MapData>> {
    Ok(ProgramArray::try_from(Map::ProgramArray(open_prog_array(pin, slot)?))?)
}

fn next_seq() -> String {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{}{nanos:x}", SEQ.fetch_add(1, Ordering::Relaxed))
}

/// Runs `cmd` to completion; on failure, an error naming `what`, the command line and its output
/// (the tail of it: a verifier log can run to megabytes).
pub(crate) fn run(cmd: &mut Command, what: &str) -> Result<Output> {
    let line = format!(
        "{} {}",
        cmd.get_program().to_string_lossy(),
        cmd.get_args().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ")
    );
    let out = cmd.output().with_context(|| format!("{what}: running `{line}` (is it installed?)"))?;
    if !out.status.success() {
        bail!("{what}: `{line}` failed ({})\n{}{}", out.status, tail(&out.stdout), tail(&out.stderr));
    }
    Ok(out)
}

fn tail(bytes: &[u8]) -> String {
    const MAX: usize = 8192;
    let text = String::from_utf8_lossy(bytes);
    if text.len() <= MAX {
        return text.into_owned();
    }
    let mut start = text.len() - MAX;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("[... {start} bytes cut ...]\n{}", &text[start..])
}
