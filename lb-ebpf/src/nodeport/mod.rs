//! North-south load balancing: packets entering the node for NodePort,
//! LoadBalancer and external-IP frontends (tc ingress and XDP), and the
//! replies that must be translated back (tc ingress for SNAT, tc egress for
//! local backends and DSR). Written once over `NpContext`; `tc.rs` and
//! `xdp.rs` only adapt the verdicts and the few helpers that differ.
//!
//! Per new flow: service lookup (the node-local view for
//! externalTrafficPolicy: Local), backend by Maglev or at random, a route to
//! the backend (FIB lookup), then one of:
//!
//! * backend on this node: DNAT; the stack delivers it; tc egress undoes
//!   the DNAT on the reply (CT_REVERSE);
//! * remote, SNAT: DNAT + SNAT to this node's address on the egress device,
//!   redirect; the reply comes back to that port and tc ingress undoes both;
//! * remote, DSR: DNAT, the service address in an IPv4 option (on a TCP SYN,
//!   on every UDP datagram), redirect; the backend's node learns the service
//!   from the option and its tc egress makes the reply leave from it.
//!
//! Conntrack (LB4_CT, an LRU) keeps every packet of a flow on the backend its
//! first packet chose, whatever happens to the backend set or the Maglev
//! table, until the flow ends, idles out, or its backend is gone.
pub mod flow;
pub mod packet;
pub mod tc;
pub mod xdp;

use aya_ebpf::{
    bindings::bpf_fib_lookup,
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns},
};
use lb_common::{
    backend::{Backend4, BACKEND_FLAG_LOCAL},
    config::{
        CFG_LB_MODE, CFG_MAGLEV_M, CFG_SNAT_PORT_MAX, CFG_SNAT_PORT_MIN, CNT_CT_CREATED,
        CNT_DSR_LEARNED, CNT_NP_FORWARD, CNT_NP_REVERSE,
    },
    drop::{Direction, DropReason},
    event::Event,
    nodeport::*,
    service::{
        Service4Key, ServiceValue, ALG_MAGLEV, SCOPE_ALL, SCOPE_LOCAL, SVC_FLAG_EXTERNAL_IP,
        SVC_FLAG_LOAD_BALANCER, SVC_FLAG_NODE_PORT, SVC_FLAG_TWO_SCOPES,
    },
};

use self::{
    flow::{parse, Flow, Parsed},
    packet::*,
};
use crate::{
    drop, events,
    lb::{self, Family, V4},
    maps::{LB4_CT, LB_DEVICES, LB_MAGLEV, LB_SCRATCH},
};

/// Per-CPU room for what does not fit the 512-byte BPF stack along a call
/// chain. Safe to share: a program runs to completion on its CPU and neither
/// tc nor XDP nests into another run of itself there.
#[repr(C)]
pub struct Scratch {
    pub flow: Flow,
    pub fib: bpf_fib_lookup,
    pub event: Event,
    /// Conntrack values being built for a new flow (forward and reverse).
    pub ct: Ct4Value,
    pub rct: Ct4Value,
}

#[inline(always)]
fn scratch() -> Option<*mut Scratch> {
    LB_SCRATCH.get_ptr_mut(0)
}

/// What the program does with the packet.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Hand it to the stack (as is, or rewritten for a local backend).
    Pass,
    Drop,
    /// Send it out of this device, already rewritten (MACs included).
    Redirect(u32),
    /// Send it out of this device, the kernel resolving the next hop (tc only).
    RedirectNeigh(u32, u32),
    /// XDP could not do it without the stack's help: let tc handle it (the
    /// packet is untouched).
    Punt,
}

/// The hook-specific parts.
pub trait NpContext: Pkt {
    fn ingress_ifindex(&self) -> u32;
    fn hook(&self) -> u8;
    /// Inserts `len` bytes after the 20-byte IPv4 header (the DSR option).
    /// XDP does not: it punts those packets to tc.
    fn grow_ip_options(&self, len: u32) -> bool;
    /// Removes `len` bytes after the 20-byte IPv4 header.
    fn shrink_ip_options(&self, len: u32) -> bool;
    fn fib_lookup(&self, params: &mut bpf_fib_lookup) -> i64;
    /// Fixes the IPv4 header checksum for a 4-byte field that changed.
    fn csum_l3(&self, old: u32, new: u32) -> bool;
    /// Fixes the L4 checksum at `check_off` for a field that changed; `size`
    /// 2 or 4; `pseudo`: the field is part of the pseudo-header (an address).
    fn csum_l4(
        &self,
        check_off: usize,
        old: u32,
        new: u32,
        size: u64,
        pseudo: bool,
        udp: bool,
    ) -> bool;
    /// XDP cannot insert options or resolve neighbours: it punts instead.
    const CAN_INSERT_OPTIONS: bool;
    const CAN_RESOLVE_NEIGH: bool;
}

