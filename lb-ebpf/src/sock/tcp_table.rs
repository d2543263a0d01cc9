//! `LB_SOCK_TCP`: translated TCP sockets by the low bits of their cookie
//! (see `lb_common::sock::SockTcpSlot` for why, and what it measured).
//!
//! Writers and readers run on any CPU at once without a lock, and these
//! programs have no atomic instructions (Rust's BPF target has no
//! compare-and-swap), so every access is volatile (in program order) and:
//! * a claim writes `cookie` 0 first (even over a slot it found free),
//!   then the translation, then its own cookie;
//! * a claim then reads the slot back, and when another claim of the same
//!   slot was mixed into its own (two CPUs drawing cookies a multiple of `slots` apart at
//!   the same instant), frees it if it still holds its cookie and keeps its
//!   translation in the LRU instead; a socket's getpeername() comes after
//!   its connect4 returned, so it never sees the mix;
//! * a read takes the cookie, the translation, then the cookie again, and
//!   believes the translation only when both name its socket. With stores
//!   and loads each kept in order, as x86 does, a translation read across a
//!   claim is never believed (arm64 may reorder loads: there a read racing
//!   the claim of its own slot could see a mix).
//!
//! What is left, each needing two sockets on one slot within the ~100 ns of
//! a claim: the other socket of two mixed claims can lose its translation
//! (its getpeername() then shows the backend); an occupant closing while a
//! claim moves it leaves its translation in the LRU until evicted; and one
//! closing as a claim writes can free the new socket's translation.
use lb_common::Addr6;
use lb_common::{
    drop::{Direction, DropReason},
    sock::{sock_tcp_slot, SockTcpSlot},
};

use super::{
    family::{SockFamily, Translation},
    lru_filter, peers,
};
use crate::{drop, maps::LB_SOCK_TCP};

/// The table's size, a power of two: set by the agent at load
/// (`sock_tcp_slots` of its `--map-size-sock-revnat`), as `LB_SOCK_TCP`'s
/// max_entries. Read-only data: the verifier sees a constant.
#[unsafe(no_mangle)]
static SOCK_TCP_SLOTS: u32 =
    lb_common::sock::sock_tcp_slots(lb_common::maps::DEFAULT_SOCK_REVNAT_MAX);

#[inline(always)]
fn slot_of(cookie: u64) -> *mut SockTcpSlot {
    // SAFETY: a plain read of our own read-only global.
    let slots = unsafe { core::ptr::read_volatile(&raw const SOCK_TCP_SLOTS) };
    LB_SOCK_TCP
        .get_ptr_mut(sock_tcp_slot(cookie, slots))
        .unwrap_or(core::ptr::null_mut())
}

/// connect4/6 sent this TCP socket to `backend:port` for `t`'s frontend.
/// False when the translation could not be kept (the connection still
/// works; only getpeername()'s view is lost).
#[inline(always)]
pub fn put<F: SockFamily>(cookie: u64, backend: Addr6, port: u16, t: &Translation) -> bool {
    let e = slot_of(cookie);
    if e.is_null() {
        return F::lru_put(cookie, backend, port, t);
    }
    // sock_release looks a socket up only when its backend's flag and its
    // own are set: a direct connect to a backend others were sent to then
    // reads a byte, not this table's slot of its cookie, which nothing has
    // touched for `slots` sockets (a cache miss).
    lru_filter::note(lru_filter::slot(F::FAMILY, &backend, port));
    lru_filter::note_socket(cookie);
    // SAFETY: an element of our own array, valid for the program's run;
    // see the file comment for the order of the accesses.
    unsafe {
        let occupant = core::ptr::read_volatile(&(*e).cookie);
        if occupant != 0
            && occupant != cookie
            && !peers::spill(occupant, &core::ptr::read_volatile(&(*e).peer))
        {
            // Still open (a closing socket frees its slot): its
            // translation should have moved to the LRU before it is
            // overwritten. Counted like any translation not kept.
            drop::count(DropReason::RevNatUpdateFailed, Direction::Egress);
        }
        // Always, even over a free slot: another claim may have filled it
        // since, and its socket must not read this translation as its own.
        core::ptr::write_volatile(&mut (*e).cookie, 0);
        core::ptr::write_volatile(&mut (*e).peer, t.peer(F::FAMILY, backend, port));
        core::ptr::write_volatile(&mut (*e).cookie, cookie);
        // Read back, field by field (a copy would not fit the stack):
        // another claim of this slot mixed into this one.
        let q = &raw const (*e).peer;
        if core::ptr::read_volatile(&(*e).cookie) == cookie
            && core::ptr::read_volatile(&raw const (*q).backend) == backend
            && core::ptr::read_volatile(&raw const (*q).frontend) == t.frontend
            && core::ptr::read_volatile(&raw const (*q).backend_port) == port
            && core::ptr::read_volatile(&raw const (*q).frontend_port) == t.frontend_port
            && core::ptr::read_volatile(&raw const (*q).service_id) == t.service_id
            && core::ptr::read_volatile(&raw const (*q).family) == F::FAMILY
        {
            return true;
        }
        if core::ptr::read_volatile(&(*e).cookie) == cookie {
            core::ptr::write_volatile(&mut (*e).cookie, 0);
        }
    }
    F::lru_put(cookie, backend, port, t)
}

/// The frontend this socket asked for when it was sent to `backend:port`,
/// if its slot still holds it.
#[inline(always)]
pub fn get<F: SockFamily>(cookie: u64, backend: Addr6, port: u16) -> Option<Translation> {
    let e = slot_of(cookie);
    if e.is_null() {
        return None;
    }
    // SAFETY: as in `put`.
    let p = unsafe {
        if core::ptr::read_volatile(&(*e).cookie) != cookie {
            return None;
        }
        let p = core::ptr::read_volatile(&(*e).peer);
        if core::ptr::read_volatile(&(*e).cookie) != cookie {
            return None;
        }
        p
    };
    (p.family == F::FAMILY && p.backend == backend && p.backend_port == port)
        .then(|| Translation::of(&p))
}

/// Frees the socket's slot if it still holds it; whether it did.
#[inline(always)]
pub fn release(cookie: u64) -> bool {
    let e = slot_of(cookie);
    if e.is_null() {
        return false;
    }
    // SAFETY: as in `put`.
    unsafe {
        if core::ptr::read_volatile(&(*e).cookie) != cookie {
            return false;
        }
        core::ptr::write_volatile(&mut (*e).cookie, 0);
    }
    true
}
