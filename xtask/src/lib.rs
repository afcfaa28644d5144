//! What the project tasks share with the tests: running commands from the workspace root,
//! installing pirated as a systemd service (`install`, which tests/tests/service.rs stages), and
//! the import rule's check (`layers`).

pub mod install;
pub mod layers;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Runs `cmd` in the workspace root, echoing it; a failure is an error.
pub fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: {cmd:?}");
    let status = cmd.current_dir(root()).status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}
