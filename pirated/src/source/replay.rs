//! The replay source: the datapath's own per-packet code (`pirate_common`'s parser,
//! `pirate::tracker::step` and the fridges' step) run over a pcap capture, cut into epochs as
//! the daemon cuts them.
//! Needs no privileges.

use std::{collections::HashMap, fs::File, io::Read, path::Path};

use anyhow::{bail, Context};
use pirate_common::{
    ctx::PacketCtx,
    fridge::{Fridges, Sample, MAX_FRIDGES},
    key::FlowKey,
    parse::parse,
    pirate::{config::Params, flow::FlowState, layout::Layout, measures, tracker::step},
    with_modes,
};

use super::EpochData;
use crate::{
    config::Config,
    fridge::{report::FridgeEpoch, table::FridgeTable},
    pirate::flow::FlowEpoch,
};

/// Runs the capture at `path` through the datapath's code, cut into epochs every `config.epoch`
/// from the first packet's timestamp and numbered from 1 as in the daemon; the last, partial
/// epoch too. Each closed epoch goes to `on_epoch`, which may hand back the fridges' new shape
/// (recalibrated), as the daemon writes it into the datapath.
pub fn run(
    config: &Config,
    path: &Path,
    on_epoch: impl FnMut(EpochData) -> anyhow::Result<Option<Fridges>>,
) -> anyhow::Result<()> {
    let packets = read_pcap(path)?;
    let params = config.params();
    // The fridges draw their entry decisions from a fixed seed: a replay repeats itself.
    let fridges = config.fridge.enabled.then(|| ReplayFridges {
        table: FridgeTable::new(config.fridge.shape(), 1),
        samples: Vec::new(),
        offered: [0; MAX_FRIDGES],
    });
    // The same state layout as the daemon's, so the same modes fit.
    with_modes!(Layout::for_modes(config.pirate.modes), M => epochs::<M>(config.epoch.as_nanos(), &params, &packets, fridges, on_epoch))
}

fn epochs<const M: usize>(
    epoch_ns: u64,
    params: &Params,
    packets: &[(u64, Vec<u8>)],
    mut fridges: Option<ReplayFridges>,
    mut on_epoch: impl FnMut(EpochData) -> anyhow::Result<Option<Fridges>>,
) -> anyhow::Result<()> {
    let mut flows: HashMap<FlowKey, FlowState<M>> = HashMap::new();
    let Some(&(t0, _)) = packets.first() else { return Ok(()) };
    let mut epoch: u32 = 1;
    // An epoch closes before any packet of the next one: no state is handed over early, as in
    // the kernel for every flow that stays quiet until the drain.
    let mut close = |flows: &HashMap<FlowKey, FlowState<M>>,
                     fridges: &mut Option<ReplayFridges>,
                     closed: u32,
                     span_ns: u64|
     -> anyhow::Result<()> {
        let fridge = fridges.as_mut().map(|f| f.close(span_ns));
        let flows =
            flows.iter().filter(|(_, st)| st.measured(closed)).map(|(k, st)| FlowEpoch::from_state(*k, st)).collect();
        if let (Some(shape), Some(f)) = (on_epoch(EpochData { epoch: closed, flows, fridge })?, fridges.as_mut()) {
            f.table.reshape(shape);
        }
        Ok(())
    };
    let mut pkt = PacketCtx::default();
    for (ts, frame) in packets {
        let due = 1 + ((ts.saturating_sub(t0)) / epoch_ns) as u32;
        while epoch < due {
            close(&flows, &mut fridges, epoch, epoch_ns)?;
            epoch += 1;
        }
        if parse(frame.as_slice(), &mut pkt).is_err() {
            continue;
        }
        pkt.ts_ns = *ts;
        if let Some(f) = &mut fridges {
            f.table.packet(&pkt, |s| f.samples.push(s));
        }
        if measures(&pkt) {
            let st = flows.entry(pkt.key).or_insert_with(|| FlowState::new(epoch));
            step(st, epoch, &pkt, params, |_| {});
        }
    }
    let last = packets.last().map_or(t0, |p| p.0);
    let partial = last.saturating_sub(t0 + (epoch as u64 - 1) * epoch_ns).max(1);
    close(&flows, &mut fridges, epoch, partial)
}

/// The fridges in replay: the userspace table, the epoch's samples, and the requests offered
/// when the last epoch closed (what `fridge::samples::Samples` keeps live).
struct ReplayFridges {
    table: FridgeTable,
    samples: Vec<Sample>,
    offered: [u64; MAX_FRIDGES],
}

impl ReplayFridges {
    /// Closes the fridges' epoch of `span_ns`.
    fn close(&mut self, span_ns: u64) -> FridgeEpoch {
        let now = self.table.offered();
        let epoch = FridgeEpoch {
            samples: std::mem::take(&mut self.samples),
            offered: std::array::from_fn(|k| now[k] - self.offered[k]),
            span_ns,
            shape: *self.table.shape(),
        };
        self.offered = now;
        epoch
    }
}

/// Reads a classic pcap file (µs or ns timestamps, either byte order, Ethernet link type):
/// returns (timestamp ns, frame) pairs.
pub fn read_pcap(path: &Path) -> anyhow::Result<Vec<(u64, Vec<u8>)>> {
    let mut data = Vec::new();
    File::open(path).with_context(|| format!("opening {}", path.display()))?.read_to_end(&mut data)?;
    parse_pcap(&data).with_context(|| format!("reading {}", path.display()))
}

fn parse_pcap(data: &[u8]) -> anyhow::Result<Vec<(u64, Vec<u8>)>> {
    if data.len() < 24 {
        bail!("not a pcap file (too short)");
    }
    let magic = u32::from_le_bytes(data[0..4].try_into().unwrap());
    let (le, nanos) = match magic {
        0xa1b2c3d4 => (true, false),
        0xa1b23c4d => (true, true),
        0xd4c3b2a1 => (false, false),
        0x4d3cb2a1 => (false, true),
        0x0a0d0d0a => bail!("pcapng is not supported: write classic pcap (tcpdump -w, or editcap -F pcap)"),
        _ => bail!("not a pcap file (magic {magic:#x})"),
    };
    let u32_at = |off: usize| {
        let b: [u8; 4] = data[off..off + 4].try_into().unwrap();
        if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }
    };
    let linktype = u32_at(20) & 0x0fff_ffff;
    if linktype != 1 {
        bail!("link type {linktype} is not Ethernet (1): capture on an Ethernet interface");
    }
    let mut out = Vec::new();
    let mut off = 24;
    while off + 16 <= data.len() {
        let sec = u32_at(off) as u64;
        let frac = u32_at(off + 4) as u64;
        let caplen = u32_at(off + 8) as usize;
        off += 16;
        if off + caplen > data.len() {
            bail!("truncated record at byte {off}");
        }
        let ts = sec * 1_000_000_000 + if nanos { frac } else { frac * 1000 };
        out.push((ts, data[off..off + caplen].to_vec()));
        off += caplen;
    }
    Ok(out)
}
