//! RLI's JSON lines: per interval, the segment's delay from its references
//! (`"type": "segment_references"`: count, mean, std-dev, quantiles each with the references
//! it needs), and per flow (`"type": "segment_flow"`: RLI and RLI-L, each with the packets
//! behind it).

use std::io::Write;

use serde_json::{json, Value};

use super::{
    drain::{Closed, Figures},
    quantiles::QUANTILES,
};

/// Writes a closed interval's lines into `out`.
pub fn write(out: &mut impl Write, closed: &Closed) -> std::io::Result<()> {
    let Closed { interval, references, flows, .. } = closed;
    let references = references.as_ref();
    let quantiles: Vec<Value> = QUANTILES
        .iter()
        .zip(references.map_or([None; QUANTILES.len()], |s| s.quantiles))
        .map(|((q, needs), v)| json!({ "q": q, "delay_ns": v, "needs": needs }))
        .collect();
    let line = json!({
        "type": "segment_references",
        "interval": interval,
        "references": references.map_or(0, |s| s.count),
        "mean_ns": references.map(|s| s.mean),
        // A spread needs two.
        "std_dev_ns": references.filter(|s| s.count > 1).map(|s| s.std_dev),
        "quantiles": quantiles,
    });
    serde_json::to_writer(&mut *out, &line)?;
    out.write_all(b"\n")?;
    let figures = |f: &Figures| json!({ "packets": f.packets, "mean_ns": f.mean_ns, "std_dev_ns": f.std_dev_ns, "withheld": f.withheld });
    for f in flows {
        let line = json!({
            "type": "segment_flow",
            "interval": interval,
            "proto": f.key.proto_name(),
            "client": f.key.client().to_string(),
            "server": f.key.server().to_string(),
            "rli": figures(&f.rli),
            "rli_l": figures(&f.left),
            "unsettled": f.unsettled,
            "widened": f.widened,
        });
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}
