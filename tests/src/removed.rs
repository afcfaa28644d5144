//! A path removed when its guard is dropped: the scratch files and bpffs pins that tests and
//! benchmarks make, gone whether they finish or fail.

use std::path::PathBuf;

pub struct Removed(pub PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        // Already gone (never written, or removed by its user) is fine.
        let _ = std::fs::remove_file(&self.0);
    }
}
