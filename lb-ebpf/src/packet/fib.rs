//! Routes to backends (and back to clients): a FIB lookup that also checks
//! that the packet fits the path, and the TTL decrement a router owes.
//!
//! The kernel compares `tot_len` with the route's MTU when it is set
//! (net/core/filter.c, bpf_ipv4_fib_lookup). Set to the IP total length of a
//! GRO/GSO packet (up to 64 KiB) that comparison fails every bulk transfer,
//! so it is given what really goes on the wire: one segment (IP header, L4
//! header and the GSO size) for a GSO packet, the whole packet otherwise,
//! plus whatever this node adds (the DSR option). A packet that does not fit
//! gets FRAG_NEEDED and the route's MTU, from which `icmp.rs` answers the
//! sender.
use lb_common::drop::DropReason;

use super::{
    access::{store, ETH_HLEN, IP_CHECK},
    csum::{diff16, update_field},
    family::Ip,
    parse::Flow,
    scratch, Hook,
};

const BPF_FIB_LKUP_RET_SUCCESS: i64 = 0;
const BPF_FIB_LKUP_RET_NO_NEIGH: i64 = 7;
const BPF_FIB_LKUP_RET_FRAG_NEEDED: i64 = 8;

pub enum Route {
    /// Egress ifindex; the MACs are in the scratch FIB parameters.
    Resolved(u32),
    /// Egress ifindex, neighbour not resolved yet (the next hop is in the
    /// scratch FIB parameters).
    NoNeigh(u32),
    /// The packet does not fit: the path's MTU. (Widening this to u32, so
    /// that no variant leaves payload bits undefined, made rustc return
    /// Route through a pointer argument: a sixth argument for
    /// `route_cache::lookup`, which BPF calls cannot take. As it is, the
    /// verifier accepts the packed word.)
    TooBig(u16),
    /// No route: the lookup's return code (BPF_FIB_LKUP_RET_*), or
    /// `u32::MAX` when no lookup ran. Every variant carries a value on
    /// purpose: a payload-less one gives LLVM an undefined payload to pack
    /// into the returned word, and it has filled that from a register that
    /// held a pointer, which the verifier refuses ("pointer arithmetic with
    /// <<= operator prohibited").
    Failed(#[allow(dead_code)] u32),
}

/// FIB lookup from `saddr` toward `daddr` for the packet `f` grown by
/// `extra` bytes, in the scratch map's parameters (which keep the MACs for
/// `finish_redirect`).
#[inline(always)]
pub fn lookup<C: Hook, I: Ip>(
    ctx: &C,
    saddr: &I::Addr,
    daddr: &I::Addr,
    f: &Flow<I>,
    extra: u16,
) -> Route {
    let Some(s) = scratch::<I>() else {
        return Route::Failed(u32::MAX);
    };
    // SAFETY: per-CPU scratch, used by this program run only.
    let p = unsafe { &mut (*s).fib };
    // SAFETY: plain data; all zero is its "nothing set" value.
    *p = unsafe { core::mem::zeroed() };
    p.family = I::AF;
    p.l4_protocol = f.proto;
    p.sport = f.sport;
    p.dport = f.dport;
    p.__bindgen_anon_1.tot_len = ctx.wire_len(f).saturating_add(extra);
    p.ifindex = ctx.ingress_ifindex();
    I::set_fib_addrs(p, *saddr, *daddr);
    crate::runtime::bump(lb_common::config::CNT_FIB_LOOKUPS);
    match ctx.fib_lookup(p) {
        BPF_FIB_LKUP_RET_SUCCESS => Route::Resolved(p.ifindex),
        BPF_FIB_LKUP_RET_NO_NEIGH => Route::NoNeigh(p.ifindex),
        // SAFETY: as above (tot_len and mtu_result share the union).
        BPF_FIB_LKUP_RET_FRAG_NEEDED => Route::TooBig(unsafe { p.__bindgen_anon_1.mtu_result }),
        rc => Route::Failed(rc as u32),
    }
}

/// RFC 1812 §5.3.1: a router decrements TTL and does not forward a packet
/// whose TTL reached zero (RFC 8200 §3: the same for IPv6's hop limit,
/// which no checksum covers). Err: expired (the caller answers "time
/// exceeded").
#[inline(always)]
pub fn decrement_ttl<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Result<(), DropReason> {
    if f.ttl <= 1 {
        return Err(DropReason::TtlExceeded);
    }
    let off = ETH_HLEN + I::HOP_LIMIT;
    if I::IS_V6 {
        if !store(ctx, off, f.ttl - 1) {
            return Err(DropReason::InvalidPacket);
        }
        // Next header and hop limit form one 16-bit word of the packet's
        // sum: keep skb->csum in step (no header checksum cancels it).
        let old = u16::from_ne_bytes([f.proto, f.ttl]);
        let new = u16::from_ne_bytes([f.proto, f.ttl - 1]);
        ctx.csum_complete_fixup(diff16(old, new));
        return Ok(());
    }
    // TTL and protocol form one 16-bit word of the header checksum.
    let old = u16::from_ne_bytes([f.ttl, f.proto]);
    let new = u16::from_ne_bytes([f.ttl - 1, f.proto]);
    if !store(ctx, off, f.ttl - 1) || !update_field(ctx, ETH_HLEN + IP_CHECK, diff16(old, new)) {
        return Err(DropReason::InvalidPacket);
    }
    Ok(())
}
