//! `cargo xtask bench lda`: the LDA paper's Fig. 4 and 5 through pirated's own LDA code. One
//! interval of 5 M packets (1 s of a 10 Gb/s link at 250-byte packets), Weibull delays
//! (scale 0.133 µs, shape 0.6: mean 0.2 µs), uniform loss from 0.01 % to 20 %, 1024 counters:
//! the single bank tuned for the actual loss rate as published (p = α m / (L + 1), α = ½) and
//! with pirated's α = 1, and the practical two banks of 512 tuned for 0.5 % and 10 %; every p
//! rounded to a power of ½, as the datapath samples. Each loss rate is one trace, run ten times
//! with the packets hashed anew (the paper's ten runs); printed: mean relative error of the mean
//! and the standard deviation, the worst run's mean error, the effective sample size, and how
//! many runs have the truth inside their 98 % Hoeffding bound. Timestamps in picoseconds.

use anyhow::Result;
use clap::Parser;
use pirate_common::segment::lda::LdaShape;
use pirated::{
    parallel,
    segment::{
        lda::{estimate, record, tuned, ALPHA},
        synthetic::{Interval, Loss, Spec},
    },
};

#[derive(Parser)]
struct Args {
    /// Loss rates, as fractions.
    #[arg(long, value_delimiter = ',', default_value = "0.0001,0.0005,0.001,0.005,0.01,0.02,0.05,0.1,0.2")]
    losses: Vec<f64>,
    /// Packets per interval.
    #[arg(long, default_value_t = 5_000_000)]
    packets: usize,
    /// Counters (rows over all banks).
    #[arg(long, default_value_t = 1024)]
    counters: u32,
    /// Runs per loss rate, each hashing the packets anew.
    #[arg(long, default_value_t = 10)]
    runs: u64,
}

/// One configuration's figures over the runs at one loss rate.
#[derive(Default)]
struct Figures {
    mean_error: f64,
    worst_mean_error: f64,
    std_error: f64,
    samples: f64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let spec = |loss| Spec::papers(args.packets, Loss::Rate(loss), 0);
    println!(
        "LDA, {} packets an interval, Weibull delays (mean 0.2 µs, shape 0.6), {} counters, {} runs per loss rate\n",
        args.packets, args.counters, args.runs
    );
    let configs: [(&str, &dyn Fn(f64) -> LdaShape); 3] = [
        ("1 bank, alpha 1/2 (paper)", &|loss| tuned(args.counters, &[loss], args.packets as f64, 0.5)),
        ("1 bank, alpha 1", &|loss| tuned(args.counters, &[loss], args.packets as f64, ALPHA)),
        ("2 banks (0.5 %, 10 %), alpha 1", &|_| tuned(args.counters / 2, &[0.005, 0.1], args.packets as f64, ALPHA)),
    ];
    print!("{:>7}", "");
    for (name, _) in &configs {
        print!("  {name:<38}");
    }
    print!("\n{:>7}", "loss");
    for _ in &configs {
        print!("  {:>8} {:>8} {:>8} {:>9}  ", "mean err", "worst", "std err", "samples");
    }
    println!();
    let mut worst = [(0.0f64, 0.0f64); 3]; // per configuration: below 0.1 % loss, and at any loss
    let (mut inside, mut total) = (0u64, 0u64);
    for (i, &loss) in args.losses.iter().enumerate() {
        let shapes: Vec<LdaShape> = configs.iter().map(|(_, shape)| shape(loss)).collect();
        let runs: Vec<u64> = (0..args.runs).collect();
        let per_run = parallel::map(&runs, |&run| {
            let interval = Interval::new(spec(loss), 0x4c44_4100 + i as u64, 0x1d5 + run);
            shapes
                .iter()
                .map(|shape| {
                    let e = estimate(shape, &record(shape, &interval.up), &record(shape, &interval.down));
                    let (mean, std_dev) = (e.figures.mean.unwrap_or(f64::NAN), e.figures.std_dev.unwrap_or(f64::NAN));
                    let inside = e.figures.bound.is_some_and(|b| (mean - interval.mean).abs() <= b);
                    (
                        (mean - interval.mean).abs() / interval.mean,
                        (std_dev - interval.std_dev).abs() / interval.std_dev,
                        e.samples,
                        inside,
                    )
                })
                .collect::<Vec<_>>()
        });
        print!("{:>6}%", loss * 100.0);
        for c in 0..configs.len() {
            let mut f = Figures::default();
            for run in &per_run {
                let (mean_error, std_error, samples, within) = run[c];
                f.mean_error += mean_error / args.runs as f64;
                f.worst_mean_error = f.worst_mean_error.max(mean_error);
                f.std_error += std_error / args.runs as f64;
                f.samples += samples as f64 / args.runs as f64;
                inside += u64::from(within);
                total += 1;
            }
            print!(
                "  {:>7.3}% {:>7.3}% {:>7.1}% {:>9.0}  ",
                f.mean_error * 100.0,
                f.worst_mean_error * 100.0,
                f.std_error * 100.0,
                f.samples
            );
            if loss < 0.001 {
                worst[c].0 = worst[c].0.max(f.mean_error);
            }
            worst[c].1 = worst[c].1.max(f.mean_error);
        }
        println!();
    }
    println!(
        "\nmean err: relative error of the mean, averaged over the runs; worst: the worst run's; std err: of the standard \
         deviation;\nsamples: effective sample size (packets in usable rows). {inside} of {total} runs have the truth within \
         their 98 % Hoeffding bound."
    );
    for (c, (name, _)) in configs.iter().enumerate() {
        println!(
            "{name}: mean relative error at most {:.3} % below 0.1 % loss (the paper: < 0.3 %), at most {:.2} % at any \
             loss (the paper: < 4 % at 20 %)",
            worst[c].0 * 100.0,
            worst[c].1 * 100.0
        );
    }
    Ok(())
}
