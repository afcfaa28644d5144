//! RLI's datapath at the downstream point, run in the kernel with BPF_PROG_TEST_RUN: references
//! with a valid tag are taken (their delay kept, the packet dropped); forged, replayed and
//! stale ones are dropped and counted, never used; every other packet passes unchanged into its
//! flow's counters, interpolated between the references around it.

use anyhow::{ensure, Result};
use pirate_common::{counters, rli::reference::seal};
use pirated::{
    clock,
    config::Config,
    datapath::{test_run::test_run, Datapath},
    rli::drain::Drain,
};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const KEY: [u64; 2] = [0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210];
const PORT: u16 = 9466;

/// An Ethernet + IPv4 + UDP frame from 10.0.0.1:`sport` to 10.0.0.2:`dport`.
fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00, 0x45, 0];
    f.extend_from_slice(&((28 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

/// A downstream point's datapath with RLI on, its references tagged under `KEY`.
fn downstream() -> Result<Datapath> {
    let config = Config::parse(&format!(
        "[segment]\nrole = \"down\"\nkey_file = \"/nonexistent\"\n[rli]\nenabled = true\nport = {PORT}\n"
    ))?;
    let mut spec = config.datapath();
    ensure!(spec.rli.enabled, "the downstream point chains rli");
    ensure!(Datapath::load(&spec).is_err(), "rli chained without a key");
    spec.rli.shape.key = KEY;
    Datapath::load(&spec)
}

/// Runs the chain on `frame`; its verdict and what each counter gained.
fn run(dp: &Datapath, frame: &[u8]) -> Result<(u32, [u64; counters::COUNT as usize])> {
    let before = dp.counters()?;
    let mut out = vec![0u8; 2048];
    let r = test_run(dp.root_fd()?, frame, 1, &mut out)?;
    if r.verdict == XDP_PASS {
        ensure!(&out[..r.out_len] == frame, "a regular packet left changed");
    }
    let after = dp.counters()?;
    Ok((r.verdict, std::array::from_fn(|i| after[i] - before[i])))
}

/// Runs `frame` and expects it dropped with `counter` counted once.
fn dropped_as(dp: &Datapath, frame: &[u8], counter: u32) -> Result<()> {
    let (verdict, d) = run(dp, frame)?;
    ensure!(verdict == XDP_DROP, "verdict {verdict} for a {}", counters::NAMES[counter as usize]);
    ensure!(d[counter as usize] == 1, "not counted {}: {d:?}", counters::NAMES[counter as usize]);
    Ok(())
}

#[test]
fn references_are_checked_taken_and_used_and_nothing_else_is_dropped() -> Result<()> {
    let mut dp = downstream()?;
    let mut maps = dp.take_rli()?;
    let sent_ago = |ms: u64| clock::now() - ms * 1_000_000;
    let reference = |key, seq, sent| udp(40000, PORT, &seal(key, seq, sent));
    let regular = udp(1234, 80, b"request");

    // Before any reference: passes, counted nowhere.
    ensure!(run(&dp, &regular)?.0 == XDP_PASS);
    let seq = 1_000;
    dropped_as(&dp, &reference(KEY, seq, sent_ago(3)), counters::EVENT_RLI_TAKEN)?;
    // Another key, a cut payload, a bit flipped: forged.
    dropped_as(&dp, &reference([1, 2], seq + 1, sent_ago(3)), counters::EVENT_RLI_FORGED)?;
    dropped_as(&dp, &udp(40000, PORT, &seal(KEY, seq + 1, sent_ago(3))[..31]), counters::EVENT_RLI_FORGED)?;
    let mut flipped = reference(KEY, seq + 1, sent_ago(3));
    let last = flipped.len() - 9;
    flipped[last] ^= 1;
    dropped_as(&dp, &flipped, counters::EVENT_RLI_FORGED)?;
    // The same reference again, one from 5 s ago (beyond max_delay), one from the future.
    dropped_as(&dp, &reference(KEY, seq, sent_ago(3)), counters::EVENT_RLI_REPLAYED)?;
    dropped_as(&dp, &reference(KEY, seq + 1, sent_ago(5000)), counters::EVENT_RLI_STALE)?;
    dropped_as(&dp, &reference(KEY, seq + 1, clock::now() + 2_000_000_000), counters::EVENT_RLI_STALE)?;

    // Two packets of the flow after the first reference, then the second (1 ms later sent, 1
    // ms of delay), then one more packet: it settles the two on the line between them.
    for _ in 0..2 {
        ensure!(run(&dp, &regular)?.0 == XDP_PASS);
    }
    dropped_as(&dp, &reference(KEY, seq + 1, sent_ago(1)), counters::EVENT_RLI_TAKEN)?;
    let (verdict, d) = run(&dp, &regular)?;
    ensure!(verdict == XDP_PASS && d[counters::EVENT_RLI_FLOW_INSERTED as usize] == 0, "{d:?}");

    let mut taken = Vec::new();
    maps.drain_taken(|t| taken.push(t));
    ensure!(taken.len() == 2, "{} references taken: {taken:?}", taken.len());
    let (first, second) = (taken[0].reference, taken[1].reference);
    ensure!((first.seq, second.seq) == (seq, seq + 1), "{taken:?}");
    // Each delay as stamped (3 ms and 1 ms), plus what the test took to run it.
    for (r, ms) in [(first, 3), (second, 1)] {
        let late = r.delay_ns - ms * 1_000_000;
        ensure!((0..50_000_000).contains(&late), "reference {} delay {} ns", r.seq, r.delay_ns);
    }
    let figures = Drain::default().read(maps.flows()?, &maps.references()?);
    ensure!(figures.len() == 1, "{figures:?}");
    let f = &figures[0];
    ensure!(f.key.dport == 80 && f.unsettled == 0, "{f:?}");
    // RLI-L: the two after the first reference at its delay, the last at the second's.
    ensure!(f.left.packets == 3, "{f:?}");
    let left = (2.0 * first.delay_ns as f64 + second.delay_ns as f64) / 3.0;
    ensure!((f.left.mean_ns.unwrap() - left).abs() < 1.0, "RLI-L {f:?}, expected {left}");
    // RLI: the two between the references, on the line between their delays.
    ensure!(f.rli.packets == 2, "{f:?}");
    let (lo, hi) = (first.delay_ns.min(second.delay_ns) as f64, first.delay_ns.max(second.delay_ns) as f64);
    let mean = f.rli.mean_ns.unwrap();
    ensure!(mean >= lo - 16.0 && mean <= hi + 16.0, "RLI {f:?} outside {lo}..{hi}");
    Ok(())
}
