//! An instance's pin directory, `<pin_root>/<instance>/`: its maps and XDP link live there
//! across restarts, beside an empty `layout-…` directory naming the map layout they were made
//! with (bpffs holds no files), and a lock in /run/pirated keeps one daemon per instance.

use std::{
    fs,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context};
use pirate_common::maps;
use tracing::info;

pub const LOCK_DIR: &str = "/run/pirated";

pub(crate) const MARKER_PREFIX: &str = "layout-";
const LINK_PREFIX: &str = "link-";

/// A locked pin directory.
pub struct PinDir {
    dir: PathBuf,
    _lock: fs::File,
}

impl PinDir {
    /// Locks `instance` and readies its directory under `root` for maps of `layout`. Returns
    /// whether the pinned maps are reusable: made with this very layout. Otherwise their pins
    /// go, with the reason logged, but not `FORWARD` (where balancers registered) nor the links
    /// (the chain stays attached until the new root replaces it).
    pub fn open(root: &Path, instance: &str, layout: &str) -> anyhow::Result<(PinDir, bool)> {
        let lock = lock_instance(instance)?;
        ensure_bpffs(root)?;
        let dir = root.join(instance);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let names = entries(&dir)?;
        let marker = format!("{MARKER_PREFIX}{layout}");
        if names.contains(&marker) {
            return Ok((PinDir { dir, _lock: lock }, true));
        }
        let old = names.iter().find(|n| n.starts_with(MARKER_PREFIX));
        let stale: Vec<&String> = names.iter().filter(|n| *n != maps::FORWARD && !n.starts_with(LINK_PREFIX)).collect();
        if !stale.is_empty() {
            let why = match old {
                Some(old) => format!("the map layout changed ({old} → {marker})"),
                None => "pins without a layout marker (an interrupted start)".to_string(),
            };
            info!(dir = %dir.display(), "{why}: starting with fresh maps");
        }
        for name in stale {
            let path = dir.join(name);
            let removed = if path.is_dir() { fs::remove_dir_all(&path) } else { fs::remove_file(&path) };
            removed.with_context(|| format!("removing the stale pin {}", path.display()))?;
        }
        Ok((PinDir { dir, _lock: lock }, false))
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Records that the maps pinned here now have `layout` (after they were all created).
    pub fn mark(&self, layout: &str) -> anyhow::Result<()> {
        let marker = self.dir.join(format!("{MARKER_PREFIX}{layout}"));
        fs::create_dir(&marker).with_context(|| format!("creating {}", marker.display()))
    }

    /// Where the chain's XDP link on `iface` is pinned.
    pub fn link(&self, iface: &str) -> PathBuf {
        self.dir.join(link_name(iface))
    }

    /// Pinned links on interfaces other than `iface` (the instance moved).
    pub fn other_links(&self, iface: &str) -> anyhow::Result<Vec<PathBuf>> {
        let own = link_name(iface);
        Ok(entries(&self.dir)?
            .into_iter()
            .filter(|n| n.starts_with(LINK_PREFIX) && *n != own)
            .map(|n| self.dir.join(n))
            .collect())
    }

    /// Removes every pin: links (which detaches the chain once no descriptor holds them), maps
    /// and the marker.
    pub fn remove(&self) -> anyhow::Result<()> {
        fs::remove_dir_all(&self.dir).with_context(|| format!("removing {}", self.dir.display()))
    }
}

/// Removes what `instance` left pinned under `root` (its chain detaches), if no daemon runs it.
/// Returns whether there was anything.
pub fn remove_instance(root: &Path, instance: &str) -> anyhow::Result<bool> {
    let _lock = lock_instance(instance)?;
    let dir = root.join(instance);
    if !dir.exists() {
        return Ok(false);
    }
    fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    Ok(true)
}

/// The link's pin name: bpffs refuses dots, which VLAN interfaces have (`eth0.100`), so they
/// become colons, which no interface name has.
fn link_name(iface: &str) -> String {
    format!("{LINK_PREFIX}{}", iface.replace('.', ":"))
}

fn entries(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        names.push(entry?.file_name().to_string_lossy().into_owned());
    }
    Ok(names)
}

/// Takes /run/pirated/<instance>.lock, so that a second daemon with the same instance name (and
/// pin directory) fails instead of taking over the first one's chain.
fn lock_instance(instance: &str) -> anyhow::Result<fs::File> {
    let refused =
        |what: &str, e: &std::io::Error| format!("{what} was refused ({e}): {}", super::privileges::NEEDS_ROOT);
    match fs::create_dir_all(LOCK_DIR) {
        // A fresh host has no /run/pirated, and only root may make it.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            bail!(refused(&format!("creating {LOCK_DIR}"), &e))
        }
        made => made.with_context(|| format!("creating {LOCK_DIR}"))?,
    }
    let path = Path::new(LOCK_DIR).join(format!("{instance}.lock"));
    let file = match fs::File::create(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            bail!(refused(&format!("opening {}", path.display()), &e))
        }
        opened => opened.with_context(|| format!("opening {}", path.display()))?,
    };
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        bail!(
            "instance {instance:?} is running ({} is locked): stop it, or give this daemon another `instance`",
            path.display()
        );
    }
    Ok(file)
}

/// Makes sure `root` lies on bpffs. The default root's /sys/fs/bpf is mounted if it is not: a
/// fresh boot has none, and `ip netns exec` gives its commands a new /sys without it.
pub fn ensure_bpffs(root: &Path) -> anyhow::Result<()> {
    const BPF_FS_MAGIC: i64 = 0xcafe4a11;
    let on_bpffs = |p: &Path| {
        let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else { return false };
        // SAFETY: statfs writes into the zeroed struct; the path is NUL-terminated.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC }
    };
    // The nearest existing ancestor tells which filesystem `root` is (or will be) on.
    let existing = root.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
    if on_bpffs(existing) {
        return Ok(());
    }
    let sys_bpf = Path::new("/sys/fs/bpf");
    if !root.starts_with(sys_bpf) {
        bail!("pin_root {} is not on a bpffs mount (mount -t bpf bpf <dir>)", root.display());
    }
    let (fstype, path) = (std::ffi::CString::new("bpf").unwrap(), std::ffi::CString::new("/sys/fs/bpf").unwrap());
    // SAFETY: all pointers are valid NUL-terminated strings; no data argument.
    let rc = unsafe { libc::mount(fstype.as_ptr(), path.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        bail!(
            "/sys/fs/bpf is not a bpffs mount and mounting one failed ({}): mount it as root (`mount -t bpf bpf \
             /sys/fs/bpf`; systemd does at boot), or run pirated as root",
            std::io::Error::last_os_error()
        );
    }
    info!("mounted bpffs on /sys/fs/bpf");
    Ok(())
}
