//! The TOML configuration: schema, defaults and validation. Every key is documented, with its
//! default, in `configs/pirated.toml`; keep the two in step.

use std::{
    fmt,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    path::Path,
    str::FromStr,
    time::Duration,
};

use anyhow::Context;
use pirate_common::pirate::batch_break::BreakRules;

pub mod segment;
use segment::SegmentConfig;
use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

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
    pub metrics: MetricsConfig,
}

/// Latency-aware load balancing: the built-in forwarder and the weight controller.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LbConfig {
    pub vips: Vec<VipSpec>,
    pub forwarder: Forwarder,
    pub katran_grpc: String,
    pub position: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tunnel_source: Option<Ipv4Addr>,
    pub egress: Egress,
    pub ring_size: u32,
    pub max_connections: u32,
    pub adaptive: bool,
    pub control: crate::lb::controller::Control,
}

/// A virtual service and the reals behind it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VipSpec {
    pub address: SocketAddrV4,
    #[serde(default = "tcp")]
    pub proto: Proto,
    pub reals: Vec<Ipv4Addr>,
}

fn tcp() -> Proto {
    Proto::Tcp
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub fn number(self) -> u8 {
        match self {
            Proto::Tcp => pirate_common::parse::IPPROTO_TCP,
            Proto::Udp => pirate_common::parse::IPPROTO_UDP,
        }
    }

    /// As the configuration spells it.
    pub fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// Which balancer forwards the VIPs' packets.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Forwarder {
    /// `pirate_lb`, registered by pirated.
    Builtin,
    /// Katran's balancer, whose pinned maps pirated writes; it registers itself.
    Katran,
}

/// How the forwarder's encapsulated packets leave.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Egress {
    /// From XDP, where the kernel's routes say (XDP_TX or a redirect), else through the kernel.
    Xdp,
    /// Through the kernel's routing, always.
    Kernel,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FridgeConfig {
    pub enabled: bool,
    pub classes: Vec<FridgeClass>,
    pub fridges: Vec<FridgeSpec>,
    pub window: Dur,
    pub sla: Vec<Dur>,
    pub ring_bytes: u32,
}

/// A request→response class (`pirate_common::fridge::class`).
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum FridgeClass {
    TcpHandshake,
    Dns,
    IcmpEcho,
    TcpFlow,
}

impl FridgeClass {
    /// Its bit in `Fridges::classes`.
    pub fn bit(self) -> u32 {
        use pirate_common::fridge::class::{DNS, ICMP_ECHO_CLASS, TCP_FLOW, TCP_HANDSHAKE};
        1 << match self {
            FridgeClass::TcpHandshake => TCP_HANDSHAKE,
            FridgeClass::Dns => DNS,
            FridgeClass::IcmpEcho => ICMP_ECHO_CLASS,
            FridgeClass::TcpFlow => TCP_FLOW,
        }
    }
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FridgeSpec {
    pub slots: u32,
    pub p: Probability,
}

/// A fridge's entry probability: calibrated from the traffic, or fixed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Probability {
    Auto,
    Fixed(f64),
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PirateConfig {
    pub estimator: crate::pirate::estimate::Estimator,
    pub modes: u32,
    pub epsilon: Dur,
    pub epsilon_relative: f64,
    pub mode_span: u32,
    pub delta: AutoOr,
    pub idle_floor: Dur,
    pub min_mode_share: f64,
    pub min_time_share: f64,
    pub min_ibg_gaps: u64,
    pub intra_batch_max: Dur,
    pub min_break_ratio: f64,
    pub straggler_share: f64,
    pub min_break_time_share: f64,
    pub round_trip_floor: f64,
    pub round_trip_slack: Dur,
    pub multiplexed_short_share: f64,
    pub batch_gap: AutoOr,
    pub skip_pure_acks: bool,
    pub skip_retransmissions: bool,
    pub mark_after_short: bool,
    pub mark_acked: bool,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    pub listen: SocketAddr,
    /// Servers with per-server series at once; a new server past it is refused (and counted).
    pub max_servers: u32,
    /// Epochs without a figure after which a server's series are removed.
    pub idle_epochs: u32,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AttachMode {
    /// Driver (native) mode, falling back to generic if the driver lacks XDP support.
    Auto,
    /// Driver mode only: fail if the driver has no XDP support.
    Native,
    /// Generic (skb) mode: works on any interface, costs more per packet.
    Generic,
}

/// What pirated leaves behind when it stops.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnExit {
    /// The chain stays attached, measuring into its pinned maps: a restart takes over with no
    /// flow losing its epoch. `pirated detach` removes it.
    Keep,
    /// Detach the chain and remove the pins.
    Detach,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            instance: "default".into(),
            interface: String::new(),
            attach_mode: AttachMode::Auto,
            pin_root: crate::datapath::DEFAULT_PIN_ROOT.into(),
            on_exit: OnExit::Keep,
            epoch: Dur(Duration::from_secs(1)),
            max_flows: 65536,
            pirate: PirateConfig::default(),
            fridge: FridgeConfig::default(),
            lb: LbConfig::default(),
            segment: SegmentConfig::default(),
            metrics: MetricsConfig::default(),
        }
    }
}

