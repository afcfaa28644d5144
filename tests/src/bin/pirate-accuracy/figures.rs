//! What one run of a case measured, per stat (the mean, the client's quantiles): the truth and
//! both estimators' figures; and, over several runs, each estimator's errors summed up.

use pirate_tests::testbed::{batch_weighted_mean, server_quantiles, By, Of};
use serde_json::Value;

use crate::cases::Outcome;

/// The estimators compared, in the table's order.
pub const ESTIMATORS: [By; 2] = [By::Paper, By::Batches];

/// One stat of one run.
pub struct Stat {
    /// `mean`, `p50`, …
    pub name: String,
    pub truth: f64,
    /// Per estimator of [`ESTIMATORS`]: its figure, or none.
    pub estimates: [Option<f64>; 2],
}

impl Stat {
    /// Each estimator's error relative to the truth (0.01 = 1 %).
    pub fn errors(&self) -> [Option<f64>; 2] {
        self.estimates.map(|e| e.map(|e| (e - self.truth) / self.truth))
    }
}

/// One run's figures for the case's server.
pub struct Run {
    pub stats: Vec<Stat>,
    /// Flows whose figure pirated withheld (`flows_without_figure`, absent: 0), and all flows
    /// it reported for the server, over its epochs.
    pub withheld: u64,
    pub flows: u64,
    /// The requests' cycle's error against the client's mean, where the capture was kept, and
    /// why the cycle would be withheld.
    pub cycle: Option<(f64, Option<&'static str>)>,
}

impl Run {
    pub fn of(o: &Outcome) -> Run {
        let mean = |by| batch_weighted_mean(&o.lines, Of::Server(&o.server), by).map(|(s, _)| s);
        let mut stats = vec![Stat { name: "mean".into(), truth: o.truth.mean, estimates: ESTIMATORS.map(mean) }];
        let quantiles = ESTIMATORS.map(|by| server_quantiles(&o.lines, &o.server, by));
        for &(q, truth) in &o.truth.quantiles {
            let at = |est: &Vec<(f64, f64)>| est.iter().find(|e| (e.0 - q).abs() < 1e-9).map(|e| e.1);
            stats.push(Stat { name: format!("p{:.0}", q * 100.0), truth, estimates: quantiles.each_ref().map(at) });
        }
        let lines = || o.lines.iter().filter(|v| v["type"] == "server" && v["server"] == o.server.as_str());
        let count = |v: &Value, field| v[field].as_u64().unwrap_or(0);
        let withheld = lines().map(|v| count(v, "flows_without_figure")).sum();
        let cycle = o.cycle.as_ref().map(|c| (c.ns * 1e-9 / o.truth.mean - 1.0, c.withheld));
        Run { stats, withheld, flows: withheld + lines().map(|v| count(v, "flows")).sum::<u64>(), cycle }
    }

    /// Whether the run reports no figure from estimator `e` for its stat `i`: it gave none, or
    /// pirated withheld some flow's figure (counted for the configured estimator; the same floor
    /// holds both).
    pub fn no_figure(&self, i: usize, e: usize) -> bool {
        self.stats[i].estimates[e].is_none() || self.withheld > 0
    }
}

/// Several runs' values of one figure: their median and range.
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// None without values.
    pub fn of(mut values: Vec<f64>) -> Option<Spread> {
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => values[n / 2],
            _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
        };
        Some(Spread { median, min: values[0], max: values[n - 1] })
    }
}
