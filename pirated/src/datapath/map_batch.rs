//! Reading (BPF_MAP_LOOKUP_BATCH) and writing (BPF_MAP_UPDATE_BATCH) a whole hash map: a few
//! syscalls per thousand entries instead of one or two per entry, which is what makes a drain of
//! a large flow table fit in an epoch. aya 0.13 has no batch API.

use std::{
    io,
    mem::MaybeUninit,
    os::fd::{AsFd, AsRawFd},
};

use aya::maps::MapData;

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
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

/// Checks that `map`'s keys and values are `K` and `V`.
fn check<K, V>(map: &MapData) -> io::Result<()> {
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
    Ok(())
}

fn bpf(cmd: libc::c_long, attr: &mut BatchAttr) -> io::Result<()> {
    // SAFETY: attr is a valid `batch` bpf_attr whose buffers the caller sized for `count` entries
    // of the map's key and value sizes (checked by `check`).
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut BatchAttr, size_of::<BatchAttr>()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Writes every (key, value) into the hash map `map`, whose keys and values must be `K` and `V`
/// (checked), creating or replacing entries.
pub fn update<K: aya::Pod, V: aya::Pod>(map: &MapData, keys: &[K], values: &[V]) -> io::Result<()> {
    check::<K, V>(map)?;
    let fd = map.fd().as_fd();
    for (keys, values) in keys.chunks(CHUNK).zip(values.chunks(CHUNK)) {
        let mut attr = BatchAttr {
            keys: keys.as_ptr() as u64,
            values: values.as_ptr() as u64,
            count: keys.len().min(values.len()) as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..Default::default()
        };
        bpf(BPF_MAP_UPDATE_BATCH, &mut attr)?;
    }
    Ok(())
}

/// Calls `each` for every entry of the hash map `map`, whose keys and values must be `K` and `V`
/// (checked). Entries inserted or deleted while it runs may be seen or not; none twice.
pub fn for_each<K: aya::Pod, V: aya::Pod>(map: &MapData, mut each: impl FnMut(&K, &V)) -> io::Result<()> {
    check::<K, V>(map)?;
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
        // The buffers hold CHUNK keys and values; the kernel writes `count` of each and the token.
        let done = match bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) {
            Ok(()) => false,
            Err(err) => match err.raw_os_error() {
                Some(libc::ENOENT) => true,
                Some(libc::EINVAL) => {
                    return Err(io::Error::other("BPF_MAP_LOOKUP_BATCH is not supported on this map (kernel < 5.6?)"))
                }
                _ => return Err(err),
            },
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
