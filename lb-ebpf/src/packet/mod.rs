//! The packet path: packets entering the node for NodePort, LoadBalancer,
//! external-IP (and routed ClusterIP) frontends (tc ingress and XDP), and
//! the replies that must be translated back (tc ingress for SNAT, tc egress
//! for local backends and DSR). Written once over `Hook` and over the
//! address family (`family::Ip`); `tc.rs` and `xdp.rs` only adapt the
//! verdicts and the few helpers that differ.
//!
//! One module per concern:
//!
//! * `family`: what differs between IPv4 and IPv6 (headers, maps, keys);
//! * `parse`: the packet as a `Flow` (ports, TCP flags, fragments, the DSR
//!   option, the packet an ICMP error quotes);
//! * `ct`: conntrack, lifetimes and the closing/reopen rules;
//! * `snat`: source ports for SNAT;
//! * `host_flow`: host connections that meet a SNAT flow's tuple;
//! * `fib`: routes, path MTU, TTL;
//! * `route_cache`: a per-CPU cache of `fib`'s answers for a flow;
//! * `nat`: address and port rewrites with their checksums;
//! * `dsr`: the DSR option (add, learn, strip);
//! * `encap`: DSR's IPIP / IP6IP6 dispatch (the option's packet inside an
//!   outer header);
//! * `icmp`: errors this node sends, and errors about our flows translated;
//! * `icmp6`: the ICMPv6 errors this node sends;
//! * `frag`: IPv4 fragments following their first fragment;
//! * `access`, `csum`: bounds-checked packet access, checksums.
//!
//! Per new flow: frontend lookup (the node-local view for
//! externalTrafficPolicy: Local), backend by Maglev or at random, then:
//!
//! * backend on this node: DNAT; the stack delivers it; tc egress undoes
//!   the DNAT on the reply (CT_REVERSE);
//! * remote, SNAT: DNAT + SNAT to this node's address on the egress device,
//!   TTL decremented, redirected; the reply comes back to that port and tc
//!   ingress undoes both;
//! * remote, DSR: DNAT, the frontend in an IPv4 option (on a TCP SYN, on
//!   every UDP datagram), redirected; the backend's node learns the frontend
//!   from the option and its tc egress makes the reply leave from it.
//!
//! Conntrack keeps every packet of a flow on the backend its first packet
//! chose, whatever happens to the backend set or the Maglev table, until the
//! flow ends, idles out, or its backend is gone.
//!
//! IPv6 takes the same path (SNAT to the egress device's IPv6 address, DSR
//! in a Destination Options header), and answers with ICMPv6 errors
//! (`icmp6`) where IPv4 answers with ICMP ones. What only IPv4 has here
//! (fragments, the early exit) is reached through `Ip::as_v4`.
pub mod access;
pub mod csum;
pub mod ct;
pub mod drops;
pub mod dsr;
mod early_exit;
pub mod encap;
pub mod family;
pub mod fib;
pub mod frag;
mod host_flow;
pub mod icmp;
pub mod icmp6;
mod known;
pub mod nat;
mod new_flow;
pub mod parse;
pub mod route_cache;
pub mod snat;
pub mod tc;
pub mod xdp;

use aya_ebpf::bindings::bpf_fib_lookup;
use lb_common::{
    backend::BACKEND_FLAG_LOCAL,
    config::{
        CFG_FRONTEND_FILTER, CFG_LB_MODE, CFG_MAGLEV_M, CFG_SNAT_PORTS_EVER, CFG_SNAT_PORT_MAX,
        CFG_SNAT_PORT_MIN, CNT_CT_CREATED, CNT_CT_REOPENED, CNT_FRAGMENTS, CNT_NP_FORWARD,
        CNT_NP_REVERSE,
    },
    conntrack::*,
    drop::{Direction, DropReason},
    event::Event,
    filter::{filter_bit, fold6, word_and_mask},
    nodeport::*,
    service::{
        ServiceValue, ALG_MAGLEV, SCOPE_ALL, SCOPE_LOCAL, SVC_FLAG_AFFINITY,
        SVC_FLAG_FOREIGN_EXTERNAL_IP, SVC_FLAG_FORWARD_DSR, SVC_FLAG_FORWARD_SNAT,
        SVC_FLAG_HOST_LOOPBACK, SVC_FLAG_STATS, SVC_FLAG_TWO_SCOPES,
    },
};

