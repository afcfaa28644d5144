//! One-way delay probes over UDP: ground truth that does not depend on the emulator.
//!
//! Both ends take kernel timestamps on one host clock (CLOCK_REALTIME): the sender a software
//! transmit timestamp (SO_TIMESTAMPING, taken by the veth driver as it passes the frame on), the
//! receiver a receive timestamp (SO_TIMESTAMPNS, taken when the frame enters its namespace's
//! stack). So neither side's scheduling enters the measurement: a sender preempted between
//! reading the clock and `send` by a busy machine would otherwise add milliseconds. The result is
//! the one-way delay of the path between the two namespaces, kernel paths included.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use super::sys;
use crate::netns::Netns;

/// Every probe starts with its sequence number, little-endian.
const HEADER: usize = 8;
/// How long the kernel may take to report a transmit timestamp after `send` returned.
const TX_TIMESTAMP_TIMEOUT: Duration = Duration::from_secs(1);

/// A probe run: how many datagrams, how far apart, how big.
#[derive(Debug, Clone)]
pub struct Probes {
    pub count: u64,
    /// Pause after each send; the real gap is longer by the sender's wakeup latency.
    pub gap: Duration,
    /// UDP payload bytes (at least 8).
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
    /// Receive timestamp minus transmit timestamp, in ns.
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
        // OPT_ID numbers the timestamps by datagram; TSONLY leaves the payload out of them.
        let flags = libc::SOF_TIMESTAMPING_TX_SOFTWARE
            | libc::SOF_TIMESTAMPING_SOFTWARE
            | libc::SOF_TIMESTAMPING_OPT_ID
            | libc::SOF_TIMESTAMPING_OPT_TSONLY;
        sys::setsockopt(tx.as_raw_fd(), libc::SOL_SOCKET, libc::SO_TIMESTAMPING, &flags)?;

        let sender_done = Arc::new(AtomicBool::new(false));
        let receiver = {
            let (done, count, settle) = (sender_done.clone(), self.count, self.settle);
            thread::spawn(move || receive(&rx, count, &done, settle))
        };
        let sent = self.send(&tx);
        sender_done.store(true, Ordering::Release);
        let received = receiver.join().expect("probe receiver panicked")?;
        let sent_ns = sent?;
        let arrivals = received
            .into_iter()
            .map(|(seq, received_ns)| {
                let sent = sent_ns.get(&seq).with_context(|| format!("probe {seq} never sent"))?;
                Ok(Arrival { seq, one_way_ns: received_ns - sent })
            })
            .collect::<Result<_>>()?;
        Ok(ProbeRun { sent: self.count, arrivals })
    }

    /// The UDP payload of probe `seq`: its sequence number, then zeros up to `payload` bytes.
    pub fn payload(&self, seq: u64) -> Vec<u8> {
        let mut payload = vec![0u8; self.payload.max(HEADER)];
        payload[..HEADER].copy_from_slice(&seq.to_le_bytes());
        payload
    }

    /// Sends the probes and returns their transmit timestamps by sequence number.
    fn send(&self, tx: &UdpSocket) -> Result<HashMap<u64, i64>> {
        let mut sent_ns = HashMap::with_capacity(self.count as usize);
        for seq in 0..self.count {
            tx.send(&self.payload(seq)).with_context(|| format!("sending probe {seq}"))?;
            collect_tx_timestamps(tx, &mut sent_ns)?;
            thread::sleep(self.gap);
        }
        let deadline = Instant::now() + TX_TIMESTAMP_TIMEOUT;
        while (sent_ns.len() as u64) < self.count {
            if Instant::now() >= deadline {
                bail!("transmit timestamps for {} of {} probes", sent_ns.len(), self.count);
            }
            thread::sleep(Duration::from_millis(1));
            collect_tx_timestamps(tx, &mut sent_ns)?;
        }
        Ok(sent_ns)
    }
}

/// Reads the transmit timestamps waiting in the socket's error queue.
fn collect_tx_timestamps(tx: &UdpSocket, sent_ns: &mut HashMap<u64, i64>) -> Result<()> {
    let mut buf = [0u8; 64];
    let flags = libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT;
    while let Some(report) = sys::recv(tx.as_raw_fd(), &mut buf, flags)? {
        if let (Some(id), Some(ns)) = (report.tx_id, report.kernel_ns) {
            sent_ns.insert(u64::from(id), ns);
        }
    }
    Ok(())
}

/// Collects (sequence number, receive timestamp) until all `count` probes arrived or `settle`
/// has passed since the sender finished.
fn receive(rx: &UdpSocket, count: u64, sender_done: &AtomicBool, settle: Duration) -> Result<Vec<(u64, i64)>> {
    let mut received = Vec::with_capacity(count as usize);
    let mut buf = [0u8; 2048];
    let mut settle_deadline = None;
    while (received.len() as u64) < count {
        if settle_deadline.is_none() && sender_done.load(Ordering::Acquire) {
            settle_deadline = Some(Instant::now() + settle);
        }
        if settle_deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let Some(datagram) = sys::recv(rx.as_raw_fd(), &mut buf, 0)? else { continue };
        if datagram.len < HEADER || datagram.truncated {
            bail!("received a {}-byte datagram that is not a probe", datagram.len);
        }
        let received_ns = datagram.kernel_ns.context("no SO_TIMESTAMPNS timestamp on a probe")?;
        received.push((u64::from_le_bytes(buf[..8].try_into()?), received_ns));
    }
    Ok(received)
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
///
/// On a virtual machine the host now and then deschedules a virtual CPU for milliseconds; every
/// frame the emulator should have sent meanwhile leaves late. A handful of such frames moves the
/// mean and the standard deviation far more than the emulator's behaviour does, so quantiles are
/// here too, for assertions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    /// Sample standard deviation.
    pub sd: f64,
    /// Mean of the samples between the 1st and the 99th percentile.
    pub trimmed_mean: f64,
    pub min: f64,
    pub p25: f64,
    pub median: f64,
    pub p75: f64,
    pub p90: f64,
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
            p25: quantile(0.25),
            median: quantile(0.5),
            p75: quantile(0.75),
            p90: quantile(0.9),
            p99: quantile(0.99),
            max: sorted[n - 1],
        }
    }
}

impl std::fmt::Display for Summary {
    /// Formats a sample of nanoseconds in µs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let us = |ns: f64| ns / 1e3;
        write!(
            f,
            "n={} mean={:.1} trimmed={:.1} sd={:.1} | min={:.1} p25={:.1} median={:.1} p75={:.1} p90={:.1} \
             p99={:.1} max={:.1} (µs)",
            self.n,
            us(self.mean),
            us(self.trimmed_mean),
            us(self.sd),
            us(self.min),
            us(self.p25),
            us(self.median),
            us(self.p75),
            us(self.p90),
            us(self.p99),
            us(self.max)
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
        let s = Summary::of(&(0..1001).collect::<Vec<_>>());
        assert_eq!(s.trimmed_mean, 500.0);
        assert_eq!((s.p25, s.p75, s.p90), (250.0, 750.0, 900.0));
    }
}
