//! Direct server return: the frontend a flow was for travels to the backend's
//! node (on a TCP SYN, on every UDP datagram), so that node can make the
//! backend's replies leave from the frontend address, straight to the
//! client. IPv4 carries it in an IPv4 option, IPv6 in a Destination Options
//! extension header (`DSR6_*`, as Cilium does).
//!
//! Either goes right after the base header (20 or 40 bytes), ahead of any
//! options the packet already has (bpf_skb_adjust_room with
//! BPF_ADJ_ROOM_NET inserts at the end of the base header:
//! net/core/filter.c, bpf_skb_net_grow); the IPv4 option only when the
//! header stays within 60 bytes. Neither touches the L4 checksum: its
//! pseudo-header holds neither IP options nor extension headers.
use lb_common::{
    config::CNT_DSR_LEARNED,
    conntrack::{CtValue, CT_F_CLOSING, CT_F_DSR, CT_F_DSR_ENCAP, CT_REVERSE},
    drop::DropReason,
    nodeport::{DSR6_HDR_LEN, DSR6_OPT_LEN, DSR6_OPT_TYPE, DSR_OPT_LEN, DSR_OPT_TYPE},
    service::{
        SCOPE_ALL, SVC_FLAG_EXTERNAL_IP, SVC_FLAG_HOST_LOOPBACK, SVC_FLAG_LOAD_BALANCER,
        SVC_FLAG_NODE_PORT,
    },
};

use super::{
    access::{
        store, ETH_HLEN, IP6_NEXT_HEADER, IP6_PAYLOAD_LEN, IPPROTO_DSTOPTS, IPPROTO_TCP, IPV6_HLEN,
        IP_CHECK, IP_TOT_LEN, TCP_ACK, TCP_SYN,
    },
    csum::{diff16, fold, ipv4_csum, sum_words},
    ct::{self, now},
    drop_packet,
    family::Ip,
    parse::Flow,
    Action, Hook,
};
use crate::{
    runtime::bump,
    select::{V4, V6},
};

const BPF_NOEXIST: u64 = 1;

/// Whether this packet of a DSR flow carries the option.
#[inline(always)]
pub fn needs_option<I: Ip>(f: &Flow<I>) -> bool {
    f.proto != IPPROTO_TCP || f.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
}

/// The DSR request of flow `ct`: the option, and with the IPIP dispatch
/// the outer header around the packet (`encap`). A subprogram: inlined,
/// the two grew `rewrite_remote`'s frame past what the remote path's call
/// chain can hold within the 512-byte stack.
#[inline(never)]
pub fn add<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, ct: &CtValue<I::Addr>) -> bool {
    if !insert(ctx, f) {
        return false;
    }
    ct.flags & CT_F_DSR_ENCAP == 0
        || super::encap::push::<C, I>(ctx, f.tot_len + I::DSR_LEN, &ct.nat_addr, &ct.addr)
}

/// Inserts the option naming the frontend the packet was sent to (`f`
/// describes the packet before the DNAT).
#[inline(always)]
pub fn insert<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> bool {
    if let Some(f) = I::as_v4(f) {
        return insert_option(ctx, f, f.daddr, f.dport);
    }
    match I::as_v6(f) {
        Some(f) => insert_header6(ctx, f),
        None => false,
    }
}

/// IPv6: the Destination Options header, the IPv6 header's next header
/// and payload length changed to match.
#[inline(always)]
fn insert_header6<C: Hook>(ctx: &C, f: &Flow<V6>) -> bool {
    if !ctx.grow_ip_options(u32::from(DSR6_HDR_LEN)) {
        return false;
    }
    let ip = ETH_HLEN;
    let h = ip + IPV6_HLEN;
    let payload = f.tot_len as usize - IPV6_HLEN + DSR6_HDR_LEN as usize;
    let hdr: [u8; 4] = [f.proto, 2, DSR6_OPT_TYPE, DSR6_OPT_LEN];
    store(ctx, ip + IP6_PAYLOAD_LEN, (payload as u16).to_be())
        && store(ctx, ip + IP6_NEXT_HEADER, IPPROTO_DSTOPTS)
        && store(ctx, h, hdr)
        && store(ctx, h + 4, f.dport)
        && store(ctx, h + 6, 0u16)
        && store(ctx, h + 8, f.daddr)
}