use self::{
    access::*,
    ct::{now, Hit},
    early_exit::{cannot_concern_a_service, in_snat_ports},
    family::Ip,
    fib::Route,
    known::{known_flow, reverse_local, snat_reply},
    new_flow::{frontend, new_flow, Frontend},
    parse::{Flow, Parsed},
};
pub use self::{
    drops::{drop_packet, record_drop},
    known::finish_redirect,
};
use crate::{
    drop,
    maps::{LB4_FE_FILTER, LB_BACKENDS_GEN, LB_MAGLEV},
    runtime::{self, bump},
    select::{self, Lookup, V4, V6},
};

/// Per-CPU room for what does not fit the 512-byte BPF stack along a call
/// chain. Safe to share: a program runs to completion on its CPU and neither
/// tc nor XDP nests into another run of itself there.
#[repr(C)]
pub struct Scratch<I: Ip> {
    pub flow: Flow<I>,
    pub fib: bpf_fib_lookup,
    pub event: Event,
    /// Conntrack values being built for a new flow (forward and reverse).
    pub ct: CtValue<I::Addr>,
    pub rct: CtValue<I::Addr>,
    /// Conntrack keys: the packet's own (`known_flow`, `snat_reply`, and
    /// the forward one of a new flow in `new_local`, `new_remote`), which
    /// is also what the route cache is looked up by; and the reverse one
    /// of a new flow (`snat::alloc`'s port search). Here rather than on the stack: an IPv6 key is 40
    /// bytes, and the remote path's call chain (new_remote → snat::alloc →
    /// socket_holds) would not fit the 512-byte stack with them.
    pub fkey: CtKey<I::Addr>,
    pub rkey: CtKey<I::Addr>,
    /// What an ICMP error keeps of the packet it answers.
    pub macs: [u8; 12],
    pub quote: [u8; 28],
    /// The IPv6 header and 8 bytes, in 8-byte words.
    pub quote6: [u64; icmp6::QUOTE6_LEN / 8],
    /// The ICMP or ICMPv6 error `Action::SEND_ICMP` asks for, and for which service.
    pub icmp_error: u32,
    pub icmp_service: u32,
    /// The frontend whose traffic this packet counts as (`stats`), set by
    /// `known_flow` and `pick`, 0 for none; and whether it starts its flow.
    /// Counted once the verdict is known, so a packet XDP punts to tc is
    /// counted there only.
    pub stats_service: u32,
    pub stats_new_flow: u32,
}

#[inline(always)]
pub fn scratch<I: Ip>() -> Option<*mut Scratch<I>> {
    I::scratch()
}

/// What the program does with the packet, in one 64-bit word: a
/// subprogram then returns it in R0. A bigger value (an enum with payloads,
/// an Option of one) comes back through a stack slot, and LLVM may leave a
/// stack pointer in R0 at exit, which the verifier refuses ("cannot return
/// stack pointer to the caller").
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(transparent)]
pub struct Action(u64);

/// `Action` taken apart, for the verdict.
pub enum Verdict {
    /// Hand it to the stack (as is, or rewritten for a local backend).
    Pass,
    Drop,
    /// Send it out of this device, already rewritten (MACs included).
    Redirect(u32),
    /// Send it out of this device, the kernel resolving the next hop (tc
    /// only; the next hop is in the scratch FIB parameters of the family:
    /// `true` for IPv6).
    RedirectNeigh(u32, bool),
    /// XDP could not do it without the stack's help: let tc handle it (the
    /// packet is untouched).
    Punt,
}

