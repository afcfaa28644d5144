//! Two captures, one per point, replayed: each frame through the datapath's parser and its
//! per-packet step (`pirate_common::segment::packet`, the one copy), each interval's banks closed
//! as a live point closes them, and the downstream point's reconciliation, so the lines are
//! those a live pair would have printed for the same packets.

use std::{collections::BTreeMap, io::Write, time::Instant};

use anyhow::{bail, Context};
use pirate_common::{
    ctx::PacketCtx,
    identity::identity,
    parse::parse,
    segment::{lda::LdaCell, packet, rda::RdaBucket, CacheEntry, Seen, SegmentShape, Store},
};

use super::{
    config::SegmentConfig,
    point::{Cache, Found},
    reconcile::{reconcile, DOWNSTREAM_UNMEASURED},
    wire::Record,
};
use crate::capture::{CaptureReader, Tally};

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

/// What runs before the segment's step at the downstream point, as the live chain has it (`rli`,
/// which takes its references out of the traffic): composed by the one who runs the replay.
pub trait Before {
    /// Whether the chain goes on to the segment with this frame, parsed into `pkt`, captured
    /// at `tai_ns`.
    fn frame(&mut self, pkt: &mut PacketCtx, frame: &[u8], tai_ns: u64) -> bool;
    /// The downstream capture has been read: what the program before has left to say, and
    /// whether it failed.
    fn end(&mut self) -> anyhow::Result<()>;
}

/// Nothing before the segment.
pub struct Nothing;

impl Before for Nothing {
    fn frame(&mut self, _: &mut PacketCtx, _: &[u8], _: u64) -> bool {
        true
    }

    fn end(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}

/// One capture replayed as a stream: its frames into the banks up to an interval, each
/// interval closed into a record once a frame of a later one arrives (as the live point reads a
/// half once the next interval has begun), kept until reconciled.
struct Point {
    reader: CaptureReader,
    banks: Banks,
    tai_offset_ns: i64,
    pkt: PacketCtx,
    /// Records of the intervals from the cache's first on (those before are of no use).
    records: BTreeMap<u64, Record>,
    /// The interval the banks are filling (the capture's last, once it ended).
    current: Option<u64>,
    ended: bool,
    tally: Tally,
}

impl Point {
    fn new(reader: CaptureReader, shape: SegmentShape, cache_packets: usize, tai_offset_ns: i64) -> Point {
        Point {
            reader,
            banks: Banks::new(shape, cache_packets),
            tai_offset_ns,
            pkt: PacketCtx::default(),
            records: BTreeMap::new(),
            current: None,
            ended: false,
            tally: Tally::default(),
        }
    }

    /// Reads frames until every interval up to `through` is closed (or the capture ends). A frame
    /// stamped in an interval before the current one (the capture's clock stepped back) is left
    /// out as `backwards`.
    fn advance(&mut self, through: u64, before: &mut dyn Before) {
        let shape = self.banks.shape;
        while !self.ended && self.current.is_none_or(|c| c <= through) {
            let (ts, frame) = match self.reader.frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => {
                    self.end();
                    break;
                }
                Err(e) => {
                    self.tally.error = Some(e);
                    self.end();
                    break;
                }
            };
            if let Err(reject) = parse(frame, &mut self.pkt) {
                self.tally.refused.add(reject.name());
                continue;
            }
            let ts = ts.saturating_add_signed(self.tai_offset_ns);
            if !before.frame(&mut self.pkt, frame, ts) {
                continue;
            }
            let interval = shape.interval(ts);
            match self.current {
                Some(c) if interval < c => {
                    self.tally.refused.add("backwards");
                    continue;
                }
                Some(c) if interval > c => {
                    let from = self.banks.cache.from();
                    keep(&mut self.records, from, c, self.banks.close(c));
                }
                _ => {}
            }
            self.current = Some(interval);
            self.tally.replayed += 1;
            packet(&shape, identity(frame, &self.pkt), ts, &mut self.banks);
        }
    }

    fn end(&mut self) {
        self.ended = true;
        if let Some(c) = self.current {
            let from = self.banks.cache.from();
            keep(&mut self.records, from, c, self.banks.close(c));
        }
    }

