//! Which maps the agent can fill, and how full they are: one table read by
//! both the reconciler (which refuses a change that cannot fit, before
//! writing anything) and the fake maps (which refuse what the kernel would,
//! E2BIG, so tests meet the same limits as the real maps).
use lb_common::{filter::FILTER_WORDS, maps as names};

use super::{
    catalog::{spec_of, MapSpec},
    Family, MapOp, MapSizes, MapState, SizeFlag,
};

/// A map with a fixed number of entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Bounded {
    Services(Family),
    Backends(Family),
    RevNat(Family),
    Maglev,
    AffinityMatch,
    AffinityGroup,
    /// LB4_SRC_RANGES and LB6_SRC_RANGES, each of the same size, counted
    /// together (the state keeps one count): refused early, never late.
    SourceRanges,
}

impl Bounded {
    /// In the order the reconciler reports the first full one: a family's
    /// maps together, IPv4 first.
    pub const ALL: [Bounded; 10] = [
        Bounded::Services(Family::V4),
        Bounded::Backends(Family::V4),
        Bounded::RevNat(Family::V4),
        Bounded::Services(Family::V6),
        Bounded::Backends(Family::V6),
        Bounded::RevNat(Family::V6),
        Bounded::Maglev,
        Bounded::AffinityMatch,
        Bounded::AffinityGroup,
        Bounded::SourceRanges,
    ];

    pub fn map(self) -> &'static str {
        match self {
            Bounded::Services(f) => f.names().services,
            Bounded::Backends(f) => f.names().backends,
            Bounded::RevNat(f) => f.names().revnat,
            Bounded::Maglev => names::LB_MAGLEV,
            Bounded::AffinityMatch => names::LB_AFFINITY_MATCH,
            Bounded::AffinityGroup => names::LB_AFFINITY_GROUP,
            Bounded::SourceRanges => "LB4_SRC_RANGES and LB6_SRC_RANGES",
        }
    }

    /// The map the catalog sizes it as (both source-range maps have the
    /// same size).
    fn sized_as(self) -> &'static str {
        match self {
            Bounded::SourceRanges => names::LB4_SRC_RANGES,
            other => other.map(),
        }
    }

    /// The agent flag that sizes it (the catalog's).
    pub fn flag(self) -> &'static str {
        spec_of(self.sized_as())
            .and_then(MapSpec::size_flag)
            .map_or("(a fixed size)", SizeFlag::flag)
    }

    /// How many entries it holds at most with `sizes` (the catalog's).
    pub fn max(self, sizes: &MapSizes) -> u32 {
        spec_of(self.sized_as())
            .and_then(|m| m.max_entries(sizes))
            .unwrap_or(0)
    }

    /// Entries it holds in `state`.
    pub fn len(self, state: &MapState) -> usize {
        match self {
            Bounded::Services(f) => state.counts(f).0,
            Bounded::Backends(f) => state.counts(f).1,
            Bounded::RevNat(f) => state.counts(f).2,
            Bounded::Maglev => state.maglev.len(),
            Bounded::AffinityMatch => state.affinity_entries(),
            Bounded::AffinityGroup => state.affinity_groups.len(),
            Bounded::SourceRanges => state.source_range_entries(),
        }
    }

    /// The map `op` adds an entry to, if it adds one (an update of an
    /// existing entry takes no room).
    pub fn added_by(op: &MapOp, state: &MapState) -> Option<Bounded> {
        let new = match op {
            MapOp::UpsertService(k, _) => !state.services.contains_key(k),
            MapOp::UpsertBackend(id, _) => !state.backends.contains_key(id),
            MapOp::UpsertRevNat(id, _) => !state.revnat.contains_key(id),
            MapOp::SetMaglev(svc, _) => !state.maglev.contains_key(svc),
            MapOp::UpsertAffinityMatch(svc, b) => {
                !state.affinity.get(svc).is_some_and(|s| s.contains(b))
            }
            MapOp::SetAffinityGroup(svc, _) => !state.affinity_groups.contains_key(svc),
            MapOp::UpsertSourceRange(svc, r) => {
                !state.source_ranges.get(svc).is_some_and(|s| s.contains(r))
            }
            _ => false,
        };
        if !new {
            return None;
        }
        Some(match (op, op.family()) {
            (MapOp::UpsertService(..), Some(f)) => Bounded::Services(f),
            (MapOp::UpsertBackend(..), Some(f)) => Bounded::Backends(f),
            (MapOp::UpsertRevNat(..), Some(f)) => Bounded::RevNat(f),
            (MapOp::SetMaglev(..), _) => Bounded::Maglev,
            (MapOp::UpsertAffinityMatch(..), _) => Bounded::AffinityMatch,
            (MapOp::SetAffinityGroup(..), _) => Bounded::AffinityGroup,
            _ => Bounded::SourceRanges,
        })
    }
}

