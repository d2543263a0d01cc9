//! The real maps: opened from their pins, so the agent and lbctl see the same
//! objects whether or not the agent that created them is still running.
use std::{io, path::Path};

use anyhow::Context as _;
use aya::maps::{HashMap, Map, MapData, MapError, PerCpuArray};
use lb_common::{
    backend::Backend4,
    drop::{drop_index, Direction, DropReason},
    maps as names,
    revnat::RevNat4,
    service::{Service4Key, ServiceValue},
};

use super::{Capacity, LbMaps, MapOp, MapState, MapWriteError};

pub struct BpfMaps {
    services: HashMap<MapData, Service4Key, ServiceValue>,
    backends: HashMap<MapData, u32, Backend4>,
    revnat: HashMap<MapData, u32, RevNat4>,
    capacity: Capacity,
}

/// Opens a pinned map, with an error that says what to do when it is missing.
pub fn open_pinned(pin_dir: &Path, name: &str) -> anyhow::Result<Map> {
    let path = pin_dir.join(name);
    if !path.exists() {
        anyhow::bail!(
            "map {name} is not pinned at {}: the data path is not installed there \
             (start lb-agent, or pass the right --pin-dir)",
            path.display()
        );
    }
    let data = MapData::from_pin(&path).with_context(|| format!("opening pinned map {}", path.display()))?;
    Map::from_map_data(data).with_context(|| format!("map {}", path.display()))
}

fn max_entries(map: &Map, name: &str) -> anyhow::Result<u32> {
    let data = match map {
        Map::HashMap(d) | Map::LruHashMap(d) | Map::PerCpuArray(d) | Map::Array(d) => d,
        _ => anyhow::bail!("map {name} has an unexpected type"),
    };
    Ok(data.info().with_context(|| format!("info of map {name}"))?.max_entries())
}

impl BpfMaps {
    pub fn open(pin_dir: &Path) -> anyhow::Result<Self> {
        let services = open_pinned(pin_dir, names::LB4_SERVICES)?;
        let backends = open_pinned(pin_dir, names::LB4_BACKENDS)?;
        let revnat = open_pinned(pin_dir, names::LB4_REVNAT)?;
        let capacity = Capacity {
            services: max_entries(&services, names::LB4_SERVICES)?,
            backends: max_entries(&backends, names::LB4_BACKENDS)?,
            revnat: max_entries(&revnat, names::LB4_REVNAT)?,
        };
        Ok(Self {
            services: HashMap::try_from(services)?,
            backends: HashMap::try_from(backends)?,
            revnat: HashMap::try_from(revnat)?,
            capacity,
        })
    }
}

fn io_error(e: MapError) -> io::Error {
    match e {
        MapError::SyscallError(s) => s.io_error,
        other => io::Error::other(other.to_string()),
    }
}

/// Deleting what is already gone is success: deletes are idempotent.
fn ignore_missing(r: Result<(), MapError>) -> Result<(), io::Error> {
    match r.map_err(io_error) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        other => other,
    }
}

impl LbMaps for BpfMaps {
    fn apply(&mut self, op: &MapOp) -> Result<(), MapWriteError> {
        let result = match op {
            MapOp::UpsertService(k, v) => self.services.insert(k, v, 0).map_err(io_error),
            MapOp::DeleteService(k) => ignore_missing(self.services.remove(k)),
            MapOp::UpsertBackend(id, b) => self.backends.insert(id, b, 0).map_err(io_error),
            MapOp::DeleteBackend(id) => ignore_missing(self.backends.remove(id)),
            MapOp::UpsertRevNat(id, r) => self.revnat.insert(id, r, 0).map_err(io_error),
            MapOp::DeleteRevNat(id) => ignore_missing(self.revnat.remove(id)),
        };
        result.map_err(|source| MapWriteError { map: op.map_name(), op: format!("{op:?}"), source })
    }

    fn dump(&self) -> anyhow::Result<MapState> {
        let services = self.services.iter().collect::<Result<Vec<_>, _>>().context("reading LB4_SERVICES")?;
        let backends = self.backends.iter().collect::<Result<Vec<_>, _>>().context("reading LB4_BACKENDS")?;
        let revnat = self.revnat.iter().collect::<Result<Vec<_>, _>>().context("reading LB4_REVNAT")?;
        Ok(MapState::from_entries(services, backends, revnat))
    }

    fn capacity(&self) -> Capacity {
        self.capacity
    }
}

/// One drop counter, summed over CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DropCount {
    pub reason: &'static str,
    pub direction: &'static str,
    pub packets: u64,
}

/// Reads `LB_DROPS`: every reason and direction, zeros included.
pub fn read_drops(pin_dir: &Path) -> anyhow::Result<Vec<DropCount>> {
    let drops: PerCpuArray<MapData, u64> = PerCpuArray::try_from(open_pinned(pin_dir, names::LB_DROPS)?)?;
    let mut out = Vec::new();
    for reason in DropReason::ALL {
        for direction in Direction::ALL {
            let values = drops.get(&drop_index(reason, direction), 0).context("reading LB_DROPS")?;
            out.push(DropCount {
                reason: reason.name(),
                direction: direction.name(),
                packets: values.iter().sum(),
            });
        }
    }
    Ok(out)
}
