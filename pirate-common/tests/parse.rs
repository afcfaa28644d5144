//! Header parsing (`pirate_common::parse`) against hand-built frames. The XDP program runs this
//! very parser, so these tests are the specification of what the kernel side accepts, rejects and
//! measures.
//!
//! Every frame is assembled by the small builder below from its layers, and every expected value
//! is derived from what the builder was told to put into the frame, never from parser output.

use pirate_common::{
    ctx::PacketCtx,
    key::{FlowKey, FAMILY_V4, FAMILY_V6},
    parse::{parse, Reject},
    pirate::tracker::PacketInfo,
};
use proptest::{
    prelude::*,
    test_runner::{Config as ProptestConfig, RngSeed},
};

// ---------------------------------------------------------------------------------------------
// Frame builder
// ---------------------------------------------------------------------------------------------

/// The acknowledgement number every built TCP segment carries (ACK set or not).
const ACK_NUMBER: u32 = 0x0506_0708;
const SEQ_NUMBER: u32 = 0x0102_0304;

/// What the parser reports for a TCP segment built here, without FIN.
fn tcp_info(payload: u16, pure_ack: bool, ack: Option<u32>) -> PacketInfo {
    PacketInfo { payload, pure_ack, ack, data_end: data_end(payload, 0), syn: false, quic: false }
}

/// The sequence number just past a built segment's data: a FIN takes a number too.
fn data_end(payload: u16, flags: u8) -> u32 {
    SEQ_NUMBER.wrapping_add(payload as u32 + (flags & FIN != 0) as u32)
}

/// Whether a segment with these flags opens a connection (SYN without ACK).
fn opens(flags: u8) -> bool {
    flags & SYN != 0 && flags & ACK == 0
}

/// What the parser reports for a UDP datagram.
fn udp_info(payload: u16) -> PacketInfo {
    PacketInfo { payload, pure_ack: false, ack: None, data_end: 0, syn: false, quic: false }
}
const TPID_8021Q: u16 = 0x8100;
const TPID_8021AD: u16 = 0x88a8;
const ETH_IPV4: u16 = 0x0800;
const ETH_IPV6: u16 = 0x86dd;
const ETH_ARP: u16 = 0x0806;
const ETH_LLDP: u16 = 0x88cc;

const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const PSH: u8 = 0x08;
const ACK: u8 = 0x10;
const URG: u8 = 0x20;

const PROTO_ICMP: u8 = 1;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const PROTO_GRE: u8 = 47;
const PROTO_ESP: u8 = 50;
const PROTO_ICMPV6: u8 = 58;
const PROTO_NONE_V6: u8 = 59;
const PROTO_SCTP: u8 = 132;

const ETH_LEN: usize = 14;
const VLAN_LEN: usize = 4;
const IPV4_LEN: usize = 20;
const IPV6_LEN: usize = 40;
const TCP_LEN: usize = 20;
const UDP_LEN: usize = 8;
/// Bytes of the TCP header the parser itself reads: ports, seq, ack, data offset and flags.
const TCP_READ: usize = 14;

const SRC4: [u8; 4] = [192, 0, 2, 1];
const DST4: [u8; 4] = [198, 51, 100, 7];
const SRC6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0xaa, 0xbb, 0xcc, 0x01];
const DST6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0x11, 0x22, 0x33, 0x02];
/// Ports whose two bytes differ, so a byte-order mistake shows.
const SPORT: u16 = 40_000; // 0x9c40
const DPORT: u16 = 8443; // 0x20fb

/// TCP options: NOP, NOP, timestamps (10 bytes) — the usual 12 bytes of an established flow.
const TCP_OPT_TS: [u8; 12] = [1, 1, 8, 10, 0, 0, 0x12, 0x34, 0, 0, 0x56, 0x78];
/// IPv4 options: router alert (4 bytes).
const IP_OPT_RA: [u8; 4] = [0x94, 0x04, 0x00, 0x00];

/// An IPv6 extension header. The value is the header's own length field.
#[derive(Clone, Copy, Debug)]
enum Ext {
    /// Hop-by-hop options: (len + 1) · 8 bytes.
    HopByHop(u8),
    /// Routing: (len + 1) · 8 bytes.
    Routing(u8),
    /// Destination options: (len + 1) · 8 bytes.
    DestOpts(u8),
    /// Authentication header: (len + 2) · 4 bytes.
    Auth(u8),
    /// Fragment header: 8 bytes.
    Fragment,
}

impl Ext {
    fn proto(self) -> u8 {
        match self {
            Ext::HopByHop(_) => 0,
            Ext::Routing(_) => 43,
            Ext::DestOpts(_) => 60,
            Ext::Auth(_) => 51,
            Ext::Fragment => 44,
        }
    }

    fn len(self) -> usize {
        match self {
            Ext::HopByHop(n) | Ext::Routing(n) | Ext::DestOpts(n) => (n as usize + 1) * 8,
            Ext::Auth(n) => (n as usize + 2) * 4,
            Ext::Fragment => 8,
        }
    }

    fn bytes(self, next: u8) -> Vec<u8> {
        let mut b = vec![0u8; self.len()];
        b[0] = next;
        match self {
            Ext::HopByHop(n) | Ext::DestOpts(n) => {
                b[1] = n;
                // PadN option filling the rest of the header.
                b[2] = 1;
                b[3] = (b.len() - 4) as u8;
            }
            Ext::Routing(n) => {
                b[1] = n;
                b[2] = 4; // segment routing
                b[3] = 0; // segments left
            }
            Ext::Auth(n) => {
                b[1] = n;
                b[4..8].copy_from_slice(&0x0000_1001u32.to_be_bytes()); // SPI
                b[8..12].copy_from_slice(&7u32.to_be_bytes()); // sequence number
                for (i, x) in b.iter_mut().enumerate().skip(12) {
                    *x = 0xc0 ^ i as u8; // ICV
                }
            }
            Ext::Fragment => {
                b[2..4].copy_from_slice(&0x0001u16.to_be_bytes()); // offset 0, M set
                b[4..8].copy_from_slice(&0xdead_beefu32.to_be_bytes());
            }
        }
        b
    }
}

#[derive(Clone, Debug)]
enum Ip {
    /// `options` must be a multiple of 4 bytes; `frag` is the flags + fragment offset field.
    V4 {
        options: Vec<u8>,
        frag: u16,
    },
    V6 {
        exts: Vec<Ext>,
    },
}

