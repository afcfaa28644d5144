//! The clock the two points share: TAI (`CLOCK_TAI`), the datapath's `bpf_ktime_get_tai_ns`.
//! Synchronised hosts (PTP, or NTP with the TAI offset set, as chrony's `leapsectz` does) agree
//! on it; on one host every namespace does.

fn read(clock: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to write into; CLOCK_TAI exists since Linux 3.10.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// Nanoseconds since the TAI epoch.
pub fn now() -> u64 {
    read(libc::CLOCK_TAI) as u64
}

/// TAI minus UTC (`CLOCK_REALTIME`, what packet captures stamp with) on this host, in ns: the
/// leap-second count the kernel was given (0 if none was), so whole seconds.
pub fn tai_offset_ns() -> i64 {
    let (utc, tai) = (read(libc::CLOCK_REALTIME), read(libc::CLOCK_TAI));
    ((tai - utc) as f64 / 1e9).round() as i64 * 1_000_000_000
}
