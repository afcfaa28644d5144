//! One-way delay probes over UDP: ground truth that does not depend on the emulator.
//!
//! The sender stamps each datagram with CLOCK_REALTIME just before `send`; the receiver takes the
//! kernel's receive timestamp (SO_TIMESTAMPNS, the same clock), so neither side's scheduling
//! latency enters the measurement. Both ends are in this process on one host clock, so the
//! difference is the one-way delay of the path, including the two kernels' send and receive paths
//! (a few µs on veth).

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use super::sys;
use crate::netns::Netns;

/// Header of every probe: sequence number and send timestamp, both little-endian.
const HEADER: usize = 16;

/// A probe run: how many datagrams, how far apart, how big.
#[derive(Debug, Clone)]
pub struct Probes {
    pub count: u64,
    /// Pause after each send; the real gap is longer by the sender's wakeup latency.
    pub gap: Duration,
    /// UDP payload bytes (at least 16).
    pub payload: usize,
    /// How long to wait for stragglers after the last send; must exceed the path's delay.
    pub settle: Duration,
}

impl Default for Probes {
    fn default() -> Probes {
        Probes { count: 200, gap: Duration::from_millis(10), payload: 64, settle: Duration::from_millis(500) }
    }
}

/// One probe that arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// Its sequence number (0-based, in sending order).
    pub seq: u64,
    /// Kernel receive timestamp minus the sender's timestamp, in ns.
    pub one_way_ns: i64,
}

/// The outcome of [`Probes::run`].
#[derive(Debug, Clone)]
pub struct ProbeRun {
    pub sent: u64,
    /// In order of arrival.
    pub arrivals: Vec<Arrival>,
}

impl Probes {
    /// Sends probes from namespace `from` (source address `src`) to `dst` in namespace `to` and
    /// collects what arrives. Blocks for about `count × gap + settle`.
    pub fn run(&self, from: &Netns, src: IpAddr, to: &Netns, dst: SocketAddr) -> Result<ProbeRun> {
        ensure!(self.payload >= HEADER, "probe payload must be at least {HEADER} bytes");
        let rx = to.run_in(|| UdpSocket::bind(dst))?.with_context(|| format!("binding {dst} in {}", to.name()))?;
        let on: i32 = 1;
        sys::setsockopt(rx.as_raw_fd(), libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, &on)?;
        // Room for every probe even if the receiver thread is descheduled for a while.
        let rcvbuf: i32 = 4 << 20;
        sys::setsockopt(rx.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &rcvbuf)?;
        rx.set_read_timeout(Some(Duration::from_millis(10)))?;
        let tx = from
            .run_in(|| UdpSocket::bind(SocketAddr::new(src, 0)))?
            .with_context(|| format!("binding {src} in {}", from.name()))?;
        tx.connect(dst)?;

        let sender_done = Arc::new(AtomicBool::new(false));
        let receiver = {
            let (done, count, settle) = (sender_done.clone(), self.count, self.settle);
            thread::spawn(move || receive(&rx, count, &done, settle))
        };
        let sent = self.send(&tx);
        sender_done.store(true, Ordering::Release);
        let arrivals = receiver.join().expect("probe receiver panicked")?;
        Ok(ProbeRun { sent: sent?, arrivals })
    }

    fn send(&self, tx: &UdpSocket) -> Result<u64> {
        let mut payload = vec![0u8; self.payload];
        for seq in 0..self.count {
            payload[..8].copy_from_slice(&seq.to_le_bytes());
            payload[8..16].copy_from_slice(&sys::realtime_ns().to_le_bytes());
            tx.send(&payload).with_context(|| format!("sending probe {seq}"))?;
            thread::sleep(self.gap);
        }
        Ok(self.count)
    }
}

/// Collects probes until all `count` arrived or `settle` has passed since the sender finished.
fn receive(rx: &UdpSocket, count: u64, sender_done: &AtomicBool, settle: Duration) -> Result<Vec<Arrival>> {
    let mut arrivals = Vec::with_capacity(count as usize);
    let mut buf = [0u8; 2048];
    let mut settle_deadline = None;
    while (arrivals.len() as u64) < count {
        if settle_deadline.is_none() && sender_done.load(Ordering::Acquire) {
            settle_deadline = Some(Instant::now() + settle);
        }
        if settle_deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let Some(received) = sys::recv(rx.as_raw_fd(), &mut buf)? else { continue };
        if received.len < HEADER || received.truncated {
            bail!("received a {}-byte datagram that is not a probe", received.len);
        }
        let kernel_ns = received.kernel_ns.context("no SO_TIMESTAMPNS timestamp on a probe")?;
        let seq = u64::from_le_bytes(buf[..8].try_into()?);
        let sent_ns = i64::from_le_bytes(buf[8..16].try_into()?);
        arrivals.push(Arrival { seq, one_way_ns: kernel_ns - sent_ns });
    }
    Ok(arrivals)
}

