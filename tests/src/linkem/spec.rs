//! What the emulator does to one direction of the link, and its `key=value,…` syntax.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use super::rng::SplitMix64;

/// Distribution of the jitter added to `delay`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dist {
    /// Uniform on `delay ± jitter` (netem's default); standard deviation `jitter / √3`.
    #[default]
    Uniform,
    /// Normal with mean `delay` and standard deviation `jitter`, clamped at zero delay.
    Normal,
    /// Log-uniform on `delay … delay + jitter`: each factor of ten in between equally likely, so
    /// one link carries delays spanning decades (what the fridges must measure without bias).
    LogUniform,
}

impl fmt::Display for Dist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dist::Uniform => "uniform",
            Dist::Normal => "normal",
            Dist::LogUniform => "loguniform",
        })
    }
}

impl FromStr for Dist {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Dist> {
        match s {
            "uniform" => Ok(Dist::Uniform),
            "normal" => Ok(Dist::Normal),
            "loguniform" => Ok(Dist::LogUniform),
            _ => bail!("unknown distribution {s:?} (expected uniform, normal or loguniform)"),
        }
    }
}

/// Impairments for one direction of the link. `Default` is a plain relay.
///
/// The text form (used by `pirate-linkem --ab/--ba`) is a comma-separated list of `key=value`
/// pairs, each optional: `delay=5ms,jitter=1ms,dist=normal,loss=0.01,reorder=0.25,reorder_delay=0`.
/// Durations take `s`, `ms`, `us` or `ns` (`1.5ms` works; a bare `0` is zero); probabilities are
/// fractions (`0.01`) or percentages (`1%`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LinkSpec {
    /// Fixed delay of every frame, counted from the kernel's receive timestamp.
    pub delay: Duration,
    /// Spread of the random delay added to `delay` (see [`Dist`]). Frames leave in order of their
    /// departure times, so jitter larger than the gap between frames reorders them (as in netem).
    pub jitter: Duration,
    pub dist: Dist,
    /// Probability that a frame is dropped, decided first, independently per frame.
    pub loss: f64,
    /// Probability that a (not lost) frame is sent after `reorder_delay` instead of
    /// `delay ± jitter`, so that it overtakes frames queued before it — netem's `reorder` with
    /// `delay`.
    pub reorder: f64,
    pub reorder_delay: Duration,
}

/// What happens to one frame.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Fate {
    Lost,
    /// Leaves after this many nanoseconds; `reordered` if it took the reorder path.
    Delayed {
        delay_ns: i64,
        reordered: bool,
    },
}

impl LinkSpec {
    /// A spec with only a fixed delay.
    pub fn delay(delay: Duration) -> LinkSpec {
        LinkSpec { delay, ..LinkSpec::default() }
    }

    /// Draws the fate of the next frame. Each impairment that is enabled consumes one draw per
    /// frame in a fixed order (loss, reorder, jitter), so a seed reproduces the same decisions
    /// for the same sequence of frames.
    pub(crate) fn fate(&self, rng: &mut SplitMix64) -> Fate {
        if self.loss > 0.0 && rng.next_f64() < self.loss {
            return Fate::Lost;
        }
        if self.reorder > 0.0 && rng.next_f64() < self.reorder {
            return Fate::Delayed { delay_ns: nanos(self.reorder_delay), reordered: true };
        }
        let mut delay_ns = nanos(self.delay) as f64;
        if !self.jitter.is_zero() {
            let jitter_ns = nanos(self.jitter) as f64;
            delay_ns += match self.dist {
                Dist::Uniform => (2.0 * rng.next_f64() - 1.0) * jitter_ns,
                Dist::Normal => rng.next_normal() * jitter_ns,
                Dist::LogUniform => delay_ns * (((delay_ns + jitter_ns) / delay_ns).powf(rng.next_f64()) - 1.0),
            };
        }
        Fate::Delayed { delay_ns: delay_ns.max(0.0).round() as i64, reordered: false }
    }

    fn validate(&self) -> Result<()> {
        for (name, p) in [("loss", self.loss), ("reorder", self.reorder)] {
            if !(0.0..=1.0).contains(&p) {
                bail!("{name}={p} is not a probability in 0..1");
            }
        }
        if self.dist == Dist::LogUniform && self.delay.is_zero() && !self.jitter.is_zero() {
            bail!("dist=loguniform needs delay > 0: its range is delay … delay + jitter");
        }
        Ok(())
    }
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

impl fmt::Display for LinkSpec {
    /// Writes `delay` always and every other field that differs from the default, in the syntax
    /// [`FromStr`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let default = LinkSpec::default();
        write!(f, "delay={}", DisplayDuration(self.delay))?;
        if self.jitter != default.jitter {
            write!(f, ",jitter={}", DisplayDuration(self.jitter))?;
        }
        if self.dist != default.dist {
            write!(f, ",dist={}", self.dist)?;
        }
        if self.loss != default.loss {
            write!(f, ",loss={}", self.loss)?;
        }
        if self.reorder != default.reorder {
            write!(f, ",reorder={}", self.reorder)?;
        }
        if self.reorder_delay != default.reorder_delay {
            write!(f, ",reorder_delay={}", DisplayDuration(self.reorder_delay))?;
        }
        Ok(())
    }
}

