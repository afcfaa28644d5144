//! An mmapable BPF array mapped into the daemon: read (and written) in place, where a syscall
//! per entry would copy it out one by one.

use std::{
    io,
    os::fd::{AsFd, AsRawFd},
    ptr::NonNull,
};

use aya::maps::MapData;

pub struct Mapped {
    base: NonNull<u8>,
    len: usize,
    entries: usize,
    value_size: usize,
    /// Bytes from one entry to the next: the kernel rounds values up to 8 bytes.
    stride: usize,
}

// SAFETY: the mapping is only read and written through volatile copies.
unsafe impl Send for Mapped {}

impl Mapped {
    /// Maps `map` (an array created with BPF_F_MMAPABLE).
    pub fn of(map: &MapData) -> io::Result<Mapped> {
        let info = map.info().map_err(io::Error::other)?;
        let (entries, value_size) = (info.max_entries() as usize, info.value_size() as usize);
        let stride = value_size.next_multiple_of(8);
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let len = (entries * stride).next_multiple_of(page);
        let fd = map.fd().as_fd().as_raw_fd();
        // SAFETY: a shared mapping of the array's values, which the kernel sizes at least `len`.
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(base as *mut u8).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapped { base, len, entries, value_size, stride })
    }

    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Entry `i`, as a `T` the size of the array's values.
    pub fn at<T>(&self, i: usize) -> *mut T {
        assert!(i < self.entries && size_of::<T>() == self.value_size, "entry {i} of the wrong array layout");
        // SAFETY: within the mapping (checked above); entries are `stride` apart from a page
        // start, so 8-byte aligned.
        unsafe { self.base.as_ptr().add(i * self.stride) as *mut T }
    }

    /// Overwrites entry `i`.
    pub fn write<T: Copy>(&self, i: usize, v: T) {
        // SAFETY: an aligned entry inside the mapping.
        unsafe { std::ptr::write_volatile(self.at(i), v) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `of`, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.len) };
    }
}
