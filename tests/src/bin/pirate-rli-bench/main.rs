//! `cargo xtask bench rli`: RLI and RLI-L (pirated's estimators) on a synthetic segment: flows of
//! Pareto sizes through a 1 Gb/s FIFO bottleneck with bursts that fill its queue for 2 ms every
//! 50 ms, at three loads; references at three rates, given as the share of the link injected
//! references would take (the paper's budget is 0.2 %), injected 1-in-n, 1-in-τ (as many), or
//! sampled 1-in-n from the regular packets (their timestamps cross the peer channel, 16 bytes
//! each, instead). Printed per load, way and rate: the references' share of the packets and of
//! the link (sampled: of the peer channel's bytes), and over flows of 100 packets or more (and
//! of 10–99) the median and p90 of the relative error of each flow's mean and standard deviation
//! of delay, against every packet's true delay, and the median signed error of RLI's means.
//! Then the segment's delay quantiles per interval from the references alone, against every
//! packet's: the median and worst relative error over intervals, the worst being a burst's.
//! Then, as root, the same live on the two-point testbed (`testbed`).

mod testbed;

use anyhow::Result;
use clap::Parser;
use pirated::{
    parallel,
    rli::{
        interpolate::{estimate, Sums},
        quantiles::Summary,
        synthetic::{References, Spec, Trace, REFERENCE_BYTES},
    },
};

