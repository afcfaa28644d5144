//! The privileges pirated needs of the kernel, and how to tell whether it holds them, for errors
//! that say what to do.

use std::fs;

/// The privileges pirated needs, for errors that come of lacking them.
pub const NEEDS_ROOT: &str =
    "pirated needs root, or CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN and write access to /run/pirated";

/// CAP_PERFMON's number (Linux 5.8 on).
pub(super) const CAP_PERFMON: u32 = 38;

/// Whether this process holds capability `cap` (effective, as /proc/self/status says); assumed
/// held where that cannot be read.
pub(super) fn has_capability(cap: u32) -> bool {
    let effective = fs::read_to_string("/proc/self/status").ok().and_then(|status| {
        let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
        u64::from_str_radix(hex.trim(), 16).ok()
    });
    effective.is_none_or(|caps| caps & (1 << cap) != 0)
}
