//! The TOML configuration: the top-level keys, `[metrics]`, and the aggregate of every
//! capability's section (each validated by its own `config` module). Every key is documented,
//! with its default, in `configs/pirated.toml`; keep the two in step.

use std::{net::SocketAddr, path::Path, time::Duration};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::{
    datapath::{pins::LOCK_DIR, AttachMode, OnExit, Spec, DEFAULT_PIN_ROOT},
    fridge::config::FridgeConfig,
    lb::config::LbConfig,
    pirate::config::PirateConfig,
    rli::config::{Point, RliConfig},
    segment::config::{Role, SegmentConfig},
    value::{refuse, Dur, Invalid},
};

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Names the pin directory /sys/fs/bpf/pirated/<instance>; two daemons need two names.
    pub instance: String,
    /// The client-facing interface (requests arrive on it).
    pub interface: String,
    pub attach_mode: AttachMode,
    /// The bpffs directory holding each instance's pins.
    pub pin_root: String,
    pub on_exit: OnExit,
    pub epoch: Dur,
    pub max_flows: u32,
    pub pirate: PirateConfig,
    pub fridge: FridgeConfig,
    pub lb: LbConfig,
    pub segment: SegmentConfig,
    pub rli: RliConfig,
    pub metrics: MetricsConfig,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    pub listen: SocketAddr,
    /// Servers with per-server series at once; a new server past it is refused (and counted).
    pub max_servers: u32,
    /// Epochs without a figure after which a server's series are removed.
    pub idle_epochs: u32,
    /// A latency histogram per server (644 series each), which sums across pirateds.
    pub histograms: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            instance: "default".into(),
            interface: String::new(),
            attach_mode: AttachMode::Auto,
            pin_root: DEFAULT_PIN_ROOT.into(),
            on_exit: OnExit::Keep,
            epoch: Dur(Duration::from_secs(1)),
            max_flows: 65536,
            pirate: PirateConfig::default(),
            fridge: FridgeConfig::default(),
            lb: LbConfig::default(),
            segment: SegmentConfig::default(),
            rli: RliConfig::default(),
            metrics: MetricsConfig::default(),
        }
    }
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            max_servers: 10_000,
            idle_epochs: 300,
            histograms: false,
        }
    }
}

impl Config {
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    /// Parses and validates; syntax and type errors carry the line and column, values out of
    /// their range the line of their key (or of the other key they conflict with) where it is set.
    pub fn parse(text: &str) -> anyhow::Result<Config> {
        let config: Config = toml::from_str(text)?;
        config.validate().map_err(|e| {
            let line = e.downcast_ref::<Invalid>().and_then(|i| i.keys.iter().find_map(|k| line_of(text, k)));
            match line {
                Some(line) => e.context(format!("line {line}")),
                None => e,
            }
        })?;
        Ok(config)
    }

