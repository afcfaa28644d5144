//! What a listener facing the network holds at once: connections in all, and from one address,
//! each given back when its connection ends. A leaf: `/metrics` and the segment's peer listener
//! bound their strangers with it.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
};

/// The limits and what is held against them.
#[derive(Clone)]
pub struct Limits {
    held: Arc<Mutex<Held>>,
    total: usize,
    per_source: usize,
}

#[derive(Default)]
struct Held {
    total: usize,
    per_source: HashMap<IpAddr, usize>,
}

/// A connection's place, given back on drop.
pub struct Slot {
    held: Arc<Mutex<Held>>,
    source: IpAddr,
}

impl Limits {
    /// At most `total` connections at once, `per_source` from one address.
    pub fn new(total: usize, per_source: usize) -> Limits {
        Limits { held: Arc::default(), total, per_source }
    }

    /// A place for a connection from `source` (counted with its /64 for IPv6), if the limits
    /// leave one.
    pub fn take(&self, source: IpAddr) -> Option<Slot> {
        let source = source_of(source);
        let mut h = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let from = h.per_source.get(&source).copied().unwrap_or(0);
        if h.total >= self.total || from >= self.per_source {
            return None;
        }
        h.total += 1;
        h.per_source.insert(source, from + 1);
        Some(Slot { held: self.held.clone(), source })
    }
}

/// Who a connection counts against: an IPv4 address, or an IPv6 address's /64 (one host holds
/// a whole /64).
pub fn source_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        v4 => v4,
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut h = self.held.lock().unwrap_or_else(|p| p.into_inner());
        h.total -= 1;
        if let Some(n) = h.per_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                h.per_source.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_in_all_and_per_source_and_given_back() {
        let limits = Limits::new(3, 2);
        let (a, b, c) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into(), [10, 0, 0, 3].into());
        let a1 = limits.take(a).unwrap();
        let _a2 = limits.take(a).unwrap();
        assert!(limits.take(a).is_none(), "a third from one source");
        let _b1 = limits.take(b).unwrap();
        assert!(limits.take(c).is_none(), "a fourth in all");
        drop(a1);
        let _c1 = limits.take(c).expect("a place given back is taken again");
        // A /64 is one source.
        let v6 = Limits::new(8, 1);
        let _one = v6.take("2001:db8::1".parse().unwrap()).unwrap();
        assert!(v6.take("2001:db8::ffff:2".parse().unwrap()).is_none());
        assert!(v6.take("2001:db8:0:1::1".parse().unwrap()).is_some());
    }
}