    /// The first interval after `interval` this capture has a packet in, as far as it has read.
    fn next_after(&self, interval: u64) -> Option<u64> {
        let closed = self.records.range(interval + 1..).next().map(|(&i, _)| i);
        closed.or(self.current.filter(|&c| c > interval))
    }

    /// Forgets the records and cached packets of intervals before `interval`, and keeps none of
    /// them from now on.
    fn keep_from(&mut self, interval: u64) {
        self.records = self.records.split_off(&interval);
        self.banks.cache.keep_from(interval);
    }

    /// What was read of the capture, once done.
    fn finish(mut self) -> Tally {
        self.tally.finish(self.reader);
        self.tally
    }
}

/// Keeps interval `c`'s record in `records` if it is still of use (from interval `from` on).
fn keep(records: &mut BTreeMap<u64, Record>, from: u64, c: u64, record: Record) {
    if c >= from {
        records.insert(c, record);
    }
}

/// Replays `up` and `down` (the captures at the two points) with
/// `[segment]`'s shape and prints a JSON line for every interval either capture has a packet in,
/// from the upstream capture's first to its last, as the live downstream point would (an
/// interval past the end of the downstream capture is reported unmeasured); then a
/// `"type": "capture"` line per capture. Both are read as streams, a few intervals at a time. A
/// summary goes to stderr; a replay that measured no interval, or a capture that ended in an
/// error, is an error.
pub fn run(
    config: &SegmentConfig,
    up: CaptureReader,
    down: CaptureReader,
    tai_offset_ns: i64,
    out: &mut impl Write,
    before: &mut dyn Before,
) -> anyhow::Result<()> {
    let shape = config.shape();
    if shape.interval_ns == 0 {
        bail!("segment.interval must be above 0 to replay a segment");
    }
    let cache = config.cache_packets as usize;
    let (up_path, down_path) = (up.path().to_owned(), down.path().to_owned());
    let (mut u, mut d) = (Point::new(up, shape, cache, tai_offset_ns), Point::new(down, shape, cache, tai_offset_ns));
    u.advance(0, &mut Nothing);
    let (mut measured, mut reported, mut next) = (0, 0, u.current);
    while let Some(interval) = next {
        u.advance(interval, &mut Nothing);
        // D's packets of the interval after too: those sent in this one and late. What D saw
        // before this interval is of no use: a capture that starts long before U's keeps no
        // record of it.
        d.keep_from(interval);
        d.advance(interval + 1, before);
        let started = Instant::now();
        let up_record = u.records.remove(&interval).unwrap_or_else(|| empty(&shape, interval));
        let mut down_record = d.records.remove(&interval).unwrap_or_else(|| empty(&shape, interval));
        down_record.measured = d.current.is_some_and(|c| interval <= c);
        let found = Found { up: |id| u.banks.cache.get(interval, id), down: &d.banks.cache, interval };
        let mut report = reconcile(&shape, Some(up_record), down_record, &found);
        measured += u64::from(report.unmeasured.is_none());
        reported += 1;
        report.took = started.elapsed();
        report.write_json(out).context("writing a JSON line")?;
        u.keep_from(interval + 1);
        d.keep_from(interval + 1);
        // The next interval with a packet at either point, up to U's last.
        next = [u.next_after(interval), d.next_after(interval)].into_iter().flatten().min();
        next = next.filter(|&n| !u.ended || u.current.is_some_and(|last| n <= last));
    }
    before.end()?;
    let (up_tally, down_tally) = (u.finish(), d.finish());
    for (point, tally) in [("up", &up_tally), ("down", &down_tally)] {
        serde_json::to_writer(&mut *out, &tally.json(serde_json::json!({ "point": point })))?;
        out.write_all(b"\n")?;
    }
    eprintln!(
        "pirated: replayed {reported} intervals, {measured} measured ({} unmeasured, beyond the downstream capture as {DOWNSTREAM_UNMEASURED}); upstream {}: {up_tally}; downstream {}: {down_tally}",
        reported - measured,
        up_path.display(),
        down_path.display()
    );
    if let Some(e) = up_tally.error.or(down_tally.error) {
        return Err(e);
    }
    if measured == 0 {
        bail!("no interval measured: the captures share no interval");
    }
    Ok(())
}
