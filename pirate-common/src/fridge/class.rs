//! Request→response classes and their pair ids, from header fields only (payloads may be
//! encrypted): what a packet is to each enabled class, and the 32-bit id its request and its
//! response share. Ids put the client's endpoint first, so a response (sent by the server)
//! computes the same id as its request.

use crate::{
    ctx::PacketCtx,
    key::FlowKey,
    parse::{
        ICMPV6_ECHO, ICMP_ECHO, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP, TCP_ACK, TCP_FIN, TCP_RST,
        TCP_SYN,
    },
};

/// Classes a configuration may enable, at their bit in `Fridges::classes`.
pub const CLASSES: usize = 4;

/// SYN → SYN/ACK where both directions pass the interface; SYN → the client's handshake ACK
/// where only client→server does (DSR): the SYN/ACK clears the slot first where it passes.
pub const TCP_HANDSHAKE: u8 = 0;
/// DNS query → response over UDP port 53.
pub const DNS: u8 = 1;
/// ICMP (and ICMPv6) echo request → reply.
pub const ICMP_ECHO_CLASS: u8 = 2;
/// SYN → the first FIN or RST of either side: the connection's duration.
pub const TCP_FLOW: u8 = 3;

/// The classes' names in configuration, metrics labels and JSON, indexed by class.
pub const NAMES: [&str; CLASSES] = ["tcp-handshake", "dns", "icmp-echo", "tcp-flow"];

const DNS_PORT: u16 = 53;
/// A DNS message's header: queries shorter than it are not DNS.
const DNS_HEADER: u16 = 12;
/// The QR bit of the flags (the low half of `PacketCtx::head`): set in responses.
const DNS_QR: u32 = 0x8000;

/// One request or response of a class, keyed by its pair id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub class: u8,
    pub response: bool,
    pub id: u32,
}

/// What the packet is to the classes enabled in the bit mask `classes`: each of its events to
/// `f` (at most two, both requests: a SYN opens a handshake and a flow; or one response).
/// A callback, not a returned pair of options: the verifier refuses the masking LLVM applies to
/// such a pair's registers on the paths that hold none.
#[inline(always)]
pub fn events(pkt: &PacketCtx, classes: u32, mut f: impl FnMut(Event)) {
    let on = |class: u8| classes & (1 << class) != 0;
    let key = &pkt.key;
    match key.proto {
        IPPROTO_TCP => {
            let flags = pkt.tcp_flags;
            if flags & TCP_SYN != 0 && flags & (TCP_ACK | TCP_RST) == 0 {
                if on(TCP_HANDSHAKE) {
                    f(request(TCP_HANDSHAKE, key, pkt.seq.wrapping_add(1)));
                }
                if on(TCP_FLOW) {
                    f(flow(key, false));
                }
            } else if flags & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK && flags & TCP_RST == 0 {
                if on(TCP_HANDSHAKE) {
                    f(response(TCP_HANDSHAKE, key, pkt.ack));
                }
            } else if flags & (TCP_FIN | TCP_RST) != 0 {
                if on(TCP_FLOW) {
                    f(flow(key, true));
                }
            } else if on(TCP_HANDSHAKE) && pkt.payload == 0 && flags & (TCP_SYN | TCP_ACK) == TCP_ACK {
                // The client's handshake ACK, in the SYN's direction: a pure ACK at the next
                // sequence number. Every pure ACK looks; after the first match the slot is empty.
                f(Event { response: true, ..request(TCP_HANDSHAKE, key, pkt.seq) });
            }
        }
        IPPROTO_UDP if on(DNS) && pkt.payload >= DNS_HEADER => {
            let txid = pkt.head >> 16;
            if key.dport == DNS_PORT && pkt.head & DNS_QR == 0 {
                f(request(DNS, key, txid));
            } else if key.sport == DNS_PORT && pkt.head & DNS_QR != 0 {
                f(response(DNS, key, txid));
            }
        }
        // The parser keeps only echoes of these protocols.
        IPPROTO_ICMP | IPPROTO_ICMPV6 if on(ICMP_ECHO_CLASS) => {
            if pkt.icmp_type == ICMP_ECHO[0] || pkt.icmp_type == ICMPV6_ECHO[0] {
                f(request(ICMP_ECHO_CLASS, key, pkt.head));
            } else {
                f(response(ICMP_ECHO_CLASS, key, pkt.head));
            }
        }
        _ => {}
    }
}

