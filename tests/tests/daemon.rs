//! The daemon's own behaviour as an operator meets it: its JSON lines never hold up the epoch
//! loop, and a reader that goes away stops it cleanly.

use std::{
    io::{BufRead, BufReader, Read},
    net::UdpSocket,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};
use pirate_tests::testbed::{metric, workspace_binary, OnePoint, CLIENT_IP, SERVER_IP, VP_CLIENT_IF};

const LISTEN: &str = "127.0.0.1:9466";

/// pirated with 20 ms epochs and JSON lines on a pipe the test holds.
fn start(tb: &OnePoint, name: &str) -> Result<Child> {
    let file = std::env::temp_dir().join(format!("pirated-{name}-{}.toml", std::process::id()));
    std::fs::write(&file, format!("interface = \"{VP_CLIENT_IF}\"\ninstance = \"{name}\"\nepoch = \"20ms\"\n"))?;
    let bin = workspace_binary("pirated")?;
    let args =
        [bin.to_str().unwrap(), "run", "--config", file.to_str().unwrap(), "--output", "json", "--listen", LISTEN];
    let child = tb.vp.command(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    Ok(child)
}

/// 200 flows from the client, a datagram each every 10 ms, for `how_long`.
fn traffic(tb: &OnePoint, how_long: Duration) -> Result<std::thread::JoinHandle<Result<()>>> {
    let socks: Vec<UdpSocket> = (0..200)
        .map(|_| tb.client.run_in(|| UdpSocket::bind((CLIENT_IP, 0)))?.map_err(Into::into))
        .collect::<Result<_>>()?;
    Ok(std::thread::spawn(move || {
        let end = Instant::now() + how_long;
        while Instant::now() < end {
            for s in &socks {
                s.send_to(b"x", (SERVER_IP, 9005))?;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }))
}

/// Waits up to `timeout` for `child` to exit.
fn exit_within(child: &mut Child, timeout: Duration) -> Result<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() > deadline {
            child.kill()?;
            anyhow::bail!("pirated did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Nobody reads the JSON lines: the pipe fills, and epochs go on being drained, estimated and
/// published, their lines dropped and counted; SIGTERM still stops pirated at once.
#[test]
fn a_stalled_reader_never_holds_up_the_epochs() -> Result<()> {
    let tb = OnePoint::new()?;
    let mut pirated = start(&tb, "stalled")?;
    let mut stderr = BufReader::new(pirated.stderr.take().context("stderr")?);
    let mut line = String::new();
    while !line.contains("attached") {
        line.clear();
        ensure!(stderr.read_line(&mut line)? > 0, "pirated ended before attaching");
    }
    let started = Instant::now();
    traffic(&tb, Duration::from_millis(1500))?.join().unwrap()?;
    let metrics = tb.vp.run(&["curl", "-sf", &format!("http://{LISTEN}/metrics")])?;
    let elapsed = started.elapsed().as_secs_f64();
    let (epochs, dropped) =
        (metric(&metrics, "pirated_epochs_total"), metric(&metrics, "pirated_json_epochs_dropped_total"));
    eprintln!("{epochs} epochs in {elapsed:.2} s with nobody reading, {dropped} epochs of lines dropped");
    ensure!(
        epochs >= 0.5 * elapsed / 0.020,
        "{epochs} epochs of 20 ms in {elapsed:.2} s: the loop waited for the reader"
    );
    ensure!(dropped > 0.0, "nothing dropped, yet nobody read");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pirated.id() as i32, libc::SIGTERM) };
    let status = exit_within(&mut pirated, Duration::from_secs(5))?;
    ensure!(status.success(), "pirated exited with {status}");
    Ok(())
}

/// The reader of the JSON lines goes away: pirated stops, cleanly, saying why.
#[test]
fn a_closed_stdout_stops_pirated_cleanly() -> Result<()> {
    let tb = OnePoint::new()?;
    let mut pirated = start(&tb, "closed")?;
    let sender = traffic(&tb, Duration::from_secs(3))?;
    let mut stdout = BufReader::new(pirated.stdout.take().context("stdout")?);
    let mut first = String::new();
    stdout.read_line(&mut first)?;
    ensure!(first.contains("\"type\":\"flow\""), "first line: {first}");
    drop(stdout);
    let status = exit_within(&mut pirated, Duration::from_secs(5))?;
    sender.join().unwrap()?;
    let mut err = String::new();
    pirated.stderr.take().context("stderr")?.read_to_string(&mut err)?;
    ensure!(status.success(), "pirated exited with {status}: {err}");
    ensure!(err.contains("stdout was closed: stopping"), "{err}");
    Ok(())
}
