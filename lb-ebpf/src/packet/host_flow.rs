//! Host connections that meet a SNAT flow's tuple.
//!
//! The SNAT range overlaps the node's ephemeral ports (32768-65535 against
//! Linux's 32768-60999), and host processes may also bind a port of it
//! themselves. `snat::alloc` never takes a tuple a live socket holds, but a
//! socket made later can pick the tuple of a running SNAT flow (this node's
//! address and port, the same backend): the backend's replies would then go
//! to the SNAT flow's client, and the host's connection would hang. Linux
//! NAT settles such a clash by giving the later connection another source
//! port (`nf_nat_setup_info` → `get_unique_tuple`, for locally made
//! connections too), and Cilium NATs host traffic for the same reason. So
//! does this, only for a host connection that clashes, on its way out (tc
//! egress of the device the route chose):
//!
//! * its first packet finds the SNAT flow's reverse entry under its tuple:
//!   it gets a port from `snat::alloc`, as a SNAT flow would (never one a
//!   socket or another flow holds), a forward entry under its own tuple
//!   (`CT_F_HOST`) and a reverse entry under the new port;
//! * its later packets leave from that port (forward entry);
//! * the peer's replies arrive at the new port and `snat_reply` gives them
//!   their port back (`reply`), for the stack to deliver.
//!
//! Both entries age and are swept like a SNAT flow's (the reverse one
//! names the forward one: lb-userspace `conntrack::forward_of`).
#[allow(clippy::wildcard_imports)]
use super::*;
use lb_common::config::CNT_HOST_PORT_CLASHES;

/// A host packet from a port of the SNAT range: translated when its
/// connection clashed (NEXT: it did not, nothing to do).
#[inline(never)]
pub(super) fn egress<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
    let Some(sp) = scratch::<I>() else {
        return Action::NEXT;
    };
    // SAFETY: per-CPU scratch; the key field is not the flow.
    let key = unsafe { &mut (*sp).fkey };
    *key = f.ct_key(CT_SERVICE);
    let reopen = match ct::lookup::<I>(key, f.proto, f.tcp_flags) {
        Hit::Live(ct) if ct.flags & CT_F_HOST != 0 => return renumber(ctx, f, ct.nat_port),
        // Another kind of entry under this tuple: not a host flow of ours.
        Hit::Live(_) => return Action::NEXT,
        Hit::Miss => false,
        // A SYN on a closing host flow's tuple: the same connection again
        // (its SYN answered by a reset) or a new one on the same tuple.
        Hit::Reopen => true,
    };
    if reopen {
        let port = keep_port::<I>(f);
        if port != 0 {
            return renumber(ctx, f, port);
        }
    }
    // Does the tuple clash now?
    // SAFETY: as above.
    let key = unsafe { &mut (*sp).fkey };
    *key = f.reply_ct_key(CT_REVERSE);
    if ct::peek::<I>(key, f.proto).is_some_and(|r| r.flags & CT_F_SNAT != 0) {
        return new_host_flow(ctx, f);
    }
    if reopen {
        // The connection keeps its own port: the old one's entry must not
        // renumber its next packets. (Its reverse entry goes with it: the
        // sweep drops a reverse entry whose forward one is gone.)
        *key = f.ct_key(CT_SERVICE);
        if I::ct()
            .get_ptr(&*key)
            // SAFETY: a map value stays valid for the program's run.
            .is_some_and(|e| unsafe { (*e).flags } & CT_F_HOST != 0)
        {
            let _ = I::ct().remove(&*key);
        }
    }
    Action::NEXT
}

