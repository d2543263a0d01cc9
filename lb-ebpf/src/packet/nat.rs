//! Address and port rewrites, with the IP and L4 checksums kept right.
//!
//! A later fragment has no L4 header: only its addresses change (its first
//! fragment carried the L4 checksum, which covers the whole datagram and was
//! updated there).
use super::{
    access::{store, ETH_HLEN, IPPROTO_TCP, IPPROTO_UDP, L4_DPORT, L4_SPORT, TCP_CHECK, UDP_CHECK},
    csum::diff32,
    family::Ip,
    parse::Flow,
    Hook,
};

/// Rewrites an address field (`I::SADDR` or `I::DADDR`), fixing the IPv4
/// header checksum and the L4 checksum, whose pseudo-header holds the
/// address: one 32-bit update per word that changed (one for IPv4, up to
/// four for IPv6).
#[inline(always)]
pub fn set_addr<C: Hook, I: Ip>(
    ctx: &C,
    f: &Flow<I>,
    field: usize,
    old: &I::Addr,
    new: &I::Addr,
) -> Option<()> {
    if old == new {
        return Some(());
    }
    let (old, new) = (*old, *new);
    if !store(ctx, ETH_HLEN + field, new) {
        return None;
    }
    if !I::IS_V6 && !ctx.csum_l3(I::word(old, 0), I::word(new, 0), 4) {
        return None;
    }
    if !f.has_l4() {
        return Some(());
    }
    let check = l4_check(f);
    let udp = f.proto == IPPROTO_UDP;
    let mut diff = 0u32;
    let mut i = 0;
    while i < I::WORDS {
        let (o, n) = (I::word(old, i), I::word(new, i));
        if o != n {
            if !ctx.csum_l4(check, o, n, 4, true, udp) {
                return None;
            }
            diff += diff32(o, n);
        }
        i += 1;
    }
    if I::IS_V6 {
        ctx.csum_complete_fixup(diff);
    }
    Some(())
}

#[inline(always)]
pub fn set_port<C: Hook, I: Ip>(
    ctx: &C,
    f: &Flow<I>,
    field: usize,
    old: u16,
    new: u16,
) -> Option<()> {
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
fn l4_check<I: Ip>(f: &Flow<I>) -> usize {
    f.l4()
        + if f.proto == IPPROTO_TCP {
            TCP_CHECK
        } else {
            UDP_CHECK
        }
}

/// Rewrites the destination to the backend (address, port, checksums).
#[inline(always)]
pub fn dnat<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, addr: &I::Addr, port: u16) -> Option<()> {
    set_addr(ctx, f, I::DADDR, &f.daddr, addr)?;
    set_port(ctx, f, L4_DPORT, f.dport, port)
}

/// DNAT plus SNAT to this node's address and port.
#[inline(always)]
pub fn dnat_snat<C: Hook, I: Ip>(
    ctx: &C,
    f: &Flow<I>,
    addr: &I::Addr,
    port: u16,
    node: &I::Addr,
    node_port: u16,
) -> Option<()> {
    dnat(ctx, f, addr, port)?;
    set_addr(ctx, f, I::SADDR, &f.saddr, node)?;
    set_port(ctx, f, L4_SPORT, f.sport, node_port)
}

/// A reply's source becomes the frontend again (local backend, DSR).
#[inline(always)]
pub fn reverse_source<C: Hook, I: Ip>(
    ctx: &C,
    f: &Flow<I>,
    addr: &I::Addr,
    port: u16,
) -> Option<()> {
    set_addr(ctx, f, I::SADDR, &f.saddr, addr)?;
    set_port(ctx, f, L4_SPORT, f.sport, port)
}

/// A reply to a SNAT port: from the frontend, to the client.
#[inline(always)]
pub fn reverse_snat<C: Hook, I: Ip>(
    ctx: &C,
    f: &Flow<I>,
    frontend: &I::Addr,
    fport: u16,
    client: &I::Addr,
    cport: u16,
) -> Option<()> {
    reverse_source(ctx, f, frontend, fport)?;
    set_addr(ctx, f, I::DADDR, &f.daddr, client)?;
    set_port(ctx, f, L4_DPORT, f.dport, cport)
}
