//! Real clients run in the testbed's client namespace, with their own latency figures parsed
//! from their output: the ground truth the estimates are held to.

use std::{
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::{linkem::rng::SplitMix64, netns::Netns};

/// What a load generator measured itself.
#[derive(Clone, Copy, Debug)]
pub struct ClientLatency {
    /// Mean request→response latency, seconds.
    pub mean: f64,
    pub requests: u64,
}

/// `wrk` with `connections` keep-alive connections on one thread for `duration` (whole
/// seconds). The mean is wrk's own latency mean (µs resolution, printed by a `done` hook), but
/// never above its run time over the requests each connection made one after another: its
/// coordinated-omission correction adds samples for latencies above the mean request interval,
/// which inflates the mean whenever latency varies. Under CPU contention, one connection's
/// latencies summed to 3.2 s in a 3 s run (+6 % at 1 ms), which no connection can do.
pub fn wrk(ns: &Netns, url: &str, connections: u32, duration: Duration) -> Result<ClientLatency> {
    let script = std::env::temp_dir().join(format!("pirate-wrk-{}.lua", std::process::id()));
    std::fs::write(
        &script,
        "done = function(summary, latency, requests)\n  \
         io.write(string.format(\"PIRATE %.3f %d %d %d\\n\", latency.mean, summary.duration, summary.requests, summary.errors.status + summary.errors.read + summary.errors.connect))\n\
         end\n",
    )?;
    let out = ns.run(&[
        "wrk",
        "-t1",
        &format!("-c{connections}"),
        &format!("-d{}s", duration.as_secs().max(1)),
        "-s",
        script.to_str().unwrap(),
        url,
    ]);
    let _ = std::fs::remove_file(&script);
    let out = out?;
    let line = out.lines().find_map(|l| l.strip_prefix("PIRATE ")).with_context(|| format!("wrk printed:\n{out}"))?;
    let f: Vec<&str> = line.split_whitespace().collect();
    let (mean_us, run_us, requests, errors): (f64, f64, u64, u64) =
        (f[0].parse()?, f[1].parse()?, f[2].parse()?, f[3].parse()?);
    if errors > 0 || requests == 0 {
        bail!("wrk: {requests} requests, {errors} errors:\n{out}");
    }
    let cycle_us = run_us * connections as f64 / requests as f64;
    Ok(ClientLatency { mean: mean_us.min(cycle_us) / 1e6, requests })
}

/// `redis-benchmark` with `clients` connections, `requests` GETs, pipelining `pipeline`; its own
/// average latency (printed with µs resolution in its CSV output).
pub fn redis_benchmark(ns: &Netns, host: &str, clients: u32, requests: u32, pipeline: u32) -> Result<ClientLatency> {
    let out = ns.run(&[
        "redis-benchmark",
        "-h",
        host,
        "-c",
        &clients.to_string(),
        "-n",
        &requests.to_string(),
        "-P",
        &pipeline.to_string(),
        "-t",
        "get",
        "--csv",
    ])?;
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",…
    let row =
        out.lines().find(|l| l.starts_with("\"GET\"")).with_context(|| format!("redis-benchmark printed:\n{out}"))?;
    let fields: Vec<&str> = row.split(',').map(|f| f.trim_matches('"')).collect();
    let mean_ms: f64 = fields.get(2).context("no avg_latency_ms column")?.parse()?;
    Ok(ClientLatency { mean: mean_ms / 1e3, requests: requests as u64 })
}

/// `h2load` over HTTP/2 on one connection with `streams` requests multiplexed on it, for
/// `duration` (whole seconds): cleartext with prior knowledge (h2c) for an `http://` URL, TLS
/// with ALPN `h2` for an `https://` one; a run that spoke anything else is an error. Its own
/// mean time for request (request sent → response complete), from its per-request log: µs
/// resolution, where its summary rounds to 10 µs above 1 ms.
pub fn h2load(ns: &Netns, url: &str, streams: u32, duration: Duration) -> Result<ClientLatency> {
    h2load_speaking(ns, url, false, streams, duration)
}

/// [`h2load`] over HTTP/1.1 (`--h1`: ALPN offers `http/1.1` alone over TLS), one request in
/// flight.
pub fn h2load_h1(ns: &Netns, url: &str, duration: Duration) -> Result<ClientLatency> {
    h2load_speaking(ns, url, true, 1, duration)
}

fn h2load_speaking(ns: &Netns, url: &str, h1: bool, streams: u32, duration: Duration) -> Result<ClientLatency> {
    let log = std::env::temp_dir().join(format!("pirate-h2load-{}.log", std::process::id()));
    let (streams, secs, log_file) =
        (format!("-m{streams}"), duration.as_secs().max(1).to_string(), format!("--log-file={}", log.display()));
    let mut args = vec!["h2load", "-c1", &streams, "-D", &secs, &log_file, url];
    if h1 {
        args.push("--h1");
    }
    let out = ns.run(&args);
    let log_text = std::fs::read_to_string(&log);
    let _ = std::fs::remove_file(&log);
    let (out, log_text) = (out?, log_text.context("reading h2load's log")?);
    // "requests: 1003 total, 1003 started, 1003 done, 1000 succeeded, 3 failed, 3 errored, 0 timeout"
    let failed = out
        .lines()
        .find_map(|l| l.strip_prefix("requests: "))
        .and_then(|l| l.split(", ").find_map(|f| f.strip_suffix(" failed")))
        .with_context(|| format!("h2load printed:\n{out}"))?;
    // Per request: start (µs since the epoch), status, µs until the response ended.
    let times: Vec<f64> = log_text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f.get(1) == Some(&"200")).then(|| f.get(2)?.parse::<f64>().ok()).flatten()
        })
        .collect();
    let protocol = match (h1, url.starts_with("https://")) {
        (true, _) => "http/1.1",
        (false, true) => "h2",
        (false, false) => "h2c",
    };
    let spoke = out.lines().any(|l| l.strip_prefix("Application protocol: ") == Some(protocol));
    if failed != "0" || times.is_empty() || !spoke {
        bail!("h2load: {} requests succeeded, {failed} failed:\n{out}", times.len());
    }
    let mean_us = times.iter().sum::<f64>() / times.len() as f64;
    Ok(ClientLatency { mean: mean_us / 1e6, requests: times.len() as u64 })
}

