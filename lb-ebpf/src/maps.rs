//! Map definitions. Names are the pin names (see lb_common::maps); the agent
//! may change the capacities at load time.
use aya_ebpf::{
    btf_maps,
    macros::{btf_map, map},
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use lb_common::Addr6;
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
    maps::{
        DEFAULT_AFFINITY_MAX, DEFAULT_BACKENDS_MAX, DEFAULT_CT_MAX, DEFAULT_DEVICES_MAX,
        DEFAULT_FRAGS_MAX, DEFAULT_MAGLEV_MAX, DEFAULT_REVNAT_MAX, DEFAULT_SERVICES_MAX,
        DEFAULT_SOCK_REVNAT_MAX, DEFAULT_SOURCE_RANGES_MAX, DEFAULT_SVC_STATS_MAX,
    },
    revnat::{
        RevNat4, RevNat6, SockRevNat4Key, SockRevNat4Value, SockRevNat6Key, SockRevNat6Value,
    },
    service::{Service4Key, Service6Key, ServiceValue, SourceRange4, SourceRange6},
    sock::{sock_tcp_slots, SockTcpSlot},
    stats::ServiceStats,
};

/// Agent-written maps are not preallocated: memory follows use, so capacities
/// can be generous. (`--preallocate-maps` has the agent make the services,
/// backends and reverse-NAT maps preallocated before this object is loaded.)
/// Either way a deleted or replaced element may be handed out again at once:
/// since Linux 6.1 non-preallocated hash maps allocate from bpf_mem_alloc,
/// which reuses a freed element without waiting for an RCU grace period
/// (commit 0fd7c5d43339), so programs copy a value right after its lookup.
const BPF_F_NO_PREALLOC: u32 = 1;

#[map]
pub static LB4_SERVICES: HashMap<Service4Key, ServiceValue> =
    HashMap::pinned(DEFAULT_SERVICES_MAX, BPF_F_NO_PREALLOC);

#[map]
pub static LB4_BACKENDS: HashMap<u32, Backend4> =
    HashMap::pinned(DEFAULT_BACKENDS_MAX, BPF_F_NO_PREALLOC);

#[map]
pub static LB4_REVNAT: HashMap<u32, RevNat4> =
    HashMap::pinned(DEFAULT_REVNAT_MAX, BPF_F_NO_PREALLOC);

/// Written by the programs themselves; LRU so entries of closed sockets age out.
#[map]
pub static LB4_SOCK_REVNAT: LruHashMap<SockRevNat4Key, SockRevNat4Value> =
    LruHashMap::pinned(DEFAULT_SOCK_REVNAT_MAX, 0);

#[map]
pub static LB6_SERVICES: HashMap<Service6Key, ServiceValue> =
    HashMap::pinned(DEFAULT_SERVICES_MAX, BPF_F_NO_PREALLOC);

#[map]
pub static LB6_BACKENDS: HashMap<u32, Backend6> =
    HashMap::pinned(DEFAULT_BACKENDS_MAX, BPF_F_NO_PREALLOC);

#[map]
pub static LB6_REVNAT: HashMap<u32, RevNat6> =
    HashMap::pinned(DEFAULT_REVNAT_MAX, BPF_F_NO_PREALLOC);

#[map]
pub static LB6_SOCK_REVNAT: LruHashMap<SockRevNat6Key, SockRevNat6Value> =
    LruHashMap::pinned(DEFAULT_SOCK_REVNAT_MAX, 0);

#[map]
pub static LB_DROPS: PerCpuArray<u64> = PerCpuArray::pinned(DROP_SLOTS, 0);

/// Drop and trace events for `lbctl monitor` (rate-limited per CPU).
#[map]
pub static LB_EVENTS: RingBuf = RingBuf::pinned(EVENTS_RING_BYTES, 0);

/// Run-time settings written by the agent and lbctl (`lb_common::config`).
#[map]
pub static LB_CONFIG: Array<u32> = Array::pinned(CONFIG_SLOTS, 0);

/// Per-CPU counters that are not drops (`lb_common::config::CNT_*`).
#[map]
pub static LB_COUNTERS: PerCpuArray<u64> = PerCpuArray::pinned(COUNTER_SLOTS, 0);

/// Per-CPU token buckets: slot 0 limits events, slot 1 the ICMP errors the
/// packet path sends.
#[map]
pub static LB_EVENT_RATE: PerCpuArray<RateState> = PerCpuArray::pinned(2, 0);

/// sessionAffinity: ClientIP memory, written by the programs.
#[map]
pub static LB_AFFINITY: LruHashMap<AffinityKey, AffinityValue> =
    LruHashMap::pinned(DEFAULT_AFFINITY_MAX, 0);

/// loadBalancerSourceRanges of LoadBalancer frontends (service id + client
/// CIDR), written by the agent. (The constructor adds BPF_F_NO_PREALLOC,
/// which the kernel demands of an LPM trie.)
#[map]
pub static LB4_SRC_RANGES: LpmTrie<SourceRange4, u8> =
    LpmTrie::pinned(DEFAULT_SOURCE_RANGES_MAX, 0);

/// loadBalancerSourceRanges of IPv6 LoadBalancer frontends.
#[map]
pub static LB6_SRC_RANGES: LpmTrie<SourceRange6, u8> =
    LpmTrie::pinned(DEFAULT_SOURCE_RANGES_MAX, 0);

