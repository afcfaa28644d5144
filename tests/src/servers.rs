//! Real servers (nginx, redis) started inside a testbed namespace with their own configuration
//! in a temporary directory, stopped on drop.

use std::{
    path::PathBuf,
    process::Child,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::netns::Netns;

/// A server process in a namespace; killed (and its directory removed) on drop.
pub struct Server {
    child: Child,
    dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn scratch(ns: &Netns, what: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("{what}-{}-{}", ns.name(), std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Waits until something listens on `port` inside `ns`.
fn wait_listening(ns: &Netns, port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let out = ns.run(&["ss", "-Hltn", &format!("sport = :{port}")])?;
        if !out.trim().is_empty() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("nothing listens on port {port} in {} after 10 s", ns.name())
}

/// nginx on port 80 (IPv4 and IPv6), one worker, serving `files` (name, size in bytes) from
/// its document root; responses are the files' bytes.
pub fn nginx(ns: &Netns, files: &[(&str, usize)]) -> Result<Server> {
    let dir = scratch(ns, "nginx")?;
    let root = dir.join("www");
    std::fs::create_dir_all(&root)?;
    for (name, size) in files {
        std::fs::write(root.join(name), vec![b'x'; *size])?;
    }
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "worker_processes 1;\nerror_log stderr error;\npid {pid};\nevents {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  keepalive_requests 1000000;\n  keepalive_timeout 300s;\n\
             client_body_temp_path {tmp}; proxy_temp_path {tmp}; fastcgi_temp_path {tmp}; uwsgi_temp_path {tmp}; scgi_temp_path {tmp};\n\
             server {{ listen 80; listen [::]:80; root {root}; }}\n}}\n",
            pid = dir.join("nginx.pid").display(),
            tmp = dir.display(),
            root = root.display()
        ),
    )?;
    let child = ns
        .command(&["nginx", "-c", conf.to_str().unwrap(), "-p", dir.to_str().unwrap(), "-g", "daemon off;"])
        .spawn()
        .context("starting nginx")?;
    let server = Server { child, dir };
    wait_listening(ns, 80)?;
    Ok(server)
}

/// redis-server on port 6379, no persistence.
pub fn redis(ns: &Netns) -> Result<Server> {
    let dir = scratch(ns, "redis")?;
    let child = ns
        .command(&[
            "redis-server",
            "--port",
            "6379",
            "--bind",
            "0.0.0.0 ::",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--dir",
            dir.to_str().unwrap(),
            "--loglevel",
            "warning",
        ])
        // It prints a start-up banner before its configuration applies; a failure to start shows
        // as the port never opening.
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting redis-server")?;
    let server = Server { child, dir };
    wait_listening(ns, 6379)?;
    Ok(server)
}
