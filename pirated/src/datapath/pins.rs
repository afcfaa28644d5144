//! An instance's pin directory, `<pin_root>/<instance>/`: its maps and XDP link live there
//! across restarts, beside an empty `layout-…` directory naming the map layout they were made
//! with (bpffs holds no files), and a lock in /run/pirated keeps one daemon per instance.

use std::{
    fs,
    os::{
        fd::AsRawFd,
        unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    },
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
    /// Why the pins will not outlive this process, if they will not.
    volatile: Option<String>,
}

impl PinDir {
    /// Locks `instance` and readies its directory under `root` for maps of `layout`. Returns
    /// whether the pinned maps are reusable: made with this very layout. Otherwise their pins
    /// go, with the reason logged, but not `FORWARD` (where balancers registered) nor the links
    /// (the chain stays attached until the new root replaces it).
    pub fn open(root: &Path, instance: &str, layout: &str) -> anyhow::Result<(PinDir, bool)> {
        let lock = lock_instance(instance)?;
        let volatile = ensure_bpffs(root)?;
        let dir = root.join(instance);
        private_dir(&dir)?;
        let names = entries(&dir)?;
        let marker = format!("{MARKER_PREFIX}{layout}");
        if names.contains(&marker) {
            return Ok((PinDir { dir, _lock: lock, volatile }, true));
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
        Ok((PinDir { dir, _lock: lock, volatile }, false))
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Why the pins will not outlive this process, if they will not.
    pub fn volatile(&self) -> Option<&str> {
        self.volatile.as_deref()
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

/// Makes `dir` (and what it lacks above it) readable by its owner alone, and refuses one owned
/// by another user: who can write there can replace the pins or the lock.
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(anyhow::Error::from)
        .with_context(|| format!("creating {}", dir.display()))?;
    let meta = fs::symlink_metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("{} is not a directory (a link?): pirated keeps its state only in a directory of its own", dir.display());
    }
    let owner = meta.uid();
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if owner == 0 && me != 0 {
        bail!("writing in {} was refused (it belongs to root): {}", dir.display(), super::privileges::NEEDS_ROOT);
    }
    if owner != me {
        bail!(
            "{} belongs to uid {owner}, not to pirated's ({me}): another user could replace what is kept there; \
             give it to this user (chown) or remove it",
            dir.display()
        );
    }
    // One made before (by an older pirated, or a runtime directory's default) is closed too.
    if meta.mode() & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making {} its owner's alone", dir.display()))?;
    }
    Ok(())
}

/// Takes /run/pirated/<instance>.lock, so that a second daemon with the same instance name (and
/// pin directory) fails instead of taking over the first one's chain.
fn lock_instance(instance: &str) -> anyhow::Result<fs::File> {
    let refused =
        |what: &str, e: &std::io::Error| format!("{what} was refused ({e}): {}", super::privileges::NEEDS_ROOT);
    match private_dir(Path::new(LOCK_DIR)) {
        // A fresh host has no /run/pirated, and only root may make it.
        Err(e)
            if e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied) =>
        {
            bail!(refused(&format!("creating {LOCK_DIR}"), e.downcast_ref::<std::io::Error>().unwrap()))
        }
        made => made?,
    }
    let path = Path::new(LOCK_DIR).join(format!("{instance}.lock"));
    // Never through a link, never truncated: the lock file is only locked.
    let opened = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path);
    let file = match opened {
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            bail!("{} is a symbolic link: pirated takes its lock only in a file of its own; remove it", path.display())
        }
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
/// fresh boot has none, and `ip netns exec` gives its commands a new /sys without it. Says why
/// the pins will not outlive this process, if they will not: a bpffs mounted here, in a mount
/// namespace of this process's own (`ip netns exec` makes one per command), goes with it.
pub fn ensure_bpffs(root: &Path) -> anyhow::Result<Option<String>> {
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
        return Ok(None);
    }
    let sys_bpf = Path::new("/sys/fs/bpf");
    if !root.starts_with(sys_bpf) {
        bail!("pin_root {} is not on a bpffs mount (mount -t bpf bpf <dir>)", root.display());
    }
    let (fstype, path) = (std::ffi::CString::new("bpf").unwrap(), std::ffi::CString::new("/sys/fs/bpf").unwrap());
    // SAFETY: all pointers are valid NUL-terminated strings.
    // Readable by root alone, as systemd mounts it.
    let data = std::ffi::CString::new("mode=0700").unwrap();
    let rc = unsafe { libc::mount(fstype.as_ptr(), path.as_ptr(), fstype.as_ptr(), 0, data.as_ptr().cast()) };
    if rc != 0 {
        bail!(
            "/sys/fs/bpf is not a bpffs mount and mounting one failed ({}): mount it as root (`mount -t bpf bpf \
             /sys/fs/bpf`; systemd does at boot), or run pirated as root",
            std::io::Error::last_os_error()
        );
    }
    info!("mounted bpffs on /sys/fs/bpf");
    // A mount namespace made for this process (`ip netns exec`, `unshare` make one per command)
    // is not its parent's, and ends with it; so do PID 1's mounts (a container's only process).
    let namespace = |pid: &str| fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
    // SAFETY: getppid has no preconditions.
    let (own, parent) = (namespace("self"), namespace(&unsafe { libc::getppid() }.to_string()));
    if own.is_none() || parent.is_none() {
        info!("cannot tell whether this mount namespace, and the bpffs mounted in it, outlives pirated");
    }
    let private = std::process::id() == 1 || matches!((&own, &parent), (Some(a), Some(b)) if a != b);
    Ok(private.then(|| {
        "its bpffs was mounted by this pirated in a mount namespace of its own (`ip netns exec`, a \
         container), which ends with it: mount bpffs where it lasts (the host's /sys/fs/bpf, \
         bind-mounted) to keep the chain and its state across restarts"
            .to_string()
    }))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    /// Whether the test runs as root (as the test command does): these touch /run and chown.
    fn root() -> bool {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if !root {
            eprintln!("not root: skipped");
        }
        root
    }

    /// A lock path that is a symbolic link is refused, and what it points at is left as it was
    /// (the lock was created through it, truncating it).
    #[test]
    fn a_lock_that_is_a_link_is_refused_and_its_target_left_alone() {
        if !root() {
            return;
        }
        let instance = format!("link-test-{}", std::process::id());
        let victim = std::env::temp_dir().join(format!("pirated-victim-{}", std::process::id()));
        fs::write(&victim, "keep me").unwrap();
        private_dir(Path::new(LOCK_DIR)).unwrap();
        let lock = Path::new(LOCK_DIR).join(format!("{instance}.lock"));
        let _ = fs::remove_file(&lock);
        symlink(&victim, &lock).unwrap();
        let e = format!("{:#}", lock_instance(&instance).expect_err("a link taken as the lock"));
        let kept = fs::read_to_string(&victim).unwrap();
        let _ = (fs::remove_file(&lock), fs::remove_file(&victim));
        assert!(e.contains("is a symbolic link"), "{e}");
        assert_eq!(kept, "keep me");
    }

    /// A directory of pirated's owned by another user is refused, naming the owner; the ones it
    /// makes are its owner's alone.
    #[test]
    fn a_directory_of_another_user_is_refused() {
        if !root() {
            return;
        }
        let base = std::env::temp_dir().join(format!("pirated-dirs-{}", std::process::id()));
        let made = base.join("made/deeper");
        private_dir(&made).unwrap();
        let mode = fs::metadata(&made).unwrap().mode() & 0o777;
        let other = base.join("other");
        fs::create_dir_all(&other).unwrap();
        std::os::unix::fs::chown(&other, Some(65534), Some(65534)).unwrap();
        let e = format!("{:#}", private_dir(&other).unwrap_err());
        fs::remove_dir_all(&base).unwrap();
        assert_eq!(mode, 0o700);
        assert!(e.contains("belongs to uid 65534"), "{e}");
    }
}
