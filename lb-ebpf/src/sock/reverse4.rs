//! cgroup/recvmsg4 and cgroup/getpeername4: backend → service address.
use aya_ebpf::{
    helpers::bpf_get_socket_cookie, macros::cgroup_sock_addr, programs::SockAddrContext, EbpfContext,
};
use lb_common::revnat::SockRevNat4Key;

use super::{SockAddr, ALLOW};
use crate::maps::{LB4_REVNAT, LB4_SOCK_REVNAT};

#[cgroup_sock_addr(recvmsg4)]
pub fn lb_recvmsg4(ctx: SockAddrContext) -> i32 {
    reverse4(&ctx)
}

#[cgroup_sock_addr(getpeername4)]
pub fn lb_getpeername4(ctx: SockAddrContext) -> i32 {
    reverse4(&ctx)
}

/// These hooks may only return 1 (kernel/bpf/cgroup.c): they rewrite, never deny.
#[inline(always)]
fn reverse4(ctx: &SockAddrContext) -> i32 {
    let sa = SockAddr::new(ctx.sock_addr);
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let key = SockRevNat4Key { cookie, address: sa.user_ip4(), port: sa.user_port(), pad: 0 };
    let Some(entry) = (unsafe { LB4_SOCK_REVNAT.get(&key) }).copied() else {
        return ALLOW;
    };
    // Trust the socket's entry only while its service still has that frontend:
    // a deleted or re-created service must not leak an old address.
    match unsafe { LB4_REVNAT.get(&entry.service_id) } {
        Some(rev) if rev.address == entry.address && rev.port == entry.port => {
            sa.set_user_ip4(entry.address);
            sa.set_user_port(entry.port);
        }
        _ => {
            let _ = LB4_SOCK_REVNAT.remove(&key);
        }
    }
    ALLOW
}