    /// Checks every value `run` depends on: the top level here, then each section's own
    /// validation, then what sections must agree on; an error names the keys it is about
    /// ([`Invalid`]).
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.instance.is_empty() || !self.instance.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return refuse(
                &["instance"],
                format!("instance = {:?}: use letters, digits, '-' and '_' (it names a directory)", self.instance),
            );
        }
        let both = self.segment.role == Role::Both;
        // Its lock, <instance>.lock (`datapath::pins`), and with role "both" the downstream point's,
        // <instance>-down.lock, are file names: NAME_MAX bytes at most.
        let most = NAME_MAX - ".lock".len() - if both { DOWN_SUFFIX.len() } else { 0 };
        if self.instance.len() > most {
            let why = if both { " with segment.role = \"both\" (its downstream point is <instance>-down)" } else { "" };
            return refuse(
                &["instance"],
                format!(
                    "instance = {:?} ({} bytes): must be 1..={most} bytes{why}: it names the lock \
                     {LOCK_DIR}/<instance>.lock, a file name of at most {NAME_MAX} bytes",
                    self.instance,
                    self.instance.len(),
                ),
            );
        }
        if !self.pin_root.starts_with('/') {
            return refuse(&["pin_root"], format!("pin_root = {:?}: must be an absolute path on bpffs", self.pin_root));
        }
        if let Some(problem) = pin_root_problem(&self.pin_root) {
            return refuse(&["pin_root"], format!("pin_root = {:?}: {problem}", self.pin_root));
        }
        if !self.interface.is_empty() && !is_interface_name(&self.interface) {
            return refuse(&["interface"], format!("interface = {:?}: {INTERFACE_NAME}", self.interface));
        }
        let epoch = self.epoch.0;
        if epoch < Duration::from_millis(10) || epoch > Duration::from_secs(60) {
            return refuse(&["epoch"], format!("epoch = {}: must be between 10ms and 60s", self.epoch));
        }
        if self.max_flows == 0 || self.max_flows > 1 << 24 {
            return refuse(&["max_flows"], format!("max_flows = {}: must be 1..=16777216", self.max_flows));
        }
        let m = &self.metrics;
        if m.max_servers == 0 || m.max_servers > 1 << 24 {
            return refuse(
                &["metrics.max_servers"],
                format!("metrics.max_servers = {}: must be 1..=16777216", m.max_servers),
            );
        }
        if m.idle_epochs == 0 {
            return refuse(&["metrics.idle_epochs"], "metrics.idle_epochs = 0: must be at least 1".to_string());
        }
        self.pirate.validate()?;
        self.fridge.validate()?;
        self.lb.validate()?;
        self.segment.validate()?;
        self.rli.validate()?;
        self.validate_rli()?;
        if both && self.segment.down_interface == self.interface {
            return refuse(
                &["segment.down_interface"],
                format!(
                    "segment.down_interface = {:?} is `interface` too: the downstream point needs the other port",
                    self.interface
                ),
            );
        }
        if both && !is_interface_name(&self.segment.down_interface) {
            return refuse(
                &["segment.down_interface"],
                format!("segment.down_interface = {:?}: {INTERFACE_NAME}", self.segment.down_interface),
            );
        }
        if self.segment.role == Role::Down && binds_alike(self.segment.listen, self.metrics.listen) {
            return refuse(
                &["segment.listen", "metrics.listen", "segment.role"],
                format!(
                    "segment.listen = {}: metrics.listen ({}) binds that port too: the downstream point's listener \
                     needs another port (or another address, neither of them 0.0.0.0 or [::])",
                    self.segment.listen, self.metrics.listen
                ),
            );
        }
        // After the sections: the layout marker's name comes of their (valid) sizes.
        let deepest = self.longest_pin_path();
        let path_max = libc::PATH_MAX as usize - 1;
        if deepest > path_max {
            return refuse(
                &["pin_root", "instance"],
                format!(
                    "pin_root = {:?} ({} bytes): must be at most {} bytes with this instance and map layout: the \
                     deepest pin's path would have {deepest} bytes, and the kernel takes at most {path_max} (PATH_MAX)",
                    self.pin_root,
                    self.pin_root.len(),
                    self.pin_root.len().saturating_sub(deepest - path_max)
                ),
            );
        }
        Ok(())
    }

    /// The longest path pirated makes under `pin_root` for this instance, or for its downstream
    /// point with `segment.role = "both"` (`Spec::longest_pin_path`).
    fn longest_pin_path(&self) -> usize {
        let down = self.downstream_point().map_or(0, |down| down.datapath().longest_pin_path());
        down.max(self.datapath().longest_pin_path())
    }

    /// With `segment.role = "both"`, the downstream point's chain: on `segment.down_interface`,
    /// instance `<instance>-down` (pins of its own), no fridges, no forwarder, and a token flow
    /// table (pirated unchains Pirate there: only the segment program runs).
    pub fn downstream_point(&self) -> Option<Config> {
        (self.segment.role == Role::Both).then(|| Config {
            interface: self.segment.down_interface.clone(),
            instance: format!("{}{DOWN_SUFFIX}", self.instance),
            max_flows: 1024,
            fridge: FridgeConfig { enabled: false, ..self.fridge.clone() },
            lb: LbConfig::default(),
            ..self.clone()
        })
    }

    /// Whether this configuration's chain is a segment's downstream point: role "down", or the
    /// downstream half of role "both" (`downstream_point`).
    fn is_downstream_point(&self) -> bool {
        match self.segment.role {
            Role::Down => true,
            Role::Both => self.interface == self.segment.down_interface,
            _ => false,
        }
    }

    /// Which point of a segment this configuration's chain is, for `[rli]`.
    fn point(&self) -> Point {
        match self.segment.role {
            Role::Off => Point::Neither,
            _ if self.is_downstream_point() => Point::Downstream,
            _ => Point::Upstream,
        }
    }

    /// What `[rli]` needs of the rest: a segment to ride on, and for injected references a
    /// target for the upstream point's and a port no traffic the configuration knows of uses.
    fn validate_rli(&self) -> anyhow::Result<()> {
        let rli = &self.rli;
        if !rli.enabled {
            return Ok(());
        }
        if self.segment.role == Role::Off {
            return refuse(
                &["rli.enabled", "segment.role"],
                "rli.enabled = true without a segment: RLI measures between the segment's points (set [segment] \
                 role, and its key_file for the references' tags)"
                    .into(),
            );
        }
        if rli.sampled() {
            return Ok(());
        }
        if self.segment.role != Role::Down && rli.target.is_none() {
            return refuse(
                &["rli.target", "rli.enabled"],
                "rli.target is not set: the upstream point sends its references to an address routed the way the \
                 measured traffic goes, through the downstream point (which takes them out)"
                    .into(),
            );
        }
        if rli.port < 1024 {
            return refuse(
                &["rli.port"],
                format!(
                    "rli.port = {}: a port below 1024 belongs to a service (53 DNS, 123 NTP, 443 QUIC…), and the \
                     downstream point drops every UDP packet to rli.port",
                    rli.port
                ),
            );
        }
        if let Some(vip) = self.lb.vips.iter().find(|v| v.address.port() == rli.port) {
            return refuse(
                &["rli.port"],
                format!(
                    "rli.port = {}: VIP {} takes that port, and the downstream point drops every UDP packet to rli.port",
                    rli.port, vip.address
                ),
            );
        }
        Ok(())
    }

    /// What the datapath loads, attaches and pins for this configuration.
    pub fn datapath(&self) -> Spec {
        Spec {
            instance: self.instance.clone(),
            interface: self.interface.clone(),
            attach_mode: self.attach_mode,
            pin_root: self.pin_root.clone(),
            on_exit: self.on_exit,
            pirate: self.pirate.spec(self.max_flows),
            fridge: self.fridge.spec(),
            lb: self.lb.spec(),
            segment: self.segment.spec(),
            rli: self.rli.spec(self.point()),
        }
    }
}

