//! The case matrix and one testbed run per case. Each case gets its own testbed, so that one
//! case's links, servers and leftover connections cannot disturb the next.

use std::{
    net::{IpAddr, SocketAddr, TcpStream},
    path::Path,
    time::Duration,
};

use anyhow::{Context, Result};
use pirate_tests::{
    capture::Capture,
    clients::{dnsperf, h2load, redis_benchmark, wrk, ClientLatency},
    grpc,
    linkem::{EmuLink, LinkSpec},
    quic,
    servers::{nginx, nginx_h2, nginx_h2_proxy, redis, think_time_http, unbound, WEB_FILES},
    testbed::{Links, OnePoint, Pirated, IDLE_FLOOR, SERVER_IP, SERVER_IP6, VP_CLIENT_IF},
    webclient::{self, WebRun},
};
use pirated::capture::read_all;
use serde_json::Value;

/// The quantiles the web client's truth and pirated both report.
const QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];
/// Where `think_time_http` listens, on its own or behind nginx.
const THINK_TIME_PORT: u16 = 8080;
const GRPC_PORT: u16 = 50051;
const QUIC_PORT: u16 = 443;
/// The service times of the multiplexed rows (HTTP/2 behind a proxy, gRPC, HTTP/3), ms: each
/// row's server takes one of them per request, on top of the return path's delay.
const SERVICE_MS: [u64; 3] = [2, 5, 20];
/// The return path's delays of the multiplexed rows, µs: none (a plain veth, a round trip of
/// tens of µs: the data centre, service time dominant), 0.2, 1 and 5 ms.
const RETURN_US: [Option<u64>; 4] = [None, Some(200), Some(1000), Some(5000)];

