//! RLI, reference latency interpolation (Lee, Duffield, Kompella, SIGCOMM 2010): per-flow one-way
//! latency across the segment from reference packets whose delay the downstream point measures
//! exactly, every other packet's delay estimated from the references around it. In progress: the
//! estimators over a packet trace and the synthetic queue the benchmark runs them on; the
//! datapath's per-flow counters, injection at U and the surfaces come next (docs/method.md).

pub mod interpolate;
pub mod synthetic;
