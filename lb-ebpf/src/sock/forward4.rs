//! cgroup/connect4 and cgroup/sendmsg4: service address → backend.
use aya_ebpf::{
    helpers::{bpf_get_socket_cookie, bpf_set_retval},
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
    EbpfContext,
};
use lb_common::{
    drop::{Direction, DropReason},
    proto,
    revnat::{SockRevNat4Key, SockRevNat4Value},
    service::{Service4Key, SCOPE_ALL},
};

use super::{SockAddr, ALLOW, DENY, ECONNREFUSED};
use crate::{
    drop,
    lb4::{self, Lookup},
    maps::LB4_SOCK_REVNAT,
};

#[cgroup_sock_addr(connect4)]
pub fn lb_connect4(ctx: SockAddrContext) -> i32 {
    forward4(&ctx)
}

/// Unconnected UDP: every sendto() is translated on its own.
#[cgroup_sock_addr(sendmsg4)]
pub fn lb_sendmsg4(ctx: SockAddrContext) -> i32 {
    forward4(&ctx)
}

#[inline(always)]
fn forward4(ctx: &SockAddrContext) -> i32 {
    let sa = SockAddr::new(ctx.sock_addr);
    let protocol = sa.protocol();
    if protocol != proto::TCP as u32 && protocol != proto::UDP as u32 {
        return ALLOW;
    }
    let key = Service4Key::new(sa.user_ip4(), sa.user_port(), protocol as u8, SCOPE_ALL, 0);
    let svc = match lb4::lookup_service(&key) {
        Lookup::NotService => return ALLOW,
        Lookup::UnknownPort => return reject(DropReason::NoServicePort),
        Lookup::Service(svc) => svc,
    };
    let (_backend_id, backend) = match lb4::select_backend(&key, &svc) {
        Ok(found) => found,
        Err(reason) => return reject(reason),
    };

    // Remember the translation for this socket so replies (recvmsg) and
    // getpeername() show the service address again.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let rev_key = SockRevNat4Key { cookie, address: backend.address, port: backend.port, pad: 0 };
    let rev_value = SockRevNat4Value {
        address: key.address,
        port: key.dport,
        pad: 0,
        service_id: svc.service_id,
    };
    if LB4_SOCK_REVNAT.insert(&rev_key, &rev_value, 0).is_err() {
        // The connection itself still works; only the reverse view is lost.
        drop::count(DropReason::RevNatUpdateFailed, Direction::Egress);
    }

    sa.set_user_ip4(backend.address);
    sa.set_user_port(backend.port);
    ALLOW
}

/// Fails the syscall with ECONNREFUSED, as kube-proxy's REJECT rule would.
#[inline(always)]
fn reject(reason: DropReason) -> i32 {
    drop::count(reason, Direction::Egress);
    unsafe { bpf_set_retval(-ECONNREFUSED) };
    DENY
}
