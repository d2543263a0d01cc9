//! The data path's maps as the reconciler sees them: a mirror of their
//! contents (`MapState`), the operations that change them (`MapOp`), and the
//! `LbMaps` trait with two implementations, the real pinned BPF maps
//! (`bpf::BpfMaps`) and an in-memory fake for tests (`fake::FakeMaps`).
pub mod bpf;
pub mod convert;
pub mod fake;
pub mod state;

pub use state::MapState;

use lb_common::{
    backend::Backend4,
    revnat::RevNat4,
    service::{Service4Key, ServiceValue},
};

/// One element update or delete. The reconciler emits them in an order that
/// keeps every intermediate state valid for a concurrent reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapOp {
    UpsertBackend(u32, Backend4),
    DeleteBackend(u32),
    UpsertService(Service4Key, ServiceValue),
    DeleteService(Service4Key),
    UpsertRevNat(u32, RevNat4),
    DeleteRevNat(u32),
}

impl MapOp {
    pub const fn map_name(&self) -> &'static str {
        match self {
            MapOp::UpsertBackend(..) | MapOp::DeleteBackend(..) => lb_common::maps::LB4_BACKENDS,
            MapOp::UpsertService(..) | MapOp::DeleteService(..) => lb_common::maps::LB4_SERVICES,
            MapOp::UpsertRevNat(..) | MapOp::DeleteRevNat(..) => lb_common::maps::LB4_REVNAT,
        }
    }
}

/// How many entries each agent-written map can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    pub services: u32,
    pub backends: u32,
    pub revnat: u32,
}

impl Default for Capacity {
    fn default() -> Self {
        Self {
            services: lb_common::maps::DEFAULT_SERVICES_MAX,
            backends: lb_common::maps::DEFAULT_BACKENDS_MAX,
            revnat: lb_common::maps::DEFAULT_REVNAT_MAX,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{op} in {map} failed: {source}")]
pub struct MapWriteError {
    pub map: &'static str,
    pub op: String,
    #[source]
    pub source: std::io::Error,
}

/// The writer side of the data path.
pub trait LbMaps {
    /// Applies one operation to the maps.
    fn apply(&mut self, op: &MapOp) -> Result<(), MapWriteError>;
    /// Reads back everything the agent owns.
    fn dump(&self) -> anyhow::Result<MapState>;
    fn capacity(&self) -> Capacity;
}
