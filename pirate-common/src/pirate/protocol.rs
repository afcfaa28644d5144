//! What a TCP client's first data says of its protocol: whether it may multiplex requests on
//! the connection (HTTP/2, gRPC). Nothing in such a client's packets tells how many requests it
//! has in flight: streams out of step, two groups half a cycle apart, or a server that serves
//! the streams one at a time each time requests exactly as one stream of a faster server would
//! (docs/method.md), so the estimators must not read its gaps as one request in flight.
//!
//! Looked at once per connection, in its first data segment of [`MIN_LOOK`] bytes or more: the
//! HTTP/2 preface, or `h2` in the ClientHello's ALPN offer; a preamble (the PROXY protocol) or a
//! payload the frame does not hold hides what follows, and counts as multiplexing. A connection
//! met after its handshake is judged by the data it is met in: only the start of an HTTP/1
//! request or a RESP command clears it. Anything else on a connection seen opening (HTTP/1,
//! RESP, a database's protocol) keeps the paper's assumption, one request in flight or requests
//! pipelined in order.

use super::flow::FlowState;
use crate::{
    ctx::PacketCtx,
    parse::{Frame, IPPROTO_TCP, TCP_ACK, TCP_SYN},
};

/// `FlowState::protocol` bits.
/// The client's SYN was seen: its first data is the protocol's first.
pub const OPENED: u8 = 1;
/// Nothing more to look at.
pub const KNOWN: u8 = 4;
/// The client speaks, offers, or may speak a protocol that multiplexes requests.
pub const MULTIPLEXING: u8 = 8;

/// Data segments shorter than this are not judged (a keepalive probe, a hello's first bytes
/// split off): the next one is.
const MIN_LOOK: u16 = 6;
/// HTTP/2's connection preface starts `PRI * HTTP/2.0` (RFC 9113 §3.4).
const PREFACE: [u8; 4] = *b"PRI ";
/// The PROXY protocol's headers, version 1 and 2, before the client's own data.
const PROXY_V1: [u8; 6] = *b"PROXY ";
const PROXY_V2: [u8; 6] = *b"\r\n\r\n\0\r";
/// HTTP/1 methods' first four bytes (CONNECT, a tunnel, is not among them).
const HTTP1: [[u8; 4]; 8] = [*b"GET ", *b"POST", *b"PUT ", *b"HEAD", *b"DELE", *b"OPTI", *b"PATC", *b"TRAC"];
/// TLS record content types: change_cipher_spec, alert, handshake, application_data.
const TLS_HANDSHAKE: u8 = 22;
const TLS_TYPES: core::ops::RangeInclusive<u8> = 20..=23;
/// The ClientHello handshake message, and its ALPN extension (RFC 8446 §4.1.2, RFC 7301).
const CLIENT_HELLO: u8 = 1;
const ALPN: u16 = 16;
/// Extensions and ALPN names walked at most: ClientHellos carry about 10–20 extensions and offer
/// a few names.
const MAX_EXTENSIONS: usize = 32;
const MAX_NAMES: usize = 8;
/// Transport headers further into the frame than this are not looked past (none the parser
/// accepts in practice: Ethernet, two VLAN tags, IPv6 and a few extension headers).
const MAX_L4_OFF: usize = 256;

/// Looks at a TCP packet of the flow `st` for what its protocol says, until it is known: a test
/// of the flags and one of a byte per packet after that. A client's SYN starts a connection
/// afresh on the flow's 5-tuple (a port used again), whose protocol is yet to be seen.
#[inline(always)]
pub fn sniff<F: Frame + ?Sized, const M: usize>(st: &mut FlowState<M>, pkt: &PacketCtx, f: &F) {
    if pkt.key.proto != IPPROTO_TCP {
        return;
    }
    if pkt.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN {
        st.protocol = OPENED;
    }
    // A SYN may carry data too (TCP Fast Open).
    if st.protocol & KNOWN == 0 && pkt.payload >= MIN_LOOK {
        first_data(st, pkt, f);
    }
}