/// The id of a pair between `client` (address words, port) and `server`, told apart from other
/// pairs between them by `extra` (a sequence number, transaction id, echo id).
#[inline(always)]
fn id(class: u8, client: (u64, u64, u16), server: (u64, u64, u16), extra: u32) -> u32 {
    let ports = (client.2 as u64) << 16 | server.2 as u64 | (class as u64) << 32;
    pair_hash(&[client.0, client.1, server.0, server.1, ports, extra as u64])
}

/// A request: the packet's source is the client.
#[inline(always)]
fn request(class: u8, key: &FlowKey, extra: u32) -> Event {
    let w = key.words();
    Event { class, response: false, id: id(class, (w[0], w[1], key.sport), (w[2], w[3], key.dport), extra) }
}

/// A response: the packet's destination is the client.
#[inline(always)]
fn response(class: u8, key: &FlowKey, extra: u32) -> Event {
    let w = key.words();
    Event { class, response: true, id: id(class, (w[2], w[3], key.dport), (w[0], w[1], key.sport), extra) }
}

/// A flow's SYN or its end, either side's: the endpoints in a fixed order (the smaller first),
/// since a FIN or RST may come from either.
#[inline(always)]
fn flow(key: &FlowKey, response: bool) -> Event {
    let w = key.words();
    let (a, b) = ((w[0], w[1], key.sport), (w[2], w[3], key.dport));
    let (lo, hi) = if (a.0, a.1, a.2) <= (b.0, b.1, b.2) { (a, b) } else { (b, a) };
    Event { class: TCP_FLOW, response, id: id(TCP_FLOW, lo, hi, 0) }
}

