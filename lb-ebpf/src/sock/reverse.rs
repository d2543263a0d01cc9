//! cgroup/recvmsg4, recvmsg6, getpeername4, getpeername6: backend → service
//! address, one body for both families (`reverse::<F>`).
use aya_ebpf::{macros::cgroup_sock_addr, programs::SockAddrContext};
use lb_common::Addr6;
use lb_common::{config::CNT_SOCK_REVERSE, proto};

use super::{family::SockFamily, peers, v4_mapped, Dest, SockAddr, ALLOW};
use crate::{
    runtime::bump,
    select::{V4, V6},
};

#[cgroup_sock_addr(recvmsg4)]
pub fn lb_recvmsg4(ctx: SockAddrContext) -> i32 {
    reverse4(&ctx)
}

#[cgroup_sock_addr(getpeername4)]
pub fn lb_getpeername4(ctx: SockAddrContext) -> i32 {
    reverse4(&ctx)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn lb_recvmsg6(ctx: SockAddrContext) -> i32 {
    reverse6(&ctx)
}

#[cgroup_sock_addr(getpeername6)]
pub fn lb_getpeername6(ctx: SockAddrContext) -> i32 {
    reverse6(&ctx)
}

#[inline(always)]
fn reverse4(ctx: &SockAddrContext) -> i32 {
    let sa = SockAddr::new(ctx.sock_addr);
    reverse::<V4>(ctx, [sa.user_ip4(), 0, 0, 0], Dest::Ip4)
}

#[inline(always)]
fn reverse6(ctx: &SockAddrContext) -> i32 {
    let words = SockAddr::new(ctx.sock_addr).user_ip6_words();
    match v4_mapped(&words) {
        Some(a) => reverse::<V4>(ctx, [a, 0, 0, 0], Dest::Mapped),
        None => reverse::<V6>(ctx, words, Dest::Ip6),
    }
}

/// These hooks may only return 1 (kernel/bpf/cgroup.c): they rewrite, never deny.
#[inline(always)]
fn reverse<F: SockFamily>(ctx: &SockAddrContext, peer: Addr6, dest: Dest) -> i32 {
    let sa = SockAddr::new(ctx.sock_addr);
    let port = sa.user_port();
    let tcp = sa.protocol() == u32::from(proto::TCP);
    let Some((t, found)) = peers::recall::<F>(ctx, peer, port, tcp) else {
        return ALLOW;
    };
    // Trust the socket's translation only while its service still has that
    // frontend: a deleted or re-created service must not leak an old address.
    match F::frontend_of(t.service_id) {
        Some((address, fport)) if address == t.frontend && fport == t.frontend_port => {
            dest.write(&sa, t.frontend, t.frontend_port);
            bump(CNT_SOCK_REVERSE);
        }
        _ => peers::forget::<F>(ctx, found, peer, port),
    }
    ALLOW
}
