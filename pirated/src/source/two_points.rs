//! Replay of a segment's two captures with the downstream point's chain as it runs live: RLI
//! first (it takes its references out of the traffic, and reports per flow), then the segment's
//! step. The capabilities do not know of each other; the chain is composed here.

use std::io::Write;

use anyhow::Context;
use pirate_common::ctx::PacketCtx;

use crate::{
    capture::CaptureReader,
    config::Config,
    rli::{
        self,
        config::RliConfig,
        replay::{Replay, Upstream},
    },
    segment::replay::{self as segment_replay, Before},
};

/// RLI before the segment at the downstream point, its lines written to `out` as its intervals
/// close.
pub struct RliFirst<W: Write> {
    replay: Replay,
    out: W,
    error: Option<anyhow::Error>,
}

impl<W: Write> RliFirst<W> {
    /// RLI as `rli` has it, references checked under `key`, intervals of `interval_ns`.
    pub fn new(rli: &RliConfig, key: [u64; 2], interval_ns: u64, out: W) -> RliFirst<W> {
        RliFirst { replay: Replay::new(rli, key, interval_ns), out, error: None }
    }
}

impl<W: Write> Before for RliFirst<W> {
    fn frame(&mut self, pkt: &mut PacketCtx, frame: &[u8], tai_ns: u64) -> bool {
        self.replay.frame(pkt, frame, tai_ns, &mut self.out).unwrap_or_else(|e| {
            self.error.get_or_insert(e);
            true
        })
    }

    fn end(&mut self) -> anyhow::Result<()> {
        self.replay.finish(&mut self.out)?;
        self.error.take().map_or(Ok(()), |e| Err(e).context("RLI's replay"))
    }
}

/// `pirated replay-segment`: the two captures through the downstream chain `config` gives
/// (RLI's references need the key they were tagged under: `segment.key_file`), the lines to
/// stdout.
pub fn replay(config: &Config, up: CaptureReader, down: CaptureReader, tai_offset_ns: i64) -> anyhow::Result<()> {
    let out = &mut std::io::stdout().lock();
    if !config.rli.enabled {
        return segment_replay::run(&config.segment, up, down, tai_offset_ns, out, &mut segment_replay::Nothing);
    }
    if config.segment.key_file.is_none() {
        anyhow::bail!(
            "rli.enabled in replay needs segment.key_file: the key the references were tagged under (with role \
             \"both\" and no key file, each run draws its own, which no replay can know)"
        );
    }
    let key = rli::live::tag_key(&config.segment.key()?);
    let mut rli = RliFirst::new(&config.rli, key, config.segment.interval.as_nanos(), std::io::stdout());
    if config.rli.sampled() {
        // The upstream capture read a second time, ahead of the downstream one.
        let again = CaptureReader::open(up.path())
            .with_context(|| format!("sampled references read the upstream capture {} again", up.path().display()))?;
        let upstream = Upstream::new(&config.rli, key, again, tai_offset_ns);
        rli.replay = rli.replay.with_upstream(upstream, config.rli.max_delay.as_nanos());
    }
    let replayed = segment_replay::run(&config.segment, up, down, tai_offset_ns, out, &mut rli);
    let mut verdicts: Vec<_> = rli.replay.verdicts.iter().collect();
    verdicts.sort();
    eprintln!("pirated: rli: downstream frames by what RLI did with them: {verdicts:?}");
    replayed
}
