//! The Prometheus registry and its HTTP exposition (`GET /metrics`), with the datapath-wide
//! figures (packet outcomes, the chain's end, the epoch loop); each capability registers and
//! publishes its own families (`pirate::metrics`).

use std::{sync::Arc, time::Duration};

use prometheus_client::{
    encoding::{text::encode, EncodeLabelSet},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{exponential_buckets, Histogram},
    },
    registry::Registry,
};
use std::sync::atomic::AtomicU64;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};
use tracing::{debug, warn};

use pirate_common::counters;

use crate::{
    config::MetricsConfig,
    fridge::{self, report::FridgeReport},
    lb::{self, balancer::LbEpoch},
    pirate::{self, report::EpochReport},
    segment,
    source::Kernel,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pirate: pirate::metrics::Metrics,
    fridge: fridge::metrics::Metrics,
    lb: lb::metrics::Metrics,
    /// The segment's families, which its own task publishes.
    pub segment: segment::metrics::Metrics,
    last_epoch: Gauge<f64, AtomicU64>,
    tail_call_misses: Counter,
    packets: Family<OutcomeLabel, Counter>,
    lb_packets: Family<OutcomeLabel, Counter>,
    epochs: Counter,
    epoch_seconds: Histogram,
    json_dropped: Counter,
    accept_errors: Counter,
    /// Kernel counters are absolute; the Prometheus counters advance by the difference.
    last_kernel: [u64; counters::COUNT as usize],
}

impl Metrics {
    pub fn new(config: &MetricsConfig) -> Metrics {
        let mut registry = Registry::with_prefix("pirated");
        let pirate = pirate::metrics::Metrics::register(&mut registry, config.max_servers, config.idle_epochs);
        let fridge = fridge::metrics::Metrics::register(&mut registry);
        let lb = lb::metrics::Metrics::register(&mut registry);
        let segment = segment::metrics::Metrics::register(&mut registry);
        let m = Metrics {
            pirate,
            fridge,
            lb,
            segment,
            last_epoch: Gauge::default(),
            tail_call_misses: Counter::default(),
            packets: Family::default(),
            lb_packets: Family::default(),
            epochs: Counter::default(),
            epoch_seconds: Histogram::new(exponential_buckets(100e-6, 2.0, 16)),
            json_dropped: Counter::default(),
            accept_errors: Counter::default(),
            last_kernel: [0; counters::COUNT as usize],
            registry: Registry::default(),
        };
        registry.register(
            "last_epoch_timestamp_seconds",
            "When the last epoch was published (Unix time)",
            m.last_epoch.clone(),
        );
        registry.register(
            "tail_call_misses",
            "Packets that reached the end of the chain with no forwarder in FORWARD to take them (passed)",
            m.tail_call_misses.clone(),
        );
        registry.register("packets", "Packets seen by the XDP chain, by outcome", m.packets.clone());
        registry.register(
            "lb_packets",
            "Packets to a VIP by what the forwarder did: sent from XDP (forwarded), encapsulated and left to the kernel to \
             route (routed), or passed unchanged (unforwarded: no real, a tagged frame)",
            m.lb_packets.clone(),
        );
        registry.register("epochs", "Epochs processed", m.epochs.clone());
        registry.register(
            "epoch_processing_seconds",
            "Time to drain, estimate and publish one epoch",
            m.epoch_seconds.clone(),
        );
        registry.register(
            "json_epochs_dropped",
            "Epochs whose JSON lines were dropped because stdout's reader was epochs behind",
            m.json_dropped.clone(),
        );
        registry.register(
            "metrics_accept_errors",
            "Connections to /metrics that could not be accepted (out of file descriptors, reset early)",
            m.accept_errors.clone(),
        );
        Metrics { registry, ..m }
    }

    pub fn json_epoch_dropped(&self) {
        self.json_dropped.inc();
    }

