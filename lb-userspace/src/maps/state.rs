//! `MapState`: the contents of the agent-written maps, plus indexes derived
//! from them (backend references, ClusterIP addresses) kept up to date on
//! every operation so a diff never has to scan the whole table.
use std::collections::HashMap;

use lb_common::{
    backend::Backend4,
    revnat::RevNat4,
    service::{Service4Key, ServiceValue, SCOPE_ALL, SVC_FLAG_CLUSTER_IP, SVC_FLAG_VIP_MARKER},
};

use super::MapOp;

#[derive(Clone, Debug, Default)]
pub struct MapState {
    pub services: HashMap<Service4Key, ServiceValue>,
    pub backends: HashMap<u32, Backend4>,
    pub revnat: HashMap<u32, RevNat4>,
    /// backend id → number of slots naming it.
    backend_refs: HashMap<u32, u32>,
    /// address → number of ClusterIP frontends on it (the VIP marker's users).
    vip_refs: HashMap<u32, u32>,
}

impl PartialEq for MapState {
    /// Equal contents; the indexes follow from them.
    fn eq(&self, other: &Self) -> bool {
        self.services == other.services && self.backends == other.backends && self.revnat == other.revnat
    }
}
impl Eq for MapState {}

/// The marker entry that says "this address is a ClusterIP".
pub fn vip_marker_key(address: u32) -> Service4Key {
    Service4Key::new(address, 0, 0, SCOPE_ALL, 0)
}

pub fn is_marker(key: &Service4Key, value: &ServiceValue) -> bool {
    key.backend_slot == 0 && key.dport == 0 && key.proto == 0 && value.flags & SVC_FLAG_VIP_MARKER != 0
}

fn counts_as_vip(key: &Service4Key, value: &ServiceValue) -> bool {
    key.backend_slot == 0 && key.scope == SCOPE_ALL && value.flags & SVC_FLAG_CLUSTER_IP != 0 && !is_marker(key, value)
}

impl MapState {
    pub fn from_entries(
        services: impl IntoIterator<Item = (Service4Key, ServiceValue)>,
        backends: impl IntoIterator<Item = (u32, Backend4)>,
        revnat: impl IntoIterator<Item = (u32, RevNat4)>,
    ) -> Self {
        let mut state = MapState::default();
        for (k, v) in services {
            state.apply(&MapOp::UpsertService(k, v));
        }
        for (id, b) in backends {
            state.apply(&MapOp::UpsertBackend(id, b));
        }
        for (id, r) in revnat {
            state.apply(&MapOp::UpsertRevNat(id, r));
        }
        state
    }

    pub fn apply(&mut self, op: &MapOp) {
        match *op {
            MapOp::UpsertBackend(id, b) => {
                self.backends.insert(id, b);
            }
            MapOp::DeleteBackend(id) => {
                self.backends.remove(&id);
            }
            MapOp::UpsertRevNat(id, r) => {
                self.revnat.insert(id, r);
            }
            MapOp::DeleteRevNat(id) => {
                self.revnat.remove(&id);
            }
            MapOp::UpsertService(k, v) => {
                if let Some(old) = self.services.insert(k, v) {
                    self.unindex(&k, &old);
                }
                self.index(&k, &v);
            }
            MapOp::DeleteService(k) => {
                if let Some(old) = self.services.remove(&k) {
                    self.unindex(&k, &old);
                }
            }
        }
    }

    fn index(&mut self, k: &Service4Key, v: &ServiceValue) {
        if k.backend_slot > 0 {
            *self.backend_refs.entry(v.backend_id).or_default() += 1;
        } else if counts_as_vip(k, v) {
            *self.vip_refs.entry(k.address).or_default() += 1;
        }
    }

    fn unindex(&mut self, k: &Service4Key, v: &ServiceValue) {
        let (map, key) = if k.backend_slot > 0 {
            (&mut self.backend_refs, v.backend_id)
        } else if counts_as_vip(k, v) {
            (&mut self.vip_refs, k.address)
        } else {
            return;
        };
        if let Some(n) = map.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                map.remove(&key);
            }
        }
    }

    pub fn backend_refs(&self, id: u32) -> u32 {
        self.backend_refs.get(&id).copied().unwrap_or(0)
    }

    pub fn vip_refs(&self, address: u32) -> u32 {
        self.vip_refs.get(&address).copied().unwrap_or(0)
    }

    pub fn has_marker(&self, address: u32) -> bool {
        let k = vip_marker_key(address);
        self.services.get(&k).is_some_and(|v| is_marker(&k, v))
    }

    /// Master entries of real frontends (not VIP markers).
    pub fn frontends(&self) -> impl Iterator<Item = (&Service4Key, &ServiceValue)> {
        self.services.iter().filter(|(k, v)| k.backend_slot == 0 && !is_marker(k, v))
    }

    /// Backend ids in slot order (active first, then terminating).
    pub fn slots_of(&self, master: &Service4Key) -> Vec<u32> {
        let Some(m) = self.services.get(master) else {
            return Vec::new();
        };
        let total = m.count as u32 + m.terminating_count as u32;
        (1..=total)
            .filter_map(|slot| self.services.get(&master.with_slot(slot as u16)).map(|v| v.backend_id))
            .collect()
    }
}
