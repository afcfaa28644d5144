//! `[fridge]`: the request→response classes measured, the fridges (slots and entry
//! probabilities), the window and SLA thresholds the figures are read over, and the sample ring;
//! validated here, and turned into the shape the datapath runs with.

use std::time::Duration;

use pirate_common::fridge::{
    class::{DNS, ICMP_ECHO_CLASS, TCP_FLOW, TCP_HANDSHAKE},
    Fridges, MAX_FRIDGES,
};
use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

use crate::{
    datapath::{ring, spec},
    value::{refuse, Dur},
};

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
        1 << match self {
            FridgeClass::TcpHandshake => TCP_HANDSHAKE,
            FridgeClass::Dns => DNS,
            FridgeClass::IcmpEcho => ICMP_ECHO_CLASS,
            FridgeClass::TcpFlow => TCP_FLOW,
        }
    }
}

/// One fridge: its slots and entry probability.
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

impl Default for FridgeConfig {
    fn default() -> Self {
        FridgeConfig {
            enabled: true,
            classes: vec![FridgeClass::TcpHandshake, FridgeClass::Dns, FridgeClass::IcmpEcho],
            fridges: vec![FridgeSpec { slots: 4096, p: Probability::Auto }; 2],
            window: Dur(Duration::from_secs(10)),
            sla: [10, 100, 1000].map(|ms| Dur(Duration::from_millis(ms))).to_vec(),
            ring_bytes: 4 << 20,
        }
    }
}

/// The most slots the fridges may have together (24 bytes each: 384 MiB).
const MAX_FRIDGE_SLOTS: u32 = 1 << 24;
/// The most SLA thresholds (a series per class each).
const MAX_SLAS: usize = 16;
/// The largest fridge sample ring.
const MAX_FRIDGE_RING: u32 = 256 << 20;

impl FridgeConfig {
    /// Checks every value of the section; an error names the keys it is about.
    pub fn validate(&self) -> anyhow::Result<()> {
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
        if let Some(why) = ring::bytes_refusal(self.ring_bytes, MAX_FRIDGE_RING) {
            return refuse(&["fridge.ring_bytes"], format!("fridge.ring_bytes = {}: {why}", self.ring_bytes));
        }
        Ok(())
    }

    /// The datapath's view: the fridges' shape (auto probabilities start at 1: every request
    /// enters until the traffic is measured) and the enabled classes.
    pub fn shape(&self) -> Fridges {
        let slots_log2: Vec<u32> = self.fridges.iter().map(|f| f.slots.trailing_zeros()).collect();
        let p: Vec<f64> = self
            .fridges
            .iter()
            .map(|f| match f.p {
                Probability::Auto => 1.0,
                Probability::Fixed(p) => p,
            })
            .collect();
        let mut shape = Fridges::new(&slots_log2, &p).expect("validated");
        shape.classes = self.classes.iter().map(|c| c.bit()).fold(0, |a, b| a | b);
        shape
    }

    /// What the datapath sizes and writes for the fridges.
    pub fn spec(&self) -> spec::Fridge {
        spec::Fridge { enabled: self.enabled, shape: self.shape(), ring_bytes: self.ring_bytes }
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