    /// Publishes one epoch: per-label gauges are replaced, counters advance.
    pub fn publish(
        &mut self,
        report: &EpochReport,
        fridge: Option<&FridgeReport>,
        lb: Option<&LbEpoch>,
        kernel: &Kernel,
    ) {
        let now = &kernel.counters;
        let delta: [u64; counters::COUNT as usize] =
            std::array::from_fn(|i| now[i].saturating_sub(self.last_kernel[i]));
        self.pirate.publish(report, kernel.tracked, now, &delta);
        if let Some(f) = fridge {
            self.fridge.publish(f, &delta);
        }
        if let Some(lb) = lb {
            self.lb.publish(lb);
        }
        for (d, name) in delta.iter().zip(counters::NAMES).take(counters::OUTCOMES as usize) {
            self.packets.get_or_create(&OutcomeLabel { outcome: name }).inc_by(*d);
        }
        self.tail_call_misses.inc_by(delta[counters::EVENT_NO_TAIL_CALL as usize]);
        for (event, name) in [
            (counters::EVENT_LB_FORWARDED, "forwarded"),
            (counters::EVENT_LB_ROUTED, "routed"),
            (counters::EVENT_LB_UNFORWARDED, "unforwarded"),
        ] {
            self.lb_packets.get_or_create(&OutcomeLabel { outcome: name }).inc_by(delta[event as usize]);
        }
        let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        self.last_epoch.set(wall.as_secs_f64());
        self.last_kernel = *now;
        self.epochs.inc();
    }

    pub fn observe_epoch_time(&self, d: Duration) {
        self.epoch_seconds.observe(d.as_secs_f64());
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// Serves `GET /metrics` on `listener` until the task is dropped. A failed accept (out of file
/// descriptors, a connection reset before it was taken) leaves the listener usable: it is logged,
/// counted, and the server goes on after a pause.
pub async fn serve_on(listener: TcpListener, metrics: Arc<std::sync::Mutex<Metrics>>) {
    loop {
        let (mut conn, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                warn!("accepting a metrics connection: {e}");
                metrics.lock().unwrap().accept_errors.inc();
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            let mut len = 0;
            // Read the request head (bounded); the body, if any, is ignored.
            while !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") && len < buf.len() {
                match tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf[len..])).await {
                    Ok(Ok(0)) | Err(_) => return,
                    Ok(Ok(n)) => len += n,
                    Ok(Err(e)) => return debug!(%peer, "metrics connection: {e}"),
                }
            }
            let head = String::from_utf8_lossy(&buf[..len]);
            let target = head.split_whitespace().nth(1).unwrap_or("");
            let (status, ctype, body) =
                if head.starts_with("GET ") && (target == "/metrics" || target.starts_with("/metrics?")) {
                    let body = metrics.lock().unwrap().encode();
                    if accepts_openmetrics(&head) {
                        ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", body)
                    } else {
                        ("200 OK", "text/plain; version=0.0.4; charset=utf-8", prometheus_text(&body))
                    }
                } else {
                    ("404 Not Found", "text/plain; charset=utf-8", "try GET /metrics\n".to_string())
                };
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            if let Err(e) = conn.write_all(resp.as_bytes()).await {
                warn!(%peer, "metrics response: {e}");
            }
        });
    }
}

/// Whether a request's `Accept` header offers OpenMetrics (as Prometheus's scrapes do).
fn accepts_openmetrics(head: &str) -> bool {
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .any(|(name, value)| name.eq_ignore_ascii_case("accept") && value.contains("application/openmetrics-text"))
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

    #[test]
    fn openmetrics_goes_to_those_who_ask_for_it() {
        let prometheus = "GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n";
        assert!(accepts_openmetrics(prometheus));
        assert!(!accepts_openmetrics("GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n"));
        assert!(!accepts_openmetrics("GET /metrics HTTP/1.1\r\nUser-Agent: application/openmetrics-text\r\n"));
    }
}
