//! `[lb]`: latency-aware load balancing: the VIPs and their reals, which forwarder carries them
//! (the built-in `pirate_lb` or Katran's balancer), the rings and the weight controller;
//! validated here, and turned into the shape the datapath's forwarder runs with.

use std::net::{Ipv4Addr, SocketAddrV4};

use pirate_common::{
    ctx::FORWARD_SLOTS,
    lb::{LbShape, EGRESS_KERNEL, MAX_REALS, MAX_VIPS},
    parse::{IPPROTO_TCP, IPPROTO_UDP},
};
use serde::{Deserialize, Serialize};

use super::{controller::Control, katran, maglev};
use crate::{datapath::spec, value::refuse};

/// Latency-aware load balancing: the built-in forwarder and the weight controller.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LbConfig {
    pub vips: Vec<VipSpec>,
    pub forwarder: Forwarder,
    pub katran_grpc: String,
    pub position: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tunnel_source: Option<Ipv4Addr>,
    pub egress: Egress,
    pub ring_size: u32,
    pub max_connections: u32,
    pub adaptive: bool,
    pub control: Control,
}

/// A virtual service and the reals behind it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VipSpec {
    pub address: SocketAddrV4,
    #[serde(default = "tcp")]
    pub proto: Proto,
    pub reals: Vec<Ipv4Addr>,
}

fn tcp() -> Proto {
    Proto::Tcp
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub fn number(self) -> u8 {
        match self {
            Proto::Tcp => IPPROTO_TCP,
            Proto::Udp => IPPROTO_UDP,
        }
    }

    /// As the configuration spells it.
    pub fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// Which balancer forwards the VIPs' packets.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Forwarder {
    /// `pirate_lb`, registered by pirated.
    Builtin,
    /// Katran's balancer, whose pinned maps pirated writes; it registers itself.
    Katran,
}

/// How the forwarder's encapsulated packets leave.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Egress {
    /// From XDP, where the kernel's routes say (XDP_TX or a redirect), else through the kernel.
    Xdp,
    /// Through the kernel's routing, always.
    Kernel,
}

impl Default for LbConfig {
    fn default() -> Self {
        LbConfig {
            vips: Vec::new(),
            forwarder: Forwarder::Builtin,
            katran_grpc: String::new(),
            position: 2,
            tunnel_source: None,
            egress: Egress::Xdp,
            ring_size: maglev::DEFAULT_SIZE,
            max_connections: 262_144,
            adaptive: true,
            control: Control::default(),
        }
    }
}

/// The largest ring: a VIP's two rings then take 8 MiB.
const MAX_RING_SIZE: u32 = 1_048_573;

impl LbConfig {
    /// Whether pirated balances: a VIP is configured.
    pub fn enabled(&self) -> bool {
        !self.vips.is_empty()
    }

