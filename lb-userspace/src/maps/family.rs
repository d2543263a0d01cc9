//! The maps that exist once per address family (services, backends,
//! reverse NAT, source ranges), written once over the family: `Layout`
//! says what differs (key and value types, names, conversions), and
//! `FamilyMaps<L>` holds and writes one family's maps. The agent keeps one
//! for each (`PerFamily`), so no writer needs an "if IPv4 … else IPv6" of
//! its own.
use std::{io, os::fd::AsFd as _, path::Path};

use anyhow::Context as _;
use aya::{
    maps::{
        lpm_trie::{Key as LpmKey, LpmTrie},
        HashMap, IterableMap as _, MapData,
    },
    Pod,
};
use lb_common::{
    backend::{Backend4, Backend6},
    maps as names,
    revnat::{RevNat4, RevNat6},
    service::{Service4Key, Service6Key, ServiceValue, SourceRange4, SourceRange6},
};

use super::{
    bpf::{ignore_missing, io_error, open_pinned},
    convert as c, BackendEntry, Family, MapOp, RevNatEntry, SvcKey,
};
use crate::net::Cidr;

/// The names of one family's maps.
#[derive(Clone, Copy, Debug)]
pub struct Names {
    pub services: &'static str,
    pub backends: &'static str,
    pub revnat: &'static str,
    pub source_ranges: &'static str,
}

impl Family {
    pub const fn names(self) -> Names {
        match self {
            Family::V4 => Names {
                services: names::LB4_SERVICES,
                backends: names::LB4_BACKENDS,
                revnat: names::LB4_REVNAT,
                source_ranges: names::LB4_SRC_RANGES,
            },
            Family::V6 => Names {
                services: names::LB6_SERVICES,
                backends: names::LB6_BACKENDS,
                revnat: names::LB6_REVNAT,
                source_ranges: names::LB6_SRC_RANGES,
            },
        }
    }
}

/// What one family's maps hold, and how the agent's entries convert.
pub trait Layout {
    const FAMILY: Family;
    type SvcKey: Pod;
    type Backend: Pod;
    type RevNat: Pod;
    type Range: Pod;
    fn svc_key(k: &SvcKey) -> Self::SvcKey;
    fn svc_key_from(k: &Self::SvcKey) -> SvcKey;
    fn backend(b: &BackendEntry) -> Self::Backend;
    fn backend_from(b: &Self::Backend) -> BackendEntry;
    fn revnat(r: &RevNatEntry) -> Self::RevNat;
    fn revnat_from(r: &Self::RevNat) -> RevNatEntry;
    /// The source-ranges key of (service, network); an error for a network
    /// of the other family.
    fn range(service_id: u32, range: &Cidr) -> io::Result<LpmKey<Self::Range>>;
    fn range_from(key: &LpmKey<Self::Range>) -> (u32, Cidr);
}

pub struct V4;
pub struct V6;

fn wrong_family(map: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{map} holds networks of its own family only"),
    )
}

impl Layout for V4 {
    const FAMILY: Family = Family::V4;
    type SvcKey = Service4Key;
    type Backend = Backend4;
    type RevNat = RevNat4;
    type Range = SourceRange4;
    fn svc_key(k: &SvcKey) -> Service4Key {
        c::svc_key4(k)
    }
    fn svc_key_from(k: &Service4Key) -> SvcKey {
        c::svc_key_from4(k)
    }
    fn backend(b: &BackendEntry) -> Backend4 {
        c::backend4(b)
    }
    fn backend_from(b: &Backend4) -> BackendEntry {
        c::backend_from4(b)
    }
    fn revnat(r: &RevNatEntry) -> RevNat4 {
        c::revnat4(r)
    }
    fn revnat_from(r: &RevNat4) -> RevNatEntry {
        c::revnat_from4(r)
    }
    fn range(service_id: u32, range: &Cidr) -> io::Result<LpmKey<SourceRange4>> {
        let std::net::IpAddr::V4(a) = range.address else {
            return Err(wrong_family(names::LB4_SRC_RANGES));
        };
        Ok(LpmKey::new(
            SourceRange4::prefix_len(range.prefix),
            SourceRange4 {
                service_id,
                address: u32::from_ne_bytes(a.octets()),
            },
        ))
    }
    fn range_from(k: &LpmKey<SourceRange4>) -> (u32, Cidr) {
        let data = k.data();
        (
            data.service_id,
            Cidr {
                address: std::net::Ipv4Addr::from(data.address.to_ne_bytes()).into(),
                prefix: k.prefix_len().saturating_sub(32) as u8,
            },
        )
    }
}

