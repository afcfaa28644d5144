//! When the upstream point sends a reference: the paper's three schemes, each under a ceiling
//! (never two references closer than the gap that keeps them within `rli.max_share` of
//! `rli.link_bps`). A pure schedule over the clock and the egress interface's counters, so
//! that the live injector and the tests run the same decisions.

use serde::{Deserialize, Serialize};

/// How references are spaced.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Injection {
    /// One every `rli.period` (1-in-τ): good at low utilisation, blind to a short burst between
    /// two at high.
    #[default]
    Period,
    /// One every `rli.packets` packets the egress interface sends (1-in-n): dense in busy
    /// times, sparse (poor) at low utilisation.
    Packets,
    /// By utilisation (the paper's choice): at an idle link as many as the ceiling allows, fewer
    /// as the link fills, down to one every `rli.period` when it is full.
    Adaptive,
}

/// The egress interface's counters, as the kernel keeps them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Link {
    pub packets: u64,
    pub bytes: u64,
}

/// The smoothing of the utilisation the adaptive scheme reads: an average over about a second,
/// so that the rate follows the load, not the queue (a link is busiest exactly while a burst
/// fills its queue: a short average would send references away from every burst;
/// docs/accuracy.md).
const UTILISATION_NS: f64 = 1e9;

/// The decisions of one injector.
#[derive(Clone, Debug)]
pub struct Schedule {
    injection: Injection,
    /// The longest gap (`rli.period`), the shortest (the ceiling), and `rli.packets`.
    period_ns: u64,
    ceiling_ns: u64,
    packets: u64,
    link_bps: f64,
    /// The last reference's time and the counters then; the last poll's, and the utilisation
    /// since (smoothed).
    sent: Option<(u64, Link)>,
    polled: Option<(u64, Link)>,
    utilisation: f64,
}

impl Schedule {
    /// `ceiling_ns`: the shortest gap between two references.
    pub fn new(injection: Injection, period_ns: u64, ceiling_ns: u64, packets: u64, link_bps: u64) -> Schedule {
        Schedule {
            injection,
            period_ns: period_ns.max(ceiling_ns),
            ceiling_ns,
            packets: packets.max(1),
            link_bps: link_bps as f64,
            sent: None,
            polled: None,
            // Busy until measured: a new injector starts sparse, never above what the link allows.
            utilisation: 1.0,
        }
    }

    /// Whether the scheme reads the interface's counters (else `link` may be anything).
    pub fn reads_link(&self) -> bool {
        self.injection != Injection::Period
    }

    /// How often the injector should ask: often enough to hold the shortest gap within a
    /// quarter of it, at least every 50 µs apart.
    pub fn poll_ns(&self) -> u64 {
        match self.injection {
            Injection::Period => self.period_ns,
            _ => (self.ceiling_ns / 4).max(50_000),
        }
    }

    /// The shortest gap between two references.
    pub fn ceiling_ns(&self) -> u64 {
        self.ceiling_ns
    }

    /// The smoothed utilisation of the link, 0..=1.
    pub fn utilisation(&self) -> f64 {
        self.utilisation.clamp(0.0, 1.0)
    }

    /// Whether a reference is due at `now_ns`, the interface's counters being `link`.
    pub fn due(&mut self, now_ns: u64, link: Link) -> bool {
        if let Some((at, before)) = self.polled.filter(|(at, _)| now_ns > *at) {
            let dt = (now_ns - at) as f64;
            // Unclamped until smoothed: a poll that saw one packet reads far above the capacity,
            // the next ones nothing.
            let used = link.bytes.saturating_sub(before.bytes) as f64 * 8.0 / (dt * 1e-9) / self.link_bps;
            let w = (dt / UTILISATION_NS).min(1.0);
            self.utilisation += w * (used - self.utilisation);
        }
        self.polled = Some((now_ns, link));
        let Some((at, then)) = self.sent else { return true };
        let since = now_ns.saturating_sub(at);
        if since < self.ceiling_ns {
            return false;
        }
        match self.injection {
            Injection::Period => since >= self.period_ns,
            Injection::Packets => link.packets.saturating_sub(then.packets) >= self.packets,
            // The ceiling's rate scaled by the idle share of the link, at least 1 / period.
            // Within half a poll of the gap: the polls' grid would otherwise stretch every gap to
            // the next poll (a quarter of the ceiling on an idle link).
            Injection::Adaptive => {
                let gap = self.ceiling_ns as f64 / (1.0 - self.utilisation()).max(1e-9);
                (since + self.poll_ns() / 2) as f64 >= gap.min(self.period_ns as f64)
            }
        }
    }

    /// A reference went at `now_ns`.
    pub fn sent(&mut self, now_ns: u64, link: Link) {
        self.sent = Some((now_ns, link));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// References sent by `schedule` in the last second of `seconds`, polled as the injector
    /// polls it, the link carrying `pps` packets of 1 000 bytes a second.
    fn count(mut schedule: Schedule, seconds: u64, pps: u64) -> u64 {
        let (mut sent, step, last) = (0, schedule.poll_ns(), (seconds - 1) * 1_000_000_000);
        for t in (0..seconds * 1_000_000_000).step_by(step as usize) {
            let packets = t * pps / 1_000_000_000;
            let link = Link { packets, bytes: packets * 1000 };
            if schedule.due(t, link) {
                schedule.sent(t, link);
                sent += u64::from(t >= last);
            }
        }
        sent
    }

    /// Over a second (once the utilisation, smoothed over about a second, has settled): 1-in-τ
    /// sends one a period whatever the load; 1-in-n follows the packets but never beyond the
    /// ceiling; the adaptive scheme sends the ceiling's rate on an idle link, half of it at half
    /// load, one a period on a full one.
    #[test]
    fn each_scheme_spaces_references_as_it_says_under_the_ceiling() {
        // Ceiling 100 µs, period 1 ms, 1-in-100; a link of 80 Mb/s (10 000 packets/s of 1 kB).
        let s = |injection| Schedule::new(injection, 1_000_000, 100_000, 100, 80_000_000);
        assert_eq!(count(s(Injection::Period), 8, 5_000), 1000);
        assert_eq!(count(s(Injection::Packets), 8, 5_000), 50);
        assert_eq!(count(s(Injection::Packets), 8, 10_000_000), 10_000, "held to the ceiling");
        let idle = count(s(Injection::Adaptive), 8, 0);
        let half = count(s(Injection::Adaptive), 8, 5_000);
        let full = count(s(Injection::Adaptive), 8, 10_000);
        assert!((9_900..=10_000).contains(&idle), "{idle} on an idle link");
        assert!((4_500..=5_500).contains(&half), "{half} at half load");
        assert!((990..=1_000).contains(&full), "{full} at full load");
    }
}
