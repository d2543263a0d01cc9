//! The first packet of a flow: its frontend (the node-local view for
//! externalTrafficPolicy: Local), its backend (Maglev or at random, or the
//! one sessionAffinity remembers), then DNAT to a backend on this node or
//! the rewrite and redirect to a remote one (SNAT or DSR).
use super::known::{backends_gen, dsr_extra, rewrite_remote};
#[allow(clippy::wildcard_imports)]
use super::*;

pub(super) enum Frontend<K> {
    None,
    /// A known service address on a port it does not expose.
    UnknownPort,
    /// The service, its key, and whether that is the node-local view.
    Found(ServiceValue, K, bool),
}

/// The frontend a packet is addressed to; for traffic from outside, the
/// node-local view when the service has one (externalTrafficPolicy: Local).
#[inline(always)]
pub(super) fn frontend<I: Ip>(f: &Flow<I>, is_from_pod: bool) -> Frontend<I::Key> {
    let key = I::service_key(f.daddr, f.dport, f.proto, SCOPE_ALL);
    match select::lookup_service::<I>(&key) {
        Lookup::NotService => Frontend::None,
        Lookup::UnknownPort => Frontend::UnknownPort,
        // A localhost NodePort serves the node's sockets only; a packet to
        // it from outside is the stack's to drop (SVC_FLAG_HOST_LOOPBACK).
        Lookup::Service(svc) if svc.flags & SVC_FLAG_HOST_LOOPBACK != 0 => Frontend::None,
        // Pods on this node are clients on the node: they use every
        // endpoint, as kube-proxy sends pods' traffic to an
        // externalTrafficPolicy: Local service to the cluster-wide ones.
        Lookup::Service(svc) if svc.flags & SVC_FLAG_TWO_SCOPES != 0 && !is_from_pod => {
            let local = I::service_key(f.daddr, f.dport, f.proto, SCOPE_LOCAL);
            match I::service(&local) {
                Some(s) => Frontend::Found(s, local, true),
                None => Frontend::None,
            }
        }
        Lookup::Service(svc) => Frontend::Found(svc, key, false),
    }
}

/// A new flow to a frontend: pick a backend, then hand it to the local or
/// the remote path. The choice is a subprogram of its own that leaves its
/// result in the scratch conntrack value: its stack frame (service keys
/// and values) is then not under the remote path's (FIB, SNAT port search),
/// which the 512-byte budget could not hold.
#[inline(never)]
pub(super) fn new_flow<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
    let a = pick(ctx, f);
    if a == Action::REJECT {
        let Some(sp) = scratch::<I>() else {
            return Action::DROP;
        };
        // SAFETY: per-CPU scratch; read only.
        let service_id = unsafe { (*sp).ct.service_id };
        return pending_icmp::<C, I>(icmp::Error::PORT_UNREACHABLE, service_id);
    }
    if a != Action::NEXT {
        return a;
    }
    let Some(sp) = scratch::<I>() else {
        return Action::DROP;
    };
    // SAFETY: per-CPU scratch; read only.
    let local = unsafe { (*sp).ct.flags } & CT_F_LOCAL != 0;
    if local || ctx.is_from_pod() {
        new_local(ctx, f)
    } else {
        new_remote(ctx, f)
    }
}

/// A new flow to a frontend with nothing to choose, as kube-proxy treats
/// it: no endpoint at all is refused with an ICMP port unreachable (its
/// REJECT rules); externalTrafficPolicy: Local with endpoints only on other
/// nodes is dropped (its "has no local endpoints" DROP), both counted.
#[inline(always)]
pub(super) fn no_backend<C: Hook, I: Ip>(
    ctx: &C,
    f: &Flow<I>,
    svc: &ServiceValue,
    local: bool,
) -> Action {
    if local {
        let all = I::service_key(f.daddr, f.dport, f.proto, SCOPE_ALL);
        if I::service(&all).is_some_and(|s| s.count > 0 || s.terminating_count > 0) {
            return drop_packet(ctx, f, DropReason::NoLocalBackend, svc.service_id);
        }
    }
    let Some(sp) = scratch::<I>() else {
        return Action::DROP;
    };
    // SAFETY: per-CPU scratch, used by this program run only.
    unsafe { (*sp).ct.service_id = svc.service_id };
    Action::REJECT
}

