//! The fridges' epochs, from the live datapath or replay alike: the samples of a sliding window
//! weighted into each class's corrected distribution (its quantiles, SLA shares and the
//! estimated pairs per second), the epoch's own samples for the histogram, and the entry
//! probabilities recalibrated when the traffic has drifted.

use std::{
    collections::{BTreeMap, VecDeque},
    io::Write,
};

use pirate_common::fridge::{
    class::{CLASSES, NAMES},
    Fridges, Sample, MAX_FRIDGES,
};
use serde::Serialize;

use super::config::{FridgeConfig, Probability};
use super::{
    calibrate::{entry_probability, target_s, Basis},
    estimate::{weighted, Distribution, Weights},
};

/// The quantiles pirated reports per class.
pub const QUANTILES: [f64; 5] = [0.5, 0.9, 0.95, 0.99, 0.999];

/// One closed epoch of the fridges, as plain data.
#[derive(Clone, Debug, Default)]
pub struct FridgeEpoch {
    pub samples: Vec<Sample>,
    /// Requests offered to each fridge during the epoch.
    pub offered: [u64; MAX_FRIDGES],
    /// The epoch's length.
    pub span_ns: u64,
    /// The shape the datapath ran with.
    pub shape: Fridges,
}

/// Per class: the window's corrected distribution read out, and the epoch's samples weighted.
#[derive(Clone, Debug)]
pub struct ClassFigures {
    pub class: u8,
    /// Samples in the epoch, and in the window.
    pub samples: usize,
    pub window_samples: usize,
    /// The pairs the window's samples stand for, per second.
    pub pairs_per_s: f64,
    /// Corrected, then as sampled (what an uncorrected table would read), in ns; per [`QUANTILES`].
    pub quantiles_ns: Option<[f64; QUANTILES.len()]>,
    pub uncorrected_ns: Option<[f64; QUANTILES.len()]>,
    /// The share of pairs slower than each SLA threshold.
    pub above_sla: Vec<f64>,
    /// The epoch's samples: delay (s) and the pairs each stands for.
    pub weighted_s: Vec<(f64, f64)>,
}

/// Per fridge, over the window.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct FridgeFigures {
    pub slots: u32,
    pub p: f64,
    pub offered_per_s: f64,
    /// How long a request waits on average before another evicts it: M/(p·rate).
    pub lifetime_s: Option<f64>,
}

pub struct FridgeReport {
    pub epoch: u32,
    pub classes: Vec<ClassFigures>,
    pub fridges: Vec<FridgeFigures>,
    /// Requests offered to each fridge during the epoch.
    pub offered: Vec<u64>,
    /// The SLA thresholds (s), in the order of `ClassFigures::above_sla`.
    pub sla_s: Vec<f64>,
    /// New entry probabilities, for the datapath, when this epoch recalibrated them.
    pub recalibrated: Option<Fridges>,
}

/// An epoch in the window: its samples weighted once, with the shape and request rates they
/// were taken under, by class.
struct Part {
    span_ns: u64,
    offered: [u64; MAX_FRIDGES],
    largest_ns: Option<u64>,
    weighted: [Vec<(u64, f64)>; CLASSES],
}

impl Part {
    fn of(epoch: FridgeEpoch) -> Part {
        let rates = std::array::from_fn(|k| epoch.offered[k] as f64 / epoch.span_ns.max(1) as f64);
        let weighted = std::array::from_fn(|class| {
            let mine: Vec<Sample> = epoch.samples.iter().filter(|s| s.class as usize == class).copied().collect();
            weighted(&epoch.shape, &mine, Weights::Expected { offered_per_ns: rates })
        });
        Part {
            span_ns: epoch.span_ns,
            offered: epoch.offered,
            largest_ns: epoch.samples.iter().map(|s| s.delay_ns).max(),
            weighted,
        }
    }
}

/// The sliding window and the calibration state, carried from epoch to epoch.
pub struct Window {
    window_ns: u64,
    sla_ns: Vec<f64>,
    /// Which fridges' entry probabilities are calibrated.
    auto: [bool; MAX_FRIDGES],
    parts: VecDeque<Part>,
    /// What the last calibration was made for.
    basis: Option<Basis>,
}

impl Window {
    pub fn new(config: &FridgeConfig) -> Window {
        Window {
            window_ns: config.window.as_nanos(),
            sla_ns: config.sla.iter().map(|d| d.as_nanos() as f64).collect(),
            auto: std::array::from_fn(|k| config.fridges.get(k).is_some_and(|f| f.p == Probability::Auto)),
            parts: VecDeque::new(),
            basis: None,
        }
    }

