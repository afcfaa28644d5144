//! The bpf(2) system call, for the commands pirated makes without aya (`test_run`, `percpu`).

use std::io;

/// Makes bpf(2) command `cmd` with `attr`.
///
/// # Safety
/// `attr` must be the `union bpf_attr` layout `cmd` reads, and every pointer in it valid for
/// what the kernel reads or writes there for the duration of the call.
pub(super) unsafe fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> io::Result<()> {
    // SAFETY: the caller's contract.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut A, size_of::<A>()) };
    match rc {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}