/// A reopened host tuple keeps the port it had while that port's reverse
/// entry is still its own, as `snat::alloc` gives a client tuple its port
/// again: the peer may hold TIME_WAIT on the port's tuple, and accepts a
/// new SYN there only with a newer timestamp (RFC 6191), which this host's
/// clock toward the peer gives (Linux draws the offset per address pair)
/// and a SNAT client's need not. The two entries start over as a new
/// flow's. 0: no port to keep.
#[inline(never)]
fn keep_port<I: Ip>(f: &Flow<I>) -> u16 {
    let Some(sp) = scratch::<I>() else {
        return 0;
    };
    // SAFETY: per-CPU scratch; distinct fields.
    let (fkey, rkey) = unsafe { (&mut (*sp).fkey, &mut (*sp).rkey) };
    *fkey = f.ct_key(CT_SERVICE);
    let Some(fwd) = I::ct().get_ptr_mut(fkey) else {
        return 0;
    };
    // SAFETY: a map value stays valid for the program's run.
    let fwd = unsafe { &mut *fwd };
    if fwd.flags & CT_F_HOST == 0 {
        return 0;
    }
    let port = fwd.nat_port;
    *rkey = CtKey::new(f.daddr, f.saddr, f.dport, port, f.proto, CT_REVERSE);
    let Some(rev) = I::ct().get_ptr_mut(rkey) else {
        return 0;
    };
    // SAFETY: as above.
    let rev = unsafe { &mut *rev };
    if rev.flags & CT_F_HOST == 0 || rev.nat_port != f.sport || rev.nat_addr != f.saddr {
        return 0; // the port went to another flow
    }
    let t = now();
    for e in [fwd, rev] {
        e.flags = CT_F_SNAT | CT_F_HOST;
        e.last_seen_ns = t;
    }
    port
}

/// The clashing connection's first packet: a port, its two entries, and
/// the packet sent from that port.
#[inline(never)]
fn new_host_flow<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
    let Some(sp) = scratch::<I>() else {
        return Action::DROP;
    };
    // SAFETY: per-CPU scratch; distinct fields.
    let (ct, rct) = unsafe { (&mut (*sp).ct, &mut (*sp).rct) };
    let mut flags = CT_F_SNAT | CT_F_HOST;
    if f.proto == IPPROTO_TCP && f.tcp_flags & TCP_SYN == 0 {
        flags |= CT_F_ESTABLISHED;
    }
    // Forward: the peer stays the destination; the source port becomes
    // `nat_port`. Reverse: the reply's source stays; its destination
    // becomes the host's own tuple again. (`snat::alloc` reads the peer
    // and this node's address from `ct`, and records `rct` under the port.)
    *ct = CtValue {
        backend_id: 0,
        service_id: 0,
        addr: f.daddr,
        nat_addr: f.saddr,
        port: f.dport,
        nat_port: 0,
        flags,
        backends_gen: 0,
        last_seen_ns: now(),
    };
    *rct = *ct;
    rct.nat_port = f.sport;
    let port = snat::alloc(ctx, f);
    if port == 0 {
        return drop_packet(ctx, f, DropReason::SnatPortsExhausted, 0);
    }
    ct.nat_port = port;
    // SAFETY: per-CPU scratch; distinct fields (alloc is done with rkey).
    let (fkey, rkey) = unsafe { (&mut (*sp).fkey, &mut (*sp).rkey) };
    *fkey = f.ct_key(CT_SERVICE);
    if !ct::put::<I>(fkey, ct) {
        // Give the port back at once.
        *rkey = CtKey::new(f.daddr, f.saddr, f.dport, port, f.proto, CT_REVERSE);
        let _ = I::ct().remove(rkey);
        return drop_packet(ctx, f, DropReason::CtFull, 0);
    }
    bump(CNT_HOST_PORT_CLASHES);
    renumber(ctx, f, port)
}

/// The host's packet leaves from `port` instead of its own.
#[inline(always)]
fn renumber<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, port: u16) -> Action {
    match nat::source_port(ctx, f, port) {
        Some(()) => Action::PASS,
        None => Action::DROP,
    }
}

/// A peer's reply to a host flow's port: its destination port becomes the
/// host socket's again, and the stack delivers it (`ct`: the reverse entry).
#[inline(never)]
pub(super) fn reply<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, ct: &CtValue<I::Addr>) -> Action {
    match nat::destination_port(ctx, f, ct.nat_port) {
        Some(()) => Action::PASS,
        None => Action::DROP,
    }
}
