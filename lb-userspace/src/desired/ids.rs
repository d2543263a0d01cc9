//! Stable ids for frontends (service ids) and backends.
//!
//! An id lives as long as the thing it names: a frontend keeps its service id
//! and a backend its backend id across every update, so no update moves
//! existing traffic or changes what `lbctl` shows. Ids are restored from the
//! pinned maps when the agent restarts, and a freed id is not handed out
//! again until the id space wraps, so a stale reference (a socket's
//! reverse-NAT entry) never points at a different frontend.
use std::{hash::Hash, net::IpAddr};

use crate::collections::{HashMap, HashSet};

use crate::maps::{state::is_marker, BackendEntry, MapState, SvcKey};

#[derive(Debug, thiserror::Error)]
#[error("no free {kind} id left ({used} in use)")]
pub struct IdsExhausted {
    pub kind: &'static str,
    pub used: usize,
}

#[derive(Debug)]
struct IdTable<K> {
    kind: &'static str,
    by_key: HashMap<K, u32>,
    by_id: HashMap<u32, K>,
    next: u32,
    max: u32,
    /// Ids handed out since the last `begin`: a refused change gives back
    /// exactly these, in time proportional to the change, not to the table.
    fresh: Vec<u32>,
    /// Entries looked at, all operations together: what tests pin to keep
    /// the cost of a change proportional to the change.
    touched: u64,
}

impl<K: Hash + Eq + Copy> IdTable<K> {
    fn new(kind: &'static str, max: u32) -> Self {
        Self {
            kind,
            by_key: HashMap::default(),
            by_id: HashMap::default(),
            next: 1,
            max,
            fresh: Vec::new(),
            touched: 0,
        }
    }

    fn restore(&mut self, key: K, id: u32) {
        self.by_key.insert(key, id);
        self.by_id.insert(id, key);
        if id >= self.next {
            self.next = id.checked_add(1).filter(|n| *n <= self.max).unwrap_or(1);
        }
    }

    fn get_or_alloc(&mut self, key: K) -> Result<u32, IdsExhausted> {
        self.touched += 1;
        if let Some(id) = self.by_key.get(&key) {
            return Ok(*id);
        }
        if self.by_id.len() >= self.max as usize {
            return Err(IdsExhausted {
                kind: self.kind,
                used: self.by_id.len(),
            });
        }
        // 0 is never an id: it means "none" in the maps.
        while self.next == 0 || self.by_id.contains_key(&self.next) {
            self.next = if self.next >= self.max {
                1
            } else {
                self.next + 1
            };
        }
        let id = self.next;
        self.next = if id >= self.max { 1 } else { id + 1 };
        self.by_key.insert(key, id);
        self.by_id.insert(id, key);
        self.fresh.push(id);
        Ok(id)
    }

    fn rollback(&mut self) -> usize {
        let n = self.fresh.len();
        for id in std::mem::take(&mut self.fresh) {
            self.release(id);
        }
        n
    }

    fn release(&mut self, id: u32) {
        self.touched += 1;
        if let Some(key) = self.by_id.remove(&id) {
            self.by_key.remove(&key);
        }
    }

    fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.touched += (self.by_id.len() + self.by_key.len()) as u64;
        self.by_id.retain(|id, _| keep(*id));
        let by_id = &self.by_id;
        self.by_key.retain(|_, id| by_id.contains_key(id));
    }

    fn get(&self, key: &K) -> Option<u32> {
        self.by_key.get(key).copied()
    }
}

/// Identity of a frontend: address, port, protocol, scope.
pub type FrontendKey = (IpAddr, u16, u8, u8);
/// Identity of a backend: address, port, protocol. One id space for both
/// families (the kernel keeps them in LB4_BACKENDS and LB6_BACKENDS).
pub type BackendKey = (IpAddr, u16, u8);

pub fn frontend_key(k: &SvcKey) -> FrontendKey {
    (k.address, k.port, k.proto, k.scope)
}

pub fn backend_key(b: &BackendEntry) -> BackendKey {
    (b.address, b.port, b.proto)
}

#[derive(Debug)]
pub struct Ids {
    services: IdTable<FrontendKey>,
    backends: IdTable<BackendKey>,
}

impl Default for Ids {
    fn default() -> Self {
        Self::with_limits(u32::MAX - 1, u32::MAX - 1)
    }
}