impl Action {
    pub const PASS: Self = Self(0);
    pub const DROP: Self = Self(1);
    pub const PUNT: Self = Self(2);
    /// Not decided here: the caller goes on to its next step.
    pub const NEXT: Self = Self(3);
    /// From `pick` to `new_flow` only: answer with ICMP port unreachable
    /// (the service id is in the scratch conntrack value).
    const REJECT: Self = Self(6);
    /// Send the ICMP error left in the scratch map (`send_icmp`).
    const SEND_ICMP: Self = Self(7);
    const REDIRECT: u64 = 4 << 32;
    const REDIRECT_NEIGH: u64 = 5 << 32;
    const REDIRECT_NEIGH6: u64 = 6 << 32;

    #[inline(always)]
    pub const fn redirect(ifindex: u32) -> Self {
        Self(Self::REDIRECT | ifindex as u64)
    }

    #[inline(always)]
    pub const fn redirect_neigh<I: Ip>(ifindex: u32) -> Self {
        let kind = if I::IS_V6 {
            Self::REDIRECT_NEIGH6
        } else {
            Self::REDIRECT_NEIGH
        };
        Self(kind | ifindex as u64)
    }

    #[inline(always)]
    pub fn verdict(self) -> Verdict {
        match self.0 >> 32 {
            4 => Verdict::Redirect(self.0 as u32),
            5 => Verdict::RedirectNeigh(self.0 as u32, false),
            6 => Verdict::RedirectNeigh(self.0 as u32, true),
            _ => match self.0 {
                1 => Verdict::Drop,
                2 => Verdict::Punt,
                _ => Verdict::Pass,
            },
        }
    }
}

/// The hook-specific parts.
pub trait Hook: Pkt {
    fn ingress_ifindex(&self) -> u32;
    fn hook(&self) -> u8;
    /// The packet comes from a pod on this node (a pod-facing device), not
    /// from outside: every backend is reached like a local one (DNAT, the
    /// stack routes it, the pod's address kept).
    fn is_from_pod(&self) -> bool;
    /// The L3 length of what goes on the wire per packet: one segment of a
    /// GSO packet, the whole packet otherwise.
    fn wire_len<I: Ip>(&self, f: &Flow<I>) -> u16;
    /// The packets on the wire this one, with `payload` bytes after its
    /// headers, stands for: a GRO/GSO skb's segments, 1 otherwise.
    fn segments(&self, payload: u32) -> u32;
    /// Inserts `len` bytes after the 20-byte IPv4 base header.
    fn grow_ip_options(&self, len: u32) -> bool;
    /// Removes `len` bytes after the 20-byte IPv4 base header.
    fn shrink_ip_options(&self, len: u32) -> bool;
    /// Inserts `len` bytes for an outer IPv4 (or, `v6`, IPv6) header
    /// between the Ethernet header and the packet, marking the skb as
    /// encapsulated (its GSO then segments the inner packet).
    fn push_outer_header(&self, len: u32, v6: bool) -> bool;
    /// Removes the `len`-byte outer header after the Ethernet header.
    fn pop_outer_header(&self, len: u32, v6: bool) -> bool;
    /// Trims (or grows) the packet to `len` bytes.
    fn change_tail(&self, len: u32) -> bool;
    fn fib_lookup(&self, params: &mut bpf_fib_lookup) -> i64;
    /// Fixes the L4 checksum at `check_off` for several fields at once:
    /// `pseudo`, the summed change of pseudo-header fields (addresses);
    /// `plain`, that of the others (ports). Each is None when nothing of
    /// its kind changed.
    fn csum_l4_sums(
        &self,
        check_off: usize,
        pseudo: Option<u32>,
        plain: Option<u32>,
        udp: bool,
    ) -> bool;
    /// Keeps skb->csum of a CHECKSUM_COMPLETE skb in step with a change
    /// that no checksum in the packet balances: `diff` (new − old, one's
    /// complement) is added to it. Uses: after an IPv6 address rewrite, to
    /// undo what `csum_l4_sums` with `pseudo` did to skb->csum (the helper
    /// assumes IPv4, whose header checksum cancels the L4 one's change;
    /// Linux 6.16 added BPF_F_IPV6 for this, in diff mode only); after the
    /// hop limit's decrement (IPv6 has no header checksum); after a DSR
    /// option or header comes out (`dsr.rs`).
    /// Without it the stack logs "hw csum failure" and sums the packet
    /// again. XDP has no skb checksum state: nothing to do.
    fn csum_complete_fixup(&self, diff: u32);
    /// Whether a socket of this node holds the tuple of `key` (as a packet
    /// from its source to its destination would find it; a listener does
    /// not count: it takes new connections, not this tuple's packets).
    fn socket_holds<I: Ip>(&self, key: &CtKey<I::Addr>) -> bool;
    /// The packet was sent by a socket of this node whose own source is
    /// the packet's (a host process's connection), not forwarded or
    /// redirected here.
    fn sent_by_local_socket<I: Ip>(&self, f: &Flow<I>) -> bool;
    /// XDP cannot grow headers, resolve neighbours or build ICMP errors
    /// here: it punts those packets to tc, before changing anything.
    const IS_XDP: bool;
}

