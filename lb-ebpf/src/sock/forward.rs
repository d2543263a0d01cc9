//! cgroup/connect4, connect6, sendmsg4, sendmsg6: service address → backend.
use aya_ebpf::{
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_set_retval},
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
    EbpfContext,
};
use aya_log_ebpf::{debug, warn};
use lb_common::{
    config::CNT_SOCK_TRANSLATIONS,
    drop::{Direction, DropReason},
    event::{Event, EVENT_TRACE, HOOK_CONNECT4, HOOK_CONNECT6, HOOK_SENDMSG4, HOOK_SENDMSG6},
    proto,
    revnat::{SockRevNat4Key, SockRevNat4Value, SockRevNat6Key, SockRevNat6Value},
    service::{
        Service4Key, Service6Key, ServiceValue, SCOPE_ALL, SVC_FLAG_AFFINITY,
        SVC_FLAG_FOREIGN_EXTERNAL_IP,
    },
};

use super::{
    bytes_to_words, map_v4, udp_choice, v4_mapped, words_to_bytes, SockAddr, ALLOW, DENY,
    ECONNREFUSED,
};
use crate::{
    drop, events,
    lb::{self, Lookup, V4, V6},
    maps::{LB4_SOCK_REVNAT, LB6_SOCK_REVNAT},
    runtime::{self, bump, log_enabled},
};

const LOG_WARN: u32 = 2;
const LOG_DEBUG: u32 = 4;

#[cgroup_sock_addr(connect4)]
pub fn lb_connect4(ctx: SockAddrContext) -> i32 {
    forward4(&ctx, HOOK_CONNECT4, false)
}

/// Unconnected UDP: every sendto() is translated on its own.
#[cgroup_sock_addr(sendmsg4)]
pub fn lb_sendmsg4(ctx: SockAddrContext) -> i32 {
    forward4(&ctx, HOOK_SENDMSG4, false)
}

#[cgroup_sock_addr(connect6)]
pub fn lb_connect6(ctx: SockAddrContext) -> i32 {
    forward6(&ctx, HOOK_CONNECT6)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn lb_sendmsg6(ctx: SockAddrContext) -> i32 {
    forward6(&ctx, HOOK_SENDMSG6)
}

#[inline(always)]
fn tcp_or_udp(sa: &SockAddr) -> Option<u8> {
    let p = sa.protocol();
    (p == proto::TCP as u32 || p == proto::UDP as u32).then_some(p as u8)
}

/// The event skeleton for this call: hook, protocol, original destination.
#[inline(always)]
fn event(
    ctx: &SockAddrContext,
    hook: u8,
    proto: u8,
    family: u8,
    daddr: [u8; 16],
    dport: u16,
) -> Event {
    let mut e = Event::zeroed();
    e.hook = hook;
    e.proto = proto;
    e.family = family;
    e.daddr = daddr;
    e.dport = dport;
    // SAFETY: the hook's own context, valid for this run; the helper only reads the socket.
    e.cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    e
}

/// The client identity for session affinity: the socket's network namespace.
#[inline(always)]
fn netns_cookie(ctx: &SockAddrContext) -> u64 {
    // SAFETY: the hook's own context, valid for this run (helper: Linux 5.7+ for sock_addr).
    unsafe { bpf_get_netns_cookie(ctx.as_ptr()) }
}

#[inline(always)]
fn v4_bytes(a: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(&a.to_ne_bytes());
    b
}

/// `mapped`: the socket is IPv6 and dialed a v4-mapped address.
#[inline(always)]
fn forward4(ctx: &SockAddrContext, hook: u8, mapped: bool) -> i32 {
    // The client's namespace: the host-only check and session affinity key.
    let netns = netns_cookie(ctx);
    if runtime::outside_host_namespace(netns) {
        return ALLOW;
    }
    let sa = SockAddr::new(ctx.sock_addr);
    let Some(protocol) = tcp_or_udp(&sa) else {
        return ALLOW;
    };
    let Some(address) = sa.ipv4(mapped) else {
        return ALLOW;
    };
    let key = Service4Key::new(address, sa.user_port(), protocol, SCOPE_ALL, 0);
    let svc = match lb::lookup_service::<V4>(&key) {
        Lookup::NotService => return ALLOW,
        Lookup::UnknownPort => {
            let mut e = event(ctx, hook, protocol, 4, v4_bytes(key.address), key.dport);
            return reject(DropReason::NoServicePort, &mut e);
        }
        // CVE-2020-8554: an external IP the node does not own is the real
        // address it looks like, for every socket.
        Lookup::Service(svc) if svc.flags & SVC_FLAG_FOREIGN_EXTERNAL_IP != 0 => return ALLOW,
        Lookup::Service(svc) => svc,
    };
    let per_socket = keeps_choice(hook, protocol, &svc);
    let picked = if per_socket {
        udp_choice::choose::<V4>(ctx, [address, 0, 0, 0], key.dport, &key, &svc)
    } else {
        lb::select_backend_for::<V4>(&key, &svc, netns)
    };
    let (backend_id, backend) = match picked {
        Ok(found) => found,
        Err(reason) => {
            if reason == DropReason::BackendMissing && log_enabled(LOG_WARN) {
                warn!(
                    ctx,
                    "service {} names a backend that is not in LB4_BACKENDS", svc.service_id
                );
            }
            let mut e = event(ctx, hook, protocol, 4, v4_bytes(key.address), key.dport);
            e.service_id = svc.service_id;
            return reject(reason, &mut e);
        }
    };

    // Remember the translation for this socket so replies (recvmsg) and
    // getpeername() show the service address again.
    // SAFETY: the hook's own context, valid for this run; the helper only reads the socket.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let rev_key = SockRevNat4Key {
        cookie,
        address: backend.address,
        port: backend.port,
        pad: 0,
    };
    let rev = SockRevNat4Value {
        address: key.address,
        port: key.dport,
        pad: 0,
        service_id: svc.service_id,
    };
    // A socket that keeps its choice finds its entry in place: no rewrite.
    let current = per_socket
        // SAFETY: the value is copied or read before any helper call could delete the entry (RCU keeps it alive for this run).
        && unsafe { LB4_SOCK_REVNAT.get(&rev_key) }.is_some_and(|v| {
            v.address == rev.address && v.port == rev.port && v.service_id == rev.service_id
        });
    if !current && LB4_SOCK_REVNAT.insert(&rev_key, &rev, 0).is_err() {
        // The connection itself still works; only the reverse view is lost.
        drop::count(DropReason::RevNatUpdateFailed, Direction::Egress);
    }

    if mapped {
        sa.set_user_ip6_words(map_v4(backend.address));
    } else {
        sa.set_user_ip4(backend.address);
    }
    sa.set_user_port(backend.port);
    bump(CNT_SOCK_TRANSLATIONS);
    if runtime::tracing() {
        let mut e = event(ctx, hook, protocol, 4, v4_bytes(key.address), key.dport);
        e.kind = EVENT_TRACE;
        e.service_id = svc.service_id;
        e.backend_id = backend_id;
        e.xaddr = v4_bytes(backend.address);
        e.xport = backend.port;
        events::emit(&mut e);
    }
    if log_enabled(LOG_DEBUG) {
        debug!(ctx, "service {} -> backend {}", svc.service_id, backend_id);
    }
    ALLOW
}