impl Default for LbConfig {
    fn default() -> Self {
        LbConfig {
            vips: Vec::new(),
            forwarder: Forwarder::Builtin,
            katran_grpc: String::new(),
            position: 2,
            tunnel_source: None,
            egress: Egress::Xdp,
            ring_size: crate::lb::maglev::DEFAULT_SIZE,
            max_connections: 262_144,
            adaptive: true,
            control: crate::lb::controller::Control::default(),
        }
    }
}

impl Default for FridgeConfig {
    fn default() -> Self {
        FridgeConfig {
            enabled: true,
            classes: vec![FridgeClass::TcpHandshake, FridgeClass::Dns, FridgeClass::IcmpEcho],
            fridges: vec![FridgeSpec { slots: 4096, p: Probability::Auto }; 2],
            window: Dur(Duration::from_secs(10)),
            sla: ["10ms", "100ms", "1s"].iter().map(|s| s.parse().unwrap()).collect(),
            ring_bytes: 4 << 20,
        }
    }
}

impl Default for PirateConfig {
    fn default() -> Self {
        PirateConfig {
            estimator: crate::pirate::estimate::Estimator::default(),
            modes: 10,
            epsilon: Dur(Duration::from_micros(100)),
            epsilon_relative: 0.05,
            mode_span: 2,
            delta: AutoOr::Auto,
            idle_floor: Dur(Duration::from_millis(200)),
            min_mode_share: 0.02,
            min_time_share: 0.1,
            min_ibg_gaps: 2,
            intra_batch_max: Dur(Duration::from_millis(2)),
            min_break_ratio: 3.0,
            straggler_share: 0.05,
            min_break_time_share: 0.25,
            round_trip_floor: 0.8,
            round_trip_slack: Dur(Duration::from_micros(300)),
            multiplexed_short_share: 0.08,
            batch_gap: AutoOr::Auto,
            skip_pure_acks: true,
            skip_retransmissions: true,
            mark_after_short: true,
            mark_acked: false,
        }
    }
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig { listen: SocketAddr::from(([127, 0, 0, 1], 9464)), max_servers: 10_000, idle_epochs: 300 }
    }
}

