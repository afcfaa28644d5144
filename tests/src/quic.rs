//! A real QUIC server and client (aioquic, from PyPI into the venv `scripts/setup.sh` makes;
//! scripts in `quic/`): requests on streams of one connection, many in flight, each answered
//! after a fixed service time, all of it encrypted (no transport header tells a request from an
//! acknowledgement). The client times every request itself.

use std::{net::SocketAddr, time::Duration};

use anyhow::Result;

use crate::{
    clients::ClientLatency,
    netns::Netns,
    servers::{python_client_latency, python_server, wait_bound_udp, Server},
};

/// The venv's interpreter, isolated (`-I`) from the environment's Python paths.
const PYTHON: [&str; 2] = ["/opt/pirate-tests/venv/bin/python", "-I"];

/// The QUIC server on UDP `at` in `ns`, answering each request after `service` (aioquic: run
/// scripts/setup.sh).
pub fn server(ns: &Netns, at: SocketAddr, service: Duration) -> Result<Server> {
    let args = |dir: &std::path::Path| {
        let dir = dir.to_string_lossy().into_owned();
        vec![at.ip().to_string(), at.port().to_string(), service.as_secs_f64().to_string(), dir]
    };
    python_server(ns, "QUIC", &PYTHON, include_str!("quic/server.py"), args, || wait_bound_udp(ns, at.port()))
}

/// The QUIC client in `ns`: `in_flight` requests at a time to `server` on one connection for
/// `duration`; the mean of its own per-request times.
pub fn client(ns: &Netns, server: SocketAddr, in_flight: u32, duration: Duration) -> Result<ClientLatency> {
    let (host, port) = (server.ip().to_string(), server.port().to_string());
    let (in_flight, secs) = (in_flight.to_string(), duration.as_secs_f64().to_string());
    let client = include_str!("quic/client.py");
    let out = ns.run(&[&PYTHON[..], &["-c", client, &host, &port, &in_flight, &secs]].concat())?;
    python_client_latency("QUIC", &out)
}