#[inline(always)]
fn forward6(ctx: &SockAddrContext, hook: u8) -> i32 {
    // The client's namespace: the host-only check and session affinity key.
    let netns = netns_cookie(ctx);
    if runtime::outside_host_namespace(netns) {
        return ALLOW;
    }
    let sa = SockAddr::new(ctx.sock_addr);
    let words = sa.user_ip6_words();
    if v4_mapped(&words).is_some() {
        let hook4 = if hook == HOOK_CONNECT6 {
            HOOK_CONNECT4
        } else {
            HOOK_SENDMSG4
        };
        return forward4(ctx, hook4, true);
    }
    let Some(protocol) = tcp_or_udp(&sa) else {
        return ALLOW;
    };
    let key = Service6Key::new(
        words_to_bytes(&words),
        sa.user_port(),
        protocol,
        SCOPE_ALL,
        0,
    );
    let svc = match lb::lookup_service::<V6>(&key) {
        Lookup::NotService => return ALLOW,
        Lookup::UnknownPort => {
            let mut e = event(ctx, hook, protocol, 6, key.address, key.dport);
            return reject(DropReason::NoServicePort, &mut e);
        }
        // CVE-2020-8554: an external IP the node does not own is the real
        // address it looks like, for every socket.
        Lookup::Service(svc) if svc.flags & SVC_FLAG_FOREIGN_EXTERNAL_IP != 0 => return ALLOW,
        Lookup::Service(svc) => svc,
    };
    let per_socket = keeps_choice(hook, protocol, &svc);
    let picked = if per_socket {
        udp_choice::choose::<V6>(ctx, words, key.dport, &key, &svc)
    } else {
        lb::select_backend_for::<V6>(&key, &svc, netns)
    };
    let (backend_id, backend) = match picked {
        Ok(found) => found,
        Err(reason) => {
            let mut e = event(ctx, hook, protocol, 6, key.address, key.dport);
            e.service_id = svc.service_id;
            return reject(reason, &mut e);
        }
    };
    // SAFETY: the hook's own context, valid for this run; the helper only reads the socket.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let rev_key = SockRevNat6Key {
        cookie,
        address: backend.address,
        port: backend.port,
        pad: [0; 6],
    };
    let rev = SockRevNat6Value {
        address: key.address,
        port: key.dport,
        pad: 0,
        service_id: svc.service_id,
    };
    let current = per_socket
        // SAFETY: the value is copied or read before any helper call could delete the entry (RCU keeps it alive for this run).
        && unsafe { LB6_SOCK_REVNAT.get(&rev_key) }.is_some_and(|v| {
            v.address == rev.address && v.port == rev.port && v.service_id == rev.service_id
        });
    if !current && LB6_SOCK_REVNAT.insert(&rev_key, &rev, 0).is_err() {
        drop::count(DropReason::RevNatUpdateFailed, Direction::Egress);
    }
    sa.set_user_ip6_words(bytes_to_words(&backend.address));
    sa.set_user_port(backend.port);
    bump(CNT_SOCK_TRANSLATIONS);
    if runtime::tracing() {
        let mut e = event(ctx, hook, protocol, 6, key.address, key.dport);
        e.kind = EVENT_TRACE;
        e.service_id = svc.service_id;
        e.backend_id = backend_id;
        e.xaddr = backend.address;
        e.xport = backend.port;
        events::emit(&mut e);
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
