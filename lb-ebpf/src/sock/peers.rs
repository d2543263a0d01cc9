//! What each UDP socket was translated to, for the reverse hooks: in the
//! socket's own storage (`LB_SOCK_PEERS`, see `lb_common::sock`), not only
//! in the shared `LB4/6_SOCK_REVNAT` LRU keyed by socket cookie (what this
//! was, and what Cilium's `cilium_lb4_reverse_sk` is). Under churn larger
//! than that LRU, the entry of a long-lived idle socket (a resolver's) is
//! evicted, and every reply it then receives shows the backend's address,
//! which resolvers drop as a spoofed answer. Socket storage lives and dies
//! with the socket: nothing evicts it.
//!
//! TCP does not use socket storage. Its translation is read by
//! getpeername() only, and creating socket storage costs more per connect
//! than anything else tried: with the kernel's BPF statistics, connect4
//! took 940 ns per run with the LRU and 1.2 to 1.6 µs with storage created
//! for every socket (AMD EPYC, 2026-12-01), and 607-1031 ns against
//! 468-580 ns for the LRU on an Intel Xeon (2026-12-02; `lb-bench --profile
//! quick --only connect`; storage is two allocations, the LRU takes a
//! preallocated element). TCP sockets go to `LB_SOCK_TCP` (`tcp_table`), a
//! table by cookie that is cheaper still, and move to the LRU only when
//! they outlive their slot.
//!
//! The LRU is also still used for:
//! * connected UDP sockets, indexed there too: the agent finds the sockets
//!   to destroy when their backend goes (`select::sockets`) by cookie and
//!   backend, and cannot read another process's socket storage;
//! * translations that no longer fit a socket's storage (an unconnected UDP
//!   socket with replies outstanding from more than `SOCK_PEERS` backends):
//!   the oldest moves there rather than being forgotten;
//! * sockets translated before this storage existed (an upgrade), and a
//!   socket whose storage the kernel could not allocate.
use aya_ebpf::{
    btf_maps::SkStorage, helpers::bpf_get_socket_cookie, macros::btf_map,
    programs::SockAddrContext, EbpfContext,
};
use lb_common::sock::{SockPeer, SockPeers, SOCK_PEERS};
use lb_common::Addr6;

use super::{
    family::{SockFamily, Translation},
    tcp_table,
};
use crate::select::{V4, V6};

#[btf_map]
pub static LB_SOCK_PEERS: SkStorage<SockPeers> = SkStorage::new();

#[inline(always)]
pub fn cookie(ctx: &SockAddrContext) -> u64 {
    // SAFETY: the hook's own context, valid for this run; the helper only reads the socket.
    unsafe { bpf_get_socket_cookie(ctx.as_ptr()) }
}

/// Moves a translation out of a socket's storage, or out of its
/// `LB_SOCK_TCP` slot, into the shared LRU.
#[inline(always)]
pub fn spill(cookie: u64, e: &SockPeer) -> bool {
    let t = Translation::of(e);
    match e.family {
        4 => V4::lru_put(cookie, e.backend, e.backend_port, &t),
        6 => V6::lru_put(cookie, e.backend, e.backend_port, &t),
        _ => true,
    }
}

/// connect/sendmsg sent this socket to `backend:port` for `t`'s frontend.
/// False when the translation could not be kept anywhere (the connection
/// still works; only the reverse view is lost).
#[inline(always)]
pub fn remember<F: SockFamily>(
    ctx: &SockAddrContext,
    backend: Addr6,
    port: u16,
    t: &Translation,
) -> bool {
    // SAFETY: the context's socket; the storage is created zeroed.
    let peers = unsafe { LB_SOCK_PEERS.get_or_insert_ptr_mut(ctx, None) };
    if peers.is_null() {
        return F::lru_put(cookie(ctx), backend, port, t);
    }
    // SAFETY: this socket's storage, valid for the program's run.
    let peers = unsafe { &mut *peers };
    let entry = t.peer(F::FAMILY, backend, port);
    let mut free = SOCK_PEERS;
    let mut i = 0;
    while i < SOCK_PEERS {
        let e = &mut peers.entries[i];
        if e.family == F::FAMILY && e.backend == backend && e.backend_port == port {
            // The same backend again (a UDP socket's next datagram): write
            // only when the frontend it stands for changed.
            if e.frontend != t.frontend
                || e.frontend_port != t.frontend_port
                || e.service_id != t.service_id
            {
                *e = entry;
            }
            return true;
        }
        if e.family == 0 && free == SOCK_PEERS {
            free = i;
        }
        i += 1;
    }
    let mut kept = true;
    if free == SOCK_PEERS {
        free = peers.next as usize % SOCK_PEERS;
        peers.next = peers.next.wrapping_add(1);
        kept = spill(cookie(ctx), &peers.entries[free % SOCK_PEERS]);
    }
    peers.entries[free % SOCK_PEERS] = entry;
    kept
}

/// Where a translation was found, so a stale one can be forgotten.
pub enum Found {
    Storage(usize),
    /// In `LB_SOCK_TCP`, by this cookie.
    Table(u64),
    Shared(u64),
}

/// The frontend this socket asked for when it was sent to `backend:port`.
/// `tcp`: the socket is TCP (only those are in `LB_SOCK_TCP`).
#[inline(always)]
pub fn recall<F: SockFamily>(
    ctx: &SockAddrContext,
    backend: Addr6,
    port: u16,
    tcp: bool,
) -> Option<(Translation, Found)> {
    // SAFETY: the context's socket; no storage is created.
    let peers = unsafe { LB_SOCK_PEERS.get_ptr_mut(ctx) };
    if !peers.is_null() {
        // SAFETY: this socket's storage, valid for the program's run.
        let peers = unsafe { &*peers };
        let mut i = 0;
        while i < SOCK_PEERS {
            let e = &peers.entries[i];
            if e.family == F::FAMILY && e.backend == backend && e.backend_port == port {
                return Some((Translation::of(e), Found::Storage(i)));
            }
            i += 1;
        }
    }
    let cookie = cookie(ctx);
    if tcp {
        if let Some(t) = tcp_table::get::<F>(cookie, backend, port) {
            return Some((t, Found::Table(cookie)));
        }
    }
    F::lru_get(cookie, backend, port).map(|t| (t, Found::Shared(cookie)))
}

/// Drops a translation that no longer holds (its service changed).
#[inline(always)]
pub fn forget<F: SockFamily>(ctx: &SockAddrContext, found: Found, backend: Addr6, port: u16) {
    match found {
        Found::Storage(i) => {
            // SAFETY: the context's socket; no storage is created.
            let peers = unsafe { LB_SOCK_PEERS.get_ptr_mut(ctx) };
            if !peers.is_null() {
                // SAFETY: this socket's storage, valid for the program's run.
                unsafe { (*peers).entries[i % SOCK_PEERS].family = 0 };
            }
        }
        Found::Table(cookie) => {
            tcp_table::release(cookie);
        }
        Found::Shared(cookie) => F::lru_remove(|| cookie, backend, port),
    }
}
