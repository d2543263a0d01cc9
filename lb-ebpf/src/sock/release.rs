//! cgroup/sock_release: a closing socket's translation leaves its
//! `LB_SOCK_TCP` slot (TCP) and the shared `LB4/6_SOCK_REVNAT` LRU.
//!
//! connect4/6 keep a translated TCP socket in `LB_SOCK_TCP` (moved to the
//! LRU if it outlives its slot) and index every connected UDP socket in the
//! LRU by cookie and backend. A slot left taken makes the next claim move a
//! dead socket's translation to the LRU. Left alone, LRU entries stay until
//! the LRU evicts them: the map runs full under connection churn, and every
//! insert then takes the kernel's eviction path (kernel/bpf/bpf_lru_list.c,
//! `bpf_lru_list_pop_free_to_local` shrinking the inactive list). Measured
//! with the kernel's BPF statistics (`lb-bench --profile quick --only
//! connect`, 2026-12-01): connect4 took 1.0-1.4 µs per run with the insert
//! and 0.4-0.5 µs without it. Deleting at close frees the element back to
//! this CPU's local free list, where the next insert finds it warm, and
//! keeps live sockets' entries (a long-lived connected UDP socket the agent
//! may have to find) from being evicted by dead ones.
//!
//! A UDP socket's own storage (`LB_SOCK_PEERS`) names every backend it was
//! sent to; their entries go too. That covers what the destination alone
//! misses: a socket the agent destroyed (the kernel's udp_abort clears its
//! destination before the close), one that disconnected or connected again
//! elsewhere. A TCP socket whose connect failed (tcp_disconnect clears its
//! destination) is found by its cookie alone: its slot is freed too (an
//! entry it has in the LRU stays until evicted).
//!
//! Sockets of other protocols return before any lookup. A socket to a
//! backend no socket was ever sent to skips the rest, and so does one whose
//! own cookie slot is clear (`lru_filter`): a direct connect to a backend
//! other sockets were translated to reads one byte. A translated TCP socket
//! frees its slot; one that outlived it, and a UDP socket, cost an LRU
//! lookup and the delete (two walks of the same bucket, the second warm).
//! The socket's cookie slot is cleared last.
use aya_ebpf::{
    bindings::bpf_sock,
    helpers::{bpf_get_socket_cookie, generated::bpf_sk_storage_get},
    macros::cgroup_sock,
    programs::SockContext,
    EbpfContext,
};
use lb_common::Addr6;
use lb_common::{
    proto,
    sock::{SockPeers, SOCK_PEERS},
};

use super::{family::SockFamily, lru_filter, peers::LB_SOCK_PEERS, tcp_table, v4_mapped, ALLOW};
use crate::select::{V4, V6};

const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;

#[cgroup_sock(sock_release)]
pub fn lb_sock_release(ctx: SockContext) -> i32 {
    let sk = ctx.sock;
    // SAFETY: this run's context; the kernel allows reads of these fields
    // in sock_release programs (net/core/filter.c, sock_filter_is_valid_access).
    let (family, protocol) = unsafe {
        (
            core::ptr::read_volatile(&(*sk).family),
            core::ptr::read_volatile(&(*sk).protocol),
        )
    };
    if protocol != u32::from(proto::TCP) && protocol != u32::from(proto::UDP) {
        return ALLOW;
    }
    // SAFETY: as above; dst_port is a 16-bit field in network order (Linux 5.16+).
    let port = unsafe { core::ptr::read_volatile(&(*sk).dst_port) };
    // Taken only where an entry may exist: a socket that never had a
    // cookie gets one made here (net/core/sock_diag.c, __sock_gen_cookie).
    // 0 until taken (the kernel never hands out 0).
    let mut taken = 0u64;
    let mut cookie = || {
        if taken == 0 {
            // SAFETY: the hook's own context; the helper only reads the socket.
            taken = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
        }
        taken
    };
    if protocol == u32::from(proto::UDP) {
        forget_stored(&ctx, &mut cookie);
    }
    let tcp = protocol == u32::from(proto::TCP);
    if port != 0 {
        // Still connected (a UDP socket may have disconnected).
        forget_destination(sk, family, port, tcp, &mut cookie);
    } else if tcp {
        // A failed connect clears the destination (tcp_disconnect), not the
        // socket's LB_SOCK_TCP slot; left, the next claim would move it to
        // the LRU.
        let c = cookie();
        if lru_filter::socket_may_hold(c) {
            tcp_table::release(c);
        }
    }
    // The socket's entries are gone: its cookie slot is free for the
    // sockets made 2^18 cookies later.
    if taken != 0 {
        lru_filter::forget_socket(taken);
    }
    ALLOW
}

