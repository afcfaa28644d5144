//! Katran's gRPC API (`example_grpc/protos/katran.proto`, service `lb.katran.KatranService`),
//! for deployments whose Katran runs its own server: pirated adds the VIPs Katran lacks and sets
//! the weights of the reals it lists, and Katran computes its rings.
//!
//! A task owns the connection and brings Katran to the state the balancer last asked for: the
//! epoch loop never waits on Katran, a failed call is logged, counted and retried (a second
//! later, or at the next change), and only the latest weights of a VIP are sent.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::Context;
use tokio::sync::watch;
use tonic::{codegen::http::uri::PathAndQuery, transport::Channel};
use tracing::{info, warn};

/// The messages pirated exchanges, as `katran.proto` numbers their fields.
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Empty {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Bool {
        #[prost(bool, tag = "1")]
        pub success: bool,
    }

    #[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
    pub struct Vip {
        #[prost(string, tag = "1")]
        pub address: String,
        #[prost(int32, tag = "2")]
        pub port: i32,
        #[prost(int32, tag = "3")]
        pub protocol: i32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct VipMeta {
        #[prost(message, optional, tag = "1")]
        pub vip: Option<Vip>,
        #[prost(int64, tag = "2")]
        pub flags: i64,
        #[prost(bool, tag = "3")]
        pub set_flag: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Real {
        #[prost(string, tag = "1")]
        pub address: String,
        #[prost(int32, tag = "2")]
        pub weight: i32,
        #[prost(int32, tag = "3")]
        pub flags: i32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Reals {
        #[prost(message, repeated, tag = "1")]
        pub reals: Vec<Real>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Vips {
        #[prost(message, repeated, tag = "1")]
        pub vips: Vec<Vip>,
    }

    /// `Action` is an enum in the proto (ADD = 0, DEL = 1): a varint on the wire.
    pub const ADD: i32 = 0;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ModifiedRealsForVip {
        #[prost(int32, tag = "1")]
        pub action: i32,
        #[prost(message, optional, tag = "2")]
        pub real: Option<Reals>,
        #[prost(message, optional, tag = "3")]
        pub vip: Option<Vip>,
    }

    /// The full path of a `KatranService` method.
    pub fn path(method: &str) -> String {
        format!("/lb.katran.KatranService/{method}")
    }

    /// Katran's key for a VIP: its address as Katran prints it, port and IP protocol number.
    pub fn vip(address: std::net::SocketAddrV4, protocol: u8) -> Vip {
        Vip { address: address.ip().to_string(), port: address.port().into(), protocol: protocol.into() }
    }
}

/// What Katran should hold: each VIP with the weights of its reals. A new `generation` makes
/// the task send everything again (Katran restarted).
#[derive(Clone, Debug, Default, PartialEq)]
struct Wanted {
    generation: u64,
    vips: Vec<VipWeights>,
}

/// A VIP and its reals' weights.
#[derive(Clone, Debug, PartialEq)]
pub struct VipWeights {
    pub address: SocketAddrV4,
    pub proto: u8,
    pub reals: Vec<(Ipv4Addr, u32)>,
}

/// The balancer's handle on the task.
pub struct Client {
    wanted: watch::Sender<Wanted>,
    failures: Arc<AtomicU64>,
}

impl Client {
    /// Starts the task towards the server at `url` (`http://host:port`), which is connected to
    /// when there is something to send. Must run within the tokio runtime.
    pub fn spawn(url: &str) -> anyhow::Result<Client> {
        let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
            .with_context(|| format!("Katran's gRPC address {url:?}"))?
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10))
            .connect_lazy();
        let (wanted, seen) = watch::channel(Wanted::default());
        let failures = Arc::new(AtomicU64::new(0));
        tokio::spawn(run(tonic::client::Grpc::new(channel), seen, failures.clone(), url.to_owned()));
        Ok(Client { wanted, failures })
    }

    /// Asks for every VIP and its weights to be sent again, from the start.
    pub fn resend(&self, vips: Vec<VipWeights>) {
        self.wanted.send_modify(|w| {
            w.generation += 1;
            w.vips = vips;
        });
    }

    /// Asks for VIP `v`'s reals to get `weights` (in the order of [`Client::resend`]'s reals).
    pub fn set_weights(&self, v: usize, weights: &[u32]) {
        self.wanted.send_modify(|w| {
            if let Some(vip) = w.vips.get_mut(v) {
                for ((_, weight), &new) in vip.reals.iter_mut().zip(weights) {
                    *weight = new;
                }
            }
        });
    }

    /// Calls that failed so far.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
}

type Grpc = tonic::client::Grpc<Channel>;

/// Brings Katran to what is wanted, whenever that changes, retrying a second after a failure.
async fn run(mut grpc: Grpc, mut wanted: watch::Receiver<Wanted>, failures: Arc<AtomicU64>, url: String) {
    // What Katran was last given, per VIP, and for which generation.
    let mut sent: Vec<Option<VipWeights>> = Vec::new();
    let mut generation = 0;
    loop {
        let want = wanted.borrow_and_update().clone();
        if want.generation != generation {
            generation = want.generation;
            sent = vec![None; want.vips.len()];
        }
        match bring(&mut grpc, &want, &mut sent).await {
            Ok(0) => {}
            Ok(calls) => info!(calls, server = %url, "Katran's weights set"),
            Err(e) => {
                failures.fetch_add(1, Ordering::Relaxed);
                warn!(server = %url, "Katran's gRPC server: {e:#} (retrying in a second)");
                tokio::select! {
                    changed = wanted.changed() => if changed.is_err() { return },
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
        }
        if wanted.changed().await.is_err() {
            return; // the balancer is gone
        }
    }
}

/// Adds the VIPs Katran lacks (before their first weights) and sends each VIP whose weights
/// differ from what was sent; the number of weight changes made.
async fn bring(grpc: &mut Grpc, want: &Wanted, sent: &mut [Option<VipWeights>]) -> anyhow::Result<usize> {
    let pending: Vec<usize> = (0..want.vips.len()).filter(|&v| sent[v].as_ref() != Some(&want.vips[v])).collect();
    if pending.is_empty() {
        return Ok(0);
    }
    if pending.iter().any(|&v| sent[v].is_none()) {
        let have: proto::Vips = call(grpc, "getAllVips", proto::Empty {}).await?;
        for vip in &want.vips {
            let key = proto::vip(vip.address, vip.proto);
            if !have.vips.contains(&key) {
                let meta = proto::VipMeta { vip: Some(key), flags: 0, set_flag: false };
                let done: proto::Bool = call(grpc, "addVip", meta).await?;
                anyhow::ensure!(done.success, "addVip {} refused", vip.address);
                info!(vip = %vip.address, "added to Katran");
            }
        }
    }
    for &v in &pending {
        let vip = &want.vips[v];
        let reals = vip
            .reals
            .iter()
            .map(|&(address, weight)| proto::Real {
                address: address.to_string(),
                weight: weight.min(i32::MAX as u32) as i32,
                flags: 0,
            })
            .collect();
        let change = proto::ModifiedRealsForVip {
            action: proto::ADD,
            real: Some(proto::Reals { reals }),
            vip: Some(proto::vip(vip.address, vip.proto)),
        };
        let done: proto::Bool = call(grpc, "modifyRealsForVip", change).await?;
        anyhow::ensure!(done.success, "modifyRealsForVip {} refused", vip.address);
        sent[v] = Some(vip.clone());
    }
    Ok(pending.len())
}

/// One unary call of `KatranService` (Katran answers a failure with status CANCELLED).
async fn call<Q, R>(grpc: &mut Grpc, method: &str, request: Q) -> anyhow::Result<R>
where
    Q: prost::Message + Send + Sync + 'static,
    R: prost::Message + Default + Send + Sync + 'static,
{
    grpc.ready().await.with_context(|| format!("connecting for {method}"))?;
    let path = PathAndQuery::try_from(proto::path(method)).expect("a valid path");
    let codec = tonic_prost::ProstCodec::<Q, R>::default();
    let response = grpc.unary(tonic::Request::new(request), path, codec).await;
    Ok(response.with_context(|| method.to_owned())?.into_inner())
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::proto::*;

    /// The bytes `katran.proto` gives a weight change, worked out by hand from the protobuf
    /// wire format: field numbers and types as the proto declares them.
    #[test]
    fn messages_encode_as_katran_proto_numbers_them() {
        let change = ModifiedRealsForVip {
            action: ADD,
            real: Some(Reals { reals: vec![Real { address: "10.1.0.1".into(), weight: 300, flags: 0 }] }),
            vip: Some(vip("10.0.0.1:80".parse().unwrap(), 6)),
        };
        let real = [&[0x0a, 8][..], b"10.1.0.1", &[0x10, 0xac, 0x02]].concat(); // address, weight 300
        let reals = [&[0x0a, real.len() as u8][..], &real].concat();
        let vip_bytes = [&[0x0a, 8][..], b"10.0.0.1", &[0x10, 80, 0x18, 6]].concat();
        // action ADD (0) is proto3's default: not sent.
        let expected = [&[0x12, reals.len() as u8][..], &reals, &[0x1a, vip_bytes.len() as u8], &vip_bytes].concat();
        assert_eq!(change.encode_to_vec(), expected);
        let meta = VipMeta { vip: Some(vip("10.0.0.1:80".parse().unwrap(), 17)), flags: 4, set_flag: true };
        let vip_bytes = [&[0x0a, 8][..], b"10.0.0.1", &[0x10, 80, 0x18, 17]].concat();
        assert_eq!(
            meta.encode_to_vec(),
            [&[0x0a, vip_bytes.len() as u8][..], &vip_bytes, &[0x10, 4, 0x18, 1]].concat()
        );
        assert_eq!(Bool::decode(&[0x08, 1][..]).unwrap(), Bool { success: true });
    }
}