#[derive(Clone, Debug)]
enum L4 {
    /// `options` must be a multiple of 4 bytes.
    Tcp {
        flags: u8,
        options: Vec<u8>,
    },
    Udp,
    /// Any other protocol, with an 8-byte header of its own.
    Other(u8),
}

impl L4 {
    fn proto(&self) -> u8 {
        match self {
            L4::Tcp { .. } => PROTO_TCP,
            L4::Udp => PROTO_UDP,
            L4::Other(p) => *p,
        }
    }
}

#[derive(Clone, Debug)]
struct Pkt {
    tpids: Vec<u16>,
    ip: Ip,
    l4: L4,
    payload: usize,
    /// Bytes after the IP datagram (Ethernet padding, FCS).
    trailer: usize,
}

/// A built frame and where its layers start.
struct Built {
    bytes: Vec<u8>,
    /// Offset of the IP header.
    l3: usize,
    /// Offset of the transport header.
    l4: usize,
    /// Length of the transport header.
    l4_hdr: usize,
    /// End of the IP datagram (start of the trailer).
    end: usize,
}

impl Pkt {
    fn tcp4(flags: u8, payload: usize) -> Self {
        Pkt {
            tpids: vec![],
            ip: Ip::V4 { options: vec![], frag: 0x4000 }, // DF, as Linux sends TCP
            l4: L4::Tcp { flags, options: vec![] },
            payload,
            trailer: 0,
        }
    }

    fn udp4(payload: usize) -> Self {
        Pkt { l4: L4::Udp, ..Pkt::tcp4(0, payload) }
    }

    fn tcp6(flags: u8, payload: usize, exts: Vec<Ext>) -> Self {
        Pkt { ip: Ip::V6 { exts }, ..Pkt::tcp4(flags, payload) }
    }

    fn udp6(payload: usize, exts: Vec<Ext>) -> Self {
        Pkt { ip: Ip::V6 { exts }, ..Pkt::udp4(payload) }
    }

    fn tcp_options(mut self, options: &[u8]) -> Self {
        match &mut self.l4 {
            L4::Tcp { options: o, .. } => *o = options.to_vec(),
            _ => panic!("not TCP"),
        }
        self
    }

    fn ip_options(mut self, options: &[u8]) -> Self {
        match &mut self.ip {
            Ip::V4 { options: o, .. } => *o = options.to_vec(),
            _ => panic!("not IPv4"),
        }
        self
    }

    fn frag(mut self, value: u16) -> Self {
        match &mut self.ip {
            Ip::V4 { frag, .. } => *frag = value,
            _ => panic!("not IPv4"),
        }
        self
    }

    fn vlans(mut self, tpids: &[u16]) -> Self {
        self.tpids = tpids.to_vec();
        self
    }

    fn trailer(mut self, n: usize) -> Self {
        self.trailer = n;
        self
    }

    fn l4(mut self, l4: L4) -> Self {
        self.l4 = l4;
        self
    }

    fn ext_len(&self) -> usize {
        match &self.ip {
            Ip::V4 { .. } => 0,
            Ip::V6 { exts } => exts.iter().map(|e| e.len()).sum(),
        }
    }

    /// The transport payload the parser must report: what was put after the transport header.
    fn expected_info(&self) -> PacketInfo {
        match self.l4 {
            L4::Tcp { flags, .. } => PacketInfo {
                data_end: data_end(self.payload as u16, flags),
                syn: opens(flags),
                ..tcp_info(
                    self.payload as u16,
                    self.payload == 0 && flags & ACK != 0 && flags & (SYN | FIN | RST) == 0,
                    (flags & ACK != 0).then_some(ACK_NUMBER),
                )
            },
            _ => udp_info(self.payload as u16),
        }
    }

    fn expected_key(&self) -> FlowKey {
        let proto = self.l4.proto();
        match self.ip {
            Ip::V4 { .. } => key4(proto),
            Ip::V6 { .. } => key6(proto),
        }
    }

    fn build(&self) -> Built {
        let mut b = Vec::new();
        b.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01]); // destination MAC
        b.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02]); // source MAC
        for (i, tpid) in self.tpids.iter().enumerate() {
            b.extend_from_slice(&tpid.to_be_bytes());
            b.extend_from_slice(&(0x0064u16 + i as u16).to_be_bytes()); // PCP 0, VID 100 + i
        }
        let ethertype = match self.ip {
            Ip::V4 { .. } => ETH_IPV4,
            Ip::V6 { .. } => ETH_IPV6,
        };
        b.extend_from_slice(&ethertype.to_be_bytes());
        let l3 = b.len();

        let transport = self.transport();
        let l4_hdr = transport.len() - self.payload;
        match &self.ip {
            Ip::V4 { options, frag } => {
                assert_eq!(options.len() % 4, 0, "IPv4 options must fill 32-bit words");
                let ihl = IPV4_LEN + options.len();
                let total = ihl + transport.len();
                b.push(0x40 | (ihl / 4) as u8);
                b.push(0); // DSCP/ECN
                b.extend_from_slice(&(total as u16).to_be_bytes());
                b.extend_from_slice(&0x1234u16.to_be_bytes()); // identification
                b.extend_from_slice(&frag.to_be_bytes());
                b.push(64); // TTL
                b.push(self.l4.proto());
                b.extend_from_slice(&[0, 0]); // checksum (not checked)
                b.extend_from_slice(&SRC4);
                b.extend_from_slice(&DST4);
                b.extend_from_slice(options);
            }
            Ip::V6 { exts } => {
                let plen = self.ext_len() + transport.len();
                b.extend_from_slice(&[0x60, 0x0a, 0xbc, 0xde]); // version, traffic class, flow label
                b.extend_from_slice(&(plen as u16).to_be_bytes());
                b.push(exts.first().map_or(self.l4.proto(), |e| e.proto()));
                b.push(64); // hop limit
                b.extend_from_slice(&SRC6);
                b.extend_from_slice(&DST6);
                for (i, e) in exts.iter().enumerate() {
                    let next = exts.get(i + 1).map_or(self.l4.proto(), |n| n.proto());
                    b.extend_from_slice(&e.bytes(next));
                }
            }
        }
        let l4 = b.len();
        b.extend_from_slice(&transport);
        let end = b.len();
        b.extend(std::iter::repeat_n(0xa5, self.trailer));
        Built { bytes: b, l3, l4, l4_hdr, end }
    }

    fn transport(&self) -> Vec<u8> {
        let mut t = Vec::new();
        match &self.l4 {
            L4::Tcp { flags, options } => {
                assert_eq!(options.len() % 4, 0, "TCP options must fill 32-bit words");
                let hdr = TCP_LEN + options.len();
                t.extend_from_slice(&SPORT.to_be_bytes());
                t.extend_from_slice(&DPORT.to_be_bytes());
                t.extend_from_slice(&SEQ_NUMBER.to_be_bytes());
                t.extend_from_slice(&ACK_NUMBER.to_be_bytes());
                t.push(((hdr / 4) as u8) << 4);
                t.push(*flags);
                t.extend_from_slice(&0xffffu16.to_be_bytes()); // window
                t.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent pointer
                t.extend_from_slice(options);
            }
            L4::Udp => {
                t.extend_from_slice(&SPORT.to_be_bytes());
                t.extend_from_slice(&DPORT.to_be_bytes());
                t.extend_from_slice(&((UDP_LEN + self.payload) as u16).to_be_bytes());
                t.extend_from_slice(&[0, 0]);
            }
            // ICMP's destination unreachable, ICMPv6's time exceeded: no echo.
            L4::Other(_) => t.extend_from_slice(&[3, 0, 0, 0, 0, 1, 0, 1]),
        }
        t.extend((0..self.payload).map(|i| (i as u8) ^ 0x5a));
        t
    }
}