/// [`sniff`] while the protocol is unknown. A function of its own in the datapath: the
/// verifier walks its paths once, not once for each state the per-packet step may reach it in,
/// and the step after it starts from one.
#[inline(never)]
fn first_data<F: Frame + ?Sized, const M: usize>(st: &mut FlowState<M>, pkt: &PacketCtx, f: &F) {
    let l4 = pkt.l4_off as usize;
    let doff = if l4 <= MAX_L4_OFF { f.read::<u8>(l4 + 12) } else { None };
    let multiplexing = doff.is_none_or(|d| {
        let at = l4 + (d >> 4) as usize * 4;
        multiplexes(f, at, at + pkt.payload as usize, st.protocol & OPENED == 0)
    });
    st.protocol |= KNOWN | if multiplexing { MULTIPLEXING } else { 0 };
}

/// Whether a client whose first data seen lies from `at` to `end` may multiplex: the HTTP/2
/// preface, or a TLS ClientHello that offers `h2`; a TLS record of any other kind (the hello
/// not seen: its offer is unknown), a PROXY protocol header, or data the frame does not hold
/// (a capture cut short); or, `late` (joined after the handshake), anything but the start of an
/// HTTP/1 request or a RESP command.
#[inline(always)]
fn multiplexes<F: Frame + ?Sized>(f: &F, at: usize, end: usize, late: bool) -> bool {
    let Some(head) = f.read::<[u8; 6]>(at) else { return true };
    let tls = head[1] == 3 && head[2] <= 4 && TLS_TYPES.contains(&head[0]);
    if tls && head[0] == TLS_HANDSHAKE && head[5] == CLIENT_HELLO {
        return offers_h2(f, at, end);
    }
    let word = [head[0], head[1], head[2], head[3]];
    if word == PREFACE || tls || head == PROXY_V1 || head == PROXY_V2 {
        return true;
    }
    let digit = |b: u8| b.is_ascii_digit();
    let resp = head[0] == b'*' && digit(head[1]) && (head[2] == b'\r' || (digit(head[2]) && head[3] == b'\r'));
    late && !(resp || HTTP1.contains(&word))
}

/// Whether the ClientHello in the record at `at` offers `h2` in its ALPN extension, or may: an
/// extension list that runs on past `end` (the segment's) is taken to, since a name may be in the
/// next segment. Every field is read through [`Frame::chunk`] at offsets the hello's own lengths
/// give, and none past `end`.
#[inline(always)]
fn offers_h2<F: Frame + ?Sized>(f: &F, at: usize, end: usize) -> bool {
    let u8_at = |p: usize| f.chunk::<1>(p).filter(|_| p < end).map(|b| b[0] as usize);
    let u16_at = |p: usize| f.chunk::<2>(p).filter(|_| p + 2 <= end).map(|b| u16::from_be_bytes(b) as usize);
    // Record header (5), handshake header (4), legacy version (2), random (32).
    let mut p = at + 5 + 4 + 2 + 32;
    let Some(session) = u8_at(p) else { return true };
    p += 1 + session;
    let Some(suites) = u16_at(p) else { return true };
    p += 2 + suites;
    let Some(compression) = u8_at(p) else { return true };
    p += 1 + compression;
    let Some(extensions) = u16_at(p) else { return true };
    p += 2;
    let last = p + extensions;
    for _ in 0..MAX_EXTENSIONS {
        if p >= last {
            return false;
        }
        let Some(ext) = f.chunk::<4>(p).filter(|_| p + 4 <= end) else { return true };
        let len = u16::from_be_bytes([ext[2], ext[3]]) as usize;
        if u16::from_be_bytes([ext[0], ext[1]]) == ALPN {
            return alpn_has_h2(f, p + 4 + 2, p + 4 + len, end);
        }
        p += 4 + len;
    }
    true
}