#[derive(Parser)]
struct Args {
    /// Seconds of traffic per trace.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Offered loads, shares of the link.
    #[arg(long, value_delimiter = ',', default_value = "0.3,0.6,0.9")]
    loads: Vec<f64>,
    /// Reference rates, as the share of the link injected references take.
    #[arg(long, value_delimiter = ',', default_value = "0.0005,0.002,0.008")]
    link_shares: Vec<f64>,
    /// The segment's measurement interval for its quantiles, ms.
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
    /// Where: the synthetic segment (no root), the two-point testbed (root), or both.
    #[arg(long, value_delimiter = ',', default_value = "synthetic,testbed")]
    on: Vec<On>,
    /// Flows on the testbed.
    #[arg(long, default_value_t = 600)]
    flows: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum On {
    Synthetic,
    Testbed,
}

/// Median and p90 of the magnitudes of `errors` (NaN for none).
fn median_p90(errors: &[f64]) -> (f64, f64) {
    let mut errors: Vec<f64> = errors.iter().map(|e| e.abs()).collect();
    if errors.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    errors.sort_by(f64::total_cmp);
    let at = |q: f64| errors[((errors.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.9))
}

/// A median / p90 pair as percentages, for the tables.
fn pct(x: (f64, f64)) -> String {
    if x.0.is_nan() {
        // No figure (RLI-L with sampled references is withheld).
        return format!("{:>15}", "—");
    }
    format!("{:6.2} / {:6.2}", x.0 * 100.0, x.1 * 100.0)
}

/// The median of `values`, signed (NaN for none).
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Per flow of `min..max` packets: the relative errors of the mean (signed) and of the std-dev
/// (absolute).
fn errors(truth: &[Sums], est: &[Sums], min: u64, max: u64) -> (Vec<f64>, Vec<f64>) {
    let (mut means, mut stds) = (Vec::new(), Vec::new());
    for (t, e) in truth.iter().zip(est) {
        if !(min..max).contains(&t.packets) || e.packets == 0 {
            continue;
        }
        let rel = |e: Option<f64>, t: Option<f64>| Some((e? - t?) / t?);
        means.extend(rel(e.mean(), t.mean()));
        if let Some(r) = rel(e.std_dev(), t.std_dev()).map(f64::abs).filter(|r| r.is_finite()) {
            stds.push(r);
        }
    }
    (means, stds)
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.on.contains(&On::Synthetic) {
        synthetic(&args)?;
    }
    if args.on.contains(&On::Testbed) {
        testbed::bench(&args.link_shares, args.flows)?;
    }
    Ok(())
}

/// The synthetic segment's tables.
fn synthetic(args: &Args) -> Result<()> {
    println!(
        "RLI on a synthetic segment: 1 Gb/s FIFO, bursts at 1.5× the link for 2 ms every 50 ms, {} s a trace; relative \
         errors of per-flow mean and std-dev against every packet's true delay, median / p90 over flows of ≥100 \
         packets (and 10–99)\n",
        args.seconds
    );
    println!(
        "{:>4} {:>12} {:>8} {:>8} {:>6} | {:>15} {:>15} | {:>15} {:>15} | {:>15} | {:>8}",
        "load",
        "references",
        "pkts %",
        "link %",
        "flows",
        "RLI mean",
        "RLI std",
        "RLI-L mean",
        "RLI-L std",
        "RLI mean 10–99",
        "RLI bias"
    );
    for &load in &args.loads {
        let spec = Spec::gigabit(args.seconds, load);
        // For a share of the link: τ, and n at the packets a second of traffic carries.
        let packets_per_s = Trace::new(&spec, References::Sampled(u64::MAX), 1).arrivals.len() as f64 / args.seconds;
        let ways: Vec<(String, References)> = args
            .link_shares
            .iter()
            .flat_map(|&share| {
                let tau = (REFERENCE_BYTES as f64 * 8.0 / (share * spec.link_bps) * 1e9) as u64;
                let n = (packets_per_s * tau as f64 / 1e9).round().max(1.0) as u64;
                [
                    (format!("1-in-{n}"), References::EveryN(n)),
                    (format!("1-in-{:.0}µs", tau as f64 / 1e3), References::EveryNs(tau)),
                    (format!("sampled {n}"), References::Sampled(n)),
                ]
            })
            .collect();
        let rows = parallel::map(&ways, |(name, refs)| {
            let trace = Trace::new(&spec, *refs, 0x524c_4900 + (load * 100.0) as u64);
            let e = estimate(&trace.arrivals, trace.truth.len());
            let regular = trace.arrivals.len() as u64 - trace.references;
            // Sampled: U's timestamps over the peer channel, an identity and a stamp each.
            let link_bytes = match refs {
                References::Sampled(_) => trace.references * 16,
                _ => trace.reference_bytes,
            };
            let (rli_m, rli_s) = errors(&trace.truth, &e.rli, 100, u64::MAX);
            let (left_m, left_s) = errors(&trace.truth, &e.left, 100, u64::MAX);
            let (small, _) = errors(&trace.truth, &e.rli, 10, 100);
            format!(
                "{load:>4} {name:>12} {:>8.3} {:>8.3} {:>6} | {:>15} {:>15} | {:>15} {:>15} | {:>15} | {:>+8.2}",
                trace.references as f64 / regular as f64 * 100.0,
                link_bytes as f64 * 8.0 / spec.link_bps / spec.seconds * 100.0,
                rli_m.len(),
                pct(median_p90(&rli_m)),
                pct(median_p90(&rli_s)),
                pct(median_p90(&left_m)),
                pct(median_p90(&left_s)),
                pct(median_p90(&small)),
                median(&rli_m) * 100.0,
            )
        });
        rows.iter().for_each(|r| println!("{r}"));
    }
    quantiles(args)
}

/// Per load and way of choosing references (at 0.2 % of the link): per interval, the quantiles
/// and std-dev of the references' delays against every packet's; printed, the median and the
/// worst relative error over the intervals, and the references an interval held.
fn quantiles(args: &Args) -> Result<()> {
    println!(
        "
The segment's delay per {} ms interval from its references (0.2 % of the link) against every packet's:          relative error, median / worst over intervals
",
        args.interval_ms
    );
    println!(
        "{:>4} {:>12} {:>10} | {:>15} {:>15} {:>15} {:>15} | {:>12}",
        "load", "references", "refs/int", "p50", "p90", "p99", "std-dev", "top p99 ms"
    );
    let interval_ns = args.interval_ms * 1_000_000;
    for &load in &args.loads {
        let spec = Spec::gigabit(args.seconds, load);
        let packets_per_s = Trace::new(&spec, References::Sampled(u64::MAX), 1).arrivals.len() as f64 / args.seconds;
        let n = (packets_per_s * REFERENCE_BYTES as f64 * 8.0 / (0.002 * spec.link_bps)).round().max(1.0) as u64;
        let ways = [(format!("1-in-{n}"), References::EveryN(n)), (format!("sampled {n}"), References::Sampled(n))];
        let rows = parallel::map(&ways, |(name, refs)| {
            let trace = Trace::new(&spec, *refs, 0x524c_4951 + (load * 100.0) as u64);
            // Whole intervals: what arrives after the trace's end (the queue draining) is left out.
            let intervals = ((args.seconds * 1e9) as u64 / interval_ns) as usize;
            let (mut truth, mut seen) = (vec![Vec::new(); intervals], vec![Vec::new(); intervals]);
            for &(at, d) in &trace.delays {
                if let Some(t) = truth.get_mut((at / interval_ns) as usize) {
                    t.push(d);
                }
            }
            for a in &trace.arrivals {
                if let (Some(d), Some(r)) = (a.reference, seen.get_mut((a.at_ns / interval_ns) as usize)) {
                    r.push(d);
                }
            }
            // Per statistic (p50, p90, p99, std-dev): the errors over the intervals.
            let mut errors = vec![Vec::new(); 4];
            let (mut worst_p99, mut refs) = ((0.0, 0.0), Vec::new());
            for (t, r) in truth.iter_mut().zip(seen.iter_mut()) {
                let (Some(t), Some(r)) = (Summary::of(t), Summary::of(r)) else { continue };
                refs.push(r.count as f64);
                for (k, e) in errors.iter_mut().enumerate().take(3) {
                    if let (Some(tq), Some(rq)) = (t.quantiles[k], r.quantiles[k]) {
                        e.push((rq - tq) / tq);
                    }
                }
                errors[3].push((r.std_dev - t.std_dev) / t.std_dev);
                if let (Some(tq), Some(rq)) = (t.quantiles[2], r.quantiles[2]) {
                    if tq > worst_p99.0 {
                        worst_p99 = (tq, rq);
                    }
                }
            }
            let stat = |e: &[f64]| {
                let worst = e.iter().copied().map(f64::abs).fold(f64::NAN, f64::max);
                format!("{:6.2} / {:6.2}", median_p90(e).0 * 100.0, worst * 100.0)
            };
            format!(
                "{load:>4} {name:>12} {:>10.0} | {:>15} {:>15} {:>15} {:>15} | {:>5.2} / {:>4.2}",
                median(&refs),
                stat(&errors[0]),
                stat(&errors[1]),
                stat(&errors[2]),
                stat(&errors[3]),
                worst_p99.0 / 1e6,
                worst_p99.1 / 1e6,
            )
        });
        rows.iter().for_each(|r| println!("{r}"));
    }
    Ok(())
}