pub const MAX_MODES: u32 = pirate_common::pirate::config::MODES_WIDE as u32;

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

    /// Checks every value `run` depends on; an error names the keys it is about ([`Invalid`]).
    pub fn validate(&self) -> anyhow::Result<()> {
        let p = &self.pirate;
        if self.instance.is_empty() || !self.instance.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return refuse(
                &["instance"],
                format!("instance = {:?}: use letters, digits, '-' and '_' (it names a directory)", self.instance),
            );
        }
        let both = self.segment.role == segment::Role::Both;
        // Its lock, <instance>.lock (`datapath::pins`), and with role "both" the downstream point's,
        // <instance>-down.lock, are file names: NAME_MAX bytes at most.
        let most = NAME_MAX - ".lock".len() - if both { DOWN_SUFFIX.len() } else { 0 };
        if self.instance.len() > most {
            let why = if both { " with segment.role = \"both\" (its downstream point is <instance>-down)" } else { "" };
            return refuse(
                &["instance"],
                format!(
                    "instance = {:?} ({} bytes): must be 1..={most} bytes{why}: it names the lock \
                     {}/<instance>.lock, a file name of at most {NAME_MAX} bytes",
                    self.instance,
                    self.instance.len(),
                    crate::datapath::pins::LOCK_DIR
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
        if !(1..=MAX_MODES).contains(&p.modes) {
            return refuse(&["pirate.modes"], format!("pirate.modes = {}: must be 1..={MAX_MODES}", p.modes));
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
        let (first_delta, which) = match p.delta {
            AutoOr::Fixed(delta) => (delta, ""),
            AutoOr::Auto => (Dur(FIRST_EPOCH_DELTA), " in a flow's first epoch with \"auto\""),
        };
        if p.idle_floor.0 <= first_delta.0 {
            return refuse(
                &["pirate.idle_floor", "pirate.delta"],
                format!("pirate.idle_floor ({}) must be above pirate.delta ({first_delta}{which})", p.idle_floor),
            );
        }
        if p.idle_floor.0 > Duration::from_secs(4) {
            return refuse(
                &["pirate.idle_floor"],
                format!("pirate.idle_floor = {}: gaps are kept up to 4.29s, so at most 4s", p.idle_floor),
            );
        }
        if p.epsilon.0 >= Duration::from_secs(1) {
            return refuse(&["pirate.epsilon"], format!("pirate.epsilon = {}: must be below 1s", p.epsilon));
        }
        if !(0.0..=0.5).contains(&p.epsilon_relative) {
            return refuse(
                &["pirate.epsilon_relative"],
                format!("pirate.epsilon_relative = {}: must be in [0, 0.5]", p.epsilon_relative),
            );
        }
        if p.mode_span > MAX_MODE_SPAN {
            return refuse(
                &["pirate.mode_span"],
                format!("pirate.mode_span = {}: must be 0 (unbounded) ..={MAX_MODE_SPAN}", p.mode_span),
            );
        }
        if p.min_break_ratio < 1.0 || !p.min_break_ratio.is_finite() {
            return refuse(
                &["pirate.min_break_ratio"],
                format!("pirate.min_break_ratio = {}: must be at least 1", p.min_break_ratio),
            );
        }
        if !(0.0..=1.0).contains(&p.min_break_time_share) {
            return refuse(
                &["pirate.min_break_time_share"],
                format!("pirate.min_break_time_share = {}: must be in [0, 1]", p.min_break_time_share),
            );
        }
        for (key, share) in
            [("round_trip_floor", p.round_trip_floor), ("multiplexed_short_share", p.multiplexed_short_share)]
        {
            if !(0.0..=1.0).contains(&share) {
                return refuse(&[&format!("pirate.{key}")], format!("pirate.{key} = {share}: must be in [0, 1]"));
            }
        }
        if p.intra_batch_max.0 >= p.idle_floor.0 {
            return refuse(
                &["pirate.intra_batch_max", "pirate.idle_floor"],
                format!(
                    "pirate.intra_batch_max ({}) must be below pirate.idle_floor ({})",
                    p.intra_batch_max, p.idle_floor
                ),
            );
        }
        if let AutoOr::Fixed(gap) = p.batch_gap {
            if gap.0.is_zero() || gap.0 >= p.idle_floor.0 {
                return refuse(
                    &["pirate.batch_gap", "pirate.idle_floor"],
                    format!("pirate.batch_gap = {gap}: must be \"auto\" or a duration above 0 and below pirate.idle_floor ({})", p.idle_floor),
                );
            }
        }
        if p.min_ibg_gaps == 0 {
            return refuse(
                &["pirate.min_ibg_gaps"],
                "pirate.min_ibg_gaps = 0: must be at least 1 (1 is the paper's rule)".to_string(),
            );
        }
        self.fridge.validate()?;
        self.lb.validate()?;
        self.segment.validate()?;
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
        if self.segment.role == segment::Role::Down && binds_alike(self.segment.listen, self.metrics.listen) {
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
        let deepest = crate::datapath::longest_pin_path(self);
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
        for (key, v) in [
            ("min_mode_share", p.min_mode_share),
            ("min_time_share", p.min_time_share),
            ("straggler_share", p.straggler_share),
        ] {
            if !(0.0..1.0).contains(&v) {
                return refuse(&[&format!("pirate.{key}")], format!("pirate.{key} = {v}: must be in [0, 1)"));
            }
        }
        Ok(())
    }

    /// The break between intra- and inter-batch gaps, for the estimator and the datapath alike.
    fn break_rules(&self) -> BreakRules {
        let p = &self.pirate;
        BreakRules {
            // Below the idle floor, at most 4 s (checked): a u32.
            intra_batch_max_ns: p.intra_batch_max.as_nanos() as u32,
            min_ratio_q10: (p.min_break_ratio * 1024.0).round() as u32,
            // Rounded down, so that a mode holding exactly `min_mode_share` still qualifies.
            min_share_q20: (p.min_mode_share * (1u64 << 20) as f64).floor() as u32,
            straggler_share_q20: (p.straggler_share * (1u64 << 20) as f64).floor() as u32,
        }
    }

    /// With `segment.role = "both"`, the downstream point's chain: on `segment.down_interface`,
    /// instance `<instance>-down` (pins of its own), no fridges, no forwarder, and a token flow
    /// table (pirated unchains Pirate there: only the segment program runs).
    pub fn downstream_point(&self) -> Option<Config> {
        (self.segment.role == segment::Role::Both).then(|| Config {
            interface: self.segment.down_interface.clone(),
            instance: format!("{}{DOWN_SUFFIX}", self.instance),
            max_flows: 1024,
            fridge: FridgeConfig { enabled: false, ..self.fridge.clone() },
            lb: LbConfig::default(),
            ..self.clone()
        })
    }

    /// Both estimators' settings.
    pub fn estimation(&self) -> crate::pirate::estimate::Settings {
        let p = &self.pirate;
        crate::pirate::estimate::Settings {
            paper: crate::pirate::estimate::paper::Denoise {
                idle_floor_ns: p.idle_floor.as_nanos(),
                min_mode_share: p.min_mode_share,
                min_time_share: p.min_time_share,
                prefer_candidates: p.mark_after_short,
                min_ibg_gaps: p.min_ibg_gaps,
            },
            batches: crate::pirate::estimate::batches::Break {
                idle_floor_ns: p.idle_floor.as_nanos(),
                rules: self.break_rules(),
                min_upper_time_share: p.min_break_time_share,
                fixed_ns: match p.batch_gap {
                    AutoOr::Auto => None,
                    AutoOr::Fixed(gap) => Some(gap.as_nanos()),
                },
            },
            acked_marks: p.mark_acked,
            round_trip_floor: p.round_trip_floor,
            round_trip_slack_ns: p.round_trip_slack.as_nanos() as f64,
            multiplexed_short_share: p.multiplexed_short_share,
            epsilon: self.params().epsilon(),
        }
    }

    /// The datapath's view of the configuration.
    pub fn params(&self) -> pirate_common::pirate::config::Params {
        use pirate_common::pirate::config::{
            Params, FLAG_ADAPTIVE_DELTA, FLAG_MARK_ACKED, FLAG_MARK_AFTER_SHORT, FLAG_SKIP_PURE_ACKS,
            FLAG_SKIP_RETRANSMISSIONS,
        };
        let p = &self.pirate;
        let mut flags = 0;
        if p.skip_pure_acks {
            flags |= FLAG_SKIP_PURE_ACKS;
        }
        if p.skip_retransmissions {
            flags |= FLAG_SKIP_RETRANSMISSIONS;
        }
        if p.mark_after_short {
            flags |= FLAG_MARK_AFTER_SHORT;
        }
        if p.mark_acked {
            flags |= FLAG_MARK_ACKED;
        }
        let delta_ns = match p.delta {
            AutoOr::Auto => {
                flags |= FLAG_ADAPTIVE_DELTA;
                FIRST_EPOCH_DELTA.as_nanos() as u64
            }
            AutoOr::Fixed(delta) => delta.as_nanos(),
        };
        Params {
            delta_ns,
            idle_floor_ns: p.idle_floor.as_nanos(),
            epsilon_ns: p.epsilon.as_nanos() as u32,
            epsilon_rel_q20: (p.epsilon_relative * (1u64 << 20) as f64).round() as u32,
            max_modes: p.modes as u16,
            mode_span: p.mode_span as u16,
            flags,
            rules: self.break_rules(),
            table_sets: pirate_common::pirate::table::sets_for(self.max_flows),
            _pad: 0,
        }
    }
}

impl FridgeConfig {
    fn validate(&self) -> anyhow::Result<()> {
        use pirate_common::fridge::MAX_FRIDGES;
        if !(1..=MAX_FRIDGES).contains(&self.fridges.len()) {
            return refuse(
                &["fridge.fridges"],
                format!("fridge.fridges has {} fridges: must be 1..={MAX_FRIDGES}", self.fridges.len()),
            );
        }
        for (k, f) in self.fridges.iter().enumerate() {
            if !f.slots.is_power_of_two() || !(16..=MAX_FRIDGE_SLOTS).contains(&f.slots) {
                return refuse(
                    &["fridge.fridges"],
                    format!("fridge.fridges[{k}].slots = {}: must be a power of two, 16..={MAX_FRIDGE_SLOTS}", f.slots),
                );
            }
            if let Probability::Fixed(p) = f.p {
                if !(p > 0.0 && p <= 1.0) {
                    return refuse(
                        &["fridge.fridges"],
                        format!("fridge.fridges[{k}].p = {p}: must be in (0, 1] or \"auto\""),
                    );
                }
            }
        }
        let total: u64 = self.fridges.iter().map(|f| f.slots as u64).sum();
        if total > MAX_FRIDGE_SLOTS as u64 {
            return refuse(
                &["fridge.fridges"],
                format!("fridge.fridges hold {total} slots: at most {MAX_FRIDGE_SLOTS} together"),
            );
        }
        if self.enabled && self.classes.is_empty() {
            return refuse(
                &["fridge.classes", "fridge.enabled"],
                "fridge.classes is empty: enable a class or set fridge.enabled = false".into(),
            );
        }
        if self.window.0.is_zero() || self.window.0 > Duration::from_secs(3600) {
            return refuse(
                &["fridge.window"],
                format!("fridge.window = {}: must be above 0 and at most 1h", self.window),
            );
        }
        if self.sla.len() > MAX_SLAS || self.sla.iter().any(|d| d.0.is_zero()) {
            return refuse(&["fridge.sla"], format!("fridge.sla: at most {MAX_SLAS} thresholds, each above 0"));
        }
        if let Some(why) = crate::datapath::ring_bytes_refusal(self.ring_bytes, MAX_FRIDGE_RING) {
            return refuse(&["fridge.ring_bytes"], format!("fridge.ring_bytes = {}: {why}", self.ring_bytes));
        }
        Ok(())
    }

    /// The datapath's view: the fridges' shape (auto probabilities start at 1: every request
    /// enters until the traffic is measured) and the enabled classes.
    pub fn shape(&self) -> pirate_common::fridge::Fridges {
        let slots_log2: Vec<u32> = self.fridges.iter().map(|f| f.slots.trailing_zeros()).collect();
        let p: Vec<f64> = self
            .fridges
            .iter()
            .map(|f| match f.p {
                Probability::Auto => 1.0,
                Probability::Fixed(p) => p,
            })
            .collect();
        let mut shape = pirate_common::fridge::Fridges::new(&slots_log2, &p).expect("validated");
        shape.classes = self.classes.iter().map(|c| c.bit()).fold(0, |a, b| a | b);
        shape
    }
}

impl LbConfig {
    /// Whether pirated balances: a VIP is configured.
    pub fn enabled(&self) -> bool {
        !self.vips.is_empty()
    }

    fn validate(&self) -> anyhow::Result<()> {
        use pirate_common::{
            ctx::FORWARD_SLOTS,
            lb::{MAX_REALS, MAX_VIPS},
        };
        if self.vips.len() > MAX_VIPS as usize {
            return refuse(&["lb.vips"], format!("lb.vips has {} VIPs: at most {MAX_VIPS}", self.vips.len()));
        }
        for (i, vip) in self.vips.iter().enumerate() {
            if vip.reals.is_empty() {
                return refuse(&["lb.vips"], format!("lb.vips[{i}] ({}) has no reals", vip.address));
            }
            if let Some(j) = self.vips[..i].iter().position(|v| (v.address, v.proto) == (vip.address, vip.proto)) {
                return refuse(&["lb.vips"], format!("lb.vips[{i}] repeats lb.vips[{j}] ({})", vip.address));
            }
            if vip.reals.len() as u64 * 100 > self.ring_size as u64 {
                return refuse(
                    &["lb.ring_size", "lb.vips"],
                    format!(
                        "lb.ring_size = {}: a ring needs at least 100 entries per real ({} reals behind {})",
                        self.ring_size,
                        vip.reals.len(),
                        vip.address
                    ),
                );
            }
        }
        let reals: usize = self.vips.iter().map(|v| v.reals.len()).sum();
        if reals >= MAX_REALS as usize {
            return refuse(&["lb.vips"], format!("lb.vips have {reals} reals together: at most {}", MAX_REALS - 1));
        }
        if self.position >= FORWARD_SLOTS {
            return refuse(
                &["lb.position"],
                format!("lb.position = {}: the forwarder slots are 0..{FORWARD_SLOTS}", self.position),
            );
        }
        if !crate::lb::maglev::is_prime(self.ring_size) || self.ring_size > MAX_RING_SIZE {
            return refuse(
                &["lb.ring_size"],
                format!("lb.ring_size = {}: must be a prime up to {MAX_RING_SIZE} (65537 is)", self.ring_size),
            );
        }
        if self.max_connections == 0 || self.max_connections > 1 << 24 {
            return refuse(
                &["lb.max_connections"],
                format!("lb.max_connections = {}: must be 1..=16777216", self.max_connections),
            );
        }
        if !self.katran_grpc.is_empty() {
            let http = self
                .katran_grpc
                .parse::<tonic::codegen::http::Uri>()
                .ok()
                .filter(|u| u.scheme_str() == Some("http") && u.host().is_some() && u.path() == "/");
            if self.forwarder != Forwarder::Katran || http.is_none() {
                return refuse(
                    &["lb.katran_grpc", "lb.forwarder"],
                    format!(
                        "lb.katran_grpc = {:?}: with forwarder = \"katran\", the address of Katran's gRPC server, \
                         http://host:port (katran_server_grpc serves plaintext on port 50051)",
                        self.katran_grpc
                    ),
                );
            }
        }
        if self.forwarder == Forwarder::Katran {
            if self.ring_size != crate::lb::katran::RING_SIZE {
                return refuse(
                    &["lb.ring_size", "lb.forwarder"],
                    format!(
                        "lb.ring_size = {}: Katran's rings have {} positions (its RING_SIZE)",
                        self.ring_size,
                        crate::lb::katran::RING_SIZE
                    ),
                );
            }
        } else if self.enabled() && self.tunnel_source.is_none() {
            return refuse(
                &["lb.tunnel_source", "lb.vips"],
                "lb.tunnel_source is not set: the forwarder needs the outer source address of the packets it \
                 encapsulates (this host's address towards the reals)"
                    .into(),
            );
        }
        if let Some((key, problem)) = self.control.problem() {
            return refuse(&[&format!("lb.control.{key}")], format!("lb.control.{problem}"));
        }
        Ok(())
    }

    /// The datapath's view.
    pub fn shape(&self) -> pirate_common::lb::LbShape {
        pirate_common::lb::LbShape {
            ring_size: self.ring_size,
            tunnel_source: self.tunnel_source.map_or([0; 4], |a| a.octets()),
            flags: match self.egress {
                Egress::Xdp => 0,
                Egress::Kernel => pirate_common::lb::EGRESS_KERNEL,
            },
        }
    }
}

/// The largest ring: a VIP's two rings then take 8 MiB.
const MAX_RING_SIZE: u32 = 1_048_573;

/// The most slots the fridges may have together (24 bytes each: 384 MiB).
const MAX_FRIDGE_SLOTS: u32 = 1 << 24;
/// The most SLA thresholds (a series per class each).
const MAX_SLAS: usize = 16;
/// The largest fridge sample ring.
const MAX_FRIDGE_RING: u32 = 256 << 20;

/// A value `validate` refuses, with the keys (`section.name`) it is about.
#[derive(Debug)]
pub struct Invalid {
    pub keys: Vec<String>,
    message: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Invalid {}

fn refuse(keys: &[&str], message: String) -> anyhow::Result<()> {
    Err(Invalid { keys: keys.iter().map(|k| k.to_string()).collect(), message }.into())
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

/// Beyond this many ε a span cap hardly differs from none.
const MAX_MODE_SPAN: u32 = 64;

/// With `delta = "auto"`, Alg. 1's δ in a flow's first epoch (the paper's choice), before its
/// own break is known.
const FIRST_EPOCH_DELTA: Duration = Duration::from_micros(500);

/// A duration written like `1s`, `250ms`, `50us` or `800ns` (TOML has no duration type).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dur(pub Duration);

impl Dur {
    pub fn as_nanos(&self) -> u64 {
        self.0.as_nanos().min(u64::MAX as u128) as u64
    }
}

impl FromStr for Dur {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let value: f64 = num.parse().map_err(|_| format!("{s:?} is not a duration like 1s, 250ms, 50us"))?;
        let scale = match unit.trim() {
            "s" => 1e9,
            "ms" => 1e6,
            "us" | "µs" => 1e3,
            "ns" => 1.0,
            other => return Err(format!("{s:?}: unknown unit {other:?} (use s, ms, us or ns)")),
        };
        let ns = value * scale;
        if !ns.is_finite() || ns > u64::MAX as f64 {
            return Err(format!("{s:?} is out of range"));
        }
        Ok(Dur(Duration::from_nanos(ns.round() as u64)))
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        let (div, unit) = [(1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "us")]
            .into_iter()
            .find(|(d, _)| ns.is_multiple_of(*d) && ns >= *d)
            .unwrap_or((1, "ns"));
        write!(f, "{}{}", ns / div, unit)
    }
}

/// A threshold derived from the traffic ("auto": the break found in each flow's modes every
/// epoch) or fixed to a duration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoOr {
    Auto,
    Fixed(Dur),
}

impl fmt::Display for AutoOr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AutoOr::Auto => f.write_str("auto"),
            AutoOr::Fixed(d) => d.fmt(f),
        }
    }
}

