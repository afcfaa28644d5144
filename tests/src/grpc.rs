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

/// The gRPC server on `port` (IPv4 and IPv6) in `ns`, answering each call after `service`.
pub fn server(ns: &Netns, port: u16, service: Duration) -> Result<Server> {
    let args = |_: &std::path::Path| vec![port.to_string(), service.as_secs_f64().to_string()];
    python_server(ns, "gRPC", &PYTHON, include_str!("grpc/server.py"), args, || wait_listening(ns, port))
}

/// The gRPC client in `ns`: `in_flight` calls at a time to `server` on one connection for
/// `duration`; the mean of its own per-call times.
pub fn client(ns: &Netns, server: SocketAddr, in_flight: u32, duration: Duration) -> Result<ClientLatency> {
    let (target, in_flight, secs) = (server.to_string(), in_flight.to_string(), duration.as_secs_f64().to_string());
    let out = ns.run(&[&PYTHON[..], &["-c", include_str!("grpc/client.py"), &target, &in_flight, &secs]].concat())?;
    python_client_latency("gRPC", &out)
}
