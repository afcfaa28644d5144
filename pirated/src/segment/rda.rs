//! RDA's reconciliation and estimators (Sun et al. §V): the subtraction of U's RDA from D's,
//! peeled packet by packet (Alg. 1: a bucket is pure when its count is ±1 and its XOR of
//! identities hashes back to it), each packet classified as lost (U only) or reordered (D only);
//! the repair that removes them from the RDA that holds them, with their timestamps from that
//! point's packet cache; the mean over the buckets that then agree; and the standard deviation
//! from selectively collapsed buckets (Alg. 2 and 3: usable buckets paired within a bank).

use pirate_common::segment::rda::{RdaBucket, RdaShape};

use super::{difference, Figures, Sums};

/// The packets one point saw and the other did not.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decoded {
    /// Seen at U only.
    pub lost: Vec<u64>,
    /// Seen at D only (sent before the interval, or on a path that skips U).
    pub reordered: Vec<u64>,
    /// Whether the subtraction peeled down to nothing: every such packet was listed.
    pub complete: bool,
}

/// The RDA one point fills from its `(identity, timestamp)` packets.
pub fn record(shape: &RdaShape, packets: &[(u64, u64)]) -> Vec<RdaBucket> {
    let mut rda = vec![RdaBucket::default(); shape.len()];
    for &(id, ts) in packets {
        for bank in 0..shape.banks {
            rda[shape.bucket(bank, id) as usize].update(id, ts, 1);
        }
    }
    rda
}

/// Peels `down - up` (Alg. 1), each packet only where `seen(sign, id)` says the point it would
/// be at has it (sign −1: U, a packet D lacks; +1: D, one U lacks). A bucket of several packets
/// whose XOR hashes back to it passes for pure about one in `buckets` times and would peel a
/// packet that is not there, which can feed itself (docs/method.md). A packet no point has is
/// left in its buckets, which stay unusable: the decode is then incomplete, never wrong.
pub fn decode(shape: &RdaShape, up: &[RdaBucket], down: &[RdaBucket], seen: impl Fn(i64, u64) -> bool) -> Decoded {
    let mut diff: Vec<(u64, i64)> =
        up.iter().zip(down).map(|(u, d)| (u.id_xor ^ d.id_xor, d.count - u.count)).collect();
    let pure = |diff: &[(u64, i64)], i: usize| {
        let (id, count) = diff[i];
        count.abs() == 1 && shape.bucket(i as u32 / shape.buckets, id) == i as u32 && seen(count, id)
    };
    let mut stack: Vec<usize> = (0..diff.len()).filter(|&i| pure(&diff, i)).collect();
    let mut out = Decoded::default();
    // And where `seen` cannot tell (D asking U for the packets only U saw), a real difference
    // never lists more packets than the subtraction has buckets.
    let most = diff.len();
    while let Some(i) = stack.pop() {
        if out.lost.len() + out.reordered.len() >= most {
            break;
        }
        if !pure(&diff, i) {
            continue; // emptied, or changed, by a packet peeled since
        }
        let (id, sign) = diff[i];
        match sign {
            1 => out.reordered.push(id),
            _ => out.lost.push(id),
        }
        for bank in 0..shape.banks {
            let q = shape.bucket(bank, id) as usize;
            diff[q].0 ^= id;
            diff[q].1 -= sign;
            if pure(&diff, q) {
                stack.push(q);
            }
        }
    }
    out.complete = diff.iter().all(|&d| d == (0, 0));
    out
}

/// Removes `ids` (each with its timestamp from that point's cache) from `rda`; the number of
/// `ids` the cache lacked, which stay (their buckets then stay unusable).
pub fn remove(shape: &RdaShape, rda: &mut [RdaBucket], ids: &[u64], cache: impl Fn(u64) -> Option<u64>) -> u64 {
    let mut missing = 0;
    for &id in ids {
        let Some(ts) = cache(id) else {
            missing += 1;
            continue;
        };
        for bank in 0..shape.banks {
            rda[shape.bucket(bank, id) as usize].update(id, ts, -1);
        }
    }
    missing
}

/// One interval's figures, in the timestamps' unit.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RdaEstimate {
    /// Mean, standard deviation and bound (with `samples` / banks independent packets).
    pub figures: Figures,
    /// Packets in usable buckets, each counted once per bank it is usable in.
    pub samples: u64,
    /// The fraction of non-empty buckets that are usable.
    pub usable: f64,
}

