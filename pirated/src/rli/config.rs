//! `[rli]`: per-flow one-way delay across the segment from reference packets. It rides on the
//! segment's points (`[segment]`'s role, key and interval): the upstream point sends the
//! references, the downstream point takes them out of the traffic and reports each flow's delay
//! every interval. What it must agree with elsewhere, the top level checks.

use std::{net::IpAddr, time::Duration};

use pirate_common::rli::reference::{RliShape, PAYLOAD};

use super::inject::{Injection, Schedule};
use serde::{Deserialize, Serialize};

use crate::{
    datapath::{ring, spec},
    value::{refuse, Dur},
};

/// Where the references come from.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// Packets the upstream point sends into the segment (the paper's): they take their share
    /// of the link, and need nothing else.
    #[default]
    Injected,
    /// Packets of the traffic itself, sampled by a hash of their identity at both points: the
    /// link carries nothing more, their times at the upstream point cross the peer channel.
    Sampled,
}

/// Which point of the segment a datapath is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Point {
    Upstream,
    Downstream,
    /// Not in a segment.
    Neither,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RliConfig {
    pub enabled: bool,
    pub references: Origin,
    /// Sampled references: the share of packets taken as references, the same at both points.
    pub sample_share: f64,
    /// Sampled references: the niceness pirated takes (-20..=19; 0 leaves it), so that their
    /// upstream times are not kept waiting by other work on the host.
    pub nice: i32,
    /// The UDP destination port of the references: the downstream point drops every packet to
    /// it, so no traffic may use it.
    pub port: u16,
    /// Where the upstream point sends references: an address its routes send the way the
    /// measured traffic goes, through the downstream point (which takes them out before they
    /// reach it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<IpAddr>,
    /// How references are spaced: every `period` (1-in-τ), every `packets` packets of the egress
    /// interface (1-in-n), or by utilisation (`period` the longest gap).
    pub injection: Injection,
    pub period: Dur,
    pub packets: u64,
    /// The segment's capacity in bits per second, and the most of it references may take.
    pub link_bps: u64,
    pub max_share: f64,
    /// A reference delayed more than this, either way, is refused as stale.
    pub max_delay: Dur,
    /// Flows the downstream point's table holds (LRU: the least recent one makes room).
    pub max_flows: u32,
    pub ring_bytes: u32,
}

impl Default for RliConfig {
    fn default() -> Self {
        RliConfig {
            enabled: false,
            references: Origin::Injected,
            sample_share: 0.01,
            nice: -15,
            port: 9466,
            target: None,
            injection: Injection::Period,
            period: Dur(Duration::from_millis(1)),
            packets: 1000,
            link_bps: 1_000_000_000,
            max_share: 0.002,
            max_delay: Dur(Duration::from_secs(1)),
            max_flows: 65536,
            ring_bytes: 256 << 10,
        }
    }
}

/// A reference's bytes on an Ethernet wire: preamble and gap (20), Ethernet (14), IPv6 (40, the
/// larger header), UDP (8), payload, frame check (4).
pub const WIRE_BYTES: u64 = 20 + 14 + 40 + 8 + PAYLOAD as u64 + 4;

/// The largest flow table and ring.
const MAX_FLOWS: u32 = 1 << 24;
const MAX_RING: u32 = 64 << 20;

impl RliConfig {
    /// The share of `link_bps` references one `period` apart take.
    pub fn share(&self) -> f64 {
        WIRE_BYTES as f64 * 8.0 / self.period.0.as_secs_f64() / self.link_bps as f64
    }

    /// The shortest gap between two references: at it, they take `max_share` of `link_bps`.
    pub fn ceiling_ns(&self) -> u64 {
        (WIRE_BYTES as f64 * 8.0 / (self.max_share * self.link_bps as f64) * 1e9).ceil() as u64
    }

    /// The upstream point's schedule.
    pub fn schedule(&self) -> Schedule {
        Schedule::new(self.injection, self.period.as_nanos(), self.ceiling_ns(), self.packets, self.link_bps)
    }

