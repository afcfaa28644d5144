//! Estimators: pure functions from drained epochs to latencies.

pub mod pirate;
