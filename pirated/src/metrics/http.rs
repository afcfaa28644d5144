//! `GET /metrics` on hyper: the exposition as last encoded (each epoch and each segment
//! interval, never per request nor under the metrics' lock), in OpenMetrics for those who ask
//! for it and Prometheus's text format otherwise. What faces the network is bounded: a request's
//! head must arrive within `HEAD_WITHIN` however slowly it trickles, a connection is served
//! within `SERVE_WITHIN` however slowly it reads, one request a connection, and at most
//! `MAX_CONNECTIONS` at once, `MAX_PER_SOURCE` from one address: beyond, the oldest is closed for
//! the newest, and counted.

use std::{
    convert::Infallible,
    sync::{Arc, RwLock},
    time::Duration,
};

use http_body_util::Full;
use hyper::{
    body::{Bytes, Incoming},
    header::{ACCEPT, CONTENT_TYPE},
    server::conn::http1,
    service::service_fn,
    Method, Request, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpListener,
};
use tracing::{debug, warn};

use crate::limit::Held;

/// How long a client has to send a request's head.
pub const HEAD_WITHIN: Duration = Duration::from_secs(5);
/// How long a connection is served in all (reading its request, writing the exposition).
pub const SERVE_WITHIN: Duration = Duration::from_secs(10);
/// Connections served at once; beyond, the oldest is closed for the newest.
pub const MAX_CONNECTIONS: usize = 64;
/// Connections from one address served at once.
pub const MAX_PER_SOURCE: usize = 8;

/// The exposition as last encoded, in both formats, for scrapes to take without encoding.
#[derive(Clone, Default)]
pub struct Exposed(Arc<RwLock<Arc<Texts>>>);

#[derive(Default)]
pub struct Texts {
    openmetrics: Bytes,
    prometheus: Bytes,
}

impl Exposed {
    /// Replaces the exposition with `openmetrics` (and its Prometheus text rendering).
    pub fn set(&self, openmetrics: String) {
        let prometheus = prometheus_text(&openmetrics);
        let texts = Arc::new(Texts { openmetrics: openmetrics.into(), prometheus: prometheus.into() });
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = texts;
    }

    fn get(&self) -> Arc<Texts> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// What the server needs of the metrics: the exposition, and the counters of what it turned
/// away.
#[derive(Clone)]
pub struct Server {
    pub exposed: Exposed,
    /// Accepts that failed (out of descriptors, a connection reset before it was taken).
    pub accept_errors: Counter,
    /// Connections closed for newer ones, past `MAX_CONNECTIONS` or `MAX_PER_SOURCE`.
    pub refused: Counter,
}

/// Serves `GET /metrics` on `listener` until the task is dropped. A failed accept (out of file
/// descriptors, a connection reset before it was taken) leaves the listener usable: it is logged,
/// counted, and the server goes on after a pause.
pub async fn serve_on(listener: TcpListener, server: Server) {
    let mut held = Held::new(MAX_CONNECTIONS, MAX_PER_SOURCE);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                warn!("accepting a metrics connection: {e}");
                server.accept_errors.inc();
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let exposed = server.exposed.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = serve_connection(stream, exposed).await {
                debug!(%peer, "metrics connection: {e}");
            }
        });
        if held.admit(peer.ip(), task.abort_handle()) {
            debug!(%peer, "metrics: too many connections, closed the oldest for this one");
            server.refused.inc();
        }
    }
}

/// Serves one connection's one request, within `HEAD_WITHIN` for its head and `SERVE_WITHIN`
/// in all.
pub async fn serve_connection<I>(io: I, exposed: Exposed) -> Result<(), String>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_WITHIN)
        .keep_alive(false)
        .serve_connection(TokioIo::new(io), service_fn(move |req| respond(req, exposed.clone())));
    match tokio::time::timeout(SERVE_WITHIN, conn).await {
        Ok(served) => served.map_err(|e| e.to_string()),
        Err(_) => Err(format!("not served within {SERVE_WITHIN:?}, closed")),
    }
}

/// The exposition for `GET /metrics` (any query), in the format the client accepts; 404 else.
async fn respond(req: Request<Incoming>, exposed: Exposed) -> Result<Response<Full<Bytes>>, Infallible> {
    let response = |status, ctype: &'static str, body: Bytes| {
        let mut r = Response::new(Full::new(body));
        *r.status_mut() = status;
        r.headers_mut().insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static(ctype));
        r
    };
    if req.method() != Method::GET || req.uri().path() != "/metrics" {
        return Ok(response(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"try GET /metrics\n"),
        ));
    }
    let openmetrics = req
        .headers()
        .get_all(ACCEPT)
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.contains("application/openmetrics-text")));
    let texts = exposed.get();
    Ok(match openmetrics {
        true => response(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            texts.openmetrics.clone(),
        ),
        false => response(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", texts.prometheus.clone()),
    })
}