fn key4(proto: u8) -> FlowKey {
    let mut k = FlowKey { sport: SPORT, dport: DPORT, proto, family: FAMILY_V4, ..FlowKey::default() };
    k.src[..4].copy_from_slice(&SRC4);
    k.dst[..4].copy_from_slice(&DST4);
    k
}

fn key6(proto: u8) -> FlowKey {
    FlowKey { src: SRC6, dst: DST6, sport: SPORT, dport: DPORT, proto, family: FAMILY_V6, _pad: [0; 2] }
}

fn parse_ctx(b: &[u8]) -> Result<PacketCtx, Reject> {
    let mut ctx = PacketCtx::default();
    parse(b, &mut ctx).map(|()| ctx)
}

fn parse_bytes(b: &[u8]) -> Result<(FlowKey, PacketInfo), Reject> {
    parse_ctx(b).map(|ctx| (ctx.key, PacketInfo::of(&ctx)))
}

/// Builds `pkt` and checks it parses into the key, info and header offsets it was built with.
#[track_caller]
fn assert_parses(pkt: &Pkt) -> Built {
    let built = pkt.build();
    assert_eq!(parse_bytes(&built.bytes), Ok((pkt.expected_key(), pkt.expected_info())), "{pkt:?}");
    let ctx = parse_ctx(&built.bytes).unwrap();
    assert_eq!((ctx.l3_off as usize, ctx.l4_off as usize), (built.l3, built.l4), "{pkt:?}");
    built
}

fn set_be16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_be_bytes());
}

fn get_be16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}

/// An ARP request frame (42 bytes), optionally behind VLAN tags.
fn arp_frame(tpids: &[u16]) -> Vec<u8> {
    let mut b = vec![0xff; 6];
    b.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
    for tpid in tpids {
        b.extend_from_slice(&tpid.to_be_bytes());
        b.extend_from_slice(&0x0064u16.to_be_bytes());
    }
    b.extend_from_slice(&ETH_ARP.to_be_bytes());
    b.extend_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 1]); // Ethernet/IPv4, request
    b.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
    b.extend_from_slice(&SRC4);
    b.extend_from_slice(&[0; 6]);
    b.extend_from_slice(&DST4);
    b
}

// ---------------------------------------------------------------------------------------------
// Keys and payload lengths
// ---------------------------------------------------------------------------------------------

#[test]
fn builder_lays_out_the_headers_where_the_parser_expects_them() {
    // Guard against a builder bug making the other tests vacuous.
    let b = Pkt::tcp4(ACK, 7).vlans(&[TPID_8021Q]).ip_options(&IP_OPT_RA).tcp_options(&TCP_OPT_TS).build();
    assert_eq!(b.l3, ETH_LEN + VLAN_LEN);
    assert_eq!(get_be16(&b.bytes, 12), TPID_8021Q);
    assert_eq!(get_be16(&b.bytes, 16), ETH_IPV4);
    assert_eq!(b.bytes[b.l3], 0x46); // version 4, IHL 6
    assert_eq!(get_be16(&b.bytes, b.l3 + 2) as usize, 24 + 32 + 7);
    assert_eq!(b.l4, b.l3 + 24);
    assert_eq!(b.l4_hdr, 32);
    assert_eq!(b.bytes[b.l4 + 12] >> 4, 8);
    assert_eq!(b.end, b.bytes.len());
    assert_eq!(b.end, b.l4 + 32 + 7);

    let b = Pkt::tcp6(ACK, 3, vec![Ext::HopByHop(0), Ext::Auth(4)]).build();
    assert_eq!(b.bytes[b.l3] >> 4, 6);
    assert_eq!(b.bytes[b.l3 + 6], 0); // next: hop-by-hop
    assert_eq!(b.bytes[b.l3 + IPV6_LEN], 51); // hop-by-hop's next: AH
    assert_eq!(b.bytes[b.l3 + IPV6_LEN + 8], PROTO_TCP); // AH's next: TCP
    assert_eq!(b.l4, b.l3 + IPV6_LEN + 8 + 24);
    assert_eq!(get_be16(&b.bytes, b.l3 + 4) as usize, 8 + 24 + 20 + 3);
}

#[test]
fn ipv4_tcp_key_and_payload() {
    for payload in [0, 1, 100, 1448] {
        let pkt = Pkt::tcp4(ACK | PSH, payload);
        let built = assert_parses(&pkt);
        let (key, info) = parse_bytes(&built.bytes).unwrap();
        // Spelled out once against the builder's constants, beyond `expected_key`.
        assert_eq!(&key.src[..4], &SRC4);
        assert_eq!(&key.dst[..4], &DST4);
        assert_eq!(&key.src[4..], &[0u8; 12]);
        assert_eq!(&key.dst[4..], &[0u8; 12]);
        assert_eq!((key.sport, key.dport), (40_000, 8443));
        assert_eq!((key.proto, key.family), (6, 4));
        assert_eq!(info.payload as usize, payload);
        // ACK|PSH without data is still a pure ACK; with data it is not.
        assert_eq!(info.pure_ack, payload == 0);
    }
}

