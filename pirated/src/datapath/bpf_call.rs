//! The bpf(2) system call, for the commands pirated makes without aya (`test_run`, `percpu`,
//! the forwarder slot's program).

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd},
};

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;

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

/// `union bpf_attr` as BPF_MAP_LOOKUP_ELEM reads it.
#[repr(C)]
struct LookupAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// Reads entry `key` of `map` into `value` (ENOENT for an empty slot or a missing key).
///
/// # Safety
/// `value` must have room for all the kernel writes for one entry of `map`: its value size,
/// once per possible CPU for a per-CPU map, each rounded up to 8 bytes there.
pub(super) unsafe fn lookup<V>(map: BorrowedFd<'_>, key: u32, value: &mut [V]) -> io::Result<()> {
    let mut attr = LookupAttr {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: &key as *const u32 as u64,
        value: value.as_mut_ptr() as u64,
        flags: 0,
    };
    // SAFETY: attr is a valid bpf_attr prefix for this command; key and value outlive the call,
    // and value has room for what the kernel writes (the caller's contract).
    unsafe { bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) }
}
