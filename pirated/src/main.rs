//! pirated: passive response-latency measurement with XDP (the Pirate algorithm), exported as
//! Prometheus metrics and JSON lines.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
};

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use tracing_subscriber::EnvFilter;

use pirated::{
    capture::CaptureReader,
    clock,
    config::Config,
    datapath::{Datapath, Spec},
    epoch,
    json::JsonLines,
    lb::balancer::Balancer,
    metrics, psk,
    rli::{self, live::Injector},
    segment::{self, config::Role},
    source::live::Live,
};

/// Passive response-latency measurement on a live interface, from client→server packets only.
///
/// pirated attaches its XDP chain (`pirate_root`, which parses each frame once and tail-calls
/// `pirate`) to the client-facing interface, summarises each flow's inter-packet gaps into a few
/// modes in the kernel, and every epoch turns them into a mean response latency per flow and per
/// server (Pirate's proportional mode sum, or the
/// `batches` estimator). Results are served as Prometheus metrics and optionally printed as
/// JSON lines.
#[derive(Parser, Debug)]
#[command(version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Attach and measure until SIGINT/SIGTERM (the default). A previous run's chain and maps
    /// are taken over; at exit they stay attached unless `on_exit = "detach"`.
    Run(RunArgs),
    /// Detach the chain a stopped instance left attached (`on_exit = "keep"`) and remove its pins
    /// (the flow state, and the forwarder slots balancers registered in).
    Detach {
        #[arg(short, long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Validate a configuration file and print the effective configuration; a segment point's
    /// key file is read and checked too (the key itself is never printed).
    Check {
        #[arg(short, long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Run the same per-packet code and estimators over a capture; prints JSON lines, the last
    /// a "capture" line of what it read and left out. Fails if the capture measured nothing or
    /// ended in an error (after printing what it read before). Needs no privileges.
    Replay {
        /// A pcap or pcapng file (`-`: standard input), as tcpdump or dumpcap write it: Ethernet
        /// (with or without FCS), Linux cooked (`tcpdump -i any`) or raw IP. The client→server
        /// direction as pirated would see it on its interface (and, for the fridges'
        /// responses, the other one where the capture has it).
        #[arg(long, value_name = "FILE")]
        pcap: PathBuf,
        #[arg(short, long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Replay two captures of the same traffic, one at each point of a segment, through the
    /// segment's per-packet step and the downstream point's reconciliation; prints a JSON line
    /// per interval (`"type": "segment"`) as the live downstream point does. `[segment]` in the
    /// configuration gives the interval and the banks (its role is not used). Needs no
    /// privileges.
    ReplaySegment {
        /// A capture at the upstream point (pcap or pcapng, as `--pcap` of replay).
        #[arg(long, value_name = "FILE")]
        up: PathBuf,
        /// A capture at the downstream point.
        #[arg(long, value_name = "FILE")]
        down: PathBuf,
        /// Seconds TAI was ahead of UTC when the captures were taken (live points cut intervals
        /// on TAI; captures stamp UTC; 37 since 2017), -1000..=1000. Default: this host's offset
        /// now.
        #[arg(long, value_name = "SECONDS", allow_negative_numbers = true,
              value_parser = clap::value_parser!(i64).range(-1000..=1000))]
        tai_offset: Option<i64>,
        #[arg(short, long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Write a fresh segment key (256 random bits, as 64 hex digits) to FILE, which must not
    /// exist, readable by its owner only; copy it to the other point by a secure means and set
    /// `segment.key_file` at both.
    Keygen {
        /// Where to write the key (refused if anything is there).
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
}

#[derive(clap::Args, Debug, Clone, Default)]
struct RunArgs {
    /// Configuration file (TOML); see configs/pirated.toml for every key and its default.
    #[arg(short, long, value_name = "FILE", global = true)]
    config: Option<PathBuf>,
    /// Client-facing interface (overrides `interface` in the config).
    #[arg(short, long, value_name = "IFACE")]
    interface: Option<String>,
    /// XDP attach mode (overrides `attach_mode`).
    #[arg(long, value_enum)]
    attach_mode: Option<pirated::datapath::AttachMode>,
    /// Metrics listen address (overrides `metrics.listen`).
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<std::net::SocketAddr>,
    /// `json`: besides serving /metrics, print one JSON line per flow and per server each
    /// epoch [default: prometheus].
    #[arg(long, value_enum)]
    output: Option<Output>,
}

impl RunArgs {
    /// Options given after `run` win over the same ones given before it.
    fn or(self, outer: RunArgs) -> RunArgs {
        RunArgs {
            config: self.config.or(outer.config),
            interface: self.interface.or(outer.interface),
            attach_mode: self.attach_mode.or(outer.attach_mode),
            listen: self.listen.or(outer.listen),
            output: self.output.or(outer.output),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    /// Serve Prometheus metrics only.
    Prometheus,
    /// Serve metrics and print JSON lines on stdout.
    Json,
}

fn load(path: Option<&PathBuf>) -> anyhow::Result<Config> {
    match path {
        Some(p) => Config::load(p),
        None => Ok(Config::default()),
    }
}

fn main() {
    // Colour only for a terminal: journald, files and pipes get plain text.
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        None => run(cli.run),
        Some(Command::Run(args)) => run(args.or(cli.run)),
        Some(Command::Check { config }) => check(config.or(cli.run.config)),
        Some(Command::Keygen { file }) => psk::Psk::write_new(&file),
        Some(Command::Detach { config }) => detach(config.or(cli.run.config)),
        Some(Command::Replay { pcap, config }) => load(config.or(cli.run.config).as_ref())
            .and_then(|c| epoch::replay(&c, CaptureReader::open(&pcap)?, &mut std::io::stdout().lock())),
        Some(Command::ReplaySegment { up, down, tai_offset, config }) => load(config.or(cli.run.config).as_ref())
            .and_then(|c| {
                let offset = tai_offset.map_or_else(clock::tai_offset_ns, |s| s * 1_000_000_000);
                let (up, down) = (CaptureReader::open(&up)?, CaptureReader::open(&down)?);
                pirated::source::two_points::replay(&c, up, down, offset)
            }),
    };
    if let Err(e) = result {
        eprintln!("pirated: error: {e:#}");
        std::process::exit(1);
    }
}

fn check(path: Option<PathBuf>) -> anyhow::Result<()> {
    let config = load(path.as_ref())?;
    print!("{}", toml::to_string(&config)?);
    if matches!(config.segment.role, segment::config::Role::Up | segment::config::Role::Down) {
        config.segment.key()?;
        println!("# segment key: set, read from segment.key_file and found private");
    }
    Ok(())
}

fn detach(path: Option<PathBuf>) -> anyhow::Result<()> {
    let config = load(path.as_ref())?;
    if let Some(down) = config.downstream_point() {
        detach_instance(&down)?;
    }
    detach_instance(&config)
}

fn detach_instance(config: &Config) -> anyhow::Result<()> {
    if Datapath::detach(&config.datapath())? {
        eprintln!("pirated: detached instance {:?} and removed its pins in {}", config.instance, config.pin_root);
    } else {
        eprintln!("pirated: instance {:?} has nothing pinned in {}", config.instance, config.pin_root);
    }
    Ok(())
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let mut config = load(args.config.as_ref())?;
    if let Some(i) = args.interface {
        config.interface = i;
    }
    if let Some(m) = args.attach_mode {
        config.attach_mode = m;
    }
    if let Some(l) = args.listen {
        config.metrics.listen = l;
    }
    config.validate()?;
    if config.rli.sampled() {
        rli::live::prioritise(config.rli.nice);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let metrics = Arc::new(Mutex::new(metrics::Metrics::new(&config.metrics)));
        // Bind before attaching so a busy port fails fast, with nothing to undo.
        let listener = tokio::net::TcpListener::bind(config.metrics.listen)
            .await
            .with_context(|| format!("binding the metrics listener on {}", config.metrics.listen))?;
        tracing::info!(listen = %config.metrics.listen, "serving /metrics");
        let shutdown = shutdown_signal()?;
        let lines = match args.output == Some(Output::Json) {
            true => Some(JsonLines::spawn().context("starting the JSON lines writer")?),
            false => None,
        };
        let rli_key = rli_key(&config)?;
        let keyed = |mut spec: Spec| {
            spec.rli.shape = spec.rli.shape.keyed(rli_key.unwrap_or_default());
            spec
        };
        let mut dp = Datapath::attach(&keyed(config.datapath()))?;
        let mut down = config.downstream_point().map(|d| Datapath::attach(&keyed(d.datapath()))).transpose()?;
        let lines_of = || lines.as_ref().map(|l| l.lines());
        let interval_ns = config.segment.interval.as_nanos();
        // Sampled references: the upstream point's times cross the segment's link.
        let sampled = config.rli.sampled();
        let mut relay = segment::live::Relay::default();
        let rli_up = match config.segment.role {
            Role::Up | Role::Both if sampled => {
                let (send, to_peer) = tokio::sync::mpsc::channel(RELAYED);
                relay.send = Some(to_peer);
                Some(rli::live::spawn_upstream(dp.take_rli()?, send))
            }
            _ => None,
        };
        let rli_down = match (&mut down, config.segment.role) {
            _ if !config.rli.enabled => None,
            (Some(down), _) => Some(down.take_rli()?),
            (None, Role::Down) => Some(dp.take_rli()?),
            _ => None,
        }
        .map(|maps| {
            let times = sampled.then(|| {
                let (deliver, times) = tokio::sync::mpsc::channel(RELAYED);
                relay.deliver = Some(deliver);
                times
            });
            rli::live::spawn_downstream(maps, &config.rli, interval_ns, times, shared(&metrics, |m| &m.rli), lines_of())
        });
        let injector = match (rli_key, config.segment.role) {
            (Some(key), Role::Up | Role::Both) if !sampled => Some(Injector::start(&config.rli, key)?),
            _ => None,
        };
        let segment =
            segment::live::spawn(&config.segment, down, &mut dp, relay, shared(&metrics, |m| &m.segment), lines_of())
                .await?;
        let forwarder = config.lb.enabled().then(|| dp.take_lb()).transpose()?;
        let mut live = Live::new(dp, &config)?;
        let balancer = forwarder.map(|maps| Balancer::start(&config.lb, maps)).transpose()?;
        let server = tokio::spawn(metrics::http::serve_on(listener, metrics.lock().unwrap().server()));
        let result = epoch::run(&config, &mut live, balancer, metrics, lines.as_ref(), shutdown).await;
        // Before the downstream chain goes (with role "both", or detaching): no reference
        // passes it on the way out.
        drop(injector);
        server.abort();
        for task in [segment, rli_down, rli_up].into_iter().flatten() {
            task.abort();
            let _ = task.await;
        }
        if let Some(lines) = lines {
            lines.finish(std::time::Duration::from_secs(2));
        }
        tracing::info!("stopping");
        drop(live);
        result
    })
}

/// Batches of sampled references' times on their way between RLI and the segment's link (one a
/// ms; beyond, they are dropped and their references voided).
const RELAYED: usize = 256;

/// The key RLI's references are tagged with, if `[rli]` is on: derived from the segment key
/// (read from its file), or with both points in this pirated from a key drawn for this run.
fn rli_key(config: &Config) -> anyhow::Result<Option<[u64; 2]>> {
    if !config.rli.enabled {
        return Ok(None);
    }
    let psk = match (config.segment.role, &config.segment.key_file) {
        (Role::Both, None) => psk::Psk::generate().context("drawing a key for the references")?,
        _ => config.segment.key()?,
    };
    Ok(Some(rli::live::tag_key(&psk)))
}

/// How a capability's task reaches its families (`segment::metrics::Shared`, `rli::metrics::Shared`).
type Families<T> = Arc<dyn Fn(&mut dyn FnMut(&T)) + Send + Sync>;

/// A capability's families in `metrics` (`pick`), for a task of its own: reached under the
/// registry's lock, the exposition encoded again after each use.
fn shared<T: 'static>(metrics: &Arc<Mutex<metrics::Metrics>>, pick: fn(&metrics::Metrics) -> &T) -> Families<T> {
    let metrics = metrics.clone();
    Arc::new(move |f| {
        let m = metrics.lock().unwrap();
        f(pick(&m));
        m.expose();
    })
}

/// SIGTERM or SIGINT. The handlers are installed here, before attaching: a signal that arrives
/// right after "attached" is logged must still detach and unpin cleanly, not take the default
/// action and kill the process.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}
