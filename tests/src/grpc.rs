//! A real gRPC server and client (Debian's `python3-grpcio`, scripts in `grpc/`): unary calls,
//! many in flight on one HTTP/2 connection, each served after a fixed service time. The client
//! times every call itself, the ground truth for multiplexed RPCs.

use std::{net::SocketAddr, time::Duration};

use anyhow::Result;

use crate::{
    clients::ClientLatency,
    netns::Netns,
    servers::{python_client_latency, python_server, wait_listening, Server},
};

/// Debian's interpreter, which has `python3-grpcio`; isolated (`-I`) from the environment's
/// Python paths and the user's packages, and so from any other Python first on `PATH`.
const PYTHON: [&str; 2] = ["/usr/bin/python3", "-I"];

/// The gRPC server on `port` (IPv4 and IPv6) in `ns`, answering each call after `service`,
/// every call in flight at once.
pub fn server(ns: &Netns, port: u16, service: Duration) -> Result<Server> {
    start(ns, port, service, false)
}

/// [`server`] serving one call at a time, as a server of a single worker does: N calls in flight
/// take N service times each, and their responses leave one service time apart.
pub fn server_one_at_a_time(ns: &Netns, port: u16, service: Duration) -> Result<Server> {
    start(ns, port, service, true)
}

fn start(ns: &Netns, port: u16, service: Duration, one_at_a_time: bool) -> Result<Server> {
    let mut args = vec![port.to_string(), service.as_secs_f64().to_string()];
    if one_at_a_time {
        args.push("one-at-a-time".into());
    }
    python_server(ns, "gRPC", &PYTHON, include_str!("grpc/server.py"), |_| args, || wait_listening(ns, port))
}

/// The gRPC client in `ns`: `in_flight` calls at a time to `server` on one connection for
/// `duration`; the mean of its own per-call times.
pub fn client(ns: &Netns, server: SocketAddr, in_flight: u32, duration: Duration) -> Result<ClientLatency> {
    let (target, in_flight, secs) = (server.to_string(), in_flight.to_string(), duration.as_secs_f64().to_string());
    let out = ns.run(&[&PYTHON[..], &["-c", include_str!("grpc/client.py"), &target, &in_flight, &secs]].concat())?;
    python_client_latency("gRPC", &out)
}
