//! One table of every pinned map: its name, the key and value sizes this
//! build expects, and where its capacity comes from. The install's checks of
//! pinned maps, the capacities handed to the loader, the maps that need a
//! pin path of their own, and `lbctl status` all read it; a test checks it
//! against `lb_common::maps::ALL` and the object itself.
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
};

use super::sizes::{MapSizes, SizeFlag};

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

const fn kv<K, V>() -> Option<(usize, usize)> {
    Some((size_of::<K>(), size_of::<V>()))
}

const fn spec(name: &'static str, sizes: Option<(usize, usize)>, capacity: Capacity) -> MapSpec {
    MapSpec {
        name,
        sizes,
        capacity,
        btf: false,
        preallocatable: false,
    }
}

/// `spec` of a hash map `--preallocate-maps` applies to.
const fn synced(name: &'static str, sizes: Option<(usize, usize)>, capacity: Capacity) -> MapSpec {
    MapSpec {
        preallocatable: true,
        ..spec(name, sizes, capacity)
    }
}

/// Every pinned map of the object.
pub const CATALOG: [MapSpec; 31] = [
    synced(
        names::LB4_SERVICES,
        kv::<Service4Key, ServiceValue>(),
        Capacity::Sized(SizeFlag::Services),
    ),
    synced(
        names::LB4_BACKENDS,
        kv::<u32, Backend4>(),
        Capacity::Sized(SizeFlag::Backends),
    ),
    synced(
        names::LB4_REVNAT,
        kv::<u32, RevNat4>(),
        Capacity::Sized(SizeFlag::Services),
    ),
    spec(
        names::LB4_SOCK_REVNAT,
        kv::<SockRevNat4Key, SockRevNat4Value>(),
        Capacity::Sized(SizeFlag::SockRevNat),
    ),
    synced(
        names::LB6_SERVICES,
        kv::<Service6Key, ServiceValue>(),
        Capacity::Sized(SizeFlag::Services),
    ),
    synced(
        names::LB6_BACKENDS,
        kv::<u32, Backend6>(),
        Capacity::Sized(SizeFlag::Backends),
    ),
    synced(
        names::LB6_REVNAT,
        kv::<u32, RevNat6>(),
        Capacity::Sized(SizeFlag::Services),
    ),
    spec(
        names::LB6_SOCK_REVNAT,
        kv::<SockRevNat6Key, SockRevNat6Value>(),
        Capacity::Sized(SizeFlag::SockRevNat),
    ),
    // Socket storage: the key is the socket (an int fd from user space).
    MapSpec {
        name: names::LB_SOCK_PEERS,
        sizes: kv::<i32, SockPeers>(),
        capacity: Capacity::Unchecked,
        btf: true,
        preallocatable: false,
    },
    spec(
        names::LB_SOCK_TCP,
        kv::<u32, SockTcpSlot>(),
        Capacity::DerivedFrom(SizeFlag::SockRevNat, sock_tcp_slots),
    ),
    spec(
        names::LB_SOCK_FILTER,
        kv::<u32, u8>(),
        Capacity::Fixed(SOCK_FILTER_SLOTS),
    ),
    spec(
        names::LB_SOCK_COOKIES,
        kv::<u32, u8>(),
        Capacity::Fixed(SOCK_COOKIE_SLOTS),
    ),
    MapSpec {
        name: names::LB_SOCK_UDP,
        sizes: kv::<i32, UdpChoices>(),
        capacity: Capacity::Unchecked,
        btf: true,
        preallocatable: false,
    },
    spec(
        names::LB_AFFINITY,
        kv::<AffinityKey, AffinityValue>(),
        Capacity::Sized(SizeFlag::Affinity),
    ),
    spec(
        names::LB_AFFINITY_MATCH,
        kv::<AffinityMatchKey, u8>(),
        Capacity::Sized(SizeFlag::Services),
    ),
    // One entry per frontend at most: the services map's size holds them.
    spec(
        names::LB_AFFINITY_GROUP,
        kv::<u32, u32>(),
        Capacity::Sized(SizeFlag::Services),
    ),
    spec(
        names::LB4_CT,
        kv::<Ct4Key, Ct4Value>(),
        Capacity::Sized(SizeFlag::Ct),
    ),
    spec(
        names::LB4_FRAGS,
        kv::<Frag4Key, Frag4Value>(),
        Capacity::Fixed(names::DEFAULT_FRAGS_MAX),
    ),
    spec(
        names::LB_DEVICES,
        kv::<u32, Device>(),
        Capacity::Fixed(names::DEFAULT_DEVICES_MAX),
    ),
    spec(
        names::LB6_CT,
        kv::<Ct6Key, Ct6Value>(),
        Capacity::Sized(SizeFlag::Ct),
    ),
    spec(
        names::LB6_DEVICES,
        kv::<u32, Device6>(),
        Capacity::Fixed(names::DEFAULT_DEVICES_MAX),
    ),
    MapSpec {
        name: names::LB_MAGLEV,
        sizes: kv::<u32, u32>(),
        capacity: Capacity::Sized(SizeFlag::Maglev),
        btf: true,
        preallocatable: false,
    },
    spec(
        names::LB4_SRC_RANGES,
        // The kernel's key: a 32-bit prefix length, then the data.
        Some((
            size_of::<u32>() + size_of::<SourceRange4>(),
            size_of::<u8>(),
        )),
        Capacity::Sized(SizeFlag::SourceRanges),
    ),
    spec(
        names::LB6_SRC_RANGES,
        Some((
            size_of::<u32>() + size_of::<SourceRange6>(),
            size_of::<u8>(),
        )),
        Capacity::Sized(SizeFlag::SourceRanges),
    ),
    spec(
        names::LB4_FE_FILTER,
        kv::<u32, u64>(),
        Capacity::Fixed(FILTER_WORDS),
    ),
    spec(names::LB_BACKENDS_GEN, kv::<u32, u32>(), Capacity::Fixed(1)),
    spec(
        names::LB_DROPS,
        kv::<u32, u64>(),
        Capacity::Fixed(DROP_SLOTS),
    ),
    spec(
        names::LB_EVENTS,
        Some((0, 0)),
        Capacity::Fixed(EVENTS_RING_BYTES),
    ),
    spec(
        names::LB_CONFIG,
        kv::<u32, u32>(),
        Capacity::Fixed(CONFIG_SLOTS),
    ),
    spec(
        names::LB_COUNTERS,
        kv::<u32, u64>(),
        Capacity::Fixed(COUNTER_SLOTS),
    ),
    spec(
        names::LB_EVENT_RATE,
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
        let mut all: Vec<&str> = names::ALL.to_vec();
        all.sort_unstable();
        assert_eq!(listed, all);
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
