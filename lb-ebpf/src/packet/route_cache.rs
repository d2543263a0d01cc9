//! The route an established flow's packets take, remembered for about a
//! second on each CPU, so that most of a flow's packets skip the FIB lookup.
//!
//! bpf_fib_lookup (net/core/filter.c) walks the FIB, picks the nexthop and
//! looks the neighbour up on every call: the largest single cost of a
//! packet to a remote backend (in a profile of the IPv6 SNAT path about half
//! of the program's time, with the 64-byte clear of its parameters). The
//! answer depends only on the flow's tuple (ECMP hashes it), the device it
//! came in on, and the routing and neighbour tables; a flow's packets ask
//! the same question again and again.
//!
//! So each CPU keeps a small direct-mapped table (`LB_ROUTES4`,
//! `LB_ROUTES6`, not pinned: a new load starts empty) of the last answer
//! for a flow's conntrack key: egress device, MACs and the route's MTU.
//! An entry is trusted only
//! - for the same key (all of it: a slot is shared by whatever hashes to it),
//!   the same source and destination looked up (a key can be bound to
//!   another backend, or a reply's to another client, within a second) and
//!   the same ingress device;
//! - within the clock epoch (2^30 ns, about 1.07 s) it was resolved in:
//!   a change of routing, neighbour or device state (a route, a nexthop, a
//!   MAC, a device going down, forwarding turned off, a lower path MTU)
//!   reaches a flow at most that late (the kernel's own forwarding sees it
//!   at once: this is the price of skipping the lookup);
//! - for a packet no longer than the route's MTU: anything bigger takes the
//!   FIB lookup, which answers FRAG_NEEDED as before.
//!
//! Only a successful lookup (neighbour resolved) is kept: an unresolved
//! neighbour or a failed lookup asks again next packet.
//!
//! Per CPU, so a slot has one writer and no reader elsewhere (a program run
//! finishes on its CPU and tc or XDP does not nest into itself there, as for
//! the scratch maps): no torn entries. A flow whose packets arrive on
//! several CPUs has an entry on each.
use lb_common::conntrack::CtKey;

use super::{access::copy_mac, family::Ip, fib, fib::Route, parse::Flow, scratch, Hook};

/// Slots per CPU and family: a power of two. 1 024 × 52 bytes (IPv4) and
/// × 100 bytes (IPv6): 152 KiB per CPU. A CPU forwarding more flows than
/// that at once keeps fewer of them cached; none is ever wrong.
pub const ROUTE_CACHE_SLOTS: u32 = 1024;
const SLOT_BITS: u32 = ROUTE_CACHE_SLOTS.trailing_zeros();

/// The clock epoch a cached route is trusted in: `ct::now()` >> 30.
const EPOCH_SHIFT: u32 = 30;

#[repr(C)]
pub struct CachedRoute<A> {
    pub key: CtKey<A>,
    /// What was looked up: a flow's key can be bound to another backend
    /// (a reused tuple, a deleted backend, an expired entry) or a reply's
    /// to another client and frontend (a SNAT port given to a new flow)
    /// within one epoch.
    pub saddr: A,
    pub daddr: A,
    /// `ct::now() >> EPOCH_SHIFT` at the lookup; 0 = empty.
    pub epoch: u32,
    pub ingress_ifindex: u32,
    pub ifindex: u32,
    pub dmac: [u8; 6],
    pub smac: [u8; 6],
    /// The route's MTU as the lookup reported it (`mtu_result`).
    pub mtu: u16,
    pub pad: u16,
}

/// The slot of `key`: a multiplicative hash (Knuth) of its words, top bits.
#[inline(always)]
fn slot<I: Ip>(key: &CtKey<I::Addr>) -> u32 {
    let mut h = (u32::from(key.sport) << 16 | u32::from(key.dport))
        ^ (u32::from(key.proto) << 8 | u32::from(key.kind));
    let mut i = 0;
    while i < I::WORDS {
        h = (h ^ I::word(key.saddr, i)).rotate_left(7) ^ I::word(key.daddr, i);
        i += 1;
    }
    h.wrapping_mul(0x9e37_79b1) >> (32 - SLOT_BITS)
}

/// `fib::lookup` for a packet of the flow whose conntrack key the caller
/// left in the scratch map (`fkey`), answered from this CPU's cache when it
/// holds a route for that key from this epoch that the packet fits. A hit
/// leaves the MACs in the scratch FIB parameters, as a lookup does, for
/// `finish_redirect`. (A subprogram of its own, with the key in the scratch
/// map rather than an argument: BPF calls take five arguments, and inlined
/// into its callers it pushed the remote paths' call chains past the
/// 512-byte stack.)
#[inline(never)]
pub fn lookup<C: Hook, I: Ip>(
    ctx: &C,
    saddr: &I::Addr,
    daddr: &I::Addr,
    f: &Flow<I>,
    extra: u16,
) -> Route {
    let Some(s) = scratch::<I>() else {
        return Route::Failed(u32::MAX);
    };
    // SAFETY: per-CPU scratch, used by this program run only.
    let key = unsafe { &(*s).fkey };
    let Some(c) = I::route_cache().get_ptr_mut(slot::<I>(key)) else {
        return fib::lookup(ctx, saddr, daddr, f, extra);
    };
    // SAFETY: this CPU's slot, used by this program run only.
    let c = unsafe { &mut *c };
    let now = epoch();
    let iif = ctx.ingress_ifindex();
    let len = ctx.wire_len(f).saturating_add(extra);
    if c.epoch == now
        && c.ingress_ifindex == iif
        && len <= c.mtu
        && c.key == *key
        && c.daddr == *daddr
        && c.saddr == *saddr
    {
        // SAFETY: as above.
        unsafe {
            copy_mac(&mut (*s).fib.dmac, &c.dmac);
            copy_mac(&mut (*s).fib.smac, &c.smac);
        }
        return Route::Resolved(c.ifindex);
    }
    let route = fib::lookup(ctx, saddr, daddr, f, extra);
    if let Route::Resolved(ifindex) = route {
        // SAFETY: as above; the lookup left its answer in the parameters.
        let p = unsafe { &(*s).fib };
        c.key = *key;
        c.saddr = *saddr;
        c.daddr = *daddr;
        c.epoch = now;
        c.ingress_ifindex = iif;
        c.ifindex = ifindex;
        copy_mac(&mut c.dmac, &p.dmac);
        copy_mac(&mut c.smac, &p.smac);
        // SAFETY: plain data. On success the kernel reports the route's
        // MTU in mtu_result (the union with tot_len; Linux 5.12,
        // bpf_fib_set_fwd_params) when it checked one, and leaves tot_len
        // (the packet's length) otherwise: either way no larger packet is
        // let through unchecked.
        c.mtu = unsafe { p.__bindgen_anon_1.mtu_result };
    }
    route
}

/// The clock epoch now; never 0 (the clock counts from boot, and 0 marks
/// an empty slot).
#[inline(always)]
fn epoch() -> u32 {
    ((super::ct::now() >> EPOCH_SHIFT) as u32).max(1)
}
