//! `cargo xtask install`: pirated as a systemd service. configs/pirated.service is the unit of the
//! default layout (/usr/local, /etc); [`Layout::unit`] renders it for any other.

use std::{
    fs, io,
    os::unix::fs::{chown, PermissionsExt},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{bail, Context, Result};

use crate::{root, run};

pub const DEFAULT_PREFIX: &str = "/usr/local";
pub const DEFAULT_SYSCONFDIR: &str = "/etc";

/// The unit, as the repository holds it.
const UNIT: &str = "configs/pirated.service";
/// The configuration installed where there is none.
const CONFIG: &str = "configs/pirated.toml";

/// Where the service's files go.
pub struct Layout {
    /// The binary goes to `<prefix>/bin/pirated`.
    pub prefix: PathBuf,
    /// The configuration to `<sysconfdir>/pirated/pirated.toml`, the unit to
    /// `<sysconfdir>/systemd/system/pirated.service`.
    pub sysconfdir: PathBuf,
}

impl Layout {
    pub fn binary(&self) -> PathBuf {
        self.prefix.join("bin/pirated")
    }

    pub fn config(&self) -> PathBuf {
        self.sysconfdir.join("pirated/pirated.toml")
    }

    pub fn unit_path(&self) -> PathBuf {
        self.sysconfdir.join("systemd/system/pirated.service")
    }

    /// The unit with this layout's binary and configuration in its `ExecStart=`.
    pub fn unit(&self) -> Result<String> {
        let template = fs::read_to_string(root().join(UNIT)).with_context(|| format!("reading {UNIT}"))?;
        let exec_start = |layout: &Layout| -> Result<String> {
            let (binary, config) = (layout.binary(), layout.config());
            for path in [&binary, &config] {
                let path = path.to_str().with_context(|| format!("{} is not UTF-8", path.display()))?;
                if !path.starts_with('/') || path.contains(|c: char| c.is_whitespace() || "%\"'\\".contains(c)) {
                    bail!("{path:?}: a path in ExecStart= must be absolute, without white space, quotes, '%' or '\\'");
                }
            }
            Ok(format!("ExecStart={} run --config {}", binary.display(), config.display()))
        };
        let default = exec_start(&Layout { prefix: DEFAULT_PREFIX.into(), sysconfdir: DEFAULT_SYSCONFDIR.into() })?;
        if !template.lines().any(|l| l == default) {
            bail!("{UNIT} has no line {default}");
        }
        Ok(template.replace(&default, &exec_start(self)?))
    }
}

/// The values of `key` in unit text `unit`, in order (`ExecStartPre=` may come more than once).
pub fn settings<'a>(unit: &'a str, key: &str) -> impl Iterator<Item = &'a str> + 'a {
    let prefix = format!("{key}=");
    unit.lines().filter_map(move |l| l.strip_prefix(prefix.as_str()))
}

/// Installs `built`, a pirated binary, as the service of `layout`: the unit's user (made if
/// missing), the binary, a configuration (only if there is none: an operator's stays) readable by
/// root and the user's group alone, and the unit; checks the
/// configuration with `pirated check` and the unit with `systemd-analyze verify`, and has systemd
/// reload its units where it runs them. Run again, it replaces the binary and the unit and keeps
/// the rest. Needs root.
pub fn install(layout: &Layout, built: &Path) -> Result<()> {
    let unit = layout.unit()?;
    let user = settings(&unit, "User").next().with_context(|| format!("{UNIT} has no User="))?;
    let gid = ensure_user(user)?;
    let binary = layout.binary();
    put(&binary, 0o755, None, |tmp| fs::copy(built, tmp).map(drop))?;
    let config = layout.config();
    if config.exists() {
        eprintln!("xtask: kept {}", config.display());
    } else {
        put(&config, 0o640, Some(gid), |tmp| fs::copy(root().join(CONFIG), tmp).map(drop))?;
        eprintln!("xtask: set `interface` in {} (every key is documented there)", config.display());
    }
    put(&layout.unit_path(), 0o644, None, |tmp| fs::write(tmp, &unit))?;
    run(Command::new(&binary).arg("check").arg("--config").arg(&config).stdout(Stdio::null()))?;
    verify(&layout.unit_path())?;
    reload(layout)
}

/// `systemd-analyze verify` of the unit at `path`: a failure, or anything it says of the unit
/// (unknown keys and values it cannot parse are only warnings to it), is an error.
pub fn verify(path: &Path) -> Result<()> {
    eprintln!("xtask: systemd-analyze verify {}", path.display());
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(path)
        .output()
        .context("running systemd-analyze (Debian's systemd package has it)")?;
    let name = path.file_name().unwrap().to_string_lossy();
    let said = String::from_utf8_lossy(&out.stderr) + String::from_utf8_lossy(&out.stdout);
    let about: Vec<&str> = said.lines().filter(|l| l.contains(&*name)).collect();
    if !out.status.success() || !about.is_empty() {
        bail!("systemd-analyze verify {} ({}):\n{}", path.display(), out.status, said.trim());
    }
    Ok(())
}

/// The group id of `user`, made a system user first (a group of its own, no home, no login) if
/// there is none.
fn ensure_user(user: &str) -> Result<u32> {
    let id = |args: &[&str]| Command::new("id").args(args).arg(user).stderr(Stdio::null()).output();
    if !id(&[])?.status.success() {
        #[rustfmt::skip]
        run(Command::new("useradd").args(["--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
            "--shell", "/usr/sbin/nologin", user]))?;
    }
    let gid = id(&["-g"])?;
    String::from_utf8_lossy(&gid.stdout).trim().parse().with_context(|| format!("the group id of {user}"))
}

/// Makes `path` (and its directory) with `mode` and group `gid`, its content written by `write`
/// into a temporary file then renamed over it: a running pirated's binary is replaced, never
/// rewritten under it.
fn put(path: &Path, mode: u32, gid: Option<u32>, write: impl FnOnce(&Path) -> io::Result<()>) -> Result<()> {
    let (dir, name) = (path.parent().unwrap(), path.file_name().unwrap().to_string_lossy());
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!(".{name}.xtask"));
    write(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode))?;
    if let Some(gid) = gid {
        chown(&tmp, None, Some(gid)).with_context(|| format!("giving {} to group {gid}", tmp.display()))?;
    }
    fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    eprintln!("xtask: installed {}", path.display());
    Ok(())
}

/// Has systemd reload its units where it runs (as PID 1) and reads this one; else says what is
/// left to do.
fn reload(layout: &Layout) -> Result<()> {
    let unit = layout.unit_path();
    if !unit.starts_with("/etc/systemd/system") {
        eprintln!("xtask: staged: systemd reads units from /etc/systemd/system, not {}", unit.display());
    } else if !Path::new("/run/systemd/system").is_dir() {
        eprintln!(
            "xtask: systemd is not PID 1 here; where it is: systemctl daemon-reload && systemctl enable --now pirated"
        );
    } else {
        run(Command::new("systemctl").arg("daemon-reload"))?;
        eprintln!("xtask: next: systemctl enable --now pirated (a running one: systemctl restart pirated)");
    }
    Ok(())
}
