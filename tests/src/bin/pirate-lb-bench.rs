//! `cargo xtask bench lb`: static against latency-aware Maglev (the Pirate paper's §5.6) on the
//! load-balancing testbed. Clients open one connection per request to a VIP that four nginx
//! backends serve, replies straight to the clients; backend 0's capacity follows a trace
//! (requests beyond it wait in line), so its latency grows with the load it is given, as a
//! saturated server's does. Each forwarder (`pirate_lb`, Katran's balancer) runs the same trace
//! at each offered load twice, static and adaptive, and the clients' own p50/p99 are printed
//! side by side with the p99 reduction; failed requests are counted (a connection moved to
//! another real by a weight change fails so).

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use pirate_tests::{
    balancing::{self, Balanced},
    clients, servers,
};

#[derive(Parser)]
#[command(about = "Static against latency-aware Maglev on the load-balancing testbed (needs root)")]
struct Args {
    /// Offered loads, new connections (one request each) a second.
    #[arg(long, value_delimiter = ',', default_value = "100,200,300")]
    loads: Vec<f64>,
    /// Seconds each run lasts; trace steps after its end are not reached.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Which forwarders to run.
    #[arg(long, value_enum, default_value_t = Which::Both)]
    forwarder: Which,
    /// Backend 0's capacity over time: lines of `<seconds from the start> <requests a second>`
    /// (`none` lifts the limit). Without it, the built-in trace.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// pirated's epoch, the controller's step.
    #[arg(long, default_value = "500ms")]
    epoch: String,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Which {
    Both,
    PirateLb,
    Katran,
}

/// The built-in trace of backend 0's capacity (seconds from the start, requests a second):
/// unlimited, then limited twice, each time for longer than the controller needs to react.
const TRACE: &[(f64, Option<u32>)] = &[(0.0, None), (4.0, Some(150)), (14.0, None), (18.0, Some(100)), (28.0, None)];

const BACKENDS: usize = 4;

fn main() -> Result<()> {
    let args = Args::parse();
    let trace = match &args.trace {
        Some(path) => read_trace(path)?,
        None => TRACE.to_vec(),
    };
    if args.loads.iter().any(|&l| !(l > 0.0 && l <= 2000.0)) || args.seconds == 0 {
        bail!("--loads must be within (0, 2000] connections a second and --seconds at least 1");
    }
    let forwarders: &[Forwarder] = match args.forwarder {
        Which::Both => &[Forwarder::PirateLb, Forwarder::Katran],
        Which::PirateLb => &[Forwarder::PirateLb],
        Which::Katran => &[Forwarder::Katran],
    };
    let steps: Vec<String> = trace
        .iter()
        .map(|(at, c)| format!("{at} s {}", c.map_or("unlimited".to_string(), |c| format!("{c}/s"))))
        .collect();
    println!("backend 0's capacity over each run: {}", steps.join(", "));
    println!(
        "{} s per run, one HTTP request per connection at Poisson arrivals; 4 nginx backends, replies straight to the client\n",
        args.seconds
    );
    println!(
        "{:<10} {:>6}  {:>9} {:>9} {:>7} {:>7}  {:>9} {:>9} {:>7} {:>7} {:>6}  {:>8}",
        "forwarder",
        "load/s",
        "static",
        "p50 ms",
        "p99 ms",
        "b0 %",
        "adaptive",
        "p50 ms",
        "p99 ms",
        "b0 %",
        "rings",
        "p99 cut"
    );
    let build_dir = std::env::temp_dir().join(format!("pirate-lb-bench-{}", std::process::id()));
    let (mut cuts, mut failed) = (Vec::new(), 0);
    for &forwarder in forwarders {
        for &load in &args.loads {
            let [fixed, adaptive] = [false, true].map(|adaptive| {
                Run { forwarder, load, adaptive, seconds: args.seconds, epoch: &args.epoch }.go(&trace, &build_dir)
            });
            let (fixed, adaptive) = (fixed?, adaptive?);
            let cut = 1.0 - adaptive.p99_ms / fixed.p99_ms;
            cuts.push(cut);
            failed += fixed.failed + adaptive.failed;
            println!(
                "{:<10} {load:>6}  {:>9} {:>9.2} {:>7.2} {:>7.1}  {:>9} {:>9.2} {:>7.2} {:>7.1} {:>6}  {:>7.1}%",
                forwarder.name(),
                failures(&fixed),
                fixed.p50_ms,
                fixed.p99_ms,
                fixed.slow_share * 100.0,
                failures(&adaptive),
                adaptive.p50_ms,
                adaptive.p99_ms,
                adaptive.slow_share * 100.0,
                adaptive.rings,
                cut * 100.0
            );
        }
    }
    let _ = std::fs::remove_dir_all(&build_dir);
    println!("\nstatic/adaptive: failed requests of the run (a connection that breaks fails its request);");
    println!("b0 %: backend 0's share of the connections; rings: the new rings the controller made live in the adaptive run (weight moves and regressions).");
    if failed > 0 {
        bail!("{failed} requests failed");
    }
    println!(
        "p99 reduction, latency-aware against static Maglev, mean over {} runs: {:.1} % (the paper: 37 %)",
        cuts.len(),
        cuts.iter().sum::<f64>() / cuts.len() as f64 * 100.0
    );
    Ok(())
}

fn failures(o: &Outcome) -> String {
    format!("{} failed", o.failed)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Forwarder {
    PirateLb,
    Katran,
}

impl Forwarder {
    fn name(self) -> &'static str {
        match self {
            Forwarder::PirateLb => "pirate_lb",
            Forwarder::Katran => "katran",
        }
    }
}

struct Run<'a> {
    forwarder: Forwarder,
    load: f64,
    adaptive: bool,
    seconds: u64,
    epoch: &'a str,
}

