//! Builds the XDP object from `pirate-ebpf` (nightly, bpfel-unknown-none, build-std=core) so that
//! a plain `cargo build` of pirated embeds an up-to-date datapath.

use std::{env, path::PathBuf, process::Command};

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap();
    let ebpf_dir = root.join("pirate-ebpf");
    for dir in ["pirate-ebpf/src", "pirate-common/src"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    for file in ["pirate-ebpf/Cargo.toml", "pirate-ebpf/Cargo.lock", "pirate-common/Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
    }

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").unwrap());
    let target_dir = out_dir.join("ebpf-target");
    let mut cmd = Command::new("rustup");
    cmd.args(["run", "nightly", "cargo", "build", "--release", "--target", "bpfel-unknown-none"])
        .args(["-Z", "build-std=core", "--bin", "pirate"])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(&ebpf_dir);
    // The outer cargo's settings (stable toolchain, clippy wrapper, host flags) must not leak in.
    for var in [
        "RUSTUP_TOOLCHAIN",
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().unwrap_or_else(|e| {
        panic!("cannot run `rustup run nightly cargo` to build the XDP program ({e}); run scripts/setup.sh")
    });
    if !status.success() {
        panic!("building pirate-ebpf failed (needs nightly + rust-src + bpf-linker: run scripts/setup.sh)");
    }
    let obj = target_dir.join("bpfel-unknown-none/release/pirate");
    println!("cargo:rustc-env=PIRATE_EBPF_OBJ={}", obj.display());
}
