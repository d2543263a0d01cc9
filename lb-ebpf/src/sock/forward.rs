//! cgroup/connect4, connect6, sendmsg4, sendmsg6: service address → backend.
//! One body for both families (`forward::<F>`); the entry points only say
//! where the address is and how to write it back.
use aya_ebpf::{
    helpers::{bpf_get_netns_cookie, bpf_set_retval},
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
    EbpfContext,
};
use aya_log_ebpf::{debug, warn};
use lb_common::Addr6;
use lb_common::{
    config::CNT_SOCK_TRANSLATIONS,
    drop::{Direction, DropReason},
    event::{Event, EVENT_TRACE, HOOK_CONNECT4, HOOK_CONNECT6, HOOK_SENDMSG4, HOOK_SENDMSG6},
    proto,
    service::{
        ServiceValue, SVC_FLAG_AFFINITY, SVC_FLAG_FOREIGN_EXTERNAL_IP, SVC_FLAG_HOST_LOOPBACK,
        SVC_FLAG_STATS,
    },
};

use super::{
    family::{SockFamily, Translation},
    peers, tcp_table, udp_choice, v4_mapped, Dest, SockAddr, ALLOW, DENY, ECONNREFUSED,
};
use crate::{
    drop, events,
    runtime::{self, bump, log_enabled},
    select::{self, Lookup, V4, V6},
};

const LOG_WARN: u32 = 2;
const LOG_DEBUG: u32 = 4;

#[cgroup_sock_addr(connect4)]
pub fn lb_connect4(ctx: SockAddrContext) -> i32 {
    let sa = SockAddr::new(ctx.sock_addr);
    forward::<V4>(&ctx, HOOK_CONNECT4, [sa.user_ip4(), 0, 0, 0], Dest::Ip4)
}

/// Unconnected UDP: every sendto() is translated on its own.
#[cgroup_sock_addr(sendmsg4)]
pub fn lb_sendmsg4(ctx: SockAddrContext) -> i32 {
    let sa = SockAddr::new(ctx.sock_addr);
    forward::<V4>(&ctx, HOOK_SENDMSG4, [sa.user_ip4(), 0, 0, 0], Dest::Ip4)
}

