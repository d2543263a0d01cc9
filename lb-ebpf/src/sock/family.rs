//! What the socket hooks need per address family, so `forward` and
//! `reverse` are written once. Addresses travel as the four 32-bit words of
//! `bpf_sock_addr.user_ip6` (an IPv4 address in the first word, the rest
//! zero), the form the per-socket storage keeps.
use aya_ebpf::maps::LruHashMap;
use lb_common::Addr6;
use lb_common::{
    backend::{Backend4, Backend6},
    revnat::{SockRevNat4Key, SockRevNat4Value, SockRevNat6Key, SockRevNat6Value},
    service::{Service4Key, Service6Key, SCOPE_ALL},
    sock::SockPeer,
};

use super::lru_filter;
use crate::{
    maps::{LB4_REVNAT, LB4_SOCK_REVNAT, LB6_REVNAT, LB6_SOCK_REVNAT},
    select::{ServiceFamily, V4, V6},
};

/// A translation as the shared LRU (`LB4/6_SOCK_REVNAT`) keeps it.
#[derive(Clone, Copy)]
pub struct Translation {
    pub frontend: Addr6,
    pub frontend_port: u16,
    pub service_id: u32,
}

impl Translation {
    /// The translation a socket's storage or `LB_SOCK_TCP` entry holds.
    #[inline(always)]
    pub fn of(p: &SockPeer) -> Self {
        Self {
            frontend: p.frontend,
            frontend_port: p.frontend_port,
            service_id: p.service_id,
        }
    }

    /// As a socket's storage and `LB_SOCK_TCP` keep it: with the backend
    /// `backend:port` of family `family` it was sent to.
    #[inline(always)]
    pub fn peer(&self, family: u8, backend: Addr6, port: u16) -> SockPeer {
        SockPeer {
            backend,
            frontend: self.frontend,
            backend_port: port,
            frontend_port: self.frontend_port,
            service_id: self.service_id,
            family,
            pad: [0; 3],
        }
    }
}

pub trait SockFamily: ServiceFamily {
    /// 4 or 6, as events and `SockPeer::family` carry it.
    const FAMILY: u8;
    fn frontend_key(address: Addr6, port: u16, proto: u8) -> Self::Key;
    /// The backend's address and port.
    fn target(b: &Self::Backend) -> (Addr6, u16);
    /// The service's frontend as the agent wrote it (LB4/6_REVNAT).
    fn frontend_of(service_id: u32) -> Option<(Addr6, u16)>;
    fn lru_get(cookie: u64, backend: Addr6, port: u16) -> Option<Translation>;
    fn lru_put(cookie: u64, backend: Addr6, port: u16, t: &Translation) -> bool;
    /// Removes a socket's entry, if it has one. Nothing, not even the
    /// socket's cookie (`cookie` makes one if the socket has none), when no
    /// socket was ever indexed under a backend of this slot (`lru_filter`);
    /// nothing either when the socket's own cookie slot is clear; else a
    /// lock-free lookup first (`remove_if_present`). The cookie slot is
    /// left for the caller to clear (a UDP socket may have several entries).
    fn lru_remove(cookie: impl FnOnce() -> u64, backend: Addr6, port: u16);
}

#[inline(always)]
fn key4(cookie: u64, backend: Addr6, port: u16) -> SockRevNat4Key {
    SockRevNat4Key {
        cookie,
        address: backend[0],
        port,
        pad: 0,
    }
}

#[inline(always)]
fn key6(cookie: u64, backend: Addr6, port: u16) -> SockRevNat6Key {
    SockRevNat6Key {
        cookie,
        address: backend,
        port,
        pad: [0; 6],
    }
}

/// Deletes `key` only when a lock-free lookup finds it: the delete takes
/// the bucket's spinlock even when nothing is there (kernel/bpf/hashtab.c,
/// htab_lru_map_delete_elem).
#[inline(always)]
fn remove_if_present<K, V>(map: &LruHashMap<K, V>, key: &K) {
    // SAFETY: a lookup in our own map; only whether it found something is used.
    if unsafe { map.get(key) }.is_some() {
        let _ = map.remove(key);
    }
}

