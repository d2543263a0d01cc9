//! IPv4 fragments of translated flows. Only the first fragment carries the
//! ports, so it records them under the datagram's identity (RFC 791 §3.2:
//! source, destination, protocol and identification), and the later
//! fragments look them up to follow the same flow, as Cilium does with
//! `cilium_ipv4_frag_datagrams` (bpf/lib/ipv4.h). A later fragment whose
//! first one was not seen (it came first, or the LRU forgot it) cannot be
//! placed and is left to the stack.
use lb_common::fragments::{Frag4Key, Frag4Value};

use super::{
    family::Ip,
    parse::{Flow, FRAG_FIRST},
};
use crate::{maps::LB4_FRAGS, select::V4};

#[inline(always)]
fn key(f: &Flow<V4>) -> Frag4Key {
    Frag4Key {
        saddr: f.saddr,
        daddr: f.daddr,
        id: f.ip_id,
        proto: f.proto,
        pad: 0,
    }
}

/// A first fragment of a flow we translate: remember its ports. (IPv6
/// fragments are not parsed: the stack reassembles them.)
#[inline(always)]
pub fn remember<I: Ip>(f: &Flow<I>) {
    let Some(f) = I::as_v4(f) else {
        return;
    };
    if f.frag == FRAG_FIRST {
        let v = Frag4Value {
            sport: f.sport,
            dport: f.dport,
        };
        let _ = LB4_FRAGS.insert(&key(f), &v, 0);
    }
}

/// A later fragment: its ports, from its first fragment. False when the
/// first fragment was not seen.
#[inline(always)]
pub fn follow<I: Ip>(f: &mut Flow<I>) -> bool {
    let Some(f) = I::as_v4_mut(f) else {
        return false;
    };
    // SAFETY: a map value stays valid for the program's run; copied at once.
    match unsafe { LB4_FRAGS.get(&key(f)) } {
        Some(v) => {
            f.sport = v.sport;
            f.dport = v.dport;
            true
        }
        None => false,
    }
}