impl Layout for V6 {
    const FAMILY: Family = Family::V6;
    type SvcKey = Service6Key;
    type Backend = Backend6;
    type RevNat = RevNat6;
    type Range = SourceRange6;
    fn svc_key(k: &SvcKey) -> Service6Key {
        c::svc_key6(k)
    }
    fn svc_key_from(k: &Service6Key) -> SvcKey {
        c::svc_key_from6(k)
    }
    fn backend(b: &BackendEntry) -> Backend6 {
        c::backend6(b)
    }
    fn backend_from(b: &Backend6) -> BackendEntry {
        c::backend_from6(b)
    }
    fn revnat(r: &RevNatEntry) -> RevNat6 {
        c::revnat6(r)
    }
    fn revnat_from(r: &RevNat6) -> RevNatEntry {
        c::revnat_from6(r)
    }
    fn range(service_id: u32, range: &Cidr) -> io::Result<LpmKey<SourceRange6>> {
        let std::net::IpAddr::V6(a) = range.address else {
            return Err(wrong_family(names::LB6_SRC_RANGES));
        };
        Ok(LpmKey::new(
            SourceRange6::prefix_len(range.prefix),
            SourceRange6 {
                service_id,
                address: c::ip6_to_map(a),
            },
        ))
    }
    fn range_from(k: &LpmKey<SourceRange6>) -> (u32, Cidr) {
        let data = k.data();
        (
            data.service_id,
            Cidr {
                address: c::ip6_from_map(data.address).into(),
                prefix: k.prefix_len().saturating_sub(32) as u8,
            },
        )
    }
}

/// One family's maps.
pub struct FamilyMaps<L: Layout> {
    services: HashMap<MapData, L::SvcKey, ServiceValue>,
    backends: HashMap<MapData, u32, L::Backend>,
    revnat: HashMap<MapData, u32, L::RevNat>,
    source_ranges: LpmTrie<MapData, L::Range, u8>,
}

/// One value per address family.
pub struct PerFamily<A, B> {
    pub v4: A,
    pub v6: B,
}

/// The per-family maps of both families.
pub type BothFamilies = PerFamily<FamilyMaps<V4>, FamilyMaps<V6>>;

impl BothFamilies {
    pub fn open(pin_dir: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            v4: FamilyMaps::open(pin_dir)?,
            v6: FamilyMaps::open(pin_dir)?,
        })
    }
}

/// Which of a family's maps a run of batchable upserts goes to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum RunMap {
    Services,
    Backends,
    RevNat,
}

impl<L: Layout> FamilyMaps<L> {
    pub fn open(pin_dir: &Path) -> anyhow::Result<Self> {
        let n = L::FAMILY.names();
        Ok(Self {
            services: HashMap::try_from(open_pinned(pin_dir, n.services)?)?,
            backends: HashMap::try_from(open_pinned(pin_dir, n.backends)?)?,
            revnat: HashMap::try_from(open_pinned(pin_dir, n.revnat)?)?,
            source_ranges: LpmTrie::try_from(open_pinned(pin_dir, n.source_ranges)?)?,
        })
    }

