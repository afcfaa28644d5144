//! Kernels before 5.11 charge BPF maps to the locked-memory limit (RLIMIT_MEMLOCK, often 64 KiB
//! or 8 MiB), so a flow table fails to be created with EPERM, which reads as a lack of root.
//! pirated raises the limit there before loading, and names it when creating maps still fails.

use std::io;

/// Whether kernel `release` (as `uname -r` prints it) charges BPF maps to RLIMIT_MEMLOCK: every
/// release before 5.11 (from 5.11 on, maps are charged to the memory cgroup).
pub fn charged(release: &str) -> bool {
    let mut parts = release.split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse::<u32>().ok());
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) < (5, 11)
}

/// The running kernel's release.
pub fn release() -> io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/osrelease")?.trim().to_owned())
}

/// The locked-memory limit (soft), in bytes; `None` for unlimited.
pub fn limit() -> io::Result<Option<u64>> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur))
}

/// On a kernel that charges maps to it, lifts the limit: to unlimited if allowed
/// (CAP_SYS_RESOURCE), else the soft limit to the hard one. Returns the limit now in force.
pub fn raise() -> io::Result<Option<u64>> {
    if !charged(&release()?) {
        return limit();
    }
    let unlimited = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: setrlimit and getrlimit read or write one rlimit each.
    unsafe {
        if libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) != 0 {
            let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) == 0 {
                lim.rlim_cur = lim.rlim_max;
                libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim);
            }
        }
    }
    limit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_before_5_11_charge_maps_to_memlock() {
        for old in ["4.19.0-27-amd64", "5.4.0", "5.10.209-1", "3.10.0-1160.el7.x86_64"] {
            assert!(charged(old), "{old}");
        }
        for new in ["5.11.0", "5.15.0-91-generic", "6.1.0-18-amd64", "6.18.1", "10.0"] {
            assert!(!charged(new), "{new}");
        }
    }

    /// On a kernel that does not charge maps, the limit is left as it is.
    #[test]
    fn a_current_kernel_keeps_the_limit() {
        if charged(&release().unwrap()) {
            return;
        }
        assert_eq!(raise().unwrap(), limit().unwrap());
    }
}
