//! One point's side of the live measurement: its banks, closed interval by interval (read one
//! half, then clear it before the interval after next writes it again), and its packet cache.

use std::collections::{BTreeMap, HashMap};

use pirate_common::segment::{CacheEntry, SegmentShape};

use super::{reconcile::Caches, wire::Record};
use crate::{clock, datapath::segment::SegmentMaps};

/// The packet cache: per interval, each packet the RDA took and its timestamp, up to `limit`
/// packets an interval (the rest counted, and their buckets not repairable).
#[derive(Default)]
pub struct Cache {
    intervals: BTreeMap<u64, HashMap<u64, u64>>,
    limit: usize,
    /// Intervals before this one are forgotten, and their packets no longer kept.
    from: u64,
    /// Packets left out since [`Cache::take_dropped`].
    dropped: u64,
}

impl Cache {
    pub fn new(limit: usize) -> Cache {
        Cache { limit, ..Default::default() }
    }

    pub fn add(&mut self, shape: &SegmentShape, entry: CacheEntry) {
        let interval = shape.interval(entry.ts);
        if interval < self.from {
            return;
        }
        let packets = self.intervals.entry(interval).or_default();
        if packets.len() < self.limit {
            packets.insert(entry.id, entry.ts);
        } else {
            self.dropped += 1;
        }
    }

    pub fn get(&self, interval: u64, id: u64) -> Option<u64> {
        self.intervals.get(&interval)?.get(&id).copied()
    }

    /// The packets left out since the last call.
    pub fn take_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.dropped)
    }

    /// The first interval whose packets are kept.
    pub fn from(&self) -> u64 {
        self.from
    }

    /// Forgets the intervals before `interval`, and keeps no packet of them from now on.
    pub fn keep_from(&mut self, interval: u64) {
        self.intervals = self.intervals.split_off(&interval);
        self.from = self.from.max(interval);
    }
}

/// Where the downstream point finds timestamps to reconcile `interval`: its own cache of the
/// interval and of the next, and U's for the packets only U saw (from `up`: U's answer live,
/// U's capture in replay).
pub struct Found<'a, U> {
    pub up: U,
    pub down: &'a Cache,
    pub interval: u64,
}

impl<U: Fn(u64) -> Option<u64>> Caches for Found<'_, U> {
    fn up(&self, id: u64) -> Option<u64> {
        (self.up)(id)
    }
    fn down(&self, id: u64) -> Option<u64> {
        self.down.get(self.interval, id)
    }
    fn down_next(&self, id: u64) -> Option<u64> {
        self.down.get(self.interval + 1, id)
    }
}

/// The banks and which intervals they hold alone.
pub struct Point {
    maps: SegmentMaps,
    shape: SegmentShape,
    /// Per half, the interval that found it cleared when it began.
    clean: [Option<u64>; 2],
}

impl Point {
    /// Takes over the banks, clearing both halves: what they held (a previous run's) is no
    /// interval's alone. The current interval is therefore unmeasured.
    pub fn start(maps: SegmentMaps, shape: SegmentShape) -> anyhow::Result<Point> {
        let mut point = Point { maps, shape, clean: [None; 2] };
        let current = shape.interval(clock::now());
        point.clear(current)?;
        point.clear(current.wrapping_sub(1))?;
        Ok(point)
    }

    pub fn maps(&mut self) -> &mut SegmentMaps {
        &mut self.maps
    }

    /// Reads interval `interval`'s half (the interval is over) and clears it.
    pub fn close(&mut self, interval: u64) -> anyhow::Result<Record> {
        let banks = self.maps.read(interval)?;
        let measured = self.clean[(interval & 1) as usize] == Some(interval) && !banks.overrun;
        self.clear(interval)?;
        Ok(Record { interval, measured, packets: banks.packets, lda: banks.lda, rda: banks.rda })
    }

    /// Clears interval `interval`'s half for interval + 2, which starts clean if the clearing
    /// ends before it begins.
    fn clear(&mut self, interval: u64) -> anyhow::Result<()> {
        let half = (interval & 1) as usize;
        self.maps.clear(half as u32)?;
        let next = interval + 2;
        self.clean[half] = (clock::now() < next * self.shape.interval_ns).then_some(next);
        Ok(())
    }
}
