//! SNAT source ports for flows to remote backends.
//!
//! A port is taken by creating the reverse entry (backend → node:port) with
//! BPF_NOEXIST, so two live flows can never share one, and only when no
//! socket of this node holds the same tuple (a host process talking to the
//! same backend from that port: its replies must stay its own).
//!
//! The client's own source port comes first when it lies in the range, as
//! Linux NAT and Cilium (`__snat_try_keep_port`) do. That is what keeps a
//! busy client working: a backend that closed first holds TIME_WAIT on the
//! tuple for 60 s and accepts a new SYN on it only when its TCP timestamp
//! is newer (RFC 6191), and Linux draws timestamp offsets per connection,
//! so a tuple handed to a different client connection is refused
//! (PAWSTimewait) about half the time; the same client connection maps to
//! the same tuple again. Otherwise the search starts at a random port and
//! probes the ports after it (Cilium's
//! `snat_v4_new_mapping` does 32 tries; its retries are random, ours linear,
//! so a nearly full range is still searched without repeats). When none of
//! them is free, a port whose flow is over is taken over: its forward entry
//! gone or idled out, or both directions closing (FIN or RST seen each way)
//! and quiet for `SNAT_REUSE_CLOSING_NS`. Without that, short connections
//! would hold their ports for the whole closing timeout and one busy client
//! would run the range dry.
use aya_ebpf::helpers::bpf_get_prandom_u32;
use lb_common::{
    config::{CFG_SNAT_PORT_MAX, CFG_SNAT_PORT_MIN, CNT_SNAT_REUSED},
    conntrack::{CtKey, CT_F_CLOSING, CT_F_SNAT, CT_REVERSE, CT_SERVICE, SNAT_REUSE_CLOSING_NS},
};

use super::{
    ct::{self, now},
    family::Ip,
    parse::Flow,
    scratch, Hook,
};
use crate::runtime::{bump, config};

const BPF_NOEXIST: u64 = 1;
const ATTEMPTS: u32 = 32;

/// Takes a free port (network order) for the new flow `f`, whose forward
/// and reverse conntrack values wait in the scratch map (`ct`: the backend
/// and the node's address; `rct`: the reverse translation, recorded under
/// the port). 0 when every port tried is in use. (A plain integer, not an
/// Option: a subprogram returns it in a register.)
#[inline(never)]
pub fn alloc<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> u16 {
    let Some(sp) = scratch::<I>() else {
        return 0;
    };
    // SAFETY: per-CPU scratch; distinct fields. The candidate key lives
    // there too, not on the stack (an IPv6 key is 40 bytes).
    let (ct, rval, rkey) = unsafe { (&(*sp).ct, &(*sp).rct, &mut (*sp).rkey) };
    let min = config(CFG_SNAT_PORT_MIN);
    let max = config(CFG_SNAT_PORT_MAX);
    if min == 0 || max < min || max > 65535 {
        return 0;
    }
    let span = max - min + 1;
    // A NonZero divisor: no panic path for the verifier to reject.
    let Some(span_nz) = core::num::NonZeroU32::new(span) else {
        return 0;
    };
    // backend → node:port, the port filled in per candidate.
    *rkey = CtKey::new(ct.addr, ct.nat_addr, ct.port, 0, f.proto, CT_REVERSE);
    // The client's port first, when it lies in the range: free, or held
    // by this same client tuple's earlier flow (a reused tuple), or by a
    // flow that is over.
    let client = u32::from(u16::from_be(f.sport));
    if client >= min && client <= max {
        rkey.dport = f.sport;
        if !ctx.socket_holds::<I>(rkey) {
            if I::ct().insert(&*rkey, rval, BPF_NOEXIST).is_ok() {
                return f.sport;
            }
            if (same_client::<I>(rkey, f) || reusable::<I>(rkey, f.proto))
                && I::ct().insert(&*rkey, rval, 0).is_ok()
            {
                return f.sport;
            }
        }
    }
    // SAFETY: a helper without arguments.
    let start = unsafe { bpf_get_prandom_u32() } % span_nz;
    let mut spare: u16 = 0;
    // A range smaller than the attempts is searched once.
    let attempts = if span < ATTEMPTS { span } else { ATTEMPTS };
    let mut i = 0;
    while i < attempts {
        let off = (start + i) % span_nz;
        let port = ((min + off) as u16).to_be();
        rkey.dport = port;
        if !ctx.socket_holds::<I>(rkey) {
            if I::ct().insert(&*rkey, rval, BPF_NOEXIST).is_ok() {
                return port;
            }
            if spare == 0 && reusable::<I>(rkey, f.proto) {
                spare = port;
            }
        }
        i += 1;
    }
    // (Port 0 is never in the range: min > 0.)
    if spare == 0 {
        return 0;
    }
    rkey.dport = spare;
    if I::ct().insert(&*rkey, rval, 0).is_err() {
        return 0;
    }
    bump(CNT_SNAT_REUSED);
    spare
}

/// Whether this reverse entry belongs to an earlier flow of the same client
/// tuple (the client reused its port: the tuple is the client's again).
#[inline(never)]
fn same_client<I: Ip>(rkey: &CtKey<I::Addr>, f: &Flow<I>) -> bool {
    match I::ct().get_ptr(rkey) {
        // SAFETY: a map value stays valid for the program's run.
        Some(old) => unsafe {
            (*old).flags & CT_F_SNAT != 0
                && (*old).nat_addr == f.saddr
                && (*old).nat_port == f.sport
                && (*old).addr == f.daddr
                && (*old).port == f.dport
        },
        None => true,
    }
}

/// Whether the flow holding this reverse entry is over. Its forward entry
/// decides: the reverse one is only refreshed by replies, and a one-way
/// flow keeps its port while it sends.
#[inline(never)]
fn reusable<I: Ip>(rkey: &CtKey<I::Addr>, proto: u8) -> bool {
    let Some(old) = I::ct().get_ptr(rkey) else {
        return true; // evicted since the insert failed
    };
    // SAFETY: a map value stays valid for the program's run.
    let old = unsafe { &*old };
    if old.flags & CT_F_SNAT == 0 {
        return false;
    }
    // The forward entry of the flow: client → frontend.
    let fkey = CtKey::new(
        old.nat_addr,
        old.addr,
        old.nat_port,
        old.port,
        proto,
        CT_SERVICE,
    );
    let Some(fwd) = I::ct().get_ptr(&fkey) else {
        return true;
    };
    // SAFETY: as above.
    let fwd = unsafe { &*fwd };
    if fwd.flags & CT_F_SNAT == 0 || fwd.nat_port != rkey.dport || fwd.nat_addr != rkey.daddr {
        return true; // the client's tuple has moved on to another port
    }
    let t = now();
    if ct::expired(proto, fwd, t) {
        return true;
    }
    fwd.flags & CT_F_CLOSING != 0
        && old.flags & CT_F_CLOSING != 0
        && t.saturating_sub(fwd.last_seen_ns) >= SNAT_REUSE_CLOSING_NS
        && t.saturating_sub(old.last_seen_ns) >= SNAT_REUSE_CLOSING_NS
}
