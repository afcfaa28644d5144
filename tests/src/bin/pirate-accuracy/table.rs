//! The accuracy table: per case a mean row and, where the client has its own quantiles,
//! p50/p90/p99 rows, each with the truth, both estimators and their relative errors. Markdown,
//! padded so that it lines up in a terminal too; failed cases get an `error` row, their
//! messages follow the table (they would widen its columns).

use anyhow::Result;
use pirate_tests::testbed::{batch_weighted_mean, server_quantiles, By, Of};

use crate::cases::Outcome;

const HEADER: [&str; 7] = ["case", "stat", "truth", "paper", "err", "batches", "err"];
/// Columns that are text; the others are figures, right-aligned.
const TEXT_COLUMNS: usize = 2;

#[derive(Default)]
pub struct Table {
    rows: Vec<[String; 7]>,
    errors: Vec<String>,
}

impl Table {
    pub fn add(&mut self, case: &str, outcome: &Result<Outcome>) {
        let o = match outcome {
            Ok(o) => o,
            Err(e) => {
                let none = || "—".to_string();
                self.rows.push([case.into(), "error".into(), none(), none(), none(), none(), none()]);
                self.errors.push(format!("{case}: {e:#}"));
                return;
            }
        };
        let mean = |by| batch_weighted_mean(&o.lines, Of::Server(&o.server), by).map(|(s, _)| s);
        let mut stats = vec![("mean".to_string(), o.truth.mean, mean(By::Paper), mean(By::Batches))];
        let (paper, batches) =
            (server_quantiles(&o.lines, &o.server, By::Paper), server_quantiles(&o.lines, &o.server, By::Batches));
        let at = |est: &[(f64, f64)], q: f64| est.iter().find(|e| (e.0 - q).abs() < 1e-9).map(|e| e.1);
        for &(q, truth) in &o.truth.quantiles {
            stats.push((format!("p{:.0}", q * 100.0), truth, at(&paper, q), at(&batches, q)));
        }
        for (i, (stat, truth, paper, batches)) in stats.into_iter().enumerate() {
            // The case's name once, on its first row.
            let name = if i == 0 { case.to_string() } else { String::new() };
            let (p, pe) = figure(paper, truth);
            let (b, be) = figure(batches, truth);
            self.rows.push([name, stat, ms(truth), p, pe, b, be]);
        }
    }

    pub fn render(&self) -> String {
        let width =
            |c: usize| self.rows.iter().map(|r| r[c].chars().count()).chain([HEADER[c].len()]).max().unwrap_or(0);
        let widths: Vec<usize> = (0..HEADER.len()).map(width).collect();
        let line = |cells: &[String]| {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(c, (s, &w))| if c < TEXT_COLUMNS { format!("{s:<w$}") } else { format!("{s:>w$}") })
                .collect();
            format!("| {} |\n", padded.join(" | "))
        };
        let mut out = line(&HEADER.map(String::from));
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

/// An estimate and its error relative to `truth`, or dashes where pirated gave none.
fn figure(estimate: Option<f64>, truth: f64) -> (String, String) {
    match estimate {
        Some(e) => (ms(e), format!("{:+.2} %", (e - truth) / truth * 100.0)),
        None => ("—".into(), "—".into()),
    }
}
