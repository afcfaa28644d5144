//! Reading a per-CPU array with the CPU count learned once, at load. aya 0.13 reads the
//! possible CPUs from sysfs again on each thread that first looks such a value up, and the epoch
//! loop moves between tokio's worker threads: a process out of descriptors could not read its
//! counters.

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd},
};

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;

/// `union bpf_attr` as BPF_MAP_LOOKUP_ELEM reads it.
#[repr(C)]
struct LookupAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// The sum over `cpus` CPUs of entry `key` of the per-CPU u64 array `map`.
pub fn sum(map: BorrowedFd<'_>, key: u32, cpus: usize) -> io::Result<u64> {
    Ok(values::<u64>(map, key, cpus)?.iter().sum())
}

/// Entry `key` of the per-CPU array `map` on each of `cpus` CPUs: `T` is the array's value, plain
/// data of a multiple of 8 bytes.
pub fn values<T: aya::Pod + Default>(map: BorrowedFd<'_>, key: u32, cpus: usize) -> io::Result<Vec<T>> {
    // The kernel writes one 8-byte-aligned value per possible CPU.
    const { assert!(size_of::<T>().is_multiple_of(8) && align_of::<T>() == 8) };
    let mut values = vec![T::default(); cpus];
    let mut attr = LookupAttr {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: &key as *const u32 as u64,
        value: values.as_mut_ptr() as u64,
        flags: 0,
    };
    // SAFETY: attr is a valid bpf_attr prefix for this command; key and values outlive the
    // call, and values holds a T for every possible CPU, which is what the kernel writes.
    unsafe { super::bpf_call::bpf(BPF_MAP_LOOKUP_ELEM, &mut attr)? };
    Ok(values)
}
