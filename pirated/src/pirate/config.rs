//! `[pirate]`: the per-flow state machine's parameters (modes, ε, δ, the marks) and the
//! estimators' thresholds; validated here, and turned into what the datapath and the estimators
//! take (`params`, `settings`).

use std::time::Duration;

use pirate_common::pirate::{
    batch_break::BreakRules,
    config::{
        Params, FLAG_ADAPTIVE_DELTA, FLAG_MARK_ACKED, FLAG_MARK_AFTER_SHORT, FLAG_SKIP_PURE_ACKS,
        FLAG_SKIP_RETRANSMISSIONS, MODES_WIDE,
    },
    layout::Layout,
    modes::Epsilon,
};
use serde::{Deserialize, Serialize};

use super::estimate::{batches, paper, Estimator, Settings};
use crate::{
    datapath::spec,
    value::{refuse, AutoOr, Dur},
};

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PirateConfig {
    pub estimator: Estimator,
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
    pub min_batches: u64,
    pub batch_gap: AutoOr,
    pub skip_pure_acks: bool,
    pub skip_retransmissions: bool,
    pub mark_after_short: bool,
    pub mark_acked: bool,
}

impl Default for PirateConfig {
    fn default() -> Self {
        PirateConfig {
            estimator: Estimator::default(),
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
            min_batches: 2,
            batch_gap: AutoOr::Auto,
            skip_pure_acks: true,
            skip_retransmissions: true,
            mark_after_short: true,
            mark_acked: false,
        }
    }
}

/// The most modes a flow keeps (the wide layout's).
pub const MAX_MODES: u32 = MODES_WIDE as u32;

/// Beyond this many ε a span cap hardly differs from none.
const MAX_MODE_SPAN: u32 = 64;

/// With `delta = "auto"`, Alg. 1's δ in a flow's first epoch (the paper's choice), before its
/// own break is known.
const FIRST_EPOCH_DELTA: Duration = Duration::from_micros(500);