const AF_INET: u8 = 2;
const BPF_FIB_LKUP_RET_SUCCESS: i64 = 0;
const BPF_FIB_LKUP_RET_NO_NEIGH: i64 = 7;
const BPF_NOEXIST: u64 = 1;
const NS: u64 = 1_000_000_000;
const SNAT_ATTEMPTS: u32 = 8;

#[inline(always)]
fn now() -> u64 {
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
fn lifetime(proto: u8, flags: u16) -> u64 {
    if flags & CT_F_CLOSING != 0 {
        CT_LIFETIME_CLOSING
    } else if proto == IPPROTO_TCP {
        CT_LIFETIME_TCP
    } else {
        CT_LIFETIME_UDP
    }
}

#[inline(always)]
fn fill_event<C: NpContext>(e: &mut Event, ctx: &C, f: &Flow) {
    *e = Event::zeroed();
    e.hook = ctx.hook();
    e.proto = f.proto;
    e.family = 4;
    e.saddr[..4].copy_from_slice(&f.saddr.to_ne_bytes());
    e.daddr[..4].copy_from_slice(&f.daddr.to_ne_bytes());
    e.sport = f.sport;
    e.dport = f.dport;
}

#[inline(never)]
fn drop_packet<C: NpContext>(ctx: &C, f: &Flow, reason: DropReason, service_id: u32) -> Action {
    match scratch() {
        Some(s) => {
            let e = unsafe { &mut (*s).event };
            fill_event(e, ctx, f);
            e.service_id = service_id;
            drop::drop_packet(reason, Direction::Ingress, e);
        }
        None => drop::count(reason, Direction::Ingress),
    }
    Action::Drop
}

// Subprograms (#[inline(never)]) split the work into BPF-to-BPF calls: each
// has its own stack frame, so the drop path's event, the FIB parameters and
// the conntrack values are never on the stack at the same time (512 bytes in
// all along a call chain, kernel/bpf/verifier.c MAX_BPF_STACK).

/// A live conntrack entry, refreshed; None when missing or idled out. The
/// entry itself, not a copy (the stack is short): read it right away.
#[inline(always)]
fn ct_get(key: &Ct4Key, proto: u8, tcp_flags: u8) -> Option<&'static Ct4Value> {
    let entry = LB4_CT.get_ptr_mut(key)?;
    let entry = unsafe { &mut *entry };
    let t = now();
    if t.saturating_sub(entry.last_seen_ns) > lifetime(proto, entry.flags) * NS {
        return None;
    }
    if tcp_flags & (TCP_FIN | TCP_RST) != 0 {
        entry.flags |= CT_F_CLOSING;
    }
    // Refresh at most once a second: fewer writes to a shared entry.
    if t.saturating_sub(entry.last_seen_ns) > NS {
        entry.last_seen_ns = t;
    }
    Some(entry)
}

/// tc ingress and XDP: a packet arriving on an external device.
///
/// A thin dispatcher over subprograms called one after the other, so their
/// stack frames are never live at the same time.
#[inline(always)]
pub fn ingress<C: NpContext>(ctx: &C) -> Action {
    let Some(s) = scratch() else {
        return Action::Pass;
    };
    let parsed = parse_into(ctx, s);
    // Raw field projection: the flow is read while the FIB, event and
    // conntrack parts of the same scratch value are written, never through
    // one &mut Scratch.
    let f: &Flow = unsafe { &(*s).flow };
    match parsed {
        Parsed::Other => return Action::Pass,
        Parsed::Flow => {}
        Parsed::Fragment(ports) => {
            return reject_unless_passable(ctx, f, ports, DropReason::Fragment)
        }
        Parsed::Invalid(ports) => {
            return reject_unless_passable(ctx, f, ports, DropReason::InvalidPacket)
        }
    }

    // On a backend's node: a DSR request carries the service address.
    if let Some((vip, vport)) = f.dsr {
        if !C::CAN_INSERT_OPTIONS {
            return Action::Punt;
        }
        return learn_dsr(ctx, f, vip, vport);
    }
    if let Some(a) = known_flow(ctx, f) {
        return a;
    }
    if let Some(a) = snat_reply(ctx, f) {
        return a;
    }
    new_flow(ctx, f)
}