impl<'de> Deserialize<'de> for AutoOr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s == "auto" {
            return Ok(AutoOr::Auto);
        }
        s.parse().map(AutoOr::Fixed).map_err(|e| de::Error::custom(format!("{e}, or \"auto\"")))
    }
}

impl Serialize for AutoOr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Probability {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(f64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Number(p) => Ok(Probability::Fixed(p)),
            Raw::Text(s) if s == "auto" => Ok(Probability::Auto),
            Raw::Text(s) => Err(de::Error::custom(format!("p = {s:?}: a probability in (0, 1], or \"auto\""))),
        }
    }
}

impl Serialize for Probability {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Probability::Auto => s.serialize_str("auto"),
            Probability::Fixed(p) => s.serialize_f64(*p),
        }
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_trip() {
        for s in ["1s", "250ms", "50us", "800ns", "1500us"] {
            let d: Dur = s.parse().unwrap();
            assert_eq!(d.to_string().parse::<Dur>().unwrap(), d, "{s}");
        }
        assert_eq!("1.5ms".parse::<Dur>().unwrap().0, Duration::from_micros(1500));
        assert!("5 parsecs".parse::<Dur>().is_err());
        assert!("ms".parse::<Dur>().is_err());
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

    /// The balancer's settings are checked as `run` needs them, each error at its key's line.
    #[test]
    fn lb_errors_name_their_key() {
        let err = |text: &str| format!("{:#}", Config::parse(text).unwrap_err());
        let vip = "vips = [{ address = \"10.0.0.1:80\", reals = [\"10.1.0.1\", \"10.1.0.2\"] }]\n";
        let e = err(&format!("[lb]\n{vip}"));
        assert!(e.starts_with("line 2: lb.tunnel_source is not set"), "{e}");
        let ok = format!("[lb]\n{vip}tunnel_source = \"10.1.0.254\"\n");
        let lb = Config::parse(&ok).unwrap().lb;
        assert!(lb.enabled() && lb.vips[0].proto == Proto::Tcp && lb.shape().tunnel_source == [10, 1, 0, 254]);
        assert!(err(&format!("{ok}ring_size = 65536\n")).starts_with("line 4: lb.ring_size = 65536"));
        assert!(err(&format!("{ok}position = 3\n")).starts_with("line 4: lb.position = 3"));
        let e = err(&format!("{ok}forwarder = \"katran\"\nring_size = 65521\n"));
        assert!(e.starts_with("line 5: lb.ring_size = 65521: Katran's rings"), "{e}");
        let grpc = "katran_grpc = \"http://127.0.0.1:50051\"\n";
        let e = err(&format!("{ok}{grpc}"));
        assert!(e.starts_with("line 4: lb.katran_grpc = \"http://127.0.0.1:50051\": with forwarder"), "{e}");
        let e = err(&format!("{ok}forwarder = \"katran\"\nkatran_grpc = \"127.0.0.1:50051\"\n"));
        assert!(e.starts_with("line 5: lb.katran_grpc = \"127.0.0.1:50051\""), "{e}");
        let lb = Config::parse(&format!("{ok}forwarder = \"katran\"\n{grpc}")).unwrap().lb;
        assert_eq!(lb.katran_grpc, "http://127.0.0.1:50051");
        let e = err(&format!("{ok}[lb.control]\nalpha_low = 2.0\n"));
        assert!(e.starts_with("line 5: lb.control.alpha_low = 2"), "{e}");
        let twice = "[lb]\ntunnel_source = \"10.1.0.254\"\nvips = [{ address = \"10.0.0.1:80\", reals = [\"10.1.0.1\"] }, { address = \"10.0.0.1:80\", reals = [\"10.1.0.2\"] }]\n";
        assert!(err(twice).contains("lb.vips[1] repeats lb.vips[0]"));
    }

    /// `text` refused, the error starting with `want`.
    fn refused(text: &str, want: &str) {
        let e = format!("{:#}", Config::parse(text).expect_err(want));
        assert!(e.starts_with(want), "want {want:?}, got {e:?}");
    }

    /// Every limit `run` enforces, at its edge: the largest value is accepted, the next refused
    /// at its key's line, by key and value, with the range. (tests/tests/limits.rs loads the
    /// largest ones into the kernel and has `run` refuse the next.)
    #[test]
    fn each_limit_accepts_its_edge_and_refuses_the_next_at_its_line() {
        let lb = "[lb]\ntunnel_source = \"10.1.0.254\"\n";
        let up = "[segment]\nrole = \"up\"\nkey = \"sixteen bytes at least\"\n";
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
            ("[metrics]\nlisten = \"127.0.0.1:9464\"\n[segment]\nrole = \"down\"\nkey = \"sixteen bytes at least\"\n",
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
        assert_eq!(crate::datapath::longest_pin_path(&config), libc::PATH_MAX as usize - 1);
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

    /// `delta`'s conflict with the idle floor names the δ in force: a fixed one as configured,
    /// "auto" by its first epoch's 500us; at the line of whichever of the two keys is set.
    #[test]
    fn the_delta_error_names_its_mode() {
        let fixed = "[pirate]\nidle_floor = \"1ms\"\ndelta = \"1ms\"\n";
        refused(fixed, "line 2: pirate.idle_floor (1ms) must be above pirate.delta (1ms)");
        assert!(!format!("{:#}", Config::parse(fixed).unwrap_err()).contains("auto"));
        Config::parse("[pirate]\nidle_floor = \"1ms\"\ndelta = \"999999ns\"\nintra_batch_max = \"500us\"\n").unwrap();
        let auto = "[pirate]\ndelta = \"auto\"\nidle_floor = \"500us\"\nintra_batch_max = \"400us\"\n";
        refused(auto, "line 3: pirate.idle_floor (500us) must be above pirate.delta (500us in a flow's first epoch with \"auto\")");
        Config::parse("[pirate]\ndelta = \"auto\"\nidle_floor = \"501us\"\nintra_batch_max = \"400us\"\n").unwrap();
        refused(
            "[pirate]\ndelta = \"300ms\"\n",
            "line 2: pirate.idle_floor (200ms) must be above pirate.delta (300ms)",
        );
    }

    #[test]
    fn a_mode_of_exactly_min_mode_share_is_significant() {
        let rules = Config::default().break_rules();
        assert!(rules.significant(2, 100) && !rules.significant(1, 100));
        let odd = Config::parse("[pirate]\nmin_mode_share = 0.07\n").unwrap().break_rules();
        assert!(odd.significant(7, 100) && !odd.significant(6, 100));
    }

    #[test]
    fn batch_gap_is_auto_or_a_duration_below_the_floor() {
        let gap = |text: &str| Config::parse(&format!("[pirate]\nbatch_gap = {text}\n")).map(|c| c.pirate.batch_gap);
        assert_eq!(gap("\"auto\"").unwrap(), AutoOr::Auto);
        assert_eq!(gap("\"1500us\"").unwrap(), AutoOr::Fixed(Dur(Duration::from_micros(1500))));
        assert_eq!(
            Config::parse("[pirate]\nbatch_gap = \"3ms\"\n").unwrap().estimation().batches.fixed_ns,
            Some(3_000_000)
        );
        for bad in ["\"sometimes\"", "\"0ms\"", "\"1s\""] {
            let err = format!("{:#}", gap(bad).unwrap_err());
            assert!(err.contains("batch_gap") || err.contains("auto"), "{bad}: {err}");
        }
    }
}