impl FromStr for LinkSpec {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<LinkSpec> {
        let mut spec = LinkSpec::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item.split_once('=').ok_or_else(|| anyhow!("{item:?} is not key=value"))?;
            let value = value.trim();
            let context = || format!("in {item:?}");
            match key.trim() {
                "delay" => spec.delay = parse_duration(value).with_context(context)?,
                "jitter" => spec.jitter = parse_duration(value).with_context(context)?,
                "dist" => spec.dist = value.parse().with_context(context)?,
                "loss" => spec.loss = parse_probability(value).with_context(context)?,
                "reorder" => spec.reorder = parse_probability(value).with_context(context)?,
                "reorder_delay" => spec.reorder_delay = parse_duration(value).with_context(context)?,
                other => bail!(
                    "unknown key {other:?} (expected delay, jitter, dist, loss, reorder, \
                     reorder_delay)"
                ),
            }
        }
        spec.validate()?;
        Ok(spec)
    }
}

/// Parses `5ms`, `1.5ms`, `250us`, `2s`, `100ns` or a bare `0`.
pub fn parse_duration(s: &str) -> Result<Duration> {
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| anyhow!("duration {s:?} has no unit (s, ms, us, ns)"))?;
    let (number, unit) = s.split_at(split);
    let number: f64 = number.parse().with_context(|| format!("duration {s:?} does not start with a number"))?;
    let scale = match unit {
        "s" => 1e9,
        "ms" => 1e6,
        "us" | "µs" => 1e3,
        "ns" => 1.0,
        _ => bail!("duration {s:?} has unknown unit {unit:?} (s, ms, us, ns)"),
    };
    Ok(Duration::from_nanos((number * scale).round() as u64))
}

fn parse_probability(s: &str) -> Result<f64> {
    let (number, scale) = match s.strip_suffix('%') {
        Some(percent) => (percent, 0.01),
        None => (s, 1.0),
    };
    let p: f64 = number.parse().with_context(|| format!("{s:?} is not a number"))?;
    Ok(p * scale)
}

/// Formats a duration exactly, in the largest of ms/us/ns that divides it.
struct DisplayDuration(Duration);

impl fmt::Display for DisplayDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        if ns == 0 {
            f.write_str("0")
        } else if ns.is_multiple_of(1_000_000) {
            write!(f, "{}ms", ns / 1_000_000)
        } else if ns.is_multiple_of(1_000) {
            write!(f, "{}us", ns / 1_000)
        } else {
            write!(f, "{ns}ns")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_full_syntax() {
        let spec: LinkSpec =
            "delay=5ms, jitter=1.5ms,dist=normal,loss=1%,reorder=0.25,reorder_delay=250us".parse().unwrap();
        assert_eq!(
            spec,
            LinkSpec {
                delay: Duration::from_millis(5),
                jitter: Duration::from_micros(1500),
                dist: Dist::Normal,
                loss: 0.01,
                reorder: 0.25,
                reorder_delay: Duration::from_micros(250),
            }
        );
    }

    #[test]
    fn display_round_trips() {
        for text in [
            "delay=0",
            "delay=5ms",
            "delay=20ms,jitter=1ms,dist=normal,loss=0.1,reorder=0.25,reorder_delay=1500us",
            "delay=123456789ns,jitter=7us",
            "delay=1ms,jitter=99ms,dist=loguniform",
        ] {
            let spec: LinkSpec = text.parse().unwrap();
            assert_eq!(spec.to_string(), text);
            assert_eq!(spec.to_string().parse::<LinkSpec>().unwrap(), spec);
        }
        assert_eq!(LinkSpec::default().to_string(), "delay=0");
        assert_eq!("".parse::<LinkSpec>().unwrap(), LinkSpec::default());
    }

    #[test]
    fn rejects_nonsense() {
        for bad in [
            "delay=5",
            "delay=5m",
            "delay=-1ms",
            "loss=1.5",
            "reorder=-0.1",
            "dist=pareto",
            "latency=1ms",
            "delay",
            "jitter=1ms,dist=loguniform",
        ] {
            assert!(bad.parse::<LinkSpec>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn fates_follow_the_probabilities() {
        let spec: LinkSpec = "delay=5ms,jitter=1ms,loss=0.1,reorder=0.2".parse().unwrap();
        let mut rng = SplitMix64::new(42);
        let n = 100_000;
        let (mut lost, mut reordered, mut delays) = (0, 0, Vec::new());
        for _ in 0..n {
            match spec.fate(&mut rng) {
                Fate::Lost => lost += 1,
                Fate::Delayed { reordered: true, delay_ns } => {
                    assert_eq!(delay_ns, 0);
                    reordered += 1;
                }
                Fate::Delayed { delay_ns, .. } => delays.push(delay_ns as f64),
            }
        }
        let lost = lost as f64 / n as f64;
        let reordered = reordered as f64 / (n as f64 * 0.9);
        assert!((lost - 0.1).abs() < 0.005, "loss {lost}");
        assert!((reordered - 0.2).abs() < 0.005, "reorder {reordered}");
        let (lo, hi) = delays.iter().fold((f64::MAX, f64::MIN), |(l, h), &d| (l.min(d), h.max(d)));
        assert!(lo >= 4e6 && hi <= 6e6, "uniform jitter out of range: {lo}..{hi}");
    }
}