#[inline(never)]
fn parse_into<C: NpContext>(ctx: &C, s: *mut Scratch) -> Parsed {
    parse(ctx, unsafe { &mut (*s).flow })
}

/// A fragment or a broken packet: dropped when addressed to a service
/// frontend (counted, with its reason), left to the stack otherwise.
#[inline(never)]
fn reject_unless_passable<C: NpContext>(
    ctx: &C,
    f: &Flow,
    ports: bool,
    reason: DropReason,
) -> Action {
    if ports && is_service(f) {
        drop_packet(ctx, f, reason, 0)
    } else {
        Action::Pass
    }
}

/// A known flow to a frontend stays on its backend.
#[inline(never)]
fn known_flow<C: NpContext>(ctx: &C, f: &Flow) -> Option<Action> {
    let key = f.ct_key(CT_SERVICE);
    let ct = ct_get(&key, f.proto, f.tcp_flags)?;
    // Its backend is gone: None, and the flow chooses again.
    let b = V4::backend(ct.backend_id)?;
    Some(forward_known(ctx, f, ct, &b))
}

/// A reply to a SNATed flow, addressed to our SNAT port.
#[inline(never)]
fn snat_reply<C: NpContext>(ctx: &C, f: &Flow) -> Option<Action> {
    let key = f.ct_key(CT_REVERSE);
    let ct = ct_get(&key, f.proto, f.tcp_flags)?;
    if ct.flags & CT_F_SNAT == 0 {
        return None;
    }
    Some(reverse_snat(ctx, f, ct))
}

/// The frontend for traffic from outside: NodePort, LoadBalancer or
/// external IP; the node-local view when the service has one (eTP Local).
#[inline(always)]
fn external_service(f: &Flow) -> Option<(ServiceValue, Service4Key)> {
    let key = Service4Key::new(f.daddr, f.dport, f.proto, SCOPE_ALL, 0);
    let svc = V4::service(&key)?;
    if svc.flags & (SVC_FLAG_NODE_PORT | SVC_FLAG_LOAD_BALANCER | SVC_FLAG_EXTERNAL_IP) == 0 {
        return None;
    }
    if svc.flags & SVC_FLAG_TWO_SCOPES != 0 {
        let local = Service4Key::new(f.daddr, f.dport, f.proto, SCOPE_LOCAL, 0);
        return V4::service(&local).map(|s| (s, local));
    }
    Some((svc, key))
}

#[inline(always)]
fn is_service(f: &Flow) -> bool {
    external_service(f).is_some()
}

/// A new flow to a frontend: pick a backend, then hand it to the local or
/// the remote path.
#[inline(never)]
fn new_flow<C: NpContext>(ctx: &C, f: &Flow) -> Action {
    let Some((svc, key)) = external_service(f) else {
        return Action::Pass;
    };
    let picked = if svc.algorithm == ALG_MAGLEV {
        maglev(f, &svc)
    } else {
        lb::select_backend::<V4>(&key, &svc)
    };
    let (backend_id, b) = match picked {
        Ok(x) => x,
        Err(reason) => return drop_packet(ctx, f, reason, svc.service_id),
    };
    let Some(sp) = scratch() else {
        return Action::Drop;
    };
    let ct = unsafe { &mut (*sp).ct };
    *ct = Ct4Value {
        backend_id,
        service_id: svc.service_id,
        addr: b.address,
        nat_addr: 0,
        port: b.port,
        nat_port: 0,
        flags: 0,
        pad: 0,
        last_seen_ns: now(),
    };
    if b.flags & BACKEND_FLAG_LOCAL != 0 {
        new_local(ctx, f, &b)
    } else {
        new_remote(ctx, f, &b)
    }
}

