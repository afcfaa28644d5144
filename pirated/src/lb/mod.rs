//! Latency-aware layer-4 load balancing (the Pirate paper's §4): weighted Maglev rings and the
//! controller that sets their weights from measured latencies, run by the balancer.

pub mod balancer;
pub mod config;
pub mod controller;
pub mod katran;
mod katran_driver;
pub mod katran_grpc;
pub mod maglev;
pub mod metrics;
mod pool;
