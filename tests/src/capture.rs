//! Packet captures with tcpdump inside a namespace: the pcap a test reads its ground truth from,
//! or feeds to `pirated replay`.

use std::{
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, ChildStderr, Stdio},
};

use anyhow::{bail, Context, Result};

use crate::netns::Netns;

/// A running tcpdump writing nanosecond timestamps and each frame's first 256 bytes; the file is
/// removed on drop.
pub struct Capture {
    child: Child,
    stderr: BufReader<ChildStderr>,
    path: PathBuf,
}

impl Capture {
    /// Starts capturing on `iface` in `ns`, with tcpdump's `extra` arguments (a direction such as
    /// `-Q in`, a filter expression), and returns once tcpdump listens. Packets reach the file as
    /// they come (immediate mode: libpcap would otherwise hold them until a 1 s timeout).
    pub fn start(ns: &Netns, iface: &str, extra: &[&str]) -> Result<Capture> {
        static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("pirate-capture-{}-{n}.pcap", std::process::id()));
        let mut args = vec!["tcpdump", "-i", iface, "--immediate-mode", "-U", "-s", "256"];
        args.extend(["--time-stamp-precision=nano", "-w", path.to_str().unwrap()]);
        args.extend(extra);
        let mut child = ns.command(&args).stderr(Stdio::piped()).spawn().context("starting tcpdump")?;
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        stderr.read_line(&mut line)?;
        let capture = Capture { child, stderr, path };
        if !line.contains("listening") {
            bail!("tcpdump: {line}");
        }
        Ok(capture)
    }

    /// The capture file (complete once [`Capture::stop`] returned).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops tcpdump (SIGINT: it flushes and closes the file) and checks that it ended well.
    pub fn stop(&mut self) -> Result<()> {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait()?;
        let mut summary = String::new();
        self.stderr.read_to_string(&mut summary)?;
        if !status.success() {
            bail!("tcpdump {status}: {summary}");
        }
        Ok(())
    }

    /// Stops tcpdump and reads the frames it captured, with their timestamps (ns).
    pub fn frames(&mut self) -> Result<Vec<(u64, Vec<u8>)>> {
        self.stop()?;
        pirated::source::replay::read_pcap(&self.path)
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.path);
    }
}