/// Backend on this node: DNAT here, the stack delivers it, tc egress undoes
/// the DNAT on the reply.
#[inline(never)]
fn new_local<C: NpContext>(ctx: &C, f: &Flow, b: &Backend4) -> Action {
    let Some(sp) = scratch() else {
        return Action::Drop;
    };
    let (ct, rct) = unsafe { (&mut (*sp).ct, &mut (*sp).rct) };
    ct.flags = CT_F_LOCAL;
    *rct = *ct;
    rct.addr = f.daddr;
    rct.port = f.dport;
    let skey = f.ct_key(CT_SERVICE);
    let rev = Ct4Key::new(b.address, f.saddr, b.port, f.sport, f.proto, CT_REVERSE);
    if LB4_CT.insert(&rev, &*rct, 0).is_err() || LB4_CT.insert(&skey, &*ct, 0).is_err() {
        return drop_packet(ctx, f, DropReason::CtFull, ct.service_id);
    }
    events::bump(CNT_CT_CREATED);
    match rewrite_dnat(ctx, f, b) {
        Some(()) => {
            events::bump(CNT_NP_FORWARD);
            Action::Pass
        }
        None => Action::Drop,
    }
}

/// Backend on another node: SNAT or DSR by mode, routed by a FIB lookup.
#[inline(never)]
fn new_remote<C: NpContext>(ctx: &C, f: &Flow, b: &Backend4) -> Action {
    let mode = events::config(CFG_LB_MODE);
    let dsr = mode == MODE_DSR || (mode == MODE_HYBRID && f.proto == IPPROTO_TCP);
    let needs_option = dsr && (f.proto == IPPROTO_UDP || f.tcp_flags & TCP_SYN != 0);
    if needs_option && !C::CAN_INSERT_OPTIONS {
        return Action::Punt; // before anything changed: tc will redo it
    }
    let Some(sp) = scratch() else {
        return Action::Drop;
    };
    let ct = unsafe { &mut (*sp).ct };
    // The route to the backend decides the egress device and its address.
    let route = fib_lookup(ctx, f.saddr, b.address, f);
    let egress = match route {
        Route::Resolved(ifindex) | Route::NoNeigh(ifindex, _) => ifindex,
        Route::None => return drop_packet(ctx, f, DropReason::FibLookupFailed, ct.service_id),
    };
    if matches!(route, Route::NoNeigh(..)) && !C::CAN_RESOLVE_NEIGH {
        return Action::Punt;
    }
    if dsr {
        ct.flags = CT_F_DSR;
    } else {
        let Some(dev) = (unsafe { LB_DEVICES.get(&egress) }).copied() else {
            return drop_packet(ctx, f, DropReason::FibLookupFailed, ct.service_id);
        };
        ct.flags = CT_F_SNAT;
        ct.nat_addr = dev.address;
        match alloc_snat_port(f, b, dev.address) {
            Some(port) => ct.nat_port = port,
            None => return drop_packet(ctx, f, DropReason::SnatPortsExhausted, ct.service_id),
        }
    }
    let skey = f.ct_key(CT_SERVICE);
    if LB4_CT.insert(&skey, &*ct, 0).is_err() {
        return drop_packet(ctx, f, DropReason::CtFull, ct.service_id);
    }
    events::bump(CNT_CT_CREATED);
    forward_remote(ctx, f, ct, b, needs_option, route)
}

/// Maglev: the flow's hash picks a slot of the service's table.
#[inline(always)]
fn maglev(f: &Flow, svc: &ServiceValue) -> Result<(u32, Backend4), DropReason> {
    let m = events::config(CFG_MAGLEV_M);
    // A NonZero divisor: no panic path for the verifier to reject.
    let Some(m) = core::num::NonZeroU32::new(m) else {
        return Err(DropReason::MaglevMissing);
    };
    let slot = flow_hash(f.saddr, f.daddr, f.sport, f.dport, f.proto) % m;
    let id = match unsafe { LB_MAGLEV.get_value(&svc.service_id, &slot) } {
        Some(id) => *id,
        None => return Err(DropReason::MaglevMissing),
    };
    match V4::backend(id) {
        Some(b) => Ok((id, b)),
        None => Err(DropReason::BackendMissing),
    }
}

