//! Flows that have a conntrack entry: a known flow to a frontend stays on
//! its backend, a backend's reply to a SNAT port goes back to its client,
//! and on egress a local backend's (or a DSR) reply leaves from the
//! frontend.
use super::access::store_mac;
#[allow(clippy::wildcard_imports)]
use super::*;

/// A known flow to a frontend stays on its backend (NEXT: not a known flow).
#[inline(never)]
pub(super) fn known_flow<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
    let Some(sp) = scratch::<I>() else {
        return Action::DROP;
    };
    // SAFETY: per-CPU scratch; the key field is not the flow. (A new flow
    // overwrites it later: the lookup is done by then.)
    let key = unsafe { &mut (*sp).fkey };
    *key = f.ct_key(CT_SERVICE);
    match ct::lookup::<I>(key, f.proto, f.tcp_flags) {
        Hit::Miss => Action::NEXT,
        Hit::Reopen => {
            // The tuple is reused: new_flow chooses again and overwrites.
            bump(CNT_CT_REOPENED);
            Action::NEXT
        }
        Hit::Live(ct) => {
            // Its backend is gone (or its id now names another backend):
            // the flow chooses again. Checked only when a backend has been
            // deleted since this entry last looked (the generation moved):
            // a hash lookup less on nearly every packet. The generation is
            // read before the backend, as in `pick`. Limits, accepted: the
            // entry keeps 16 bits, so one idle across an exact multiple of
            // 65 535 moves is trusted until the next move; and nothing
            // orders the two loads on a weakly ordered CPU, where the agent
            // writes them microseconds apart.
            let gen = backends_gen();
            if ct.backends_gen != gen {
                if !I::backend_is(ct.backend_id, &ct.addr, ct.port) {
                    return Action::NEXT;
                }
                ct.backends_gen = gen;
            }
            frag::remember(f);
            if ct.flags & CT_F_COUNTED != 0 {
                // SAFETY: per-CPU scratch; fields of their own.
                unsafe {
                    (*sp).stats_service = ct.service_id;
                    (*sp).stats_new_flow = 0;
                }
            }
            if ct.flags & CT_F_LOCAL != 0 {
                return forward_local(ctx, f, ct);
            }
            forward_known(ctx, f, ct)
        }
    }
}

/// The low 16 bits of the backends' generation (`LB_BACKENDS_GEN`), as
/// conntrack entries keep it.
#[inline(always)]
pub(super) fn backends_gen() -> u16 {
    LB_BACKENDS_GEN.get(0).map_or(0, |g| *g as u16)
}

/// A reply to a SNATed flow, addressed to our SNAT port (NEXT: not one).
#[inline(never)]
pub(super) fn snat_reply<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
    let Some(sp) = scratch::<I>() else {
        return Action::DROP;
    };
    // SAFETY: per-CPU scratch. The reply's own key, where the route cache
    // looks for it (`known_flow` is done with the forward one).
    let key = unsafe { &mut (*sp).fkey };
    *key = f.ct_key(CT_REVERSE);
    let Hit::Live(ct) = ct::lookup::<I>(key, f.proto, f.tcp_flags) else {
        return Action::NEXT;
    };
    if ct.flags & CT_F_SNAT == 0 {
        return Action::NEXT;
    }
    frag::remember(f);
    if ct.flags & CT_F_HOST != 0 {
        if C::IS_XDP {
            // tc must see it untouched: given its port back here, the reply
            // would meet the clashing SNAT flow's entry there.
            return Action::PUNT;
        }
        return super::host_flow::reply(ctx, f, ct);
    }
    reverse_snat(ctx, f, ct)
}

/// A packet of a known flow to a backend on this node (or from a pod):
/// DNAT, and the stack delivers it. Inlined into `known_flow`: a call and
/// its return less on the busiest path (a return costs more than a few
/// instructions on CPUs whose kernels mitigate SRSO or retbleed).
#[inline(always)]
pub(super) fn forward_local<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, ct: &CtValue<I::Addr>) -> Action {
    let (baddr, bport) = (&ct.addr, ct.port);
    let rewritten = if ct.flags & CT_F_SNAT != 0 {
        nat::dnat_snat(ctx, f, baddr, bport, &ct.nat_addr, ct.nat_port)
    } else {
        nat::dnat(ctx, f, baddr, bport)
    };
    rewritten.map_or(Action::DROP, |_| {
        bump(CNT_NP_FORWARD);
        Action::PASS
    })
}

/// A packet of a known flow to a backend on another node: same rewrite and
/// route as its first packet.
#[inline(never)]
pub(super) fn forward_known<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, ct: &CtValue<I::Addr>) -> Action {
    // The conntrack entry names the backend (`known_flow` checked it is
    // still the one its id names).
    let baddr = &ct.addr;
    let needs_option = ct.flags & CT_F_DSR != 0 && f.has_l4() && dsr::needs_option(f);
    if needs_option && C::IS_XDP {
        return Action::PUNT;
    }
    let extra = dsr_extra::<I>(needs_option, ct.flags & CT_F_DSR_ENCAP != 0);
    // `known_flow` left the flow's key in the scratch map.
    let route = route_cache::lookup(ctx, &f.saddr, baddr, f, extra);
    match route {
        Route::Failed(_) => return drop_packet(ctx, f, DropReason::FibLookupFailed, ct.service_id),
        Route::TooBig(mtu) => {
            return icmp_too_big(ctx, f, mtu.saturating_sub(extra), ct.service_id)
        }
        Route::NoNeigh(..) if C::IS_XDP => return Action::PUNT,
        _ => {}
    }
    if f.ttl <= 1 {
        return pending_icmp::<C, I>(icmp::Error::TTL_EXCEEDED, ct.service_id);
    }
    let a = rewrite_remote(ctx, f, ct);
    if a != Action::NEXT {
        return a;
    }
    finish_redirect::<C, I>(ctx, route)
}

