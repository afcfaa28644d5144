//! `cargo xtask bench rli`: RLI and RLI-L (pirated's estimators) on a synthetic segment: flows of
//! Pareto sizes through a 1 Gb/s FIFO bottleneck with bursts that fill its queue for 2 ms every
//! 50 ms, at three loads; references at three rates, given as the share of the link injected
//! references would take (the paper's budget is 0.2 %), injected 1-in-n, 1-in-τ (as many), or
//! sampled 1-in-n from the regular packets (their timestamps cross the peer channel, 16 bytes
//! each, instead). Printed per load, way and rate: the references' share of the packets and of
//! the link (sampled: of the peer channel's bytes), and over flows of 100 packets or more (and
//! of 10–99) the median and p90 of the relative error of each flow's mean and standard deviation
//! of delay, against every packet's true delay, and the median signed error of RLI's means.

use anyhow::Result;
use clap::Parser;
use pirated::{
    parallel,
    rli::{
        interpolate::{estimate, Sums},
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
            let pct = |x: (f64, f64)| format!("{:6.2} / {:6.2}", x.0 * 100.0, x.1 * 100.0);
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
    Ok(())
}