/// A free SNAT port: the reverse entry (backend → node:port) is created with
/// BPF_NOEXIST, so two flows can never share one.
#[inline(never)]
fn alloc_snat_port(f: &Flow, b: &Backend4, node: u32) -> Option<u16> {
    let min = events::config(CFG_SNAT_PORT_MIN);
    let max = events::config(CFG_SNAT_PORT_MAX);
    if min == 0 || max < min || max > 65535 {
        return None;
    }
    let Some(span) = core::num::NonZeroU32::new(max - min + 1) else {
        return None;
    };
    // The reverse value, next to the forward one the caller filled in.
    let sp = scratch()?;
    let (ct, rval) = unsafe { (&(*sp).ct, &mut (*sp).rct) };
    *rval = *ct;
    rval.addr = f.daddr;
    rval.port = f.dport;
    rval.nat_addr = f.saddr;
    rval.nat_port = f.sport;
    let mut i = 0;
    while i < SNAT_ATTEMPTS {
        let port = ((min + unsafe { bpf_get_prandom_u32() } % span) as u16).to_be();
        let rkey = Ct4Key::new(b.address, node, b.port, port, f.proto, CT_REVERSE);
        if LB4_CT.insert(&rkey, &*rval, BPF_NOEXIST).is_ok() {
            return Some(port);
        }
        i += 1;
    }
    None
}

enum Route {
    /// Egress ifindex; the MACs are in the scratch FIB parameters.
    Resolved(u32),
    /// Egress ifindex and next hop, neighbour not resolved yet.
    NoNeigh(u32, u32),
    None,
}

// The "no route: drop / unresolved neighbour in XDP: punt" match stands
// three times below on purpose: a shared helper taking `&Route` made LLVM
// spill the enum with an uninitialised payload register, which the verifier
// rejects (R1 !read_ok).

/// FIB lookup toward `daddr`, in the scratch map's parameters (which keep
/// the MACs for `finish_redirect`).
#[inline(always)]
fn fib_lookup<C: NpContext>(ctx: &C, saddr: u32, daddr: u32, f: &Flow) -> Route {
    let Some(s) = scratch() else {
        return Route::None;
    };
    let p = unsafe { &mut (*s).fib };
    *p = unsafe { core::mem::zeroed() };
    p.family = AF_INET;
    p.l4_protocol = f.proto;
    p.sport = f.sport;
    p.dport = f.dport;
    p.__bindgen_anon_1.tot_len = f.tot_len;
    p.ifindex = ctx.ingress_ifindex();
    p.__bindgen_anon_3.ipv4_src = saddr;
    p.__bindgen_anon_4.ipv4_dst = daddr;
    match ctx.fib_lookup(p) {
        BPF_FIB_LKUP_RET_SUCCESS => Route::Resolved(p.ifindex),
        BPF_FIB_LKUP_RET_NO_NEIGH => {
            Route::NoNeigh(p.ifindex, unsafe { p.__bindgen_anon_4.ipv4_dst })
        }
        _ => Route::None,
    }
}

/// A packet of a known flow: same rewrite as its first packet (no option).
#[inline(never)]
fn forward_known<C: NpContext>(ctx: &C, f: &Flow, ct: &Ct4Value, b: &Backend4) -> Action {
    if ct.flags & CT_F_LOCAL != 0 {
        return rewrite_dnat(ctx, f, b).map_or(Action::Drop, |_| {
            events::bump(CNT_NP_FORWARD);
            Action::Pass
        });
    }
    let needs_option =
        ct.flags & CT_F_DSR != 0 && (f.proto == IPPROTO_UDP || f.tcp_flags & TCP_SYN != 0);
    if needs_option && !C::CAN_INSERT_OPTIONS {
        return Action::Punt;
    }
    let route = fib_lookup(ctx, f.saddr, b.address, f);
    match route {
        Route::None => return drop_packet(ctx, f, DropReason::FibLookupFailed, ct.service_id),
        Route::NoNeigh(..) if !C::CAN_RESOLVE_NEIGH => return Action::Punt,
        _ => {}
    }
    forward_remote(ctx, f, ct, b, needs_option, route)
}

#[inline(always)]
fn forward_remote<C: NpContext>(
    ctx: &C,
    f: &Flow,
    ct: &Ct4Value,
    b: &Backend4,
    needs_option: bool,
    route: Route,
) -> Action {
    if ct.flags & CT_F_SNAT != 0 {
        if rewrite_snat(ctx, f, b, ct.nat_addr, ct.nat_port).is_none() {
            return Action::Drop;
        }
    } else if rewrite_dnat(ctx, f, b).is_none() {
        return Action::Drop;
    }
    if needs_option && !insert_dsr_option(ctx, f) {
        return drop_packet(ctx, f, DropReason::InvalidPacket, ct.service_id);
    }
    events::bump(CNT_NP_FORWARD);
    finish_redirect(ctx, route)
}

