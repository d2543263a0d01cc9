//! One table of every pinned map: its name, the key and value sizes this
//! build expects, and where its capacity comes from. The install's checks of
//! pinned maps, the capacities handed to the loader, the maps that need a
//! pin path of their own, the uninstall, and `lbctl status` all read it; a
//! test checks each pin of a loaded object against its row (map_writes.rs).
use std::mem::size_of;

use lb_common::{
    affinity::{AffinityKey, AffinityMatchKey, AffinityValue},
    backend::{Backend4, Backend6},
    config::{RateState, CONFIG_SLOTS, COUNTER_SLOTS},
    conntrack::{Ct4Key, Ct4Value, Ct6Key, Ct6Value},
    devices::{Device, Device6},
    drop::DROP_SLOTS,
    event::EVENTS_RING_BYTES,
    filter::{FILTER_WORDS, SOCK_COOKIE_SLOTS, SOCK_FILTER_SLOTS},
    fragments::{Frag4Key, Frag4Value},
    maps as names,
    revnat::{
        RevNat4, RevNat6, SockRevNat4Key, SockRevNat4Value, SockRevNat6Key, SockRevNat6Value,
    },
    service::{Service4Key, Service6Key, ServiceValue, SourceRange4, SourceRange6},
    sock::{sock_tcp_slots, SockPeers, SockTcpSlot, UdpChoices},
    stats::ServiceStats,
};

use aya::maps::MapType;

use super::{
    sizes::{MapSizes, SizeFlag},
    Family,
};

/// Where a map's capacity comes from.
#[derive(Clone, Copy, Debug)]
pub enum Capacity {
    /// Set by a `--map-size-*` flag.
    Sized(SizeFlag),
    /// Follows from a flag's size (`LB_SOCK_TCP`: a power of two).
    DerivedFrom(SizeFlag, fn(u32) -> u32),
    /// Fixed by the layout.
    Fixed(u32),
    /// Not checked (socket storage: its capacity is the sockets').
    Unchecked,
}

/// One pinned map.
#[derive(Clone, Copy, Debug)]
pub struct MapSpec {
    pub name: &'static str,
    /// The kernel's map type, as the object declares it (a test checks
    /// each pin against it).
    pub kind: MapType,
    /// The address family whose entries it holds; `None`: both, or none.
    pub family: Option<Family>,
    /// Key and value sizes this build expects; `None`: not checked.
    pub sizes: Option<(usize, usize)>,
    pub capacity: Capacity,
    /// A BTF map definition: it carries no pinning attribute, so the loader
    /// is given its pin path.
    pub btf: bool,
    /// A hash map the agent fills on every full sync (BPF_F_NO_PREALLOC in
    /// the object): made preallocated instead with `--preallocate-maps`.
    pub preallocatable: bool,
}

const V4: Option<Family> = Some(Family::V4);
const V6: Option<Family> = Some(Family::V6);
/// Both families' entries (or no addresses at all).
const BOTH: Option<Family> = None;

const fn kv<K, V>() -> Option<(usize, usize)> {
    Some((size_of::<K>(), size_of::<V>()))
}

const fn spec(
    name: &'static str,
    kind: MapType,
    family: Option<Family>,
    sizes: Option<(usize, usize)>,
    capacity: Capacity,
) -> MapSpec {
    MapSpec {
        name,
        kind,
        family,
        sizes,
        capacity,
        btf: false,
        preallocatable: false,
    }
}

/// `spec` of a hash map `--preallocate-maps` applies to.
const fn synced(
    name: &'static str,
    family: Option<Family>,
    sizes: Option<(usize, usize)>,
    capacity: Capacity,
) -> MapSpec {
    MapSpec {
        preallocatable: true,
        ..spec(name, MapType::Hash, family, sizes, capacity)
    }
}

/// `spec` of a map defined in BTF (no pinning attribute of its own), of
/// both families.
const fn btf(
    name: &'static str,
    kind: MapType,
    sizes: Option<(usize, usize)>,
    capacity: Capacity,
) -> MapSpec {
    MapSpec {
        btf: true,
        ..spec(name, kind, BOTH, sizes, capacity)
    }
}

