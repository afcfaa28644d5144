//! `pirate`'s flow table: an array of sets of [`WAYS`] flows, which pirated reads in place (the
//! array is mmapable) instead of copying a hash table out entry by entry. A flow may sit in
//! either of two sets picked by its flow hash ([`sets_of`]); a new flow takes an empty way of
//! the two, else the way whose last packet is oldest. With one set per flow, sets overflow long
//! before the table is full (4 ways: one flow in eight finds its set full at 80 % of the ways
//! in use); two choices of 8 ways each, with the table sized for 80 % of its ways
//! ([`sets_for`]), turn away 1 flow in 5000 when `max_flows` flows are in it (simulated).

use super::flow::FlowState;
use crate::key::FlowId;

/// Flows per set: their ids fill two cache lines.
pub const WAYS: usize = 8;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Set<const M: usize> {
    /// The flows' ids, together in one cache line; family 0 marks an empty way.
    pub ids: [FlowId; WAYS],
    pub states: [FlowState<M>; WAYS],
}

impl<const M: usize> Set<M> {
    /// The way holding `id`, or [`WAYS`] if none does.
    #[inline(always)]
    pub fn find(&self, id: &FlowId) -> usize {
        let want = id.words();
        let mut at = WAYS;
        for (w, have) in self.ids.iter().enumerate() {
            let have = have.words();
            if have[0] == want[0] && have[1] == want[1] {
                at = w;
            }
        }
        at
    }

    /// The way a new flow would take here, and what taking it costs (the lower the better): an
    /// empty way of a set with few flows (its flows, 0 to WAYS − 1), else the way whose last
    /// packet is oldest (WAYS plus that time in 256 ns units). The emptier of two sets fills
    /// first, which is what keeps both from overflowing. Without branches but one per way: the
    /// verifier walks it once, where a way index carried through branches multiplies its walk.
    #[inline(always)]
    pub fn victim(&self) -> (usize, u64) {
        // 1 for a taken way (family 4 or 6), 0 for an empty one.
        let taken = |w: usize| (self.ids[w].family as u64 + 255) >> 8;
        let mut used = 0;
        for w in 0..WAYS {
            used += taken(w);
        }
        let mut best = u64::MAX;
        for w in 0..WAYS {
            let t = taken(w);
            let age = self.states[w].last_pkt.get() >> 8;
            let cost = (1 - t) * used + t * (WAYS as u64 + age);
            best = best.min((cost << 3) | w as u64);
        }
        ((best & 7) as usize, best >> 3)
    }
}

/// Sets for a table of `flows` flows, with a quarter more ways than flows.
pub fn sets_for(flows: u32) -> u32 {
    (flows as u64 * 5 / 4).div_ceil(WAYS as u64).max(1) as u32
}

/// The two sets (of `sets`) a flow of hash `hash` may sit in: the hash itself, and the hash
/// mixed again, each scaled into 0..sets by a multiply and a shift (no division: it would cost
/// the datapath more than the rest of the lookup).
#[inline(always)]
pub fn sets_of(hash: u32, sets: u32) -> (u32, u32) {
    let scale = |h: u32| ((h as u64 * sets as u64) >> 32) as u32;
    (scale(hash), scale(hash.wrapping_mul(0x85eb_ca6b).rotate_right(15)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        key::{FlowKey, FAMILY_V4, FAMILY_V6},
        pirate::config::MODES_COMPACT,
    };

    fn id(port: u16, family: u8) -> FlowId {
        let mut key = FlowKey { sport: port, dport: 80, proto: 17, family, ..FlowKey::default() };
        key.src[..4].copy_from_slice(&[10, 0, 0, 1]);
        FlowId::of(&key, crate::hash::FLOW_SEED)
    }

    #[test]
    fn a_flow_is_found_in_its_way_and_new_flows_take_empty_then_oldest_ways() {
        let mut set = Set { ids: [FlowId::default(); WAYS], states: [FlowState::<MODES_COMPACT>::new(1); WAYS] };
        for w in 0..WAYS {
            // The first empty way; the cost is the flows already in the set.
            assert_eq!(set.victim(), (w, w as u64));
            set.ids[w] = id(1000 + w as u16, FAMILY_V4);
            set.states[w].last_pkt.set(100 << 8);
        }
        assert_eq!(set.find(&id(1002, FAMILY_V4)), 2);
        assert_eq!(set.find(&id(1002, FAMILY_V6)), WAYS, "another family is another flow");
        assert_eq!(set.find(&id(999, FAMILY_V4)), WAYS);
        // Full: the way whose last packet is oldest, at a cost above any set with room.
        set.states[3].last_pkt.set(40 << 8);
        assert_eq!(set.victim(), (3, WAYS as u64 + 40));
        set.states[1].last_pkt.set(5 << 8);
        assert_eq!(set.victim(), (1, WAYS as u64 + 5));
    }

    /// `max_flows` flows arriving at random into a table sized for them: with two sets to
    /// choose from, almost every one finds an empty way; with one, many find their set full.
    #[test]
    fn two_choices_hold_max_flows() {
        let flows = 1u32 << 16;
        let sets = sets_for(flows);
        let full = |choices: bool| {
            let mut used = vec![0usize; sets as usize];
            let mut turned_away = 0;
            for i in 0..flows {
                let key = FlowKey { sport: i as u16, dport: (i >> 16) as u16, ..FlowKey::default() };
                let (a, b) = sets_of(key.flow_hash(crate::hash::FLOW_SEED), sets);
                assert!(a < sets && b < sets);
                let pick = if choices && used[b as usize] < used[a as usize] { b } else { a } as usize;
                match used[pick] {
                    WAYS => turned_away += 1,
                    _ => used[pick] += 1,
                }
            }
            turned_away
        };
        let (one, two) = (full(false), full(true));
        eprintln!("of {flows} flows, turned away: {one} with one set each, {two} with two");
        assert!(two * 2000 < flows, "{two} flows of {flows} found both sets full");
        assert!(one > 50 * two.max(1), "one choice ({one}) did about as well as two ({two})");
    }

    #[test]
    fn sets_cover_the_flows_asked_for() {
        assert_eq!(sets_for(1), 1);
        assert_eq!(sets_for(65536), 10240);
        assert_eq!(sets_for(65537), 10241);
        assert_eq!(sets_for(16 << 20), 2621440);
    }
}
