//! Test infrastructure for pirated: network namespaces and veth links, the link emulator that
//! stands in for netem, and the one-point testbed with real clients and servers.
//! Everything here runs as root and tears down what it creates.

pub mod balancing;
pub mod capture;
pub mod clients;
pub mod grpc;
pub mod katran;
pub mod katran_server;
pub mod linkem;
pub mod netns;
pub mod pairs;
pub mod pping;
pub mod quic;
pub mod removed;
pub mod rli;
pub mod servers;
pub mod stalls;
pub mod testbed;
pub mod twopoint;
pub mod webclient;
