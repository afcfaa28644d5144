//! The relay behind `pirate-linkem`: a transparent two-port bridge in userspace that delays,
//! drops and reorders frames.
//!
//! # Design
//!
//! One AF_PACKET socket per interface receives every frame arriving there (promiscuous,
//! ETH_P_ALL, own transmissions ignored) and sends frames out of it, so the two sides see each
//! other's MACs and ARP/NDP pass through. Each received frame gets its fate from the direction's
//! [`LinkSpec`]; a frame that survives is queued with a departure time of
//! `kernel receive timestamp + delay`. Counting from the kernel's timestamp (SO_TIMESTAMPNS)
//! rather than from when the relay got to read the frame keeps the relay's own wakeup latency
//! (tens to hundreds of µs in a VM) out of the emulated delay, as long as the delay is longer than
//! that latency. Frames leave in order of departure time, ties in order of arrival, so a
//! reordered frame (short delay) overtakes frames queued before it and jitter can reorder as in
//! netem. Frames still queued when the relay stops are discarded (counted as `unsent_at_exit`).
//!
//! A single thread serves both directions: it sends every frame that is due, then sleeps in
//! `ppoll` on both sockets until the next departure is `spin` away, then polls without sleeping
//! until it is due. Sleeping alone would send frames late by the timer wakeup latency (median
//! 35–70 µs, 99th percentile 100–150 µs in a small VM); spinning only through the last `spin`
//! bounds the CPU cost, and a budget caps spinning at half the time when departures are dense
//! (see [`SpinBudget`]). The thread runs at SCHED_FIFO priority so that wakeups are not delayed
//! by other processes (without it, a busy machine delays some frames by milliseconds), with its
//! memory locked and a 1 ns timer slack. One thread rather than one per direction means at most
//! one core spins, which matters on small machines, and no locks or cross-thread wakeups.
//!
//! Measured on a 2-vCPU VM (tests/tests/linkem.rs, kernel timestamps at both ends): the emulated
//! link adds the configured delay plus 6–12 µs (the relay's send path and the extra veth hop);
//! the standard deviation around that is 3–10 µs. Rare multi-millisecond stalls of the virtual
//! CPU by the host remain, visible in `sent_late`.
//!
//! Capacity: every send runs the receiving namespace's stack inline (veth), so one thread relays
//! about 20 000 frames/s on that VM (TCP at ~170 Mbit/s, debug or release build alike). Offered
//! more, frames wait in the relay and leave late; `sent_late` and `max_send_lateness_ns` show it.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use anyhow::{Context, Result};

use super::rng::SplitMix64;
use super::spec::{Fate, LinkSpec};
use super::sys;
use super::{Counters, DirCounters};

/// How to run the relay.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Interface of side A; frames arriving here go out of `b` with the `ab` impairments.
    pub a: String,
    /// Interface of side B; frames arriving here go out of `a` with the `ba` impairments.
    pub b: String,
    pub ab: LinkSpec,
    pub ba: LinkSpec,
    /// Seeds the random decisions of both directions (each gets its own stream).
    pub seed: u64,
    /// How long before a departure the relay stops sleeping and starts polling. Must exceed the
    /// machine's usual timer wakeup latency, or frames leave late by the difference.
    pub spin: Duration,
    /// SCHED_FIFO priority for the relay thread, if any.
    pub rt_priority: Option<i32>,
}

/// Frames queued per direction before new ones are dropped (netem's `limit`, default 1000 there).
/// Enough for a TCP window of several MB at any delay the tests use.
const QUEUE_LIMIT: usize = 10_000;
/// Frames read from one socket per poll round, so that departures are not held up for long.
const RX_BATCH: usize = 16;
/// Longest sleep, so that a stop request is noticed even if its signal raced with `ppoll`.
const MAX_SLEEP_NS: i64 = 50_000_000;
/// A frame sent later than this after its departure time counts as `sent_late`.
const LATE_NS: i64 = 50_000;
/// Socket receive buffer: absorbs bursts while the relay is busy or descheduled.
const RCVBUF: i32 = 8 << 20;
/// Attempts to send a frame when the kernel is momentarily out of buffers.
const SEND_ATTEMPTS: usize = 3;
/// Receive buffer: a frame this large can only be an unsegmented GSO/GRO frame, which is counted
/// and dropped; 4 extra bytes leave room to reinsert a VLAN tag.
const FRAME_BUF: usize = 65_536 + 4;

