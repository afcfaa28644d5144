//! What the capabilities' ring buffers share: the sizes the kernel takes for one, and waiting
//! for one to have something (the hand-over ring, the fridges' samples, the segment's cache).

use std::os::fd::{AsRawFd, RawFd};

use tokio::io::{unix::AsyncFd, Interest};

/// The smallest ring buffer the kernel makes: a page (a ring's size must be a power of two and a
/// whole number of pages). 4096 bytes on x86-64; 16 or 64 KiB on some arm64 kernels.
pub fn min_bytes() -> u32 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(page).unwrap_or(4096).max(4096)
}

/// Why `bytes` is no size for a ring buffer of at most `most` bytes (a configured one), if not.
pub fn bytes_refusal(bytes: u32, most: u32) -> Option<String> {
    let least = min_bytes();
    (!bytes.is_power_of_two() || !(least..=most).contains(&bytes))
        .then(|| format!("must be a power of two, {least}..={most}"))
}

/// A ring buffer's descriptor, owned by whoever reads the ring, registered for readiness only.
pub struct Borrowed(RawFd);

impl AsRawFd for Borrowed {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// A ring buffer's descriptor watched for readiness.
pub type Watched = AsyncFd<Borrowed>;

/// Watches a ring buffer's descriptor for readiness.
///
/// # Safety
/// `fd` must stay open while the returned value lives (its reader owns it).
pub unsafe fn watch(fd: RawFd, what: &str) -> anyhow::Result<Watched> {
    // SAFETY: the caller keeps `fd` open.
    unsafe { AsyncFd::register_with_interest(Borrowed(fd), Interest::READABLE) }
        .map_err(|e| anyhow::anyhow!("watching {what}: {e}"))
}
