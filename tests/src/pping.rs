//! ePPing (xdp-project/bpf-examples `pping/`) as a peer in the datapath benchmark: its XDP
//! ingress program, loaded from an object the operator built with that project's own Makefile
//! (nothing of it is in this repository), configured as its `pping` command configures it by
//! default, so that it runs beside pirated's chain on the same packets.
//!
//! aya 0.13 refuses the names of two of the object's sections: its map-iterator programs
//! (`iter/bpf_map_elem`: ePPing's cleanup, which a benchmark does not run) and its TC programs
//! (`tc`, the name newer libbpf gives `classifier`). A copy of the object renames them to names
//! aya parses (`llvm-objcopy --rename-section`) and the benchmark never loads them; everything
//! else is as built.

use std::{path::Path, process::Command};

use anyhow::{ensure, Context, Result};
use aya::{
    programs::{ProgramFd, Xdp},
    Ebpf, EbpfLoader,
};

use crate::removed::Removed;

/// The program the benchmark runs: ePPing's ingress path for XDP.
const PROGRAM: &str = "pping_xdp_ingress";

/// Sections renamed in the copy aya loads.
const RENAMED: [&str; 2] = ["iter/bpf_map_elem=raw_tp/pping_iterators_not_loaded", "tc=classifier"];

/// `llvm-objcopy` of the LLVM that `scripts/setup.sh` installs.
const OBJCOPY: &str = "/usr/lib/llvm-22/bin/llvm-objcopy";

/// ePPing's `struct bpf_config` (`pping.h`) with the values its `pping` command sets by default:
/// a timestamp per flow at most every 100 ms, TCP tracked, local addresses filtered, SYNs
/// skipped, one event per RTT, Ethernet headers.
fn default_config() -> [u8; 40] {
    let mut c = [0u8; 40];
    // __u64 rate_limit; fixpoint64 rtt_rate; __u64 ipv6_prefix_mask; __u32 ipv4_prefix_mask;
    // then bool use_srtt, track_tcp, track_icmp, localfilt, skip_syn, push_individual_events,
    // agg_rtts, agg_by_dst, eth_header.
    c[..8].copy_from_slice(&100_000_000u64.to_ne_bytes());
    let flags = 28;
    for (i, on) in [false, true, false, true, true, true, false, false, true].into_iter().enumerate() {
        c[flags + i] = on as u8;
    }
    c
}

/// ePPing's XDP program, loaded; its maps live as long as this does.
pub struct Pping {
    _ebpf: Ebpf,
    prog: ProgramFd,
}

impl Pping {
    /// Loads `object` (ePPing's `pping_kern.o`) with its default configuration.
    pub fn load(object: &Path) -> Result<Pping> {
        ensure!(object.is_file(), "no ePPing object at {}", object.display());
        // The renamed copy, removed once loaded.
        let copy = Removed(std::env::temp_dir().join(format!("pirate-pping-{}.o", std::process::id())));
        let out = Command::new(OBJCOPY)
            .args(RENAMED.iter().flat_map(|r| ["--rename-section", r]))
            .arg(object)
            .arg(&copy.0)
            .output()
            .with_context(|| format!("running {OBJCOPY}"))?;
        ensure!(out.status.success(), "{OBJCOPY} on {}: {}", object.display(), String::from_utf8_lossy(&out.stderr));
        let config = default_config();
        let mut ebpf = EbpfLoader::new()
            .set_global("config", &config, true)
            .load_file(&copy.0)
            .with_context(|| format!("loading ePPing's object {}", object.display()))?;
        let xdp: &mut Xdp = ebpf
            .program_mut(PROGRAM)
            .with_context(|| format!("{} has no program {PROGRAM}", object.display()))?
            .try_into()?;
        xdp.load().context("the kernel refused ePPing's XDP program")?;
        let prog = xdp.fd()?.try_clone()?;
        Ok(Pping { _ebpf: ebpf, prog })
    }

    pub fn fd(&self) -> &ProgramFd {
        &self.prog
    }
}
