//! `[segment]`: two-point one-way latency (LDA and RDA) between an upstream point and a
//! downstream one: each a pirated with this section, peering over TCP, or one pirated on two
//! interfaces.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use pirate_common::segment::{
    lda::{LdaShape, MAX_BANKS as LDA_MAX_BANKS},
    rda::{RdaShape, MAX_BANKS as RDA_MAX_BANKS},
    SegmentShape, LDA, RDA,
};
use serde::{Deserialize, Serialize};

use crate::{
    datapath::{ring, spec},
    psk::Psk,
    value::{refuse, Dur},
};

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SegmentConfig {
    pub role: Role,
    pub interval: Dur,
    pub listen: SocketAddr,
    pub peer: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub down_interface: String,
    /// Refused when set, saying where the key goes now (see [`SegmentConfig::validate`]).
    #[serde(skip_serializing)]
    pub key: Option<toml::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    pub lda: bool,
    pub lda_rows: u32,
    pub lda_loss: Vec<f64>,
    pub packets: u64,
    pub rda: bool,
    pub rda_buckets: u32,
    pub rda_banks: u32,
    pub sample_zeros: u32,
    pub cache_packets: u32,
    pub cache_ring_bytes: u32,
}

/// Which end of the segment this pirated is.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Off,
    /// Upstream: connects to the downstream point and sends its banks each interval.
    Up,
    /// Downstream: listens for the upstream point, reconciles both points' banks and reports.
    Down,
    /// Both points in one pirated: upstream on `interface`, downstream on `down_interface`.
    Both,
}

impl Default for SegmentConfig {
    fn default() -> Self {
        SegmentConfig {
            role: Role::Off,
            interval: Dur(Duration::from_secs(1)),
            listen: SocketAddr::from(([0, 0, 0, 0], 9465)),
            peer: String::new(),
            down_interface: String::new(),
            key: None,
            key_file: None,
            lda: true,
            lda_rows: 512,
            lda_loss: vec![0.005, 0.1],
            packets: 100_000,
            rda: true,
            rda_buckets: 2048,
            rda_banks: 2,
            sample_zeros: 0,
            cache_packets: 1 << 20,
            cache_ring_bytes: 4 << 20,
        }
    }
}

/// The most rows or buckets per bank (both halves of every bank then take 2 × 4 × 2^16 cells
/// per CPU).
const MAX_CELLS: u32 = 1 << 16;
/// The largest packet cache ring.
const MAX_CACHE_RING: u32 = 256 << 20;

impl SegmentConfig {
    pub fn enabled(&self) -> bool {
        self.role != Role::Off
    }

    /// Checks every value of the section; an error names the keys it is about (what it must
    /// agree with elsewhere, the top level checks).
    pub fn validate(&self) -> anyhow::Result<()> {
        let interval = self.interval.0;
        if interval < Duration::from_millis(100) || interval > Duration::from_secs(3600) {
            return refuse(
                &["segment.interval"],
                format!("segment.interval = {}: must be between 100ms and 1h", self.interval),
            );
        }
        if self.lda_rows < 2 || !self.lda_rows.is_multiple_of(2) || self.lda_rows > MAX_CELLS {
            return refuse(
                &["segment.lda_rows"],
                format!("segment.lda_rows = {}: must be even, 2..={MAX_CELLS}", self.lda_rows),
            );
        }
        if self.lda_loss.is_empty()
            || self.lda_loss.len() > LDA_MAX_BANKS
            || self.lda_loss.iter().any(|l| !(*l > 0.0 && *l < 1.0))
        {
            return refuse(
                &["segment.lda_loss"],
                format!(
                    "segment.lda_loss = {:?}: 1..={LDA_MAX_BANKS} loss rates in (0, 1), a bank tuned to each",
                    self.lda_loss
                ),
            );
        }
        if self.packets == 0 {
            return refuse(
                &["segment.packets"],
                "segment.packets = 0: the packets an interval carries, at least 1".into(),
            );
        }
        if self.rda_buckets == 0 || self.rda_buckets > MAX_CELLS {
            return refuse(
                &["segment.rda_buckets"],
                format!("segment.rda_buckets = {}: must be 1..={MAX_CELLS}", self.rda_buckets),
            );
        }
        if !(1..=RDA_MAX_BANKS as u32).contains(&self.rda_banks) {
            return refuse(
                &["segment.rda_banks"],
                format!("segment.rda_banks = {}: must be 1..={RDA_MAX_BANKS}", self.rda_banks),
            );
        }
        if self.sample_zeros > 32 {
            return refuse(
                &["segment.sample_zeros"],
                format!("segment.sample_zeros = {}: must be 0..=32 (a share of 2^-n)", self.sample_zeros),
            );
        }
        if let Some(why) = ring::bytes_refusal(self.cache_ring_bytes, MAX_CACHE_RING) {
            return refuse(
                &["segment.cache_ring_bytes"],
                format!("segment.cache_ring_bytes = {}: {why}", self.cache_ring_bytes),
            );
        }
        if self.key.is_some() {
            return refuse(
                &["segment.key"],
                "segment.key is not read: a key in the configuration is readable by whoever reads it. Write \
                 one with `pirated keygen /etc/pirated/segment.key`, copy it to the other point, and set \
                 segment.key_file"
                    .into(),
            );
        }
        if !self.enabled() {
            return Ok(());
        }
        if !self.lda && !self.rda {
            return refuse(&["segment.lda", "segment.rda"], "segment.lda and segment.rda are both off".into());
        }
        if self.role == Role::Up && self.peer.is_empty() {
            return refuse(
                &["segment.peer", "segment.role"],
                "segment.peer is not set: the upstream point connects to the downstream one (host:port)".into(),
            );
        }
        if self.role == Role::Up && !is_host_port(&self.peer) {
            return refuse(
                &["segment.peer"],
                format!(
                    "segment.peer = {:?}: must be the downstream point's listen address, host:port with a port \
                     1..=65535",
                    self.peer
                ),
            );
        }
        if self.role == Role::Both {
            return match self.down_interface.is_empty() {
                true => refuse(
                    &["segment.down_interface", "segment.role"],
                    "segment.down_interface is not set: with role = \"both\", the interface where the \
                     segment's packets enter this host again (the downstream point)"
                        .into(),
                ),
                false => Ok(()),
            };
        }
        match &self.key_file {
            Some(_) => Ok(()),
            None => refuse(
                &["segment.key_file", "segment.role"],
                "segment.key_file is not set: the file holding the key both points authenticate each other \
                 with (`pirated keygen FILE` writes one)"
                    .into(),
            ),
        }
    }

