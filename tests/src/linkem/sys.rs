//! The raw syscalls the relay and the probes need, wrapped so that the `unsafe` stays here.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::RawFd;

/// CLOCK_REALTIME in nanoseconds: the clock SO_TIMESTAMPNS stamps received frames with, so every
/// departure time and every probe timestamp is on this one clock.
pub(crate) fn realtime_ns() -> i64 {
    // SAFETY: a zeroed timespec is valid and clock_gettime only writes to it.
    let mut ts: libc::timespec = unsafe { zeroed() };
    // SAFETY: valid pointer; CLOCK_REALTIME always exists, so this cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

pub(crate) fn setsockopt<T>(fd: RawFd, level: i32, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: `value` points to size_of::<T>() readable bytes for the duration of the call.
    let rc =
        unsafe { libc::setsockopt(fd, level, name, (value as *const T).cast(), size_of::<T>() as libc::socklen_t) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

pub(crate) fn getsockopt<T: Copy>(fd: RawFd, level: i32, name: i32) -> io::Result<T> {
    // SAFETY: only used with plain-old-data kernel structs, for which all-zero is valid.
    let mut value: T = unsafe { zeroed() };
    let mut len = size_of::<T>() as libc::socklen_t;
    // SAFETY: `value` has room for `len` bytes.
    let rc = unsafe { libc::getsockopt(fd, level, name, (&mut value as *mut T).cast(), &mut len) };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One frame or datagram as `recvmsg` reported it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Received {
    /// Its full length, which exceeds the buffer when `truncated`.
    pub(crate) len: usize,
    pub(crate) truncated: bool,
    /// Kernel receive timestamp (CLOCK_REALTIME ns) if SO_TIMESTAMPNS is on.
    pub(crate) kernel_ns: Option<i64>,
    /// Packet sockets with PACKET_AUXDATA: VLAN tag stripped by the NIC/veth, checksum state.
    pub(crate) aux: Option<libc::tpacket_auxdata>,
    /// Packet sockets: PACKET_HOST, PACKET_OUTGOING, …
    pub(crate) pkttype: Option<u8>,
    /// Error queue with SOF_TIMESTAMPING_OPT_ID: which datagram `kernel_ns` is the transmit
    /// timestamp of (0 for the first one sent after enabling timestamping).
    pub(crate) tx_id: Option<u32>,
}

/// `recvmsg` into `buf` with its control messages; `flags` may add MSG_ERRQUEUE and
/// MSG_DONTWAIT. `Ok(None)` when nothing is there (a non-blocking socket, or SO_RCVTIMEO
/// expired) or the call was interrupted by a signal.
pub(crate) fn recv(fd: RawFd, buf: &mut [u8], flags: i32) -> io::Result<Option<Received>> {
    // u64 elements give the control buffer the alignment cmsghdr needs.
    let mut control = [0u64; 32];
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut from: libc::sockaddr_storage = unsafe { zeroed() };
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: all-zero is a valid msghdr; the pointers are filled in below.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_name = (&mut from as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&control);
    // SAFETY: msg points to live buffers of the sizes it claims. MSG_TRUNC makes the kernel
    // return the real length of a frame that did not fit.
    let n = unsafe { libc::recvmsg(fd, &mut msg, flags | libc::MSG_TRUNC) };
    if n < 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::EAGAIN | libc::EINTR) => Ok(None),
            _ => Err(err),
        };
    }
    let mut received = Received {
        len: n as usize,
        truncated: n as usize > buf.len(),
        kernel_ns: None,
        aux: None,
        pkttype: None,
        tx_id: None,
    };
    if i32::from(from.ss_family) == libc::AF_PACKET {
        // SAFETY: the kernel filled in a sockaddr_ll, which fits in sockaddr_storage.
        let ll = unsafe { &*(&from as *const libc::sockaddr_storage).cast::<libc::sockaddr_ll>() };
        received.pkttype = Some(ll.sll_pkttype);
    }
    // SAFETY: msg and its control buffer are valid; CMSG_* walk only within msg_controllen, and
    // each payload is read (unaligned) only when its type says what it holds.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            let data = libc::CMSG_DATA(cmsg);
            match ((*cmsg).cmsg_level, (*cmsg).cmsg_type) {
                (libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS) => {
                    let ts = data.cast::<libc::timespec>().read_unaligned();
                    received.kernel_ns = Some(ts.tv_sec * 1_000_000_000 + ts.tv_nsec);
                }
                // struct scm_timestamping: software, (deprecated), hardware.
                (libc::SOL_SOCKET, libc::SCM_TIMESTAMPING) => {
                    let ts = data.cast::<libc::timespec>().read_unaligned();
                    received.kernel_ns = Some(ts.tv_sec * 1_000_000_000 + ts.tv_nsec);
                }
                (libc::SOL_IP, libc::IP_RECVERR) | (libc::SOL_IPV6, libc::IPV6_RECVERR) => {
                    let err = data.cast::<libc::sock_extended_err>().read_unaligned();
                    if err.ee_origin == libc::SO_EE_ORIGIN_TIMESTAMPING {
                        received.tx_id = Some(err.ee_data);
                    }
                }
                (libc::SOL_PACKET, libc::PACKET_AUXDATA) => {
                    received.aux = Some(data.cast::<libc::tpacket_auxdata>().read_unaligned());
                }
                _ => {}
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(Some(received))
}

/// A non-blocking `send` on a connected or bound socket.
pub(crate) fn send(fd: RawFd, frame: &[u8]) -> io::Result<usize> {
    // SAFETY: frame is a live buffer of frame.len() bytes.
    let n = unsafe { libc::send(fd, frame.as_ptr().cast(), frame.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `ppoll` with a nanosecond timeout (plain `poll` only has milliseconds). An interrupting
/// signal counts as a timeout.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout_ns: i64) -> io::Result<()> {
    let timeout = libc::timespec { tv_sec: timeout_ns / 1_000_000_000, tv_nsec: timeout_ns % 1_000_000_000 };
    // SAFETY: fds and timeout are valid for the call; a null sigmask leaves the mask unchanged.
    let rc = unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &timeout, std::ptr::null()) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
    Ok(())
}

/// Sets the calling thread's timer slack to 1 ns. The default 50 µs lets the kernel fire our
/// timed wakeups up to 50 µs late to batch them with others.
pub(crate) fn minimal_timer_slack() -> io::Result<()> {
    // SAFETY: PR_SET_TIMERSLACK takes an integer argument and only affects this thread.
    if unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Switches the calling thread to SCHED_FIFO at `priority`, so that its wakeups preempt ordinary
/// tasks (traffic generators, builds) instead of waiting for a time slice.
pub(crate) fn realtime_priority(priority: i32) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: priority };
    // SAFETY: pid 0 is the calling thread; param is valid.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Locks the process's memory, present and future, so that the relay never waits for a page
/// fault (its binary's pages being evicted under memory pressure from parallel builds, say).
pub(crate) fn lock_memory() -> io::Result<()> {
    // SAFETY: plain syscall with flag arguments.
    if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn if_nametoindex(name: &str) -> io::Result<u32> {
    let c_name = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in interface name"))?;
    // SAFETY: c_name is a valid NUL-terminated string.
    match unsafe { libc::if_nametoindex(c_name.as_ptr()) } {
        0 => Err(io::Error::last_os_error()),
        index => Ok(index),
    }
}
