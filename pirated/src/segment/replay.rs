//! Two captures, one per point, replayed: each frame through the datapath's parser and its
//! per-packet step (`pirate_common::segment::packet`, the one copy), each interval's banks closed
//! as a live point closes them, and the downstream point's reconciliation, so the lines are
//! those a live pair would have printed for the same packets.

use std::{collections::BTreeMap, io::Write, path::Path, time::Instant};

use anyhow::{bail, Context};
use pirate_common::{
    ctx::PacketCtx,
    parse::parse,
    segment::{identity::identity, lda::LdaCell, packet, rda::RdaBucket, CacheEntry, Seen, SegmentShape, Store},
};

use super::{
    point::{Cache, Found},
    reconcile::{reconcile, DOWNSTREAM_UNMEASURED},
    wire::Record,
};
use crate::{config::segment::SegmentConfig, source::replay::read_pcap};

/// What one capture recorded: a record per interval it has packets in, and its packet cache.
struct Point {
    records: BTreeMap<u64, Record>,
    cache: Cache,
    /// Frames the parser refused (the datapath passes them by), and frames stamped before one
    /// already replayed (a capture's clock stepped back), left out.
    unparsed: u64,
    backwards: u64,
}

/// Both halves of a point's banks in memory, as the per-CPU maps hold one CPU's.
struct Banks {
    shape: SegmentShape,
    seen: [Seen; 2],
    lda: Vec<LdaCell>,
    rda: Vec<RdaBucket>,
    cache: Cache,
}

impl Store for Banks {
    fn seen(&mut self, half: u32) -> Option<&mut Seen> {
        self.seen.get_mut(half as usize)
    }

    fn lda(&mut self, index: u32) -> Option<&mut LdaCell> {
        self.lda.get_mut(index as usize)
    }

    fn rda(&mut self, index: u32) -> Option<&mut RdaBucket> {
        self.rda.get_mut(index as usize)
    }

    fn cache(&mut self, entry: CacheEntry) -> bool {
        self.cache.add(&self.shape, entry);
        true
    }
}

impl Banks {
    fn new(shape: SegmentShape, cache_packets: usize) -> Banks {
        Banks {
            shape,
            seen: [Seen::default(); 2],
            lda: vec![LdaCell::default(); 2 * shape.lda.cells()],
            rda: vec![RdaBucket::default(); 2 * shape.rda.len()],
            cache: Cache::new(cache_packets),
        }
    }

    /// Interval `interval`'s half as its record, the half cleared.
    fn close(&mut self, interval: u64) -> Record {
        let half = (interval & 1) as usize;
        let (cells, buckets) = (self.shape.lda.cells(), self.shape.rda.len());
        Record {
            interval,
            measured: true,
            packets: std::mem::take(&mut self.seen[half]).packets,
            lda: take_half(&mut self.lda, half, cells),
            rda: take_half(&mut self.rda, half, buckets),
        }
    }
}

/// Half `half` (of `n` entries) of `v`, left zeroed.
fn take_half<T: Default>(v: &mut [T], half: usize, n: usize) -> Vec<T> {
    v[half * n..(half + 1) * n].iter_mut().map(std::mem::take).collect()
}

/// An interval a capture has no packet in, but spans: nothing recorded.
fn empty(shape: &SegmentShape, interval: u64) -> Record {
    Record {
        interval,
        measured: true,
        packets: 0,
        lda: vec![LdaCell::default(); shape.lda.cells()],
        rda: vec![RdaBucket::default(); shape.rda.len()],
    }
}

/// Replays one capture. `tai_offset_ns` takes its timestamps (UTC) to the points' clock.
fn point(shape: SegmentShape, cache_packets: usize, frames: &[(u64, Vec<u8>)], tai_offset_ns: i64) -> Point {
    let mut banks = Banks::new(shape, cache_packets);
    let (mut records, mut unparsed, mut backwards) = (BTreeMap::new(), 0, 0);
    let mut pkt = PacketCtx::default();
    let mut current: Option<u64> = None;
    for (ts, frame) in frames {
        if parse(frame.as_slice(), &mut pkt).is_err() {
            unparsed += 1;
            continue;
        }
        let ts = ts.saturating_add_signed(tai_offset_ns);
        let interval = shape.interval(ts);
        match current {
            Some(c) if interval < c => {
                backwards += 1;
                continue;
            }
            Some(c) if interval > c => {
                records.insert(c, banks.close(c));
            }
            _ => {}
        }
        current = Some(interval);
        packet(&shape, identity(frame.as_slice(), &pkt), ts, &mut banks);
    }
    if let Some(c) = current {
        records.insert(c, banks.close(c));
    }
    Point { records, cache: banks.cache, unparsed, backwards }
}

/// Replays `up` and `down` (pcap captures at the two points) with `[segment]`'s shape and prints
/// a JSON line for every interval of the upstream capture, as the live downstream point would;
/// an interval past the end of the downstream capture is reported unmeasured. A summary goes to
/// stderr; a replay that measured no interval is an error.
pub fn run(
    config: &SegmentConfig,
    up: &Path,
    down: &Path,
    tai_offset_ns: i64,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let shape = config.shape();
    if shape.interval_ns == 0 {
        bail!("segment.interval must be above 0 to replay a segment");
    }
    let replay = |path: &Path| -> anyhow::Result<Point> {
        let frames = read_pcap(path)?;
        Ok(point(shape, config.cache_packets as usize, &frames, tai_offset_ns))
    };
    let (u, d) = (replay(up)?, replay(down)?);
    let (Some(&first), Some(&last)) = (u.records.keys().next(), u.records.keys().next_back()) else {
        bail!("{}: no frame pirated's parser accepts, nothing to replay", up.display());
    };
    let down_last = d.records.keys().next_back().copied();
    let mut measured = 0;
    for interval in first..=last {
        let started = Instant::now();
        let up_record = u.records.get(&interval).cloned().unwrap_or_else(|| empty(&shape, interval));
        let mut down_record = d.records.get(&interval).cloned().unwrap_or_else(|| empty(&shape, interval));
        down_record.measured = down_last.is_some_and(|l| interval <= l);
        let found = Found { up: |id| u.cache.get(interval, id), down: &d.cache, interval };
        let mut report = reconcile(&shape, Some(up_record), down_record, &found);
        if report.unmeasured.is_none() {
            measured += 1;
        }
        report.took = started.elapsed();
        report.write_json(out).context("writing a JSON line")?;
    }
    eprintln!(
        "pirated: replayed intervals {first}..={last} ({} measured; {} beyond the downstream capture as {DOWNSTREAM_UNMEASURED}); frames the parser refused: {} upstream, {} downstream; stamped backwards: {}, {}",
        measured,
        last - first + 1 - measured,
        u.unparsed,
        d.unparsed,
        u.backwards,
        d.backwards
    );
    if measured == 0 {
        bail!("no interval measured: the captures share no interval");
    }
    Ok(())
}