/// Short TCP connections to `server` from `ns`, opened at Poisson arrivals `rate` a second for
/// `duration`, each closed once established (by a thread of its own, so that slow handshakes
/// overlap): the time each `connect` took, as its client saw it (SYN out → SYN/ACK in).
pub fn short_connections(ns: &Netns, server: SocketAddr, rate: f64, duration: Duration) -> Result<Vec<Duration>> {
    poisson(ns, rate, duration, move || {
        let began = Instant::now();
        TcpStream::connect_timeout(&server, Duration::from_secs(3)).map(|_| began.elapsed()).context("connecting")
    })?
    .into_iter()
    .collect()
}

/// One HTTP/1.1 request per connection to `server` from `ns`, at Poisson arrivals `rate` a
/// second for `duration`: connect, GET with `Connection: close`, read the whole response. Each
/// request's latency as its client saw it (connect → response read), or why it failed.
pub fn http_per_connection(
    ns: &Netns,
    server: SocketAddr,
    rate: f64,
    duration: Duration,
) -> Result<Vec<Result<Duration>>> {
    poisson(ns, rate, duration, move || {
        let began = Instant::now();
        let mut conn = TcpStream::connect_timeout(&server, Duration::from_secs(3)).context("connecting")?;
        conn.set_nodelay(true)?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        http_exchange(&mut conn, "close")?;
        Ok(began.elapsed())
    })
}

/// Runs `each` from `ns` at Poisson arrivals `rate` a second for `duration`, every call on a
/// thread of its own so that slow ones overlap (an open loop: arrivals never wait for answers);
/// the results in arrival order. The arrivals are the same in every run (a fixed seed).
fn poisson<T, F>(ns: &Netns, rate: f64, duration: Duration, each: F) -> Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn() -> T + Send + Sync + Clone + 'static,
{
    let run = move || -> Result<Vec<T>> {
        let (start, mut at, mut rng) = (Instant::now(), Duration::ZERO, SplitMix64::new(0x5eed));
        let mut handles = Vec::new();
        while at < duration {
            // Exponential gaps; 1 - u is in (0, 1], so the logarithm is finite.
            at += Duration::from_secs_f64(-(1.0 - rng.next_f64()).ln() / rate);
            std::thread::sleep((start + at).saturating_duration_since(Instant::now()));
            handles.push(std::thread::spawn(each.clone()));
        }
        handles.into_iter().map(|h| h.join().map_err(|_| anyhow::anyhow!("a client thread panicked"))).collect()
    };
    ns.spawn_in(run)?.join().map_err(|_| anyhow::anyhow!("the client panicked"))?
}