impl Ids {
    pub fn with_limits(max_service_id: u32, max_backend_id: u32) -> Self {
        Self {
            services: IdTable::new("service", max_service_id),
            backends: IdTable::new("backend", max_backend_id),
        }
    }

    /// Takes over the ids found in the maps.
    pub fn restore(&mut self, state: &MapState) {
        for (k, v) in &state.services {
            if k.slot == 0 && !is_marker(k, v) {
                self.services.restore(frontend_key(k), v.service_id);
            }
        }
        for (id, b) in &state.backends {
            self.backends.restore(backend_key(b), *id);
        }
    }

    pub fn service_id(&mut self, key: &SvcKey) -> Result<u32, IdsExhausted> {
        self.services.get_or_alloc(frontend_key(key))
    }

    pub fn backend_id(&mut self, b: &BackendEntry) -> Result<u32, IdsExhausted> {
        self.backends.get_or_alloc(backend_key(b))
    }

    pub fn lookup_service(&self, key: &SvcKey) -> Option<u32> {
        self.services.get(&frontend_key(key))
    }

    pub fn release_service(&mut self, id: u32) {
        self.services.release(id);
    }

    pub fn release_backend(&mut self, id: u32) {
        self.backends.release(id);
    }

    /// Id-table entries looked at so far (a cost measure for tests).
    pub fn touched(&self) -> u64 {
        self.services.touched + self.backends.touched
    }

    /// Starts a change: ids handed out from now on are given back by
    /// `rollback` unless the change is kept (`begin` again).
    pub fn begin(&mut self) {
        self.services.fresh.clear();
        self.backends.fresh.clear();
    }

    /// Gives back the ids handed out since `begin` (the change was refused,
    /// nothing of it reached the maps). Returns how many: the cost is that,
    /// whatever the size of the tables.
    pub fn rollback(&mut self) -> usize {
        self.services.rollback() + self.backends.rollback()
    }

    /// Forgets ids allocated for changes that were never applied (a scan of
    /// every id: after a failed write or a full sync, never per service).
    pub fn retain_applied(&mut self, state: &MapState) {
        let live: HashSet<u32> = state.frontends().map(|(_, v)| v.service_id).collect();
        self.services.retain(|id| live.contains(&id));
        self.backends.retain(|id| state.backends.contains_key(&id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(port: u16) -> SvcKey {
        SvcKey::new("10.96.0.10".parse().unwrap(), port, 6, 0)
    }

    #[test]
    fn same_key_same_id() {
        let mut ids = Ids::default();
        let a = ids.service_id(&key(80)).unwrap();
        let b = ids.service_id(&key(443)).unwrap();
        assert_ne!(a, b);
        assert_eq!(ids.service_id(&key(80)).unwrap(), a);
    }

    #[test]
    fn freed_ids_are_not_reused_before_wrapping() {
        let mut ids = Ids::default();
        let a = ids.service_id(&key(1)).unwrap();
        ids.release_service(a);
        let b = ids.service_id(&key(2)).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn rollback_gives_back_only_the_ids_of_the_refused_change() {
        let mut ids = Ids::default();
        ids.begin();
        let kept = ids.service_id(&key(1)).unwrap();
        ids.begin(); // the first change was kept
        let refused = ids.service_id(&key(2)).unwrap();
        assert_eq!(
            ids.service_id(&key(1)).unwrap(),
            kept,
            "an existing id is not fresh"
        );
        assert_eq!(
            ids.rollback(),
            1,
            "one id to give back, whatever the table holds"
        );
        assert_eq!(ids.lookup_service(&key(2)), None);
        assert_eq!(ids.lookup_service(&key(1)), Some(kept));
        assert_ne!(
            ids.service_id(&key(2)).unwrap(),
            refused,
            "not reused before wrapping"
        );
    }

    #[test]
    fn allocation_wraps_and_skips_used_ids() {
        let mut ids = Ids::with_limits(3, 3);
        let a = ids.service_id(&key(1)).unwrap();
        let b = ids.service_id(&key(2)).unwrap();
        let c = ids.service_id(&key(3)).unwrap();
        assert_eq!((a, b, c), (1, 2, 3));
        assert!(ids.service_id(&key(4)).is_err(), "space exhausted");
        ids.release_service(b);
        assert_eq!(ids.service_id(&key(4)).unwrap(), 2);
    }
}