/// The frontend and backend of a new flow, into the scratch conntrack value
/// (`addr`/`port`: the backend; `CT_F_LOCAL` when it runs on this node).
/// NEXT when there is one; else what to do with the packet.
#[inline(never)]
pub(super) fn pick<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
    let (svc, key, local) = match frontend(f, ctx.is_from_pod()) {
        Frontend::None => return Action::PASS,
        Frontend::UnknownPort => return drop_packet(ctx, f, DropReason::NoServicePort, 0),
        Frontend::Found(svc, key, local) => (svc, key, local),
    };
    // CVE-2020-8554: a pod's packets to an external IP this node does not
    // own go where they are addressed, as its sockets' connects do.
    if svc.flags & SVC_FLAG_FOREIGN_EXTERNAL_IP != 0 && ctx.is_from_pod() {
        return Action::PASS;
    }
    if !f.has_l4() {
        return Action::PASS; // a later fragment never starts a flow
    }
    // loadBalancerSourceRanges, before anything else about the service
    // (kube-proxy's KUBE-FW chain runs before its REJECT of an empty one).
    if !I::admits(&svc, f.saddr) {
        return drop_packet(ctx, f, DropReason::SourceRange, svc.service_id);
    }
    if svc.count == 0 && svc.terminating_count == 0 {
        return no_backend(ctx, f, &svc, local);
    }
    // The generation before the backend is read: a delete between the two
    // then leaves the entry a generation behind, checked on its next packet.
    let gen = backends_gen();
    // sessionAffinity: ClientIP: the source address's last backend first,
    // then the usual choice, remembered (kube-proxy's "recent" match).
    let client = I::client(f.saddr);
    let affinity = svc.flags & SVC_FLAG_AFFINITY != 0;
    let remembered = if affinity {
        select::remembered::<I>(&svc, client)
    } else {
        None
    };
    let picked = if let Some(found) = remembered {
        Ok(found)
    } else if svc.algorithm == ALG_MAGLEV {
        maglev(f, &svc)
    } else {
        select::select_backend::<I>(&key, &svc)
    };
    if affinity && remembered.is_none() {
        if let Ok((id, _)) = picked {
            select::remember(&svc, client, id);
        }
    }
    let (backend_id, b) = match picked {
        Ok(x) => x,
        Err(reason) => return drop_packet(ctx, f, reason, svc.service_id),
    };
    let Some(sp) = scratch::<I>() else {
        return Action::DROP;
    };
    // SAFETY: per-CPU scratch; the ct field is not the flow.
    let ct = unsafe { &mut (*sp).ct };
    // A flow picked up after its handshake (conntrack lost it) is established.
    let established = f.proto == IPPROTO_TCP && f.tcp_flags & TCP_SYN == 0;
    let mut flags = if established { CT_F_ESTABLISHED } else { 0 };
    let (baddr, bport, bflags) = I::backend_target(&b);
    if bflags & BACKEND_FLAG_LOCAL != 0 {
        flags |= CT_F_LOCAL;
    } else if ctx.is_from_pod() {
        // A pod's packet goes to `new_local` whatever its backend: no
        // forwarding mode to ask for (its flags would be misread there).
    } else if svc.flags & SVC_FLAG_FORWARD_DSR != 0 {
        // The service's own forwarding mode, for `new_remote` (which
        // clears it and sets the flag the flow keeps).
        flags |= CT_F_DSR;
    } else if svc.flags & SVC_FLAG_FORWARD_SNAT != 0 {
        flags |= CT_F_SNAT;
    }
    if svc.flags & SVC_FLAG_STATS != 0 {
        flags |= CT_F_COUNTED;
        // SAFETY: per-CPU scratch; fields of their own.
        unsafe {
            (*sp).stats_service = svc.service_id;
            (*sp).stats_new_flow = 0; // until its entries are in (`flow_made`)
        }
    }
    *ct = CtValue {
        backend_id,
        service_id: svc.service_id,
        addr: baddr,
        nat_addr: I::Addr::default(),
        port: bport,
        nat_port: 0,
        flags,
        backends_gen: gen,
        last_seen_ns: now(),
    };
    frag::remember(f);
    Action::NEXT
}