/// Whether the ALPN names from `p` to `last` hold `h2`, or may (past `end`).
#[inline(always)]
fn alpn_has_h2<F: Frame + ?Sized>(f: &F, mut p: usize, last: usize, end: usize) -> bool {
    for _ in 0..MAX_NAMES {
        if p >= last {
            return false;
        }
        let Some(name) = f.chunk::<3>(p).filter(|_| p + 3 <= end) else { return true };
        if name == [2, b'h', b'2'] {
            return true;
        }
        p += 1 + name[0] as usize;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pirate::config::MODES_COMPACT;

    /// A TCP segment's frame from the client (Ethernet, IPv4, a 32-byte TCP header) and its
    /// parsed context.
    fn segment(flags: u8, payload: &[u8]) -> (Vec<u8>, PacketCtx) {
        let mut frame = vec![0u8; 14 + 20 + 32];
        frame[14 + 20 + 12] = 8 << 4;
        frame.extend_from_slice(payload);
        let mut pkt = PacketCtx { l4_off: 34, payload: payload.len() as u16, tcp_flags: flags, ..PacketCtx::default() };
        pkt.key.proto = IPPROTO_TCP;
        (frame, pkt)
    }

    /// The protocol bits after the client's segments, opened in view (a SYN first) or not.
    fn after(opened: bool, payloads: &[&[u8]]) -> u8 {
        let mut st = FlowState::<MODES_COMPACT>::new(1);
        let syn = opened.then_some(&[][..]);
        for (i, p) in syn.into_iter().chain(payloads.iter().copied()).enumerate() {
            let flags = if opened && i == 0 { TCP_SYN } else { TCP_ACK };
            let (frame, pkt) = segment(flags, p);
            sniff(&mut st, &pkt, &frame[..]);
        }
        st.protocol & (KNOWN | MULTIPLEXING)
    }

    /// A ClientHello record: a session id, two cipher suites, and extensions `before` bytes of
    /// padding, an ALPN offer of `names` (none: no ALPN), `after` bytes of padding (a
    /// post-quantum key share makes a hello longer than a segment).
    fn client_hello(names: Option<&[&str]>, before: usize, after: usize) -> Vec<u8> {
        let ext = |kind: u16, data: &[u8]| {
            let mut e = kind.to_be_bytes().to_vec();
            e.extend_from_slice(&(data.len() as u16).to_be_bytes());
            e.extend_from_slice(data);
            e
        };
        let mut extensions = ext(21, &vec![0; before]);
        if let Some(names) = names {
            let list: Vec<u8> = names.iter().flat_map(|n| [&[n.len() as u8][..], n.as_bytes()].concat()).collect();
            extensions.extend(ext(ALPN, &[&(list.len() as u16).to_be_bytes()[..], &list].concat()));
        }
        extensions.extend(ext(51, &vec![0x33; after]));
        let mut hello = vec![3, 3];
        hello.extend([0x5a; 32]);
        hello.push(32);
        hello.extend([0x11; 32]);
        hello.extend([0, 4, 0x13, 1, 0x13, 2, 1, 0]);
        hello.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
        hello.extend(extensions);
        let mut record = vec![TLS_HANDSHAKE, 3, 1];
        record.extend_from_slice(&(hello.len() as u16 + 4).to_be_bytes());
        record.extend([CLIENT_HELLO, 0]);
        record.extend_from_slice(&(hello.len() as u16).to_be_bytes());
        record.extend(hello);
        record
    }

    #[test]
    fn a_multiplexing_protocol_is_told_by_its_first_data() {
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\x12\x04\0\0\0\0\0";
        assert_eq!(after(true, &[preface]), KNOWN | MULTIPLEXING);
        let hello = |names| after(true, &[&client_hello(names, 20, 300)]);
        assert_eq!(hello(Some(&["h2", "http/1.1"])), KNOWN | MULTIPLEXING);
        assert_eq!(hello(Some(&["http/1.1", "h2"])), KNOWN | MULTIPLEXING);
        assert_eq!(hello(Some(&["http/1.1"])), KNOWN);
        assert_eq!(hello(Some(&["h2c", "h3"])), KNOWN);
        assert_eq!(hello(None), KNOWN);
        assert_eq!(after(true, &[b"GET /small HTTP/1.1\r\nHost: x\r\n\r\n"]), KNOWN);
        assert_eq!(after(true, &[b"*1\r\n$4\r\nPING\r\n"]), KNOWN);
        // Only the first data is looked at: a preface later is some protocol's payload.
        assert_eq!(after(true, &[b"GET / HTTP/1.1\r\n\r\n", preface]), KNOWN);
        // Nothing yet: a SYN alone, a pure ACK.
        assert_eq!(after(true, &[&[]]), 0);
        // A preamble hides what follows; so does a payload the frame does not hold (a capture
        // cut short).
        assert_eq!(after(true, &[b"PROXY TCP4 10.0.0.1 10.0.0.2 40000 443\r\n"]), KNOWN | MULTIPLEXING);
        assert_eq!(after(true, &[b"\r\n\r\n\0\r\nQUIT\n\x21\x11\0\x0c"]), KNOWN | MULTIPLEXING);
        let mut st = FlowState::<MODES_COMPACT>::new(1);
        let (mut frame, mut pkt) = segment(TCP_ACK, b"GET / HTTP/1.1\r\n\r\n");
        frame.truncate(frame.len() - 16);
        pkt.payload += 100;
        sniff(&mut st, &pkt, &frame[..]);
        assert_eq!(st.protocol, KNOWN | MULTIPLEXING);
        // A port used again: the new connection's SYN starts afresh.
        let mut st = FlowState::<MODES_COMPACT>::new(1);
        for (flags, data) in
            [(TCP_SYN, &b""[..]), (TCP_ACK, b"GET / HTTP/1.1\r\n\r\n"), (TCP_SYN, b""), (TCP_ACK, preface)]
        {
            let (frame, pkt) = segment(flags, data);
            sniff(&mut st, &pkt, &frame[..]);
        }
        assert_eq!(st.protocol, OPENED | KNOWN | MULTIPLEXING);
        // TCP Fast Open: the hello in the SYN.
        let mut st = FlowState::<MODES_COMPACT>::new(1);
        let (frame, pkt) = segment(TCP_SYN, &client_hello(Some(&["h2"]), 20, 300));
        sniff(&mut st, &pkt, &frame[..]);
        assert_eq!(st.protocol, OPENED | KNOWN | MULTIPLEXING);
    }

    /// A ClientHello longer than a segment: its ALPN offer read in the first; where the offer,
    /// or the extensions before it, run on into the second, taken as offering `h2`.
    #[test]
    fn an_offer_past_the_first_segment_counts_as_made() {
        let split = |names: &[&str], before: usize, at: usize| {
            let hello = client_hello(Some(names), before, 1300);
            let (a, b) = hello.split_at(at);
            after(true, &[a, b])
        };
        assert_eq!(split(&["h2"], 20, 1400), KNOWN | MULTIPLEXING);
        assert_eq!(split(&["http/1.1"], 20, 1400), KNOWN);
        assert_eq!(split(&["http/1.1"], 1300, 2000), KNOWN);
        let offer = client_hello(Some(&["http/1.1"]), 1300, 0).windows(9).position(|w| w == b"\x08http/1.1").unwrap();
        for at in [60, 1000, offer - 4, offer + 1] {
            assert_eq!(split(&["http/1.1"], 1300, at), KNOWN | MULTIPLEXING, "split at {at}");
        }
        // Three bytes of a name tell it is not `h2`.
        assert_eq!(split(&["http/1.1"], 1300, offer + 3), KNOWN);
    }

    /// Joined after the handshake: TLS records hide the offer, and an HTTP/2 frame, or the
    /// middle of a record or a frame, may be anything; only the start of an HTTP/1 request or a
    /// RESP command clears the flow. Segments too short to tell (a keepalive probe) wait for
    /// the next.
    #[test]
    fn a_flow_joined_late_may_multiplex() {
        assert_eq!(after(false, &[&[23, 3, 3, 0, 40, 1, 2, 3]]), KNOWN | MULTIPLEXING);
        let headers = [0, 0, 20, 1, 4, 0, 0, 0, 7, 0x82];
        assert_eq!(after(false, &[&headers]), KNOWN | MULTIPLEXING);
        assert_eq!(after(false, &[&[0x5a; 1400]]), KNOWN | MULTIPLEXING);
        assert_eq!(after(true, &[&headers]), KNOWN);
        // Opened in view, its hello not seen: the offer is unknown.
        assert_eq!(after(true, &[&[23, 3, 3, 0, 40, 1, 2, 3]]), KNOWN | MULTIPLEXING);
        assert_eq!(after(false, &[b"GET / HTTP/1.1\r\n\r\n"]), KNOWN);
        assert_eq!(after(false, &[b"*12\r\n$4\r\nMGET\r\n"]), KNOWN);
        assert_eq!(after(false, &[&[0]]), 0);
        assert_eq!(after(false, &[&[0], &[23, 3, 3, 0, 40, 1, 2, 3]]), KNOWN | MULTIPLEXING);
        assert_eq!(after(false, &[b"*1\r\n$4\r\nPING\r\n"]), KNOWN);
    }
}