// Subprograms (#[inline(never)]) split the work into BPF-to-BPF calls: each
// has its own stack frame, so the drop path's event, the FIB parameters and
// the conntrack values are never on the stack at the same time (512 bytes in
// all along a call chain, kernel/bpf/verifier.c MAX_BPF_STACK).

/// tc ingress and XDP: a packet arriving on an external device.
///
/// A thin dispatcher over subprograms called one after the other, so their
/// stack frames are never live at the same time.
#[inline(always)]
pub fn ingress<C: Hook>(ctx: &C) -> Action {
    // Most packets reaching a node are not for a service: let them go
    // before the parse and any hash lookup.
    if cannot_concern_a_service(ctx) {
        return Action::PASS;
    }
    // After the early exit, which reads what is linear and sends anything
    // else on (a failed read says "maybe a service").
    ctx.pull(IPV4_HEADERS);
    match load::<u16, C>(ctx, 12) {
        Some(p) if p == ETH_P_IP.to_be() => {
            // A DSR request in an outer header (`encap`): the inner packet
            // takes the path; anything else encapsulated is the stack's.
            if !encap::take_off::<C, V4>(ctx) {
                return Action::PASS;
            }
            ingress_of::<C, V4>(ctx)
        }
        Some(p) if p == ETH_P_IPV6.to_be() => {
            ctx.pull(IPV6_HEADERS);
            if !encap::take_off::<C, V6>(ctx) {
                return Action::PASS;
            }
            ingress_of::<C, V6>(ctx)
        }
        _ => Action::PASS,
    }
}

/// Headers we read directly: Ethernet, an IPv4 header with the DSR option,
/// TCP. Packets from local sockets or GRO can keep part of them in page
/// fragments; tc pulls them into the linear area first (XDP's are linear).
pub const IPV4_HEADERS: usize = ETH_HLEN + 28 + 20;

/// Ethernet, the IPv6 header and a TCP header: what an IPv6 packet needs
/// directly readable (the programs pull less for IPv4, whose small packets
/// would otherwise all pay a pull).
const IPV6_HEADERS: usize = ETH_HLEN + IPV6_HLEN + 20;