impl PirateConfig {
    /// Checks every value of the section; an error names the keys it is about.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !(1..=MAX_MODES).contains(&self.modes) {
            return refuse(&["pirate.modes"], format!("pirate.modes = {}: must be 1..={MAX_MODES}", self.modes));
        }
        let (first_delta, which) = match self.delta {
            AutoOr::Fixed(delta) => (delta, ""),
            AutoOr::Auto => (Dur(FIRST_EPOCH_DELTA), " in a flow's first epoch with \"auto\""),
        };
        if self.idle_floor.0 <= first_delta.0 {
            return refuse(
                &["pirate.idle_floor", "pirate.delta"],
                format!("pirate.idle_floor ({}) must be above pirate.delta ({first_delta}{which})", self.idle_floor),
            );
        }
        if self.idle_floor.0 > Duration::from_secs(4) {
            return refuse(
                &["pirate.idle_floor"],
                format!("pirate.idle_floor = {}: gaps are kept up to 4.29s, so at most 4s", self.idle_floor),
            );
        }
        if self.epsilon.0 >= Duration::from_secs(1) {
            return refuse(&["pirate.epsilon"], format!("pirate.epsilon = {}: must be below 1s", self.epsilon));
        }
        if !(0.0..=0.5).contains(&self.epsilon_relative) {
            return refuse(
                &["pirate.epsilon_relative"],
                format!("pirate.epsilon_relative = {}: must be in [0, 0.5]", self.epsilon_relative),
            );
        }
        if self.mode_span > MAX_MODE_SPAN {
            return refuse(
                &["pirate.mode_span"],
                format!("pirate.mode_span = {}: must be 0 (unbounded) ..={MAX_MODE_SPAN}", self.mode_span),
            );
        }
        if self.min_break_ratio < 1.0 || !self.min_break_ratio.is_finite() {
            return refuse(
                &["pirate.min_break_ratio"],
                format!("pirate.min_break_ratio = {}: must be at least 1", self.min_break_ratio),
            );
        }
        for (key, share) in [
            ("min_break_time_share", self.min_break_time_share),
            ("round_trip_floor", self.round_trip_floor),
            ("multiplexed_short_share", self.multiplexed_short_share),
        ] {
            if !(0.0..=1.0).contains(&share) {
                return refuse(&[&format!("pirate.{key}")], format!("pirate.{key} = {share}: must be in [0, 1]"));
            }
        }
        if !(1..=1000).contains(&self.min_batches) {
            return refuse(
                &["pirate.min_batches"],
                format!("pirate.min_batches = {}: must be 1..=1000", self.min_batches),
            );
        }
        if self.round_trip_slack.0 > Duration::from_secs(1) {
            return refuse(
                &["pirate.round_trip_slack"],
                format!("pirate.round_trip_slack = {}: must be at most 1s", self.round_trip_slack),
            );
        }
        if self.intra_batch_max.0 >= self.idle_floor.0 {
            return refuse(
                &["pirate.intra_batch_max", "pirate.idle_floor"],
                format!(
                    "pirate.intra_batch_max ({}) must be below pirate.idle_floor ({})",
                    self.intra_batch_max, self.idle_floor
                ),
            );
        }
        if let AutoOr::Fixed(gap) = self.batch_gap {
            if gap.0.is_zero() || gap.0 >= self.idle_floor.0 {
                return refuse(
                    &["pirate.batch_gap", "pirate.idle_floor"],
                    format!(
                        "pirate.batch_gap = {gap}: must be \"auto\" or a duration above 0 and below \
                         pirate.idle_floor ({})",
                        self.idle_floor
                    ),
                );
            }
        }
        if self.min_ibg_gaps == 0 {
            return refuse(
                &["pirate.min_ibg_gaps"],
                "pirate.min_ibg_gaps = 0: must be at least 1 (1 is the paper's rule)".to_string(),
            );
        }
        for (key, v) in [
            ("min_mode_share", self.min_mode_share),
            ("min_time_share", self.min_time_share),
            ("straggler_share", self.straggler_share),
        ] {
            if !(0.0..1.0).contains(&v) {
                return refuse(&[&format!("pirate.{key}")], format!("pirate.{key} = {v}: must be in [0, 1)"));
            }
        }
        Ok(())
    }

    /// The break between intra- and inter-batch gaps, for the estimator and the datapath alike.
    fn break_rules(&self) -> BreakRules {
        BreakRules {
            // Below the idle floor, at most 4 s (checked): a u32.
            intra_batch_max_ns: self.intra_batch_max.as_nanos() as u32,
            min_ratio_q10: (self.min_break_ratio * 1024.0).round() as u32,
            // Rounded down, so that a mode holding exactly `min_mode_share` still qualifies.
            min_share_q20: (self.min_mode_share * (1u64 << 20) as f64).floor() as u32,
            straggler_share_q20: (self.straggler_share * (1u64 << 20) as f64).floor() as u32,
        }
    }

    /// Alg. 2's ε and span cap, as the datapath and the estimators both apply them.
    fn epsilon(&self) -> Epsilon {
        Epsilon {
            // Below 1 s (checked): a u32.
            abs_ns: self.epsilon.as_nanos() as u32,
            rel_q20: (self.epsilon_relative * (1u64 << 20) as f64).round() as u32,
            span: self.mode_span,
        }
    }

    /// Both estimators' settings.
    pub fn settings(&self) -> Settings {
        Settings {
            paper: paper::Denoise {
                idle_floor_ns: self.idle_floor.as_nanos(),
                min_mode_share: self.min_mode_share,
                min_time_share: self.min_time_share,
                prefer_candidates: self.mark_after_short,
                min_ibg_gaps: self.min_ibg_gaps,
            },
            batches: batches::Break {
                idle_floor_ns: self.idle_floor.as_nanos(),
                rules: self.break_rules(),
                min_upper_time_share: self.min_break_time_share,
                fixed_ns: match self.batch_gap {
                    AutoOr::Auto => None,
                    AutoOr::Fixed(gap) => Some(gap.as_nanos()),
                },
            },
            acked_marks: self.mark_acked,
            round_trip_floor: self.round_trip_floor,
            round_trip_slack_ns: self.round_trip_slack.as_nanos() as f64,
            multiplexed_short_share: self.multiplexed_short_share,
            epsilon: self.epsilon(),
            min_batches: self.min_batches,
        }
    }

    /// The datapath's parameters, for a flow table of `max_flows` flows.
    pub fn params(&self, max_flows: u32) -> Params {
        let mut flags = 0;
        for (on, flag) in [
            (self.skip_pure_acks, FLAG_SKIP_PURE_ACKS),
            (self.skip_retransmissions, FLAG_SKIP_RETRANSMISSIONS),
            (self.mark_after_short, FLAG_MARK_AFTER_SHORT),
            (self.mark_acked, FLAG_MARK_ACKED),
        ] {
            if on {
                flags |= flag;
            }
        }
        let delta_ns = match self.delta {
            AutoOr::Auto => {
                flags |= FLAG_ADAPTIVE_DELTA;
                FIRST_EPOCH_DELTA.as_nanos() as u64
            }
            AutoOr::Fixed(delta) => delta.as_nanos(),
        };
        let epsilon = self.epsilon();
        Params {
            delta_ns,
            idle_floor_ns: self.idle_floor.as_nanos(),
            epsilon_ns: epsilon.abs_ns,
            epsilon_rel_q20: epsilon.rel_q20,
            max_modes: self.modes as u16,
            mode_span: self.mode_span as u16,
            flags,
            rules: self.break_rules(),
            table_sets: pirate_common::pirate::table::sets_for(max_flows),
            _pad: 0,
        }
    }

    /// What the datapath sizes and writes for Pirate, with a flow table of `max_flows` flows.
    pub fn spec(&self, max_flows: u32) -> spec::Pirate {
        spec::Pirate { params: self.params(max_flows), layout: Layout::for_modes(self.modes), max_flows }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{tests::refused, Config};

    #[test]
    fn a_mode_of_exactly_min_mode_share_is_significant() {
        let rules = PirateConfig::default().break_rules();
        assert!(rules.significant(2, 100) && !rules.significant(1, 100));
        let odd = PirateConfig { min_mode_share: 0.07, ..PirateConfig::default() }.break_rules();
        assert!(odd.significant(7, 100) && !odd.significant(6, 100));
    }

    /// The estimators apply the ε the datapath applies.
    #[test]
    fn the_estimators_and_the_datapath_take_one_epsilon() {
        let p = PirateConfig { epsilon_relative: 0.13, mode_span: 5, ..PirateConfig::default() };
        let (params, settings) = (p.params(1024), p.settings());
        let e = params.epsilon();
        assert_eq!((e.abs_ns, e.rel_q20, e.span), (settings.epsilon.abs_ns, settings.epsilon.rel_q20, 5));
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
    fn batch_gap_is_auto_or_a_duration_below_the_floor() {
        let gap = |text: &str| Config::parse(&format!("[pirate]\nbatch_gap = {text}\n")).map(|c| c.pirate.batch_gap);
        assert_eq!(gap("\"auto\"").unwrap(), AutoOr::Auto);
        assert_eq!(gap("\"1500us\"").unwrap(), AutoOr::Fixed(Dur(Duration::from_micros(1500))));
        assert_eq!(
            Config::parse("[pirate]\nbatch_gap = \"3ms\"\n").unwrap().pirate.settings().batches.fixed_ns,
            Some(3_000_000)
        );
        for bad in ["\"sometimes\"", "\"0ms\"", "\"1s\""] {
            let err = format!("{:#}", gap(bad).unwrap_err());
            assert!(err.contains("batch_gap") || err.contains("auto"), "{bad}: {err}");
        }
    }
}
