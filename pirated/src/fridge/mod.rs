//! Fridges: request→response delay distributions without the bias against long delays. The
//! per-packet step is `pirate_common::fridge`; here are the fridges in userspace memory (for
//! replay and the simulator) and the estimators that turn samples into a distribution.

pub mod calibrate;
pub mod config;
pub mod estimate;
pub mod metrics;
pub mod report;
pub mod samples;
pub mod synthetic;
pub mod table;