/// An OpenMetrics exposition in Prometheus's text format 0.0.4, for clients that did not ask for
/// OpenMetrics (curl, `promtool check metrics`, older scrapers): a counter family's HELP and TYPE
/// name its `_total` samples, an unknown type is untyped, and there is no `# UNIT` or `# EOF`.
fn prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> =
        openmetrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        let mut words = line.splitn(4, ' ');
        let (hash, kind, name, rest) = (words.next(), words.next(), words.next(), words.next().unwrap_or(""));
        match (hash, kind, name) {
            (Some("#"), Some("TYPE"), Some(name)) if rest == "counter" => {
                out.push_str(&format!("# TYPE {name}_total counter\n"))
            }
            (Some("#"), Some("TYPE"), Some(name)) if rest == "unknown" => {
                out.push_str(&format!("# TYPE {name} untyped\n"))
            }
            (Some("#"), Some("HELP"), Some(name)) if counters.contains(name) => {
                out.push_str(&format!("# HELP {name}_total {rest}\n"))
            }
            (Some("#"), Some("UNIT" | "EOF"), _) => {}
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::{net::SocketAddr, time::Instant};

    use prometheus_client::{encoding::text::encode, metrics::gauge::Gauge, registry::Registry};
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::{TcpSocket, TcpStream},
    };

    use super::*;

    #[test]
    fn the_classic_text_names_counters_by_their_samples() {
        let mut registry = Registry::with_prefix("pirated");
        let (counter, gauge) = (Counter::<u64>::default(), Gauge::<i64>::default());
        registry.register("requests", "Requests \"offered\"", counter.clone());
        registry.register("held", "Held now", gauge.clone());
        counter.inc_by(3);
        gauge.set(2);
        let mut openmetrics = String::new();
        encode(&mut openmetrics, &registry).unwrap();
        assert_eq!(
            prometheus_text(&openmetrics),
            "# HELP pirated_requests_total Requests \"offered\".\n# TYPE pirated_requests_total counter\n\
             pirated_requests_total 3\n# HELP pirated_held Held now.\n# TYPE pirated_held gauge\npirated_held 2\n"
        );
    }

    /// A server on a port of its own, serving a one-counter exposition.
    async fn server() -> (SocketAddr, Server) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server =
            Server { exposed: Exposed::default(), accept_errors: Counter::default(), refused: Counter::default() };
        server.exposed.set("# TYPE pirated_requests counter\npirated_requests_total 3\n# EOF\n".into());
        tokio::spawn(serve_on(listener, server.clone()));
        (addr, server)
    }

    /// A connection to `addr` from address `from`.
    async fn connect(addr: SocketAddr, from: [u8; 4]) -> TcpStream {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((from, 0))).unwrap();
        socket.connect(addr).await.unwrap()
    }

    /// `request` sent on `conn`, and all the server answered before it closed.
    async fn exchange(mut conn: TcpStream, request: &str) -> String {
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        let _ = conn.read_to_string(&mut out).await;
        out
    }

    #[tokio::test]
    async fn a_scrape_gets_the_format_it_asks_for() {
        let (addr, _) = server().await;
        let local = [127, 0, 0, 1];
        let plain = exchange(connect(addr, local).await, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(plain.starts_with("HTTP/1.1 200") && plain.contains("text/plain; version=0.0.4"), "{plain}");
        assert!(plain.contains("pirated_requests_total 3") && !plain.contains("# EOF"), "{plain}");
        let om =
            "GET /metrics?x=1 HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n\r\n";
        let om = exchange(connect(addr, local).await, om).await;
        assert!(om.contains("application/openmetrics-text") && om.contains("# EOF"), "{om}");
        for other in ["GET / HTTP/1.1\r\n\r\n", "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n"] {
            let answer = exchange(connect(addr, local).await, other).await;
            assert!(answer.starts_with("HTTP/1.1 404"), "{other:?}: {answer}");
        }
    }

    /// A head sent a byte at a time is cut off when `HEAD_WITHIN` has passed since the
    /// connection came, however often a byte arrives (each byte used to restart the wait).
    #[tokio::test]
    async fn a_request_head_trickled_in_is_cut_off() {
        let (addr, _) = server().await;
        let mut conn = connect(addr, [127, 0, 0, 1]).await;
        let started = Instant::now();
        conn.write_all(b"GET /metrics HTTP/1.1\r\n").await.unwrap();
        let mut closed = false;
        while started.elapsed() < HEAD_WITHIN * 2 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if conn.write_all(b"X").await.is_err() {
                closed = true;
                break;
            }
            let mut byte = [0u8; 1];
            if let Ok(read) = tokio::time::timeout(Duration::from_millis(1), conn.read(&mut byte)).await {
                closed = matches!(read, Ok(0) | Err(_)) || closed;
                if closed {
                    break;
                }
            }
        }
        assert!(closed, "still open after {:?}", started.elapsed());
        assert!(started.elapsed() < HEAD_WITHIN + Duration::from_secs(2), "closed after {:?}", started.elapsed());
    }

    /// Past `MAX_PER_SOURCE` idle connections from one address, the next from it is served and
    /// the oldest idle one closed for it (and counted); another address is served too. (One
    /// address held every connection, and the scraper waited.)
    #[tokio::test]
    async fn one_address_cannot_take_every_connection() {
        let (addr, server) = server().await;
        let mut idle = Vec::new();
        for _ in 0..MAX_PER_SOURCE {
            idle.push(connect(addr, [127, 0, 0, 1]).await);
        }
        let served = exchange(connect(addr, [127, 0, 0, 1]).await, "GET /metrics HTTP/1.1\r\n\r\n").await;
        assert!(served.starts_with("HTTP/1.1 200"), "not served past the per-source limit: {served:?}");
        let mut oldest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(1), idle[0].read_to_end(&mut oldest)).await;
        assert!(closed.is_ok(), "the oldest idle connection was not closed");
        let served = exchange(connect(addr, [127, 0, 0, 2]).await, "GET /metrics HTTP/1.1\r\n\r\n").await;
        assert!(served.starts_with("HTTP/1.1 200"), "{served}");
        assert_eq!(server.refused.get(), 1);
    }
}
