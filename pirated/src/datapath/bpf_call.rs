//! The bpf(2) system call, for the commands pirated makes without aya (`test_run`, `percpu`,
//! the forwarder slot's program).

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd},
};

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;

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

/// `union bpf_attr` as BPF_MAP_LOOKUP_ELEM and BPF_MAP_UPDATE_ELEM read it.
#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// Makes element command `cmd` on entry `key` of `map`, with the value at `value`.
///
/// # Safety
/// `value` must point at what `cmd` reads or writes there for one entry of `map`.
unsafe fn elem(cmd: libc::c_long, map: BorrowedFd<'_>, key: u32, value: u64) -> io::Result<()> {
    let mut attr =
        ElemAttr { map_fd: map.as_raw_fd() as u32, _pad: 0, key: &key as *const u32 as u64, value, flags: 0 };
    // SAFETY: attr is a valid bpf_attr prefix for element commands; key outlives the call, and
    // value is valid for it (the caller's contract).
    unsafe { bpf(cmd, &mut attr) }
}

/// Reads entry `key` of `map` into `value` (ENOENT for an empty slot or a missing key).
///
/// # Safety
/// `value` must have room for all the kernel writes for one entry of `map`: its value size,
/// once per possible CPU for a per-CPU map, each rounded up to 8 bytes there.
pub(super) unsafe fn lookup<V>(map: BorrowedFd<'_>, key: u32, value: &mut [V]) -> io::Result<()> {
    // SAFETY: the caller's contract.
    unsafe { elem(BPF_MAP_LOOKUP_ELEM, map, key, value.as_mut_ptr() as u64) }
}

/// Writes `value` into entry `key` of `map` (create or replace).
///
/// # Safety
/// `value` must hold what the kernel reads for one entry of `map`: its value size, once per
/// possible CPU for a per-CPU map, each rounded up to 8 bytes there.
pub(super) unsafe fn update<V>(map: BorrowedFd<'_>, key: u32, value: &[V]) -> io::Result<()> {
    // SAFETY: the caller's contract.
    unsafe { elem(BPF_MAP_UPDATE_ELEM, map, key, value.as_ptr() as u64) }
}