/// Runs the relay until `stop` is set, calling `ready` once both sockets are bound (frames that
/// arrive from then on are relayed). Returns the counters.
pub fn run(config: &RelayConfig, stop: &AtomicBool, ready: impl FnOnce()) -> Result<Counters> {
    let sockets = [PacketSocket::open(&config.a)?, PacketSocket::open(&config.b)?];
    if let Err(e) = sys::minimal_timer_slack() {
        eprintln!("pirate-linkem: PR_SET_TIMERSLACK: {e} (departures may be late)");
    }
    if let Err(e) = sys::lock_memory() {
        eprintln!("pirate-linkem: mlockall: {e} (page faults may delay departures)");
    }
    if let Some(priority) = config.rt_priority {
        sys::realtime_priority(priority).with_context(|| format!("SCHED_FIFO priority {priority}"))?;
    }
    let mut seeds = SplitMix64::new(config.seed);
    let mut relay = Relay {
        dirs: [
            Direction::new(config.ab.clone(), seeds.next_u64()),
            Direction::new(config.ba.clone(), seeds.next_u64()),
        ],
        queue: BinaryHeap::new(),
        next_seq: 0,
        spin_ns: i64::try_from(config.spin.as_nanos()).unwrap_or(i64::MAX),
        logged_send_error: false,
    };
    ready();
    let mut buf = vec![0u8; FRAME_BUF];
    let mut budget = SpinBudget::new(sys::realtime_ns());
    while !stop.load(AtomicOrdering::Relaxed) {
        budget.account(sys::realtime_ns());
        relay.send_due(&sockets);
        // Sleep until `spin` before the next departure, then poll without sleeping until it is
        // due — unless the spin budget is spent, in which case sleep all the way.
        let until = relay.queue.peek().map(|Reverse(head)| head.departure - sys::realtime_ns());
        budget.spinning = until.is_some_and(|u| u > 0 && u <= relay.spin_ns) && budget.may_spin();
        let timeout_ns = match until {
            _ if budget.spinning => 0,
            Some(u) if u > relay.spin_ns => u - relay.spin_ns,
            Some(u) => u,
            None => MAX_SLEEP_NS,
        };
        let mut fds =
            sockets.each_ref().map(|s| libc::pollfd { fd: s.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        sys::poll(&mut fds, timeout_ns.clamp(0, MAX_SLEEP_NS)).context("ppoll")?;
        for (dir, fd) in fds.iter().enumerate() {
            if fd.revents != 0 {
                relay.receive(dir, &sockets[dir], &mut buf)?;
            }
        }
    }
    let mut counters = Counters { ab: relay.dirs[0].counters.clone(), ba: relay.dirs[1].counters.clone() };
    for Reverse(frame) in relay.queue {
        [&mut counters.ab, &mut counters.ba][frame.dir].unsent_at_exit += 1;
    }
    for (socket, dir) in sockets.iter().zip([&mut counters.ab, &mut counters.ba]) {
        dir.kernel_drops = socket.drops()?;
    }
    Ok(counters)
}

/// Limits spinning to 1/[`SPIN_SHARE_DIV`] of the time in the long run: a token bucket, filled
/// by elapsed time and drained by time spent polling without sleeping. Dense departures (a TCP
/// transfer) would otherwise keep one core busy at real-time priority for as long as traffic
/// lasts and starve the testbed's other processes on it. Once the budget is spent the relay
/// sleeps until each departure, so frames leave up to one timer wakeup late (tens of µs), which
/// `sent_late` counts.
struct SpinBudget {
    credit_ns: i64,
    last_ns: i64,
    /// Whether the relay polled without sleeping since the last `account`.
    spinning: bool,
}

/// Share of the time the relay may spin in the long run (1/SPIN_SHARE_DIV).
const SPIN_SHARE_DIV: i64 = 2;
/// Most credit the budget holds: from full, the relay may spin continuously for twice as long
/// (it earns at half the rate it spends).
const SPIN_CREDIT_NS: i64 = 1_000_000;

impl SpinBudget {
    fn new(now: i64) -> SpinBudget {
        SpinBudget { credit_ns: SPIN_CREDIT_NS, last_ns: now, spinning: false }
    }

    /// Earns credit for the time since the last call, and spends it if that time was spun.
    fn account(&mut self, now: i64) {
        let elapsed = now - self.last_ns;
        self.last_ns = now;
        let spent = if self.spinning { elapsed } else { 0 };
        self.credit_ns = (self.credit_ns + elapsed / SPIN_SHARE_DIV - spent).min(SPIN_CREDIT_NS);
    }

    fn may_spin(&self) -> bool {
        self.credit_ns > 0
    }
}

struct Relay {
    /// Index 0 is a→b (frames read on socket 0), 1 is b→a.
    dirs: [Direction; 2],
    /// Min-heap by (departure, arrival sequence).
    queue: BinaryHeap<Reverse<Queued>>,
    next_seq: u64,
    spin_ns: i64,
    logged_send_error: bool,
}

struct Direction {
    spec: LinkSpec,
    rng: SplitMix64,
    counters: DirCounters,
    queued: usize,
}

impl Direction {
    fn new(spec: LinkSpec, seed: u64) -> Direction {
        Direction { spec, rng: SplitMix64::new(seed), counters: DirCounters::default(), queued: 0 }
    }
}

struct Queued {
    departure: i64,
    seq: u64,
    dir: usize,
    /// Whether the frame was read before its departure time, i.e. could have left on time.
    in_time: bool,
    frame: Vec<u8>,
}

impl Queued {
    fn key(&self) -> (i64, u64) {
        (self.departure, self.seq)
    }
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Queued {}

impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Queued {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

impl Relay {
    /// Reads up to a batch of frames from the socket of direction `dir` and queues them.
    fn receive(&mut self, dir: usize, socket: &PacketSocket, buf: &mut [u8]) -> Result<()> {
        for _ in 0..RX_BATCH {
            // Leave room in front to reinsert a VLAN tag without copying twice.
            let received = match sys::recv(socket.fd.as_raw_fd(), &mut buf[4..], 0) {
                Ok(Some(r)) => r,
                Ok(None) => return Ok(()),
                // The interface went down: AF_PACKET reports it once and resumes when it is up.
                Err(e) if e.raw_os_error() == Some(libc::ENETDOWN) => {
                    eprintln!("pirate-linkem: {}: {e}", socket.ifname);
                    return Ok(());
                }
                Err(e) => return Err(e).with_context(|| format!("recvmsg on {}", socket.ifname)),
            };
            let now = sys::realtime_ns();
            if received.pkttype == Some(libc::PACKET_OUTGOING) {
                // PACKET_IGNORE_OUTGOING should already keep our own sends out.
                continue;
            }
            let d = &mut self.dirs[dir];
            d.counters.received += 1;
            if received.truncated {
                d.counters.dropped_oversize += 1;
                continue;
            }
            let frame = frame_with_vlan(buf, received.len, received.aux.as_ref());
            if received.aux.is_some_and(|a| a.tp_status & libc::TP_STATUS_CSUMNOTREADY != 0) {
                d.counters.csum_partial += 1;
            }
            let Fate::Delayed { delay_ns, reordered } = d.spec.fate(&mut d.rng) else {
                d.counters.dropped_loss += 1;
                continue;
            };
            d.counters.reordered += u64::from(reordered);
            if d.queued >= QUEUE_LIMIT {
                d.counters.dropped_queue_full += 1;
                continue;
            }
            // A timestamp ahead of the clock can only come from a clock step; never wait for it.
            let arrival = received.kernel_ns.map_or(now, |ts| ts.min(now));
            let departure = arrival.saturating_add(delay_ns);
            d.queued += 1;
            self.queue.push(Reverse(Queued { departure, seq: self.next_seq, dir, in_time: departure > now, frame }));
            self.next_seq += 1;
        }
        Ok(())
    }

    /// Sends every queued frame whose departure time has come.
    fn send_due(&mut self, sockets: &[PacketSocket; 2]) {
        let now = sys::realtime_ns();
        while self.queue.peek().is_some_and(|Reverse(head)| head.departure <= now) {
            let Some(Reverse(frame)) = self.queue.pop() else { break };
            let late_ns = sys::realtime_ns() - frame.departure;
            let out = &sockets[1 - frame.dir];
            let result = send_frame(out.fd.as_raw_fd(), &frame.frame);
            let d = &mut self.dirs[frame.dir];
            d.queued -= 1;
            match result {
                Ok(()) => d.counters.sent += 1,
                Err(e) => {
                    d.counters.send_errors += 1;
                    if !self.logged_send_error {
                        self.logged_send_error = true;
                        eprintln!(
                            "pirate-linkem: sending a {}-byte frame on {}: {e} (further send \
                             errors are only counted)",
                            frame.frame.len(),
                            out.ifname
                        );
                    }
                }
            }
            if !frame.in_time {
                d.counters.late_on_arrival += 1;
            } else {
                d.counters.max_send_lateness_ns = d.counters.max_send_lateness_ns.max(late_ns as u64);
                d.counters.sent_late += u64::from(late_ns > LATE_NS);
            }
        }
    }
}

/// Sends one frame, retrying briefly when the kernel is out of buffers or a signal interrupts.
fn send_frame(fd: RawFd, frame: &[u8]) -> std::io::Result<()> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match sys::send(fd, frame) {
            Ok(_) => return Ok(()),
            Err(e)
                if attempt < SEND_ATTEMPTS
                    && matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::ENOBUFS)) =>
            {
                std::thread::yield_now();
            }
            Err(e) => return Err(e),
        }
    }
}

