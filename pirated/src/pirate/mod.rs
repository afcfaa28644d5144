//! Pirate: per-flow and per-server response latency from client→server packets. The kernel's
//! modes drained each epoch, turned into estimates, reported as JSON lines and metrics.

pub mod config;
pub mod drain;
pub mod estimate;
pub mod flow;
pub mod metrics;
pub mod report;
pub mod step;
