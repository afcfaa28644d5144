//! What a listener facing the network holds at once: connections in all, and from one address
//! (an IPv6 /64). Beyond, the oldest gives way to the newest, so that strangers who keep
//! connecting cannot keep out a peer or a scraper whose exchange takes a round trip or two. A
//! leaf: `/metrics` and the segment's peer listener bound their strangers with it.

use std::{collections::VecDeque, net::IpAddr};

use tokio::task::AbortHandle;

/// The connections held, oldest first, each by its source and the task serving it.
pub struct Held {
    held: VecDeque<(IpAddr, AbortHandle)>,
    total: usize,
    per_source: usize,
}

impl Held {
    /// At most `total` connections at once, `per_source` from one address.
    pub fn new(total: usize, per_source: usize) -> Held {
        Held { held: VecDeque::new(), total, per_source }
    }

    /// Holds the connection from `ip` that `task` serves, closing (aborting) the one the limits
    /// call for to make room for it; whether one was closed.
    pub fn admit(&mut self, ip: IpAddr, task: AbortHandle) -> bool {
        let closed = self.make_room(ip).map(|oldest| oldest.abort()).is_some();
        self.hold(ip, task);
        closed
    }

    /// Makes room for a connection from `ip`: the task of the one to close for it, if the limits
    /// call for one (the oldest from its source, else the oldest of all).
    fn make_room(&mut self, ip: IpAddr) -> Option<AbortHandle> {
        self.held.retain(|(_, task)| !task.is_finished());
        let source = source_of(ip);
        let oldest = match self.held.iter().filter(|(s, _)| *s == source).count() {
            n if n >= self.per_source => self.held.iter().position(|(s, _)| *s == source),
            _ if self.held.len() >= self.total => Some(0),
            _ => None,
        };
        oldest.and_then(|i| self.held.remove(i)).map(|(_, task)| task)
    }

    /// Holds the connection from `ip` that `task` serves.
    fn hold(&mut self, ip: IpAddr, task: AbortHandle) {
        self.held.push_back((source_of(ip), task));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_oldest_gives_way_in_its_source_then_in_all() {
        let mut held = Held::new(3, 2);
        let task = || tokio::spawn(std::future::pending::<()>()).abort_handle();
        let (a, b, c): (IpAddr, IpAddr, IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into(), [10, 0, 0, 3].into());
        let a1 = task();
        held.hold(a, a1.clone());
        assert!(held.make_room(a).is_none());
        held.hold(a, task());
        let closed = held.make_room(a).expect("a third from one source");
        assert_eq!(closed.id(), a1.id(), "not the oldest of its source");
        held.hold(a, task());
        let b1 = task();
        assert!(held.make_room(b).is_none());
        held.hold(b, b1);
        assert!(held.make_room(c).is_some(), "a fourth in all");
        // A /64 is one source.
        let mut v6 = Held::new(8, 1);
        v6.hold("2001:db8::1".parse().unwrap(), task());
        assert!(v6.make_room("2001:db8::ffff:2".parse().unwrap()).is_some());
        assert!(v6.make_room("2001:db8:0:1::1".parse().unwrap()).is_none());
    }
}
