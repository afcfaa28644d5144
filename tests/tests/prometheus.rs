//! pirated as an operator watches it: Debian's Prometheus scrapes it on the testbed, and every
//! query of the Grafana dashboard (configs/grafana/pirated.json) returns data through
//! Prometheus's HTTP API; `promtool check metrics` passes the exposition; a server's series go
//! once it has been idle for `metrics.idle_epochs`.

use std::{
    net::SocketAddr,
    process::{Child, Stdio},
    time::Duration,
};

use anyhow::{bail, ensure, Context, Result};
use pirate_tests::{
    clients, servers,
    testbed::{metric, wait_until, OnePoint, Pirated, SERVER_IP, VP_CLIENT_IF},
};
use serde_json::Value;

/// Where the test's Prometheus listens, in pirated's namespace.
const PROMETHEUS: &str = "127.0.0.1:9091";
/// Its scrape interval, and the window the dashboard's `$__rate_interval` stands for (Grafana
/// makes it at least four scrape intervals).
const SCRAPE: &str = "1s";
const RATE_INTERVAL: &str = "4s";
const IDLE_EPOCHS: u32 = 3;

/// Debian's `prometheus`, scraping pirated every second into a store of its own; stopped (and
/// its store removed) on drop.
struct Prometheus {
    child: Child,
    dir: std::path::PathBuf,
}