impl SockFamily for V4 {
    const FAMILY: u8 = 4;
    #[inline(always)]
    fn frontend_key(address: Addr6, port: u16, proto: u8) -> Service4Key {
        Service4Key::new(address[0], port, proto, SCOPE_ALL, 0)
    }
    #[inline(always)]
    fn target(b: &Backend4) -> (Addr6, u16) {
        ([b.address, 0, 0, 0], b.port)
    }
    #[inline(always)]
    fn frontend_of(service_id: u32) -> Option<(Addr6, u16)> {
        // SAFETY: a lookup in our own map, the value copied out at once.
        let r = unsafe { LB4_REVNAT.get(&service_id) }?;
        Some(([r.address, 0, 0, 0], r.port))
    }
    #[inline(always)]
    fn lru_get(cookie: u64, backend: Addr6, port: u16) -> Option<Translation> {
        // SAFETY: a lookup in our own map, the value copied out at once.
        let v = unsafe { LB4_SOCK_REVNAT.get(&key4(cookie, backend, port)) }?;
        Some(Translation {
            frontend: [v.address, 0, 0, 0],
            frontend_port: v.port,
            service_id: v.service_id,
        })
    }
    #[inline(always)]
    fn lru_put(cookie: u64, backend: Addr6, port: u16, t: &Translation) -> bool {
        let v = SockRevNat4Value {
            address: t.frontend[0],
            port: t.frontend_port,
            pad: 0,
            service_id: t.service_id,
        };
        lru_filter::note(lru_filter::slot(4, &backend, port));
        lru_filter::note_socket(cookie);
        LB4_SOCK_REVNAT
            .insert(&key4(cookie, backend, port), &v, 0)
            .is_ok()
    }
    #[inline(always)]
    fn lru_remove(cookie: impl FnOnce() -> u64, backend: Addr6, port: u16) {
        if !lru_filter::may_hold(lru_filter::slot(4, &backend, port)) {
            return;
        }
        let cookie = cookie();
        if lru_filter::socket_may_hold(cookie) {
            remove_if_present(&LB4_SOCK_REVNAT, &key4(cookie, backend, port));
        }
    }
}

impl SockFamily for V6 {
    const FAMILY: u8 = 6;
    #[inline(always)]
    fn frontend_key(address: Addr6, port: u16, proto: u8) -> Service6Key {
        Service6Key::new(address, port, proto, SCOPE_ALL, 0)
    }
    #[inline(always)]
    fn target(b: &Backend6) -> (Addr6, u16) {
        (b.address, b.port)
    }
    #[inline(always)]
    fn frontend_of(service_id: u32) -> Option<(Addr6, u16)> {
        // SAFETY: a lookup in our own map, the value copied out at once.
        let r = unsafe { LB6_REVNAT.get(&service_id) }?;
        Some((r.address, r.port))
    }
    #[inline(always)]
    fn lru_get(cookie: u64, backend: Addr6, port: u16) -> Option<Translation> {
        // SAFETY: a lookup in our own map, the value copied out at once.
        let v = unsafe { LB6_SOCK_REVNAT.get(&key6(cookie, backend, port)) }?;
        Some(Translation {
            frontend: v.address,
            frontend_port: v.port,
            service_id: v.service_id,
        })
    }
    #[inline(always)]
    fn lru_put(cookie: u64, backend: Addr6, port: u16, t: &Translation) -> bool {
        let v = SockRevNat6Value {
            address: t.frontend,
            port: t.frontend_port,
            pad: 0,
            service_id: t.service_id,
        };
        lru_filter::note(lru_filter::slot(6, &backend, port));
        lru_filter::note_socket(cookie);
        LB6_SOCK_REVNAT
            .insert(&key6(cookie, backend, port), &v, 0)
            .is_ok()
    }
    #[inline(always)]
    fn lru_remove(cookie: impl FnOnce() -> u64, backend: Addr6, port: u16) {
        if !lru_filter::may_hold(lru_filter::slot(6, &backend, port)) {
            return;
        }
        let cookie = cookie();
        if lru_filter::socket_may_hold(cookie) {
            remove_if_present(&LB6_SOCK_REVNAT, &key6(cookie, backend, port));
        }
    }
}
