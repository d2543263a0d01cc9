//! Address and port rewrites, with the IP and L4 checksums kept right.
//!
//! A later fragment has no L4 header: only its addresses change (its first
//! fragment carried the L4 checksum, which covers the whole datagram and was
//! updated there).
use super::{
    access::{
        store, ETH_HLEN, IPPROTO_TCP, IPPROTO_UDP, IP_DADDR, IP_SADDR, L4_DPORT, L4_SPORT,
        TCP_CHECK, UDP_CHECK,
    },
    parse::Flow,
    Hook,
};

/// Rewrites an IPv4 address field, fixing the IP and L4 (pseudo-header) checksums.
#[inline(always)]
pub fn set_addr<C: Hook>(ctx: &C, f: &Flow, field: usize, old: u32, new: u32) -> Option<()> {
    if old == new {
        return Some(());
    }
    if !store(ctx, ETH_HLEN + field, new) || !ctx.csum_l3(old, new, 4) {
        return None;
    }
    if !f.has_l4() {
        return Some(());
    }
    ctx.csum_l4(l4_check(f), old, new, 4, true, f.proto == IPPROTO_UDP)
        .then_some(())
}

#[inline(always)]
pub fn set_port<C: Hook>(ctx: &C, f: &Flow, field: usize, old: u16, new: u16) -> Option<()> {
    if old == new || !f.has_l4() {
        return Some(());
    }
    if !store(ctx, f.l4() + field, new) {
        return None;
    }
    ctx.csum_l4(
        l4_check(f),
        old as u32,
        new as u32,
        2,
        false,
        f.proto == IPPROTO_UDP,
    )
    .then_some(())
}

#[inline(always)]
fn l4_check(f: &Flow) -> usize {
    f.l4()
        + if f.proto == IPPROTO_TCP {
            TCP_CHECK
        } else {
            UDP_CHECK
        }
}

/// Rewrites the destination to the backend (address, port, checksums).
#[inline(always)]
pub fn dnat<C: Hook>(ctx: &C, f: &Flow, addr: u32, port: u16) -> Option<()> {
    set_addr(ctx, f, IP_DADDR, f.daddr, addr)?;
    set_port(ctx, f, L4_DPORT, f.dport, port)
}

/// DNAT plus SNAT to this node's address and port.
#[inline(always)]
pub fn dnat_snat<C: Hook>(
    ctx: &C,
    f: &Flow,
    addr: u32,
    port: u16,
    node: u32,
    node_port: u16,
) -> Option<()> {
    dnat(ctx, f, addr, port)?;
    set_addr(ctx, f, IP_SADDR, f.saddr, node)?;
    set_port(ctx, f, L4_SPORT, f.sport, node_port)
}

/// A reply's source becomes the frontend again (local backend, DSR).
#[inline(always)]
pub fn reverse_source<C: Hook>(ctx: &C, f: &Flow, addr: u32, port: u16) -> Option<()> {
    set_addr(ctx, f, IP_SADDR, f.saddr, addr)?;
    set_port(ctx, f, L4_SPORT, f.sport, port)
}

/// A reply to a SNAT port: from the frontend, to the client.
#[inline(always)]
pub fn reverse_snat<C: Hook>(
    ctx: &C,
    f: &Flow,
    frontend: u32,
    fport: u16,
    client: u32,
    cport: u16,
) -> Option<()> {
    reverse_source(ctx, f, frontend, fport)?;
    set_addr(ctx, f, IP_DADDR, f.daddr, client)?;
    set_port(ctx, f, L4_DPORT, f.dport, cport)
}
