//! The clock the two points share: TAI (`CLOCK_TAI`), the datapath's `bpf_ktime_get_tai_ns`.
//! Synchronised hosts (PTP, or NTP with the TAI offset set, as chrony's `leapsectz` does) agree
//! on it; on one host every namespace does.

/// Nanoseconds since the TAI epoch.
pub fn now() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to write into; CLOCK_TAI exists since Linux 3.10.
    unsafe { libc::clock_gettime(libc::CLOCK_TAI, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
