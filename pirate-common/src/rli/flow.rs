//! RLI's per-flow counters at the downstream point, in integers the datapath can afford (no
//! floating point, 64-bit products only, no division by a value the packet controls): per flow,
//! packets, Σ delay and Σ delay² by the left reference (RLI-L) and by interpolation between the
//! references before and after each packet (RLI). The packets after the newest reference cannot
//! be interpolated yet: they wait in three sums (how many, Σ τ, Σ τ², τ their time since that
//! reference), which the next reference settles, since Σ (d_L + s·τ)² expands into them. A
//! sampled reference's delay comes later than the packet (its upstream time crosses the peer
//! channel): the packets around it wait in a group of their own until it is in, a few groups a
//! flow (with more pending, the most recent group widens over the newer references).
//!
//! Squares are taken around a centre (the first delay a counter takes) in units of 16 ns: a
//! square of the delay itself, rounded to any unit the sums can hold, loses the variance of a
//! flow whose spread is small beside its delay. Beyond the bounds below
//! (references further apart than `MAX_TAU`, more than `MAX_WAITING` packets of a flow between
//! two, delays or their changes beyond `MAX_SPREAD_NS` from the centre) a packet is counted by
//! RLI-L alone, or not at all, and counted as `unsettled`.

/// τ's unit: 64 ns.
pub const TAU_SHIFT: u32 = 6;
/// The longest τ interpolated, in `TAU_SHIFT` units: references at most 1.07 s apart at D
/// (one a second, or a queue that grew by tens of ms between two, still interpolated: leaving
/// such packets out would leave out the slowest). The products below stay within 63 bits: Σ τ²
/// over `MAX_WAITING` packets, and `waiting` × span², are at most 2^58.
pub const MAX_TAU: u64 = 1 << 24;
/// The most packets of one flow between two references.
pub const MAX_WAITING: u64 = 1 << 10;
/// How far after theirs the packets' right reference is looked for: a span crosses up to
/// `MAX_SKIP` - 1 references lost in a row, interpolated from the one before to the first after
/// that arrived.
pub const MAX_SKIP: u64 = 4;
/// Squared deviations in units of 16 ns, squared.
pub const SQ_SHIFT: u32 = 4;
/// The largest deviation from a counter's centre, and change of delay between two references,
/// taken: ±268 ms.
pub const MAX_SPREAD_NS: i64 = 1 << 28;

/// The paper's three counters, the squares around a centre: packets, Σ delay (ns), Σ (delay −
/// centre)² (`SQ_SHIFT` units), and the centre (the first delay taken).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub packets: u64,
    pub sum_ns: i64,
    pub sum_sq: u64,
    pub centre_ns: i64,
}

impl Counters {
    /// `delay - centre` in `SQ_SHIFT` units, the centre set by the first delay; `None` beyond
    /// `MAX_SPREAD_NS`.
    #[inline(always)]
    fn deviation(&mut self, delay_ns: i64) -> Option<i64> {
        if self.packets == 0 {
            self.centre_ns = delay_ns;
        }
        let off = delay_ns.checked_sub(self.centre_ns)?;
        (off.unsigned_abs() < MAX_SPREAD_NS as u64).then(|| units(off))
    }

    /// One packet of delay `delay_ns`; false (nothing counted) beyond the bounds.
    #[inline(always)]
    fn add(&mut self, delay_ns: i64) -> bool {
        let Some(u) = self.deviation(delay_ns) else { return false };
        self.packets += 1;
        self.sum_ns = self.sum_ns.wrapping_add(delay_ns);
        self.sum_sq = self.sum_sq.saturating_add((u * u) as u64);
        true
    }

