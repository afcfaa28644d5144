//! pirated's library: everything but the command line, so tests and xtask can drive it.
//! Shared layers at the top (config, datapath, sources, the epoch pipeline, metrics), a folder
//! per capability.

pub mod background;
pub mod buffer;
pub mod capture;
pub mod clock;
pub mod config;
pub mod datapath;
pub mod epoch;
pub mod fridge;
pub mod histogram;
pub mod json;
pub mod lb;
pub mod limit;
pub mod metrics;
pub mod parallel;
pub mod pirate;
pub mod psk;
pub mod rli;
pub mod rng;
pub mod segment;
pub mod source;
pub mod value;
