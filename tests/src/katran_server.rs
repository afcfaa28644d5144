//! A stand-in for Katran's own gRPC server (`katran_server_grpc`, whose C++ control plane needs
//! folly and cannot be built here): `lb.katran.KatranService`'s `getAllVips`, `addVip` and
//! `modifyRealsForVip` over Katran's real balancer, with the semantics of Katran's `KatranLb`
//! (facebookincubator/katran, `KatranLb.cpp` and `Vip.cpp`):
//! - a VIP is keyed by its address string, port and protocol; `addVip` on one it has fails;
//!   VIP numbers are handed out from 0, real ids from 1, one id per real address across VIPs;
//! - `modifyRealsForVip(ADD)` adds reals or sets the weights of those the VIP has, then rebuilds
//!   the VIP's weighted Maglev ring (reals of weight 0 get no positions; all 0 leaves the old
//!   ring); an address that does not parse is skipped;
//! - a failed call answers status CANCELLED.
//!
//! The ring is weighted Maglev over the real ids with a permutation other than pirated's, as
//! Katran's own differs: pirated must read which real a flow went to from Katran's ring, not
//! assume its own. Every other method answers UNIMPLEMENTED, so a client that relies on one fails.

use std::{
    collections::HashMap,
    convert::Infallible,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    sync::{Arc, Mutex},
    task::{Context as TaskContext, Poll},
    thread::JoinHandle,
};

use anyhow::{Context, Result};
use pirated::lb::{katran::RING_SIZE, katran_grpc::proto, maglev::Ring};
use tonic::{
    body::Body,
    codegen::{http, BoxFuture, Service},
    server::{NamedService, UnaryService},
    Status,
};

use crate::{katran::Katran, netns::Netns};

/// The server, serving on a thread of its own until dropped.
pub struct KatranServer {
    pub listen: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<()>>>,
}

#[derive(Default)]
struct State {
    vips: Vec<(proto::Vip, VipState)>,
    /// Real ids by address, across VIPs.
    ids: HashMap<Ipv4Addr, u32>,
    /// Calls by method name.
    calls: HashMap<String, u64>,
}

struct VipState {
    num: u32,
    /// Real id and weight.
    reals: Vec<(u32, u32)>,
}

impl KatranServer {
    /// Serves Katran's API for `katran` on `listen` in `ns`.
    pub fn start(ns: &Netns, listen: SocketAddr, katran: Arc<Katran>) -> Result<KatranServer> {
        let state = Arc::new(Mutex::new(State::default()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (bound, ready) = std::sync::mpsc::channel();
        let service = Katrans { state: state.clone(), katran };
        let thread = ns.spawn_in(move || -> Result<()> {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind(listen).await;
                let ok = listener.is_ok();
                let _ = bound.send(listener.as_ref().map(drop).map_err(|e| e.to_string()));
                if !ok {
                    return Ok(());
                }
                let incoming = tonic::transport::server::TcpIncoming::from(listener?);
                tonic::transport::Server::builder()
                    .serve_with_incoming_shutdown(service, incoming, async {
                        let _ = stopped.await;
                    })
                    .await
                    .context("serving")
            })
        })?;
        match ready.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => anyhow::bail!("binding the Katran stand-in on {listen} in {}: {e}", ns.name()),
            Err(_) => anyhow::bail!("the Katran stand-in's thread ended before binding"),
        }
        Ok(KatranServer { listen, state, stop: Some(stop), thread: Some(thread) })
    }

    /// Calls of `method` so far.
    pub fn calls(&self, method: &str) -> u64 {
        self.state.lock().unwrap().calls.get(method).copied().unwrap_or(0)
    }

    /// The weights VIP `vip` gives its reals, by address.
    pub fn weights(&self, vip: SocketAddrV4) -> Vec<(Ipv4Addr, u32)> {
        let state = self.state.lock().unwrap();
        let key = proto::vip(vip, libc::IPPROTO_TCP as u8);
        let by_id: HashMap<u32, Ipv4Addr> = state.ids.iter().map(|(&a, &id)| (id, a)).collect();
        state
            .vips
            .iter()
            .filter(|(k, _)| *k == key)
            .flat_map(|(_, v)| v.reals.iter().map(|(id, w)| (by_id[id], *w)))
            .collect()
    }
}

impl Drop for KatranServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(Ok(Err(e))) = self.thread.take().map(JoinHandle::join) {
            eprintln!("katran stand-in: {e:#}");
        }
    }
}

/// The service, routing each call by its method name.
#[derive(Clone)]
struct Katrans {
    state: Arc<Mutex<State>>,
    katran: Arc<Katran>,
}

impl NamedService for Katrans {
    const NAME: &'static str = "lb.katran.KatranService";
}

