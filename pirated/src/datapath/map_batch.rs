//! Reading a whole hash map with BPF_MAP_LOOKUP_BATCH: a few syscalls per thousand entries
//! instead of two per entry (get-next-key + lookup), which is what makes a 64 K-flow drain fit
//! comfortably in an epoch. aya 0.13 has no batch API.

use std::{
    io,
    mem::MaybeUninit,
    os::fd::{AsFd, AsRawFd},
};

use aya::maps::MapData;

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// Entries per call; a hash bucket never holds nearly this many, so ENOSPC does not occur.
const CHUNK: usize = 4096;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Calls `each` for every entry of the hash map `map`, whose keys and values must be `K` and `V`
/// (checked). Entries inserted or deleted while it runs may be seen or not; none twice.
pub fn for_each<K: aya::Pod, V: aya::Pod>(map: &MapData, mut each: impl FnMut(&K, &V)) -> io::Result<()> {
    let info = map.info().map_err(io::Error::other)?;
    if info.key_size() as usize != size_of::<K>() || info.value_size() as usize != size_of::<V>() {
        return Err(io::Error::other(format!(
            "map entries are {}+{} bytes, not the {}+{} expected",
            info.key_size(),
            info.value_size(),
            size_of::<K>(),
            size_of::<V>()
        )));
    }
    let fd = map.fd().as_fd();
    let mut keys: Vec<MaybeUninit<K>> = Vec::with_capacity(CHUNK);
    let mut values: Vec<MaybeUninit<V>> = Vec::with_capacity(CHUNK);
    // Hash maps use a bucket index as the batch token.
    let (mut token_in, mut token_out) = (0u64, 0u64);
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { &token_in as *const u64 as u64 },
            out_batch: &mut token_out as *mut u64 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..Default::default()
        };
        // SAFETY: the buffers hold CHUNK keys and values of the map's sizes (checked above); the
        // kernel writes `count` of each and the token.
        let rc = unsafe {
            libc::syscall(libc::SYS_bpf, BPF_MAP_LOOKUP_BATCH, &mut attr as *mut BatchAttr, size_of::<BatchAttr>())
        };
        let done = if rc == 0 {
            false
        } else {
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::ENOENT) => {}
                Some(libc::EINVAL) => {
                    return Err(io::Error::other("BPF_MAP_LOOKUP_BATCH is not supported on this map (kernel < 5.6?)"))
                }
                _ => return Err(err),
            }
            true
        };
        for i in 0..attr.count as usize {
            // SAFETY: the kernel filled the first `count` entries.
            unsafe {
                each(
                    keys.as_ptr().add(i).cast::<K>().as_ref().unwrap(),
                    values.as_ptr().add(i).cast::<V>().as_ref().unwrap(),
                )
            };
        }
        if done {
            return Ok(());
        }
        token_in = token_out;
        first = false;
    }
}