/// The line (from 1) of `text` that sets `key` (`section.name`, or `name` at the top), if one does.
fn line_of(text: &str, key: &str) -> Option<usize> {
    let (section, name) = key.rsplit_once('.').unwrap_or(("", key));
    let mut current = "";
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = header.trim();
            continue;
        }
        let Some((lhs, _)) = line.split_once('=') else { continue };
        let lhs = lhs.trim();
        if (current == section && lhs == name) || (current.is_empty() && lhs == key) {
            return Some(i + 1);
        }
    }
    None
}

/// The downstream point's instance with `segment.role = "both"`: `<instance>-down`.
const DOWN_SUFFIX: &str = "-down";

/// The longest file name (Linux's NAME_MAX).
const NAME_MAX: usize = libc::NAME_MAX as usize;

/// What an interface name may be, for errors.
const INTERFACE_NAME: &str =
    "an interface name has 1..=15 bytes (IFNAMSIZ), none of them '/', ':' or white space, and is not \".\" or \"..\"";

/// Whether `name` can name a network interface: Linux's `dev_valid_name`. (A name it refuses
/// names no interface, and `run` would look for it in vain.)
fn is_interface_name(name: &str) -> bool {
    let bad = |c: char| c == '/' || c == ':' || c == '\0' || c.is_ascii_whitespace() || c == '\x0b';
    (1..libc::IFNAMSIZ).contains(&name.len()) && name != "." && name != ".." && !name.contains(bad)
}

