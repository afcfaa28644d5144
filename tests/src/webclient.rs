//! A web-like HTTP/1.1 client for accuracy tests: keep-alive, a dependency tree of requests
//! (a page, then up to four of its objects pipelined on the connection, each written separately,
//! then the next page), multi-packet responses. It measures its own ground truth: per batch,
//! the time from writing the first request to reading the last byte of the last response —
//! the latency of the response that triggers the next batch.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

/// One connection's own measurements.
#[derive(Clone, Debug)]
pub struct WebRun {
    /// Local address: identifies the flow in pirated's output.
    pub local: SocketAddr,
    /// Per batch: (start, latency).
    pub batches: Vec<(Instant, Duration)>,
    pub requests: u64,
}

impl WebRun {
    /// Mean latency of the batches shorter than `below`, seconds, and how many there were.
    pub fn mean_batch_latency(&self, below: Duration) -> (f64, usize) {
        let kept: Vec<f64> = self.batches.iter().filter(|b| b.1 < below).map(|b| b.1.as_secs_f64()).collect();
        (kept.iter().sum::<f64>() / kept.len().max(1) as f64, kept.len())
    }

    /// The `q` quantile of the batch latencies (nearest rank), seconds.
    pub fn latency_quantile(&self, q: f64) -> f64 {
        let mut v: Vec<f64> = self.batches.iter().map(|b| b.1.as_secs_f64()).collect();
        v.sort_by(f64::total_cmp);
        v.get(((v.len() as f64 * q).ceil() as usize).saturating_sub(1)).copied().unwrap_or(f64::NAN)
    }
}

/// Deterministic per-connection choices (object counts and sizes) without a rand dependency.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Runs the client on an already connected `stream` for `duration`. `objects` are the paths it
/// may fetch as a page's objects (none: it fetches only `page`, one request at a time).
pub fn run(
    stream: TcpStream,
    host: &str,
    page: &str,
    objects: &[&str],
    duration: Duration,
    seed: u64,
) -> Result<WebRun> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let local = stream.local_addr()?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::with_capacity(1 << 16, stream);
    let mut rng = SplitMix(seed);
    let mut batches = Vec::new();
    let mut requests = 0;
    let deadline = Instant::now() + duration;
    let mut want_page = true;
    while Instant::now() < deadline {
        let paths: Vec<&str> = if want_page {
            vec![page]
        } else {
            let n = 1 + (rng.next() % 4) as usize;
            (0..n).map(|_| objects[(rng.next() % objects.len() as u64) as usize]).collect()
        };
        // Without objects, every batch is one page request: one request in flight.
        want_page = objects.is_empty() || !want_page;
        let start = Instant::now();
        for p in &paths {
            // One write per request: the requests leave as separate packets, microseconds apart.
            writer.write_all(format!("GET /{p} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())?;
        }
        for _ in &paths {
            read_response(&mut reader)?;
        }
        batches.push((start, start.elapsed()));
        requests += paths.len() as u64;
    }
    Ok(WebRun { local, batches, requests })
}

fn read_response(r: &mut BufReader<TcpStream>) -> Result<()> {
    let mut line = String::new();
    let mut length = None;
    r.read_line(&mut line)?;
    if !line.starts_with("HTTP/1.1 200") {
        bail!("unexpected status line {line:?}");
    }
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            bail!("connection closed in headers");
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = Some(v.trim().parse::<u64>()?);
            }
        }
    }
    let length = length.context("response without Content-Length")?;
    std::io::copy(&mut r.by_ref().take(length), &mut std::io::sink())?;
    Ok(())
}
