//! Vectors an epoch fills with a value per flow: a million flows' worth is hundreds of MiB,
//! kept from one epoch to the next and faulted in before the first needs it.

/// An empty vector with room for `n` items, its memory faulted in now: after a restart that
/// took over a full flow table, the first epoch would otherwise fault it in within its time
/// budget. (A kernel before 5.14 refuses the advice; the first epoch faults it in then.)
pub fn populated<T>(n: usize) -> Vec<T> {
    let v = Vec::with_capacity(n);
    let (start, end) = (v.as_ptr() as usize, v.as_ptr() as usize + n * size_of::<T>());
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
    if end > start {
        let start = start / page * page;
        // SAFETY: the pages hold `v`'s allocation (the first one also the allocator's header of
        // it): populating them changes nothing they hold.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_POPULATE_WRITE) };
    }
    v
}
