//! The early exit: most packets reaching a node are not for a service,
//! and these checks let them go with a few reads of the packet and of the
//! frontend filter (`lb_common::filter`), before the parse and any hash
//! lookup.
use super::*;
#[allow(clippy::wildcard_imports)]
use lb_common::Addr6;

/// The early exit, read straight from the packet: an IPv4 TCP or UDP
/// packet with a plain 20-byte header, not a fragment (or an IPv6 one whose
/// next header is TCP or UDP: no extension header), that is neither for a
/// frontend, nor for a known flow to one, nor a reply to our SNAT: the bits
/// of its (address, port) and of its address alone (a ClusterIP's marker:
/// its other ports are dropped) are clear in LB4_FE_FILTER, and its port is
/// outside the SNAT range (every SNATed flow's port is taken from it).
/// Everything else takes the full path, which decides as it always did: IP
/// options (a DSR option), fragments, ICMP, broken headers; and everything
/// while the agent has not said the filter is complete. Not on a pod-facing
/// device: a pod's reply to a hairpinned flow goes to the frontend's
/// address on the client's port, which no bit covers.
#[inline(always)]
pub(super) fn cannot_concern_a_service<C: Hook>(ctx: &C) -> bool {
    if ctx.is_from_pod() || runtime::config(CFG_FRONTEND_FILTER) == 0 {
        return false;
    }
    let ip = ETH_HLEN;
    let Some(eth) = load::<u16, C>(ctx, 12) else {
        return false;
    };
    // The destination (an IPv6 one folded as the agent folds it) and port.
    let (daddr, dport) = if eth == ETH_P_IP.to_be() {
        if load::<u8, C>(ctx, ip) != Some(0x45) {
            return false;
        }
        let proto = load::<u8, C>(ctx, ip + IP_PROTO);
        if proto != Some(IPPROTO_TCP) && proto != Some(IPPROTO_UDP) {
            return false;
        }
        if load::<u16, C>(ctx, ip + IP_FRAG_OFF).is_none_or(|f| f & IP_MF_OR_OFFSET != 0) {
            return false;
        }
        match (
            load::<u32, C>(ctx, ip + IP_DADDR),
            load::<u16, C>(ctx, ip + 20 + L4_DPORT),
        ) {
            (Some(a), Some(p)) => (a, p),
            _ => return false,
        }
    } else if eth == ETH_P_IPV6.to_be() {
        let next = load::<u8, C>(ctx, ip + IP6_NEXT_HEADER);
        if next != Some(IPPROTO_TCP) && next != Some(IPPROTO_UDP) {
            return false;
        }
        match (
            load::<Addr6, C>(ctx, ip + 24),
            load::<u16, C>(ctx, ip + IPV6_HLEN + L4_DPORT),
        ) {
            (Some(a), Some(p)) => (fold6(a), p),
            _ => return false,
        }
    } else {
        return false;
    };
    // A frontend's own (address, port) first: a packet to a service, the
    // busiest kind here, then stops before the SNAT range's settings.
    if filter_has(daddr, dport) {
        return false;
    }
    if in_snat_ports(dport) {
        return false;
    }
    !filter_has(daddr, 0)
}

/// Whether `port` (network byte order) is in a SNAT range used since
/// install (the agent records the current one there too): flows SNATed
/// before a restart live on. Without a record (programs driven by hand),
/// the current range.
#[inline(always)]
pub(super) fn in_snat_ports(port: u16) -> bool {
    let ever = runtime::config(CFG_SNAT_PORTS_EVER);
    let (low, high) = if ever != 0 {
        (ever >> 16, ever & 0xffff)
    } else {
        (
            runtime::config(CFG_SNAT_PORT_MIN),
            runtime::config(CFG_SNAT_PORT_MAX),
        )
    };
    let port = u32::from(u16::from_be(port));
    port >= low && port <= high
}

#[inline(always)]
pub(super) fn filter_has(address: u32, port: u16) -> bool {
    let (word, mask) = word_and_mask(filter_bit(address, port));
    // A missing word (cannot happen: the array has every index) passes.
    LB4_FE_FILTER.get(word).is_none_or(|w| w & mask != 0)
}