    /// `k` packets interpolated on the line from `left_ns` changing by `delta_ns` over the span,
    /// whose Σ τ/span and Σ τ²/span² are `x1` and `x2` (2^-16 units, each at most `k`).
    #[inline(always)]
    fn add_line(&mut self, k: u64, left_ns: i64, delta_ns: i64, x1: i64, x2: i64) -> bool {
        let Some(a) = self.deviation(left_ns) else { return false };
        // Σ e, e = Δd·τ/span each: in ns, then units.
        let e1 = (delta_ns * x1) >> 16;
        let (e1u, dd) = (units(e1), units(delta_ns));
        // Σ (a + e)² = k·a² + 2·a·Σe + Σe², with Σe² = Δd²·x2.
        let sq = k as i64 * a * a + 2 * a * e1u + dd * ((dd * x2) >> 16);
        self.packets += k;
        self.sum_ns = self.sum_ns.wrapping_add((k as i64).wrapping_mul(left_ns).wrapping_add(e1));
        self.sum_sq = self.sum_sq.saturating_add(sq.max(0) as u64);
        true
    }
}

/// A reference's delay not known yet: a sampled packet at the downstream point, whose time at
/// the upstream point is still on its way over the peer channel.
pub const PENDING: i64 = i64::MIN;
/// A reference's delay never to be known: a sampled packet the upstream point has no time for.
pub const VOID: i64 = i64::MIN + 1;

/// A reference packet as the downstream point took it: its sequence number, its arrival (ns,
/// the datapath's monotonic clock, which regular packets are stamped on too) and its delay
/// (ns, the points' shared clock: TAI), or [`PENDING`] or [`VOID`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reference {
    pub seq: u64,
    pub at_ns: u64,
    pub delay_ns: i64,
}

impl Reference {
    /// Its delay, if known.
    #[inline(always)]
    pub fn delay(&self) -> Option<i64> {
        (self.delay_ns != PENDING && self.delay_ns != VOID).then_some(self.delay_ns)
    }

    #[inline(always)]
    pub fn pending(&self) -> bool {
        self.delay_ns == PENDING
    }
}

/// How many groups of waiting packets a flow keeps: packets after references whose delays are
/// still pending wait in a group per reference (an injected reference's delay is known on
/// arrival, and one group is all a flow ever uses). With more pending than that, the most
/// recent group widens over the newer references (see [`RliFlow::on_packet`]).
pub const GROUPS: usize = 4;
/// `Waiting::after`'s top bit: the reference's delay was pending when the group opened, so
/// RLI-L counts its packets when it settles, not on arrival.
const DEFERRED: u64 = 1 << 63;

/// A flow's packets after one reference, waiting for the one after the last they followed:
/// how many, Σ τ, Σ τ² (τ their time since the first, `TAU_SHIFT` units), the first's number
/// (with [`DEFERRED`]) and the last's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Waiting {
    pub after: u64,
    pub last: u64,
    pub packets: u64,
    pub tau: u64,
    pub tau_sq: u64,
}

impl Waiting {
    /// The reference the packets follow.
    #[inline(always)]
    pub fn seq(&self) -> u64 {
        self.after & !DEFERRED
    }
}

/// One flow's counters at the downstream point.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RliFlow {
    /// By interpolation (RLI).
    pub rli: Counters,
    /// By the left reference (RLI-L).
    pub left: Counters,
    /// The packets waiting for the reference after theirs, a group per reference.
    pub waiting: [Waiting; GROUPS],
    /// Packets RLI could not interpolate (outside the bounds, their right reference lost, or
    /// their left one's delay never known).
    pub unsettled: u64,
    /// Packets RLI interpolated in a widened group: over a span with references inside it.
    pub widened: u64,
}