#[test]
fn ipv4_tcp_with_options_on_both_layers() {
    // IHL 6 and 15 (the maximum: 40 bytes of options); data offset 8 and 15.
    let ip_opts_max = [1u8; 40]; // NOPs
    let tcp_opts_max = [1u8; 40];
    for ip_opts in [&IP_OPT_RA[..], &ip_opts_max[..]] {
        for tcp_opts in [&[][..], &TCP_OPT_TS[..], &tcp_opts_max[..]] {
            for payload in [0, 33] {
                let pkt = Pkt::tcp4(ACK, payload).ip_options(ip_opts).tcp_options(tcp_opts);
                let built = assert_parses(&pkt);
                assert_eq!(built.l4 - built.l3, IPV4_LEN + ip_opts.len());
                assert_eq!(built.l4_hdr, TCP_LEN + tcp_opts.len());
            }
        }
    }
}

#[test]
fn ipv4_udp_key_and_payload() {
    for payload in [0, 1, 512, 1472] {
        let pkt = Pkt::udp4(payload);
        assert_parses(&pkt);
        let (key, info) = parse_bytes(&pkt.build().bytes).unwrap();
        assert_eq!((key.sport, key.dport, key.proto, key.family), (SPORT, DPORT, 17, 4));
        assert_eq!(info, udp_info(payload as u16));
    }
    // IPv4 options in front of UDP.
    assert_parses(&Pkt::udp4(20).ip_options(&IP_OPT_RA));
}

#[test]
fn udp_payload_comes_from_the_ip_length_not_the_udp_length() {
    // The parser sizes the payload from the IP header; the UDP length field is not consulted.
    let pkt = Pkt::udp4(40);
    let mut built = pkt.build();
    set_be16(&mut built.bytes, built.l4 + 4, 9999);
    assert_eq!(parse_bytes(&built.bytes), Ok((key4(PROTO_UDP), udp_info(40))));
}

#[test]
fn ethernet_padding_and_trailers_are_not_payload() {
    // A pure ACK is 54 bytes; the NIC pads it to the 60-byte minimum. 0xa5 padding must not
    // be taken for data (it would also make the ACK look impure).
    let pkt = Pkt::tcp4(ACK, 0).trailer(6);
    let built = assert_parses(&pkt);
    assert_eq!(built.bytes.len(), 60);
    assert_eq!(parse_bytes(&built.bytes).unwrap().1, tcp_info(0, true, Some(ACK_NUMBER)));

    // Small data segments, UDP datagrams and IPv6 packets, padded or with a 4-byte FCS.
    for trailer in [1, 4, 6, 26, 200] {
        for pkt in [
            Pkt::tcp4(ACK | PSH, 2).trailer(trailer),
            Pkt::tcp4(ACK, 1000).trailer(trailer),
            Pkt::tcp4(ACK, 0).tcp_options(&TCP_OPT_TS).trailer(trailer),
            Pkt::udp4(2).trailer(trailer),
            Pkt::udp4(0).trailer(trailer),
            Pkt::tcp6(ACK, 0, vec![]).trailer(trailer),
            Pkt::tcp6(ACK, 5, vec![Ext::DestOpts(0)]).trailer(trailer),
            Pkt::udp6(3, vec![]).trailer(trailer),
        ] {
            let built = assert_parses(&pkt);
            assert_eq!(built.bytes.len(), built.end + trailer);
        }
    }
}

#[test]
fn pure_ack_detection() {
    // (flags, payload, pure?)
    let cases = [
        (ACK, 0, true),
        (ACK | PSH, 0, true),
        (ACK | URG, 0, true),
        (ACK, 1, false),
        (ACK | PSH, 100, false),
        (SYN, 0, false),
        (SYN | ACK, 0, false),
        (FIN | ACK, 0, false),
        (FIN | ACK, 10, false),
        (RST | ACK, 0, false),
        (RST, 0, false),
        (FIN, 0, false),
        (0, 0, false),
        (PSH, 0, false),
        // ECE/CWR (0x40/0x80) do not make an ACK impure.
        (ACK | 0x40 | 0x80, 0, true),
    ];
    for (flags, payload, pure) in cases {
        for pkt in [
            Pkt::tcp4(flags, payload),
            Pkt::tcp4(flags, payload).tcp_options(&TCP_OPT_TS),
            Pkt::tcp6(flags, payload, vec![]),
        ] {
            let (_, info) = parse_bytes(&pkt.build().bytes).unwrap();
            assert_eq!(
                info,
                PacketInfo {
                    data_end: data_end(payload as u16, flags),
                    syn: opens(flags),
                    ..tcp_info(payload as u16, pure, (flags & ACK != 0).then_some(ACK_NUMBER))
                },
                "flags {flags:#04x}, payload {payload}"
            );
        }
    }
    // SYN with an MSS option: still not pure (and the option is not payload).
    let pkt = Pkt::tcp4(SYN, 0).tcp_options(&[2, 4, 0x05, 0xb4]);
    assert_eq!(parse_bytes(&pkt.build().bytes).unwrap().1, PacketInfo { syn: true, ..tcp_info(0, false, None) });
    // UDP is never a pure ACK, even empty.
    assert_eq!(parse_bytes(&Pkt::udp4(0).build().bytes).unwrap().1, udp_info(0));
}

// ---------------------------------------------------------------------------------------------
// VLAN tags
// ---------------------------------------------------------------------------------------------

#[test]
fn one_and_two_vlan_tags_are_skipped() {
    let stacks: [&[u16]; 6] = [
        &[TPID_8021Q],
        &[TPID_8021AD],
        &[TPID_8021AD, TPID_8021Q],
        &[TPID_8021Q, TPID_8021Q],
        &[TPID_8021AD, TPID_8021AD],
        &[TPID_8021Q, TPID_8021AD],
    ];
    for tpids in stacks {
        for pkt in [
            Pkt::tcp4(ACK | PSH, 300).tcp_options(&TCP_OPT_TS),
            Pkt::udp4(12),
            Pkt::tcp6(ACK, 0, vec![Ext::HopByHop(0)]),
            Pkt::tcp4(ACK, 0).trailer(4),
        ] {
            let tagged = pkt.clone().vlans(tpids);
            let built = assert_parses(&tagged);
            assert_eq!(built.l3, ETH_LEN + VLAN_LEN * tpids.len());
            // Same result as untagged.
            assert_eq!(parse_bytes(&built.bytes), parse_bytes(&pkt.build().bytes));
        }
    }
}

