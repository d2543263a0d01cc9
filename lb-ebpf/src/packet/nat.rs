//! Address and port rewrites, with the IP and L4 checksums kept right.
//!
//! A later fragment has no L4 header: only its addresses change (its first
//! fragment carried the L4 checksum, which covers the whole datagram and was
//! updated there).
use super::{
    access::{
        store, ETH_HLEN, IPPROTO_TCP, IPPROTO_UDP, IP_CHECK, L4_DPORT, L4_SPORT, TCP_CHECK,
        UDP_CHECK,
    },
    csum::{diff16, diff32, update_field},
    family::Ip,
    parse::Flow,
    Hook,
};

/// The checksum changes of one rewrite, summed as its fields are stored
/// and applied once at the end (`apply`): one read-modify-write per
/// checksum in XDP and at most two helper calls in tc, instead of one per
/// field (an IPv6 SNAT changes eight address words and two ports).
#[derive(Clone, Copy)]
struct Sums {
    /// Address words (in the IPv4 header checksum and the L4
    /// pseudo-header): one's complement partial sum of the changes.
    addr: u32,
    /// Ports (in the L4 checksum only, not its pseudo-header).
    port: u32,
    addr_changed: bool,
    port_changed: bool,
}

const NONE: Sums = Sums {
    addr: 0,
    port: 0,
    addr_changed: false,
    port_changed: false,
};

/// Stores an address field (`I::SADDR` or `I::DADDR`), noting the change
/// of every word that differs.
#[inline(always)]
fn put_addr<C: Hook, I: Ip>(
    ctx: &C,
    field: usize,
    old: &I::Addr,
    new: &I::Addr,
    sums: &mut Sums,
) -> Option<()> {
    if old == new {
        return Some(());
    }
    // Word by word, only the words that change (`old` is what the packet
    // holds: the parsed flow's field). One store of a whole IPv6 address
    // became a call to a byte-by-byte memmove (`access::mac_words` says
    // why).
    let mut i = 0;
    while i < I::WORDS {
        let (o, n) = (I::word(*old, i), I::word(*new, i));
        if o != n {
            if !store(ctx, ETH_HLEN + field + 4 * i, n) {
                return None;
            }
            sums.addr += diff32(o, n);
        }
        i += 1;
    }
    sums.addr_changed = true;
    Some(())
}

#[inline(always)]
fn put_port<C: Hook, I: Ip>(
    ctx: &C,
    f: &Flow<I>,
    field: usize,
    old: u16,
    new: u16,
    sums: &mut Sums,
) -> Option<()> {
    if old == new || !f.has_l4() {
        return Some(());
    }
    if !store(ctx, f.l4() + field, new) {
        return None;
    }
    sums.port += diff16(old, new);
    sums.port_changed = true;
    Some(())
}

/// Brings the checksums in step with what `put_addr` and `put_port`
/// stored: the IPv4 header checksum (addresses), the L4 checksum
/// (addresses through its pseudo-header, and ports), and for IPv6 the
/// skb's CHECKSUM_COMPLETE sum (see `Hook::csum_complete_fixup`).
#[inline(always)]
fn apply<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, sums: &Sums) -> Option<()> {
    if !I::IS_V6 && sums.addr_changed && !update_field(ctx, ETH_HLEN + IP_CHECK, sums.addr) {
        return None;
    }
    if !f.has_l4() || !(sums.addr_changed || sums.port_changed) {
        return Some(());
    }
    let pseudo = sums.addr_changed.then_some(sums.addr);
    let plain = sums.port_changed.then_some(sums.port);
    if !ctx.csum_l4_sums(l4_check(f), pseudo, plain, f.proto == IPPROTO_UDP) {
        return None;
    }
    if I::IS_V6 && sums.addr_changed {
        ctx.csum_complete_fixup(sums.addr);
    }
    Some(())
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
    let mut sums = NONE;
    put_addr::<C, I>(ctx, I::DADDR, &f.daddr, addr, &mut sums)?;
    put_port(ctx, f, L4_DPORT, f.dport, port, &mut sums)?;
    apply(ctx, f, &sums)
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
    let mut sums = NONE;
    put_addr::<C, I>(ctx, I::DADDR, &f.daddr, addr, &mut sums)?;
    put_port(ctx, f, L4_DPORT, f.dport, port, &mut sums)?;
    put_addr::<C, I>(ctx, I::SADDR, &f.saddr, node, &mut sums)?;
    put_port(ctx, f, L4_SPORT, f.sport, node_port, &mut sums)?;
    apply(ctx, f, &sums)
}

/// A reply's source becomes the frontend again (local backend, DSR).
#[inline(always)]
pub fn reverse_source<C: Hook, I: Ip>(
    ctx: &C,
    f: &Flow<I>,
    addr: &I::Addr,
    port: u16,
) -> Option<()> {
    let mut sums = NONE;
    put_addr::<C, I>(ctx, I::SADDR, &f.saddr, addr, &mut sums)?;
    put_port(ctx, f, L4_SPORT, f.sport, port, &mut sums)?;
    apply(ctx, f, &sums)
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
    let mut sums = NONE;
    put_addr::<C, I>(ctx, I::SADDR, &f.saddr, frontend, &mut sums)?;
    put_port(ctx, f, L4_SPORT, f.sport, fport, &mut sums)?;
    put_addr::<C, I>(ctx, I::DADDR, &f.daddr, client, &mut sums)?;
    put_port(ctx, f, L4_DPORT, f.dport, cport, &mut sums)?;
    apply(ctx, f, &sums)
}

/// A host flow's packet leaves from another port (`host_flow`).
#[inline(always)]
pub fn source_port<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, port: u16) -> Option<()> {
    let mut sums = NONE;
    put_port(ctx, f, L4_SPORT, f.sport, port, &mut sums)?;
    apply(ctx, f, &sums)
}

/// A reply to a host flow's port gets the host socket's port back.
#[inline(always)]
pub fn destination_port<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, port: u16) -> Option<()> {
    let mut sums = NONE;
    put_port(ctx, f, L4_DPORT, f.dport, port, &mut sums)?;
    apply(ctx, f, &sums)
}