/// A new flow's conntrack entries are in: counted, and (when its frontend
/// counts, `count_frontend`) a flow of its frontend.
#[inline(always)]
fn flow_made<I: Ip>() {
    bump(CNT_CT_CREATED);
    if let Some(sp) = scratch::<I>() {
        // SAFETY: per-CPU scratch; a field of its own.
        unsafe { (*sp).stats_new_flow = 1 };
    }
}

/// Backend on this node (or any backend, for a pod's packet): DNAT here,
/// the stack delivers or routes it, tc egress (of the device the reply
/// leaves by, or of the pod's device) undoes the DNAT on the reply.
#[inline(never)]
pub(super) fn new_local<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
    let Some(sp) = scratch::<I>() else {
        return Action::DROP;
    };
    // SAFETY: per-CPU scratch; distinct fields.
    let (ct, rct, fkey, rkey) = unsafe {
        (
            &mut (*sp).ct,
            &mut (*sp).rct,
            &mut (*sp).fkey,
            &mut (*sp).rkey,
        )
    };
    ct.flags |= CT_F_LOCAL;
    let (baddr, bport) = (ct.addr, ct.port);
    // Hairpin: a pod that reached itself through a frontend would get its
    // own address as the source and drop it as a martian. Like kube-proxy's
    // masquerade, the source becomes the frontend (same port), and the
    // pod's reply to it comes back through here as a SNAT reply.
    let hairpin = baddr == f.saddr;
    let (src, sport) = if hairpin {
        ct.flags |= CT_F_SNAT;
        ct.nat_addr = f.daddr;
        ct.nat_port = f.sport;
        (f.daddr, f.sport)
    } else {
        (f.saddr, f.sport)
    };
    *rct = *ct;
    rct.addr = f.daddr;
    rct.port = f.dport;
    rct.nat_addr = f.saddr;
    rct.nat_port = f.sport;
    *fkey = f.ct_key(CT_SERVICE);
    *rkey = CtKey::new(baddr, src, bport, sport, f.proto, CT_REVERSE);
    if !ct::put::<I>(rkey, rct) || !ct::put::<I>(fkey, ct) {
        return drop_packet(ctx, f, DropReason::CtFull, ct.service_id);
    }
    flow_made::<I>();
    let rewritten = if hairpin {
        nat::dnat_snat(ctx, f, &baddr, bport, &src, sport)
    } else {
        nat::dnat(ctx, f, &baddr, bport)
    };
    match rewritten {
        Some(()) => {
            bump(CNT_NP_FORWARD);
            Action::PASS
        }
        None => Action::DROP,
    }
}