/// `dnsperf` from `ns` asking `server` for [`crate::servers::DNS_NAME`] `rate` times a second
/// for `duration` (whole seconds) on one socket, open loop: the queries it completed and their
/// mean latency, its own. A lost query is an error: on the testbed nothing drops them.
pub fn dnsperf(ns: &Netns, server: &str, rate: u32, duration: Duration) -> Result<ClientLatency> {
    let queries = std::env::temp_dir().join(format!("pirate-dnsperf-{}-{}", ns.name(), std::process::id()));
    std::fs::write(&queries, format!("{} A\n", crate::servers::DNS_NAME))?;
    let (secs, rate) = (duration.as_secs().to_string(), rate.to_string());
    let out = ns.run(&["dnsperf", "-s", server, "-d", queries.to_str().unwrap(), "-l", &secs, "-Q", &rate, "-c", "1"]);
    let _ = std::fs::remove_file(&queries);
    let out = out?;
    // "  Queries completed:    6000 (100.00%)", "  Average Latency (s):  0.000093 (min …, max …)"
    let field = |what: &str| -> Option<&str> {
        let line = out.lines().find(|l| l.trim_start().starts_with(what))?;
        line.split_once(':')?.1.split_whitespace().next()
    };
    let count = |what: &str| field(what)?.parse::<u64>().ok();
    match (count("Queries completed"), count("Queries lost"), field("Average Latency (s)").and_then(|v| v.parse().ok()))
    {
        (Some(requests), Some(0), Some(mean)) => Ok(ClientLatency { mean, requests }),
        _ => bail!("dnsperf lost queries or printed no summary:\n{out}"),
    }
}

/// One HTTP/1.1 keep-alive connection from `ns` to `server`, established before this returns,
/// then sending GET requests one after another for `duration` on a thread of its own, which
/// yields each request's latency (request written → whole response read). Any failure (refused,
/// reset, a short or malformed response) is an error: a connection the load balancer moved to
/// another real breaks so.
pub fn http_keepalive(
    ns: &Netns,
    server: SocketAddr,
    duration: Duration,
) -> Result<std::thread::JoinHandle<Result<Vec<Duration>>>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let run = move || -> Result<Vec<Duration>> {
        let connected = TcpStream::connect_timeout(&server, Duration::from_secs(3)).context("connecting");
        let _ = tx.send(connected.is_ok());
        let mut conn = connected?;
        conn.set_nodelay(true)?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        let (start, mut latencies) = (Instant::now(), Vec::new());
        while start.elapsed() < duration {
            let began = Instant::now();
            http_exchange(&mut conn, "keep-alive").with_context(|| format!("request {}", latencies.len() + 1))?;
            latencies.push(began.elapsed());
        }
        Ok(latencies)
    };
    let handle = ns.spawn_in(run)?;
    if rx.recv() == Ok(true) {
        return Ok(handle);
    }
    match handle.join() {
        Ok(Err(e)) => Err(e),
        _ => bail!("the client thread ended without connecting"),
    }
}

/// Writes a GET and reads the whole response (its head, then Content-Length bytes of body).
fn http_exchange(conn: &mut TcpStream, connection: &str) -> Result<()> {
    use std::io::{Read, Write};
    conn.write_all(format!("GET / HTTP/1.1\r\nHost: test\r\nConnection: {connection}\r\n\r\n").as_bytes())?;
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 4096];
    let (head_end, body) = loop {
        let n = conn.read(&mut chunk)?;
        if n == 0 {
            bail!("the connection closed before a whole response");
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            if !head.starts_with("http/1.1 200") {
                bail!("response {:?}", head.lines().next().unwrap_or(""));
            }
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .context("a response without Content-Length")?;
            break (end + 4, len);
        }
    };
    while buf.len() < head_end + body {
        let n = conn.read(&mut chunk)?;
        if n == 0 {
            bail!("the connection closed inside a response body");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(())
}
