//! The daemon's own behaviour as an operator meets it: its JSON lines never hold up the epoch
//! loop, a reader that goes away stops it cleanly, and /metrics outlives failed accepts.

use std::{
    io::{BufRead, BufReader, Read},
    net::{TcpStream, UdpSocket},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};
use pirate_tests::testbed::{exit_within, metric, workspace_binary, OnePoint, CLIENT_IP, SERVER_IP, VP_CLIENT_IF};

const LISTEN: &str = "127.0.0.1:9466";

/// pirated with 20 ms epochs and JSON lines on a pipe the test holds, run by `wrapper` (a
/// command and its arguments, or nothing).
fn start_with(tb: &OnePoint, name: &str, wrapper: &[&str]) -> Result<Child> {
    let file = std::env::temp_dir().join(format!("pirated-{name}-{}.toml", std::process::id()));
    std::fs::write(&file, format!("interface = \"{VP_CLIENT_IF}\"\ninstance = \"{name}\"\nepoch = \"20ms\"\n"))?;
    let bin = workspace_binary("pirated")?;
    let mut args = wrapper.to_vec();
    args.extend([
        bin.to_str().unwrap(),
        "run",
        "--config",
        file.to_str().unwrap(),
        "--output",
        "json",
        "--listen",
        LISTEN,
    ]);
    let child = tb.vp.command(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    Ok(child)
}

fn start(tb: &OnePoint, name: &str) -> Result<Child> {
    start_with(tb, name, &[])
}

/// Reads `child`'s log until it has attached, then keeps reading it in the background (so that
/// it never blocks on a full pipe); returns the lines read so far and later.
fn attached(child: &mut Child) -> Result<std::sync::Arc<std::sync::Mutex<Vec<String>>>> {
    let mut stderr = BufReader::new(child.stderr.take().context("stderr")?);
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    loop {
        let mut line = String::new();
        ensure!(stderr.read_line(&mut line)? > 0, "pirated ended before attaching: {:?}", log.lock().unwrap());
        let done = line.contains("attached");
        log.lock().unwrap().push(line);
        if done {
            break;
        }
    }
    let sink = log.clone();
    std::thread::spawn(move || stderr.lines().map_while(Result::ok).for_each(|l| sink.lock().unwrap().push(l)));
    Ok(log)
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

/// Nobody reads the JSON lines: the pipe fills, and epochs go on being drained, estimated and
/// published, their lines dropped and counted; SIGTERM still stops pirated at once.
#[test]
fn a_stalled_reader_never_holds_up_the_epochs() -> Result<()> {
    let tb = OnePoint::new()?;
    let mut pirated = start(&tb, "stalled")?;
    attached(&mut pirated)?;
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

/// pirated out of file descriptors (a limit of 64, 100 connections held open on /metrics): the
/// accepts that fail are logged and counted, and once the connections go, /metrics answers again.
#[test]
fn metrics_outlive_failed_accepts() -> Result<()> {
    let tb = OnePoint::new()?;
    let mut pirated = start_with(&tb, "nofile", &["prlimit", "--nofile=64:64"])?;
    let log = attached(&mut pirated)?;
    let _stdout = pirated.stdout.take();
    // From many addresses: /metrics holds only a few connections from each, and closes the
    // rest at once; these are to run it out of descriptors.
    let connect = |from: u8| -> std::io::Result<TcpStream> {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        socket.bind(&std::net::SocketAddr::from(([127, 0, 0, from], 0)).into())?;
        socket.connect(&LISTEN.parse::<std::net::SocketAddr>().unwrap().into())?;
        Ok(socket.into())
    };
    let held: Vec<TcpStream> =
        (0..100u8).map(|i| tb.vp.run_in(|| connect(1 + i / 4))?.map_err(Into::into)).collect::<Result<_>>()?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !log.lock().unwrap().iter().any(|l| l.contains("accepting a metrics connection")) {
        ensure!(Instant::now() < deadline, "no failed accept logged: {:?}", log.lock().unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        match tb.vp.run(&["curl", "-sf", "--max-time", "1", &format!("http://{LISTEN}/metrics")]) {
            Ok(text) => break text,
            Err(e) => ensure!(Instant::now() < deadline, "/metrics never answered again: {e:#}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let errors = metric(&metrics, "pirated_metrics_accept_errors_total");
    eprintln!("{errors} failed accepts counted; /metrics answers again");
    ensure!(errors > 0.0, "failed accepts were logged but not counted");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pirated.id() as i32, libc::SIGTERM) };
    ensure!(exit_within(&mut pirated, Duration::from_secs(5))?.success(), "pirated failed to stop");
    Ok(())
}
