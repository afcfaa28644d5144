//! The accuracy table: per case a mean row and, where the client has its own quantiles,
//! p50/p90/p99 rows, each with the truth and both estimators' errors, and the case's flows
//! whose figure pirated withheld. One run a case shows each figure; several show the median
//! error, its range and the runs that reported no figure; with the captures kept (`--pcap`),
//! the error of their requests' cycle (research: `cycle`; in parentheses where it would be
//! withheld, with why). Markdown, padded so that it lines up
//! in a terminal too; failed runs' messages follow the table (they would widen its columns),
//! and a case whose every run failed gets an `error` row.

use anyhow::Result;

use crate::{
    cases::Outcome,
    figures::{Run, Spread, ESTIMATORS},
};

const ONE_RUN: &[&str] = &["case", "stat", "truth", "paper", "err", "batches", "err", "no figure", "cycle err"];
const RUNS: &[&str] = &[
    "case",
    "stat",
    "truth",
    "paper",
    "min … max",
    "runs w/o",
    "batches",
    "min … max",
    "runs w/o",
    "no figure",
    "cycle err, min … max",
];
/// Columns that are text; the others are figures, right-aligned.
const TEXT_COLUMNS: usize = 2;

pub struct Table {
    header: &'static [&'static str],
    rows: Vec<Vec<String>>,
    errors: Vec<String>,
}

impl Table {
    /// A table of `runs` runs a case.
    pub fn new(runs: u32) -> Table {
        Table { header: if runs == 1 { ONE_RUN } else { RUNS }, rows: Vec::new(), errors: Vec::new() }
    }

    /// One case's rows from its runs' outcomes.
    pub fn add(&mut self, case: &str, outcomes: &[Result<Outcome>]) {
        let mut runs = Vec::new();
        for (k, outcome) in outcomes.iter().enumerate() {
            match outcome {
                Ok(o) => runs.push(Run::of(o)),
                Err(e) if outcomes.len() == 1 => self.errors.push(format!("{case}: {e:#}")),
                Err(e) => self.errors.push(format!("{case}, run {}/{}: {e:#}", k + 1, outcomes.len())),
            }
        }
        let Some(first) = runs.first() else {
            let dashes = (TEXT_COLUMNS..self.header.len()).map(|_| none());
            self.rows.push([case.into(), "error".into()].into_iter().chain(dashes).collect());
            return;
        };
        let (withheld, flows) = runs.iter().fold((0, 0), |(w, f), r| (w + r.withheld, f + r.flows));
        for (i, stat) in first.stats.iter().enumerate() {
            // The case's name and flows once, on its first row.
            let once = |text: String| if i == 0 { text } else { String::new() };
            let mut row = vec![once(case.into()), stat.name.clone()];
            // One run a case: its figures; several: the errors' medians and ranges over the runs
            // that succeeded.
            if self.header == ONE_RUN {
                row.push(ms(stat.truth));
                for (estimate, error) in stat.estimates.iter().zip(stat.errors()) {
                    row.extend([estimate.map_or_else(none, ms), error.map_or_else(none, percent)]);
                }
            } else {
                let truths = runs.iter().map(|r| r.stats[i].truth).collect();
                row.push(Spread::of(truths).map_or_else(none, |t| ms(t.median)));
                for e in 0..ESTIMATORS.len() {
                    let errors = runs.iter().filter_map(|r| r.stats[i].errors()[e]).collect();
                    row.extend(match Spread::of(errors) {
                        Some(s) => [percent(s.median), format!("{:+.2} … {}", s.min * 100.0, percent(s.max))],
                        None => [none(), none()],
                    });
                    row.push(format!("{}/{}", runs.iter().filter(|r| r.no_figure(i, e)).count(), runs.len()));
                }
            }
            row.push(once(format!("{withheld}/{flows} flows")));
            // The requests' cycle (with `--pcap`), against the mean, and the runs whose cycle
            // would be withheld (in one run, why).
            let cycles: Vec<f64> = runs.iter().filter_map(|r| r.cycle.map(|c| c.0)).collect();
            let withheld: Vec<&str> = runs.iter().filter_map(|r| r.cycle.and_then(|c| c.1)).collect();
            row.push(match Spread::of(cycles) {
                Some(c) if i == 0 && runs.len() == 1 => match withheld.first() {
                    Some(why) => format!("({}, {why})", percent(c.median)),
                    None => percent(c.median),
                },
                Some(c) if i == 0 => format!(
                    "{}, {:+.2} … {}, {}/{} withheld",
                    percent(c.median),
                    c.min * 100.0,
                    percent(c.max),
                    withheld.len(),
                    runs.len()
                ),
                _ => once(none()),
            });
            self.rows.push(row);
        }
    }

    pub fn render(&self) -> String {
        let width = |c: usize| {
            self.rows.iter().map(|r| r[c].chars().count()).chain([self.header[c].chars().count()]).max().unwrap_or(0)
        };
        let widths: Vec<usize> = (0..self.header.len()).map(width).collect();
        let line = |cells: &[String]| {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(c, (s, &w))| if c < TEXT_COLUMNS { format!("{s:<w$}") } else { format!("{s:>w$}") })
                .collect();
            format!("| {} |\n", padded.join(" | "))
        };
        let mut out = line(&self.header.iter().map(|h| h.to_string()).collect::<Vec<_>>());
        let rule: Vec<String> = widths
            .iter()
            .enumerate()
            .map(|(c, &w)| if c < TEXT_COLUMNS { "-".repeat(w) } else { format!("{}:", "-".repeat(w - 1)) })
            .collect();
        out += &line(&rule);
        for row in &self.rows {
            out += &line(row);
        }
        for e in &self.errors {
            out += &format!("\nerror: {e}");
        }
        out
    }
}

fn ms(seconds: f64) -> String {
    format!("{:.3} ms", seconds * 1e3)
}

/// A relative error (0.01 = 1 %).
fn percent(error: f64) -> String {
    format!("{:+.2} %", error * 100.0)
}

/// Where there is no figure.
fn none() -> String {
    "—".into()
}