#[inline(always)]
fn ingress_of<C: Hook, I: Ip>(ctx: &C) -> Action {
    let Some(s) = scratch::<I>() else {
        return Action::PASS;
    };
    let parsed = parse_into(ctx, s);
    // Raw field projection: the flow is read while the FIB, event and
    // conntrack parts of the same scratch value are written, never through
    // one &mut Scratch.
    // SAFETY: per-CPU scratch, used by this program run only.
    let f: &Flow<I> = unsafe { &(*s).flow };
    match parsed {
        Parsed::Other => return Action::PASS,
        Parsed::Flow => {}
        Parsed::LaterFragment => {
            if !follow_fragment(s) {
                return Action::PASS;
            }
        }
        Parsed::IcmpError => {
            if C::IS_XDP {
                return Action::PUNT;
            }
            return icmp::ingress_error(ctx, f);
        }
        Parsed::Invalid(ports) => return reject_unless_passable(ctx, f, ports),
    }
    // SAFETY: per-CPU scratch; fields of their own (a previous run's value
    // must not be counted again).
    unsafe { (*s).stats_service = 0 };

    // On a backend's node: a DSR request carries the frontend.
    if f.dsr_port != 0 {
        if C::IS_XDP {
            return Action::PUNT;
        }
        return dsr::learn(ctx, f);
    }
    // A packet to a port of the SNAT range is, on the busy path, a
    // backend's reply to a SNATed flow: its reverse entry is looked up
    // first, which spares that packet the forward lookup's miss. (Only a
    // tuple with both a forward and a reverse entry would find another
    // answer than in the usual order; the SNAT range is kept clear of the
    // node's own ports and of NodePorts.)
    let reply_first = in_snat_ports(f.dport);
    let mut a = Action::NEXT;
    if reply_first {
        a = snat_reply(ctx, f);
    }
    if a == Action::NEXT {
        a = known_flow(ctx, f);
    }
    if a == Action::NEXT && !reply_first {
        a = snat_reply(ctx, f);
    }
    if a == Action::NEXT {
        a = new_flow(ctx, f);
    }
    // Counted when forwarded (as Katran counts a VIP's packets): not when
    // punted to tc, which counts it, nor dropped or answered with an ICMP
    // error (`lbctl drops` counts those).
    if a != Action::PUNT && a != Action::DROP && a != Action::SEND_ICMP {
        count_frontend(ctx, s);
    }
    if a == Action::SEND_ICMP {
        return send_icmp(ctx, s);
    }
    a
}

/// Counts the packet for the frontend `known_flow` or `pick` found (none
/// when the frontend does not count, `SVC_FLAG_STATS`). Its bytes as on
/// the wire: a GRO/GSO packet's segments each carry the headers again.
#[inline(always)]
fn count_frontend<C: Hook, I: Ip>(ctx: &C, s: *mut Scratch<I>) {
    // SAFETY: per-CPU scratch, used by this program run only.
    let (service_id, new_flow, f) =
        unsafe { ((*s).stats_service, (*s).stats_new_flow, &(*s).flow) };
    if service_id == 0 {
        return;
    }
    let headers = ((f.ip_len & I::IP_LEN_MASK) + f.l4_len) as u32;
    let segments = ctx.segments(u32::from(f.tot_len).saturating_sub(headers));
    let bytes = u32::from(f.tot_len) + (segments - 1) * headers;
    crate::stats::count_packet(service_id, segments, bytes, new_flow != 0);
}

/// The ICMP or ICMPv6 error a deeper step left in the scratch map, sent
/// from here: one call deep, its frame (it builds a whole packet) never
/// sits under the remote path's frames, which the 512-byte stack could not
/// hold with the IPv6 ones.
#[inline(never)]
fn send_icmp<C: Hook, I: Ip>(ctx: &C, s: *mut Scratch<I>) -> Action {
    // SAFETY: per-CPU scratch, used by this program run only.
    let (f, error, service_id) = unsafe { (&(*s).flow, (*s).icmp_error, (*s).icmp_service) };
    let error = icmp::Error::from_raw(error);
    if let Some(f) = I::as_v4(f) {
        return icmp::reply(ctx, f, error, service_id);
    }
    match I::as_v6(f) {
        Some(f) => icmp6::reply(ctx, f, error, service_id),
        None => Action::DROP,
    }
}

