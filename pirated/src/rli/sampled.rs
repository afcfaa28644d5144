//! Sampled references at the downstream point: each reference the datapath took (a packet of
//! the traffic whose identity hashes below the share, its delay pending) matched with that
//! packet's time at the upstream point, which comes over the peer channel before or after it.
//! The delay is D's arrival minus U's time, both on TAI. A reference gets none, and is void,
//! when no upstream time comes for it within `WAIT_NS`, when its delay is beyond `max_delay`,
//! or when it is ambiguous: one identity twice at either point with no order to pair them by
//! (U's two times in before D's first arrival, or D's two arrivals waiting at once). The
//! datapath then settles the packets around it as unsettled: never interpolated on a guess.

use std::collections::{hash_map::Entry, HashMap, VecDeque};

use pirate_common::rli::{flow::VOID, Taken};

/// How long a reference waits for its upstream time: the upstream point sends its times every
/// ms, so they come within a few, or after a lost segment of the peer channel's TCP is sent
/// again (200 ms at the least).
pub const WAIT_NS: u64 = 250_000_000;
/// Upstream times kept unmatched at most (each waits up to `max_delay` for its packet at D).
pub const MAX_EARLY: usize = 1 << 20;

/// What became of the sampled references, for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcomes {
    /// A delay, from the packet's upstream time.
    pub matched: u64,
    /// No upstream time came in time.
    pub unmatched: u64,
    /// One identity twice at a point, unpaired.
    pub ambiguous: u64,
    /// A delay beyond `max_delay` either way.
    pub stale: u64,
    /// Upstream times dropped: never matched, or beyond `MAX_EARLY`.
    pub times_unused: u64,
}

impl Outcomes {
    /// What they gained since `last`, which becomes them.
    pub fn since(&self, last: &mut Outcomes) -> Outcomes {
        let d = Outcomes {
            matched: self.matched - last.matched,
            unmatched: self.unmatched - last.unmatched,
            ambiguous: self.ambiguous - last.ambiguous,
            stale: self.stale - last.stale,
            times_unused: self.times_unused - last.times_unused,
        };
        *last = *self;
        d
    }
}

/// An upstream time not matched yet.
#[derive(Clone, Copy)]
enum Early {
    At(u64),
    /// Two times for one identity: the next reference of it is ambiguous.
    Twice,
}

/// Matches the downstream point's sampled references with the upstream point's times.
pub struct Matcher {
    max_delay_ns: u64,
    /// References waiting for their upstream time, by identity.
    waiting: HashMap<u64, Taken>,
    /// Upstream times waiting for their reference, by identity, with when they came in.
    early: HashMap<u64, (Early, u64)>,
    /// Identities by when they came in (D's arrival; U's time), oldest first, for expiry; an
    /// entry whose map no longer holds it as of that time is passed over.
    waiting_order: VecDeque<(u64, u64)>,
    early_order: VecDeque<(u64, u64)>,
    pub outcomes: Outcomes,
}

impl Matcher {
    pub fn new(max_delay_ns: u64) -> Matcher {
        Matcher {
            max_delay_ns,
            waiting: HashMap::new(),
            early: HashMap::new(),
            waiting_order: VecDeque::new(),
            early_order: VecDeque::new(),
            outcomes: Outcomes::default(),
        }
    }

    /// A reference the datapath took (`t.id` its identity, `t.tai_ns` its arrival); those it
    /// resolves (its own, or one it makes ambiguous) go to `out`, with their delay or void.
    pub fn downstream(&mut self, t: Taken, out: &mut Vec<Taken>) {
        if let Some(other) = self.waiting.remove(&t.id) {
            self.outcomes.ambiguous += 2;
            out.extend([other, t].map(void));
            return;
        }
        match self.early.remove(&t.id) {
            Some((Early::At(up), _)) => out.push(self.resolve(t, up)),
            Some((Early::Twice, _)) => {
                self.outcomes.ambiguous += 1;
                out.push(void(t));
            }
            None => {
                self.waiting_order.push_back((t.tai_ns, t.id));
                self.waiting.insert(t.id, t);
            }
        }
    }

    /// The upstream point's time `tai_ns` of the packet of identity `id`.
    pub fn upstream(&mut self, id: u64, tai_ns: u64, out: &mut Vec<Taken>) {
        if let Some(t) = self.waiting.remove(&id) {
            out.push(self.resolve(t, tai_ns));
            return;
        }
        if self.early.len() >= MAX_EARLY && !self.early.contains_key(&id) {
            self.outcomes.times_unused += 1;
            return;
        }
        match self.early.entry(id) {
            Entry::Occupied(mut e) => {
                e.get_mut().0 = Early::Twice;
                self.outcomes.times_unused += 1;
            }
            Entry::Vacant(e) => {
                e.insert((Early::At(tai_ns), tai_ns));
                self.early_order.push_back((tai_ns, id));
            }
        }
    }

