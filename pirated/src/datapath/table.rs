//! `pirate`'s flow table as pirated sees it: the kernel's mmapable array of sets
//! (`pirate_common::pirate::table`), mapped into the daemon and read in place a set at a time,
//! where a hash table had to be copied out entry by entry.

use std::{
    io,
    os::fd::{AsFd, AsRawFd},
    ptr::NonNull,
};

use aya::maps::MapData;
use pirate_common::pirate::table::Set;

pub struct FlowTable {
    base: NonNull<u8>,
    len: usize,
    sets: usize,
    set_size: usize,
}

// SAFETY: the mapping is only read (and, by benchmarks, written) through volatile copies.
unsafe impl Send for FlowTable {}

impl FlowTable {
    /// Maps the flow table `map` (an mmapable array of sets).
    pub fn map(map: &MapData) -> io::Result<FlowTable> {
        let info = map.info().map_err(io::Error::other)?;
        let (sets, set_size) = (info.max_entries() as usize, info.value_size() as usize);
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let len = (sets * set_size).next_multiple_of(page);
        let fd = map.fd().as_fd().as_raw_fd();
        // SAFETY: a shared mapping of the array's values, which the kernel sizes at least `len`.
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(base as *mut u8).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(FlowTable { base, len, sets, set_size })
    }

    pub fn sets(&self) -> usize {
        self.sets
    }

    fn at<const M: usize>(&self, i: usize) -> *mut Set<M> {
        assert!(i < self.sets && size_of::<Set<M>>() == self.set_size, "set {i} of the wrong table layout");
        // SAFETY: within the mapping (checked above); sets are 8-byte multiples from a page start.
        unsafe { self.base.as_ptr().add(i * self.set_size) as *mut Set<M> }
    }

    /// A copy of set `i`. The datapath may be writing it meanwhile: a flow's copy can be torn
    /// (see `FlowEpoch::is_consistent`).
    pub fn read<const M: usize>(&self, i: usize) -> Set<M> {
        // SAFETY: an aligned set inside the mapping; any bit pattern is a valid Set.
        unsafe { std::ptr::read_volatile(self.at(i)) }
    }

    /// Flows in the table now, counted from the ids alone (a cache line per set).
    pub fn occupied<const M: usize>(&self) -> usize {
        let ways = |i| {
            // SAFETY: as in `read`, for the set's ids only.
            let ids = unsafe { std::ptr::read_volatile(&raw const (*self.at::<M>(i)).ids) };
            ids.iter().filter(|id| id.family != 0).count()
        };
        (0..self.sets).map(ways).sum()
    }

    /// Overwrites set `i`: for benchmarks that fill the table, never for a live one.
    pub fn write<const M: usize>(&self, i: usize, set: &Set<M>) {
        // SAFETY: as in `read`.
        unsafe { std::ptr::write_volatile(self.at(i), *set) }
    }
}

impl Drop for FlowTable {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.len) };
    }
}