/// The bytes a DSR packet grows by on its way to the backend: the option,
/// and with the IPIP dispatch the outer header around it.
#[inline(always)]
pub(super) fn dsr_extra<I: Ip>(needs_option: bool, encap: bool) -> u16 {
    match (needs_option, encap) {
        (false, _) => 0,
        (true, false) => I::DSR_LEN,
        (true, true) => I::DSR_LEN + I::ENCAP_LEN,
    }
}

// The "no route: drop / too big: ICMP / XDP without a resolved neighbour:
// punt" match stands in each caller on purpose: a shared helper taking
// `&Route` made LLVM spill the enum with an uninitialised payload register,
// which the verifier rejects (R1 !read_ok).

/// The rewrite of a packet to a remote backend: TTL, DNAT (and SNAT), the
/// DSR option where due. NEXT when done; the caller then redirects it.
/// (The backend is `ct.addr`/`ct.port`; a separate subprogram keeps the
/// callers' stack frames within the 512-byte budget.)
///
/// The callers answered a packet whose TTL runs out here already (before
/// anything changed, and with one call frame less: the ICMP reply's frames
/// on top of this one would pass 512 bytes).
#[inline(never)]
pub(super) fn rewrite_remote<C: Hook, I: Ip>(
    ctx: &C,
    f: &Flow<I>,
    ct: &CtValue<I::Addr>,
) -> Action {
    if fib::decrement_ttl(ctx, f).is_err() {
        return Action::DROP;
    }
    let rewritten = if ct.flags & CT_F_SNAT != 0 {
        nat::dnat_snat(ctx, f, &ct.addr, ct.port, &ct.nat_addr, ct.nat_port)
    } else {
        nat::dnat(ctx, f, &ct.addr, ct.port)
    };
    if rewritten.is_none() {
        return Action::DROP;
    }
    let needs_option = ct.flags & CT_F_DSR != 0 && f.has_l4() && dsr::needs_option(f);
    if needs_option && !dsr::add(ctx, f, ct) {
        // (Without the service id: `ct` kept live across the call costs
        // this frame a slot the remote path's call chain has no room for.)
        return drop_packet(ctx, f, DropReason::InvalidPacket, 0);
    }
    bump(CNT_NP_FORWARD);
    Action::NEXT
}

#[inline(always)]
pub fn finish_redirect<C: Hook, I: Ip>(ctx: &C, route: Route) -> Action {
    match route {
        Route::Resolved(ifindex) => {
            let Some(s) = scratch::<I>() else {
                return Action::DROP;
            };
            // SAFETY: per-CPU scratch; the FIB parameters hold the MACs.
            let fib = unsafe { &(*s).fib };
            if !store_mac(ctx, 0, &fib.dmac) || !store_mac(ctx, 6, &fib.smac) {
                return Action::DROP;
            }
            Action::redirect(ifindex)
        }
        Route::NoNeigh(ifindex) => Action::redirect_neigh::<I>(ifindex),
        Route::TooBig(_) | Route::Failed(_) => Action::DROP,
    }
}

/// A reply from a backend to our SNAT port: back to the client, from the
/// frontend.
#[inline(never)]
pub(super) fn reverse_snat<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, ct: &CtValue<I::Addr>) -> Action {
    // (`snat_reply` left this reply's conntrack key in the scratch map,
    // where the route cache looks.)
    // ct: addr/port = the frontend, nat_addr/nat_port = the client.
    let route = route_cache::lookup(ctx, &ct.addr, &ct.nat_addr, f, 0);
    match route {
        Route::Failed(_) => return drop_packet(ctx, f, DropReason::FibLookupFailed, ct.service_id),
        // Answered to the backend: it sent what does not fit toward the client.
        Route::TooBig(mtu) => return icmp_too_big(ctx, f, mtu, ct.service_id),
        Route::NoNeigh(..) if C::IS_XDP => return Action::PUNT,
        _ => {}
    }
    if f.ttl <= 1 {
        return pending_icmp::<C, I>(icmp::Error::TTL_EXCEEDED, ct.service_id);
    }
    if fib::decrement_ttl(ctx, f).is_err() {
        return Action::DROP;
    }
    if nat::reverse_snat(ctx, f, &ct.addr, ct.port, &ct.nat_addr, ct.nat_port).is_none() {
        return Action::DROP;
    }
    bump(CNT_NP_REVERSE);
    finish_redirect::<C, I>(ctx, route)
}

#[inline(never)]
pub(super) fn reverse_local<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
    let key = f.ct_key(CT_REVERSE);
    let Hit::Live(ct) = ct::lookup::<I>(&key, f.proto, f.tcp_flags) else {
        return Action::PASS;
    };
    if ct.flags & CT_F_SNAT != 0 {
        return Action::PASS; // SNAT replies arrive on ingress
    }
    if nat::reverse_source(ctx, f, &ct.addr, ct.port).is_none() {
        return Action::DROP;
    }
    frag::remember(f);
    bump(CNT_NP_REVERSE);
    Action::PASS
}