    /// The pre-shared key, read from `key_file` (see [`Psk::read`] for what it must be).
    pub fn key(&self) -> anyhow::Result<Psk> {
        let path = self.key_file.as_deref().ok_or_else(|| anyhow::anyhow!("segment.key_file is not set"))?;
        Psk::read(path)
    }

    /// The datapath's view (`interval_ns` 0 when off). Both points must compute the same one:
    /// the peers compare it when they meet.
    pub fn shape(&self) -> SegmentShape {
        if !self.enabled() {
            return SegmentShape::default();
        }
        let lda: LdaShape = super::lda::tuned(self.lda_rows, &self.lda_loss, self.packets as f64, super::lda::ALPHA);
        SegmentShape {
            interval_ns: self.interval.as_nanos(),
            lda,
            rda: RdaShape { buckets: self.rda_buckets, banks: self.rda_banks },
            sample_zeros: self.sample_zeros,
            flags: if self.lda { LDA } else { 0 } | if self.rda { RDA } else { 0 },
            _pad: 0,
        }
    }

    /// What the datapath sizes and writes for the segment: its shape, the cache ring, and
    /// `SEGMENT_LDA` and `SEGMENT_RDA` with both halves (one entry when off: maps are never empty).
    pub fn spec(&self) -> spec::Segment {
        let shape = self.shape();
        spec::Segment {
            enabled: self.enabled(),
            shape,
            lda_entries: (2 * shape.lda.cells() as u32).max(1),
            rda_entries: (2 * shape.rda.len() as u32).max(1),
            cache_ring_bytes: self.cache_ring_bytes,
        }
    }
}

/// Whether `peer` is an address the upstream point can connect to: an IP address and port, or
/// host:port (the host resolved when connecting). Port 0 takes no connection.
fn is_host_port(peer: &str) -> bool {
    if let Ok(addr) = peer.parse::<SocketAddr>() {
        return addr.port() != 0;
    }
    let Some((host, port)) = peer.rsplit_once(':') else { return false };
    port.parse::<u16>().is_ok_and(|p| p != 0) && !host.is_empty() && !host.contains(char::is_whitespace)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn err(text: &str) -> String {
        format!("{:#}", Config::parse(text).unwrap_err())
    }

    /// A role needs a key file (a key in the configuration is refused, saying where it goes),
    /// and the upstream point its peer; errors name the line. Both points compute the same
    /// shape from the same settings.
    #[test]
    fn a_role_needs_a_key_file_and_upstream_its_peer() {
        let e = err("[segment]\nrole = \"down\"\n");
        assert!(e.starts_with("line 2: segment.key_file is not set") && e.contains("keygen"), "{e}");
        let e = err("[segment]\nrole = \"down\"\nkey = \"sixteen bytes at least\"\n");
        assert!(e.starts_with("line 3: segment.key is not read") && e.contains("key_file"), "{e}");
        let e = err("[segment]\nkey_file = \"k\"\nrole = \"up\"\n");
        assert!(e.starts_with("line 3:") && e.contains("segment.peer"), "{e}");
        let e = err("[segment]\nrole = \"down\"\nkey_file = \"k\"\nlda_rows = 7\n");
        assert!(e.starts_with("line 4: segment.lda_rows = 7"), "{e}");
        let down = Config::parse("[segment]\nrole = \"down\"\nkey_file = \"k\"\n").unwrap();
        let up = Config::parse("[segment]\nrole = \"up\"\npeer = \"d:9465\"\nkey_file = \"/k\"\n").unwrap();
        assert_eq!(down.segment.shape(), up.segment.shape());
        assert_eq!(Config::default().segment.shape().interval_ns, 0);
    }

    /// One pirated on two ports needs the second port, another than `interface`, and no key;
    /// its downstream chain is an instance of its own on that port.
    #[test]
    fn both_points_need_another_port() {
        let e = err("interface = \"eth0\"\n[segment]\nrole = \"both\"\n");
        assert!(e.starts_with("line 3:") && e.contains("segment.down_interface is not set"), "{e}");
        let e = err("interface = \"eth0\"\n[segment]\nrole = \"both\"\ndown_interface = \"eth0\"\n");
        assert!(e.starts_with("line 4:") && e.contains("is `interface` too"), "{e}");
        let both =
            Config::parse("interface = \"eth0\"\n[segment]\nrole = \"both\"\ndown_interface = \"eth1\"\n").unwrap();
        let down = both.downstream_point().unwrap();
        assert_eq!((down.interface.as_str(), down.instance), ("eth1", format!("{}-down", both.instance)));
        assert!(!down.fridge.enabled && Config::default().downstream_point().is_none());
    }
}