impl Service<http::Request<Body>> for Katrans {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let me = self.clone();
        Box::pin(async move {
            let method = request.uri().path().rsplit('/').next().unwrap_or_default().to_owned();
            *me.state.lock().unwrap().calls.entry(method.clone()).or_default() += 1;
            Ok(match method.as_str() {
                "getAllVips" => unary(request, move |_: proto::Empty| me.all_vips()).await,
                "addVip" => unary(request, move |m: proto::VipMeta| me.add_vip(m)).await,
                "modifyRealsForVip" => unary(request, move |m| me.modify_reals(m)).await,
                _ => Status::unimplemented(format!("{method}: not in the stand-in")).into_http(),
            })
        })
    }
}

/// A unary call answered by `f`.
async fn unary<Q, R, F>(request: http::Request<Body>, f: F) -> http::Response<Body>
where
    Q: prost::Message + Default + Send + 'static,
    R: prost::Message + Send + 'static,
    F: FnMut(Q) -> Result<R, Status> + Send + 'static,
{
    struct Handler<F>(F);
    impl<Q, R, F: FnMut(Q) -> Result<R, Status>> UnaryService<Q> for Handler<F> {
        type Response = R;
        type Future = std::future::Ready<Result<tonic::Response<R>, Status>>;
        fn call(&mut self, request: tonic::Request<Q>) -> Self::Future {
            std::future::ready((self.0)(request.into_inner()).map(tonic::Response::new))
        }
    }
    let codec = tonic_prost::ProstCodec::<R, Q>::default();
    tonic::server::Grpc::new(codec).unary(Handler(f), request).await
}

/// Katran's failures: status CANCELLED with the reason.
fn cancelled(e: impl std::fmt::Display) -> Status {
    Status::cancelled(e.to_string())
}

impl Katrans {
    fn all_vips(&self) -> Result<proto::Vips, Status> {
        Ok(proto::Vips { vips: self.state.lock().unwrap().vips.iter().map(|(k, _)| k.clone()).collect() })
    }

    fn add_vip(&self, meta: proto::VipMeta) -> Result<proto::Bool, Status> {
        let key = meta.vip.ok_or_else(|| cancelled("no vip"))?;
        let mut state = self.state.lock().unwrap();
        if state.vips.iter().any(|(k, _)| *k == key) {
            return Err(cancelled("the VIP exists"));
        }
        let address = socket(&key).ok_or_else(|| cancelled("bad VIP address"))?;
        let num = state.vips.len() as u32;
        self.katran.add_vip(address, key.protocol as u8, num, meta.flags as u32).map_err(cancelled)?;
        state.vips.push((key, VipState { num, reals: Vec::new() }));
        Ok(proto::Bool { success: true })
    }

    fn modify_reals(&self, change: proto::ModifiedRealsForVip) -> Result<proto::Bool, Status> {
        if change.action != proto::ADD {
            return Err(cancelled("only ADD in the stand-in"));
        }
        let key = change.vip.ok_or_else(|| cancelled("no vip"))?;
        let mut state = self.state.lock().unwrap();
        let State { vips, ids, .. } = &mut *state;
        let (_, vip) = vips.iter_mut().find(|(k, _)| *k == key).ok_or_else(|| cancelled("no such VIP"))?;
        for real in change.real.map(|r| r.reals).unwrap_or_default() {
            let Ok(address) = real.address.parse::<Ipv4Addr>() else { continue };
            let next = ids.len() as u32 + 1;
            let id = *ids.entry(address).or_insert(next);
            if id == next {
                self.katran.set_real(id, address).map_err(cancelled)?;
            }
            let weight = real.weight.max(0) as u32;
            match vip.reals.iter_mut().find(|(i, _)| *i == id) {
                Some(r) => r.1 = weight,
                None => vip.reals.push((id, weight)),
            }
        }
        let live: Vec<(u32, u32)> = vip.reals.iter().copied().filter(|&(_, w)| w > 0).collect();
        if !live.is_empty() {
            let keys: Vec<[u64; 2]> = live.iter().map(|&(id, _)| [id as u64, 0x4b61_7472]).collect();
            let keys: Vec<&[u64]> = keys.iter().map(|k| k.as_slice()).collect();
            let weights: Vec<u32> = live.iter().map(|&(_, w)| w).collect();
            let ring = Ring::new(&keys, &weights, RING_SIZE).map_err(cancelled)?;
            let ring: Vec<u32> = ring.entries().iter().map(|&i| live[i as usize].0).collect();
            self.katran.set_ring(vip.num, &ring).map_err(cancelled)?;
        }
        Ok(proto::Bool { success: true })
    }
}

fn socket(vip: &proto::Vip) -> Option<SocketAddrV4> {
    Some(SocketAddrV4::new(vip.address.parse().ok()?, u16::try_from(vip.port).ok()?))
}
