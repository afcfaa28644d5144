//! pirated's library: everything but the command line, so tests and xtask can drive it.

pub mod config;
pub mod datapath;
pub mod epoch;
pub mod estimate;
pub mod flow;
pub mod map_batch;
pub mod metrics;
pub mod replay;
pub mod report;
pub mod test_run;
