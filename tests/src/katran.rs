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
//! Map updates go through the `bpf(2)` syscall on the pinned maps rather than one `bpftool`
//! process per entry: the consistent-hashing ring alone is 65 537 entries per VIP. Everything here
//! needs root (CAP_BPF and CAP_SYS_ADMIN for bpffs).

use std::ffi::CString;
use std::fs;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};

/// `RING_SIZE` in Katran's `balancer_consts.h`: positions in each VIP's consistent-hashing ring.
/// Checked at load against `ch_rings`' size (`CH_RINGS_SIZE = MAX_VIPS * RING_SIZE`).
pub const RING_SIZE: u32 = 65537;
/// `MAX_VIPS` in `balancer_consts.h`: the size of `vip_map`, and the bound on `vip_num`.
pub const MAX_VIPS: u32 = 512;
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
/// pinned in a private directory under `/sys/fs/bpf`.
///
/// Dropping it unregisters it from every prog array slot [`Katran::register`] put it in (if the
/// slot still holds it) and removes the pins, which frees the program and maps once nothing else
/// holds them.
#[derive(Debug)]
pub struct Katran {
    prog: OwnedFd,
    prog_id: u32,
    registrations: Mutex<Vec<(PathBuf, u32)>>,
    // Last: dropped after the program's fd, removing the pins.
    pins: PinDir,
}