/// The frame as it was on the wire. `buf[4..4 + len]` holds what recvmsg returned; when the
/// interface had stripped a VLAN tag into the metadata (rx-vlan-offload), it is put back after
/// the two MAC addresses, using the 4 spare bytes in front.
fn frame_with_vlan(buf: &mut [u8], len: usize, aux: Option<&libc::tpacket_auxdata>) -> Vec<u8> {
    let Some(aux) = aux.filter(|a| a.tp_status & libc::TP_STATUS_VLAN_VALID != 0 && len >= 12) else {
        return buf[4..4 + len].to_vec();
    };
    let tpid =
        if aux.tp_status & libc::TP_STATUS_VLAN_TPID_VALID != 0 { aux.tp_vlan_tpid } else { libc::ETH_P_8021Q as u16 };
    buf.copy_within(4..16, 0);
    buf[12..14].copy_from_slice(&tpid.to_be_bytes());
    buf[14..16].copy_from_slice(&aux.tp_vlan_tci.to_be_bytes());
    buf[..len + 4].to_vec()
}

/// An AF_PACKET socket bound to one interface.
struct PacketSocket {
    fd: OwnedFd,
    ifname: String,
}

impl PacketSocket {
    fn open(ifname: &str) -> Result<PacketSocket> {
        let context = || format!("packet socket on {ifname}");
        let ifindex = sys::if_nametoindex(ifname).with_context(context)?;
        // Protocol 0: the socket receives nothing until bind, so no frame from another interface
        // slips in between socket() and bind().
        // SAFETY: plain syscall; the fd is owned right away.
        let raw =
            unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error()).with_context(context);
        }
        // SAFETY: raw is a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let raw = fd.as_raw_fd();
        let on: i32 = 1;
        sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &on)
            .context("PACKET_IGNORE_OUTGOING")
            .with_context(context)?;
        sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_AUXDATA, &on)
            .context("PACKET_AUXDATA")
            .with_context(context)?;
        sys::setsockopt(raw, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, &on)
            .context("SO_TIMESTAMPNS")
            .with_context(context)?;
        // RCVBUFFORCE goes past net.core.rmem_max (we are root); fall back to the capped one.
        if sys::setsockopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &RCVBUF).is_err() {
            sys::setsockopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, &RCVBUF)
                .context("SO_RCVBUF")
                .with_context(context)?;
        }
        // SAFETY: all-zero is a valid sockaddr_ll; the fields that matter are set below.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        addr.sll_ifindex = ifindex as i32;
        // SAFETY: addr is a valid sockaddr_ll of the given size.
        let rc = unsafe {
            libc::bind(
                raw,
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).context("bind").with_context(context);
        }
        // Frames are addressed to the MAC of the far side. veth delivers them to packet sockets
        // anyway, but a real NIC would filter them out; promiscuous membership lasts exactly as
        // long as the socket.
        let mreq = libc::packet_mreq {
            mr_ifindex: ifindex as i32,
            mr_type: libc::PACKET_MR_PROMISC as u16,
            mr_alen: 0,
            mr_address: [0; 8],
        };
        sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq)
            .context("PACKET_MR_PROMISC")
            .with_context(context)?;
        Ok(PacketSocket { fd, ifname: ifname.to_owned() })
    }

    /// Frames the kernel dropped because the receive buffer was full.
    fn drops(&self) -> Result<u64> {
        let stats: libc::tpacket_stats =
            sys::getsockopt(self.fd.as_raw_fd(), libc::SOL_PACKET, libc::PACKET_STATISTICS)
                .with_context(|| format!("PACKET_STATISTICS on {}", self.ifname))?;
        Ok(u64::from(stats.tp_drops))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vlan_tag_is_reinserted_after_the_macs() {
        let wire: Vec<u8> = (0u8..20).collect();
        let mut buf = vec![0u8; 64];
        buf[4..24].copy_from_slice(&wire);
        assert_eq!(frame_with_vlan(&mut buf.clone(), 20, None), wire);

        // SAFETY: all-zero is a valid tpacket_auxdata.
        let mut aux: libc::tpacket_auxdata = unsafe { std::mem::zeroed() };
        aux.tp_status = libc::TP_STATUS_VLAN_VALID;
        aux.tp_vlan_tci = 0x2064;
        let tagged = frame_with_vlan(&mut buf, 20, Some(&aux));
        assert_eq!(&tagged[..12], &wire[..12]);
        assert_eq!(&tagged[12..16], &[0x81, 0x00, 0x20, 0x64]);
        assert_eq!(&tagged[16..], &wire[12..]);
    }
}