#[inline(always)]
fn finish_redirect<C: NpContext>(ctx: &C, route: Route) -> Action {
    match route {
        Route::Resolved(ifindex) => {
            let Some(s) = scratch() else {
                return Action::Drop;
            };
            let (dmac, smac) = unsafe { ((*s).fib.dmac, (*s).fib.smac) };
            if !store(ctx, 0, dmac) || !store(ctx, 6, smac) {
                return Action::Drop;
            }
            Action::Redirect(ifindex)
        }
        Route::NoNeigh(ifindex, nexthop) => Action::RedirectNeigh(ifindex, nexthop),
        Route::None => Action::Drop,
    }
}

/// Rewrites the destination to the backend (address, port, checksums).
#[inline(always)]
fn rewrite_dnat<C: NpContext>(ctx: &C, f: &Flow, b: &Backend4) -> Option<()> {
    set_addr(ctx, f, IP_DADDR, f.daddr, b.address)?;
    set_port(ctx, f, L4_DPORT, f.dport, b.port)
}

/// DNAT plus SNAT to this node's address and port.
#[inline(always)]
fn rewrite_snat<C: NpContext>(ctx: &C, f: &Flow, b: &Backend4, node: u32, port: u16) -> Option<()> {
    rewrite_dnat(ctx, f, b)?;
    set_addr(ctx, f, IP_SADDR, f.saddr, node)?;
    set_port(ctx, f, L4_SPORT, f.sport, port)
}

/// A reply from a backend to our SNAT port: back to the client, from the
/// service address.
#[inline(never)]
fn reverse_snat<C: NpContext>(ctx: &C, f: &Flow, ct: &Ct4Value) -> Action {
    // ct: addr/port = the frontend, nat_addr/nat_port = the client.
    let route = fib_lookup(ctx, ct.addr, ct.nat_addr, f);
    match route {
        Route::None => return drop_packet(ctx, f, DropReason::FibLookupFailed, ct.service_id),
        Route::NoNeigh(..) if !C::CAN_RESOLVE_NEIGH => return Action::Punt,
        _ => {}
    }
    let ok = set_addr(ctx, f, IP_SADDR, f.saddr, ct.addr)
        .and_then(|_| set_port(ctx, f, L4_SPORT, f.sport, ct.port))
        .and_then(|_| set_addr(ctx, f, IP_DADDR, f.daddr, ct.nat_addr))
        .and_then(|_| set_port(ctx, f, L4_DPORT, f.dport, ct.nat_port));
    if ok.is_none() {
        return Action::Drop;
    }
    events::bump(CNT_NP_REVERSE);
    finish_redirect(ctx, route)
}

/// On the backend's node: remember which service a DSR flow was for, so the
/// reply can leave from it; then strip the option and let the stack deliver.
#[inline(never)]
fn learn_dsr<C: NpContext>(ctx: &C, f: &Flow, vip: u32, vport: u16) -> Action {
    let key = f.reply_ct_key(CT_REVERSE);
    let val = Ct4Value {
        backend_id: 0,
        service_id: 0,
        addr: vip,
        nat_addr: 0,
        port: vport,
        nat_port: 0,
        flags: CT_F_DSR,
        pad: 0,
        last_seen_ns: now(),
    };
    if LB4_CT.insert(&key, &val, 0).is_err() {
        return drop_packet(ctx, f, DropReason::CtFull, 0);
    }
    events::bump(CNT_DSR_LEARNED);
    // Ours is the only option: take it out. With other options too, or if
    // that fails, it stays: the stack ignores an unknown option.
    if f.ip_len == 28 {
        remove_dsr_option(ctx, f);
    }
    Action::Pass
}

/// tc egress: replies leaving the node whose source must become the service
/// address again (a local backend's reply, or a DSR reply on the backend's node).
#[inline(always)]
pub fn egress<C: NpContext>(ctx: &C) -> Action {
    let Some(s) = scratch() else {
        return Action::Pass;
    };
    if parse(ctx, unsafe { &mut (*s).flow }) != Parsed::Flow {
        return Action::Pass;
    }
    let f: &Flow = unsafe { &(*s).flow };
    let key = f.ct_key(CT_REVERSE);
    let Some(ct) = ct_get(&key, f.proto, f.tcp_flags) else {
        return Action::Pass;
    };
    if ct.flags & CT_F_SNAT != 0 {
        return Action::Pass; // SNAT replies arrive on ingress
    }
    let (addr, port) = (ct.addr, ct.port);
    let ok = set_addr(ctx, f, IP_SADDR, f.saddr, addr)
        .and_then(|_| set_port(ctx, f, L4_SPORT, f.sport, port));
    if ok.is_none() {
        return Action::Drop;
    }
    events::bump(CNT_NP_REVERSE);
    Action::Pass
}