/// "Fragmentation needed" (IPv4) / "packet too big" (IPv6) with the
/// path's MTU. An IPv4 packet without DF is not answered: this node cannot
/// fragment a packet it redirects, so it is dropped, counted.
#[inline(always)]
fn icmp_too_big<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, mtu: u16, service_id: u32) -> Action {
    if C::IS_XDP {
        return Action::PUNT;
    }
    if I::as_v4(f).is_some_and(|f| !f.df) {
        return drop_packet(ctx, f, DropReason::FragNeeded, service_id);
    }
    pending_icmp::<C, I>(icmp::Error::frag_needed(mtu), service_id)
}

/// An ICMP or ICMPv6 error in answer to the packet: left in the scratch
/// map for `send_icmp` (SEND_ICMP), both families alike; XDP leaves it to tc.
#[inline(always)]
fn pending_icmp<C: Hook, I: Ip>(error: icmp::Error, service_id: u32) -> Action {
    if C::IS_XDP {
        return Action::PUNT; // tc sends it
    }
    let Some(sp) = scratch::<I>() else {
        return Action::DROP;
    };
    // SAFETY: per-CPU scratch; fields of their own.
    unsafe {
        (*sp).icmp_error = error.raw();
        (*sp).icmp_service = service_id;
    }
    Action::SEND_ICMP
}

#[inline(never)]
fn parse_into<C: Hook, I: Ip>(ctx: &C, s: *mut Scratch<I>) -> Parsed {
    // SAFETY: per-CPU scratch, used by this program run only.
    I::parse(ctx, unsafe { &mut (*s).flow })
}

#[inline(never)]
fn follow_fragment<I: Ip>(s: *mut Scratch<I>) -> bool {
    // SAFETY: per-CPU scratch, used by this program run only.
    let ok = frag::follow::<I>(unsafe { &mut (*s).flow });
    if ok {
        bump(CNT_FRAGMENTS);
    }
    ok
}

/// A broken packet: dropped when addressed to a frontend (counted, with its
/// reason), left to the stack otherwise.
#[inline(never)]
fn reject_unless_passable<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, ports: bool) -> Action {
    if ports && !matches!(frontend(f, ctx.is_from_pod()), Frontend::None) {
        drop_packet(ctx, f, DropReason::InvalidPacket, 0)
    } else {
        Action::PASS
    }
}

/// tc egress: replies leaving the node whose source must become the
/// frontend again (a local backend's reply, or a DSR reply on the backend's
/// node), and ICMP errors about such flows.
#[inline(always)]
pub fn egress<C: Hook>(ctx: &C) -> Action {
    match load::<u16, C>(ctx, 12) {
        Some(p) if p == ETH_P_IP.to_be() => egress_of::<C, V4>(ctx),
        Some(p) if p == ETH_P_IPV6.to_be() => {
            ctx.pull(IPV6_HEADERS);
            egress_of::<C, V6>(ctx)
        }
        _ => Action::PASS,
    }
}

#[inline(always)]
fn egress_of<C: Hook, I: Ip>(ctx: &C) -> Action {
    let Some(s) = scratch::<I>() else {
        return Action::PASS;
    };
    let parsed = parse_into(ctx, s);
    // SAFETY: per-CPU scratch, used by this program run only.
    let f: &Flow<I> = unsafe { &(*s).flow };
    match parsed {
        Parsed::Flow => {}
        Parsed::LaterFragment => {
            if !follow_fragment(s) {
                return Action::PASS;
            }
        }
        Parsed::IcmpError => return icmp::egress_error(ctx, f),
        Parsed::Other | Parsed::Invalid(_) => return Action::PASS,
    }
    // A host connection from a port of the SNAT range: its tuple may be
    // one a SNAT flow holds (the ranges overlap: snat.rs).
    if in_snat_ports(f.sport) && ctx.sent_by_local_socket(f) {
        let a = host_flow::egress(ctx, f);
        if a != Action::NEXT {
            return a;
        }
    }
    reverse_local(ctx, f)
}
