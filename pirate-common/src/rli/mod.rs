//! RLI (reference latency interpolation) at the downstream point: reference packets from the
//! upstream point, each carrying its send time, give the segment's delay exactly at their
//! arrival; every other packet's delay is estimated from the references around it, per flow
//! (`flow`). [`packet`] is the per-packet step the datapath and replay both run: a reference
//! is checked (`reference`: its tag under the segment key, its sequence number not seen
//! before, its delay plausible), kept and taken out of the traffic; any other packet goes into
//! its flow's counters. With sampled references, nothing is injected: packets whose identity
//! hashes below a share are references, their time at the upstream point handed to its pirated
//! (which sends it over the peer channel), at the downstream point kept with their delay
//! pending until that time is in.

pub mod flow;
pub mod reference;

use crate::{ctx::PacketCtx, identity::identity, key::FlowKey, parse::Frame};
pub use flow::Reference;
use flow::RliFlow;
use flow::PENDING;
use reference::{RliShape, Window, PAYLOAD};

/// A reference taken, for pirated (its quantiles of the segment's delay): the reference and
/// its arrival on the shared clock, which places it in an interval; a sampled one's identity
/// (0: an injected one), by which pirated finds its upstream time. At the upstream point, a
/// sampled packet's identity and time (the reference left empty).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Taken {
    pub reference: Reference,
    pub tai_ns: u64,
    pub id: u64,
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for Reference {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for Taken {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for RliFlow {}

/// References kept for interpolation, by sequence number modulo this: a flow's packets wait
/// for the reference after theirs, which must still be here when the flow's next packet (or
/// pirated's drain) settles them. At 3 000 references a second (0.2 % of 1 Gb/s), 1.4 s.
pub const RING: u32 = 4096;

/// Where the downstream point keeps its references: the datapath's shared maps, or replay's.
pub trait References {
    /// The newest reference's sequence number (0: none yet).
    fn newest(&self) -> u64;
    /// Reference `seq`, if the ring still holds it.
    fn get(&self, seq: u64) -> Option<Reference>;
    /// Keeps a reference (the newest if it is).
    fn put(&mut self, reference: Reference);
    /// The next sequence number of a sampled reference, in arrival order.
    fn number(&mut self) -> u64;
    /// The replay window over sequence numbers.
    fn window(&mut self) -> Option<&mut Window>;
    /// Hands a taken reference to pirated; whether it went (a full ring drops it).
    fn taken(&mut self, taken: Taken) -> bool;
}

/// Where the flows' counters live: get or create.
pub trait Flows {
    fn flow(&mut self, key: &FlowKey) -> Option<&mut RliFlow>;
}

/// What [`packet`] did, for the datapath's counters and its verdict: a regular packet goes on
/// down the chain, anything sent to the reference port is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not a reference: into its flow's counters (if a reference came before it).
    Regular,
    /// A reference, taken (and handed to pirated, or `Lost` if its ring was full).
    Taken,
    Lost,
    /// To the reference port, but no valid tag under the key (or too short to carry one).
    Forged,
    /// A sequence number already taken, or older than the window remembers.
    Replayed,
    /// A delay beyond `max_delay_ns` either way: a reference held back and sent later, or
    /// clocks apart.
    Stale,
    /// A packet sampled as a reference, handed to pirated (or `SampledLost`: its ring full);
    /// it goes on down the chain.
    Sampled,
    SampledLost,
}

/// One packet at the downstream point: `at_ns` its arrival on the datapath's monotonic clock,
/// `tai_ns` on the shared one (only references need it).
#[inline(always)]
pub fn packet<F: Frame + ?Sized, R: References, S: Flows>(
    shape: &RliShape,
    pkt: &PacketCtx,
    frame: &F,
    tai_ns: impl FnOnce() -> u64,
    refs: &mut R,
    flows: &mut S,
) -> Verdict {
    if shape.is_reference(&pkt.key) {
        return reference(shape, pkt, frame, tai_ns(), refs);
    }
    let mut verdict = Verdict::Regular;
    if shape.sample_below != 0 {
        let id = identity(frame, pkt);
        if shape.sampled(id) {
            verdict = sampled(shape, pkt, id, tai_ns(), refs);
        }
        if shape.upstream != 0 {
            return verdict;
        }
    }
    let newest = refs.newest();
    if newest == 0 {
        return verdict;
    }
    if let Some(flow) = flows.flow(&pkt.key) {
        flow.on_packet(pkt.ts_ns, refs.get(newest), |seq| refs.get(seq));
    }
    verdict
}

/// A sampled packet: at the upstream point its time goes to pirated; at the downstream point
/// it becomes the newest reference, its delay pending (the packet itself then follows it, at
/// τ = 0, like any other of its flow).
#[inline(always)]
fn sampled<R: References>(shape: &RliShape, pkt: &PacketCtx, id: u64, tai_ns: u64, refs: &mut R) -> Verdict {
    let mut reference = Reference::default();
    if shape.upstream == 0 {
        reference = Reference { seq: refs.number(), at_ns: pkt.ts_ns, delay_ns: PENDING };
        refs.put(reference);
    }
    match refs.taken(Taken { reference, tai_ns, id }) {
        true => Verdict::Sampled,
        false => Verdict::SampledLost,
    }
}

#[inline(always)]
fn reference<F: Frame + ?Sized, R: References>(
    shape: &RliShape,
    pkt: &PacketCtx,
    frame: &F,
    tai_ns: u64,
    refs: &mut R,
) -> Verdict {
    // Masked for the verifier, which tracks a packet offset's range only below 64 KiB; a UDP
    // header past 4 KiB (huge IPv6 extension headers) is no reference of ours.
    let bytes = match pkt.payload as usize >= PAYLOAD && pkt.l4_off < 0x1000 {
        true => frame.read::<[u8; PAYLOAD]>((pkt.l4_off & 0xfff) as usize + 8),
        false => None,
    };
    let Some((seq, sent_ns)) = bytes.and_then(|b| reference::open(shape.key, &b)) else { return Verdict::Forged };
    let delay_ns = tai_ns.wrapping_sub(sent_ns) as i64;
    if delay_ns.unsigned_abs() > shape.max_delay_ns {
        return Verdict::Stale;
    }
    if !refs.window().is_some_and(|window| window.admit(seq)) {
        return Verdict::Replayed;
    }
    let reference = Reference { seq, at_ns: pkt.ts_ns, delay_ns };
    refs.put(reference);
    match refs.taken(Taken { reference, tai_ns, id: 0 }) {
        true => Verdict::Taken,
        false => Verdict::Lost,
    }
}
