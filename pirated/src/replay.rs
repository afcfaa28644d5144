//! `pirated replay`: the datapath's per-packet code run over a pcap capture, with the same
//! epochs, estimators and JSON lines as the daemon. Needs no privileges.

use std::{collections::HashMap, fs::File, io::Read, io::Write, path::Path};

use anyhow::{bail, Context};
use pirate_common::{
    config::Params,
    ctx::PacketCtx,
    flow::{FlowKey, FlowState},
    parse::parse,
    tracker::on_packet,
};

use crate::{
    config::Config,
    datapath::{with_modes, Layout},
    flow::FlowEpoch,
    report::EpochReport,
};

/// Replays `path` and writes every epoch's JSON lines to `out`. Returns the reports.
pub fn replay(config: &Config, path: &Path, out: &mut impl Write) -> anyhow::Result<Vec<EpochReport>> {
    let packets = read_pcap(path)?;
    let params = config.params();
    // The same state layout as the daemon's, so the same modes fit.
    let reports = with_modes!(Layout::for_modes(config.pirate.modes), M => run::<M>(config, &params, &packets));
    for r in &reports {
        r.write_json(out)?;
    }
    Ok(reports)
}

/// Epochs are cut every `config.epoch` from the first packet's timestamp, numbered from 1 as in
/// the daemon; the last, partial epoch is reported too.
fn run<const M: usize>(config: &Config, params: &Params, packets: &[(u64, Vec<u8>)]) -> Vec<EpochReport> {
    let settings = config.estimation();
    let epoch_ns = config.epoch.as_nanos();
    let mut flows: HashMap<FlowKey, FlowState<M>> = HashMap::new();
    let mut reports = Vec::new();
    let Some(&(t0, _)) = packets.first() else { return reports };
    let mut epoch: u32 = 1;
    let close = |flows: &HashMap<FlowKey, FlowState<M>>, closed: u32| {
        let done: Vec<FlowEpoch> = flows
            .iter()
            .filter(|(_, st)| st.epoch == closed && st.packets > 0)
            .map(|(k, st)| FlowEpoch::from_state(*k, st))
            .collect();
        EpochReport::new(closed, done, &settings, config.pirate.estimator, true)
    };
    for (ts, frame) in packets {
        let due = 1 + ((ts.saturating_sub(t0)) / epoch_ns) as u32;
        while epoch < due {
            reports.push(close(&flows, epoch));
            epoch += 1;
        }
        let mut pkt = PacketCtx::default();
        if parse(frame.as_slice(), &mut pkt).is_err() {
            continue;
        }
        let st = flows.entry(pkt.key).or_insert_with(|| FlowState::new(epoch));
        if st.epoch != epoch {
            st.start_epoch(epoch, params);
        }
        on_packet(st, *ts, pkt.info(), params);
    }
    reports.push(close(&flows, epoch));
    reports
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