/// Rewrites an IPv4 address field, fixing the IP and L4 (pseudo-header) checksums.
#[inline(always)]
fn set_addr<C: NpContext>(ctx: &C, f: &Flow, field: usize, old: u32, new: u32) -> Option<()> {
    if old == new {
        return Some(());
    }
    if !store(ctx, ETH_HLEN + field, new) || !ctx.csum_l3(old, new) {
        return None;
    }
    ctx.csum_l4(l4_check(f), old, new, 4, true, f.proto == IPPROTO_UDP)
        .then_some(())
}

#[inline(always)]
fn set_port<C: NpContext>(ctx: &C, f: &Flow, field: usize, old: u16, new: u16) -> Option<()> {
    if old == new {
        return Some(());
    }
    if !store(ctx, f.l4() + field, new) {
        return None;
    }
    ctx.csum_l4(
        l4_check(f),
        old as u32,
        new as u32,
        2,
        false,
        f.proto == IPPROTO_UDP,
    )
    .then_some(())
}

#[inline(always)]
fn l4_check(f: &Flow) -> usize {
    f.l4()
        + if f.proto == IPPROTO_TCP {
            TCP_CHECK
        } else {
            UDP_CHECK
        }
}

/// The XDP way: RFC 1624 on the checksum fields themselves (there is no
/// skb checksum state to keep in step).
#[inline(always)]
pub fn manual_csum_l3<P: Pkt>(p: &P, old: u32, new: u32) -> bool {
    let off = ETH_HLEN + IP_CHECK;
    match load::<u16, P>(p, off) {
        Some(c) => store(p, off, csum_apply(c, diff32(old, new))),
        None => false,
    }
}

#[inline(always)]
pub fn manual_csum_l4<P: Pkt>(p: &P, off: usize, old: u32, new: u32, size: u64, udp: bool) -> bool {
    let Some(check) = load::<u16, P>(p, off) else {
        return false;
    };
    if udp && check == 0 {
        return true; // no UDP checksum (allowed for IPv4): keep none
    }
    let d = if size == 4 {
        diff32(old, new)
    } else {
        diff16(old as u16, new as u16)
    };
    let mut c = csum_apply(check, d);
    if udp && c == 0 {
        c = 0xffff; // RFC 768: a computed zero is sent as all ones
    }
    store(p, off, c)
}

/// Inserts the DSR option right after the 20-byte IPv4 header: type, length,
/// the service port and address (as the packet had them before the DNAT).
#[inline(always)]
fn insert_dsr_option<C: NpContext>(ctx: &C, f: &Flow) -> bool {
    if f.ip_len != 20 || !ctx.grow_ip_options(DSR_OPT_LEN as u32) {
        return false;
    }
    let ip = ETH_HLEN;
    let opt: [u8; 2] = [DSR_OPT_TYPE, DSR_OPT_LEN];
    let ok = store(ctx, ip, 0x47u8) // version 4, 7 words
        && store(ctx, ip + IP_TOT_LEN, (f.tot_len + DSR_OPT_LEN as u16).to_be())
        && store(ctx, ip + 20, opt)
        && store(ctx, ip + 22, f.dport)
        && store(ctx, ip + 24, f.daddr);
    if !ok {
        return false;
    }
    match ipv4_csum(ctx, ip, true) {
        Some(c) => store(ctx, ip + IP_CHECK, c),
        None => false,
    }
}

#[inline(always)]
fn remove_dsr_option<C: NpContext>(ctx: &C, f: &Flow) -> bool {
    if !ctx.shrink_ip_options(DSR_OPT_LEN as u32) {
        return false;
    }
    let ip = ETH_HLEN;
    let ok = store(ctx, ip, 0x45u8)
        && store(
            ctx,
            ip + IP_TOT_LEN,
            (f.tot_len - DSR_OPT_LEN as u16).to_be(),
        );
    if !ok {
        return false;
    }
    match ipv4_csum(ctx, ip, false) {
        Some(c) => store(ctx, ip + IP_CHECK, c),
        None => false,
    }
}