/// IPv4: the option: type, length, the frontend port and address.
#[inline(always)]
fn insert_option<C: Hook>(ctx: &C, f: &Flow<V4>, frontend: u32, fport: u16) -> bool {
    let ip_len = f.ip_len & 0x3c;
    if ip_len + DSR_OPT_LEN as usize > 60 || !ctx.grow_ip_options(u32::from(DSR_OPT_LEN)) {
        return false;
    }
    let ip = ETH_HLEN;
    let new_len = ip_len + DSR_OPT_LEN as usize;
    let opt: [u8; 2] = [DSR_OPT_TYPE, DSR_OPT_LEN];
    let ok = store(ctx, ip, 0x40u8 | (new_len / 4) as u8)
        && store(
            ctx,
            ip + IP_TOT_LEN,
            (f.tot_len + u16::from(DSR_OPT_LEN)).to_be(),
        )
        && store(ctx, ip + 20, opt)
        && store(ctx, ip + 22, fport)
        && store(ctx, ip + 24, frontend);
    if !ok {
        return false;
    }
    match ipv4_csum(ctx, ip, new_len) {
        Some(c) => store(ctx, ip + IP_CHECK, c),
        None => false,
    }
}

/// Takes our option (IPv4) or header (IPv6) out again.
#[inline(always)]
fn remove<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> bool {
    if let Some(f) = I::as_v4(f) {
        return remove_option(ctx, f);
    }
    match I::as_v6(f) {
        Some(f) => remove_header6(ctx, f),
        None => false,
    }
}

/// The kernel takes the removed bytes out of a CHECKSUM_COMPLETE skb->csum
/// (bpf_skb_generic_pop, skb_postpull_rcsum); the two header words that
/// change (payload length; next header with the hop limit) are put in step
/// here, as IPv6 has no header checksum to balance them (IPv4's option
/// removal recomputes its header checksum, which keeps the header's sum).
#[inline(always)]
fn remove_header6<C: Hook>(ctx: &C, f: &Flow<V6>) -> bool {
    if !ctx.shrink_ip_options(u32::from(DSR6_HDR_LEN)) {
        return false;
    }
    let ip = ETH_HLEN;
    let old_payload = ((f.tot_len as usize - IPV6_HLEN) as u16).to_be();
    let new_payload = ((f.tot_len as usize - IPV6_HLEN - DSR6_HDR_LEN as usize) as u16).to_be();
    let old_next = u16::from_ne_bytes([IPPROTO_DSTOPTS, f.ttl]);
    let new_next = u16::from_ne_bytes([f.proto, f.ttl]);
    if !store(ctx, ip + IP6_PAYLOAD_LEN, new_payload) || !store(ctx, ip + IP6_NEXT_HEADER, f.proto)
    {
        return false;
    }
    ctx.csum_complete_fixup(diff16(old_payload, new_payload) + diff16(old_next, new_next));
    true
}

/// Takes our option out again (it is the first one).
#[inline(always)]
fn remove_option<C: Hook>(ctx: &C, f: &Flow<V4>) -> bool {
    let ip_len = f.ip_len & 0x3c;
    if ip_len < 28 || !ctx.shrink_ip_options(u32::from(DSR_OPT_LEN)) {
        return false;
    }
    let ip = ETH_HLEN;
    let new_len = ip_len - DSR_OPT_LEN as usize;
    // The kernel took the option's bytes out of a CHECKSUM_COMPLETE
    // skb->csum (skb_postpull_rcsum); the base header's own sum changes too
    // (it balanced the option's before; it balances nothing after), which
    // is put in step below. Measured over the 20 bytes, before and after.
    let Some(before) = sum_words(ctx, ip, 10, usize::MAX) else {
        return false;
    };
    let ok = store(ctx, ip, 0x40u8 | (new_len / 4) as u8)
        && store(
            ctx,
            ip + IP_TOT_LEN,
            (f.tot_len - u16::from(DSR_OPT_LEN)).to_be(),
        );
    if !ok {
        return false;
    }
    let stored = match ipv4_csum(ctx, ip, new_len) {
        Some(c) => store(ctx, ip + IP_CHECK, c),
        None => false,
    };
    let Some(after) = sum_words(ctx, ip, 10, usize::MAX) else {
        return false;
    };
    ctx.csum_complete_fixup(u32::from(fold(after)) + u32::from(!fold(before)));
    stored
}