#[test]
fn a_third_vlan_tag_is_read_as_the_ethertype() {
    // Only two tags are skipped; the third TPID is then taken as the ethertype, which is not IP.
    for third in [TPID_8021Q, TPID_8021AD] {
        for pkt in [Pkt::tcp4(ACK, 10), Pkt::tcp6(ACK, 10, vec![])] {
            let built = pkt.vlans(&[TPID_8021AD, TPID_8021Q, third]).build();
            assert_eq!(get_be16(&built.bytes, ETH_LEN + 2 * VLAN_LEN - 2), third);
            assert_eq!(parse_bytes(&built.bytes), Err(Reject::NotIp));
        }
    }
}

#[test]
fn frames_cut_inside_the_vlan_tags_are_malformed() {
    let built = Pkt::tcp4(ACK, 10).vlans(&[TPID_8021AD, TPID_8021Q]).build();
    for n in 0..ETH_LEN + 2 * VLAN_LEN {
        assert_eq!(parse_bytes(&built.bytes[..n]), Err(Reject::Malformed), "prefix {n}");
    }
}

// ---------------------------------------------------------------------------------------------
// IPv6
// ---------------------------------------------------------------------------------------------

#[test]
fn ipv6_tcp_and_udp_without_extension_headers() {
    for payload in [0, 1, 1428] {
        let built = assert_parses(&Pkt::tcp6(ACK | PSH, payload, vec![]));
        assert_eq!(built.l4, ETH_LEN + IPV6_LEN);
        let (key, _) = parse_bytes(&built.bytes).unwrap();
        assert_eq!((key.src, key.dst, key.family, key.proto), (SRC6, DST6, 6, 6));
        assert_parses(&Pkt::udp6(payload, vec![]));
    }
    assert_parses(&Pkt::tcp6(ACK, 0, vec![]).tcp_options(&TCP_OPT_TS));
}

#[test]
fn ipv6_hop_by_hop_routing_and_destination_options_then_tcp() {
    // 8 + 24 + 16 bytes of extension headers, which must come off the payload length.
    let exts = vec![Ext::HopByHop(0), Ext::Routing(2), Ext::DestOpts(1)];
    for payload in [0, 9, 1000] {
        let pkt = Pkt::tcp6(ACK | PSH, payload, exts.clone()).tcp_options(&TCP_OPT_TS);
        let built = assert_parses(&pkt);
        assert_eq!(built.l4 - built.l3, IPV6_LEN + 8 + 24 + 16);
        let plen = get_be16(&built.bytes, built.l3 + 4) as usize;
        assert_eq!(plen, 48 + 32 + payload);
    }
    // A pure ACK behind extension headers is still a pure ACK.
    let (_, info) = parse_bytes(&Pkt::tcp6(ACK, 0, exts.clone()).build().bytes).unwrap();
    assert_eq!(info, tcp_info(0, true, Some(ACK_NUMBER)));
    // And UDP behind them.
    assert_parses(&Pkt::udp6(77, exts));
    // Largest single header the length field allows: (255 + 1) · 8 = 2048 bytes.
    assert_parses(&Pkt::tcp6(ACK, 5, vec![Ext::DestOpts(255)]));
}

#[test]
fn ipv6_authentication_header() {
    // AH length is in 4-octet units minus 2: len 4 → 24 bytes (12-byte ICV), len 1 → 12 bytes.
    for ah in [Ext::Auth(4), Ext::Auth(1), Ext::Auth(7)] {
        for pkt in [
            Pkt::tcp6(ACK | PSH, 50, vec![ah]),
            Pkt::tcp6(ACK, 0, vec![ah]),
            Pkt::udp6(50, vec![ah]),
            Pkt::tcp6(ACK, 50, vec![Ext::HopByHop(0), ah, Ext::DestOpts(0)]),
        ] {
            assert_parses(&pkt);
        }
    }
    // AH (len 4 → 24 bytes) is a different size than if it were read like the others
    // ((4 + 1) · 8 = 40): the parser must find TCP at exactly +24.
    let built = Pkt::tcp6(ACK, 0, vec![Ext::Auth(4)]).build();
    assert_eq!(built.l4 - built.l3, IPV6_LEN + 24);
}

#[test]
fn ipv6_extension_header_walk_is_bounded_at_six() {
    let six = vec![Ext::HopByHop(0), Ext::DestOpts(0), Ext::Routing(0), Ext::Auth(1), Ext::DestOpts(1), Ext::Auth(4)];
    assert_parses(&Pkt::tcp6(ACK, 20, six.clone()));
    // A seventh header is not walked: its number is left as the transport protocol → Unsupported.
    let mut seven = six;
    seven.push(Ext::DestOpts(0));
    assert_eq!(parse_bytes(&Pkt::tcp6(ACK, 20, seven).build().bytes), Err(Reject::Unsupported));
}

