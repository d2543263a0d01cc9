//! How big the sized maps are: one field per `--map-size-*` flag. The
//! catalog (`super::catalog`) says which flag sizes which map, so a flag's
//! name, its field and the maps it sizes are written down once.
use lb_common::maps as names;

/// The capacity of every map a flag sizes; both families get the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    /// Frontend entries (masters and slots); also the reverse-NAT maps and
    /// the affinity match and group maps (a service has at least one entry).
    pub services: u32,
    pub backends: u32,
    /// Translated sockets remembered for their replies (UDP, getpeername).
    pub sock_revnat: u32,
    /// LB_AFFINITY: remembered (client, service) choices.
    pub affinity: u32,
    /// LB4_CT and LB6_CT, each: north-south flows (each uses one to two entries).
    pub ct: u32,
    /// LB_MAGLEV: services with a Maglev table.
    pub maglev: u32,
    /// LB4_SRC_RANGES and LB6_SRC_RANGES: loadBalancerSourceRanges entries
    /// of all frontends.
    pub source_ranges: u32,
    /// Make the services, backends and reverse-NAT maps preallocated
    /// (`--preallocate-maps`): their full capacity is reserved at creation,
    /// and a full sync's inserts cost the kernel about half as much.
    pub preallocate: bool,
}

impl Default for MapSizes {
    fn default() -> Self {
        Self {
            services: names::DEFAULT_SERVICES_MAX,
            backends: names::DEFAULT_BACKENDS_MAX,
            sock_revnat: names::DEFAULT_SOCK_REVNAT_MAX,
            affinity: names::DEFAULT_AFFINITY_MAX,
            ct: names::DEFAULT_CT_MAX,
            maglev: names::DEFAULT_MAGLEV_MAX,
            source_ranges: names::DEFAULT_SOURCE_RANGES_MAX,
            preallocate: false,
        }
    }
}

/// A `--map-size-*` flag: its name and its field of `MapSizes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SizeFlag {
    Services,
    Backends,
    SockRevNat,
    Affinity,
    Ct,
    Maglev,
    SourceRanges,
}

impl SizeFlag {
    pub const ALL: [SizeFlag; 7] = [
        SizeFlag::Services,
        SizeFlag::Backends,
        SizeFlag::SockRevNat,
        SizeFlag::Affinity,
        SizeFlag::Ct,
        SizeFlag::Maglev,
        SizeFlag::SourceRanges,
    ];

    /// The agent's flag, as `lb-agent run --help` spells it.
    pub const fn flag(self) -> &'static str {
        match self {
            SizeFlag::Services => "--map-size-services",
            SizeFlag::Backends => "--map-size-backends",
            SizeFlag::SockRevNat => "--map-size-sock-revnat",
            SizeFlag::Affinity => "--map-size-affinity",
            SizeFlag::Ct => "--map-size-ct",
            SizeFlag::Maglev => "--map-size-maglev",
            SizeFlag::SourceRanges => "--map-size-source-ranges",
        }
    }

    pub const fn get(self, sizes: &MapSizes) -> u32 {
        match self {
            SizeFlag::Services => sizes.services,
            SizeFlag::Backends => sizes.backends,
            SizeFlag::SockRevNat => sizes.sock_revnat,
            SizeFlag::Affinity => sizes.affinity,
            SizeFlag::Ct => sizes.ct,
            SizeFlag::Maglev => sizes.maglev,
            SizeFlag::SourceRanges => sizes.source_ranges,
        }
    }

    pub fn set(self, sizes: &mut MapSizes, value: u32) {
        let field = match self {
            SizeFlag::Services => &mut sizes.services,
            SizeFlag::Backends => &mut sizes.backends,
            SizeFlag::SockRevNat => &mut sizes.sock_revnat,
            SizeFlag::Affinity => &mut sizes.affinity,
            SizeFlag::Ct => &mut sizes.ct,
            SizeFlag::Maglev => &mut sizes.maglev,
            SizeFlag::SourceRanges => &mut sizes.source_ranges,
        };
        *field = value;
    }
}

impl MapSizes {
    /// Map name → capacity of every map a `--map-size-*` flag sizes (the
    /// catalog says which); both families get the same sizes.
    pub fn entries(&self) -> Vec<(&'static str, u32)> {
        super::catalog::CATALOG
            .iter()
            .filter(|m| m.size_flag().is_some())
            .filter_map(|m| Some((m.name, m.max_entries(self)?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_flag_reads_and_writes_its_own_field() {
        for (i, flag) in SizeFlag::ALL.iter().enumerate() {
            let mut sizes = MapSizes::default();
            let value = 1000 + u32::try_from(i).unwrap();
            flag.set(&mut sizes, value);
            assert_eq!(flag.get(&sizes), value, "{flag:?}");
            for other in SizeFlag::ALL.iter().filter(|o| *o != flag) {
                assert_ne!(other.get(&sizes), value, "{flag:?} wrote {other:?}'s field");
            }
        }
    }
}