impl RliFlow {
    /// A regular packet of the flow, arriving at `at_ns`, where `newest` is the newest reference
    /// the point has and `reference(seq)` finds an earlier one (the ring keeps a few). The
    /// groups of earlier references settle first, those whose delays are in. The packet joins
    /// the open group (the newest reference's), else a free one; with none free (more
    /// references pending than groups: their delays slow to come) the most recent group,
    /// widened to the newest reference, its packets interpolated over the longer span from its
    /// first reference to the one after its last (what fewer references would give, rather
    /// than none). A packet before any reference counts nowhere.
    #[inline(always)]
    pub fn on_packet(&mut self, at_ns: u64, newest: Option<Reference>, reference: impl Fn(u64) -> Option<Reference>) {
        let Some(newest) = newest else { return };
        self.settle_ready(newest.seq, newest.seq, false, &reference);
        let (mut open, mut free, mut recent, mut recent_last) = (GROUPS, GROUPS, GROUPS, 0);
        for i in 0..GROUPS {
            let w = &self.waiting[i];
            if w.packets == 0 {
                free = free.min(i);
            } else {
                if w.last == newest.seq {
                    open = i;
                }
                if w.last >= recent_last {
                    (recent, recent_last) = (i, w.last);
                }
            }
        }
        // Masked for the verifier, which then knows the index within the array (one of the
        // three is always found).
        let g = match (open < GROUPS, free < GROUPS) {
            (true, _) => open,
            (false, true) => free,
            (false, false) => recent,
        } & (GROUPS - 1);
        if self.waiting[g].packets == 0 {
            self.waiting[g].after = newest.seq | if newest.pending() { DEFERRED } else { 0 };
        }
        let w = self.waiting[g];
        // RLI-L: a deferred group's packets count when it settles, on its first reference;
        // any other packet now, on the newest reference (or, not in yet, the group's first).
        let mut first = newest;
        if w.seq() != newest.seq {
            let Some(r) = reference(w.seq()) else {
                self.unsettled += 1;
                return;
            };
            first = r;
        }
        let counted = match w.after & DEFERRED != 0 {
            true => true,
            false => newest.delay().or(first.delay()).is_some_and(|d| self.left.add(d)),
        };
        let tau = at_ns.saturating_sub(first.at_ns) >> TAU_SHIFT;
        if !counted || tau >= MAX_TAU || w.packets >= MAX_WAITING {
            self.unsettled += 1;
            return;
        }
        let w = &mut self.waiting[g];
        w.last = newest.seq;
        w.packets += 1;
        w.tau += tau;
        w.tau_sq += tau * tau;
    }

    /// Settles every waiting group on the references around it that `reference` has; those it
    /// has not, or whose delays never came, count as unsettled (RLI-L counted those it could).
    #[inline(always)]
    pub fn settle(&mut self, reference: impl Fn(u64) -> Option<Reference>) {
        self.settle_ready(u64::MAX, u64::MAX, true, &reference);
    }

    /// Whether every waiting group can settle now, `newest` the newest reference's number:
    /// none waits on a delay still pending or a reference yet to come.
    pub fn resolved(&self, newest: u64, reference: impl Fn(u64) -> Option<Reference>) -> bool {
        let mut copy = *self;
        copy.settle_ready(newest, u64::MAX, false, &reference)
    }

    /// Settles the groups (but that of reference `skip`, which waits for the next) whose
    /// references are in, or, `last`, every group; whether none is left waiting.
    #[inline(always)]
    fn settle_ready(
        &mut self,
        newest: u64,
        skip: u64,
        last: bool,
        reference: &impl Fn(u64) -> Option<Reference>,
    ) -> bool {
        let mut done = true;
        for i in 0..GROUPS {
            let w = self.waiting[i];
            if w.packets > 0 && w.last != skip {
                done &= self.settle_group(i, newest, last, reference);
            }
        }
        done
    }

