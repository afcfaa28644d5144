//! One VIP as the balancer keeps it: its reals (and their indices in the datapath), its
//! weighted Maglev ring and the controller that sets the weights. The balancer steps it; the
//! Katran driver installs and rewrites it in Katran's maps.

use std::net::{Ipv4Addr, SocketAddrV4};

use pirate_common::lb::VipKey;

use super::{
    config::{Proto, VipSpec},
    controller::Controller,
    maglev::Ring,
};

/// Ring weights per unit of the controller's (an equal share is `WEIGHT_SCALE`).
const WEIGHT_SCALE: f64 = 10_000.0;

/// One VIP and its reals.
pub(super) struct Pool {
    pub(super) address: SocketAddrV4,
    pub(super) proto: Proto,
    pub(super) reals: Vec<Ipv4Addr>,
    /// The datapath's index of `reals[0]`; the others follow.
    pub(super) first: u32,
    pub(super) ring: Ring,
    pub(super) controller: Controller,
}

impl Pool {
    /// `vip`'s ring of `ring_size` at equal weights, its reals indexed from `first`.
    pub(super) fn new(vip: &VipSpec, first: u32, ring_size: u32) -> anyhow::Result<Pool> {
        let ids: Vec<[u64; 1]> = vip.reals.iter().map(|r| [u32::from(*r) as u64]).collect();
        let ids: Vec<&[u64]> = ids.iter().map(|id| id.as_slice()).collect();
        let n = vip.reals.len();
        let ring = Ring::new(&ids, &vec![WEIGHT_SCALE as u32; n], ring_size)?;
        Ok(Pool {
            address: vip.address,
            proto: vip.proto,
            reals: vip.reals.clone(),
            first,
            ring,
            controller: Controller::new(n),
        })
    }

    pub(super) fn key(&self) -> VipKey {
        VipKey { addr: self.address.ip().octets(), port: self.address.port(), proto: self.proto.number(), _pad: 0 }
    }

    pub(super) fn name(&self) -> String {
        format!("{}/{}", self.address, self.proto.name())
    }

    /// The controller's weights as the ring takes them (at least 1: every real keeps entries).
    pub(super) fn ring_weights(&self) -> Vec<u32> {
        self.controller.weights.iter().map(|w| (w * WEIGHT_SCALE).round().max(1.0) as u32).collect()
    }

    /// The ring with the datapath's real indices in place of positions in `reals`.
    pub(super) fn ring_of_indices(&self) -> Vec<u32> {
        self.ring.entries().iter().map(|&b| self.first + b).collect()
    }
}