#[cgroup_sock_addr(connect6)]
pub fn lb_connect6(ctx: SockAddrContext) -> i32 {
    forward6(&ctx, HOOK_CONNECT6, HOOK_CONNECT4)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn lb_sendmsg6(ctx: SockAddrContext) -> i32 {
    forward6(&ctx, HOOK_SENDMSG6, HOOK_SENDMSG4)
}

/// An IPv6 socket dialing a v4-mapped address goes through the IPv4 maps:
/// the kernel routes it as IPv4.
#[inline(always)]
fn forward6(ctx: &SockAddrContext, hook: u8, hook4: u8) -> i32 {
    let words = SockAddr::new(ctx.sock_addr).user_ip6_words();
    match v4_mapped(&words) {
        Some(a) => forward::<V4>(ctx, hook4, [a, 0, 0, 0], Dest::Mapped),
        None => forward::<V6>(ctx, hook, words, Dest::Ip6),
    }
}

#[inline(always)]
fn tcp_or_udp(sa: &SockAddr) -> Option<u8> {
    let p = sa.protocol();
    (p == u32::from(proto::TCP) || p == u32::from(proto::UDP)).then_some(p as u8)
}

/// The event skeleton for this call: hook, protocol, original destination.
#[inline(always)]
fn event<F: SockFamily>(
    ctx: &SockAddrContext,
    hook: u8,
    proto: u8,
    daddr: Addr6,
    dport: u16,
) -> Event {
    let mut e = Event::zeroed();
    e.hook = hook;
    e.proto = proto;
    e.family = F::FAMILY;
    e.daddr = daddr;
    e.dport = dport;
    e.cookie = peers::cookie(ctx);
    e
}

/// The client identity for session affinity: the socket's network namespace.
#[inline(always)]
fn netns_cookie(ctx: &SockAddrContext) -> u64 {
    // SAFETY: the hook's own context, valid for this run (helper: Linux 5.7+ for sock_addr).
    unsafe { bpf_get_netns_cookie(ctx.as_ptr()) }
}

/// `address` is what the socket dialed (IPv4 in the first word); `dest`
/// says how to write the backend back.
#[inline(always)]
fn forward<F: SockFamily>(ctx: &SockAddrContext, hook: u8, address: Addr6, dest: Dest) -> i32 {
    // The client's namespace: the host-only check and session affinity key.
    let netns = netns_cookie(ctx);
    if runtime::outside_host_namespace(netns) {
        return ALLOW;
    }
    let sa = SockAddr::new(ctx.sock_addr);
    let Some(protocol) = tcp_or_udp(&sa) else {
        return ALLOW;
    };
    let dport = sa.user_port();
    let key = F::frontend_key(address, dport, protocol);
    let svc = match select::lookup_service::<F>(&key) {
        Lookup::NotService => return ALLOW,
        Lookup::UnknownPort => {
            let mut e = event::<F>(ctx, hook, protocol, address, dport);
            return reject(DropReason::NoServicePort, &mut e);
        }
        // CVE-2020-8554: an external IP the node does not own is the real
        // address it looks like, for every socket.
        Lookup::Service(svc) if svc.flags & SVC_FLAG_FOREIGN_EXTERNAL_IP != 0 => return ALLOW,
        // A localhost NodePort is the host's: a pod's 127.0.0.1 and ::1
        // are its own loopback.
        Lookup::Service(svc)
            if svc.flags & SVC_FLAG_HOST_LOOPBACK != 0 && !runtime::in_host_namespace(netns) =>
        {
            return ALLOW
        }
        Lookup::Service(svc) => svc,
    };
    let picked = if keeps_choice(hook, protocol, &svc) {
        udp_choice::choose::<F>(ctx, address, dport, &key, &svc)
    } else {
        select::select_backend_for::<F>(&key, &svc, netns)
    };
    let (backend_id, backend) = match picked {
        Ok(found) => found,
        Err(reason) => {
            if reason == DropReason::BackendMissing && log_enabled(LOG_WARN) {
                warn!(
                    ctx,
                    "service {} names a backend that is not in LB{}_BACKENDS",
                    svc.service_id,
                    F::FAMILY
                );
            }
            let mut e = event::<F>(ctx, hook, protocol, address, dport);
            e.service_id = svc.service_id;
            return reject(reason, &mut e);
        }
    };
    let (baddr, bport) = F::target(&backend);

    // Remember the translation for this socket so replies (recvmsg) and
    // getpeername() show the service address again.
    let t = Translation {
        frontend: address,
        frontend_port: dport,
        service_id: svc.service_id,
    };
    // TCP: the table by cookie (cheaper per connect than the LRU or
    // socket storage); UDP: the socket's own storage, which churn cannot
    // evict (see `tcp_table` and `peers` for measurements and reasons).
    let kept = if protocol == proto::TCP {
        tcp_table::put::<F>(peers::cookie(ctx), baddr, bport, &t)
    } else if hook == HOOK_CONNECT4 || hook == HOOK_CONNECT6 {
        // A connected UDP socket is also indexed in the shared LRU: the
        // agent finds it there (by cookie and backend) when its backend
        // goes, to destroy it.
        let stored = peers::remember::<F>(ctx, baddr, bport, &t);
        F::lru_put(peers::cookie(ctx), baddr, bport, &t) && stored
    } else {
        peers::remember::<F>(ctx, baddr, bport, &t)
    };
    if !kept {
        // The connection itself still works; only the reverse view is lost.
        drop::count(DropReason::RevNatUpdateFailed, Direction::Egress);
    }

    dest.write(&sa, baddr, bport);
    bump(CNT_SOCK_TRANSLATIONS);
    if svc.flags & SVC_FLAG_STATS != 0 {
        crate::stats::count_connect(svc.service_id);
    }
    if runtime::tracing() {
        let mut e = event::<F>(ctx, hook, protocol, address, dport);
        e.kind = EVENT_TRACE;
        e.service_id = svc.service_id;
        e.backend_id = backend_id;
        e.xaddr = baddr;
        e.xport = bport;
        events::emit(&mut e);
    }
    if log_enabled(LOG_DEBUG) {
        debug!(ctx, "service {} -> backend {}", svc.service_id, backend_id);
    }
    ALLOW
}

/// Unconnected UDP (sendmsg) keeps one backend per socket and frontend
/// (`udp_choice`), unless the service asks for ClientIP affinity, which
/// already keeps every socket of the client on one backend.
#[inline(always)]
fn keeps_choice(hook: u8, protocol: u8, svc: &ServiceValue) -> bool {
    (hook == HOOK_SENDMSG4 || hook == HOOK_SENDMSG6)
        && protocol == proto::UDP
        && svc.flags & SVC_FLAG_AFFINITY == 0
}

/// Fails the syscall with ECONNREFUSED, as kube-proxy's REJECT rule would.
#[inline(always)]
fn reject(reason: DropReason, event: &mut Event) -> i32 {
    drop::from_socket(reason, Direction::Egress, event);
    // SAFETY: a plain helper call from a cgroup hook (Linux 5.18+), no pointers.
    unsafe { bpf_set_retval(-ECONNREFUSED) };
    DENY
}