    /// At `now_ns` (TAI): the references that waited `WAIT_NS` for their time go void into
    /// `out`; the upstream times whose packet would be later than `max_delay` are dropped.
    pub fn expire(&mut self, now_ns: u64, out: &mut Vec<Taken>) {
        while let Some(&(at, id)) = self.waiting_order.front().filter(|(at, _)| at.saturating_add(WAIT_NS) <= now_ns) {
            self.waiting_order.pop_front();
            if let Entry::Occupied(e) = self.waiting.entry(id) {
                if e.get().tai_ns == at {
                    self.outcomes.unmatched += 1;
                    out.push(void(e.remove()));
                }
            }
        }
        let keep = self.max_delay_ns.saturating_add(WAIT_NS);
        while let Some(&(at, id)) = self.early_order.front().filter(|(at, _)| at.saturating_add(keep) <= now_ns) {
            self.early_order.pop_front();
            if let Entry::Occupied(e) = self.early.entry(id) {
                if e.get().1 == at {
                    e.remove();
                    self.outcomes.times_unused += 1;
                }
            }
        }
    }

    fn resolve(&mut self, mut t: Taken, up_ns: u64) -> Taken {
        let delay = t.tai_ns.wrapping_sub(up_ns) as i64;
        t.reference.delay_ns = match delay.unsigned_abs() <= self.max_delay_ns {
            true => {
                self.outcomes.matched += 1;
                delay
            }
            false => {
                self.outcomes.stale += 1;
                VOID
            }
        };
        t
    }
}

fn void(mut t: Taken) -> Taken {
    t.reference.delay_ns = VOID;
    t
}

#[cfg(test)]
mod tests {
    use pirate_common::rli::{flow::PENDING, Reference};

    use super::*;

    fn taken(seq: u64, id: u64, tai_ns: u64) -> Taken {
        Taken { reference: Reference { seq, at_ns: tai_ns, delay_ns: PENDING }, tai_ns, id }
    }

    /// A reference gets its delay whichever comes first, its time or itself; void when its
    /// time never comes, when the delay is beyond the bound, or when an identity comes twice
    /// unpaired; upstream times without a packet are let go of.
    #[test]
    fn each_reference_gets_its_time_or_is_void() {
        let mut m = Matcher::new(1_000_000);
        let mut out = Vec::new();
        // D first, then U; U first, then D.
        m.downstream(taken(1, 10, 5_000_000), &mut out);
        assert!(out.is_empty());
        m.upstream(10, 4_600_000, &mut out);
        m.upstream(11, 5_100_000, &mut out);
        m.downstream(taken(2, 11, 5_300_000), &mut out);
        let delays: Vec<_> = out.drain(..).map(|t| (t.reference.seq, t.reference.delay_ns)).collect();
        assert_eq!(delays, [(1, 400_000), (2, 200_000)]);
        // Beyond max_delay: void (stale).
        m.upstream(12, 1_000_000, &mut out);
        m.downstream(taken(3, 12, 5_400_000), &mut out);
        // Twice at U before D: ambiguous. Twice at D at once: both ambiguous.
        m.upstream(13, 5_400_000, &mut out);
        m.upstream(13, 5_450_000, &mut out);
        m.downstream(taken(4, 13, 5_500_000), &mut out);
        m.downstream(taken(5, 14, 5_500_000), &mut out);
        m.downstream(taken(6, 14, 5_600_000), &mut out);
        let seqs: Vec<_> = out.drain(..).map(|t| (t.reference.seq, t.reference.delay_ns)).collect();
        assert_eq!(seqs, [(3, VOID), (4, VOID), (5, VOID), (6, VOID)]);
        // Never a time: void after WAIT_NS, not before; a time never matched is dropped.
        m.downstream(taken(7, 15, 6_000_000), &mut out);
        m.upstream(16, 6_000_000, &mut out);
        m.expire(6_000_000 + WAIT_NS - 1, &mut out);
        assert!(out.is_empty());
        m.expire(6_000_000 + WAIT_NS, &mut out);
        assert_eq!(out.iter().map(|t| (t.reference.seq, t.reference.delay_ns)).collect::<Vec<_>>(), [(7, VOID)]);
        m.expire(6_000_000 + 1_000_000 + WAIT_NS, &mut out);
        assert!(m.early.is_empty() && m.waiting.is_empty());
        let o = m.outcomes;
        assert_eq!((o.matched, o.stale, o.ambiguous, o.unmatched, o.times_unused), (2, 1, 3, 1, 2));
    }
}