/// Why `run` could not make its pin directory under `pin_root`, if it could not: a component
/// longer than NAME_MAX, or one with a dot under /sys/fs/bpf (the bpffs mount `run` makes there
/// if none is: bpffs refuses such names, reserving them).
fn pin_root_problem(pin_root: &str) -> Option<String> {
    use std::path::Component;
    let path = Path::new(pin_root);
    let names = |p: &'_ Path| {
        p.components()
            .filter_map(|c| match c {
                Component::Normal(name) => name.to_str().map(str::to_owned),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    if let Some(long) = names(path).into_iter().find(|n| n.len() > NAME_MAX) {
        return Some(format!("its component {long:?} has {} bytes: at most {NAME_MAX} (NAME_MAX)", long.len()));
    }
    let on_bpffs = path.strip_prefix("/sys/fs/bpf").ok()?;
    let dotted = names(on_bpffs).into_iter().find(|n| n.contains('.'))?;
    Some(format!("{dotted:?} has a dot, which bpffs refuses in names (under /sys/fs/bpf: no dots)"))
}

/// Whether two listeners on `a` and `b` take the same port: the same port (not 0, which picks
/// a free one) on the same address, or one of them on every address (0.0.0.0 covers IPv4's,
/// [::] both families' too: Linux's sockets are dual-stack unless told otherwise).
fn binds_alike(a: SocketAddr, b: SocketAddr) -> bool {
    let covers =
        |any: std::net::IpAddr, other: std::net::IpAddr| any.is_unspecified() && (any.is_ipv6() || other.is_ipv4());
    let (x, y) = (a.ip().to_canonical(), b.ip().to_canonical());
    a.port() == b.port() && a.port() != 0 && (x == y || covers(x, y) || covers(y, x))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The ranges as the docs and errors write them ("at most 1h") are what a file may say.
    #[test]
    fn durations_are_taken_as_the_docs_write_them() {
        let c = Config::parse("epoch = \"1m\"\n[fridge]\nwindow = \"1h\"\n[segment]\ninterval = \"1h\"\n").unwrap();
        assert_eq!((c.epoch.0, c.fridge.window.0), (Duration::from_secs(60), Duration::from_secs(3600)));
        assert_eq!(c.segment.interval.0, Duration::from_secs(3600));
        refused(
            "[fridge]\nwindow = \"1h 1ns\"\n",
            "line 2: fridge.window = 3600000000001ns: must be above 0 and at most 1h",
        );
    }

    #[test]
    fn shipped_config_is_the_default() {
        let shipped = include_str!("../../configs/pirated.toml");
        let parsed = Config::parse(shipped).unwrap();
        assert_eq!(parsed, Config { interface: parsed.interface.clone(), ..Config::default() });
    }

    #[test]
    fn errors_name_the_line_and_key() {
        let err = Config::parse("epoch = \"1s\"\n[pirate]\nmodse = 3\n").unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("line 3") && msg.contains("modse"), "{msg}");
        let err = Config::parse("[pirate]\nmodes = 17\n").unwrap_err();
        assert!(format!("{err:#}").contains("pirate.modes = 17"), "{err:#}");
        let err = Config::parse("epoch = \"fast\"\n").unwrap_err();
        assert!(format!("{err:#}").contains("line 1"), "{err:#}");
    }

    /// A value out of its range names the line of its key, or of the other key of a pair when
    /// only that one is in the file; and the δ it conflicts with is named as configured.
    #[test]
    fn range_errors_name_the_line_of_their_key() {
        let err = |text: &str| format!("{:#}", Config::parse(text).unwrap_err());
        let e = err("epoch = \"1s\"\n[pirate]\nepsilon = \"100us\"\nmodes = 40\n");
        assert!(e.starts_with("line 4: pirate.modes = 40"), "{e}");
        assert!(err("max_flows = 0\n").starts_with("line 1: max_flows = 0"));
        assert!(err("pirate.modes = 0\n").starts_with("line 1: pirate.modes = 0"));
        let e = err("[metrics]\nlisten = \"127.0.0.1:1\"\n[pirate]\ndelta = \"300ms\"\n");
        assert!(e.starts_with("line 4: pirate.idle_floor (200ms) must be above pirate.delta (300ms)"), "{e}");
        assert!(!e.contains("auto"), "a fixed delta is not \"auto\": {e}");
        let e = err("[pirate]\nidle_floor = \"400us\"\n");
        assert!(e.starts_with("line 2:") && e.contains("(500us in a flow's first epoch with \"auto\")"), "{e}");
        // Not in the file: the default is at fault, and no line is named.
        let e = format!("{:#}", Config { max_flows: 0, ..Config::default() }.validate().unwrap_err());
        assert!(e.starts_with("max_flows = 0"), "{e}");
    }

    /// `text` refused, the error starting with `want`.
    pub(crate) fn refused(text: &str, want: &str) {
        let e = format!("{:#}", Config::parse(text).expect_err(want));
        assert!(e.starts_with(want), "want {want:?}, got {e:?}");
    }

    /// Every limit `run` enforces, at its edge: the largest value is accepted, the next refused
    /// at its key's line, by key and value, with the range. (tests/tests/limits.rs loads the
    /// largest ones into the kernel and has `run` refuse the next.)
    #[test]
    fn each_limit_accepts_its_edge_and_refuses_the_next_at_its_line() {
        let lb = "[lb]\ntunnel_source = \"10.1.0.254\"\n";
        let up = "[segment]\nrole = \"up\"\nkey_file = \"k\"\n";
        let both = "interface = \"eth0\"\n[segment]\nrole = \"both\"\ndown_interface = \"eth1\"";
        #[rustfmt::skip]
        let edges: &[(&str, &str, &str, &str)] = &[
            // (what both have, the largest accepted, the smallest refused, the error's start)
            ("", "max_flows = 16777216", "max_flows = 16777217", "line 1: max_flows = 16777217: must be 1..=16777216"),
            ("", "max_flows = 1", "max_flows = 0", "line 1: max_flows = 0: must be 1..=16777216"),
            ("[metrics]\n", "max_servers = 16777216", "max_servers = 16777217", "line 2: metrics.max_servers = 16777217: must be 1..=16777216"),
            ("[metrics]\n", "max_servers = 1", "max_servers = 0", "line 2: metrics.max_servers = 0: must be 1..=16777216"),
            ("[metrics]\n", "idle_epochs = 1", "idle_epochs = 0", "line 2: metrics.idle_epochs = 0: must be at least 1"),
            ("", "epoch = \"60s\"", "epoch = \"60000000001ns\"", "line 1: epoch = 60000000001ns: must be between 10ms and 60s"),
            ("", "epoch = \"10ms\"", "epoch = \"9999999ns\"", "line 1: epoch = 9999999ns: must be between"),
            ("[pirate]\n", "modes = 12", "modes = 13", "line 2: pirate.modes = 13: must be 1..=12"),
            ("[pirate]\n", "idle_floor = \"4s\"", "idle_floor = \"4000000001ns\"", "line 2: pirate.idle_floor = 4000000001ns:"),
            ("[pirate]\n", "mode_span = 64", "mode_span = 65", "line 2: pirate.mode_span = 65: must be 0 (unbounded) ..=64"),
            ("[pirate]\n", "multiplexed_short_share = 1", "multiplexed_short_share = 1.1", "line 2: pirate.multiplexed_short_share = 1.1: must be in [0, 1]"),
            ("[fridge]\n", "fridges = [{ slots = 16777216, p = 1 }]", "fridges = [{ slots = 33554432, p = 1 }]",
                "line 2: fridge.fridges[0].slots = 33554432: must be a power of two, 16..=16777216"),
            ("[fridge]\n", "fridges = [{ slots = 8388608, p = 1 }, { slots = 8388608, p = 1 }]",
                "fridges = [{ slots = 8388608, p = 1 }, { slots = 16777216, p = 1 }]",
                "line 2: fridge.fridges hold 25165824 slots: at most 16777216 together"),
            ("[fridge]\n", "ring_bytes = 268435456", "ring_bytes = 536870912",
                "line 2: fridge.ring_bytes = 536870912: must be a power of two, 4096..=268435456"),
            ("[fridge]\n", "ring_bytes = 4096", "ring_bytes = 2048", "line 2: fridge.ring_bytes = 2048: must be a power of two, 4096.."),
            ("[fridge]\n", "window = \"3600s\"", "window = \"3600000000001ns\"", "line 2: fridge.window = 3600000000001ns:"),
            ("[lb]\n", "ring_size = 1048573", "ring_size = 1048574", "line 2: lb.ring_size = 1048574: must be a prime up to 1048573"),
            ("[lb]\n", "max_connections = 16777216", "max_connections = 16777217",
                "line 2: lb.max_connections = 16777217: must be 1..=16777216"),
            ("[lb]\n", "position = 2", "position = 3", "line 2: lb.position = 3: the forwarder slots are 0..3"),
            (lb, &vips(64, 1), &vips(65, 1), "line 4: lb.vips has 65 VIPs: at most 64"),
            (lb, &vips(63, 65), &vips(64, 64), "line 4: lb.vips have 4096 reals together: at most 4095"),
            ("[segment]\n", "lda_rows = 65536", "lda_rows = 65538", "line 2: segment.lda_rows = 65538: must be even, 2..=65536"),
            ("[segment]\n", "rda_buckets = 65536", "rda_buckets = 65537", "line 2: segment.rda_buckets = 65537: must be 1..=65536"),
            ("[segment]\n", "rda_banks = 4", "rda_banks = 5", "line 2: segment.rda_banks = 5: must be 1..=4"),
            ("[segment]\n", "sample_zeros = 32", "sample_zeros = 33", "line 2: segment.sample_zeros = 33: must be 0..=32"),
            ("[segment]\n", "cache_ring_bytes = 268435456", "cache_ring_bytes = 536870912",
                "line 2: segment.cache_ring_bytes = 536870912: must be a power of two, 4096..=268435456"),
            ("[segment]\n", "interval = \"3600s\"", "interval = \"3600000000001ns\"",
                "line 2: segment.interval = 3600000000001ns: must be between 100ms and 1h"),
            // Not IFNAMSIZ: `run` would look for the interface in vain.
            ("", "interface = \"abcdefghijklmno\"", "interface = \"abcdefghijklmnop\"",
                "line 1: interface = \"abcdefghijklmnop\": an interface name has 1..=15 bytes"),
            ("", "interface = \"eth0.100\"", "interface = \"eth0:1\"", "line 1: interface = \"eth0:1\": an interface name"),
            ("", "interface = \"..a\"", "interface = \"..\"", "line 1: interface = \"..\": an interface name"),
            ("", "interface = \"a-b_c\"", "interface = \"a b\"", "line 1: interface = \"a b\": an interface name"),
            ("interface = \"eth0\"\n[segment]\nrole = \"both\"\n", "down_interface = \"abcdefghijklmno\"",
                "down_interface = \"abcdefghijklmnop\"",
                "line 4: segment.down_interface = \"abcdefghijklmnop\": an interface name has 1..=15 bytes"),
            // Its lock's file name: NAME_MAX.
            ("", &format!("instance = \"{}\"", "i".repeat(250)), &format!("instance = \"{}\"", "i".repeat(251)),
                &format!("line 1: instance = \"{}\" (251 bytes): must be 1..=250 bytes: it names the lock", "i".repeat(251))),
            ("", &format!("instance = \"{}\"\n{both}", "i".repeat(245)), &format!("instance = \"{}\"\n{both}", "i".repeat(246)),
                &format!("line 1: instance = \"{}\" (246 bytes): must be 1..=245 bytes with segment.role = \"both\"", "i".repeat(246))),
            // The directories `run` makes.
            ("", &format!("pin_root = \"/run/{}\"", "p".repeat(255)), &format!("pin_root = \"/run/{}\"", "p".repeat(256)),
                &format!("line 1: pin_root = \"/run/{p}\": its component \"{p}\" has 256 bytes: at most 255", p = "p".repeat(256))),
            ("", "pin_root = \"/sys/fs/bpf/../pirated\"", "pin_root = \"/sys/fs/bpf/pirated.v2\"",
                "line 1: pin_root = \"/sys/fs/bpf/pirated.v2\": \"pirated.v2\" has a dot, which bpffs refuses"),
            // The downstream point's listener and /metrics' on one port.
            ("[metrics]\nlisten = \"127.0.0.1:9464\"\n[segment]\nrole = \"down\"\nkey_file = \"k\"\n",
                "listen = \"[::1]:9464\"", "listen = \"0.0.0.0:9464\"",
                "line 6: segment.listen = 0.0.0.0:9464: metrics.listen (127.0.0.1:9464) binds that port too"),
            // Where the upstream point connects: host:port.
            (up, "peer = \"d:65535\"", "peer = \"d\"", "line 4: segment.peer = \"d\": must be the downstream point's listen address, host:port"),
            (up, "peer = \"[::1]:1\"", "peer = \"[::1]:0\"", "line 4: segment.peer = \"[::1]:0\""),
            (up, "peer = \"::1:1\"", "peer = \":9465\"", "line 4: segment.peer = \":9465\""),
        ];
        for (both, ok, bad, want) in edges {
            let ok = format!("{both}{ok}\n");
            if let Err(e) = Config::parse(&ok) {
                panic!("{ok:?} refused: {e:#}");
            }
            refused(&format!("{both}{bad}\n"), want);
        }
    }

    /// `n` VIPs of `reals` reals each (distinct), as `lb.vips`.
    fn vips(n: usize, reals: usize) -> String {
        let real = |i: usize| format!("\"10.{}.{}.{}\"", 100 + i / 65536, (i / 256) % 256, i % 256);
        let vip = |v: usize| {
            let reals: Vec<String> = (v * reals..(v + 1) * reals).map(real).collect();
            format!("{{ address = \"10.0.0.{v}:80\", reals = [{}] }}", reals.join(", "))
        };
        format!("ring_size = 6521\nvips = [{}]", (0..n).map(vip).collect::<Vec<_>>().join(", "))
    }

    /// The deepest pin under `pin_root` has a path of at most PATH_MAX - 1 bytes: the longest
    /// `pin_root` check accepts makes one of exactly that length, the next is refused by its line.
    #[test]
    fn pin_root_leaves_room_for_the_deepest_pin() {
        for len in 1000..libc::PATH_MAX as usize + 1 {
            let path = long_path(len);
            assert!(path.len() == len && !path.ends_with('/') && !path.contains("//"), "{len}");
        }
        let with = |len: usize| format!("instance = \"{}\"\npin_root = \"{}\"\n", "i".repeat(250), long_path(len));
        let longest = (1000..libc::PATH_MAX as usize).rev().find(|&len| Config::parse(&with(len)).is_ok()).unwrap();
        let config = Config::parse(&with(longest)).unwrap();
        assert_eq!(config.longest_pin_path(), libc::PATH_MAX as usize - 1);
        let e = format!("{:#}", Config::parse(&with(longest + 1)).unwrap_err());
        let want = format!(
            "line 2: pin_root = \"{}\" ({} bytes): must be at most {longest} bytes",
            long_path(longest + 1),
            longest + 1
        );
        assert!(e.starts_with(&want), "{e}");
    }

    /// An absolute path under /sys/fs/bpf of `len` bytes (at least 13): components of 100
    /// bytes, and one of what is left.
    fn long_path(len: usize) -> String {
        let mut path = String::from("/sys/fs/bpf");
        while len - path.len() > 102 {
            path.push('/');
            path.push_str(&"p".repeat(100));
        }
        path.push('/');
        path.push_str(&"q".repeat(len - path.len()));
        path
    }

    /// Two listeners on a port: the same address, or one of them on every address of its family
    /// (IPv6's taking IPv4's too); not two families' own addresses, nor port 0.
    #[test]
    fn listeners_on_one_port_are_told_apart_as_linux_does() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        for (x, y) in [
            ("127.0.0.1:9", "127.0.0.1:9"),
            ("0.0.0.0:9", "127.0.0.1:9"),
            ("[::]:9", "127.0.0.1:9"),
            ("[::]:9", "[::1]:9"),
            ("[::ffff:127.0.0.1]:9", "127.0.0.1:9"),
        ] {
            assert!(binds_alike(a(x), a(y)) && binds_alike(a(y), a(x)), "{x} {y}");
        }
        for (x, y) in [
            ("0.0.0.0:9", "[::1]:9"),
            ("127.0.0.1:9", "[::1]:9"),
            ("127.0.0.1:9", "127.0.0.1:8"),
            ("0.0.0.0:0", "0.0.0.0:0"),
        ] {
            assert!(!binds_alike(a(x), a(y)) && !binds_alike(a(y), a(x)), "{x} {y}");
        }
    }
}