/// Forgets the translation to the backend the socket is connected to.
#[inline(always)]
fn forget_destination(
    sk: *mut bpf_sock,
    family: u32,
    port: u16,
    tcp: bool,
    mut cookie: impl FnMut() -> u64,
) {
    if family == AF_INET {
        // SAFETY: as above.
        let addr = unsafe { core::ptr::read_volatile(&(*sk).dst_ip4) };
        forget::<V4>(tcp, &mut cookie, [addr, 0, 0, 0], port);
    } else if family == AF_INET6 {
        // SAFETY: as above, a word at a time (the kernel's allowed width).
        let words = unsafe {
            [
                core::ptr::read_volatile(&(*sk).dst_ip6[0]),
                core::ptr::read_volatile(&(*sk).dst_ip6[1]),
                core::ptr::read_volatile(&(*sk).dst_ip6[2]),
                core::ptr::read_volatile(&(*sk).dst_ip6[3]),
            ]
        };
        // A dual-stack socket that dialed a v4-mapped address was indexed
        // in the IPv4 map (forward6).
        match v4_mapped(&words) {
            Some(a) => forget::<V4>(tcp, &mut cookie, [a, 0, 0, 0], port),
            None => forget::<V6>(tcp, &mut cookie, words, port),
        }
    }
}

/// A TCP socket's translation is in its `tcp_table` slot, or in the LRU
/// once another socket claimed that slot; a UDP socket's in the LRU.
#[inline(always)]
fn forget<F: SockFamily>(tcp: bool, cookie: impl FnOnce() -> u64, backend: Addr6, port: u16) {
    if !lru_filter::may_hold(lru_filter::slot(F::FAMILY, &backend, port)) {
        return;
    }
    let cookie = cookie();
    if !lru_filter::socket_may_hold(cookie) {
        return;
    }
    if tcp && tcp_table::release(cookie) {
        return;
    }
    F::lru_remove(|| cookie, backend, port);
}

/// Deletes the shared entries of every backend the socket's own storage
/// names (no storage: nothing to do, none is created).
#[inline(always)]
fn forget_stored(ctx: &SockContext, mut cookie: impl FnMut() -> u64) {
    // SAFETY: the storage map is ours; the context is this run's socket,
    // which a cgroup sock program passes as its context (the kernel's
    // bpf_sk_storage_get_cg_sock_proto); no flag: nothing is created.
    let peers = unsafe {
        bpf_sk_storage_get(
            core::ptr::from_ref(&LB_SOCK_PEERS).cast_mut().cast(),
            ctx.as_ptr(),
            core::ptr::null_mut(),
            0,
        )
    }
    .cast::<SockPeers>();
    if peers.is_null() {
        return;
    }
    let cookie = cookie();
    let mut i = 0;
    while i < SOCK_PEERS {
        // SAFETY: this socket's storage, valid for the program's run.
        let e = unsafe { &(*peers).entries[i] };
        match e.family {
            4 => V4::lru_remove(|| cookie, e.backend, e.backend_port),
            6 => V6::lru_remove(|| cookie, e.backend, e.backend_port),
            _ => {}
        }
        i += 1;
    }
}
