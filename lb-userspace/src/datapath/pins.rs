//! Where things are pinned, and checks that pinned maps fit this build.
use std::{
    mem::size_of,
    path::{Path, PathBuf},
};

use anyhow::bail;
use aya::maps::MapData;
use lb_common::{
    affinity::{AffinityKey, AffinityMatchKey, AffinityValue},
    backend::{Backend4, Backend6},
    config::{RateState, CONFIG_SLOTS, COUNTER_SLOTS},
    drop::DROP_SLOTS,
    event::EVENTS_RING_BYTES,
    maps as names,
    nodeport::{Ct4Key, Ct4Value, Device, Frag4Key, Frag4Value},
    revnat::{
        RevNat4, RevNat6, SockRevNat4Key, SockRevNat4Value, SockRevNat6Key, SockRevNat6Value,
    },
    service::{Service4Key, Service6Key, ServiceValue, SourceRange4},
};

/// Default pin directory; the layout version is part of the path because the
/// kernel reuses a pin without checking its key and value sizes.
pub fn default_pin_dir() -> PathBuf {
    PathBuf::from(format!("/sys/fs/bpf/lb/v{}", names::LAYOUT_VERSION))
}

/// Whether an agent has pinned its maps in `pin_dir` before (the data path
/// holds a state that a restart keeps serving).
pub fn has_state(pin_dir: &Path) -> bool {
    pin_dir.join(names::LB4_SERVICES).exists()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    pub services: u32,
    pub backends: u32,
    pub revnat: u32,
    pub sock_revnat: u32,
    /// LB_AFFINITY: remembered (client, service) choices.
    pub affinity: u32,
    /// LB4_CT: north-south flows (each uses one to two entries).
    pub ct: u32,
    /// LB_MAGLEV: services with a Maglev table.
    pub maglev: u32,
    /// LB4_SRC_RANGES: loadBalancerSourceRanges entries of all frontends.
    pub source_ranges: u32,
}

impl Default for MapSizes {
    fn default() -> Self {
        Self {
            services: names::DEFAULT_SERVICES_MAX,
            backends: names::DEFAULT_BACKENDS_MAX,
            revnat: names::DEFAULT_REVNAT_MAX,
            sock_revnat: names::DEFAULT_SOCK_REVNAT_MAX,
            affinity: names::DEFAULT_AFFINITY_MAX,
            ct: names::DEFAULT_CT_MAX,
            maglev: names::DEFAULT_MAGLEV_MAX,
            source_ranges: names::DEFAULT_SOURCE_RANGES_MAX,
        }
    }
}

