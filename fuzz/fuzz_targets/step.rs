//! The per-packet steps and what reads their state, over any packets at any times: the input,
//! read as records of (length: u16, microseconds since the last: u32, frame), becomes a capture
//! replayed through Pirate's tracker, the fridges and the estimators (`pirated replay`), and
//! through RLI's and the segment's steps and reconciliation with the capture at both points
//! (`pirated replay-segment`). Errors are fine (nothing measured); panics are not.
#![no_main]

use std::{io::Cursor, path::Path};

use libfuzzer_sys::fuzz_target;
use pirated::{
    capture::CaptureReader, config::Config, epoch, rli::config::RliConfig, segment, source::two_points::RliFirst,
};

/// A classic pcap (ns) of the input's records, from a second past the epoch.
fn capture(mut data: &[u8]) -> Vec<u8> {
    let mut pcap = Vec::new();
    for v in [0xa1b2_3c4d_u32, 0x0004_0002, 0, 0, 65_535, 1] {
        pcap.extend_from_slice(&v.to_le_bytes());
    }
    let mut ts: u64 = 1_000_000_000;
    while data.len() >= 6 {
        let len = usize::from(u16::from_le_bytes([data[0], data[1]])).min(data.len() - 6);
        ts += u64::from(u32::from_le_bytes([data[2], data[3], data[4], data[5]])) * 1000;
        let frame = &data[6..6 + len];
        for v in [(ts / 1_000_000_000) as u32, (ts % 1_000_000_000) as u32, len as u32, len as u32] {
            pcap.extend_from_slice(&v.to_le_bytes());
        }
        pcap.extend_from_slice(frame);
        data = &data[6 + len..];
    }
    pcap
}

fn reader(pcap: &[u8]) -> CaptureReader {
    CaptureReader::new(Box::new(Cursor::new(pcap.to_vec())), Path::new("fuzz")).expect("a pcap header")
}

fuzz_target!(|data: &[u8]| {
    let pcap = capture(data);
    let config = Config::default();
    let _ = epoch::replay(&config, reader(&pcap), &mut std::io::sink());
    // The downstream chain with RLI first, as live: references checked under a key of its own.
    let rli = RliConfig { enabled: true, ..RliConfig::default() };
    let mut before = RliFirst::new(&rli, [1, 2], config.segment.interval.as_nanos(), std::io::sink());
    let _ = segment::replay::run(&config.segment, reader(&pcap), reader(&pcap), 0, &mut std::io::sink(), &mut before);
});