#[derive(Clone, Copy)]
enum Server {
    /// nginx serving [`WEB_FILES`] over HTTP/1.1, or over h2c only.
    Nginx {
        http2: bool,
    },
    /// nginx speaking HTTP/2 (h2c, or over TLS) in front of `think_time_http`, which takes
    /// `service_ms` per request.
    H2Proxy {
        tls: bool,
        service_ms: u64,
    },
    Redis,
    /// `think_time_http` on its own, service times (ms, weight) drawn per request.
    ThinkTime(&'static [(u64, f64)]),
    /// The gRPC server, `service_ms` per call, every call at once or `one_at_a_time`.
    Grpc {
        service_ms: u64,
        one_at_a_time: bool,
    },
    /// The QUIC (HTTP/3-like, aioquic) server, `service_ms` per request.
    Quic {
        service_ms: u64,
    },
    /// unbound, answering one name from its own zone.
    Unbound,
}

#[derive(Clone, Copy)]
enum Client {
    /// `webclient` on `conns` connections: the web-like tree (a page, then up to four objects
    /// pipelined) or one `small` request in flight.
    Web {
        conns: u64,
        web_like: bool,
    },
    H2load {
        streams: u32,
    },
    RedisBenchmark {
        pipeline: u32,
    },
    Wrk {
        conns: u32,
    },
    /// The gRPC client, `in_flight` unary calls at a time on one connection.
    Grpc {
        in_flight: u32,
    },
    /// The QUIC client, `in_flight` requests at a time on one connection.
    Quic {
        in_flight: u32,
    },
    /// dnsperf, `rate` queries a second on one socket, open loop.
    Dnsperf {
        rate: u32,
    },
}

pub struct Case {
    pub name: String,
    server: Server,
    client: Client,
    /// Added on the return path (server→client); none: a plain veth, no emulator.
    return_delay: Option<Duration>,
    /// Impairments client→vp, before pirated sees the packets.
    client_side: Option<&'static str>,
    /// Impairments vp→server, after pirated saw the packets.
    server_side: Option<&'static str>,
    ipv6: bool,
}

/// What a client measured itself: the mean and, where it has its own per-batch timings,
/// quantiles (q, seconds) and the timings themselves (seconds, ascending).
pub struct Truth {
    pub mean: f64,
    pub quantiles: Vec<(f64, f64)>,
    pub latencies: Vec<f64>,
}

/// A finished run: the truth, pirated's JSON lines, and the server (addr:port as pirated prints
/// it) to read them for; with a capture kept, the cycle of the busiest connection's requests
/// ([`cycle`](crate::cycle)).
pub struct Outcome {
    pub truth: Truth,
    pub lines: Vec<Value>,
    pub server: String,
    pub cycle: Option<crate::cycle::Cycle>,
}

pub fn all() -> Vec<Case> {
    let nginx = Server::Nginx { http2: false };
    let one = Client::Web { conns: 1, web_like: false };
    let case = |name: String, server, client, delay_ms: Option<u64>| Case {
        name,
        server,
        client,
        return_delay: delay_ms.map(Duration::from_millis),
        client_side: None,
        server_side: None,
        ipv6: false,
    };
    let mut cases = Vec::new();
    for d in [1, 5, 20] {
        cases.push(case(format!("steady {d} ms, web 1 in flight"), nginx, one, Some(d)));
    }
    cases.push(case(
        "service 2/5/10/20 ms, web 1 in flight".into(),
        Server::ThinkTime(&[(2, 0.45), (5, 0.3), (10, 0.17), (20, 0.08)]),
        one,
        None,
    ));
    for streams in [1, 4, 16] {
        let name = format!("h2c 1 conn × {streams} streams, 5 ms, h2load");
        cases.push(case(name, Server::Nginx { http2: true }, Client::H2load { streams }, Some(5)));
    }
    cases.extend(multiplexed());
    for delay_ms in [None, Some(5)] {
        let name = format!("DNS 1 000 queries/s on one socket, {} ms, dnsperf", delay_ms.unwrap_or(0));
        cases.push(case(name, Server::Unbound, Client::Dnsperf { rate: 1000 }, delay_ms));
    }
    for pipeline in [4, 16] {
        let name = format!("redis -P {pipeline}, 5 ms, redis-benchmark");
        cases.push(case(name, Server::Redis, Client::RedisBenchmark { pipeline }, Some(5)));
    }
    for conns in [4, 64] {
        cases.push(case(format!("{conns} conns, 5 ms, wrk"), nginx, Client::Wrk { conns }, Some(5)));
    }
    cases.push(Case {
        client_side: Some("delay=1ms,loss=0.01,reorder=0.25"),
        ..case(
            "1 % loss + 25 % reorder, 4 ms, web-like 8 conns".into(),
            nginx,
            Client::Web { conns: 8, web_like: true },
            Some(4),
        )
    });
    cases.push(Case {
        server_side: Some("loss=0.01"),
        ..case(
            "1 % loss after the vp, 4 ms, web-like 8 conns".into(),
            nginx,
            Client::Web { conns: 8, web_like: true },
            Some(4),
        )
    });
    cases.push(Case { ipv6: true, ..case("IPv6 steady 5 ms, web 1 in flight".into(), nginx, one, Some(5)) });
    cases
}

/// The multiplexed rows: HTTP/2 (h2c and over TLS, h2load), gRPC (grpcio) and HTTP/3-like
/// requests over QUIC (aioquic), by requests in flight on one connection, return path and
/// service time.
fn multiplexed() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut push = |what: String, server, client, return_us: Option<u64>, service_ms: u64, tool: &str| {
        let rtt = return_us.map_or("0".into(), |us| format!("{}", us as f64 / 1000.0));
        cases.push(Case {
            name: format!("{what}, {rtt} ms + {service_ms} ms service, {tool}"),
            server,
            client,
            return_delay: return_us.map(Duration::from_micros),
            client_side: None,
            server_side: None,
            ipv6: false,
        });
    };
    for return_us in RETURN_US {
        for service_ms in SERVICE_MS {
            for (tls, proto) in [(false, "h2c"), (true, "h2-TLS")] {
                for streams in [1, 2, 4, 8, 16, 100] {
                    let (server, client) = (Server::H2Proxy { tls, service_ms }, Client::H2load { streams });
                    push(
                        format!("{proto} 1 conn × {streams} streams"),
                        server,
                        client,
                        return_us,
                        service_ms,
                        "h2load",
                    );
                }
            }
            for in_flight in [1, 2, 8, 16, 64] {
                let (server, client) = (Server::Grpc { service_ms, one_at_a_time: false }, Client::Grpc { in_flight });
                push(
                    format!("gRPC 1 conn × {in_flight} unary in flight"),
                    server,
                    client,
                    return_us,
                    service_ms,
                    "grpcio",
                );
            }
            // A server of one worker: 8 calls in flight request as one call of a server 8 times
            // faster would.
            let (server, client) = (Server::Grpc { service_ms, one_at_a_time: true }, Client::Grpc { in_flight: 8 });
            push(
                "gRPC 1 conn × 8 unary in flight, one at a time".into(),
                server,
                client,
                return_us,
                service_ms,
                "grpcio",
            );
            for in_flight in [1, 4] {
                let (server, client) = (Server::Quic { service_ms }, Client::Quic { in_flight });
                push(
                    format!("HTTP/3 1 conn × {in_flight} in flight"),
                    server,
                    client,
                    return_us,
                    service_ms,
                    "aioquic",
                );
            }
        }
    }
    cases
}