    /// Checks every value of the section; an error names the keys it is about.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.vips.len() > MAX_VIPS as usize {
            return refuse(&["lb.vips"], format!("lb.vips has {} VIPs: at most {MAX_VIPS}", self.vips.len()));
        }
        for (i, vip) in self.vips.iter().enumerate() {
            if vip.reals.is_empty() {
                return refuse(&["lb.vips"], format!("lb.vips[{i}] ({}) has no reals", vip.address));
            }
            if let Some(j) = self.vips[..i].iter().position(|v| (v.address, v.proto) == (vip.address, vip.proto)) {
                return refuse(&["lb.vips"], format!("lb.vips[{i}] repeats lb.vips[{j}] ({})", vip.address));
            }
            if vip.reals.len() as u64 * 100 > self.ring_size as u64 {
                return refuse(
                    &["lb.ring_size", "lb.vips"],
                    format!(
                        "lb.ring_size = {}: a ring needs at least 100 entries per real ({} reals behind {})",
                        self.ring_size,
                        vip.reals.len(),
                        vip.address
                    ),
                );
            }
        }
        let reals: usize = self.vips.iter().map(|v| v.reals.len()).sum();
        if reals >= MAX_REALS as usize {
            return refuse(&["lb.vips"], format!("lb.vips have {reals} reals together: at most {}", MAX_REALS - 1));
        }
        if self.position >= FORWARD_SLOTS {
            return refuse(
                &["lb.position"],
                format!("lb.position = {}: the forwarder slots are 0..{FORWARD_SLOTS}", self.position),
            );
        }
        if !maglev::is_prime(self.ring_size) || self.ring_size > MAX_RING_SIZE {
            return refuse(
                &["lb.ring_size"],
                format!("lb.ring_size = {}: must be a prime up to {MAX_RING_SIZE} (65537 is)", self.ring_size),
            );
        }
        if self.max_connections == 0 || self.max_connections > 1 << 24 {
            return refuse(
                &["lb.max_connections"],
                format!("lb.max_connections = {}: must be 1..=16777216", self.max_connections),
            );
        }
        if !self.katran_grpc.is_empty() {
            let http = self
                .katran_grpc
                .parse::<tonic::codegen::http::Uri>()
                .ok()
                .filter(|u| u.scheme_str() == Some("http") && u.host().is_some() && u.path() == "/");
            if self.forwarder != Forwarder::Katran || http.is_none() {
                return refuse(
                    &["lb.katran_grpc", "lb.forwarder"],
                    format!(
                        "lb.katran_grpc = {:?}: with forwarder = \"katran\", the address of Katran's gRPC server, \
                         http://host:port (katran_server_grpc serves plaintext on port 50051)",
                        self.katran_grpc
                    ),
                );
            }
        }
        if self.forwarder == Forwarder::Katran {
            if self.ring_size != katran::RING_SIZE {
                return refuse(
                    &["lb.ring_size", "lb.forwarder"],
                    format!(
                        "lb.ring_size = {}: Katran's rings have {} positions (its RING_SIZE)",
                        self.ring_size,
                        katran::RING_SIZE
                    ),
                );
            }
        } else if self.enabled() && self.tunnel_source.is_none() {
            return refuse(
                &["lb.tunnel_source", "lb.vips"],
                "lb.tunnel_source is not set: the forwarder needs the outer source address of the packets it \
                 encapsulates (this host's address towards the reals)"
                    .into(),
            );
        }
        if let Some((key, problem)) = self.control.problem() {
            return refuse(&[&format!("lb.control.{key}")], format!("lb.control.{problem}"));
        }
        Ok(())
    }

    /// The forwarder's view.
    pub fn shape(&self) -> LbShape {
        LbShape {
            ring_size: self.ring_size,
            tunnel_source: self.tunnel_source.map_or([0; 4], |a| a.octets()),
            flags: match self.egress {
                Egress::Xdp => 0,
                Egress::Kernel => EGRESS_KERNEL,
            },
        }
    }

    /// What the datapath sizes for the forwarder: two rings per VIP (one entry without VIPs:
    /// maps are never empty) and the connection table.
    pub fn spec(&self) -> spec::Lb {
        spec::Lb {
            ring_entries: (self.vips.len() as u32 * 2 * self.ring_size).max(1),
            max_connections: self.max_connections,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// The balancer's settings are checked as `run` needs them, each error at its key's line.
    #[test]
    fn lb_errors_name_their_key() {
        let err = |text: &str| format!("{:#}", Config::parse(text).unwrap_err());
        let vip = "vips = [{ address = \"10.0.0.1:80\", reals = [\"10.1.0.1\", \"10.1.0.2\"] }]\n";
        let e = err(&format!("[lb]\n{vip}"));
        assert!(e.starts_with("line 2: lb.tunnel_source is not set"), "{e}");
        let ok = format!("[lb]\n{vip}tunnel_source = \"10.1.0.254\"\n");
        let lb = Config::parse(&ok).unwrap().lb;
        assert!(lb.enabled() && lb.vips[0].proto == Proto::Tcp && lb.shape().tunnel_source == [10, 1, 0, 254]);
        assert!(err(&format!("{ok}ring_size = 65536\n")).starts_with("line 4: lb.ring_size = 65536"));
        assert!(err(&format!("{ok}position = 3\n")).starts_with("line 4: lb.position = 3"));
        let e = err(&format!("{ok}forwarder = \"katran\"\nring_size = 65521\n"));
        assert!(e.starts_with("line 5: lb.ring_size = 65521: Katran's rings"), "{e}");
        let grpc = "katran_grpc = \"http://127.0.0.1:50051\"\n";
        let e = err(&format!("{ok}{grpc}"));
        assert!(e.starts_with("line 4: lb.katran_grpc = \"http://127.0.0.1:50051\": with forwarder"), "{e}");
        let e = err(&format!("{ok}forwarder = \"katran\"\nkatran_grpc = \"127.0.0.1:50051\"\n"));
        assert!(e.starts_with("line 5: lb.katran_grpc = \"127.0.0.1:50051\""), "{e}");
        let lb = Config::parse(&format!("{ok}forwarder = \"katran\"\n{grpc}")).unwrap().lb;
        assert_eq!(lb.katran_grpc, "http://127.0.0.1:50051");
        let e = err(&format!("{ok}[lb.control]\nalpha_low = 2.0\n"));
        assert!(e.starts_with("line 5: lb.control.alpha_low = 2"), "{e}");
        let twice = "[lb]\ntunnel_source = \"10.1.0.254\"\nvips = [{ address = \"10.0.0.1:80\", reals = [\"10.1.0.1\"] }, { address = \"10.0.0.1:80\", reals = [\"10.1.0.2\"] }]\n";
        assert!(err(twice).contains("lb.vips[1] repeats lb.vips[0]"));
    }
}