    /// Settles group `i` if the delays of its references are in (or, `last`, whatever they
    /// are); whether it did.
    #[inline(always)]
    fn settle_group(
        &mut self,
        i: usize,
        newest: u64,
        last: bool,
        reference: &impl Fn(u64) -> Option<Reference>,
    ) -> bool {
        let w = self.waiting[i & (GROUPS - 1)];
        let l = reference(w.seq());
        if !last && l.is_some_and(|l| l.pending()) {
            return false;
        }
        // The right reference: the first of the `MAX_SKIP` after their last whose delay is known
        // (one lost on the way, or never to be known, leaves its successor to close the span).
        // With the left one gone from the ring, none is looked for: unsettled at once.
        // (A reference, not an `Option` the loop may leave unset: the verifier refuses a
        // register read before it is written, which the optimiser allows itself for `None`.)
        let mut r = Reference { delay_ns: VOID, ..Reference::default() };
        for skip in 1..=MAX_SKIP {
            match l.and_then(|_| reference(w.last + skip)) {
                Some(c) if c.pending() && !last => return false,
                Some(c) if c.delay().is_some() => {
                    r = c;
                    break;
                }
                _ => {}
            }
        }
        if l.is_some() && r.delay().is_none() && !last && w.last + MAX_SKIP >= newest {
            // Yet to come.
            return false;
        }
        self.waiting[i & (GROUPS - 1)] = Waiting::default();
        let k = w.packets;
        let left = l.and_then(|l| l.delay());
        let counted = match left {
            Some(d) if w.after & DEFERRED != 0 => self.left.add_line(k, d, 0, 0, 0),
            _ => left.is_some(),
        };
        let (Some(l), Some(_), true) = (l, r.delay(), counted) else {
            self.unsettled += k;
            return true;
        };
        let (left_ns, right_ns) = (l.delay_ns, r.delay_ns);
        let span = r.at_ns.saturating_sub(l.at_ns) >> TAU_SHIFT;
        let delta = right_ns.checked_sub(left_ns).filter(|d| d.unsigned_abs() < MAX_SPREAD_NS as u64);
        // The span bounded first, then each τ within it (arrivals in order), which bounds the
        // products below.
        let (tau, tau_sq) = (w.tau, w.tau_sq);
        let within = (1..MAX_TAU).contains(&span) && tau <= k * span && tau_sq <= k * span * span;
        let (Some(delta), true) = (delta, within) else {
            self.unsettled += k;
            return true;
        };
        // Σ τ / span and Σ τ² / span², in 2^-16 units: each at most k.
        let x1 = ((tau << 16) / span) as i64;
        let x2 = (((tau_sq / span) << 16) / span) as i64;
        match self.rli.add_line(k, left_ns, delta, x1, x2) {
            true if w.last != w.seq() => self.widened += k,
            true => {}
            false => self.unsettled += k,
        }
        true
    }
}

/// `delay_ns` in `SQ_SHIFT` units, rounded to the nearest (truncating would take half a unit
/// off every deviation, a bias of the deviation's size times the unit once squared).
#[inline(always)]
fn units(delay_ns: i64) -> i64 {
    (delay_ns + (1 << (SQ_SHIFT - 1))) >> SQ_SHIFT
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A packet half-way between a reference and the next one that arrived, after one lost
    /// between them, is interpolated between the two; after more lost in a row than `MAX_SKIP`
    /// it is unsettled (RLI-L has it either way).
    #[test]
    fn a_lost_reference_leaves_the_span_to_the_next_one() {
        let at = |seq: u64| Reference { seq, at_ns: seq * 64_000, delay_ns: 1_000_000 + seq as i64 * 1000 };
        for (lost, interpolated) in [(1, true), (MAX_SKIP - 1, true), (MAX_SKIP, false)] {
            let right = 1 + lost + 1;
            let refs = |seq: u64| (seq == 1 || seq == right).then(|| at(seq));
            let mut flow = RliFlow::default();
            // Half-way between reference 1 and the right one, in time.
            flow.on_packet((at(1).at_ns + at(right).at_ns) / 2, refs(1), refs);
            flow.settle(refs);
            assert_eq!(flow.left.packets, 1);
            match interpolated {
                true => {
                    assert_eq!((flow.rli.packets, flow.unsettled), (1, 0), "{lost} lost");
                    let expected = (at(1).delay_ns + at(right).delay_ns) / 2;
                    assert!((flow.rli.sum_ns - expected).abs() <= 16, "{} against {expected}", flow.rli.sum_ns);
                }
                false => assert_eq!((flow.rli.packets, flow.unsettled), (0, 1), "{lost} lost"),
            }
        }
    }
}
