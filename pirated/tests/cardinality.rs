//! Per-server series stay bounded over a long run: a day of 1 s epochs, compressed, in which a
//! million distinct servers pass by, leaves the metrics' heap flat from the first hour on.
//! A counting allocator measures the heap; the tests take turns (`ALONE`) so that each owns it.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    net::SocketAddr,
    sync::{
        atomic::{AtomicIsize, Ordering::Relaxed},
        Mutex,
    },
};

use pirated::{
    config::MetricsConfig,
    pirate::{
        estimate::{quantile::Quantile, servers::ServerEstimate},
        metrics::Metrics,
    },
};
use prometheus_client::{encoding::text::encode, registry::Registry};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        LIVE.fetch_sub(layout.size() as isize, Relaxed);
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, layout, size) };
        if !q.is_null() {
            LIVE.fetch_add(size as isize - layout.size() as isize, Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

static ALONE: Mutex<()> = Mutex::new(());

const EPOCHS_A_DAY: u64 = 86_400;
const PASSING: u64 = 1_000_000;
/// Servers with a figure in every epoch of the day.
const STEADY: u64 = 5;

/// Server `i`'s address: distinct for every `i` below 2³².
fn server(i: u64) -> SocketAddr {
    SocketAddr::from((((i as u32 + 1) << 8).to_be_bytes(), 8080))
}

fn figure(i: u64) -> ServerEstimate {
    let ms = 1e6 * (1 + i % 50) as f64;
    let quantiles = [0.5, 0.9, 0.99]
        .iter()
        .map(|&q| Quantile { q, estimate_ns: ms * (1.0 + q), lower_ns: ms, upper_ns: 3.0 * ms })
        .collect();
    ServerEstimate { server: server(i), estimate_ns: ms, flows: 1, batches: 10, quantiles, at_or_below: vec![10.0] }
}

/// The servers whose latency the exposition carries.
fn servers_shown(registry: &Registry) -> Vec<String> {
    let mut text = String::new();
    encode(&mut text, registry).unwrap();
    let shown = text.lines().filter_map(|l| l.strip_prefix("pirated_server_response_latency_seconds{server=\""));
    shown.map(|l| l.split('"').next().unwrap().to_string()).collect()
}

fn value(registry: &Registry, name: &str) -> f64 {
    let mut text = String::new();
    encode(&mut text, registry).unwrap();
    let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}"));
    line.split(' ').nth(1).unwrap().parse().unwrap()
}

/// Each passing server has a figure in one epoch of the day (the millionth in the last), the
/// steady ones in every epoch; a server's series go after `idle_epochs` (300) without one.
#[test]
fn a_million_servers_passing_in_a_day_leave_the_heap_flat() {
    let _alone = ALONE.lock();
    let config = MetricsConfig::default();
    let idle = config.idle_epochs as u64;
    let mut registry = Registry::with_prefix("pirated");
    let mut metrics = Metrics::register(&mut registry, config.max_servers, config.idle_epochs, config.histograms);
    let mut hourly: Vec<isize> = Vec::new();
    let mut next = STEADY;
    let mut epoch_figures = Vec::new();
    for epoch in 1..=EPOCHS_A_DAY {
        // Passing servers of this epoch: those whose share of the day ends in it.
        let until = STEADY + PASSING * epoch / EPOCHS_A_DAY;
        epoch_figures.clear();
        epoch_figures.extend((0..STEADY).chain(next..until).map(figure));
        next = until;
        metrics.publish_servers(&epoch_figures);
        if epoch % 3_600 == 0 {
            assert_eq!(servers_shown(&registry).len(), epoch_figures.len(), "hour {}", epoch / 3_600);
            hourly.push(LIVE.load(Relaxed));
        }
    }
    // Held at the end: the steady servers and those of the last `idle` epochs.
    let recent = PASSING - PASSING * (EPOCHS_A_DAY - idle) / EPOCHS_A_DAY;
    let held = value(&registry, "pirated_server_series");
    let expired = value(&registry, "pirated_server_series_expired_total");
    let refused = value(&registry, "pirated_server_series_refused_total");
    eprintln!(
        "{PASSING} servers over {EPOCHS_A_DAY} epochs: {held} held, {expired} expired, {refused} refused; heap by the hour (KiB): {:?}",
        hourly.iter().map(|b| b / 1024).collect::<Vec<_>>()
    );
    assert_eq!(held as u64, STEADY + recent, "held");
    assert_eq!(expired as u64, PASSING - recent, "expired");
    assert_eq!(refused, 0.0, "refused");
    let (first, most) = (hourly[0], *hourly.iter().max().unwrap());
    // Flat: no hour holds more than the first hour's heap and a tenth (the tables' spare room
    // varies); without expiry, a million servers' series would hold over a hundred times more.
    assert!(most as f64 <= 1.1 * first as f64, "heap grew: {hourly:?}");
}

/// Past `max_servers`, new servers are refused (first come, first held) and counted each epoch;
/// the series of servers idle for `idle_epochs` go, making room for new ones.
#[test]
fn the_cap_refuses_new_servers_until_idle_ones_expire() {
    let _alone = ALONE.lock();
    let config = MetricsConfig { max_servers: 1_000, idle_epochs: 3, ..MetricsConfig::default() };
    let mut registry = Registry::with_prefix("pirated");
    let mut metrics = Metrics::register(&mut registry, config.max_servers, config.idle_epochs, config.histograms);
    let burst: Vec<ServerEstimate> = (0..5_000).map(figure).collect();
    let first: Vec<String> = (0..1_000).map(|i| server(i).to_string()).collect();
    let counts = |r: &Registry| {
        ["pirated_server_series", "pirated_server_series_expired_total", "pirated_server_series_refused_total"]
            .map(|name| value(r, name) as u64)
    };
    for epoch in 1..=2 {
        metrics.publish_servers(&burst);
        let mut shown = servers_shown(&registry);
        shown.sort_unstable();
        let mut want = first.clone();
        want.sort_unstable();
        assert_eq!(shown, want, "epoch {epoch}: the first thousand");
        assert_eq!(counts(&registry), [1_000, 0, 4_000 * epoch], "epoch {epoch}");
    }
    // Idle in epochs 3 and 4: still held; in 5, the third idle epoch, gone.
    for (epoch, held, expired) in [(3, 1_000, 0), (4, 1_000, 0), (5, 0, 1_000)] {
        metrics.publish_servers(&[]);
        assert_eq!(counts(&registry), [held, expired, 8_000], "epoch {epoch}");
    }
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    assert!(!text.contains("server=\""), "series left after expiry:\n{text}");
    // Room again: the servers refused before are held now.
    metrics.publish_servers(&burst[4_000..]);
    assert_eq!(servers_shown(&registry).len(), 1_000);
    assert_eq!(counts(&registry), [1_000, 1_000, 8_000]);
}

/// With `histograms`, a server's histogram is one of its series: held within the cap, gone with
/// the rest after `idle_epochs`, its count the batches' and its buckets' sum the latency's.
#[test]
fn histograms_come_and_go_with_their_servers() {
    let _alone = ALONE.lock();
    let config = MetricsConfig { max_servers: 10, idle_epochs: 2, histograms: true, ..MetricsConfig::default() };
    let mut registry = Registry::with_prefix("pirated");
    let mut metrics = Metrics::register(&mut registry, config.max_servers, config.idle_epochs, config.histograms);
    let text = |r: &Registry| {
        let mut text = String::new();
        encode(&mut text, r).unwrap();
        text
    };
    metrics.publish_servers(&(0..15).map(figure).collect::<Vec<_>>());
    let shown = text(&registry);
    let counts: Vec<&str> =
        shown.lines().filter(|l| l.starts_with("pirated_server_batch_latency_seconds_count{")).collect();
    assert_eq!(counts.len(), 10, "{counts:?}");
    assert!(counts.iter().all(|l| l.ends_with(" 10")), "{counts:?}");
    // Server 0's 10 batches at 1 ms.
    assert!(shown.contains(&format!("pirated_server_batch_latency_seconds_sum{{server=\"{}\"}} 0.01\n", server(0))));
    for _ in 0..2 {
        metrics.publish_servers(&[]);
    }
    assert!(!text(&registry).contains("server=\""), "series left after expiry");
}
