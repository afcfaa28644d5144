//! The loaded object's maps by name, checked for the kind each capability expects: borrowed
//! for the ones the datapath keeps (the counters), taken out for the ones a capability's handle
//! owns from then on. Every name is checked present at load.

use anyhow::{anyhow, bail};
use aya::{
    maps::{Map, MapData},
    Ebpf,
};

/// Map `name` of the object, which must be a per-CPU array.
pub(super) fn per_cpu_array<'a>(ebpf: &'a Ebpf, name: &str) -> anyhow::Result<&'a MapData> {
    match ebpf.map(name).ok_or_else(|| taken(name))? {
        Map::PerCpuArray(d) => Ok(d),
        _ => bail!("{name} is not a per-CPU array: {APART}"),
    }
}

/// Takes map `name` out of the object, for the one handle that owns it from then on.
pub(super) fn take(ebpf: &mut Ebpf, name: &str) -> anyhow::Result<Map> {
    ebpf.take_map(name).ok_or_else(|| taken(name))
}

/// Takes the per-CPU array `name` out of the object.
pub(super) fn take_per_cpu(ebpf: &mut Ebpf, name: &str) -> anyhow::Result<MapData> {
    match take(ebpf, name)? {
        Map::PerCpuArray(d) => Ok(d),
        _ => bail!("{name} is not a per-CPU array: {APART}"),
    }
}

/// Takes the array `name` out of the object.
pub(super) fn take_array(ebpf: &mut Ebpf, name: &str) -> anyhow::Result<MapData> {
    match take(ebpf, name)? {
        Map::Array(d) => Ok(d),
        _ => bail!("{name} is not an array: {APART}"),
    }
}

/// What a map of the wrong kind means.
const APART: &str = "pirated and its XDP object were built apart";

fn taken(name: &str) -> anyhow::Error {
    anyhow!("map {name} was taken already")
}
