//! Real servers (nginx, redis, unbound; gRPC's in [`crate::grpc`]) started inside a testbed
//! namespace with their own configuration in a temporary directory, stopped on drop.

use std::{
    path::{Path, PathBuf},
    process::Child,
    time::Duration,
};

use anyhow::{bail, Context, Result};

use crate::{netns::Netns, testbed::wait_until};

/// A server process in a namespace; killed (and its directory removed) on drop.
pub struct Server {
    pub(crate) child: Child,
    pub(crate) dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Python server: the script `source`, written to a scratch directory named `what`, run by
/// `python` in `ns` with its path and `args(directory)` as arguments; ready once `ready` returns.
pub(crate) fn python_server(
    ns: &Netns,
    what: &str,
    python: &[&str],
    source: &str,
    args: impl FnOnce(&Path) -> Vec<String>,
    ready: impl FnOnce() -> Result<()>,
) -> Result<Server> {
    let dir = scratch(ns, what)?;
    let script = dir.join("server.py");
    std::fs::write(&script, source)?;
    let mut argv: Vec<String> = python.iter().map(|s| s.to_string()).collect();
    argv.push(script.to_string_lossy().into_owned());
    argv.extend(args(&dir));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let child = ns.spawn(&argv).with_context(|| format!("starting the {what} server"))?;
    let server = Server { child, dir };
    ready()?;
    Ok(server)
}

/// What a Python client printed as `PIRATE <mean seconds> <requests>`.
pub(crate) fn python_client_latency(what: &str, out: &str) -> Result<crate::clients::ClientLatency> {
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("PIRATE "))
        .with_context(|| format!("{what} client printed:\n{out}"))?;
    let Some((mean, requests)) = line.split_once(' ') else { bail!("{what} client printed {line:?}") };
    Ok(crate::clients::ClientLatency { mean: mean.parse()?, requests: requests.parse()? })
}