/// A map with an entry per frontend of either family: twice a family's
/// services map (`DEFAULT_SVC_STATS_MAX` at the default size).
fn both_families(services: u32) -> u32 {
    services.saturating_mul(2)
}

/// Every pinned map of the object, in the order `lbctl status` lists them.
pub const CATALOG: [MapSpec; 32] = [
    synced(
        names::LB4_SERVICES,
        V4,
        kv::<Service4Key, ServiceValue>(),
        Capacity::Sized(SizeFlag::Services),
    ),
    synced(
        names::LB4_BACKENDS,
        V4,
        kv::<u32, Backend4>(),
        Capacity::Sized(SizeFlag::Backends),
    ),
    synced(
        names::LB4_REVNAT,
        V4,
        kv::<u32, RevNat4>(),
        Capacity::Sized(SizeFlag::Services),
    ),
    spec(
        names::LB4_SOCK_REVNAT,
        MapType::LruHash,
        V4,
        kv::<SockRevNat4Key, SockRevNat4Value>(),
        Capacity::Sized(SizeFlag::SockRevNat),
    ),
    synced(
        names::LB6_SERVICES,
        V6,
        kv::<Service6Key, ServiceValue>(),
        Capacity::Sized(SizeFlag::Services),
    ),
    synced(
        names::LB6_BACKENDS,
        V6,
        kv::<u32, Backend6>(),
        Capacity::Sized(SizeFlag::Backends),
    ),
    synced(
        names::LB6_REVNAT,
        V6,
        kv::<u32, RevNat6>(),
        Capacity::Sized(SizeFlag::Services),
    ),
    spec(
        names::LB6_SOCK_REVNAT,
        MapType::LruHash,
        V6,
        kv::<SockRevNat6Key, SockRevNat6Value>(),
        Capacity::Sized(SizeFlag::SockRevNat),
    ),
    // Socket storage: the key is the socket (an int fd from user space).
    btf(
        names::LB_SOCK_PEERS,
        MapType::SkStorage,
        kv::<i32, SockPeers>(),
        Capacity::Unchecked,
    ),
    spec(
        names::LB_SOCK_TCP,
        MapType::Array,
        BOTH,
        kv::<u32, SockTcpSlot>(),
        Capacity::DerivedFrom(SizeFlag::SockRevNat, sock_tcp_slots),
    ),
    spec(
        names::LB_SOCK_FILTER,
        MapType::Array,
        BOTH,
        kv::<u32, u8>(),
        Capacity::Fixed(SOCK_FILTER_SLOTS),
    ),
    spec(
        names::LB_SOCK_COOKIES,
        MapType::Array,
        BOTH,
        kv::<u32, u8>(),
        Capacity::Fixed(SOCK_COOKIE_SLOTS),
    ),
    btf(
        names::LB_SOCK_UDP,
        MapType::SkStorage,
        kv::<i32, UdpChoices>(),
        Capacity::Unchecked,
    ),
    spec(
        names::LB_AFFINITY,
        MapType::LruHash,
        BOTH,
        kv::<AffinityKey, AffinityValue>(),
        Capacity::Sized(SizeFlag::Affinity),
    ),
    spec(
        names::LB_AFFINITY_MATCH,
        MapType::Hash,
        BOTH,
        kv::<AffinityMatchKey, u8>(),
        Capacity::Sized(SizeFlag::Services),
    ),
    // One entry per frontend of either family (maps::stats).
    spec(
        names::LB_SVC_STATS,
        MapType::PerCpuHash,
        BOTH,
        kv::<u32, ServiceStats>(),
        Capacity::DerivedFrom(SizeFlag::Services, both_families),
    ),
    // One entry per frontend at most: the services map's size holds them.
    spec(
        names::LB_AFFINITY_GROUP,
        MapType::Hash,
        BOTH,
        kv::<u32, u32>(),
        Capacity::Sized(SizeFlag::Services),
    ),
    spec(
        names::LB4_CT,
        MapType::LruHash,
        V4,
        kv::<Ct4Key, Ct4Value>(),
        Capacity::Sized(SizeFlag::Ct),
    ),
    spec(
        names::LB4_FRAGS,
        MapType::LruHash,
        V4,
        kv::<Frag4Key, Frag4Value>(),
        Capacity::Fixed(names::DEFAULT_FRAGS_MAX),
    ),
    spec(
        names::LB_DEVICES,
        MapType::Hash,
        V4,
        kv::<u32, Device>(),
        Capacity::Fixed(names::DEFAULT_DEVICES_MAX),
    ),
    spec(
        names::LB6_CT,
        MapType::LruHash,
        V6,
        kv::<Ct6Key, Ct6Value>(),
        Capacity::Sized(SizeFlag::Ct),
    ),
    spec(
        names::LB6_DEVICES,
        MapType::Hash,
        V6,
        kv::<u32, Device6>(),
        Capacity::Fixed(names::DEFAULT_DEVICES_MAX),
    ),
    btf(
        names::LB_MAGLEV,
        MapType::HashOfMaps,
        kv::<u32, u32>(),
        Capacity::Sized(SizeFlag::Maglev),
    ),
    spec(
        names::LB4_SRC_RANGES,
        MapType::LpmTrie,
        V4,
        // The kernel's key: a 32-bit prefix length, then the data.
        Some((
            size_of::<u32>() + size_of::<SourceRange4>(),
            size_of::<u8>(),
        )),
        Capacity::Sized(SizeFlag::SourceRanges),
    ),
    spec(
        names::LB6_SRC_RANGES,
        MapType::LpmTrie,
        V6,
        Some((
            size_of::<u32>() + size_of::<SourceRange6>(),
            size_of::<u8>(),
        )),
        Capacity::Sized(SizeFlag::SourceRanges),
    ),
    spec(
        names::LB4_FE_FILTER,
        MapType::Array,
        BOTH,
        kv::<u32, u64>(),
        Capacity::Fixed(FILTER_WORDS),
    ),
    spec(
        names::LB_BACKENDS_GEN,
        MapType::Array,
        BOTH,
        kv::<u32, u32>(),
        Capacity::Fixed(1),
    ),
    spec(
        names::LB_DROPS,
        MapType::PerCpuArray,
        BOTH,
        kv::<u32, u64>(),
        Capacity::Fixed(DROP_SLOTS),
    ),
    spec(
        names::LB_EVENTS,
        MapType::RingBuf,
        BOTH,
        Some((0, 0)),
        Capacity::Fixed(EVENTS_RING_BYTES),
    ),
    spec(
        names::LB_CONFIG,
        MapType::Array,
        BOTH,
        kv::<u32, u32>(),
        Capacity::Fixed(CONFIG_SLOTS),
    ),
    spec(
        names::LB_COUNTERS,
        MapType::PerCpuArray,
        BOTH,
        kv::<u32, u64>(),
        Capacity::Fixed(COUNTER_SLOTS),
    ),
    spec(
        names::LB_EVENT_RATE,
        MapType::PerCpuArray,
        BOTH,
        kv::<u32, RateState>(),
        Capacity::Fixed(2),
    ),
];