impl Prometheus {
    fn start(tb: &OnePoint, target: &str) -> Result<Prometheus> {
        let dir = std::env::temp_dir().join(format!("pirated-prometheus-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: {SCRAPE}\n  evaluation_interval: {SCRAPE}\nscrape_configs:\n  \
                 - job_name: pirated\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )?;
        let child = tb
            .vp
            .command(&[
                "prometheus",
                &format!("--config.file={}", config.display()),
                &format!("--storage.tsdb.path={}", dir.join("data").display()),
                &format!("--web.listen-address={PROMETHEUS}"),
                "--log.level=warn",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting prometheus (apt install prometheus; scripts/setup.sh does)")?;
        let p = Prometheus { child, dir };
        wait_until(Duration::from_secs(30), "prometheus ready", || {
            Ok(tb.vp.run(&["curl", "-sf", &format!("http://{PROMETHEUS}/-/ready")]).is_ok())
        })?;
        Ok(p)
    }

    /// `GET /api/v1/<path>` with `params` URL-encoded; the response's `data`.
    fn api(tb: &OnePoint, path: &str, params: &[(&str, &str)]) -> Result<Value> {
        let mut args = vec!["curl".to_string(), "-sfG".into()];
        for (k, v) in params {
            args.extend(["--data-urlencode".into(), format!("{k}={v}")]);
        }
        args.push(format!("http://{PROMETHEUS}/api/v1/{path}"));
        let out = tb.vp.run(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
        let v: Value = serde_json::from_str(&out).with_context(|| format!("prometheus answered {out}"))?;
        ensure!(v["status"] == "success", "prometheus: {v}");
        Ok(v["data"].clone())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// (name or title, text) pairs.
type Named = Vec<(String, String)>;

/// The dashboard's template variables (name, `label_values(<selector>, <label>)`) and its
/// panels' queries (title, expression), rows' nested panels included.
fn dashboard() -> Result<(Named, Named)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/grafana/pirated.json");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(path)?).context(path)?;
    let vars = d["templating"]["list"].as_array().context("templating.list")?;
    let text = |v: &Value, key: &str| v[key].as_str().map(String::from).with_context(|| format!("{key} in {v}"));
    let vars: Named = vars.iter().map(|v| Ok((text(v, "name")?, text(v, "definition")?))).collect::<Result<_>>()?;
    let mut queries = Vec::new();
    let mut panels: Vec<&Value> = d["panels"].as_array().context("panels")?.iter().collect();
    while let Some(p) = panels.pop() {
        panels.extend(p["panels"].as_array().into_iter().flatten());
        for t in p["targets"].as_array().into_iter().flatten() {
            queries.push((text(p, "title")?, text(t, "expr")?));
        }
    }
    Ok((vars, queries))
}

/// `query` with the dashboard's variables: each template variable as the alternation of the
/// values it found, `$__rate_interval` as [`RATE_INTERVAL`]. Anything else starting with `$`
/// is a variable the test does not know: an error.
fn substitute(query: &str, values: &Named) -> Result<String> {
    let mut q = query.replace("$__rate_interval", RATE_INTERVAL);
    for (name, value) in values {
        q = q.replace(&format!("${name}"), value);
    }
    ensure!(!q.contains('$'), "{query}: a variable the dashboard does not define");
    Ok(q)
}

/// The series a Prometheus query returned.
fn series(data: &Value) -> usize {
    data["result"].as_array().map_or(0, Vec::len)
}

#[test]
fn every_dashboard_query_returns_data_from_a_real_prometheus() -> Result<()> {
    let tb = OnePoint::new()?;
    let service = [(Duration::from_millis(2), 0.5), (Duration::from_millis(5), 0.5)];
    servers::think_time_http(&tb.server, 8080, &service, 7)?;
    let config = format!("epoch = \"500ms\"\n[metrics]\nidle_epochs = {IDLE_EPOCHS}\nhistograms = true\n");
    let mut pirated = Pirated::start(&tb.vp, VP_CLIENT_IF, &config)?;
    let prometheus = Prometheus::start(&tb, &pirated.listen)?;
    let server: SocketAddr = format!("{SERVER_IP}:8080").parse()?;
    let clients: Vec<_> =
        (0..3).map(|_| clients::http_keepalive(&tb.client, server, Duration::from_secs(8))).collect::<Result<_>>()?;

    let (vars, queries) = dashboard()?;
    ensure!(queries.len() >= 20 && vars.len() == 2, "{} queries, {} variables", queries.len(), vars.len());
    // Each variable's values, as Grafana's label_values() finds them (later variables may
    // refer to earlier ones); then each query, until all have returned data.
    let mut values = Named::new();
    for (name, definition) in &vars {
        let inner = definition.strip_prefix("label_values(").and_then(|d| d.strip_suffix(')'));
        let (selector, label) = inner.and_then(|d| d.rsplit_once(", ")).with_context(|| definition.clone())?;
        let selector = substitute(selector, &values)?;
        let mut found = Vec::new();
        wait_until(Duration::from_secs(20), &format!("values of ${name}"), || {
            let data = Prometheus::api(&tb, &format!("label/{label}/values"), &[("match[]", &selector)])?;
            found = data.as_array().into_iter().flatten().filter_map(|v| v.as_str().map(regex_escape)).collect();
            Ok(!found.is_empty())
        })?;
        eprintln!("${name}: {found:?}");
        values.push((name.clone(), found.join("|")));
    }
    let mut waiting: Named =
        queries.iter().map(|(title, q)| Ok((title.clone(), substitute(q, &values)?))).collect::<Result<_>>()?;
    let done = wait_until(Duration::from_secs(20), "every dashboard query to return data", || {
        let mut left = Vec::new();
        for (title, q) in waiting.drain(..) {
            if series(&Prometheus::api(&tb, "query", &[("query", &q)])?) == 0 {
                left.push((title, q));
            }
        }
        waiting = left;
        Ok(waiting.is_empty())
    });
    if done.is_err() {
        bail!("queries without data after 20 s:\n{waiting:#?}");
    }
    eprintln!("{} dashboard queries returned data", queries.len());
    // The server's histogram summed as a fleet's would be: its p90 over the window lies within
    // the bounds the per-epoch p90 gauges gave over it.
    let window = |f: &str, bound: &str| {
        format!("{f}_over_time(pirated_server_response_latency_quantile_bound_seconds{{q=\"0.9\",bound=\"{bound}\"}}[{RATE_INTERVAL}])")
    };
    let histogram = format!(
        "histogram_quantile(0.9, sum by (le, server) (rate(pirated_server_batch_latency_seconds_bucket[{RATE_INTERVAL}])))"
    );
    let value = |q: &str| -> Result<f64> {
        let data = Prometheus::api(&tb, "query", &[("query", q)])?;
        data["result"][0]["value"][1].as_str().and_then(|v| v.parse().ok()).with_context(|| format!("{q}: {data}"))
    };
    let (p90, lower, upper) = (value(&histogram)?, value(&window("min", "lower"))?, value(&window("max", "upper"))?);
    eprintln!(
        "p90 from the summed histogram {:.3} ms, the gauges' bounds {:.3} … {:.3} ms",
        p90 * 1e3,
        lower * 1e3,
        upper * 1e3
    );
    ensure!(lower <= p90 && p90 <= upper, "the histogram's p90 {p90} outside [{lower}, {upper}]");

    // The exposition's names, types and help, as Prometheus's own linter reads them: in the
    // classic text format, which a client gets unless it asks for OpenMetrics, as Prometheus
    // does (and the data above shows it read).
    let exposition = pirated.metrics(&tb.vp)?;
    let url = format!("http://{}/metrics", pirated.listen);
    let openmetrics = tb.vp.run(&["curl", "-sf", "-H", "Accept: application/openmetrics-text; version=1.0.0", &url])?;
    ensure!(openmetrics.ends_with("# EOF\n") && !exposition.contains("# EOF"), "negotiation:\n{exposition}");
    let mut promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running promtool")?;
    std::io::Write::write_all(&mut promtool.stdin.take().unwrap(), exposition.as_bytes())?;
    let out = promtool.wait_with_output()?;
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success() && said.trim().is_empty(), "promtool check metrics: {said}");

    for c in clients {
        c.join().map_err(|_| anyhow::anyhow!("client panicked"))??;
    }
    // Idle from now on: the server's series go after IDLE_EPOCHS epochs without a figure.
    let label = format!("server=\"{server}\"");
    wait_until(Duration::from_secs(10), "the idle server's series to expire", || {
        let text = pirated.metrics(&tb.vp)?;
        Ok(!text.contains(&label) && metric(&text, "pirated_server_series") == 0.0)
    })?;
    let text = pirated.metrics(&tb.vp)?;
    ensure!(metric(&text, "pirated_server_series_expired_total") == 1.0, "expired:\n{text}");
    ensure!(metric(&text, "pirated_server_series_refused_total") == 0.0, "refused:\n{text}");
    drop(prometheus);
    pirated.stop()?;
    Ok(())
}

/// `s` as a regular expression matching only itself, inside a PromQL string (`\\.`: the string's
/// escaped backslash, then the dot), as Grafana escapes multi-value variables.
fn regex_escape(s: &str) -> String {
    s.chars().fold(String::new(), |mut out, c| {
        if r"\.+*?()|[]{}^$".contains(c) {
            out.push_str(r"\\");
        }
        out.push(c);
        out
    })
}
