//! The command line's promises: clear errors for bad configuration, a missing interface and
//! missing privileges; `check` prints the effective configuration; `replay` reads pcap.

use std::process::{Command, Output};

fn pirated(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pirated")).args(args).output().expect("running pirated")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn temp_file(name: &str, contents: &[u8]) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("pirated-cli-{}-{name}", std::process::id()));
    std::fs::write(&p, contents).unwrap();
    p
}

#[test]
fn check_prints_the_effective_config() {
    let cfg = temp_file("ok.toml", b"interface = \"eth9\"\n[pirate]\nmodes = 12\n");
    let out = pirated(&["check", "--config", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("interface = \"eth9\"") && text.contains("modes = 12"), "{text}");
    // Defaults are filled in.
    assert!(text.contains("epoch = \"1s\"") && text.contains("listen = \"127.0.0.1:9464\""), "{text}");
}

#[test]
fn bad_config_names_the_line_and_key() {
    let cfg = temp_file("bad.toml", b"epoch = \"1s\"\n\n[pirate]\nepsilon = \"fast\"\n");
    let out = pirated(&["check", "--config", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("line 4") && err.contains("epsilon"), "{err}");
    let cfg = temp_file("range.toml", b"[pirate]\nmodes = 40\n");
    let err = stderr(&pirated(&["check", "--config", cfg.to_str().unwrap()]));
    assert!(
        err.contains("pirate.modes = 40") && err.contains(&format!("1..={}", pirated::pirate::config::MAX_MODES)),
        "{err}"
    );
    let err = stderr(&pirated(&["check", "--config", "/nonexistent/pirated.toml"]));
    assert!(err.contains("/nonexistent/pirated.toml"), "{err}");
}

#[test]
fn missing_interface_is_a_clear_error() {
    let out = pirated(&["run", "--interface", "no-such-if0", "--listen", "127.0.0.1:0"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("interface \"no-such-if0\" does not exist"), "{err}");
    // Its log lines went to a pipe: plain text, no terminal colour codes.
    assert!(err.contains("INFO") && err.contains("serving /metrics"), "{err}");
    assert!(!err.contains('\x1b'), "colour codes in piped logs: {err:?}");
}

#[test]
fn missing_privileges_are_a_clear_error() {
    // As an unprivileged user (this test runs as root, like the suite).
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"])
        .arg(env!("CARGO_BIN_EXE_pirated"))
        .args(["run", "--interface", "lo", "--listen", "127.0.0.1:0"])
        .output()
        .expect("setpriv");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("was refused") && err.contains("pirated needs root"), "{err}");
}

#[test]
fn replay_rejects_what_is_not_pcap() {
    let f = temp_file("junk.pcap", b"this is not a capture at all");
    let err = stderr(&pirated(&["replay", "--pcap", f.to_str().unwrap()]));
    assert!(err.contains("neither pcap nor pcapng"), "{err}");
    // A pcapng section header whose block length is zero.
    let ng =
        temp_file("ng.pcap", &[0x0a, 0x0d, 0x0d, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let err = stderr(&pirated(&["replay", "--pcap", ng.to_str().unwrap()]));
    assert!(err.contains("neither pcap nor pcapng"), "{err}");
}

/// A TAI offset beyond any the clocks have had is refused by the command line, with its range
/// (it overflowed into nanoseconds).
#[test]
fn an_absurd_tai_offset_is_refused() {
    let out = pirated(&["replay-segment", "--up", "u.pcap", "--down", "d.pcap", "--tai-offset", "99999999999"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("--tai-offset") && err.contains("-1000..=1000"), "{err}");
}
