//! `LB_SOCK_FILTER` and `LB_SOCK_COOKIES`: which backends, and which
//! sockets, may be indexed in the reverse LRU (`LB4/6_SOCK_REVNAT`) or
//! kept in `LB_SOCK_TCP`, so that a closing socket that was never
//! translated skips both (see `lb_common::filter`).
use aya_ebpf::maps::Array;
use lb_common::filter::{
    fold6, sock_cookie_slot, sock_cookie_tag, sock_filter_slot, SOCK_COOKIE_SHARED,
};
use lb_common::Addr6;

use crate::maps::{LB_SOCK_COOKIES, LB_SOCK_FILTER};

/// The slot of a backend: an IPv4 address in the first word, an IPv6 one
/// folded, as the agent computes it from the LRU's keys.
#[inline(always)]
pub fn slot(family: u8, backend: &Addr6, port: u16) -> u32 {
    if family == 4 {
        sock_filter_slot(backend[0], port)
    } else {
        sock_filter_slot(fold6(*backend), port)
    }
}

/// Before a socket is indexed under a backend. Written only when clear: a
/// busy backend's slot stays a shared, read-only cache line.
#[inline(always)]
pub fn note(slot: u32) {
    set(&LB_SOCK_FILTER, slot, 1);
}

/// Whether any socket may be indexed under a backend of this slot.
#[inline(always)]
pub fn may_hold(slot: u32) -> bool {
    is_set(&LB_SOCK_FILTER, slot)
}

/// Before a socket is indexed in the LRU or claims a `LB_SOCK_TCP` slot:
/// its tag, or "shared" when another socket's tag is there.
#[inline(always)]
pub fn note_socket(cookie: u64) {
    let tag = sock_cookie_tag(cookie);
    if let Some(flag) = LB_SOCK_COOKIES.get_ptr_mut(sock_cookie_slot(cookie)) {
        // SAFETY: as in `set`.
        unsafe {
            let now = *flag;
            if now == 0 {
                *flag = tag;
            } else if now != tag && now != SOCK_COOKIE_SHARED {
                *flag = SOCK_COOKIE_SHARED;
            }
        }
    }
}

/// Whether the socket with this cookie may be indexed in the LRU or hold
/// a `LB_SOCK_TCP` slot.
#[inline(always)]
pub fn socket_may_hold(cookie: u64) -> bool {
    let tag = sock_cookie_tag(cookie);
    LB_SOCK_COOKIES
        .get(sock_cookie_slot(cookie))
        .is_none_or(|f| *f == tag || *f == SOCK_COOKIE_SHARED)
}

/// When a socket that may have been indexed has closed and its entries
/// are gone.
#[inline(always)]
pub fn forget_socket(cookie: u64) {
    let tag = sock_cookie_tag(cookie);
    if let Some(flag) = LB_SOCK_COOKIES.get_ptr_mut(sock_cookie_slot(cookie)) {
        // SAFETY: as in `set`.
        unsafe {
            if *flag == tag {
                *flag = 0;
            }
        }
    }
}

/// Writes a flag only when it differs: a flag many sockets read stays a
/// shared cache line.
#[inline(always)]
fn set(flags: &Array<u8>, slot: u32, value: u8) {
    if let Some(flag) = flags.get_ptr_mut(slot) {
        // SAFETY: an element of our own array, valid for the program's run;
        // a whole-byte store, so a race with another CPU loses nothing.
        unsafe {
            if *flag != value {
                *flag = value;
            }
        }
    }
}

/// A missing element (cannot happen: the arrays have every index) says yes.
#[inline(always)]
fn is_set(flags: &Array<u8>, slot: u32) -> bool {
    flags.get(slot).is_none_or(|f| *f != 0)
}