/// What the clients saw in one run, and how the connections spread.
struct Outcome {
    p50_ms: f64,
    p99_ms: f64,
    failed: usize,
    /// Backend 0's share of the connections.
    slow_share: f64,
    /// Rings the controller made live (weight moves and regressions towards equal).
    rings: usize,
}

impl Run<'_> {
    /// A fresh testbed, pirated with the forwarder, the clients at the load while backend 0
    /// follows the trace.
    fn go(&self, trace: &[(f64, Option<u32>)], build_dir: &Path) -> Result<Outcome> {
        let tb = Balanced::new(BACKENDS, build_dir)?;
        let nginx = tb
            .backends
            .iter()
            .map(|b| servers::Capped::start(b, &[("index.html", 612)]))
            .collect::<Result<Vec<_>>>()?;
        let head = format!("epoch = \"{}\"\n", self.epoch);
        let extra = format!("adaptive = {}\n", self.adaptive);
        // Katran's balancer stays loaded for as long as pirated runs.
        let (mut pirated, _katran) = match self.forwarder {
            Forwarder::PirateLb => (tb.pirated(&format!("{head}{}", balancing::lb_config(BACKENDS, &extra)))?, None),
            Forwarder::Katran => {
                let katran = tb.katran(&build_dir.join("katran"))?;
                (tb.pirated_with_katran(&katran, &head, &extra)?, Some(katran))
            }
        };
        let before = tb.passive_opens()?;
        let duration = Duration::from_secs(self.seconds);
        let results = std::thread::scope(|scope| -> Result<Vec<Result<Duration>>> {
            let (start, slow) = (Instant::now(), &nginx[0]);
            let schedule = scope.spawn(move || follow(slow, trace, start, duration));
            let results = clients::http_per_connection(&tb.client, balancing::vip(), self.load, duration)?;
            schedule.join().map_err(|_| anyhow::anyhow!("the trace panicked"))??;
            Ok(results)
        })?;
        let opened = tb.opened_since(&before)?;
        let lines = pirated.stop()?;
        let mut ok: Vec<f64> = results.iter().filter_map(|r| r.as_ref().ok()).map(|d| d.as_secs_f64() * 1e3).collect();
        if ok.is_empty() {
            let why =
                results.iter().find_map(|r| r.as_ref().err()).map_or("none was made".into(), |e| format!("{e:#}"));
            bail!("no request succeeded: {why}");
        }
        for e in results.iter().filter_map(|r| r.as_ref().err()).take(3) {
            eprintln!("a request failed: {e:#}");
        }
        ok.sort_by(f64::total_cmp);
        let quantile = |q: f64| ok[((ok.len() - 1) as f64 * q).round() as usize];
        Ok(Outcome {
            p50_ms: quantile(0.5),
            p99_ms: quantile(0.99),
            failed: results.len() - ok.len(),
            slow_share: opened[0] as f64 / opened.iter().sum::<u64>().max(1) as f64,
            rings: lines.iter().filter(|v| v["type"] == "lb_move").count(),
        })
    }
}

/// Sets backend 0's capacity as the trace says, until `duration` after `start`.
fn follow(slow: &servers::Capped, trace: &[(f64, Option<u32>)], start: Instant, duration: Duration) -> Result<()> {
    for &(at, capacity) in trace {
        let at = Duration::from_secs_f64(at);
        if at >= duration {
            break;
        }
        std::thread::sleep((start + at).saturating_duration_since(Instant::now()));
        slow.set_capacity(capacity)?;
    }
    std::thread::sleep((start + duration).saturating_duration_since(Instant::now()));
    slow.set_capacity(None)
}

fn read_trace(path: &Path) -> Result<Vec<(f64, Option<u32>)>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut trace = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let parsed = line.split_once(char::is_whitespace).and_then(|(at, share)| {
            let at: f64 = at.parse().ok()?;
            let capacity = match share.trim() {
                "none" => None,
                s => Some(s.parse::<u32>().ok().filter(|&c| c > 0)?),
            };
            Some((at, capacity))
        });
        match parsed {
            Some((at, capacity)) if at >= trace.last().map_or(0.0, |l: &(f64, _)| l.0) => trace.push((at, capacity)),
            _ => bail!(
                "{}:{}: expected `<seconds> <requests a second>` or `<seconds> none`, in time order, got {line:?}",
                path.display(),
                n + 1
            ),
        }
    }
    Ok(trace)
}
