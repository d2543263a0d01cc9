//! The data path's maps as the reconciler sees them: a mirror of their
//! contents (`MapState`), the operations that change them (`MapOp`), and the
//! `LbMaps` trait with two implementations, the real pinned BPF maps
//! (`bpf::BpfMaps`) and an in-memory fake for tests (`fake::FakeMaps`).
//!
//! Everything here uses family-agnostic *logical* entries in host byte order
//! (`SvcKey`, `BackendEntry`, `RevNatEntry`); only `bpf.rs` knows that the
//! kernel keeps IPv4 and IPv6 in separate maps with network-order fields
//! (conversions in `convert.rs`).
pub mod bpf;
pub mod capacity;
pub mod catalog;
pub mod convert;
pub mod fake;
pub mod family;
pub mod sizes;
pub mod state;
pub mod stats;

use std::{net::IpAddr, sync::Arc};

use lb_common::maps as names;

use crate::net::Cidr;
pub use lb_common::service::ServiceValue;
pub use sizes::{MapSizes, SizeFlag};
pub use state::MapState;

/// Address family of an entry; selects the LB4_* or LB6_* map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(address: &IpAddr) -> Self {
        if address.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }
}

/// Key of the services maps: frontend plus slot (0 = master entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SvcKey {
    pub address: IpAddr,
    pub port: u16,
    pub proto: u8,
    pub scope: u8,
    pub slot: u16,
}

impl SvcKey {
    pub const fn new(address: IpAddr, port: u16, proto: u8, scope: u8) -> Self {
        Self {
            address,
            port,
            proto,
            scope,
            slot: 0,
        }
    }

    pub const fn with_slot(&self, slot: u16) -> Self {
        Self { slot, ..*self }
    }

    pub fn family(&self) -> Family {
        Family::of(&self.address)
    }
}

/// Value of the backends maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendEntry {
    pub address: IpAddr,
    pub port: u16,
    pub proto: u8,
    /// `BACKEND_STATE_*`.
    pub state: u8,
    /// `BACKEND_FLAG_*`.
    pub flags: u8,
}

/// Value of the reverse-NAT maps: the frontend a service id stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RevNatEntry {
    pub address: IpAddr,
    pub port: u16,
}

/// One element update or delete. The reconciler emits them in an order that
/// keeps every intermediate state valid for a concurrent reader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapOp {
    UpsertBackend(u32, BackendEntry),
    DeleteBackend(u32, Family),
    UpsertService(SvcKey, ServiceValue),
    DeleteService(SvcKey),
    UpsertRevNat(u32, RevNatEntry),
    DeleteRevNat(u32, Family),
    /// (service id, backend id): the backend is selectable for a service with session affinity.
    UpsertAffinityMatch(u32, u32),
    DeleteAffinityMatch(u32, u32),
    /// (service id, group id): the id clients' affinity memory is kept
    /// under for this frontend (LB_AFFINITY_GROUP).
    SetAffinityGroup(u32, u32),
    DeleteAffinityGroup(u32),
    /// A service's whole Maglev table (backend id per slot), swapped in at once.
    SetMaglev(u32, Arc<Vec<u32>>),
    DeleteMaglev(u32),
    /// (service id, network): a loadBalancerSourceRanges entry
    /// (LB4_SRC_RANGES or LB6_SRC_RANGES by the network's family).
    UpsertSourceRange(u32, Cidr),
    DeleteSourceRange(u32, Cidr),
    /// One 64-bit word of LB4_FE_FILTER (`lb_common::filter`).
    SetFilterWord(u32, u64),
    /// LB_CONFIG[CFG_FRONTEND_FILTER]: the filter holds every frontend.
    TrustFilter(bool),
}

impl MapOp {
    /// The family whose map the operation writes; None for the maps both
    /// families share (affinity, Maglev, the frontend filter, LB_CONFIG).
    pub fn family(&self) -> Option<Family> {
        match self {
            MapOp::UpsertBackend(_, b) => Some(Family::of(&b.address)),
            MapOp::UpsertService(k, _) | MapOp::DeleteService(k) => Some(k.family()),
            MapOp::UpsertRevNat(_, r) => Some(Family::of(&r.address)),
            MapOp::DeleteBackend(_, f) | MapOp::DeleteRevNat(_, f) => Some(*f),
            MapOp::UpsertSourceRange(_, c) | MapOp::DeleteSourceRange(_, c) => {
                Some(Family::of(&c.address))
            }
            // One map for both families (LB4_FE_FILTER too, despite its name).
            MapOp::UpsertAffinityMatch(..)
            | MapOp::DeleteAffinityMatch(..)
            | MapOp::SetAffinityGroup(..)
            | MapOp::DeleteAffinityGroup(..)
            | MapOp::SetMaglev(..)
            | MapOp::DeleteMaglev(..)
            | MapOp::SetFilterWord(..)
            | MapOp::TrustFilter(..) => None,
        }
    }

    pub fn map_name(&self) -> &'static str {
        let family = || {
            self.family()
                .expect("a per-family operation has a family")
                .names()
        };
        match self {
            MapOp::UpsertBackend(..) | MapOp::DeleteBackend(..) => family().backends,
            MapOp::UpsertService(..) | MapOp::DeleteService(..) => family().services,
            MapOp::UpsertRevNat(..) | MapOp::DeleteRevNat(..) => family().revnat,
            MapOp::UpsertSourceRange(..) | MapOp::DeleteSourceRange(..) => family().source_ranges,
            MapOp::UpsertAffinityMatch(..) | MapOp::DeleteAffinityMatch(..) => {
                names::LB_AFFINITY_MATCH
            }
            MapOp::SetAffinityGroup(..) | MapOp::DeleteAffinityGroup(..) => {
                names::LB_AFFINITY_GROUP
            }
            MapOp::SetMaglev(..) | MapOp::DeleteMaglev(..) => names::LB_MAGLEV,
            MapOp::SetFilterWord(..) => names::LB4_FE_FILTER,
            MapOp::TrustFilter(..) => names::LB_CONFIG,
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

/// The writer side of the data path. `Send`: a pipelined reconcile lends
/// the maps to its writer thread (`crate::reconcile`).
pub trait LbMaps: Send {
    /// Applies one operation to the maps.
    fn apply(&mut self, op: &MapOp) -> Result<(), MapWriteError>;
    /// Applies `ops` in order. On failure: how many were applied before the
    /// failing one, and its error. A failure of something the writes owe
    /// after them (BpfMaps: the backends' generation after deletes) counts
    /// them all as applied, possibly `ops.len()`. Writers may group
    /// consecutive writes to one map into fewer syscalls, never reorder them.
    fn apply_all(&mut self, ops: &[MapOp]) -> Result<(), (usize, MapWriteError)> {
        for (i, op) in ops.iter().enumerate() {
            self.apply(op).map_err(|e| (i, e))?;
        }
        Ok(())
    }
    /// Makes a write an earlier failure left owed that no operation
    /// carries (BpfMaps: the backends' generation after deletes). The
    /// reconciler calls it before each run, which may have nothing to write.
    fn settle(&mut self) -> Result<(), MapWriteError> {
        Ok(())
    }
    /// Reads back everything the agent owns.
    fn dump(&self) -> anyhow::Result<MapState>;
    fn capacity(&self) -> MapSizes;
}