/// The estimate from repaired RDAs: a bucket is usable when both points hold the same packets
/// in it (same XOR of identities and count). `exact` are delays known packet by packet (a
/// packet that reached D only in the next interval, with both timestamps from the caches),
/// counted once each.
pub fn estimate(shape: &RdaShape, up: &[RdaBucket], down: &[RdaBucket], exact: &[f64]) -> RdaEstimate {
    let usable = |u: &RdaBucket, d: &RdaBucket| u.id_xor == d.id_xor && u.count == d.count && u.count > 0;
    let (mut out, mut sums, mut filled, mut usable_buckets) = (RdaEstimate::default(), Sums::default(), 0usize, 0usize);
    for bank in 0..shape.banks as usize {
        let n = shape.buckets as usize;
        let (up, down) = (&up[bank * n..][..n], &down[bank * n..][..n]);
        let mut pending: Option<(f64, u64)> = None;
        for (u, d) in up.iter().zip(down) {
            filled += usize::from(u.count > 0 || d.count > 0);
            if !usable(u, d) {
                continue;
            }
            usable_buckets += 1;
            let delays = difference(u.ts_sum, d.ts_sum);
            sums.delays += delays;
            sums.samples += u.count as u64;
            let side = (delays, u.count as u64);
            match pending.take() {
                None => pending = Some(side),
                Some(first) => sums.pair(first, side),
            }
        }
    }
    out.usable = match filled {
        0 => 0.0,
        _ => usable_buckets as f64 / filled as f64,
    };
    // Each bank holds every packet once: the independent samples are one bank's.
    let independent = sums.samples / shape.banks as u64 + exact.len() as u64;
    for &w in exact {
        sums.delays += w * shape.banks as f64;
        sums.samples += shape.banks as u64;
    }
    for pair in exact.chunks_exact(2) {
        sums.pair((pair[0], 1), (pair[1], 1));
    }
    out.samples = sums.samples;
    out.figures = sums.figures(independent);
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Two points' RDAs over the same packets but for a lost and a reordered one: the decode
    /// lists exactly those, the repair removes them, and the mean is then exact.
    #[test]
    fn a_lost_and_a_reordered_packet_are_peeled_and_repaired() {
        let shape = RdaShape { buckets: 16, banks: 2 };
        let id = |i: u64| i * 0x9e37_79b9;
        // Sent at 1000 i, delayed 100 + i; 7 is seen at D only, 13 at U only.
        let up_packets: Vec<(u64, u64)> = (1..=40).filter(|&i| i != 7).map(|i| (id(i), i * 1000)).collect();
        let down_packets: Vec<(u64, u64)> =
            (1..=40).filter(|&i| i != 13).map(|i| (id(i), i * 1000 + 100 + i)).collect();
        let (mut up, mut down) = (record(&shape, &up_packets), record(&shape, &down_packets));
        let (up_cache, down_cache): (HashMap<u64, u64>, HashMap<u64, u64>) =
            (up_packets.into_iter().collect(), down_packets.into_iter().collect());
        let seen = |sign: i64, id: u64| match sign {
            1 => down_cache.contains_key(&id),
            _ => up_cache.contains_key(&id),
        };
        let decoded = decode(&shape, &up, &down, seen);
        assert_eq!(decoded, Decoded { lost: vec![id(13)], reordered: vec![id(7)], complete: true });
        assert_eq!(remove(&shape, &mut up, &decoded.lost, |id| up_cache.get(&id).copied()), 0);
        assert_eq!(remove(&shape, &mut down, &decoded.reordered, |id| down_cache.get(&id).copied()), 0);
        let e = estimate(&shape, &up, &down, &[]);
        // Delays 100 + id over the 38 packets both saw.
        let truth = (1..=40u64).filter(|&i| i != 7 && i != 13).map(|i| 100 + i).sum::<u64>() as f64 / 38.0;
        assert_eq!((e.figures.mean, e.samples, e.usable), (Some(truth), 76, 1.0));
    }

    /// More differences than the table decodes (overloaded, or two points' records of
    /// different packets): whatever passes for pure, only packets a point lacks of the other are
    /// listed; without that check, packets neither has are, at some loads.
    #[test]
    fn an_overloaded_table_lists_only_packets_the_points_have() {
        let shape = RdaShape { buckets: 64, banks: 2 };
        let id = |i: u64| (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut false_blind = 0;
        for shift in (20..=400).step_by(20) {
            let up_ids: Vec<(u64, u64)> = (0..1000).map(|i| (id(i), i)).collect();
            let down_ids: Vec<(u64, u64)> = (shift..1000 + shift).map(|i| (id(i), i)).collect();
            let (up, down) = (record(&shape, &up_ids), record(&shape, &down_ids));
            let (up_set, down_set): (HashMap<u64, u64>, HashMap<u64, u64>) =
                (up_ids.iter().copied().collect(), down_ids.iter().copied().collect());
            let seen = |sign: i64, id: u64| match sign {
                1 => down_set.contains_key(&id) && !up_set.contains_key(&id),
                _ => up_set.contains_key(&id) && !down_set.contains_key(&id),
            };
            let decoded = decode(&shape, &up, &down, seen);
            assert!(decoded.lost.iter().all(|i| up_set.contains_key(i) && !down_set.contains_key(i)), "{shift}");
            assert!(decoded.reordered.iter().all(|i| down_set.contains_key(i) && !up_set.contains_key(i)), "{shift}");
            let blind = decode(&shape, &up, &down, |_, _| true);
            let real = |i: &&u64| up_set.contains_key(i) != down_set.contains_key(i);
            false_blind += blind.lost.iter().chain(&blind.reordered).filter(|i| !real(i)).count();
        }
        assert!(false_blind > 0, "no false listing without the check at any load: the test shows nothing");
    }
}