impl MapSizes {
    /// Map name → capacity; both families get the same sizes.
    pub fn entries(&self) -> [(&'static str, u32); 13] {
        [
            (names::LB4_SERVICES, self.services),
            (names::LB4_BACKENDS, self.backends),
            (names::LB4_REVNAT, self.revnat),
            (names::LB4_SOCK_REVNAT, self.sock_revnat),
            (names::LB6_SERVICES, self.services),
            (names::LB6_BACKENDS, self.backends),
            (names::LB6_REVNAT, self.revnat),
            (names::LB6_SOCK_REVNAT, self.sock_revnat),
            (names::LB_AFFINITY, self.affinity),
            (names::LB_AFFINITY_MATCH, self.services),
            (names::LB4_CT, self.ct),
            (names::LB_MAGLEV, self.maglev),
            (names::LB4_SRC_RANGES, self.source_ranges),
        ]
    }
}

pub struct PinLayout {
    dir: PathBuf,
}

impl PinLayout {
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
        }
    }

    pub fn map(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn links_dir(&self) -> PathBuf {
        self.dir.join("links")
    }

    pub fn link(&self, hook: &str) -> PathBuf {
        self.links_dir().join(hook)
    }

    /// Checks every already pinned map against this build's layout and the
    /// requested sizes. Returns whether any map was pinned already.
    pub fn check_pinned_maps(&self, sizes: &MapSizes) -> anyhow::Result<bool> {
        let expected: [(&str, usize, usize, Option<u32>); 20] = [
            (
                names::LB4_SERVICES,
                size_of::<Service4Key>(),
                size_of::<ServiceValue>(),
                Some(sizes.services),
            ),
            (
                names::LB4_BACKENDS,
                size_of::<u32>(),
                size_of::<Backend4>(),
                Some(sizes.backends),
            ),
            (
                names::LB4_REVNAT,
                size_of::<u32>(),
                size_of::<RevNat4>(),
                Some(sizes.revnat),
            ),
            (
                names::LB4_SOCK_REVNAT,
                size_of::<SockRevNat4Key>(),
                size_of::<SockRevNat4Value>(),
                Some(sizes.sock_revnat),
            ),
            (
                names::LB6_SERVICES,
                size_of::<Service6Key>(),
                size_of::<ServiceValue>(),
                Some(sizes.services),
            ),
            (
                names::LB6_BACKENDS,
                size_of::<u32>(),
                size_of::<Backend6>(),
                Some(sizes.backends),
            ),
            (
                names::LB6_REVNAT,
                size_of::<u32>(),
                size_of::<RevNat6>(),
                Some(sizes.revnat),
            ),
            (
                names::LB6_SOCK_REVNAT,
                size_of::<SockRevNat6Key>(),
                size_of::<SockRevNat6Value>(),
                Some(sizes.sock_revnat),
            ),
            (
                names::LB_AFFINITY,
                size_of::<AffinityKey>(),
                size_of::<AffinityValue>(),
                Some(sizes.affinity),
            ),
            (
                names::LB_AFFINITY_MATCH,
                size_of::<AffinityMatchKey>(),
                size_of::<u8>(),
                Some(sizes.services),
            ),
            (
                names::LB4_CT,
                size_of::<Ct4Key>(),
                size_of::<Ct4Value>(),
                Some(sizes.ct),
            ),
            (
                names::LB_DEVICES,
                size_of::<u32>(),
                size_of::<Device>(),
                Some(names::DEFAULT_DEVICES_MAX),
            ),
            (
                names::LB_MAGLEV,
                size_of::<u32>(),
                size_of::<u32>(),
                Some(sizes.maglev),
            ),
            (
                names::LB4_SRC_RANGES,
                // The kernel's key: a 32-bit prefix length, then the data.
                size_of::<u32>() + size_of::<SourceRange4>(),
                size_of::<u8>(),
                Some(sizes.source_ranges),
            ),
            (
                names::LB_DROPS,
                size_of::<u32>(),
                size_of::<u64>(),
                Some(DROP_SLOTS),
            ),
            (names::LB_EVENTS, 0, 0, Some(EVENTS_RING_BYTES)),
            (
                names::LB_CONFIG,
                size_of::<u32>(),
                size_of::<u32>(),
                Some(CONFIG_SLOTS),
            ),
            (
                names::LB_COUNTERS,
                size_of::<u32>(),
                size_of::<u64>(),
                Some(COUNTER_SLOTS),
            ),
            (
                names::LB_EVENT_RATE,
                size_of::<u32>(),
                size_of::<RateState>(),
                Some(2),
            ),
            (
                names::LB4_FRAGS,
                size_of::<Frag4Key>(),
                size_of::<Frag4Value>(),
                Some(names::DEFAULT_FRAGS_MAX),
            ),
        ];
        let mut any = false;
        for (name, key, value, max) in expected {
            let path = self.map(name);
            if !path.exists() {
                continue;
            }
            any = true;
            let info = MapData::from_pin(&path)?.info()?;
            if info.key_size() as usize != key || info.value_size() as usize != value {
                bail!(
                    "pinned map {} has key/value sizes {}/{} but this build expects {key}/{value}: \
                     it was made by an incompatible version; run `lb-agent uninstall --pin-dir {}` first",
                    path.display(),
                    info.key_size(),
                    info.value_size(),
                    self.dir.display()
                );
            }
            if let Some(max) = max {
                if info.max_entries() != max {
                    bail!(
                        "pinned map {} holds {} entries but {max} were asked for: a pinned map cannot be resized; \
                         keep the old size, or run `lb-agent uninstall --pin-dir {}` and start again",
                        path.display(),
                        info.max_entries(),
                        self.dir.display()
                    );
                }
            }
        }
        Ok(any)
    }
}
