//! The XDP chain. Run in the kernel with BPF_PROG_TEST_RUN, without an interface: whatever the
//! frame, the root and every measuring program behind it pass it on unchanged, and each capability
//! slot is taken when filled and skipped when empty. Live on the testbed: Katran's real balancer,
//! registered into pirated's pinned `FORWARD` array as Katran registers into a root array,
//! forwards what `pirate` measured, and with its slot empty the packets pass to the server.

use std::{
    net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream},
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use pirate_common::counters;
use pirate_tests::{
    katran::{build_balancer, counter, Katran},
    testbed::{OnePoint, Pirated, SERVER_IP, VP_CLIENT_IF},
};
use pirated::{
    config::Config,
    datapath::{test_run::test_run, Capability, Datapath},
};
use proptest::{
    prelude::*,
    test_runner::{Config as ProptestConfig, TestCaseError, TestRunner},
};

const XDP_PASS: u32 = 2;
/// The kernel runs XDP test frames of at least an Ethernet header.
const ETH_HLEN: usize = 14;

/// An Ethernet frame with optional VLAN tags, an IPv4 or IPv6 header and a TCP or UDP header,
/// every field the parser reads taken from `fields` (so lengths, versions and flags vary too).
fn frame(vlans: usize, v6: bool, tcp: bool, fields: &[u8], payload: usize) -> Vec<u8> {
    let field = |i: usize| fields[i % fields.len()];
    let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
    for _ in 0..vlans {
        f.extend_from_slice(&[0x81, 0x00, 0, field(0)]);
    }
    let proto = if tcp { 6 } else { 17 };
    let l4_len = if tcp { 20 } else { 8 } + payload;
    if v6 {
        f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
        f.extend_from_slice(&(l4_len as u16).to_be_bytes());
        f.extend_from_slice(&[proto, 64]);
        f.extend((0..32).map(|i| field(i + 1)));
    } else {
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
        f.extend_from_slice(&((20 + l4_len) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0, 0x40, 0, 64, proto, 0, 0]);
        f.extend((0..8).map(|i| field(i + 1)));
    }
    f.extend((0..4).map(|i| field(i + 9)));
    if tcp {
        f.extend((0..8).map(|i| field(i + 13)));
        f.extend_from_slice(&[0x50, field(21), 0xff, 0xff, 0, 0, 0, 0]);
    } else {
        f.extend_from_slice(&((8 + payload) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
    }
    f.extend((0..payload).map(|i| field(i + 22)));
    f
}

/// Well-formed frames with bytes overwritten and cut short: they reach deep into the parser
/// (and into `pirate`'s flow table) before something breaks. Or plain random bytes.
fn frames() -> impl Strategy<Value = Vec<u8>> {
    let built = (0..3usize, any::<bool>(), any::<bool>(), prop::collection::vec(any::<u8>(), 24), 0..1400usize)
        .prop_map(|(vlans, v6, tcp, fields, payload)| frame(vlans, v6, tcp, &fields, payload));
    let mutated =
        (built, prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6), any::<prop::sample::Index>())
            .prop_map(|(mut f, writes, cut)| {
                for (at, byte) in writes {
                    let i = at.index(f.len());
                    f[i] = byte;
                }
                let keep = ETH_HLEN + cut.index(f.len() - ETH_HLEN + 1);
                f.truncate(keep);
                f
            });
    prop_oneof![3 => mutated, 1 => prop::collection::vec(any::<u8>(), ETH_HLEN..1600)]
}

/// Runs the chain on `f`: it must pass it, byte for byte.
fn passes_unchanged(root: BorrowedFd<'_>, f: &[u8]) -> Result<(), TestCaseError> {
    let mut out = vec![0u8; 4096];
    let run = test_run(root, f, 1, &mut out).map_err(|e| TestCaseError::fail(format!("BPF_PROG_TEST_RUN: {e}")))?;
    prop_assert_eq!(run.verdict, XDP_PASS, "frame {:02x?}", f);
    prop_assert_eq!(&out[..run.out_len], f);
    Ok(())
}

fn outcomes(kernel: &[u64]) -> u64 {
    kernel[..counters::OUTCOMES as usize].iter().sum()
}

#[test]
fn random_and_malformed_frames_pass_the_whole_chain_unchanged() -> Result<()> {
    let dp = Datapath::load(&Config::default().datapath())?;
    let root = dp.root_fd()?.try_clone_to_owned()?;
    const CASES: u32 = 5000;
    let config = ProptestConfig { cases: CASES, failure_persistence: None, ..ProptestConfig::default() };
    let mut runner = TestRunner::new(config);
    runner.run(&frames(), |f| passes_unchanged(root.as_fd(), &f)).map_err(|e| anyhow::anyhow!("{e}"))?;

    // Every frame the chain saw landed in exactly one outcome, and left by XDP_PASS at its end.
    let kernel = dp.counters()?;
    let runs = kernel[counters::EVENT_NO_TAIL_CALL as usize];
    ensure!(runs >= CASES as u64, "{runs} frames reached the end of the chain, of {CASES} cases at least");
    ensure!(outcomes(&kernel) == runs, "outcomes {:?} for {runs} frames", &kernel[..counters::OUTCOMES as usize]);
    let named = |c: u32| kernel[c as usize];
    eprintln!(
        "{runs} frames: {} measured or first of a flow, {} malformed, {} not IP, {} unsupported",
        named(counters::MEASURED) + named(counters::NEW_FLOW),
        named(counters::MALFORMED),
        named(counters::NOT_IP),
        named(counters::UNSUPPORTED)
    );
    // The generator reaches every parser outcome, or the test would prove less than it says.
    for c in [counters::NEW_FLOW, counters::MALFORMED, counters::NOT_IP, counters::UNSUPPORTED] {
        ensure!(named(c) > 0, "no frame ended as {}", counters::NAMES[c as usize]);
    }
    Ok(())
}

/// A capability slot is taken when filled and skipped when empty (the root's tail call
/// returns), and the packet passes either way.
#[test]
fn an_empty_capability_slot_is_skipped_and_a_filled_one_taken() -> Result<()> {
    let mut dp = Datapath::load(&Config::default().datapath())?;
    let udp = frame(0, false, false, &[7; 24], 32);
    let run = |dp: &Datapath| -> Result<[u64; counters::COUNT as usize]> {
        let before = dp.counters()?;
        passes_unchanged(dp.root_fd()?, &udp).map_err(|e| anyhow::anyhow!("{e}"))?;
        let after = dp.counters()?;
        Ok(std::array::from_fn(|i| after[i] - before[i]))
    };
    dp.chain(Capability::Pirate, false)?;
    let empty = run(&dp)?;
    ensure!(outcomes(&empty) == 0, "pirate unchained, yet an outcome was counted: {empty:?}");
    ensure!(empty[counters::EVENT_NO_TAIL_CALL as usize] == 1, "{empty:?}");
    dp.chain(Capability::Pirate, true)?;
    let filled = run(&dp)?;
    ensure!(filled[counters::NEW_FLOW as usize] == 1 && outcomes(&filled) == 1, "{filled:?}");
    ensure!(filled[counters::EVENT_NO_TAIL_CALL as usize] == 1, "{filled:?}");
    Ok(())
}

/// The first packet of a flow in a new epoch takes the detour through `pirate_flow` (which
/// hands the finished epoch over and re-enters `pirate`): it is measured once, no roll-over
/// fails, and the finished epoch reaches the hand-over ring.
#[test]
fn a_new_epoch_rolls_each_flow_over_once() -> Result<()> {
    let mut dp = Datapath::load(&Config::default().datapath())?;
    let udp = frame(0, false, false, &[9; 24], 32);
    let mut records = pirated::pirate::drain::Records::take(&mut dp)?;
    let epoch = dp.epoch();
    let before = dp.counters()?;
    for e in [epoch, epoch, epoch + 1, epoch + 1] {
        dp.set_epoch(e)?;
        passes_unchanged(dp.root_fd()?, &udp).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let after = dp.counters()?;
    let d: [u64; counters::COUNT as usize] = std::array::from_fn(|i| after[i] - before[i]);
    ensure!(d[counters::NEW_FLOW as usize] == 1 && outcomes(&d) == 4, "{d:?}");
    ensure!(d[counters::EVENT_NO_FLOW_PROGRAM as usize] == 0, "a roll-over failed: {d:?}");
    ensure!(d[counters::EVENT_RECORD_SENT as usize] == 1, "{d:?}");
    let drained = records.drain(epoch, Vec::new())?;
    ensure!(drained.flows.len() == 1, "{} flows drained for epoch {epoch}", drained.flows.len());
    ensure!(drained.flows[0].packets == 2, "{:?}", drained.flows[0]);
    Ok(())
}

/// Every mode count the configuration accepts has a layout whose programs the kernel's
/// verifier accepts: one past its budget would fail only when a user picked it.
#[test]
fn every_accepted_mode_count_loads() -> Result<()> {
    for modes in [1, pirate_common::pirate::config::MODES_COMPACT as u32, pirated::pirate::config::MAX_MODES] {
        let mut config = Config::default();
        config.pirate.modes = modes;
        let dp = Datapath::load(&config.datapath()).with_context(|| format!("modes = {modes}"))?;
        for (program, walked) in dp.verified_instructions()? {
            eprintln!("modes = {modes}: {program} walked {walked:?} instructions");
        }
    }
    Ok(())
}

/// Katran's default `rootMapPos`.
const KATRAN_SLOT: u32 = 2;
const VIP_PORT: u16 = 8080;
/// The real Katran sends the VIP's packets to (IPIP); nothing answers there.
const REAL: Ipv4Addr = Ipv4Addr::new(10, 201, 9, 100);

/// An AF_PACKET socket on `ifname` of the calling thread's namespace, receiving every frame,
/// with a read timeout so that waiting for a frame is bounded.
fn capture(ifname: &str) -> Result<OwnedFd> {
    // SAFETY: plain socket calls on a descriptor we own; addresses are valid for their lengths.
    unsafe {
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, (libc::ETH_P_ALL as u16).to_be() as i32);
        ensure!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
        let fd = OwnedFd::from_raw_fd(fd);
        let name = std::ffi::CString::new(ifname)?;
        let mut addr: libc::sockaddr_ll = std::mem::zeroed();
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        addr.sll_ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
        let sa = &addr as *const libc::sockaddr_ll as *const libc::sockaddr;
        let rc = libc::bind(fd.as_raw_fd(), sa, size_of::<libc::sockaddr_ll>() as u32);
        ensure!(rc == 0, "binding to {ifname}: {}", std::io::Error::last_os_error());
        let tv = libc::timeval { tv_sec: 0, tv_usec: 100_000 };
        let tvp = &tv as *const libc::timeval as *const libc::c_void;
        libc::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, tvp, size_of::<libc::timeval>() as u32);
        Ok(fd)
    }
}