    /// Applies an operation on this family's maps; None: not one of them.
    pub fn apply(&mut self, op: &MapOp) -> Option<io::Result<()>> {
        Some(match op {
            MapOp::UpsertService(k, v) => {
                self.services.insert(L::svc_key(k), v, 0).map_err(io_error)
            }
            MapOp::DeleteService(k) => ignore_missing(self.services.remove(&L::svc_key(k))),
            MapOp::UpsertBackend(id, b) => {
                self.backends.insert(id, L::backend(b), 0).map_err(io_error)
            }
            MapOp::DeleteBackend(id, _) => ignore_missing(self.backends.remove(id)),
            MapOp::UpsertRevNat(id, r) => self.revnat.insert(id, L::revnat(r), 0).map_err(io_error),
            MapOp::DeleteRevNat(id, _) => ignore_missing(self.revnat.remove(id)),
            MapOp::UpsertSourceRange(s, r) => {
                L::range(*s, r).and_then(|k| self.source_ranges.insert(&k, 1, 0).map_err(io_error))
            }
            MapOp::DeleteSourceRange(s, r) => match L::range(*s, r) {
                Ok(k) => ignore_missing(self.source_ranges.remove(&k)),
                Err(e) => Err(e),
            },
            _ => return None,
        })
    }

    /// One run of upserts into one map, as a single BPF_MAP_UPDATE_BATCH.
    pub fn write_run(&mut self, run: RunMap, ops: &[MapOp]) -> Result<(), (usize, io::Error)> {
        use crate::sys::bpf::map_update_batch_of as batch;
        macro_rules! go {
            ($map:expr, $pat:pat => ($k:expr, $v:expr)) => {{
                let (keys, values): (Vec<_>, Vec<_>) = ops
                    .iter()
                    .map(|op| match op {
                        $pat => ($k, $v),
                        _ => unreachable!("a run holds one kind of write"),
                    })
                    .unzip();
                batch($map.map().fd().as_fd(), &keys, &values)
            }};
        }
        match run {
            RunMap::Services => {
                go!(self.services, MapOp::UpsertService(k, v) => (L::svc_key(k), *v))
            }
            RunMap::Backends => {
                go!(self.backends, MapOp::UpsertBackend(id, b) => (*id, L::backend(b)))
            }
            RunMap::RevNat => go!(self.revnat, MapOp::UpsertRevNat(id, r) => (*id, L::revnat(r))),
        }
    }

    /// The service ids with a reverse-NAT entry: this family's frontends.
    pub fn revnat_ids(&self) -> anyhow::Result<Vec<u32>> {
        let n = L::FAMILY.names();
        self.revnat
            .keys()
            .collect::<Result<_, _>>()
            .with_context(|| format!("reading {}", n.revnat))
    }

    /// Adds this family's entries to the lists `MapState::from_entries` takes.
    pub fn dump_into(
        &self,
        services: &mut Vec<(SvcKey, ServiceValue)>,
        backends: &mut Vec<(u32, BackendEntry)>,
        revnat: &mut Vec<(u32, RevNatEntry)>,
        source_ranges: &mut Vec<(u32, Cidr)>,
    ) -> anyhow::Result<()> {
        let n = L::FAMILY.names();
        for e in &self.services {
            let (k, v) = e.with_context(|| format!("reading {}", n.services))?;
            services.push((L::svc_key_from(&k), v));
        }
        for e in &self.backends {
            let (id, b) = e.with_context(|| format!("reading {}", n.backends))?;
            backends.push((id, L::backend_from(&b)));
        }
        for e in &self.revnat {
            let (id, r) = e.with_context(|| format!("reading {}", n.revnat))?;
            revnat.push((id, L::revnat_from(&r)));
        }
        for k in self.source_ranges.keys() {
            let k = k.with_context(|| format!("reading {}", n.source_ranges))?;
            source_ranges.push(L::range_from(&k));
        }
        Ok(())
    }
}