/// The catalog's row of a map.
pub fn spec_of(name: &str) -> Option<&'static MapSpec> {
    CATALOG.iter().find(|m| m.name == name)
}

impl MapSpec {
    /// The flag that sizes this map, if one does.
    pub fn size_flag(&self) -> Option<SizeFlag> {
        match self.capacity {
            Capacity::Sized(f) | Capacity::DerivedFrom(f, _) => Some(f),
            Capacity::Fixed(_) | Capacity::Unchecked => None,
        }
    }

    /// The capacity this map must have with `sizes`; `None`: not checked.
    pub fn max_entries(&self, sizes: &MapSizes) -> Option<u32> {
        match self.capacity {
            Capacity::Sized(f) => Some(f.get(sizes)),
            Capacity::DerivedFrom(f, derive) => Some(derive(f.get(sizes))),
            Capacity::Fixed(n) => Some(n),
            Capacity::Unchecked => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_lists_every_pinned_map_once() {
        let mut listed: Vec<&str> = CATALOG.iter().map(|m| m.name).collect();
        listed.sort_unstable();
        let before = listed.len();
        listed.dedup();
        assert_eq!(listed.len(), before, "a map listed twice");
        // The kernel keeps the first 15 bytes as the map's own name
        // (BPF_OBJ_NAME_LEN - 1, what bpftool shows): those must differ too.
        let mut short: Vec<&str> = listed.iter().map(|n| &n[..n.len().min(15)]).collect();
        short.dedup();
        assert_eq!(short.len(), listed.len(), "two names alike in 15 bytes");
    }

    /// What a name's prefix says of its family: `LB4_` IPv4, `LB6_` IPv6,
    /// `LB_` both or none.
    fn family_of_name(name: &str) -> Option<Family> {
        if name.starts_with("LB4_") {
            Some(Family::V4)
        } else if name.starts_with("LB6_") {
            Some(Family::V6)
        } else {
            None
        }
    }

    #[test]
    fn a_maps_name_says_its_family_except_the_two_kept_for_upgrades() {
        let mut misnamed: Vec<(&str, &str)> = CATALOG
            .iter()
            .filter(|m| family_of_name(m.name) != m.family)
            .map(|m| {
                let renamed = names::RENAME_AT_NEXT_LAYOUT
                    .iter()
                    .find(|(old, _)| *old == m.name)
                    .map_or("", |(_, new)| *new);
                (m.name, renamed)
            })
            .collect();
        misnamed.sort_unstable();
        // A rename changes a pin's name, which a running data path and a
        // rollback still use: it waits for the next layout version, and
        // each such name is listed with the name it will get.
        assert_eq!(
            misnamed,
            vec![
                (names::LB4_FE_FILTER, "LB_FE_FILTER"),
                (names::LB_DEVICES, "LB4_DEVICES"),
            ]
        );
        for (old, new) in names::RENAME_AT_NEXT_LAYOUT {
            let row = spec_of(old).unwrap();
            assert_eq!(family_of_name(new), row.family, "{new} says its family");
        }
    }

    #[test]
    fn each_family_has_the_same_maps_and_its_writers_name_them() {
        // A map's role: its name without the family prefix.
        let roles = |f: Family| -> Vec<&str> {
            let mut r: Vec<&str> = CATALOG
                .iter()
                .filter(|m| m.family == Some(f))
                .map(|m| m.name.split_once('_').unwrap().1)
                .collect();
            r.sort_unstable();
            r
        };
        let mut v4 = roles(Family::V4);
        // IPv6 fragments go to the stack untranslated: no map follows them.
        v4.retain(|r| *r != "FRAGS");
        assert_eq!(v4, roles(Family::V6));
        for f in [Family::V4, Family::V6] {
            let n = f.names();
            for name in [n.services, n.backends, n.revnat, n.source_ranges] {
                let row = spec_of(name).unwrap_or_else(|| panic!("{name} not in the catalog"));
                assert_eq!(row.family, Some(f), "{name}");
            }
        }
    }

    #[test]
    fn capacities_follow_the_map_sizes() {
        let sizes = MapSizes {
            source_ranges: 7,
            services: 9,
            ..MapSizes::default()
        };
        let of = |name| {
            CATALOG
                .iter()
                .find(|m| m.name == name)
                .unwrap()
                .max_entries(&sizes)
        };
        assert_eq!(of(names::LB4_SRC_RANGES), Some(7));
        assert_eq!(
            of(names::LB_AFFINITY_MATCH),
            Some(9),
            "one per (service, backend)"
        );
        assert_eq!(of(names::LB_DROPS), Some(DROP_SLOTS));
        assert_eq!(of(names::LB_SOCK_UDP), None);
        assert_eq!(of(names::LB_SOCK_PEERS), None);
    }
}
