//! Values every section of the configuration shares: durations as operators write them, "auto or
//! a duration", and the refusal that names the keys it is about (the top level finds their lines).
//! A leaf: each capability's `config` and the aggregate in `config` use it.

use std::{fmt, str::FromStr, time::Duration};

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

/// A duration written as operators write them (TOML has no duration type): `1h`, `2m`, `500ms`,
/// `1.5ms`, `50us`, `800ns`, `1m 30s` (humantime's grammar). Shown in the largest unit that
/// divides it exactly, up to seconds, so that `check` prints what parses back to the same value.
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
        humantime::parse_duration(s.trim()).map(Dur).map_err(|e| {
            format!("{s:?} is not a duration like 1h, 2m, 1s, 250ms, 1.5ms, 50us or 800ns, in whole nanoseconds ({e})")
        })
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

/// A value a section's validation refuses, with the keys (`section.name`) it is about: the
/// configuration names the line of the first of them set in the file.
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

/// Refuses a value: `message` about `keys`.
pub fn refuse(keys: &[&str], message: String) -> anyhow::Result<()> {
    Err(Invalid { keys: keys.iter().map(|k| k.to_string()).collect(), message }.into())
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

    /// What operators write, as the docs' ranges say it ("at most 1h").
    #[test]
    fn durations_take_minutes_hours_and_compounds() {
        let d = |s: &str| s.parse::<Dur>().map(|d| d.0);
        assert_eq!(d("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(d("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(d("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(d("1m 30s"), Ok(Duration::from_secs(90)));
        assert_eq!(d("50µs"), Ok(Duration::from_micros(50)));
        assert_eq!("1h".parse::<Dur>().unwrap().to_string(), "3600s");
        assert!(d("-1s").is_err() && d("1").is_err() && d("").is_err());
        // Finer than a nanosecond: refused, saying so.
        assert!(d("1.2345us").unwrap_err().contains("in whole nanoseconds"));
    }
}