/// One bit per IPv4 frontend (address, port): see `lb_common::filter`.
/// An array: the verifier inlines its lookups, a few instructions each.
#[map]
pub static LB4_FE_FILTER: Array<u64> = Array::pinned(FILTER_WORDS, 0);

/// A flag per slot of backends that sockets were indexed under in
/// LB4/6_SOCK_REVNAT: see `lb_common::filter::sock_filter_slot`.
#[map]
pub static LB_SOCK_FILTER: Array<u8> = Array::pinned(SOCK_FILTER_SLOTS, 0);

/// Translated TCP sockets by cookie slot: see `lb_common::sock::SockTcpSlot`.
#[map]
pub static LB_SOCK_TCP: Array<SockTcpSlot> =
    Array::pinned(sock_tcp_slots(DEFAULT_SOCK_REVNAT_MAX), 0);

/// A flag per slot of socket cookies that may be indexed in
/// LB4/6_SOCK_REVNAT: see `lb_common::filter::sock_cookie_slot`.
#[map]
pub static LB_SOCK_COOKIES: Array<u8> = Array::pinned(SOCK_COOKIE_SLOTS, 0);

/// The backends' generation (one slot): the agent moves it on after every
/// backend it deletes (`lb_common::conntrack::next_backends_gen`) and at
/// every start. A known flow whose entry saw its backend in this
/// generation skips the backend lookup (`packet::known_flow`).
#[map]
pub static LB_BACKENDS_GEN: Array<u32> = Array::pinned(1, 0);

/// Traffic per frontend (`lb_common::stats`): service id → this CPU's
/// counts, entries made and deleted by the agent with the frontend's
/// reverse-NAT entry (not preallocated: memory follows the frontends).
#[map]
pub static LB_SVC_STATS: PerCpuHashMap<u32, ServiceStats> =
    PerCpuHashMap::pinned(DEFAULT_SVC_STATS_MAX, BPF_F_NO_PREALLOC);

/// sessionAffinity: service id → the id its clients' memory is kept under,
/// shared by the frontends of one service port; written by the agent.
#[map]
pub static LB_AFFINITY_GROUP: HashMap<u32, u32> =
    HashMap::pinned(DEFAULT_SERVICES_MAX, BPF_F_NO_PREALLOC);

/// (service, backend) pairs a service may currently select, written by the agent.
#[map]
pub static LB_AFFINITY_MATCH: HashMap<AffinityMatchKey, u8> =
    HashMap::pinned(DEFAULT_SERVICES_MAX, BPF_F_NO_PREALLOC);

/// North-south conntrack (tc / XDP), written by the programs.
#[map]
pub static LB4_CT: LruHashMap<Ct4Key, Ct4Value> = LruHashMap::pinned(DEFAULT_CT_MAX, 0);

/// First fragments' ports, for the later fragments of the same datagram.
#[map]
pub static LB4_FRAGS: LruHashMap<Frag4Key, Frag4Value> = LruHashMap::pinned(DEFAULT_FRAGS_MAX, 0);

/// The node's external devices: ifindex → address used for SNAT.
#[map]
pub static LB_DEVICES: HashMap<u32, Device> = HashMap::pinned(DEFAULT_DEVICES_MAX, 0);

/// IPv6 north-south conntrack (tc / XDP), written by the programs.
#[map]
pub static LB6_CT: LruHashMap<Ct6Key, Ct6Value> = LruHashMap::pinned(DEFAULT_CT_MAX, 0);

/// The node's external devices with a global IPv6 address: ifindex → that
/// address, the SNAT source of IPv6 flows leaving it.
#[map]
pub static LB6_DEVICES: HashMap<u32, Device6> = HashMap::pinned(DEFAULT_DEVICES_MAX, 0);

/// BPF_F_INNER_MAP: inner tables may have any size (the configured M), and a
/// table is replaced by swapping the inner map (one atomic update).
const BPF_F_INNER_MAP: usize = 1 << 12;

/// Maglev lookup tables: service id → array of M backend ids. Pinned by the
/// loader (map_pin_path), as BTF map definitions carry no pinning here.
#[btf_map]
pub static LB_MAGLEV: btf_maps::HashOfMaps<
    u32,
    btf_maps::Array<u32, 1, BPF_F_INNER_MAP>,
    { DEFAULT_MAGLEV_MAX as usize },
> = btf_maps::HashOfMaps::new();

/// Per-CPU scratch space of the tc and XDP programs, one per address family
/// (not pinned: nothing in it outlives one packet).
#[map]
pub static LB_SCRATCH: PerCpuArray<crate::packet::Scratch<crate::select::V4>> =
    PerCpuArray::with_max_entries(1, 0);

#[map]
pub static LB_SCRATCH6: PerCpuArray<crate::packet::Scratch<crate::select::V6>> =
    PerCpuArray::with_max_entries(1, 0);

/// Per-CPU route caches of the tc and XDP programs (`packet::route_cache`;
/// not pinned: a cache, empty after every load).
#[map]
pub static LB_ROUTES4: PerCpuArray<crate::packet::route_cache::CachedRoute<u32>> =
    PerCpuArray::with_max_entries(crate::packet::route_cache::ROUTE_CACHE_SLOTS, 0);

#[map]
pub static LB_ROUTES6: PerCpuArray<crate::packet::route_cache::CachedRoute<Addr6>> =
    PerCpuArray::with_max_entries(crate::packet::route_cache::ROUTE_CACHE_SLOTS, 0);
