//! Direct server return: the frontend a flow was for travels to the backend's
//! node in an IPv4 option (on a TCP SYN, on every UDP datagram), so that node
//! can make the backend's replies leave from the frontend address, straight
//! to the client.
//!
//! The option goes right after the 20-byte base header, ahead of any options
//! the packet already has (bpf_skb_adjust_room with BPF_ADJ_ROOM_NET inserts
//! at the end of the base header: net/core/filter.c, bpf_skb_net_grow), and
//! only when the header stays within 60 bytes.
use lb_common::{
    config::CNT_DSR_LEARNED,
    drop::DropReason,
    nodeport::{Ct4Value, CT_F_CLOSING, CT_F_DSR, CT_REVERSE, DSR_OPT_LEN, DSR_OPT_TYPE},
    service::{
        Service4Key, SCOPE_ALL, SVC_FLAG_EXTERNAL_IP, SVC_FLAG_LOAD_BALANCER, SVC_FLAG_NODE_PORT,
    },
};

use super::{
    access::{store, ETH_HLEN, IPPROTO_TCP, IP_CHECK, IP_TOT_LEN, TCP_ACK, TCP_SYN},
    csum::ipv4_csum,
    ct::{self, now},
    drop_packet,
    family::Ip,
    parse::Flow,
    Action, Hook,
};
use crate::{
    lb::{Family, V4},
    maps::{LB4_CT, LB_DEVICES},
    runtime::bump,
};

const BPF_NOEXIST: u64 = 1;

/// Whether this packet of a DSR flow carries the option.
#[inline(always)]
pub fn needs_option<I: Ip>(f: &Flow<I>) -> bool {
    f.proto != IPPROTO_TCP || f.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
}

/// Inserts the option: type, length, the frontend port and address (as the
/// packet had them before the DNAT). `f` describes the packet before.
#[inline(always)]
pub fn insert_option<C: Hook>(ctx: &C, f: &Flow<V4>, frontend: u32, fport: u16) -> bool {
    let ip_len = f.ip_len & 0x3c;
    if ip_len + DSR_OPT_LEN as usize > 60 || !ctx.grow_ip_options(DSR_OPT_LEN as u32) {
        return false;
    }
    let ip = ETH_HLEN;
    let new_len = ip_len + DSR_OPT_LEN as usize;
    let opt: [u8; 2] = [DSR_OPT_TYPE, DSR_OPT_LEN];
    let ok = store(ctx, ip, 0x40u8 | (new_len / 4) as u8)
        && store(
            ctx,
            ip + IP_TOT_LEN,
            (f.tot_len + DSR_OPT_LEN as u16).to_be(),
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

/// Takes our option out again (it is the first one).
#[inline(always)]
fn remove_option<C: Hook>(ctx: &C, f: &Flow<V4>) -> bool {
    let ip_len = f.ip_len & 0x3c;
    if ip_len < 28 || !ctx.shrink_ip_options(DSR_OPT_LEN as u32) {
        return false;
    }
    let ip = ETH_HLEN;
    let new_len = ip_len - DSR_OPT_LEN as usize;
    let ok = store(ctx, ip, 0x40u8 | (new_len / 4) as u8)
        && store(
            ctx,
            ip + IP_TOT_LEN,
            (f.tot_len - DSR_OPT_LEN as u16).to_be(),
        );
    if !ok {
        return false;
    }
    match ipv4_csum(ctx, ip, new_len) {
        Some(c) => store(ctx, ip + IP_CHECK, c),
        None => false,
    }
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
/// pod's replies.
#[inline(never)]
pub fn learn<C: Hook>(ctx: &C, f: &Flow<V4>) -> Action {
    let (vip, vport) = (f.dsr_addr, f.dsr_port);
    let key = Service4Key::new(vip, vport, f.proto, SCOPE_ALL, 0);
    let known = match V4::service(&key) {
        Some(svc) => {
            svc.flags & (SVC_FLAG_NODE_PORT | SVC_FLAG_LOAD_BALANCER | SVC_FLAG_EXTERNAL_IP) != 0
        }
        None => {
            // SAFETY: a map value, copied at once.
            match unsafe { LB_DEVICES.get(&ctx.ingress_ifindex()) }.copied() {
                Some(dev) => {
                    let own = Service4Key::new(dev.address, vport, f.proto, SCOPE_ALL, 0);
                    V4::service(&own).is_some_and(|s| s.flags & SVC_FLAG_NODE_PORT != 0)
                }
                None => false,
            }
        }
    };
    if !known {
        return drop_packet(ctx, f, DropReason::DsrRejected, 0);
    }
    let rkey = f.reply_ct_key(CT_REVERSE);
    let val = Ct4Value {
        backend_id: 0,
        service_id: 0,
        addr: vip,
        nat_addr: 0,
        port: vport,
        nat_port: 0,
        flags: CT_F_DSR,
        pad: 0,
        last_seen_ns: now(),
    };
    if LB4_CT.insert(&rkey, &val, BPF_NOEXIST).is_err() {
        // The tuple has an entry: replace it only when it is the same
        // frontend, or its flow is over (closing, idled out) or a new one
        // starts (a SYN).
        let replace = match ct::peek::<V4>(&rkey, f.proto) {
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
        if LB4_CT.insert(&rkey, &val, 0).is_err() {
            return drop_packet(ctx, f, DropReason::CtFull, 0);
        }
    }
    bump(CNT_DSR_LEARNED);
    // If it cannot come out, it stays: the stack ignores an unknown option.
    remove_option(ctx, f);
    Action::PASS
}
