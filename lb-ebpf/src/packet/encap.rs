//! DSR's IPIP / IP6IP6 dispatch (`--dsr-dispatch ipip`): for fabrics that
//! drop IPv4 options or IPv6 extension headers (many clouds do; it is why
//! Cilium has IPIP and Geneve dispatch), the packet that carries the DSR
//! option travels inside an outer header from the frontend's node to the
//! backend. The fabric sees only the outer header; the option inside is
//! the one `dsr.rs` adds and learns, unchanged.
//!
//! * The frontend's node: after the DNAT and the option, an outer IPv4
//!   (protocol 4, RFC 2003) or IPv6 (next header 41, RFC 2473) header from
//!   its address on the route's device to the backend (`push`). Only the
//!   packets that carry the option are encapsulated (a TCP SYN, every UDP
//!   datagram); the flow's other packets are plain, DNATed, as with the
//!   option. The path MTU counts the outer header too.
//! * The backend's node: tc ingress takes the outer header off a packet
//!   that is ours (`pop`: no outer options or fragments, an inner packet to
//!   the same address that starts with our option) and the inner one takes
//!   the usual path: `dsr::learn`, the option out, the stack delivers it.
//!   An encapsulated packet that is not ours is left to the stack.
use super::csum::ipv4_csum;
#[allow(clippy::wildcard_imports)]
use super::*;
use lb_common::nodeport::{
    DSR6_OPT_TYPE, DSR_OPT_TYPE, IPPROTO_IPIP, IPPROTO_IPV6 as IPPROTO_IP6IP6,
};

/// Puts the packet (`inner_len` bytes from its IP header on, option
/// included) inside an outer header from `src` to `dst`.
#[inline(always)]
pub fn push<C: Hook, I: Ip>(ctx: &C, inner_len: u16, src: &I::Addr, dst: &I::Addr) -> bool {
    if !ctx.push_outer_header(u32::from(I::ENCAP_LEN), I::IS_V6) {
        return false;
    }
    let ip = ETH_HLEN;
    if I::IS_V6 {
        // Version 6, traffic class and flow label 0, hop limit 64.
        return store(ctx, ip, 0x6000_0000u32.to_be())
            && store(ctx, ip + IP6_PAYLOAD_LEN, inner_len.to_be())
            && store(ctx, ip + IP6_NEXT_HEADER, [IPPROTO_IP6IP6, 64u8])
            && store(ctx, ip + 8, *src)
            && store(ctx, ip + 24, *dst);
    }
    // DF, as the option's path MTU check assumes: a router answers
    // "fragmentation needed" rather than fragment the outer packet.
    let ok = store(ctx, ip, [0x45u8, 0])
        && store(ctx, ip + IP_TOT_LEN, (inner_len + I::ENCAP_LEN).to_be())
        && store(ctx, ip + 4, 0u16)
        && store(ctx, ip + IP_FRAG_OFF, 0x4000u16.to_be())
        && store(ctx, ip + 8, [64u8, IPPROTO_IPIP])
        && store(ctx, ip + IP_CHECK, 0u16)
        && store(ctx, ip + IP_SADDR, *src)
        && store(ctx, ip + IP_DADDR, *dst);
    ok && match ipv4_csum(ctx, ip, 20) {
        Some(c) => store(ctx, ip + IP_CHECK, c),
        None => false,
    }
}

/// Whether the packet goes on through the path: it is not encapsulated
/// (protocol 4 / next header 41), or it was ours and its outer header is
/// off now. False: an encapsulated packet that is not ours, the stack's.
/// (One call from the program's entry: its frame stays small, and the
/// remote path's call chain under it needs the 512 bytes.)
#[inline(never)]
pub fn take_off<C: Hook, I: Ip>(ctx: &C) -> bool {
    // Only where this node was told to expect them (every node of a
    // cluster has the same --dsr-dispatch), and only from the wire: an
    // outer header hides the inner source from the fabric's anti-spoofing,
    // so nothing is taken off on a node that does not use the dispatch.
    if ctx.is_from_pod() || dsr_dispatch_of(runtime::config(CFG_LB_MODE)) != DSR_DISPATCH_IPIP {
        return true;
    }
    let encapsulated = if I::IS_V6 {
        load::<u8, C>(ctx, ETH_HLEN + IP6_NEXT_HEADER) == Some(IPPROTO_IP6IP6)
    } else {
        load::<u8, C>(ctx, ETH_HLEN + IP_PROTO) == Some(IPPROTO_IPIP)
    };
    !encapsulated || pop::<C, I>(ctx)
}

/// Takes our outer header off (true), or leaves a packet that is not ours
/// as it is (false): its inner packet must start with our DSR option and
/// go to the outer header's destination, and an IPv4 outer header must
/// have no options and not be a fragment.
#[inline(always)]
fn pop<C: Hook, I: Ip>(ctx: &C) -> bool {
    let ip = ETH_HLEN;
    let inner = ip + I::ENCAP_LEN as usize;
    // The inner header and the start of its option.
    ctx.pull(inner + IPV6_HLEN + 4);
    let ours = if I::IS_V6 {
        load::<u8, C>(ctx, inner).is_some_and(|v| v >> 4 == 6)
            && load::<u8, C>(ctx, inner + IP6_NEXT_HEADER) == Some(IPPROTO_DSTOPTS)
            && load::<u8, C>(ctx, inner + IPV6_HLEN + 2) == Some(DSR6_OPT_TYPE)
            && same::<C, lb_common::Addr6>(ctx, ip + 24, inner + 24)
    } else {
        load::<u8, C>(ctx, ip) == Some(0x45)
            && load::<u16, C>(ctx, ip + IP_FRAG_OFF).is_some_and(|f| f & IP_MF_OR_OFFSET == 0)
            // tc runs before ip_rcv, which would check these two.
            && ipv4_csum(ctx, ip, 20) == load::<u16, C>(ctx, ip + IP_CHECK)
            && outer_length_is_inner_plus_20(ctx)
            && load::<u8, C>(ctx, inner).is_some_and(|v| v >> 4 == 4 && v & 0xf > 5)
            && load::<u8, C>(ctx, inner + 20) == Some(DSR_OPT_TYPE)
            && same::<C, u32>(ctx, ip + IP_DADDR, inner + IP_DADDR)
    };
    ours && ctx.pop_outer_header(u32::from(I::ENCAP_LEN), I::IS_V6)
}

/// The outer IPv4 header's total length is the inner packet's and its own.
#[inline(always)]
fn outer_length_is_inner_plus_20<C: Hook>(ctx: &C) -> bool {
    let Some(outer) = load::<u16, C>(ctx, ETH_HLEN + IP_TOT_LEN) else {
        return false;
    };
    let Some(inner) = load::<u16, C>(ctx, ETH_HLEN + 20 + IP_TOT_LEN) else {
        return false;
    };
    u16::from_be(outer) == u16::from_be(inner).wrapping_add(20)
}

/// Whether the fields at `a` and `b` are equal. One load after the other:
/// with both in one expression, LLVM merged their bounds checks into
/// arithmetic on the packet's end, which the verifier refuses.
#[inline(never)]
fn same<C: Hook, T: Copy + PartialEq>(ctx: &C, a: usize, b: usize) -> bool {
    let Some(x) = load::<T, C>(ctx, a) else {
        return false;
    };
    let Some(y) = load::<T, C>(ctx, b) else {
        return false;
    };
    x == y
}