    /// Checks the section's own values; an error names the keys it is about.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.port == 0 {
            return refuse(&["rli.port"], "rli.port = 0: references need a UDP port, 1..=65535".into());
        }
        if self.period.0 < Duration::from_micros(10) || self.period.0 > Duration::from_secs(1) {
            return refuse(&["rli.period"], format!("rli.period = {}: must be between 10us and 1s", self.period));
        }
        if self.link_bps == 0 {
            return refuse(&["rli.link_bps"], "rli.link_bps = 0: the segment's capacity, in bits per second".into());
        }
        if !(self.max_share > 0.0 && self.max_share <= 0.1) {
            return refuse(&["rli.max_share"], format!("rli.max_share = {}: must be in (0, 0.1]", self.max_share));
        }
        if self.packets == 0 {
            return refuse(&["rli.packets"], "rli.packets = 0: one reference every n packets, n at least 1".into());
        }
        if self.injection != Injection::Packets && self.share() > self.max_share {
            return refuse(
                &["rli.period", "rli.max_share", "rli.link_bps"],
                format!(
                    "rli.period = {}: references of {WIRE_BYTES} bytes would take {:.3} % of rli.link_bps = {}, \
                     above rli.max_share = {} %: a period of at least {} keeps within it",
                    self.period,
                    self.share() * 100.0,
                    self.link_bps,
                    self.max_share * 100.0,
                    humantime::format_duration(Duration::from_micros(self.ceiling_ns() / 1000 + 1)),
                ),
            );
        }
        if self.max_delay.0 < Duration::from_millis(1) || self.max_delay.0 > Duration::from_secs(60) {
            return refuse(
                &["rli.max_delay"],
                format!("rli.max_delay = {}: must be between 1ms and 60s", self.max_delay),
            );
        }
        if self.max_flows == 0 || self.max_flows > MAX_FLOWS {
            return refuse(&["rli.max_flows"], format!("rli.max_flows = {}: must be 1..={MAX_FLOWS}", self.max_flows));
        }
        if !(self.sample_share > 0.0 && self.sample_share <= 0.1) {
            return refuse(
                &["rli.sample_share"],
                format!("rli.sample_share = {}: must be in (0, 0.1]", self.sample_share),
            );
        }
        if !(-20..=19).contains(&self.nice) {
            return refuse(&["rli.nice"], format!("rli.nice = {}: a niceness is -20..=19", self.nice));
        }
        if let Some(why) = ring::bytes_refusal(self.ring_bytes, MAX_RING) {
            return refuse(&["rli.ring_bytes"], format!("rli.ring_bytes = {}: {why}", self.ring_bytes));
        }
        Ok(())
    }

    /// Whether the references are sampled packets.
    pub fn sampled(&self) -> bool {
        self.enabled && self.references == Origin::Sampled
    }

    /// What the datapath of a point loads: `rli` chained at the downstream point, and at the
    /// upstream one with sampled references. The tag's key and the sampling's seed are not
    /// here: they come of the key file, which the one who attaches reads (`RliShape::keyed`;
    /// the datapath refuses to chain `rli` without them).
    pub fn spec(&self, point: Point) -> spec::Rli {
        let enabled = self.enabled && (point == Point::Downstream || (point == Point::Upstream && self.sampled()));
        let flows = enabled && point == Point::Downstream;
        spec::Rli {
            enabled,
            shape: RliShape {
                key: [0; 2],
                max_delay_ns: self.max_delay.as_nanos(),
                // The share as a bound on a 64-bit hash (0.1 at most: no overflow).
                sample_below: if self.sampled() { (self.sample_share * 2f64.powi(64)) as u64 } else { 0 },
                sample_seed: 0,
                port: if self.enabled && !self.sampled() { self.port } else { 0 },
                upstream: (point == Point::Upstream) as u8,
                _pad: [0; 5],
            },
            // One entry where no flow is counted: maps are never empty, and a table of per-CPU
            // counters takes memory whether used or not.
            max_flows: if flows { self.max_flows } else { 1 },
            ring_bytes: self.ring_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn err(text: &str) -> String {
        format!("{:#}", Config::parse(text).unwrap_err())
    }

    const DOWN: &str = "[segment]\nrole = \"down\"\nkey_file = \"k\"\n";

    /// RLI needs a segment, a target at the upstream point, a port no service uses and a
    /// period within its share of the link; each refusal names the line.
    #[test]
    fn rli_needs_a_segment_a_target_and_a_free_port_within_its_share() {
        let e = err("[rli]\nenabled = true\n");
        assert!(e.starts_with("line 2: rli.enabled = true without a segment"), "{e}");
        let up = "[segment]\nrole = \"up\"\npeer = \"d:9465\"\nkey_file = \"k\"\n[rli]\nenabled = true\n";
        assert!(err(up).starts_with("line 6: rli.target is not set"), "{}", err(up));
        let e = err(&format!("{DOWN}[rli]\nenabled = true\nport = 53\n"));
        assert!(e.starts_with("line 6: rli.port = 53") && e.contains("drops every UDP packet"), "{e}");
        let e = err(&format!("{DOWN}[rli]\nenabled = true\nperiod = \"100us\"\n"));
        assert!(e.starts_with("line 6: rli.period = 100us") && e.contains("at least 473us"), "{e}");
        let e = err(&format!("{DOWN}[rli]\nenabled = true\nlink_bps = 10000000000\nperiod = \"20us\"\n"));
        assert!(e.starts_with("line 7: rli.period = 20us") && e.contains("at least 48us"), "{e}");
        let e = err(&format!("{DOWN}[rli]\nenabled = true\nreferences = \"sampled\"\nsample_share = 0.5\n"));
        assert!(e.starts_with("line 7: rli.sample_share = 0.5"), "{e}");
        let down = Config::parse(&format!("{DOWN}[rli]\nenabled = true\n")).unwrap();
        let spec = down.datapath().rli;
        assert!(spec.enabled && spec.shape.port == 9466 && spec.shape.key == [0; 2]);
        let up = Config::parse(&format!("{up}target = \"10.0.0.1\"\n")).unwrap();
        assert!(!up.datapath().rli.enabled, "the upstream point chains no rli");
        // Sampled: no target, no port; both points chain rli, the upstream one to stamp.
        let up = "[segment]\nrole = \"up\"\npeer = \"d:9465\"\nkey_file = \"k\"\n";
        let sampled = "[rli]\nenabled = true\nreferences = \"sampled\"\nport = 53\n";
        let (up, down) =
            (Config::parse(&format!("{up}{sampled}")).unwrap(), Config::parse(&format!("{DOWN}{sampled}")).unwrap());
        let (u, d) = (up.datapath().rli, down.datapath().rli);
        assert!(u.enabled && u.shape.upstream == 1 && u.max_flows == 1 && u.shape.port == 0, "{u:?}");
        assert!(d.enabled && d.shape.upstream == 0 && d.max_flows == 65536 && d.shape.port == 0, "{d:?}");
        assert_eq!(u.shape.sample_below, d.shape.sample_below);
        assert!((d.shape.sample_below as f64 / 2f64.powi(64) - 0.01).abs() < 1e-9);
    }
}