/// The first frame on `sock` within `timeout` that is IPIP to `real` carrying a TCP SYN to `vip`.
fn ipip_syn(sock: BorrowedFd<'_>, real: Ipv4Addr, vip: SocketAddrV4, timeout: Duration) -> Result<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 2048];
    while Instant::now() < deadline {
        // SAFETY: reads at most buf.len() bytes into buf.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 54 + 20 {
            continue;
        }
        let f = &buf[..n as usize];
        let (outer, inner) = (&f[14..], &f[34..]);
        let is_ipip = f[12..14] == [0x08, 0x00] && outer[0] == 0x45 && outer[9] == 4;
        if !is_ipip || outer[16..20] != real.octets() || inner[0] != 0x45 || inner[9] != 6 {
            continue;
        }
        let tcp = &inner[20..];
        if inner[16..20] == vip.ip().octets() && tcp[2..4] == vip.port().to_be_bytes() && tcp[13] & 0x02 != 0 {
            return Ok(f.to_vec());
        }
    }
    bail!("no IPIP frame to {real} carrying a SYN to {vip} within {timeout:?}")
}

/// Katran's balancer registered at its default position in pirated's pinned `FORWARD` takes the
/// client's SYN after `pirate` measured it and sends it back out IPIP-encapsulated to the real
/// (XDP_TX, so it arrives at the client's end of the link); with the slot empty, the same
/// connection reaches the server.
#[test]
fn katran_in_a_forward_slot_forwards_and_an_empty_slot_passes() -> Result<()> {
    let tb = OnePoint::new()?;
    let vip = SocketAddrV4::new(SERVER_IP.parse()?, VIP_PORT);
    let listener = tb.server.run_in(|| TcpListener::bind(vip))??;
    // Generic XDP: XDP_TX leaves through the veth's own transmit path to the client's end (native
    // XDP_TX on a veth needs NAPI on the peer, which the testbed's offload settings turn off).
    let mut pirated = Pirated::start(&tb.vp, VP_CLIENT_IF, "epoch = \"200ms\"\nattach_mode = \"generic\"\n")?;
    let katran = Katran::load(&build_balancer(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("katran"))?)?;
    katran.set_default_router_mac(tb.client.mac_octets("c-vp")?)?;
    katran.add_vip(vip, libc::IPPROTO_TCP as u8, 0, 0)?;
    katran.set_real(1, REAL)?;
    katran.fill_ring(0, &[1])?;
    // `ip netns exec` gave pirated its own mount namespace: its pins are under its root.
    let forward = PathBuf::from(format!("/proc/{}/root/sys/fs/bpf/pirated/{}/FORWARD", pirated.pid(), tb.vp.name()));
    katran.register(&forward, KATRAN_SLOT)?;

    let sock = tb.client.run_in(|| capture("c-vp"))??;
    let attempt = tb.client.spawn_in(move || TcpStream::connect_timeout(&vip.into(), Duration::from_secs(2)))?;
    let frame = ipip_syn(sock.as_fd(), REAL, vip, Duration::from_secs(3))?;
    let forwarded = attempt.join().unwrap();
    ensure!(forwarded.is_err(), "the connection reached the server, though Katran took its SYN");
    let (tx, _) = katran.counter(counter::XDP_TX)?;
    ensure!(tx >= 1, "Katran sent nothing: {}", katran.counters_summary());
    eprintln!("Katran forwarded {tx} SYN(s); first: {} bytes, outer {:?} -> {REAL}", frame.len(), &frame[26..30]);

    katran.unregister(&forward, KATRAN_SLOT)?;
    tb.client
        .run_in(move || TcpStream::connect_timeout(&vip.into(), Duration::from_secs(5)))?
        .context("connecting with FORWARD empty")?;
    listener.set_nonblocking(false)?;
    listener.accept().context("the server accepting the connection that passed")?;
    let (tx_after, _) = katran.counter(counter::XDP_TX)?;
    ensure!(tx_after == tx, "Katran sent {} more after leaving its slot", tx_after - tx);

    std::thread::sleep(Duration::from_millis(400));
    let lines = pirated.stop()?;
    // Both connections were measured by `pirate` ahead of the forwarder slot.
    let flows = lines.iter().filter(|v| v["type"] == "flow" && v["server"] == vip.to_string().as_str()).count();
    ensure!(flows >= 2, "pirate measured {flows} flows to the VIP, not both connections");
    Ok(())
}
