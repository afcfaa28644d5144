//! Running a loaded XDP program on a frame in the kernel (BPF_PROG_TEST_RUN), without an
//! interface: the datapath benchmark times the chain this way, and tests check what it does to
//! any frame. aya 0.13 has no API for it.

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd},
};

const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// `union bpf_attr` as BPF_PROG_TEST_RUN reads it.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// What one BPF_PROG_TEST_RUN call reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TestRun {
    /// The program's return value (an `xdp_action`).
    pub verdict: u32,
    /// Mean nanoseconds per run.
    pub ns: u32,
    /// Bytes of the frame as the program left it, written to the start of `out`.
    pub out_len: usize,
}

/// Runs `prog` on `frame` `repeat` times; the frame as the last run left it goes into `out` (an
/// empty `out` skips the copy). The kernel refuses frames shorter than an Ethernet header.
pub fn test_run(prog: BorrowedFd<'_>, frame: &[u8], repeat: u32, out: &mut [u8]) -> io::Result<TestRun> {
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: frame.len() as u32,
        data_in: frame.as_ptr() as u64,
        data_size_out: out.len() as u32,
        data_out: if out.is_empty() { 0 } else { out.as_mut_ptr() as u64 },
        repeat,
        ..Default::default()
    };
    // SAFETY: attr is a valid bpf_attr prefix for this command; data_in and data_out outlive the
    // call, and the kernel writes at most data_size_out bytes to data_out.
    unsafe { super::bpf_call::bpf(BPF_PROG_TEST_RUN, &mut attr)? };
    Ok(TestRun { verdict: attr.retval, ns: attr.duration, out_len: attr.data_size_out as usize })
}
