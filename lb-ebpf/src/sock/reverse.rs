//! cgroup/recvmsg4, recvmsg6, getpeername4, getpeername6: backend → service address.
use aya_ebpf::{
    helpers::bpf_get_socket_cookie, macros::cgroup_sock_addr, programs::SockAddrContext,
    EbpfContext,
};
use lb_common::{
    config::CNT_SOCK_REVERSE,
    revnat::{SockRevNat4Key, SockRevNat6Key},
};

use super::{bytes_to_words, map_v4, v4_mapped, words_to_bytes, SockAddr, ALLOW};
use crate::{
    maps::{LB4_REVNAT, LB4_SOCK_REVNAT, LB6_REVNAT, LB6_SOCK_REVNAT},
    runtime::bump,
};

#[cgroup_sock_addr(recvmsg4)]
pub fn lb_recvmsg4(ctx: SockAddrContext) -> i32 {
    reverse4(&ctx, false)
}

#[cgroup_sock_addr(getpeername4)]
pub fn lb_getpeername4(ctx: SockAddrContext) -> i32 {
    reverse4(&ctx, false)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn lb_recvmsg6(ctx: SockAddrContext) -> i32 {
    reverse6(&ctx)
}

#[cgroup_sock_addr(getpeername6)]
pub fn lb_getpeername6(ctx: SockAddrContext) -> i32 {
    reverse6(&ctx)
}

/// These hooks may only return 1 (kernel/bpf/cgroup.c): they rewrite, never deny.
#[inline(always)]
fn reverse4(ctx: &SockAddrContext, mapped: bool) -> i32 {
    let sa = SockAddr::new(ctx.sock_addr);
    let Some(address) = sa.ipv4(mapped) else {
        return ALLOW;
    };
    // SAFETY: the hook's own context, valid for this run; the helper only reads the socket.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let key = SockRevNat4Key {
        cookie,
        address,
        port: sa.user_port(),
        pad: 0,
    };
    // SAFETY: the value is copied or read before any helper call could delete the entry (RCU keeps it alive for this run).
    let Some(entry) = (unsafe { LB4_SOCK_REVNAT.get(&key) }).copied() else {
        return ALLOW;
    };
    // Trust the socket's entry only while its service still has that frontend:
    // a deleted or re-created service must not leak an old address.
    // SAFETY: read before this run ends; RCU keeps a deleted element alive until then.
    match unsafe { LB4_REVNAT.get(&entry.service_id) } {
        Some(rev) if rev.address == entry.address && rev.port == entry.port => {
            if mapped {
                sa.set_user_ip6_words(map_v4(entry.address));
            } else {
                sa.set_user_ip4(entry.address);
            }
            sa.set_user_port(entry.port);
            bump(CNT_SOCK_REVERSE);
        }
        _ => {
            let _ = LB4_SOCK_REVNAT.remove(&key);
        }
    }
    ALLOW
}

#[inline(always)]
fn reverse6(ctx: &SockAddrContext) -> i32 {
    let sa = SockAddr::new(ctx.sock_addr);
    let words = sa.user_ip6_words();
    if v4_mapped(&words).is_some() {
        return reverse4(ctx, true);
    }
    // SAFETY: the hook's own context, valid for this run; the helper only reads the socket.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let key = SockRevNat6Key {
        cookie,
        address: words_to_bytes(&words),
        port: sa.user_port(),
        pad: [0; 6],
    };
    // SAFETY: the value is copied or read before any helper call could delete the entry (RCU keeps it alive for this run).
    let Some(entry) = (unsafe { LB6_SOCK_REVNAT.get(&key) }).copied() else {
        return ALLOW;
    };
    // SAFETY: read before this run ends; RCU keeps a deleted element alive until then.
    match unsafe { LB6_REVNAT.get(&entry.service_id) } {
        Some(rev) if rev.address == entry.address && rev.port == entry.port => {
            sa.set_user_ip6_words(bytes_to_words(&entry.address));
            sa.set_user_port(entry.port);
            bump(CNT_SOCK_REVERSE);
        }
        _ => {
            let _ = LB6_SOCK_REVNAT.remove(&key);
        }
    }
    ALLOW
}
