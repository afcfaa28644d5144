//! `cargo xtask bench accuracy`: pirated's two estimators — the paper's proportional mode sum and
//! the batches estimator — against the clients' own latency figures, one testbed run per case
//! (or `--runs N`), printed as one table. A benchmark, not a test: it reports errors and holds
//! them to no bound, so that cases beyond the tests' (HTTP/2 over cleartext and TLS, gRPC,
//! pipelining, many connections, IPv6) can be compared.
//! Needs root and pirated/pirate-linkem built next to it (the xtask builds them).

mod cases;
mod cycle;
mod figures;
mod table;

use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;

#[derive(Parser)]
#[command(about = "pirated's estimators against the clients' own latencies, one table")]
struct Args {
    /// Run only the cases whose name contains this (case-insensitive); repeatable.
    #[arg(long)]
    case: Vec<String>,
    /// Seconds of traffic per case (each case is one pirated epoch, at most 60 s).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=50))]
    seconds: u64,
    /// Runs of each case, each on a testbed of its own; with more than one, the table shows each
    /// estimator's median error and range over them, and the runs that reported no figure.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// List the cases and exit.
    #[arg(long)]
    list: bool,
    /// Print pirated's JSON lines of each case on stderr (to see why an estimate is off).
    #[arg(long)]
    dump: bool,
    /// pirated's `pirate.mode_span` for the run (default: pirated's). 0 keeps Alg. 2's modes
    /// exactly as published, so that the paper's column is the paper's estimator unaltered.
    #[arg(long)]
    mode_span: Option<u32>,
    /// A setting of pirated's `[pirate]` table for the run, as TOML (`modes = 12`,
    /// `multiplexed_short_share = 0.05`); repeatable.
    #[arg(long, value_name = "KEY = VALUE")]
    pirate: Vec<String>,
    /// Keep what the vantage point received from the client side in each run, as
    /// DIR/<case number>-<run>.pcap (for `pirated replay`, or to study a wrong figure), with the
    /// truth to hold a replay to beside it: the clients' mean latency as
    /// DIR/<case number>-<run>.mean (milliseconds) and, where the client times its own batches,
    /// their latencies as DIR/<case number>-<run>.ms (milliseconds, ascending, one a line).
    #[arg(long, value_name = "DIR")]
    pcap: Option<std::path::PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let wanted =
        |name: &str| args.case.is_empty() || args.case.iter().any(|c| name.to_lowercase().contains(&c.to_lowercase()));
    let cases: Vec<_> = cases::all().into_iter().filter(|c| wanted(&c.name)).collect();
    if args.list {
        cases.iter().for_each(|c| println!("{}", c.name));
        return Ok(());
    }
    if cases.is_empty() {
        bail!("no case matches {:?} (see --list)", args.case);
    }
    let mut config = String::from("[pirate]\n");
    if let Some(span) = args.mode_span {
        config += &format!("mode_span = {span}\n");
    }
    args.pirate.iter().for_each(|line| config += &format!("{line}\n"));
    if let Some(dir) = &args.pcap {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut table = table::Table::new(args.runs);
    for (i, case) in cases.iter().enumerate() {
        let outcomes: Vec<_> = (1..=args.runs)
            .map(|run| {
                let start = Instant::now();
                let of_runs = if args.runs > 1 { format!(" (run {run}/{})", args.runs) } else { String::new() };
                eprintln!("[{}/{}] {}{of_runs} …", i + 1, cases.len(), case.name);
                let pcap = args.pcap.as_ref().map(|dir| dir.join(format!("{}-{run}.pcap", i + 1)));
                let outcome = case.run(args.seconds, &config, pcap.as_deref());
                match &outcome {
                    Ok(o) => {
                        eprintln!(
                            "      done in {:.1} s: the clients' mean {:.3} ms",
                            start.elapsed().as_secs_f64(),
                            o.truth.mean * 1e3
                        );
                        if args.dump {
                            o.lines.iter().for_each(|l| eprintln!("{l}"));
                        }
                        if let Err(e) = pcap.as_deref().map_or(Ok(()), |pcap| keep_truth(&o.truth, pcap)) {
                            eprintln!("      failed: {e:#}");
                        }
                    }
                    Err(e) => eprintln!("      failed: {e:#}"),
                }
                outcome
            })
            .collect();
        table.add(&case.name, &outcomes);
    }
    println!("\n{}", table.render());
    Ok(())
}

/// Writes the clients' mean latency and their own batch latencies, if they timed any, beside the
/// capture at `pcap`.
fn keep_truth(truth: &cases::Truth, pcap: &std::path::Path) -> Result<()> {
    let write = |ext: &str, text: String| {
        let to = pcap.with_extension(ext);
        std::fs::write(&to, text).with_context(|| format!("writing {}", to.display()))
    };
    write("mean", format!("{:.6}\n", truth.mean * 1e3))?;
    if truth.latencies.is_empty() {
        return Ok(());
    }
    write("ms", truth.latencies.iter().map(|s| format!("{:.6}\n", s * 1e3)).collect())
}
