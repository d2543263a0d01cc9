//! `LB_SOCK_FILTER`: which backends sockets may be indexed under in the
//! reverse LRU (`LB4/6_SOCK_REVNAT`), so that a closing socket that was
//! never translated skips the LRU lookup (see `lb_common::filter`).
use lb_common::filter::{fold6, sock_filter_slot};

use crate::maps::LB_SOCK_FILTER;

/// The slot of a backend: an IPv4 address in the first word, an IPv6 one
/// folded, as the agent computes it from the LRU's keys.
#[inline(always)]
pub fn slot(family: u8, backend: &[u32; 4], port: u16) -> u32 {
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
    if let Some(flag) = LB_SOCK_FILTER.get_ptr_mut(slot) {
        // SAFETY: an element of our own array, valid for the program's run;
        // a whole-byte store, so a race with another CPU loses nothing.
        unsafe {
            if *flag == 0 {
                *flag = 1;
            }
        }
    }
}

/// Whether any socket may be indexed under a backend of this slot. A
/// missing element (cannot happen: the array has every index) says yes.
#[inline(always)]
pub fn may_hold(slot: u32) -> bool {
    LB_SOCK_FILTER.get(slot).is_none_or(|f| *f != 0)
}
