//! Project tasks: `cargo xtask demo | test | fuzz | install | bench …`. Each runs real cargo/tool
//! commands and fails loudly; the set-up of the machine itself is scripts/setup.sh.

use std::{path::PathBuf, process::Command};

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use xtask::{
    install::{self, Layout},
    layers::{check, CRATES},
    root, run,
};

#[derive(Parser)]
#[command(about = "pirated's project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build in release mode and run the demo: a one-point netns testbed with real traffic,
    /// pirated's estimates beside the clients' own latencies. Needs root.
    Demo,
    /// The whole test suite: formatting, clippy, unit, property and testbed tests. Needs root.
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Runs each cargo-fuzz target (fuzz/: the frame parser, the per-packet steps over a
    /// replayed capture, the capture reader, the segment's peer messages and handshake,
    /// /metrics' HTTP) for a while from its corpus in fuzz/corpus
    /// (new inputs go to a temporary directory); a crash fails, its input in fuzz/artifacts.
    /// `test` runs it too, 10 s a target.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u32,
        /// Targets (default: all).
        targets: Vec<String>,
    },
    /// Builds pirated in release mode and installs it as a systemd service (configs/pirated.service):
    /// the `pirated` system user, the binary, a configuration (only if there is none) and the
    /// unit; checks them (`pirated check`, `systemd-analyze verify`) and has systemd reload its
    /// units where it runs. Run again, it replaces the binary and the unit and keeps the rest.
    /// Needs root.
    Install {
        /// The binary goes to <prefix>/bin/pirated.
        #[arg(long, default_value = install::DEFAULT_PREFIX)]
        prefix: PathBuf,
        /// The configuration goes to <sysconfdir>/pirated/pirated.toml, the unit to
        /// <sysconfdir>/systemd/system/pirated.service (elsewhere than /etc: staged for a look).
        #[arg(long, default_value = install::DEFAULT_SYSCONFDIR)]
        sysconfdir: PathBuf,
    },
    /// Checks the import rule of docs/layout.md: no import cycle within a crate, and imports
    /// between top-level modules only down the layers (no capability imports another). `test`
    /// runs it first.
    Layers,
    /// Benchmarks, printed side by side with their baselines.
    Bench {
        #[command(subcommand)]
        which: Bench,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// Per-packet cost of `pirate` vs a bare XDP_PASS program (BPF_PROG_TEST_RUN) with 64 K flows
    /// in the table, and the memory per tracked flow; `-- --pping <pping_kern.o>` runs ePPing's
    /// XDP program beside them on the same packets. Needs root.
    Datapath {
        /// Extra arguments for the benchmark binary (see its --help).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// One epoch's drain, estimate and report as the flow table grows (64 K and 1 M flows by
    /// default), and the daemon's resident memory. Needs root.
    Epoch {
        /// Extra arguments for the benchmark binary (see its --help).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Fridges against the naive hash-indexed array on the fridge paper's synthetic traces
    /// (|log2(estimate/truth)| per memory size), and the userspace path's events per second.
    /// About 2 minutes; no root.
    Fridge {
        /// Extra arguments for the benchmark binary (see its --help).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// The paper's and the batches estimator against the clients' own latencies (mean, and
    /// p50/p90/p99 where the client has them) over a matrix of testbed cases, as one table.
    /// Needs root; about 2 minutes.
    Accuracy {
        /// Extra arguments for the benchmark binary (see its --help), e.g. `--case h2c`.
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// LDA's mean and standard deviation against the truth on the LDA paper's synthetic
    /// intervals (Fig. 4 and 5: Weibull delays, loss 0.01-20 %, 1024 counters). No root.
    Lda {
        /// Extra arguments for the benchmark binary (see its --help).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// RDA against LDA at equal memory as the set difference (lost and reordered packets)
    /// grows from 0 to 10 000 (the RDA paper's Fig. 7). No root.
    Rda {
        /// Extra arguments for the benchmark binary (see its --help).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// RLI and RLI-L per-flow mean and std-dev against every packet's true delay on a synthetic
    /// bottleneck with bursts, references injected 1-in-n, 1-in-τ or sampled, at three loads and
    /// three rates, with their overhead (no root); then live on the two-point testbed, each
    /// injection scheme at three budgets against the captures, beside hash-sampled references
    /// on the same traffic (root; `--on synthetic` skips it).
    Rli {
        /// Extra arguments for the benchmark binary (see its --help).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Static against latency-aware Maglev on the load-balancing testbed: one request per
    /// connection to 4 nginx backends, one of them limited on a trace, at three loads, with
    /// `pirate_lb` and with Katran's balancer; the clients' p50/p99 and the p99 reduction.
    /// Needs root; about 7 minutes.
    Lb {
        /// Extra arguments for the benchmark binary (see its --help), e.g. `--loads 200`.
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Packets per second per core on a veth pair in native XDP, driven by trafgen: a bare
    /// XDP_PASS against pirated's chain, a bare XDP_TX against `pirate_lb` and Katran's
    /// balancer. Needs root; about 1 minute a run.
    Wire {
        /// Extra arguments for the benchmark binary (see its --help), e.g. `--runs 3`.
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
}

fn cargo(args: &[&str]) -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.args(args);
    c
}

const FUZZ_TARGETS: [&str; 5] = ["parse", "step", "capture", "peer", "http"];

/// Runs each of `targets` for `seconds` under libFuzzer (nightly, sanitizers), from its corpus.
fn fuzz(targets: &[String], seconds: u32) -> Result<()> {
    let all: Vec<String> = FUZZ_TARGETS.iter().map(|t| t.to_string()).collect();
    let dir = root().join("fuzz");
    for target in if targets.is_empty() { &all } else { targets } {
        let scratch = std::env::temp_dir().join(format!("pirate-fuzz-{target}-{}", std::process::id()));
        std::fs::create_dir_all(&scratch)?;
        // Optimised, as CI runs it, in 16 codegen units (cargo-fuzz's default of one takes 3 min
        // on two cores, 16 take 2m45 and run somewhat slower); stderr closed for the target
        // (replay's summaries), kept for libFuzzer's own report.
        let result = run(Command::new("rustup")
            .args(["run", "nightly", "cargo", "fuzz", "run", "-O", "--codegen-units", "16", target])
            .arg(&scratch)
            .arg(dir.join("corpus").join(target))
            .args(["--", &format!("-max_total_time={seconds}"), "-close_fd_mask=2"])
            .env_remove("RUSTUP_TOOLCHAIN")
            .current_dir(&dir));
        std::fs::remove_dir_all(&scratch)?;
        result?;
        eprintln!("xtask: fuzz target {target}: no crash in {seconds} s");
    }
    Ok(())
}

/// Builds the benchmark binary `bin` and the binaries it runs (`with`) in release mode, then runs
/// it with `args`.
fn bench(bin: &str, with: &[&str], args: &[String]) -> Result<()> {
    let mut build = cargo(&["build", "--release", "--quiet"]);
    for b in std::iter::once(&bin).chain(with) {
        build.args(["--bin", b]);
    }
    run(&mut build)?;
    run(Command::new(root().join("target/release").join(bin)).args(args))
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Demo => {
            run(cargo(&["build", "--release", "--workspace", "--bins"]).arg("--quiet"))?;
            run(&mut Command::new(root().join("target/release/pirate-demo")))
        }
        Task::Test { args } => {
            layers()?;
            run(&mut cargo(&["fmt", "--all", "--check"]))?;
            run(&mut cargo(&["fmt", "--manifest-path", "pirate-ebpf/Cargo.toml", "--check"]))?;
            run(&mut cargo(&["fmt", "--manifest-path", "fuzz/Cargo.toml", "--check"]))?;
            run(&mut cargo(&["clippy", "--workspace", "--all-targets", "--quiet", "--", "-D", "warnings"]))?;
            // Testbed tests spawn pirated and the link emulator from target/debug.
            run(&mut cargo(&["build", "--workspace", "--bins", "--quiet"]))?;
            // One test at a time: testbeds share two CPUs, and accuracy tests need them quiet.
            // Uncaptured, so the log shows every accuracy figure next to its bound. No
            // backtraces: a failing test's message must stay at the tail of its output.
            run(cargo(&["test", "--workspace", "--no-fail-fast"])
                .args(&args)
                .args(["--", "--test-threads=1", "--nocapture"])
                .env("RUST_BACKTRACE", "0")
                .env("RUST_LIB_BACKTRACE", "0"))?;
            if args.is_empty() {
                fuzz(&[], 10)?;
            }
            Ok(())
        }
        Task::Fuzz { seconds, targets } => fuzz(&targets, seconds),
        Task::Layers => layers(),
        Task::Install { prefix, sysconfdir } => {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                bail!("installing needs root: it creates the pirated user and writes {}", sysconfdir.display());
            }
            run(&mut cargo(&["build", "--release", "--package", "pirated"]))?;
            install::install(&Layout { prefix, sysconfdir }, &root().join("target/release/pirated"))
        }
        Task::Bench { which: Bench::Datapath { args } } => bench("pirate-bench", &[], &args),
        Task::Bench { which: Bench::Epoch { args } } => bench("pirate-epoch-bench", &[], &args),
        Task::Bench { which: Bench::Fridge { args } } => bench("pirate-fridge-bench", &[], &args),
        // The testbed runs pirated and the link emulator from next to the benchmark binary.
        Task::Bench { which: Bench::Accuracy { args } } => {
            bench("pirate-accuracy", &["pirated", "pirate-linkem"], &args)
        }
        Task::Bench { which: Bench::Lda { args } } => bench("pirate-lda-bench", &[], &args),
        Task::Bench { which: Bench::Rda { args } } => bench("pirate-rda-bench", &[], &args),
        Task::Bench { which: Bench::Rli { args } } => bench("pirate-rli-bench", &["pirated", "pirate-linkem"], &args),
        Task::Bench { which: Bench::Lb { args } } => bench("pirate-lb-bench", &["pirated"], &args),
        Task::Bench { which: Bench::Wire { args } } => bench("pirate-wire-bench", &["pirated"], &args),
    }
}

/// The import rule over every crate it covers: each breach printed, an error if any.
fn layers() -> Result<()> {
    let mut breaches = 0;
    for krate in CRATES {
        for breach in check(&root(), krate)? {
            eprintln!("xtask layers: {}: {breach}", krate.src);
            breaches += 1;
        }
    }
    if breaches > 0 {
        bail!("{breaches} imports break the rule of docs/layout.md");
    }
    eprintln!("xtask layers: no cycle, every import down the layers ({} crates)", CRATES.len());
    Ok(())
}
