//! Map names (also their pin names) and default capacities.
//!
//! A pin has the whole name; the kernel keeps only the first
//! `BPF_OBJ_NAME_LEN - 1` (15) bytes as the map's own name (what bpftool
//! shows), so names differ within those (a catalog test checks it).

pub const LB4_SERVICES: &str = "LB4_SERVICES";
pub const LB4_BACKENDS: &str = "LB4_BACKENDS";
pub const LB4_REVNAT: &str = "LB4_REVNAT";
pub const LB4_SOCK_REVNAT: &str = "LB4_SOCK_REVNAT";
pub const LB6_SERVICES: &str = "LB6_SERVICES";
pub const LB6_BACKENDS: &str = "LB6_BACKENDS";
pub const LB6_REVNAT: &str = "LB6_REVNAT";
pub const LB6_SOCK_REVNAT: &str = "LB6_SOCK_REVNAT";
pub const LB_DROPS: &str = "LB_DROPS";
pub const LB_EVENTS: &str = "LB_EVENTS";
pub const LB_CONFIG: &str = "LB_CONFIG";
pub const LB_COUNTERS: &str = "LB_COUNTERS";
pub const LB_EVENT_RATE: &str = "LB_EVENT_RATE";
pub const LB_AFFINITY: &str = "LB_AFFINITY";
pub const LB_AFFINITY_MATCH: &str = "LB_AFFINITY_MATCH";
pub const LB_AFFINITY_GROUP: &str = "LB_AFFINITY_GROUP";
pub const LB4_CT: &str = "LB4_CT";
pub const LB_DEVICES: &str = "LB_DEVICES";
pub const LB6_CT: &str = "LB6_CT";
pub const LB6_DEVICES: &str = "LB6_DEVICES";
pub const LB_MAGLEV: &str = "LB_MAGLEV";
pub const LB4_FRAGS: &str = "LB4_FRAGS";
pub const LB_SOCK_UDP: &str = "LB_SOCK_UDP";
pub const LB_SOCK_PEERS: &str = "LB_SOCK_PEERS";
pub const LB_SOCK_FILTER: &str = "LB_SOCK_FILTER";
pub const LB_SOCK_COOKIES: &str = "LB_SOCK_COOKIES";
pub const LB_SOCK_TCP: &str = "LB_SOCK_TCP";
pub const LB4_SRC_RANGES: &str = "LB4_SRC_RANGES";
pub const LB6_SRC_RANGES: &str = "LB6_SRC_RANGES";
pub const LB4_FE_FILTER: &str = "LB4_FE_FILTER";
pub const LB_BACKENDS_GEN: &str = "LB_BACKENDS_GEN";
pub const LB_SVC_STATS: &str = "LB_SVC_STATS";

/// Names that say the wrong family, renamed with the next layout version
/// (a pin's name is what a running data path and a rollback open, so it
/// changes only with `LAYOUT_VERSION`): the frontend filter holds both
/// families' frontends, and the devices map holds IPv4 addresses only.
/// Every pinned map, its type and family, is listed in the agent's catalog
/// (lb-userspace/src/maps/catalog.rs).
pub const RENAME_AT_NEXT_LAYOUT: [(&str, &str); 2] =
    [(LB4_FE_FILTER, "LB_FE_FILTER"), (LB_DEVICES, "LB4_DEVICES")];

/// Default capacities, per address family. The agent can change them at load
/// time (`--map-size-*`).
pub const DEFAULT_SERVICES_MAX: u32 = 65_536;
pub const DEFAULT_BACKENDS_MAX: u32 = 65_536;
pub const DEFAULT_REVNAT_MAX: u32 = 65_536;
pub const DEFAULT_SOCK_REVNAT_MAX: u32 = 262_144;
pub const DEFAULT_AFFINITY_MAX: u32 = 65_536;
pub const DEFAULT_CT_MAX: u32 = 262_144;
pub const DEFAULT_DEVICES_MAX: u32 = 64;
/// IPv4 datagrams in fragments being followed at once (LRU).
pub const DEFAULT_FRAGS_MAX: u32 = 8_192;
/// loadBalancerSourceRanges entries (CIDR per LoadBalancer frontend).
pub const DEFAULT_SOURCE_RANGES_MAX: u32 = 16_384;
/// Services that can use Maglev at once (the outer map of LB_MAGLEV).
pub const DEFAULT_MAGLEV_MAX: u32 = 16_384;
/// Frontends whose traffic is counted (`LB_SVC_STATS`): both families'
/// frontends, each family's services map holding up to `DEFAULT_SERVICES_MAX`.
pub const DEFAULT_SVC_STATS_MAX: u32 = 2 * DEFAULT_SERVICES_MAX;
/// Default Maglev table size: a prime, about 100 × a typical backend count
/// (the paper's M ≥ 100·N keeps the imbalance within a few percent).
pub const DEFAULT_MAGLEV_M: u32 = 16_381;
/// Maglev table sizes the agent accepts (primes, as the construction needs).
/// Append only: a master entry names its table's size by its place here
/// (`maglev_size_code`), in maps that outlive the agent.
pub const MAGLEV_PRIMES: [u32; 11] = [
    251, 509, 1_021, 2_039, 4_093, 8_191, 16_381, 32_749, 65_521, 65_537, 131_071,
];

/// The code of table size `m` in a master's `ServiceValue::maglev_size`:
/// 1 + its place in `MAGLEV_PRIMES` (one byte names every size).
pub const fn maglev_size_code(m: u32) -> Option<u8> {
    let mut i = 0;
    while i < MAGLEV_PRIMES.len() {
        if MAGLEV_PRIMES[i] == m {
            return Some(i as u8 + 1);
        }
        i += 1;
    }
    None
}

/// The table size a `maglev_size` code names; None for 0 (the master
/// predates per-service sizes: `CFG_MAGLEV_M` holds it) and for codes
/// past the list.
#[inline(always)]
pub fn maglev_size_of(code: u8) -> Option<u32> {
    // `get`, not an index: no panic path for the verifier to refuse (code
    // 0 wraps to an index past the end).
    MAGLEV_PRIMES
        .get(usize::from(code).wrapping_sub(1))
        .copied()
}

/// Version of the map layout; part of the pin directory (`/sys/fs/bpf/lb/v<LAYOUT_VERSION>`).
/// Bump it on any change to a key or value type in this crate.
pub const LAYOUT_VERSION: u32 = 2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_maglev_size_has_a_code_that_names_it_back_and_zero_names_none() {
        for (i, m) in MAGLEV_PRIMES.iter().enumerate() {
            let code = maglev_size_code(*m).unwrap();
            assert_eq!(code as usize, i + 1);
            assert_eq!(maglev_size_of(code), Some(*m));
        }
        assert_eq!(maglev_size_code(16_380), None, "not a listed prime");
        assert_eq!(maglev_size_of(0), None, "0: the agent-wide size");
        assert_eq!(maglev_size_of(MAGLEV_PRIMES.len() as u8 + 1), None);
    }
}