    /// Adds a closed epoch, drops epochs that left the window, and reads the window out.
    pub fn close(&mut self, epoch: u32, part: FridgeEpoch) -> FridgeReport {
        let (shape, offered) = (part.shape, part.offered[..part.shape.count as usize].to_vec());
        self.parts.push_back(Part::of(part));
        let mut span: u64 = self.parts.iter().map(|p| p.span_ns).sum();
        while self.parts.len() > 1 && span - self.parts[0].span_ns >= self.window_ns {
            span -= self.parts.pop_front().map_or(0, |p| p.span_ns);
        }
        let span_s = span.max(1) as f64 * 1e-9;
        let offered_per_s: [f64; MAX_FRIDGES] =
            std::array::from_fn(|k| self.parts.iter().map(|p| p.offered[k]).sum::<u64>() as f64 / span_s);
        let newest = self.parts.back().expect("just pushed");
        let classes = (0..CLASSES as u8)
            .filter(|&c| shape.classes & (1 << c) != 0)
            .map(|class| {
                let window: Vec<(u64, f64)> =
                    self.parts.iter().flat_map(|p| &p.weighted[class as usize]).copied().collect();
                let raw = Distribution::new(window.iter().map(|&(d, _)| (d, 1.0)).collect());
                let window_samples = window.len();
                let corrected = Distribution::new(window);
                let read =
                    |d: &Distribution| (d.total() > 0.0).then(|| QUANTILES.map(|q| d.quantile(q).unwrap_or(0.0)));
                let current = &newest.weighted[class as usize];
                ClassFigures {
                    class,
                    samples: current.len(),
                    window_samples,
                    pairs_per_s: corrected.total() / span_s,
                    quantiles_ns: read(&corrected),
                    uncorrected_ns: read(&raw),
                    above_sla: self.sla_ns.iter().map(|&t| corrected.fraction_above(t)).collect(),
                    weighted_s: current.iter().map(|&(d, w)| (d as f64 * 1e-9, w)).collect(),
                }
            })
            .collect();
        let fridges = (0..shape.count as usize)
            .map(|k| {
                let slots = 1u32 << shape.slots_log2[k];
                let p = shape.p(k);
                let rate = offered_per_s[k];
                FridgeFigures {
                    slots,
                    p,
                    offered_per_s: rate,
                    lifetime_s: (rate > 0.0).then(|| slots as f64 / (p * rate)),
                }
            })
            .collect();
        let recalibrated = self.calibrate(&shape, &offered_per_s);
        FridgeReport {
            epoch,
            classes,
            fridges,
            offered,
            sla_s: self.sla_ns.iter().map(|t| t * 1e-9).collect(),
            recalibrated,
        }
    }

    /// New entry probabilities for the calibrated fridges, if the request rate or the largest
    /// delay in the window has drifted from what the last calibration was made for (or none
    /// was made yet and there are samples to make it from).
    fn calibrate(&mut self, shape: &Fridges, offered_per_s: &[f64; MAX_FRIDGES]) -> Option<Fridges> {
        if !self.auto.contains(&true) {
            return None;
        }
        let largest_ns = self.parts.iter().filter_map(|p| p.largest_ns).max()?;
        let now = Basis { offered_per_s: offered_per_s.iter().sum(), largest_s: largest_ns as f64 * 1e-9 };
        if self.basis.is_some_and(|b| !b.drifted(&now)) {
            return None;
        }
        self.basis = Some(now);
        let n = shape.count as usize;
        let slots_log2 = &shape.slots_log2[..n];
        let p: Vec<f64> = (0..n)
            .map(|k| match self.auto[k] {
                true => entry_probability(1 << slots_log2[k], offered_per_s[k], target_s(k, n, now.largest_s)),
                false => shape.p(k),
            })
            .collect();
        let mut next = Fridges::new(slots_log2, &p)?;
        next.classes = shape.classes;
        (next != *shape).then_some(next)
    }
}

impl FridgeReport {
    /// One JSON line per enabled class, then one for the fridges.
    pub fn write_json(&self, out: &mut impl Write) -> std::io::Result<()> {
        let named = |v: &Option<[f64; QUANTILES.len()]>| {
            v.map(|q| QUANTILES.iter().zip(q).map(|(p, ns)| (format!("p{}", p * 100.0), ns.round() as u64)).collect())
        };
        for c in &self.classes {
            let line = ClassLine {
                kind: "fridge_class",
                epoch: self.epoch,
                class: NAMES[c.class as usize],
                samples: c.samples,
                window_samples: c.window_samples,
                pairs_per_s: c.pairs_per_s,
                quantiles_ns: named(&c.quantiles_ns),
                uncorrected_ns: named(&c.uncorrected_ns),
                above_sla: self.sla_s.iter().zip(&c.above_sla).map(|(t, f)| (format!("{t}"), *f)).collect(),
            };
            serde_json::to_writer(&mut *out, &line)?;
            out.write_all(b"\n")?;
        }
        let line = FridgesLine {
            kind: "fridges",
            epoch: self.epoch,
            fridges: &self.fridges,
            recalibrated: self.recalibrated.is_some(),
        };
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")
    }
}

#[derive(Serialize)]
struct ClassLine {
    #[serde(rename = "type")]
    kind: &'static str,
    epoch: u32,
    class: &'static str,
    samples: usize,
    window_samples: usize,
    pairs_per_s: f64,
    /// "p50" … "p99.9" → ns.
    quantiles_ns: Option<BTreeMap<String, u64>>,
    uncorrected_ns: Option<BTreeMap<String, u64>>,
    /// SLA threshold in seconds → share of pairs above it.
    above_sla: BTreeMap<String, f64>,
}

#[derive(Serialize)]
struct FridgesLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    epoch: u32,
    fridges: &'a [FridgeFigures],
    recalibrated: bool,
}