impl Case {
    /// Builds the testbed, starts the server, the emulators and pirated, drives the client for
    /// `secs` seconds and stops pirated (run with `config`'s extra lines of TOML); keeps the
    /// vantage point's capture of the client side's packets at `pcap`.
    pub fn run(&self, secs: u64, config: &str, pcap: Option<&Path>) -> Result<Outcome> {
        let tb = OnePoint::with(Links {
            return_path: self.return_delay.is_some(),
            client_side: self.client_side.is_some(),
            server_side: self.server_side.is_some(),
            span: false,
        })?;
        let port = match self.server {
            Server::Nginx { .. } | Server::H2Proxy { tls: false, .. } => 80,
            Server::H2Proxy { tls: true, .. } => 443,
            Server::Redis => 6379,
            Server::ThinkTime(_) => THINK_TIME_PORT,
            Server::Grpc { .. } => GRPC_PORT,
            Server::Quic { .. } => QUIC_PORT,
            Server::Unbound => 53,
        };
        let ip: IpAddr = if self.ipv6 { SERVER_IP6 } else { SERVER_IP }.parse()?;
        let addr = SocketAddr::new(ip, port);
        let _server = match self.server {
            Server::Nginx { http2: false } => Some(nginx(&tb.server, WEB_FILES)?),
            Server::Nginx { http2: true } => Some(nginx_h2(&tb.server, WEB_FILES)?),
            Server::H2Proxy { tls, service_ms } => {
                think_time_http(&tb.server, THINK_TIME_PORT, &[(Duration::from_millis(service_ms), 1.0)], 1)?;
                Some(nginx_h2_proxy(&tb.server, tls, THINK_TIME_PORT)?)
            }
            Server::Redis => Some(redis(&tb.server)?),
            Server::Unbound => Some(unbound(&tb.server)?),
            Server::ThinkTime(service) => {
                let service: Vec<_> = service.iter().map(|&(ms, w)| (Duration::from_millis(ms), w)).collect();
                think_time_http(&tb.server, port, &service, 1)?;
                None
            }
            Server::Grpc { service_ms, one_at_a_time: false } => {
                Some(grpc::server(&tb.server, port, Duration::from_millis(service_ms))?)
            }
            Server::Grpc { service_ms, one_at_a_time: true } => {
                Some(grpc::server_one_at_a_time(&tb.server, port, Duration::from_millis(service_ms))?)
            }
            Server::Quic { service_ms } => Some(quic::server(&tb.server, addr, Duration::from_millis(service_ms))?),
        };
        // Emulators run until dropped, after pirated has stopped.
        let _return = match (self.return_delay, &tb.return_path) {
            (Some(delay), Some(link)) => Some(link.start(&LinkSpec::delay(delay), &LinkSpec::default(), 7)?),
            _ => None,
        };
        let side = |spec: Option<&str>, link: &Option<EmuLink>, seed| match (spec, link) {
            (Some(spec), Some(link)) => link.start(&spec.parse()?, &LinkSpec::default(), seed).map(Some),
            _ => Ok(None),
        };
        let _client_side = side(self.client_side, &tb.client_side, 11)?;
        let _server_side = side(self.server_side, &tb.server_side, 13)?;
        // One epoch longer than the run: pirated emits it, partial, when stopped, so the mean and
        // the quantiles cover the whole run.
        let mut pirated = Pirated::start(&tb.vp, VP_CLIENT_IF, &format!("epoch = \"{}s\"\n{config}", secs + 10))?;
        let mut capture = pcap.map(|_| Capture::start(&tb.vp, VP_CLIENT_IF, &["-Q", "in"])).transpose()?;
        let duration = Duration::from_secs(secs);
        let truth = match self.client {
            Client::Web { conns, web_like } => web(&tb, addr, conns, web_like, duration)?,
            Client::H2load { streams } => {
                let scheme = if matches!(self.server, Server::H2Proxy { tls: true, .. }) { "https" } else { "http" };
                h2load(&tb.client, &format!("{scheme}://{addr}/small"), streams, duration)?.into()
            }
            Client::RedisBenchmark { pipeline } => {
                // About `secs` of traffic: one pipeline per response delay.
                let batches = secs * 1000 / self.return_delay.map_or(1, |d| d.as_millis() as u64).max(1);
                redis_benchmark(&tb.client, &ip.to_string(), 1, (batches * pipeline as u64) as u32, pipeline)?.into()
            }
            Client::Wrk { conns } => wrk(&tb.client, &format!("http://{addr}/small"), conns, duration)?.into(),
            Client::Grpc { in_flight } => grpc::client(&tb.client, addr, in_flight, duration)?.into(),
            Client::Quic { in_flight } => quic::client(&tb.client, addr, in_flight, duration)?.into(),
            Client::Dnsperf { rate } => dnsperf(&tb.client, &ip.to_string(), rate, duration)?.into(),
        };
        let lines = pirated.stop()?;
        let mut cycle = None;
        if let (Some(capture), Some(to)) = (capture.as_mut(), pcap) {
            capture.stop()?;
            std::fs::copy(capture.path(), to).with_context(|| format!("keeping the capture as {}", to.display()))?;
            cycle = crate::cycle::of(&read_all(to)?, addr);
        }
        Ok(Outcome { truth, lines, server: addr.to_string(), cycle })
    }
}

