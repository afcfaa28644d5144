//! Request→response delays paired from a capture at the client, written apart from pirated's
//! classes so that it checks them: TCP SYN → SYN/ACK by client port (the SYN/ACK acknowledging
//! the SYN), DNS query → response by client port and transaction id, ICMP echo request → reply
//! by identifier and sequence number. Only the first response of a request counts.

use std::collections::HashMap;

use anyhow::{ensure, Result};
use pirate_common::{ctx::PacketCtx, parse::parse};

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;

/// (protocol, client port, id) of a pair.
type Key = (u8, u16, u32);

enum Role<'a> {
    Request(Key),
    /// Its delay goes to the vector.
    Response(Key, &'a mut Vec<f64>),
}

/// Delays (ns) per kind of pair, in the order the responses came.
#[derive(Clone, Debug, Default)]
pub struct Pairs {
    pub handshakes: Vec<f64>,
    pub dns: Vec<f64>,
    pub echoes: Vec<f64>,
}

impl Pairs {
    /// Pairs the frames of a capture (timestamps in ns). A frame the parser refuses (ARP, say)
    /// is skipped.
    pub fn of(frames: &[(u64, Vec<u8>)]) -> Result<Pairs> {
        let mut waiting: HashMap<Key, u64> = HashMap::new();
        let mut pairs = Pairs::default();
        let mut pkt = PacketCtx::default();
        for (ts, frame) in frames {
            if parse(frame.as_slice(), &mut pkt).is_err() {
                continue;
            }
            let k = pkt.key;
            let dns_response = pkt.head & 0x8000 != 0;
            let (syn, syn_ack) = (pkt.tcp_flags & (SYN | ACK) == SYN, pkt.tcp_flags & (SYN | ACK) == SYN | ACK);
            let role = match k.proto {
                6 if syn => Role::Request((6, k.sport, pkt.seq.wrapping_add(1))),
                6 if syn_ack => Role::Response((6, k.dport, pkt.ack), &mut pairs.handshakes),
                17 if k.dport == 53 && !dns_response => Role::Request((17, k.sport, pkt.head >> 16)),
                17 if k.sport == 53 && dns_response => Role::Response((17, k.dport, pkt.head >> 16), &mut pairs.dns),
                1 | 58 if matches!(pkt.icmp_type, 8 | 128) => Role::Request((1, 0, pkt.head)),
                1 | 58 if matches!(pkt.icmp_type, 0 | 129) => Role::Response((1, 0, pkt.head), &mut pairs.echoes),
                _ => continue,
            };
            match role {
                Role::Request(key) => drop(waiting.insert(key, *ts)),
                Role::Response(key, delays) => {
                    if let Some(sent) = waiting.remove(&key) {
                        ensure!(*ts >= sent, "a response before its request: {key:?}");
                        delays.push((ts - sent) as f64);
                    }
                }
            }
        }
        Ok(pairs)
    }
}

/// The `q` quantile of `delays`, interpolated between order statistics (sorts them).
pub fn quantile(delays: &mut [f64], q: f64) -> f64 {
    delays.sort_by(f64::total_cmp);
    let rank = q * (delays.len() - 1) as f64;
    let i = rank.floor() as usize;
    delays[i] + (delays[(i + 1).min(delays.len() - 1)] - delays[i]) * rank.fract()
}
