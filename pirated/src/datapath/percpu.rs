//! Reading a per-CPU array with the CPU count learned once, at load. aya 0.13 reads the
//! possible CPUs from sysfs again on each thread that first looks such a value up, and the epoch
//! loop moves between tokio's worker threads: a process out of descriptors could not read its
//! counters. `CounterReader` reads the datapath's counters from a capability's own task.

use std::{
    io,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
};

use anyhow::Context;
use pirate_common::counters::COUNT;

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
    // SAFETY: values holds a T, a multiple of 8 bytes, for every possible CPU: what the kernel
    // writes for an array of T per CPU.
    unsafe { super::bpf_call::lookup(map, key, &mut values)? };
    Ok(values)
}

/// The datapath's counters (`COUNTERS`), summed over CPUs, indexed like `pirate_common::counters`.
pub fn counters(map: BorrowedFd<'_>, cpus: usize) -> anyhow::Result<[u64; COUNT as usize]> {
    let mut out = [0u64; COUNT as usize];
    for (i, slot) in out.iter_mut().enumerate() {
        *slot = sum(map, i as u32, cpus).context("reading COUNTERS")?;
    }
    Ok(out)
}

/// The datapath's counters, read from a task of their own.
pub struct CounterReader {
    pub(super) fd: OwnedFd,
    pub(super) cpus: usize,
}

impl CounterReader {
    /// The counters, summed over CPUs.
    pub fn read(&self) -> anyhow::Result<[u64; COUNT as usize]> {
        counters(self.fd.as_fd(), self.cpus)
    }
}