/// A fresh directory of the server's own, named after it and its namespace.
pub(crate) fn scratch(ns: &Netns, what: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("{what}-{}-{}", ns.name(), std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Waits until something listens on TCP `port` inside `ns`.
pub(crate) fn wait_listening(ns: &Netns, port: u16) -> Result<()> {
    wait_bound(ns, "-Hltn", port)
}

/// Waits until a UDP socket is bound to `port` inside `ns`.
pub(crate) fn wait_bound_udp(ns: &Netns, port: u16) -> Result<()> {
    wait_bound(ns, "-Hlun", port)
}

/// Waits until `ss <flags>` (listening TCP or bound UDP sockets) lists `port` inside `ns`.
fn wait_bound(ns: &Netns, flags: &str, port: u16) -> Result<()> {
    wait_until(Duration::from_secs(10), &format!("nothing listens on port {port} in {}", ns.name()), || {
        Ok(!ns.run(&["ss", flags, &format!("sport = :{port}")])?.trim().is_empty())
    })
}

/// A web page's files for nginx (name, bytes): `small` for one request at a time; `page` and its
/// objects `a`–`d` for the web-like dependency tree of [`crate::webclient`].
pub const WEB_FILES: &[(&str, usize)] =
    &[("small", 100), ("page", 3_000), ("a", 1_200), ("b", 9_000), ("c", 30_000), ("d", 60_000)];

/// nginx on port 80 (IPv4 and IPv6), one worker, serving `files` (name, size in bytes) from
/// its document root over HTTP/1.1; responses are the files' bytes.
pub fn nginx(ns: &Netns, files: &[(&str, usize)]) -> Result<Server> {
    start_nginx(ns, files, Site::default())
}

/// [`nginx`] speaking HTTP/2 over cleartext only (h2c with prior knowledge, as `h2load` does
/// for `http://` URLs): nginx 1.22 cannot offer HTTP/1.1 and h2c on one cleartext port.
pub fn nginx_h2(ns: &Netns, files: &[(&str, usize)]) -> Result<Server> {
    start_nginx(ns, files, Site { speaks: Speaks::H2c, ..Site::default() })
}

/// nginx speaking HTTP/2, over cleartext on port 80 like [`nginx_h2`] or over TLS on port 443
/// (a self-signed certificate; ALPN offers `h2`), that passes every request to the HTTP/1.1
/// server on port `upstream` of the namespace's loopback: a multiplexing front whose responses
/// take the upstream's service time. Upstream connections are kept alive and opened as requests
/// arrive, one per request in flight, so concurrent streams are served concurrently by a
/// server that serves one request per connection at a time ([`think_time_http`]).
pub fn nginx_h2_proxy(ns: &Netns, tls: bool, upstream: u16) -> Result<Server> {
    let speaks = if tls { Speaks::H2Tls } else { Speaks::H2c };
    start_nginx(ns, &[], Site { speaks, upstream: Some(upstream), capacity: None })
}

/// [`nginx`] with a capacity that can change while it runs: at most so many requests a second
/// are served, and those beyond wait in line (nginx's `limit_req`, delaying instead of
/// refusing), so its latency grows with the load it is offered, as a saturated server's does;
/// without a capacity it is plain [`nginx`].
pub struct Capped {
    server: Server,
}

impl Capped {
    pub fn start(ns: &Netns, files: &[(&str, usize)]) -> Result<Capped> {
        Ok(Capped { server: start_nginx(ns, files, Site::default())? })
    }

    /// Serves at most `per_second` requests a second from now on (`None`: no limit). nginx
    /// reloads its configuration: requests waiting finish in the old worker, new ones queue in
    /// the new one, both in the one shared count.
    pub fn set_capacity(&self, per_second: Option<u32>) -> Result<()> {
        write_nginx_conf(&self.server.dir, Site { capacity: per_second, ..Site::default() })?;
        // SAFETY: signalling our own child, nginx's master process, which reloads on SIGHUP.
        if unsafe { libc::kill(self.server.child.id() as i32, libc::SIGHUP) } != 0 {
            bail!("signalling nginx: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// How nginx speaks to its clients.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum Speaks {
    /// HTTP/1.1 on port 80.
    #[default]
    Http1,
    /// HTTP/2 over cleartext (prior knowledge) on port 80.
    H2c,
    /// HTTP/2 over TLS on port 443.
    H2Tls,
}

/// One nginx configuration: the protocol, what it serves, how fast.
#[derive(Clone, Copy, Default)]
struct Site {
    speaks: Speaks,
    /// Pass every request to the HTTP/1.1 server on this loopback port instead of serving `www`.
    upstream: Option<u16>,
    /// At most so many requests a second ([`Capped`]).
    capacity: Option<u32>,
}

fn start_nginx(ns: &Netns, files: &[(&str, usize)], site: Site) -> Result<Server> {
    let dir = scratch(ns, "nginx")?;
    let root = dir.join("www");
    std::fs::create_dir_all(&root)?;
    for (name, size) in files {
        std::fs::write(root.join(name), vec![b'x'; *size])?;
    }
    if site.speaks == Speaks::H2Tls {
        self_signed_certificate(ns, &dir)?;
    }
    let conf = write_nginx_conf(&dir, site)?;
    let child = ns
        .command(&["nginx", "-c", conf.to_str().unwrap(), "-p", dir.to_str().unwrap(), "-g", "daemon off;"])
        .spawn()
        .context("starting nginx")?;
    let server = Server { child, dir };
    wait_listening(ns, if site.speaks == Speaks::H2Tls { 443 } else { 80 })?;
    Ok(server)
}

/// `dir/key.pem` and `dir/cert.pem`: a fresh P-256 key and a certificate for it, signed by
/// itself (clients of the testbed do not verify it).
fn self_signed_certificate(ns: &Netns, dir: &Path) -> Result<()> {
    let (key, cert) = (dir.join("key.pem"), dir.join("cert.pem"));
    #[rustfmt::skip]
    ns.run(&["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-days", "2", "-subj", "/CN=pirate-test", "-keyout", key.to_str().unwrap(), "-out", cert.to_str().unwrap()])
    .context("generating a certificate with openssl")?;
    Ok(())
}

/// Writes `dir/nginx.conf` for `site`, serving `dir/www` unless it has an upstream.
fn write_nginx_conf(dir: &Path, site: Site) -> Result<PathBuf> {
    let conf = dir.join("nginx.conf");
    // The zone (its count of requests) is declared either way, so that it outlives reloads.
    let (rate, limit) = match site.capacity {
        Some(r) => (r.max(1), "limit_req zone=capacity burst=1000000;"),
        None => (1, ""),
    };
    let listen = match site.speaks {
        Speaks::Http1 => "listen 80; listen [::]:80;".to_string(),
        Speaks::H2c => "listen 80 http2; listen [::]:80 http2;".to_string(),
        Speaks::H2Tls => format!(
            "listen 443 ssl http2; listen [::]:443 ssl http2; ssl_certificate {}; ssl_certificate_key {};",
            dir.join("cert.pem").display(),
            dir.join("key.pem").display()
        ),
    };
    // Upstream connections idle between requests stay open (HTTP/1.1, no `Connection: close`),
    // as many as were ever in flight.
    let (upstream, content) = match site.upstream {
        Some(port) => (
            format!("upstream backend {{ server 127.0.0.1:{port}; keepalive 256; keepalive_requests 1000000; }}\n"),
            "location / { proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\"; }"
                .to_string(),
        ),
        None => (String::new(), format!("root {};", dir.join("www").display())),
    };
    std::fs::write(
        &conf,
        format!(
            "worker_processes 1;\nerror_log stderr error;\npid {pid};\nevents {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  keepalive_requests 1000000;\n  keepalive_timeout 300s;\n\
             client_body_temp_path {tmp}; proxy_temp_path {tmp}; fastcgi_temp_path {tmp}; uwsgi_temp_path {tmp}; scgi_temp_path {tmp};\n\
             limit_req_zone $server_port zone=capacity:1m rate={rate}r/s;\n{upstream}\
             server {{ {listen} {content} {limit} }}\n}}\n",
            pid = dir.join("nginx.pid").display(),
            tmp = dir.display(),
        ),
    )
    .with_context(|| format!("writing {}", conf.display()))?;
    Ok(conf)
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

/// The name [`unbound`] answers (an A record of [`DNS_ADDRESS`]).
pub const DNS_NAME: &str = "www.test.";
pub const DNS_ADDRESS: &str = "10.201.9.9";

/// unbound on port 53 (IPv4 and IPv6), one thread, answering [`DNS_NAME`] from its own zone
/// `test.` to anyone, and nothing else (no recursion: the testbed has no internet).
pub fn unbound(ns: &Netns) -> Result<Server> {
    let dir = scratch(ns, "unbound")?;
    let conf = dir.join("unbound.conf");
    std::fs::write(
        &conf,
        format!(
            r#"server:
  interface: 0.0.0.0
  interface: ::
  port: 53
  do-daemonize: no
  username: ""
  chroot: ""
  directory: "{dir}"
  pidfile: ""
  use-syslog: no
  logfile: ""
  verbosity: 0
  num-threads: 1
  access-control: 0.0.0.0/0 allow
  access-control: ::/0 allow
  module-config: "iterator"
  local-zone: "test." static
  local-data: "{DNS_NAME} 3600 IN A {DNS_ADDRESS}"
remote-control:
  control-enable: no
"#,
            dir = dir.display()
        ),
    )?;
    let child = ns
        .command(&["unbound", "-d", "-c", conf.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting unbound")?;
    let server = Server { child, dir };
    wait_bound_udp(ns, 53)?;
    Ok(server)
}

/// An HTTP/1.1 keep-alive server whose service time is drawn per request from `service`
/// (time, weight) pairs, for workloads whose response latency varies from request to request
/// (cache hits and misses). Responses carry a small fixed body. Runs until the namespace goes.
pub fn think_time_http(ns: &Netns, port: u16, service: &[(Duration, f64)], seed: u64) -> Result<()> {
    let listener = ns.run_in(|| std::net::TcpListener::bind(("0.0.0.0", port)))??;
    let total: f64 = service.iter().map(|s| s.1).sum();
    let cdf: Vec<(Duration, f64)> = service
        .iter()
        .scan(0.0, |acc, (d, w)| {
            *acc += w / total;
            Some((*d, *acc))
        })
        .collect();
    std::thread::spawn(move || {
        for (n, conn) in listener.incoming().enumerate() {
            let Ok(conn) = conn else { continue };
            let cdf = cdf.clone();
            std::thread::spawn(move || serve_with_think_time(conn, &cdf, seed.wrapping_add(n as u64)));
        }
    });
    Ok(())
}

fn serve_with_think_time(conn: std::net::TcpStream, cdf: &[(Duration, f64)], seed: u64) {
    use std::io::{BufRead, BufReader, Write};
    let _ = conn.set_nodelay(true);
    let Ok(mut writer) = conn.try_clone() else { return };
    let mut reader = BufReader::new(conn);
    let mut state = seed | 1;
    let body = "x".repeat(100);
    let response =
        format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: text/plain\r\n\r\n{body}", body.len());
    let mut line = String::new();
    loop {
        // Request head: up to the empty line (GET requests carry no body).
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" => break,
                Ok(_) => {}
            }
        }
        // xorshift64*: uniform in [0, 1).
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let u = (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64;
        let think = cdf.iter().find(|(_, c)| u < *c).map_or(cdf[cdf.len() - 1].0, |(d, _)| *d);
        std::thread::sleep(think);
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}