/// Backend on another node: SNAT or DSR by mode, routed by a FIB lookup.
#[inline(never)]
pub(super) fn new_remote<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
    let word = runtime::config(CFG_LB_MODE);
    let mode = mode_of(word);
    let Some(sp) = scratch::<I>() else {
        return Action::DROP;
    };
    // The service's forwarding mode (`pick` left it in the flags), else
    // the agent's.
    // SAFETY: per-CPU scratch; the ct field is not the flow.
    let asked = unsafe { (*sp).ct.flags } & (CT_F_SNAT | CT_F_DSR);
    let dsr = if asked != 0 {
        asked == CT_F_DSR
    } else {
        mode == MODE_DSR || (mode == MODE_HYBRID && f.proto == IPPROTO_TCP)
    };
    let encap = dsr && dsr_dispatch_of(word) == DSR_DISPATCH_IPIP;
    let needs_option = dsr && dsr::needs_option(f);
    if needs_option && C::IS_XDP {
        return Action::PUNT; // before anything changed: tc will redo it
    }
    // SAFETY: per-CPU scratch; distinct fields.
    let (ct, rct) = unsafe { (&mut (*sp).ct, &mut (*sp).rct) };
    ct.flags &= !(CT_F_SNAT | CT_F_DSR);
    let (service_id, baddr, bport) = (ct.service_id, ct.addr, ct.port);
    let extra = dsr_extra::<I>(needs_option, encap);
    // SAFETY: per-CPU scratch; distinct fields (snat::alloc is done with rkey).
    let (fkey, rkey) = unsafe { (&mut (*sp).fkey, &mut (*sp).rkey) };
    *fkey = f.ct_key(CT_SERVICE);
    // The route to the backend decides the egress device and its address
    // (cached for the flow's next packets).
    let route = route_cache::lookup(ctx, &f.saddr, &baddr, f, extra);
    let egress = match route {
        Route::Resolved(ifindex) | Route::NoNeigh(ifindex) => ifindex,
        Route::TooBig(mtu) => return icmp_too_big(ctx, f, mtu.saturating_sub(extra), service_id),
        Route::Failed(_) => return drop_packet(ctx, f, DropReason::FibLookupFailed, service_id),
    };
    if matches!(route, Route::NoNeigh(..)) && C::IS_XDP {
        return Action::PUNT;
    }
    if f.ttl <= 1 {
        return pending_icmp::<C, I>(icmp::Error::TTL_EXCEEDED, service_id);
    }
    // This node's address on the route's device (an IPv6 one may be
    // missing): the SNAT source, or the IPIP dispatch's outer source.
    let node = if !dsr || encap {
        match I::device_address(egress) {
            Some(node) => node,
            None => return drop_packet(ctx, f, DropReason::FibLookupFailed, service_id),
        }
    } else {
        I::Addr::default()
    };
    if dsr {
        ct.flags |= CT_F_DSR;
        if encap {
            ct.flags |= CT_F_DSR_ENCAP;
            ct.nat_addr = node;
        }
    } else {
        ct.flags |= CT_F_SNAT;
        ct.nat_addr = node;
        // The reverse entry: backend → node:port, back to client ← frontend.
        *rct = *ct;
        rct.addr = f.daddr;
        rct.port = f.dport;
        rct.nat_addr = f.saddr;
        rct.nat_port = f.sport;
        ct.nat_port = snat::alloc(ctx, f);
        if ct.nat_port == 0 {
            return drop_packet(ctx, f, DropReason::SnatPortsExhausted, service_id);
        }
    }
    if !ct::put::<I>(fkey, ct) {
        if ct.flags & CT_F_SNAT != 0 {
            // Give the port back at once.
            *rkey = CtKey::new(baddr, ct.nat_addr, bport, ct.nat_port, f.proto, CT_REVERSE);
            let _ = I::ct().remove(rkey);
        }
        return drop_packet(ctx, f, DropReason::CtFull, service_id);
    }
    flow_made::<I>();
    let a = rewrite_remote(ctx, f, ct);
    if a != Action::NEXT {
        return a;
    }
    finish_redirect::<C, I>(ctx, route)
}

/// Maglev: the flow's hash picks a slot of the service's table, whose size
/// the master names (or, written by an older agent, the agent-wide
/// `CFG_MAGLEV_M`). The agent writes a table before the master when the
/// size grows and after it when it shrinks, so the size read here is never
/// past the end of the table found next.
#[inline(always)]
pub(super) fn maglev<I: Ip>(
    f: &Flow<I>,
    svc: &ServiceValue,
) -> Result<(u32, I::Backend), DropReason> {
    let m = match svc.maglev_size {
        0 => runtime::config(CFG_MAGLEV_M),
        code => lb_common::maps::maglev_size_of(code).unwrap_or(0),
    };
    // A NonZero divisor: no panic path for the verifier to reject.
    let Some(m) = core::num::NonZeroU32::new(m) else {
        return Err(DropReason::MaglevMissing);
    };
    let slot = I::flow_hash(f) % m;
    // SAFETY: a map value, copied at once.
    let id = match unsafe { LB_MAGLEV.get_value(&svc.service_id, &slot) } {
        Some(id) => *id,
        None => return Err(DropReason::MaglevMissing),
    };
    match I::backend(id) {
        Some(b) => Ok((id, b)),
        None => Err(DropReason::BackendMissing),
    }
}