impl Katran {
    /// Loads the balancer: `bpftool prog load <object> <dir>/balancer_ingress type xdp pinmaps
    /// <dir>` into a fresh `/sys/fs/bpf/pirate-katran-<pid>-<n>`, then checks that the maps this
    /// module writes have the sizes its hand-built layouts assume.
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
        let prog = sys::obj_get(&prog_pin).with_context(|| format!("opening pinned program {}", prog_pin.display()))?;
        let prog_id = sys::prog_id(prog.as_fd()).context("reading the balancer's program id")?;
        let katran = Katran { prog, prog_id, registrations: Mutex::new(Vec::new()), pins };
        katran.check_layouts()?;
        Ok(katran)
    }

    /// Checks the loaded maps against the key/value sizes and entry counts this module assumes
    /// (`balancer_structs.h`, `balancer_consts.h`), so a change in Katran fails here, clearly,
    /// instead of as a mis-programmed balancer that drops or passes everything.
    fn check_layouts(&self) -> Result<()> {
        // (map, key size, value size, max entries): struct vip_definition -> struct vip_meta;
        // u32 -> struct real_definition; u32 -> u32 real id; u32 -> struct ctl_value.
        let expected = [
            ("vip_map", 20, 8, MAX_VIPS),
            ("reals", 4, 20, MAX_REALS),
            ("ch_rings", 4, 4, MAX_VIPS * RING_SIZE),
            ("ctl_array", 4, 8, 16),
            ("stats", 4, 16, 2 * MAX_VIPS),
        ];
        for (name, key, value, entries) in expected {
            let info = sys::map_info(self.map(name)?.as_fd()).with_context(|| format!("reading map {name}'s info"))?;
            ensure!(
                (info.key_size, info.value_size, info.max_entries) == (key, value, entries),
                "Katran's map {name} has key {} B, value {} B, {} entries; this module's layouts assume \
                 key {key} B, value {value} B, {entries} entries (balancer_structs.h/balancer_consts.h changed?)",
                info.key_size,
                info.value_size,
                info.max_entries
            );
        }
        Ok(())
    }

    /// The directory its program and maps are pinned in (by their names in `balancer_maps.h`).
    pub fn pin_dir(&self) -> &Path {
        &self.pins.0
    }

    /// Opens one of Katran's pinned maps by its name in `balancer_maps.h`/`control_data_maps.h`.
    fn map(&self, name: &str) -> Result<OwnedFd> {
        let pin = self.pins.0.join(name);
        sys::obj_get(&pin).with_context(|| format!("opening Katran's map {}", pin.display()))
    }

    /// Sets `ctl_array[0]` (`struct ctl_value`, `control_data_maps.h`): the default router's MAC,
    /// which Katran writes as the destination MAC of every encapsulated packet. Without it the
    /// packets still leave with XDP_TX, but addressed to 00:00:00:00:00:00.
    pub fn set_default_router_mac(&self, mac: [u8; 6]) -> Result<()> {
        // struct ctl_value { union { __u64 value; __u32 ifindex; __u8 mac[6]; }; }: 8 bytes.
        let mut value = [0u8; 8];
        value[..6].copy_from_slice(&mac);
        self.update("ctl_array", &0u32.to_ne_bytes(), &value)
    }

    /// Adds a VIP to `vip_map`: `vip` and `proto` (e.g. `IPPROTO_TCP`) map to `vip_num`, the
    /// VIP's index into `ch_rings` and `stats`, with `flags` (`F_*` vip_meta flags of
    /// `balancer_consts.h`; 0 hashes the client's address and both ports).
    pub fn add_vip(&self, vip: SocketAddrV4, proto: u8, vip_num: u32, flags: u32) -> Result<()> {
        ensure!(vip_num < MAX_VIPS, "vip_num {vip_num} out of range: Katran has MAX_VIPS = {MAX_VIPS}");
        // struct vip_meta { __u32 flags; __u32 vip_num; }: 8 bytes, host byte order.
        let mut meta = [0u8; 8];
        meta[0..4].copy_from_slice(&flags.to_ne_bytes());
        meta[4..8].copy_from_slice(&vip_num.to_ne_bytes());
        self.update("vip_map", &pirated::lb::katran::vip_definition(vip, proto), &meta)
    }

    /// The `vip_num` `vip_map` gives `vip` and `proto`, if it has them.
    pub fn vip_num(&self, vip: SocketAddrV4, proto: u8) -> Result<Option<u32>> {
        let mut meta = [0u8; 8];
        let map = self.map("vip_map")?;
        match sys::map_lookup(map.as_fd(), &pirated::lb::katran::vip_definition(vip, proto), &mut meta) {
            Ok(()) => Ok(Some(u32::from_ne_bytes(meta[4..].try_into().unwrap()))),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e).context("reading vip_map"),
        }
    }

    /// Sets real `id` in `reals` to IPv4 address `addr`: the outer destination of packets the ring
    /// sends to `id`. Real id 0 is reserved (Katran drops packets whose ring position holds 0).
    pub fn set_real(&self, id: u32, addr: Ipv4Addr) -> Result<()> {
        ensure!((1..MAX_REALS).contains(&id), "real id {id} out of range: ids run from 1 to {}", MAX_REALS - 1);
        // struct real_definition { union { __be32 dst; __be32 dstv6[4]; }; __u8 flags; }:
        // 16 bytes of address (IPv4 in the first 4, network order), flags at 16, padded to 20.
        let mut real = [0u8; 20];
        real[0..4].copy_from_slice(&addr.octets());
        real[16] = 0; // no F_IPV6 (balancer_consts.h): IPIP over IPv4
        self.update("reals", &id.to_ne_bytes(), &real)
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
        let map = self.map("ch_rings")?;
        for (pos, id) in ring.iter().enumerate() {
            let key = vip_num * RING_SIZE + pos as u32;
            sys::map_update(map.as_fd(), &key.to_ne_bytes(), &id.to_ne_bytes())
                .with_context(|| format!("writing ch_rings[{key}] (vip_num {vip_num}, position {pos}) = {id}"))?;
        }
        Ok(())
    }

    /// One of Katran's global counters (`stats[MAX_VIPS + index]`, see [`counter`]), summed over
    /// CPUs: (v1, v2).
    pub fn counter(&self, index: u32) -> Result<(u64, u64)> {
        ensure!(index < MAX_VIPS, "counter index {index} out of range");
        self.stats_entry(MAX_VIPS + index)
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

    fn stats_entry(&self, key: u32) -> Result<(u64, u64)> {
        // BPF_MAP_TYPE_PERCPU_ARRAY of struct lb_stats { __u64 v1; __u64 v2; }: the syscall
        // returns one 16-byte value per possible CPU.
        let cpus = possible_cpus()?;
        let mut buf = vec![0u8; 16 * cpus];
        let map = self.map("stats")?;
        sys::map_lookup(map.as_fd(), &key.to_ne_bytes(), &mut buf).with_context(|| format!("reading stats[{key}]"))?;
        Ok(buf.chunks_exact(16).fold((0, 0), |(v1, v2), c| {
            (
                v1 + u64::from_ne_bytes(c[0..8].try_into().unwrap()),
                v2 + u64::from_ne_bytes(c[8..16].try_into().unwrap()),
            )
        }))
    }

    fn update(&self, map_name: &str, key: &[u8], value: &[u8]) -> Result<()> {
        let map = self.map(map_name)?;
        sys::map_update(map.as_fd(), key, value)
            .with_context(|| format!("writing Katran's {map_name}: key {} value {}", hex(key), hex(value)))
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
        let array = open_prog_array(forward_pin, slot)?;
        let fd = self.prog.as_raw_fd() as u32;
        if let Err(e) = sys::map_update(array.as_fd(), &slot.to_ne_bytes(), &fd.to_ne_bytes()) {
            let hint = if e.raw_os_error() == Some(libc::EINVAL) {
                " (EINVAL: the array's owner program is not compatible: another program type, or \
                 the XDP frags flag differs; the balancer is XDP without frags)"
            } else {
                ""
            };
            bail!(
                "putting Katran's balancer (prog id {}) into {} slot {slot}: {e}{hint}",
                self.prog_id,
                forward_pin.display()
            );
        }
        let mut regs = self.registrations.lock().unwrap_or_else(|p| p.into_inner());
        if !regs.iter().any(|(p, s)| p == forward_pin && *s == slot) {
            regs.push((forward_pin.to_path_buf(), slot));
        }
        Ok(())
    }

    /// Empties slot `slot` of the prog array at `forward_pin`, which must hold this balancer
    /// (an error otherwise, so a test never removes a program it did not put there).
    pub fn unregister(&self, forward_pin: &Path, slot: u32) -> Result<()> {
        let array = open_prog_array(forward_pin, slot)?;
        match slot_prog_id(array.as_fd(), slot)
            .with_context(|| format!("reading {} slot {slot}", forward_pin.display()))?
        {
            Some(id) if id == self.prog_id => {}
            Some(id) => bail!(
                "{} slot {slot} holds program {id}, not Katran's balancer ({}): not removing it",
                forward_pin.display(),
                self.prog_id
            ),
            None => bail!("{} slot {slot} is empty: Katran's balancer is not registered there", forward_pin.display()),
        }
        sys::map_delete(array.as_fd(), &slot.to_ne_bytes())
            .with_context(|| format!("deleting {} slot {slot}", forward_pin.display()))?;
        self.registrations.lock().unwrap_or_else(|p| p.into_inner()).retain(|(p, s)| !(p == forward_pin && *s == slot));
        Ok(())
    }

    /// Whether slot `slot` of the prog array at `forward_pin` holds this balancer.
    pub fn is_registered(&self, forward_pin: &Path, slot: u32) -> Result<bool> {
        let array = open_prog_array(forward_pin, slot)?;
        Ok(slot_prog_id(array.as_fd(), slot)? == Some(self.prog_id))
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
fn open_prog_array(pin: &Path, slot: u32) -> Result<OwnedFd> {
    let array = sys::obj_get(pin).with_context(|| format!("opening prog array {}", pin.display()))?;
    let info = sys::map_info(array.as_fd()).with_context(|| format!("reading {}'s map info", pin.display()))?;
    ensure!(
        info.map_type == sys::BPF_MAP_TYPE_PROG_ARRAY,
        "{} is a map of type {}, not a BPF_MAP_TYPE_PROG_ARRAY ({})",
        pin.display(),
        info.map_type,
        sys::BPF_MAP_TYPE_PROG_ARRAY
    );
    ensure!(slot < info.max_entries, "{} has {} slots, no slot {slot}", pin.display(), info.max_entries);
    Ok(array)
}

/// The id of the program in a prog array's slot, `None` if the slot is empty (userspace lookups
/// of a prog array return program ids).
fn slot_prog_id(array: BorrowedFd<'_>, slot: u32) -> Result<Option<u32>> {
    let mut id = [0u8; 4];
    match sys::map_lookup(array, &slot.to_ne_bytes(), &mut id) {
        Ok(()) => Ok(Some(u32::from_ne_bytes(id))),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The number of possible CPUs (`/sys/devices/system/cpu/possible`, e.g. `0-1` or `0,2-3`):
/// per-CPU maps return one value per possible CPU.
fn possible_cpus() -> Result<usize> {
    let path = "/sys/devices/system/cpu/possible";
    let text = fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let mut max = None;
    for range in text.trim().split(',') {
        let last = range.rsplit('-').next().unwrap_or(range);
        let n: usize = last.parse().with_context(|| format!("parsing {path}: {text:?}"))?;
        max = max.max(Some(n));
    }
    max.map(|m| m + 1).with_context(|| format!("no CPUs in {path}: {text:?}"))
}

/// Bytes as lowercase hex pairs separated by spaces (the form `bpftool map update ... hex` takes).
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
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

/// The few `bpf(2)` commands this module needs, with `union bpf_attr` prefixes laid out as the
/// kernel reads them (`include/uapi/linux/bpf.h`).
mod sys {
    use super::*;

    const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
    const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
    const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
    const BPF_OBJ_GET: libc::c_long = 7;
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    pub const BPF_MAP_TYPE_PROG_ARRAY: u32 = 3;

    /// `bpf_attr` for BPF_MAP_*_ELEM.
    #[repr(C)]
    #[derive(Default)]
    struct ElemAttr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }

    /// `bpf_attr` for BPF_OBJ_GET.
    #[repr(C)]
    #[derive(Default)]
    struct ObjAttr {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
        path_fd: i32,
        _pad: u32,
    }

    /// `bpf_attr` for BPF_OBJ_GET_INFO_BY_FD.
    #[repr(C)]
    #[derive(Default)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }

    /// The head of `struct bpf_map_info` (the kernel fills only `info_len` bytes).
    #[repr(C)]
    #[derive(Default, Debug)]
    pub struct MapInfo {
        pub map_type: u32,
        pub id: u32,
        pub key_size: u32,
        pub value_size: u32,
        pub max_entries: u32,
        pub map_flags: u32,
    }

    /// The head of `struct bpf_prog_info`.
    #[repr(C)]
    #[derive(Default)]
    struct ProgInfo {
        prog_type: u32,
        id: u32,
        tag: [u8; 8],
    }

    fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
        // SAFETY: attr is a valid, fully initialised bpf_attr prefix for cmd, and every pointer it
        // holds is valid for the sizes it states for the duration of the call.
        let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, std::mem::size_of::<T>()) };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(rc)
        }
    }

    pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
        let c =
            CString::new(path.as_os_str().as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut attr = ObjAttr { pathname: c.as_ptr() as u64, ..Default::default() };
        let fd = bpf(BPF_OBJ_GET, &mut attr)?;
        // SAFETY: BPF_OBJ_GET returned a new file descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }

    fn elem(cmd: libc::c_long, map: BorrowedFd<'_>, key: &[u8], value: Option<*mut u8>) -> io::Result<()> {
        let mut attr = ElemAttr {
            map_fd: map.as_raw_fd() as u32,
            key: key.as_ptr() as u64,
            value: value.map_or(0, |v| v as u64),
            ..Default::default()
        };
        bpf(cmd, &mut attr).map(drop)
    }

    /// BPF_MAP_UPDATE_ELEM with BPF_ANY; `key`/`value` must be the map's key/value size.
    pub fn map_update(map: BorrowedFd<'_>, key: &[u8], value: &[u8]) -> io::Result<()> {
        elem(BPF_MAP_UPDATE_ELEM, map, key, Some(value.as_ptr() as *mut u8))
    }

    /// BPF_MAP_LOOKUP_ELEM; `value` must hold the map's value size (times CPUs for per-CPU maps).
    pub fn map_lookup(map: BorrowedFd<'_>, key: &[u8], value: &mut [u8]) -> io::Result<()> {
        elem(BPF_MAP_LOOKUP_ELEM, map, key, Some(value.as_mut_ptr()))
    }

    pub fn map_delete(map: BorrowedFd<'_>, key: &[u8]) -> io::Result<()> {
        elem(BPF_MAP_DELETE_ELEM, map, key, None)
    }

    fn info<T: Default>(fd: BorrowedFd<'_>) -> io::Result<T> {
        let mut info = T::default();
        let mut attr = InfoAttr {
            bpf_fd: fd.as_raw_fd() as u32,
            info_len: std::mem::size_of::<T>() as u32,
            info: &mut info as *mut T as u64,
        };
        bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
        Ok(info)
    }

    pub fn map_info(map: BorrowedFd<'_>) -> io::Result<MapInfo> {
        info(map)
    }

    pub fn prog_id(prog: BorrowedFd<'_>) -> io::Result<u32> {
        info::<ProgInfo>(prog).map(|i| i.id)
    }
}
