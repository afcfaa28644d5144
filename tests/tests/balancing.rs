//! The built-in forwarder `pirate_lb` behind pirated's chain on the load-balancing testbed
//! (`pirate_tests::balancing`): real clients reach a VIP, real servers behind it answer
//! directly, and the backends' own connection counts are the truth.

use std::{net::SocketAddrV4, path::PathBuf, thread, time::Duration};

use anyhow::{ensure, Result};
use pirate_tests::{
    balancing::{self, Balanced},
    clients,
    katran::counter,
    katran_server::KatranServer,
    servers,
    testbed::{metric, wait_until, Pirated},
};

const BACKENDS: usize = 4;

fn build_dir() -> PathBuf {
    std::env::temp_dir().join(format!("pirate-balancing-{}", std::process::id()))
}

/// Each backend answers HTTP on the VIP's port after `service` per request.
fn serve(tb: &Balanced, service: &[Duration]) -> Result<()> {
    for (b, &d) in tb.backends.iter().zip(service) {
        servers::think_time_http(b, balancing::VIP_PORT, &[(d, 1.0)], 7)?;
    }
    Ok(())
}

/// Static Maglev at equal weights: every new connection reaches a backend (the backends count
/// them), each real's share is about a quarter, pirated's per-real connection counters match
/// the backends' own counts exactly, and traffic to anything but the VIP passes untouched.
#[test]
fn pirate_lb_spreads_new_connections_over_the_reals() -> Result<()> {
    let tb = Balanced::new(BACKENDS, &build_dir())?;
    serve(&tb, &[Duration::from_millis(1); BACKENDS])?;
    let config = format!("epoch = \"500ms\"\n{}", balancing::lb_config(BACKENDS, "adaptive = false\n"));
    let pirated = tb.pirated(&config)?;
    let before = tb.passive_opens()?;
    let connects = clients::short_connections(&tb.client, balancing::vip(), 100.0, Duration::from_secs(4))?;
    let opened = tb.opened_since(&before)?;
    eprintln!("{} connections; the backends accepted {opened:?}", connects.len());
    ensure!(opened.iter().sum::<u64>() == connects.len() as u64, "connections lost: {opened:?}");
    // A quarter each: binomial σ ≈ 8.7 at 400 connections; 5 σ either side.
    let quarter = connects.len() as f64 / 4.0;
    for (i, n) in opened.iter().enumerate() {
        ensure!((*n as f64 - quarter).abs() < 45.0, "backend {i} took {n} of {}", connects.len());
    }
    // Anything else to the balancer's interface passes: its own address answers pings.
    tb.client.run(&["ping", "-c", "3", "-i", "0.2", "-W", "1", &balancing::LB_IP.to_string()])?;
    thread::sleep(Duration::from_millis(1200));
    let page = pirated.metrics(&tb.lb)?;
    for (i, n) in opened.iter().enumerate() {
        let label = format!(
            "pirated_lb_real_connections_total{{vip=\"{}:{}/tcp\",real=\"{}\"}}",
            balancing::VIP,
            balancing::VIP_PORT,
            balancing::backend_ip(i)
        );
        ensure!(metric(&page, &label) == *n as f64, "{label} is not the {n} backend {i} accepted");
    }
    ensure!(metric(&page, "pirated_lb_packets_total{outcome=\"unforwarded\"}") == 0.0);
    Ok(())
}

/// The controller at work with `pirate_lb`: backend 0 answers in 20 ms, the others in 1 ms. Keep-alive
/// connections reach every backend (opened until each has one); from their gaps Pirate measures
/// each real's latency, the controller moves weight off backend 0, and new connections then
/// mostly avoid it, while not one request of the established connections fails (the connection
/// table keeps each on its real while the rings change under it).
#[test]
fn weight_leaves_a_slow_real_and_no_connection_breaks() -> Result<()> {
    let tb = Balanced::new(BACKENDS, &build_dir())?;
    serve(&tb, &slow_first())?;
    let config = format!("epoch = \"500ms\"\n{}", balancing::lb_config(BACKENDS, ""));
    let pirated = tb.pirated(&config)?;
    slow_real_loses_new_connections(&tb, &pirated)
}

/// The same with Katran's own balancer forwarding, its VIP, reals and rings written by pirated.
/// Then Katran restarts: another balancer, its maps empty, takes the slot; pirated finds it and
/// gives it the VIP, reals and rings, and every new connection reaches a backend through it.
#[test]
fn katran_forwards_as_pirated_weighs() -> Result<()> {
    let tb = Balanced::new(BACKENDS, &build_dir())?;
    serve(&tb, &slow_first())?;
    let head = "epoch = \"500ms\"\n";
    let katran = tb.katran(&build_dir().join("katran"))?;
    let pirated = tb.pirated_with_katran(&katran, head, "")?;
    slow_real_loses_new_connections(&tb, &pirated)?;
    let (tx, _) = katran.counter(counter::XDP_TX)?;
    eprintln!("Katran sent {tx} packets; {}", katran.counters_summary());

    let restarted = tb.katran(&build_dir().join("katran"))?;
    restarted.register(&tb.forward(&pirated), 2)?;
    let (vip, tcp) = (SocketAddrV4::new(balancing::VIP, balancing::VIP_PORT), libc::IPPROTO_TCP as u8);
    wait_until(Duration::from_secs(10), "pirated did not give the restarted Katran its VIP", || {
        Ok(restarted.vip_num(vip, tcp)?.is_some())
    })?;
    let before = tb.passive_opens()?;
    let connects = clients::short_connections(&tb.client, balancing::vip(), 100.0, Duration::from_secs(1))?;
    let opened = tb.opened_since(&before)?;
    let (tx, _) = restarted.counter(counter::XDP_TX)?;
    eprintln!("after the restart, {} new connections went to {opened:?}; Katran sent {tx} packets", connects.len());
    ensure!(opened.iter().sum::<u64>() == connects.len() as u64, "connections lost: {opened:?}");
    ensure!(tx > 0, "the restarted Katran sent nothing: {}", restarted.counters_summary());
    Ok(())
}