#[test]
fn ipv6_fragment_header_is_unsupported() {
    for exts in [
        vec![Ext::Fragment],
        vec![Ext::HopByHop(0), Ext::Fragment],
        vec![Ext::HopByHop(0), Ext::Routing(1), Ext::Fragment],
    ] {
        for pkt in [Pkt::tcp6(ACK, 100, exts.clone()), Pkt::udp6(100, exts.clone())] {
            assert_eq!(parse_bytes(&pkt.build().bytes), Err(Reject::Unsupported), "{pkt:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// IPv4 fragments, other protocols, non-IP
// ---------------------------------------------------------------------------------------------

#[test]
fn ipv4_fragments_are_unsupported_but_df_is_fine() {
    // flags + offset field: 0x4000 DF, 0x2000 MF, low 13 bits offset in 8-byte units.
    for frag in [0x2000, 0x6000, 0x0001, 0x00b9, 0x1fff, 0x20b9, 0x4001] {
        for pkt in [Pkt::tcp4(ACK, 100).frag(frag), Pkt::udp4(100).frag(frag)] {
            assert_eq!(parse_bytes(&pkt.build().bytes), Err(Reject::Unsupported), "frag field {frag:#06x}");
        }
    }
    for frag in [0x0000, 0x4000] {
        assert_parses(&Pkt::tcp4(ACK, 100).frag(frag));
        assert_parses(&Pkt::udp4(100).frag(frag));
    }
}

#[test]
fn other_ip_protocols_are_unsupported() {
    for proto in [PROTO_ICMP, PROTO_ESP, PROTO_GRE, PROTO_SCTP, 51, 255, 0] {
        let pkt = Pkt::tcp4(0, 40).l4(L4::Other(proto));
        assert_eq!(parse_bytes(&pkt.build().bytes), Err(Reject::Unsupported), "IPv4 proto {proto}");
    }
    for proto in [PROTO_ICMPV6, PROTO_ESP, PROTO_NONE_V6, PROTO_SCTP, 255] {
        for exts in [vec![], vec![Ext::HopByHop(0)], vec![Ext::Auth(4)]] {
            let pkt = Pkt::tcp6(0, 40, exts).l4(L4::Other(proto));
            assert_eq!(parse_bytes(&pkt.build().bytes), Err(Reject::Unsupported), "IPv6 next {proto}");
        }
    }
}

/// ICMP echoes (for the fridge's `icmp-echo` class) parse, with their type and their identifier
/// and sequence number in `head`; other ICMP messages stay unsupported.
#[test]
fn icmp_echoes_parse_with_their_id_and_sequence() {
    for (proto, build) in [(PROTO_ICMP, Pkt::tcp4(0, 40)), (PROTO_ICMPV6, Pkt::tcp6(0, 40, vec![Ext::HopByHop(0)]))] {
        let (request, reply) = if proto == PROTO_ICMP { (8, 0) } else { (128, 129) };
        for (t, ok) in [(request, true), (reply, true), (3, false), (11, false), (request + 2, false)] {
            let mut built = build.clone().l4(L4::Other(proto)).build();
            built.bytes[built.l4] = t;
            match parse_ctx(&built.bytes) {
                Ok(ctx) => {
                    assert!(ok, "proto {proto} type {t} parsed");
                    assert_eq!((ctx.icmp_type, ctx.head, ctx.key.proto), (t, 0x0001_0001, proto));
                    assert_eq!((ctx.key.sport, ctx.key.dport, ctx.l4_off as usize), (0, 0, built.l4));
                }
                Err(e) => assert!(!ok && e == Reject::Unsupported, "proto {proto} type {t}: {e:?}"),
            }
        }
    }
}

/// A UDP datagram's first four payload bytes (a DNS transaction id and flags) land in `head`.
#[test]
fn udp_datagrams_carry_their_first_four_bytes() {
    for (payload, head) in [(0, 0), (3, 0), (4, 0x5a5b_5859), (100, 0x5a5b_5859)] {
        let ctx = parse_ctx(&Pkt::udp4(payload).build().bytes).unwrap();
        assert_eq!(ctx.head, head, "{payload} bytes");
    }
}

#[test]
fn non_ip_ethertypes() {
    assert_eq!(parse_bytes(&arp_frame(&[])), Err(Reject::NotIp));
    assert_eq!(parse_bytes(&arp_frame(&[TPID_8021Q])), Err(Reject::NotIp));
    assert_eq!(parse_bytes(&arp_frame(&[TPID_8021AD, TPID_8021Q])), Err(Reject::NotIp));
    // LLDP, an 802.3 length field, zero: an otherwise valid IPv4 packet behind them is ignored.
    for ethertype in [ETH_LLDP, 0x05dc, 0x0000, 0x0801, 0x86de] {
        let mut built = Pkt::tcp4(ACK, 10).build();
        set_be16(&mut built.bytes, 12, ethertype);
        assert_eq!(parse_bytes(&built.bytes), Err(Reject::NotIp), "ethertype {ethertype:#06x}");
    }
    // Exactly an Ethernet header and nothing else: the ethertype decides.
    let mut hdr = arp_frame(&[]);
    hdr.truncate(ETH_LEN);
    assert_eq!(parse_bytes(&hdr), Err(Reject::NotIp));
}

// ---------------------------------------------------------------------------------------------
// Malformed headers
// ---------------------------------------------------------------------------------------------

/// Frames whose every truncation is checked.
fn truncation_subjects() -> Vec<Pkt> {
    vec![
        Pkt::tcp4(ACK | PSH, 24).ip_options(&IP_OPT_RA).tcp_options(&TCP_OPT_TS),
        Pkt::tcp4(ACK, 0).vlans(&[TPID_8021AD, TPID_8021Q]),
        Pkt::tcp6(ACK | PSH, 24, vec![Ext::HopByHop(0), Ext::Routing(2), Ext::DestOpts(1), Ext::Auth(4)])
            .tcp_options(&TCP_OPT_TS),
        Pkt::udp4(16).vlans(&[TPID_8021Q]),
        Pkt::udp6(16, vec![Ext::HopByHop(1)]),
    ]
}

#[test]
fn truncated_frames_never_parse_before_the_transport_fields_are_read() {
    // Every prefix that ends before the last transport-header byte the parser reads (TCP: up to
    // the flags, byte 13; UDP: the ports, byte 3) is Malformed — including the ones that end
    // before the ethertype. Longer prefixes must not yield a different flow than the whole frame.
    for pkt in truncation_subjects() {
        let built = assert_parses(&pkt);
        let whole = parse_bytes(&built.bytes);
        let read = match pkt.l4 {
            L4::Tcp { .. } => TCP_READ,
            _ => 4,
        };
        for n in 0..built.bytes.len() {
            let got = parse_bytes(&built.bytes[..n]);
            if n < built.l4 + read {
                assert_eq!(got, Err(Reject::Malformed), "{pkt:?} cut to {n} bytes");
            } else if let Ok((key, _)) = got {
                assert_eq!(key, whole.unwrap().0, "{pkt:?} cut to {n} bytes");
            }
        }
    }
}

#[test]
fn truncated_inside_the_transport_header_is_malformed() {
    for pkt in truncation_subjects() {
        let built = pkt.build();
        for n in 0..built.l4 + built.l4_hdr {
            assert_eq!(parse_bytes(&built.bytes[..n]), Err(Reject::Malformed), "{pkt:?} cut to {n} bytes");
        }
    }
}

#[test]
fn ipv4_ihl_below_five_is_malformed() {
    for pkt in [Pkt::tcp4(ACK, 40), Pkt::udp4(40)] {
        for ihl in 0u8..5 {
            let mut built = pkt.build();
            built.bytes[built.l3] = 0x40 | ihl;
            assert_eq!(parse_bytes(&built.bytes), Err(Reject::Malformed), "IHL {ihl}");
        }
    }
}

#[test]
fn ipv4_total_length_inconsistent_with_the_headers() {
    let pkt = Pkt::tcp4(ACK, 40).ip_options(&IP_OPT_RA).tcp_options(&TCP_OPT_TS);
    let ihl = IPV4_LEN + IP_OPT_RA.len();
    let tcp = TCP_LEN + TCP_OPT_TS.len();
    let with_total = |total: usize| {
        let mut built = pkt.build();
        set_be16(&mut built.bytes, built.l3 + 2, total as u16);
        parse_bytes(&built.bytes)
    };
    // Shorter than the IP header itself.
    for total in [0, 1, IPV4_LEN, ihl - 1] {
        assert_eq!(with_total(total), Err(Reject::Malformed), "total {total}");
    }
    // Room for the IP header but not for the whole TCP header (options included).
    for total in [ihl, ihl + 1, ihl + TCP_LEN, ihl + tcp - 1] {
        assert_eq!(with_total(total), Err(Reject::Malformed), "total {total}");
    }
    // Exactly the headers: a pure ACK even though 40 data bytes follow in the frame (they are
    // then padding as far as IP is concerned).
    assert_eq!(with_total(ihl + tcp), Ok((key4(PROTO_TCP), tcp_info(0, true, Some(ACK_NUMBER)))));
    assert_eq!(with_total(ihl + tcp + 39), Ok((key4(PROTO_TCP), tcp_info(39, false, Some(ACK_NUMBER)))));

    // UDP: the segment must hold the 8-byte header.
    let udp = Pkt::udp4(10);
    for (total, want) in [
        (IPV4_LEN + 7, Err(Reject::Malformed)),
        (IPV4_LEN + 4, Err(Reject::Malformed)),
        (IPV4_LEN, Err(Reject::Malformed)),
        (IPV4_LEN + 8, Ok((key4(PROTO_UDP), udp_info(0)))),
        (IPV4_LEN + 9, Ok((key4(PROTO_UDP), udp_info(1)))),
    ] {
        let mut built = udp.build();
        set_be16(&mut built.bytes, built.l3 + 2, total as u16);
        assert_eq!(parse_bytes(&built.bytes), want, "UDP total {total}");
    }
}

#[test]
fn tcp_data_offset_below_five_or_beyond_the_segment_is_malformed() {
    let set_doff = |pkt: &Pkt, doff: u8| {
        let mut built = pkt.build();
        built.bytes[built.l4 + 12] = doff << 4;
        built.bytes[built.l4 + 13] = ACK;
        parse_bytes(&built.bytes)
    };
    for pkt in [Pkt::tcp4(ACK, 0), Pkt::tcp4(ACK, 100), Pkt::tcp6(ACK, 100, vec![Ext::HopByHop(0)])] {
        for doff in 0u8..5 {
            assert_eq!(set_doff(&pkt, doff), Err(Reject::Malformed), "data offset {doff}");
        }
    }
    // A 20-byte segment with no data claiming 24 or 60 bytes of header.
    for doff in [6u8, 15] {
        assert_eq!(set_doff(&Pkt::tcp4(ACK, 0), doff), Err(Reject::Malformed), "data offset {doff}");
        assert_eq!(set_doff(&Pkt::tcp6(ACK, 0, vec![]), doff), Err(Reject::Malformed), "data offset {doff}");
    }
    // 28-byte segment (8 data bytes): offsets up to 7 eat into the data, 8 is past the segment.
    let pkt = Pkt::tcp4(ACK, 8);
    assert_eq!(set_doff(&pkt, 6), Ok((key4(PROTO_TCP), tcp_info(4, false, Some(ACK_NUMBER)))));
    assert_eq!(set_doff(&pkt, 7), Ok((key4(PROTO_TCP), tcp_info(0, true, Some(ACK_NUMBER)))));
    assert_eq!(set_doff(&pkt, 8), Err(Reject::Malformed));
    // The segment length is the IP's, not the frame's: trailing bytes do not make room.
    let pkt = Pkt::tcp4(ACK, 0).trailer(100);
    assert_eq!(set_doff(&pkt, 6), Err(Reject::Malformed));
}

#[test]
fn ipv6_extension_headers_longer_than_the_payload_are_malformed() {
    let exts = vec![Ext::HopByHop(1), Ext::Routing(2), Ext::Auth(4)];
    let ext_len = 16 + 24 + 24;
    let with_plen = |pkt: &Pkt, plen: usize| {
        let mut built = pkt.build();
        set_be16(&mut built.bytes, built.l3 + 4, plen as u16);
        parse_bytes(&built.bytes)
    };
    let pkt = Pkt::tcp6(ACK, 30, exts.clone());
    // Payload length ending inside the first, second and third extension header.
    for plen in [0, 8, 15, 16, 39, 40, ext_len - 1] {
        assert_eq!(with_plen(&pkt, plen), Err(Reject::Malformed), "payload length {plen}");
    }
    // Ending inside the TCP header.
    for plen in [ext_len, ext_len + 19] {
        assert_eq!(with_plen(&pkt, plen), Err(Reject::Malformed), "payload length {plen}");
    }
    assert_eq!(with_plen(&pkt, ext_len + 20), Ok((key6(PROTO_TCP), tcp_info(0, true, Some(ACK_NUMBER)))));
    assert_eq!(with_plen(&pkt, ext_len + 50), Ok((key6(PROTO_TCP), tcp_info(30, false, Some(ACK_NUMBER)))));

    // The overrun is Malformed even when what follows would be Unsupported anyway.
    for exts in [vec![Ext::HopByHop(1)], vec![Ext::HopByHop(1), Ext::Fragment]] {
        let pkt = Pkt::tcp6(0, 40, exts.clone()).l4(L4::Other(PROTO_ICMPV6));
        assert_eq!(with_plen(&pkt, 8), Err(Reject::Malformed), "{exts:?}");
        assert_eq!(with_plen(&pkt, 16 + exts.len() * 8), Err(Reject::Unsupported), "{exts:?}");
    }

    // One header's own length field far beyond the packet.
    for (i, huge) in [Ext::HopByHop(200), Ext::Routing(255), Ext::Auth(255)].into_iter().enumerate() {
        let mut built = Pkt::tcp6(ACK, 30, exts.clone()).build();
        let at = built.l3 + IPV6_LEN + exts[..i].iter().map(|e| e.len()).sum::<usize>();
        built.bytes[at + 1] = match huge {
            Ext::HopByHop(n) | Ext::Routing(n) | Ext::Auth(n) => n,
            _ => unreachable!(),
        };
        assert_eq!(parse_bytes(&built.bytes), Err(Reject::Malformed), "{huge:?} at header {i}");
    }
}

#[test]
fn ip_version_must_match_the_ethertype() {
    for (pkt, wrong) in [
        (Pkt::tcp4(ACK, 10), [0x05u8, 0x65, 0x55, 0xf5]),
        (Pkt::udp4(10), [0x05, 0x65, 0x35, 0x55]),
        (Pkt::tcp6(ACK, 10, vec![]), [0x00, 0x40, 0x45, 0x70]),
        (Pkt::udp6(10, vec![]), [0x45, 0xf0, 0x50, 0x20]),
    ] {
        for v in wrong {
            let mut built = pkt.build();
            // The IPv4 cases keep IHL 5, so only the version is wrong.
            built.bytes[built.l3] = v;
            assert_eq!(parse_bytes(&built.bytes), Err(Reject::Malformed), "{pkt:?} with first IP byte {v:#04x}");
        }
    }
    // The right version behind the wrong ethertype: an IPv4 packet labelled IPv6 and vice versa.
    let mut built = Pkt::tcp4(ACK, 10).build();
    set_be16(&mut built.bytes, 12, ETH_IPV6);
    assert_eq!(parse_bytes(&built.bytes), Err(Reject::Malformed));
    let mut built = Pkt::tcp6(ACK, 10, vec![]).build();
    set_be16(&mut built.bytes, 12, ETH_IPV4);
    // 0x60 → version 6 under the IPv4 ethertype.
    assert_eq!(parse_bytes(&built.bytes), Err(Reject::Malformed));
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

/// Valid frames of every shape the parser accepts, as starting points for mutation.
fn templates() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = truncation_subjects().iter().map(|p| p.build().bytes).collect();
    v.push(Pkt::tcp4(SYN, 0).tcp_options(&[2, 4, 5, 0xb4]).build().bytes);
    v.push(Pkt::tcp4(ACK, 0).trailer(6).build().bytes);
    v.push(Pkt::tcp6(ACK, 10, vec![Ext::Auth(1), Ext::DestOpts(0)]).vlans(&[TPID_8021Q]).build().bytes);
    v.push(Pkt::tcp6(ACK, 10, vec![Ext::Fragment]).build().bytes);
    v.push(Pkt::tcp4(ACK, 10).frag(0x2000).build().bytes);
    v.push(arp_frame(&[TPID_8021Q]));
    v
}

/// A valid frame with a few bytes overwritten, then cut or extended.
fn mutated_frame() -> impl Strategy<Value = Vec<u8>> {
    let t = templates();
    (0..t.len(), prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6), 0usize..=220).prop_map(
        move |(which, edits, len)| {
            let mut f = t[which].clone();
            for (at, byte) in edits {
                let i = at.index(f.len());
                f[i] = byte;
            }
            f.resize(len.min(200), 0x00);
            f
        },
    )
}

fn frames() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![prop::collection::vec(any::<u8>(), 0..=200), mutated_frame()]
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 4096,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(0x05ee_d0f9_a75e),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// Never panics; whatever parses is internally consistent and had its headers in the frame.
    #[test]
    fn never_panics_and_ok_results_are_consistent(frame in frames()) {
        if let Ok((key, info)) = parse_bytes(&frame) {
            prop_assert!(key.proto == PROTO_TCP || key.proto == PROTO_UDP);
            prop_assert_eq!(key._pad, [0, 0]);
            let min_len = match key.family {
                FAMILY_V4 => {
                    prop_assert_eq!(&key.src[4..], &[0u8; 12][..]);
                    prop_assert_eq!(&key.dst[4..], &[0u8; 12][..]);
                    ETH_LEN + IPV4_LEN
                }
                FAMILY_V6 => ETH_LEN + IPV6_LEN,
                other => return Err(TestCaseError::fail(format!("family {other}"))),
            };
            // At least the transport bytes the parser reads must have been in the frame.
            let read = if key.proto == PROTO_TCP { TCP_READ } else { 4 };
            prop_assert!(frame.len() >= min_len + read, "Ok from a {}-byte frame", frame.len());
            if info.pure_ack {
                prop_assert_eq!(key.proto, PROTO_TCP);
                prop_assert_eq!(info.payload, 0);
            }
        }
    }

    /// Whatever parses parses the same with bytes appended: the result depends on the headers
    /// only, never on what follows the datagram.
    #[test]
    fn appended_bytes_never_change_an_ok_result(frame in mutated_frame(), extra in prop::collection::vec(any::<u8>(), 0..40)) {
        let parsed = parse_bytes(&frame);
        if parsed.is_ok() {
            let mut longer = frame.clone();
            longer.extend_from_slice(&extra);
            prop_assert_eq!(parse_bytes(&longer), parsed);
        }
    }
}

/// The kernel parses into a per-CPU slot that still holds the previous packet: nothing of an
/// IPv6 TCP segment may survive into the IPv4 datagram parsed after it, nor into a rejected frame.
#[test]
fn parsing_resets_the_previous_packets_context() {
    let mut ctx = PacketCtx::default();
    parse(Pkt::tcp6(ACK | PSH, 100, vec![Ext::HopByHop(0)]).build().bytes.as_slice(), &mut ctx).unwrap();
    let v4 = Pkt::udp4(30);
    parse(v4.build().bytes.as_slice(), &mut ctx).unwrap();
    assert_eq!((ctx.key, PacketInfo::of(&ctx)), (v4.expected_key(), v4.expected_info()));
    assert_eq!((ctx.seq, ctx.ack, ctx.tcp_flags), (0, 0, 0));
    assert_eq!(parse(arp_frame(&[]).as_slice(), &mut ctx), Err(Reject::NotIp));
    assert_eq!(ctx.key, FlowKey::default());
}