/// The first map (in `Bounded::ALL` order) that `ops` would fill past its
/// size, with the entries it would then need: what the reconciler refuses
/// a service for before writing any of it.
pub fn overfilled(ops: &[MapOp], state: &MapState, sizes: &MapSizes) -> Option<(Bounded, usize)> {
    let mut added = [0usize; Bounded::ALL.len()];
    for op in ops {
        if let Some(m) = Bounded::added_by(op, state) {
            if let Some(i) = Bounded::ALL.iter().position(|b| *b == m) {
                added[i] += 1;
            }
        }
    }
    Bounded::ALL
        .iter()
        .zip(added)
        .filter(|(_, n)| *n > 0)
        .map(|(m, n)| (*m, m.len(state) + n))
        .find(|(m, needed)| *needed > Bounded::max(*m, sizes) as usize)
}

/// An array write beyond the array (the kernel's E2BIG for an index past
/// max_entries).
pub fn out_of_range(op: &MapOp) -> bool {
    matches!(op, MapOp::SetFilterWord(i, _) if *i >= FILTER_WORDS)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{maps::fake::FakeMaps, maps::LbMaps as _};

    /// Every bounded map is sized by a flag in the catalog, and its limit
    /// is that flag's value (sizes that all differ, so a wrong flag shows).
    #[test]
    fn every_bounded_map_is_limited_by_the_flag_the_catalog_gives_it() {
        let mut sizes = MapSizes::default();
        for (i, f) in SizeFlag::ALL.iter().enumerate() {
            f.set(&mut sizes, 11 + u32::try_from(i).unwrap());
        }
        for m in Bounded::ALL {
            let flag = SizeFlag::ALL
                .into_iter()
                .find(|f| f.flag() == m.flag())
                .unwrap_or_else(|| panic!("{m:?} is sized by {}, not a flag", m.flag()));
            assert_eq!(m.max(&sizes), flag.get(&sizes), "{m:?}");
            for name in m.map().split(" and ") {
                let spec = spec_of(name).unwrap_or_else(|| panic!("{name} not in the catalog"));
                assert_eq!(
                    spec.max_entries(&sizes),
                    Some(m.max(&sizes)),
                    "{m:?} ({name})"
                );
            }
        }
        // What each is meant to be sized by, written out: a catalog row
        // pointing at another flag fails here.
        let expected = [
            "--map-size-services",
            "--map-size-backends",
            "--map-size-services",
            "--map-size-services",
            "--map-size-backends",
            "--map-size-services",
            "--map-size-maglev",
            "--map-size-services",
            "--map-size-services",
            "--map-size-source-ranges",
        ];
        let flags: Vec<&str> = Bounded::ALL.iter().map(|m| m.flag()).collect();
        assert_eq!(flags, expected);
    }

    #[test]
    fn the_fake_refuses_what_the_kernel_refuses() {
        let mut fake = FakeMaps::with_capacity(MapSizes {
            services: 1,
            ..MapSizes::default()
        });
        fake.apply(&MapOp::SetAffinityGroup(1, 1)).unwrap();
        // Updating an entry takes no room; a second one does not fit.
        fake.apply(&MapOp::SetAffinityGroup(1, 2)).unwrap();
        let e = fake.apply(&MapOp::SetAffinityGroup(2, 2)).unwrap_err();
        assert_eq!(e.source.raw_os_error(), Some(libc::E2BIG), "{e}");
        let e = fake
            .apply(&MapOp::SetFilterWord(FILTER_WORDS, 1))
            .unwrap_err();
        assert_eq!(e.source.raw_os_error(), Some(libc::E2BIG), "{e}");
        fake.apply(&MapOp::SetFilterWord(FILTER_WORDS - 1, 1))
            .unwrap();
        let e = fake
            .apply(&MapOp::SetMaglev(3, Arc::new(Vec::new())))
            .unwrap_err();
        assert_eq!(e.source.raw_os_error(), Some(libc::EINVAL), "{e}");
    }
}