impl From<ClientLatency> for Truth {
    fn from(c: ClientLatency) -> Truth {
        Truth { mean: c.mean, quantiles: Vec::new(), latencies: Vec::new() }
    }
}

/// Runs `conns` web clients at once; the truth pools their batches below [`IDLE_FLOOR`], so its mean
/// is the batch-weighted mean over connections and its quantiles are over all batches, as
/// pirated's per-server figures are.
fn web(tb: &OnePoint, addr: SocketAddr, conns: u64, web_like: bool, duration: Duration) -> Result<Truth> {
    let (page, objects): (&str, &[&str]) = if web_like { ("page", &["a", "b", "c", "d"]) } else { ("small", &[]) };
    let host = addr.to_string();
    let handles: Vec<_> = (0..conns)
        .map(|seed| {
            let stream =
                tb.client.run_in(|| TcpStream::connect(addr))?.with_context(|| format!("connecting to {addr}"))?;
            let host = host.clone();
            Ok(std::thread::spawn(move || webclient::run(stream, &host, page, objects, duration, seed)))
        })
        .collect::<Result<_>>()?;
    let mut pooled = WebRun { local: addr, batches: Vec::new(), requests: 0 };
    for handle in handles {
        let run = handle.join().expect("web client panicked")?;
        pooled.batches.extend(run.batches.into_iter().filter(|b| b.1 < IDLE_FLOOR));
        pooled.requests += run.requests;
    }
    let mut latencies: Vec<f64> = pooled.batches.iter().map(|b| b.1.as_secs_f64()).collect();
    latencies.sort_by(f64::total_cmp);
    Ok(Truth {
        mean: pooled.mean_batch_latency(Duration::MAX).0,
        quantiles: QUANTILES.iter().map(|&q| (q, pooled.latency_quantile(q))).collect(),
        latencies,
    })
}