/// A 32-bit pair id from the header fields both packets of a pair carry (in the request's
/// order: client address, server address, ports, and a per-pair field such as a sequence number
/// or a DNS transaction id), as words.
#[inline(always)]
pub fn pair_hash(words: &[u64]) -> u32 {
    crate::hash::words_hash(0x4652_4944_4745_5321, words) // "FRIDGES!"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        key::{FAMILY_V4, FAMILY_V6},
        parse::IPPROTO_ICMPV6,
    };

    const ALL: u32 = (1 << CLASSES) - 1;

    /// A packet from `src`:`sport` to `dst`:`dport`.
    fn pkt(proto: u8, src: u8, sport: u16, dst: u8, dport: u16) -> PacketCtx {
        let key = FlowKey { sport, dport, proto, family: FAMILY_V4, ..FlowKey::default() };
        let mut p = PacketCtx { key, ..PacketCtx::default() };
        p.key.src[..4].copy_from_slice(&[10, 0, 0, src]);
        p.key.dst[..4].copy_from_slice(&[10, 0, 0, dst]);
        p
    }
    fn tcp(src: u8, sport: u16, dst: u8, dport: u16, flags: u8, seq: u32, ack: u32) -> PacketCtx {
        PacketCtx { tcp_flags: flags, seq, ack, ..pkt(IPPROTO_TCP, src, sport, dst, dport) }
    }
    fn all(p: &PacketCtx, classes: u32) -> Vec<Event> {
        let mut out = Vec::new();
        events(p, classes, |e| out.push(e));
        out
    }
    fn one(p: &PacketCtx, classes: u32) -> Event {
        match all(p, classes)[..] {
            [e] => e,
            ref other => panic!("{p:?}: {other:?}"),
        }
    }

    #[test]
    fn a_syn_opens_a_handshake_its_syn_ack_or_the_clients_ack_closes() {
        let syn = tcp(1, 40000, 2, 80, TCP_SYN, 1000, 0);
        let [hs, fl] = all(&syn, ALL)[..] else { panic!("{:?}", all(&syn, ALL)) };
        assert_eq!((hs.class, hs.response, fl.class, fl.response), (TCP_HANDSHAKE, false, TCP_FLOW, false));
        let syn_ack = one(&tcp(2, 80, 1, 40000, TCP_SYN | TCP_ACK, 7777, 1001), ALL);
        assert_eq!(syn_ack, Event { response: true, ..hs });
        let ack = tcp(1, 40000, 2, 80, TCP_ACK, 1001, 7778);
        assert_eq!(one(&ack, ALL), Event { response: true, ..hs }, "one-direction: the client's handshake ACK");
        // Another connection's, or another handshake's of the same ports (a later ISN).
        assert_ne!(one(&tcp(1, 40001, 2, 80, TCP_ACK, 1001, 1), ALL).id, hs.id);
        assert_ne!(one(&tcp(1, 40000, 2, 80, TCP_ACK, 5001, 1), ALL).id, hs.id);
        // Data, and the handshake class off: nothing.
        let data = PacketCtx { payload: 100, ..tcp(1, 40000, 2, 80, TCP_ACK, 1001, 7778) };
        assert_eq!(all(&data, ALL), []);
        assert_eq!(all(&ack, ALL & !(1 << TCP_HANDSHAKE)), []);
        assert_eq!(all(&syn, 1 << TCP_FLOW), [fl]);
    }

    #[test]
    fn a_flow_ends_at_either_sides_fin_or_rst() {
        let syn = tcp(1, 40000, 2, 80, TCP_SYN, 1000, 0);
        let open = all(&syn, ALL)[1];
        for (p, what) in [
            (tcp(1, 40000, 2, 80, TCP_FIN | TCP_ACK, 5000, 9000), "client FIN"),
            (tcp(2, 80, 1, 40000, TCP_FIN | TCP_ACK, 9000, 5000), "server FIN"),
            (tcp(2, 80, 1, 40000, TCP_RST, 0, 0), "server RST"),
        ] {
            assert_eq!(one(&p, ALL), Event { response: true, ..open }, "{what}");
        }
        assert_ne!(one(&tcp(2, 80, 1, 40001, TCP_RST, 0, 0), ALL).id, open.id);
    }

    #[test]
    fn dns_and_echo_pairs_match_by_transaction_and_echo_id() {
        let udp =
            |src, sport, dst, dport, head| PacketCtx { head, payload: 40, ..pkt(IPPROTO_UDP, src, sport, dst, dport) };
        let query = one(&udp(1, 5353, 3, 53, 0xbeef_0100), ALL);
        assert_eq!((query.class, query.response), (DNS, false));
        assert_eq!(one(&udp(3, 53, 1, 5353, 0xbeef_8180), ALL), Event { response: true, ..query });
        assert_ne!(one(&udp(3, 53, 1, 5353, 0xbeee_8180), ALL).id, query.id, "another transaction");
        assert_eq!(all(&udp(1, 5353, 3, 53, 0xbeef_8180), ALL), [], "a response to the server");
        assert_eq!(all(&PacketCtx { payload: 8, ..udp(1, 5353, 3, 53, 0xbeef_0100) }, ALL), []);

        let mut echo = pkt(IPPROTO_ICMPV6, 1, 0, 2, 0);
        echo.key.family = FAMILY_V6;
        echo.key.src = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        echo.key.dst = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        let request = one(&PacketCtx { icmp_type: ICMPV6_ECHO[0], head: 0x1234_0007, ..echo }, ALL);
        let mut reply = PacketCtx { icmp_type: ICMPV6_ECHO[1], head: 0x1234_0007, ..echo };
        (reply.key.src, reply.key.dst) = (echo.key.dst, echo.key.src);
        assert_eq!(one(&reply, ALL), Event { response: true, ..request });
        reply.head += 1;
        assert_ne!(one(&reply, ALL).id, request.id, "the next sequence number");
        let v4 = PacketCtx { icmp_type: ICMP_ECHO[1], head: 0x1234_0007, ..pkt(IPPROTO_ICMP, 2, 0, 1, 0) };
        assert!(one(&v4, ALL).response, "type 0 is a reply");
        assert_eq!(all(&v4, ALL & !(1 << ICMP_ECHO_CLASS)), []);
    }
}