/// The same with Katran's own control plane between pirated and Katran's balancer: a stand-in
/// for Katran's gRPC server (`pirate_tests::katran_server`) builds the rings from the weights
/// pirated sends it (`addVip`, then `modifyRealsForVip`), with a Maglev permutation other than
/// pirated's, so pirated must read each flow's real from Katran's ring. The server starts after
/// pirated: the calls that failed meanwhile are counted, and retried until they reach it.
#[test]
fn katran_server_takes_the_weights_over_grpc() -> Result<()> {
    let tb = Balanced::new(BACKENDS, &build_dir())?;
    serve(&tb, &slow_first())?;
    let katran = tb.katran(&build_dir().join("katran"))?;
    let listen = "127.0.0.1:50051";
    let extra = format!("katran_grpc = \"http://{listen}\"\n");
    let pirated = tb.pirated_with_katran(&katran, "epoch = \"500ms\"\n", &extra)?;
    let failures = || -> Result<f64> { Ok(metric(&pirated.metrics(&tb.lb)?, "pirated_lb_katran_grpc_failures_total")) };
    wait_until(Duration::from_secs(10), "no failed call counted with no server", || Ok(failures()? > 0.0))?;
    let server = KatranServer::start(&tb.lb, listen.parse()?, katran.clone())?;
    wait_until(Duration::from_secs(10), "no weights reached Katran's server", || {
        Ok(server.calls("modifyRealsForVip") > 0)
    })?;
    let vip = SocketAddrV4::new(balancing::VIP, balancing::VIP_PORT);
    eprintln!("{} failed calls before the server; it has {:?}", failures()?, server.weights(vip));
    slow_real_loses_new_connections(&tb, &pirated)?;
    let (adds, changes) = (server.calls("addVip"), server.calls("modifyRealsForVip"));
    eprintln!("addVip {adds}, modifyRealsForVip {changes}; weights now {:?}", server.weights(vip));
    ensure!(adds == 1 && changes >= 2, "the VIP added once and its weights moved: {adds} and {changes} calls");
    Ok(())
}

/// Backend 0 answers in 20 ms, the others in 1 ms.
fn slow_first() -> [Duration; BACKENDS] {
    let mut service = [Duration::from_millis(1); BACKENDS];
    service[0] = Duration::from_millis(20);
    service
}

/// Keep-alive connections until every backend has one, measured on from then on (more before
/// its first can be too late: pirated may already have moved the slow backend's weight, which
/// a 64-connection loop once met at [1, 27, 15, 21]); the slow backend 0's weight falls below a
/// half; new connections then reach it less than an eighth of the time; not one request of the
/// keep-alive connections fails.
fn slow_real_loses_new_connections(tb: &Balanced, pirated: &Pirated) -> Result<()> {
    let run = Duration::from_secs(8);
    let start = tb.passive_opens()?;
    let mut held = Vec::new();
    loop {
        let opened = tb.opened_since(&start)?;
        if opened.iter().all(|&n| n >= 1) {
            eprintln!("keep-alive connections per backend: {opened:?}");
            break;
        }
        ensure!(held.len() < 64, "64 connections and still a backend without one: {opened:?}");
        held.push(clients::http_keepalive(&tb.client, balancing::vip(), run)?);
    }
    let real0 = balancing::backend_ip(0).to_string();
    let moved = pirated.wait_for(Duration::from_secs(5), |v| {
        v["type"] == "real" && v["real"] == real0 && v["weight"].as_f64() < Some(0.5)
    })?;
    eprintln!("backend 0 after the move: {moved}");
    let before = tb.passive_opens()?;
    let connects = clients::short_connections(&tb.client, balancing::vip(), 100.0, Duration::from_secs(2))?;
    let opened = tb.opened_since(&before)?;
    eprintln!("{} new connections after the move went to {opened:?}", connects.len());
    ensure!(opened.iter().sum::<u64>() == connects.len() as u64, "connections lost: {opened:?}");
    ensure!(
        (opened[0] as f64) < connects.len() as f64 / 8.0,
        "backend 0 still took {} of {}",
        opened[0],
        connects.len()
    );
    let mut requests = 0;
    for (i, h) in held.into_iter().enumerate() {
        let latencies = h.join().map_err(|_| anyhow::anyhow!("a client panicked"))?;
        requests += latencies.map_err(|e| e.context(format!("keep-alive connection {i}")))?.len();
    }
    eprintln!("{requests} requests on the keep-alive connections, none failed");
    Ok(())
}