/// On the backend's node: remembers which frontend a DSR flow was for, so
/// the backend's replies leave from it; then strips the option and lets the
/// stack deliver the packet.
///
/// Only an option naming a frontend this node serves too is learned: a
/// LoadBalancer or external IP with that port, or a NodePort, which this
/// node serves on its own address (the option carries the first node's),
/// and it never takes over a live flow of the same tuple for another
/// frontend: otherwise any outside host could plant entries that rewrite a
/// pod's replies. A frontend with loadBalancerSourceRanges is learned only
/// for a client its ranges admit.
#[inline(never)]
pub fn learn<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
    let (vip, vport) = (f.dsr_addr, f.dsr_port);
    let key = I::service_key(vip, vport, f.proto, SCOPE_ALL);
    let svc = match I::service(&key) {
        // Never a localhost NodePort: replies rewritten to come from
        // 127.0.0.1 would leave the node (SVC_FLAG_HOST_LOOPBACK).
        Some(svc)
            if svc.flags & (SVC_FLAG_NODE_PORT | SVC_FLAG_LOAD_BALANCER | SVC_FLAG_EXTERNAL_IP)
                != 0
                && svc.flags & SVC_FLAG_HOST_LOOPBACK == 0 =>
        {
            Some(svc)
        }
        Some(_) => None,
        None => match I::device_address(ctx.ingress_ifindex()) {
            Some(node) => {
                let own = I::service_key(node, vport, f.proto, SCOPE_ALL);
                I::service(&own).filter(|s| s.flags & SVC_FLAG_NODE_PORT != 0)
            }
            None => None,
        },
    };
    let Some(svc) = svc else {
        return drop_packet(ctx, f, DropReason::DsrRejected, 0);
    };
    // A frontend guarded by loadBalancerSourceRanges admits on this node only
    // the clients it admits on the first: otherwise a client the ranges
    // refuse could send its own option naming the guarded frontend and have
    // a backend answer it from that address (the first node checked the
    // ranges against the same source address, so a real flow passes).
    if !I::admits(&svc, f.saddr) {
        return drop_packet(ctx, f, DropReason::SourceRange, svc.service_id);
    }
    let rkey = f.reply_ct_key(CT_REVERSE);
    let val = CtValue {
        backend_id: 0,
        service_id: 0,
        addr: vip,
        nat_addr: I::Addr::default(),
        port: vport,
        nat_port: 0,
        flags: CT_F_DSR,
        backends_gen: 0,
        last_seen_ns: now(),
    };
    if I::ct().insert(&rkey, &val, BPF_NOEXIST).is_err() {
        // The tuple has an entry: replace it only when it is the same
        // frontend, or its flow is over (closing, idled out) or a new one
        // starts (a SYN).
        let replace = match ct::peek::<I>(&rkey, f.proto) {
            None => true,
            Some(old) => {
                (old.addr == vip && old.port == vport)
                    || old.flags & CT_F_CLOSING != 0
                    || f.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
            }
        };
        if !replace {
            return drop_packet(ctx, f, DropReason::DsrRejected, 0);
        }
        if I::ct().insert(&rkey, &val, 0).is_err() {
            return drop_packet(ctx, f, DropReason::CtFull, 0);
        }
    }
    bump(CNT_DSR_LEARNED);
    // If it cannot come out, it stays: the stack skips an unknown option.
    remove(ctx, f);
    Action::PASS
}