impl ProbeRun {
    /// One-way delays in ns, in arrival order.
    pub fn one_way_ns(&self) -> Vec<i64> {
        self.arrivals.iter().map(|a| a.one_way_ns).collect()
    }

    /// Probes that never arrived (duplicates, which the emulator never makes, would hide losses).
    pub fn lost(&self) -> u64 {
        self.sent.saturating_sub(self.arrivals.len() as u64)
    }

    /// Arrived probes that overtook at least one probe sent before them (which arrived later),
    /// as netem's reorder makes them: a probe that skipped a queue of k others counts once, the k
    /// others not at all.
    pub fn overtaking(&self) -> Vec<Arrival> {
        let mut min_seq_later = u64::MAX;
        let mut overtaking: Vec<Arrival> = Vec::new();
        for arrival in self.arrivals.iter().rev() {
            if arrival.seq > min_seq_later {
                overtaking.push(*arrival);
            }
            min_seq_later = min_seq_later.min(arrival.seq);
        }
        overtaking.reverse();
        overtaking
    }
}

/// Summary statistics of a sample, in the sample's unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    /// Sample standard deviation.
    pub sd: f64,
    /// Mean of the samples between the 1st and the 99th percentile: the mean without the rare
    /// multi-millisecond stalls of a virtual CPU, which say nothing about the path.
    pub trimmed_mean: f64,
    pub min: f64,
    pub median: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    /// Summarises a non-empty sample.
    pub fn of(sample: &[i64]) -> Summary {
        assert!(!sample.is_empty(), "empty sample");
        let mut sorted: Vec<f64> = sample.iter().map(|&x| x as f64).collect();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let mean = sorted.iter().sum::<f64>() / n as f64;
        let var = sorted.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n.max(2) - 1) as f64;
        let quantile = |q: f64| sorted[((n - 1) as f64 * q).round() as usize];
        let cut = n / 100;
        let trimmed = &sorted[cut..n - cut];
        Summary {
            n,
            mean,
            sd: var.sqrt(),
            trimmed_mean: trimmed.iter().sum::<f64>() / trimmed.len() as f64,
            min: sorted[0],
            median: quantile(0.5),
            p99: quantile(0.99),
            max: sorted[n - 1],
        }
    }
}

impl std::fmt::Display for Summary {
    /// Formats a sample of nanoseconds in µs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "n={} mean={:.1}µs trimmed={:.1}µs sd={:.1}µs min={:.1}µs median={:.1}µs \
             p99={:.1}µs max={:.1}µs",
            self.n,
            self.mean / 1e3,
            self.trimmed_mean / 1e3,
            self.sd / 1e3,
            self.min / 1e3,
            self.median / 1e3,
            self.p99 / 1e3,
            self.max / 1e3
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seqs: &[u64]) -> ProbeRun {
        ProbeRun { sent: 10, arrivals: seqs.iter().map(|&seq| Arrival { seq, one_way_ns: 0 }).collect() }
    }

    #[test]
    fn overtaking_counts_the_probe_that_jumped_the_queue() {
        // 4 was sent without delay and overtook 1..3; 8 overtook 7.
        let r = run(&[0, 4, 1, 2, 3, 5, 6, 8, 7, 9]);
        let seqs: Vec<u64> = r.overtaking().iter().map(|a| a.seq).collect();
        assert_eq!(seqs, [4, 8]);
        assert_eq!(run(&[0, 1, 2]).overtaking(), []);
        assert_eq!(run(&[0, 2, 3]).lost(), 7);
    }

    #[test]
    fn summary() {
        let s = Summary::of(&[1, 2, 3, 4, 1000]);
        assert_eq!((s.n, s.min, s.median, s.max), (5, 1.0, 3.0, 1000.0));
        assert_eq!(s.mean, 202.0);
        let s = Summary::of(&(0..1000).collect::<Vec<_>>());
        assert_eq!(s.trimmed_mean, 499.5);
    }
}
