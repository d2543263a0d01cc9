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
//! * `fib`: routes, path MTU, TTL;
//! * `route_cache`: a per-CPU cache of `fib`'s answers for a flow;
//! * `nat`: address and port rewrites with their checksums;
//! * `dsr`: the DSR option (add, learn, strip);
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
pub mod dsr;
pub mod family;
pub mod fib;
pub mod frag;
pub mod icmp;
pub mod icmp6;
pub mod nat;
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
        SVC_FLAG_FOREIGN_EXTERNAL_IP, SVC_FLAG_SOURCE_RANGES, SVC_FLAG_TWO_SCOPES,
    },
};

use self::{
    access::*,
    ct::{now, Hit},
    family::Ip,
    fib::Route,
    parse::{Flow, Parsed},
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
    /// Inserts `len` bytes after the 20-byte IPv4 base header.
    fn grow_ip_options(&self, len: u32) -> bool;
    /// Removes `len` bytes after the 20-byte IPv4 base header.
    fn shrink_ip_options(&self, len: u32) -> bool;
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
    /// XDP cannot grow headers, resolve neighbours or build ICMP errors
    /// here: it punts those packets to tc, before changing anything.
    const IS_XDP: bool;
}

#[inline(always)]
fn fill_event<C: Hook, I: Ip>(e: &mut Event, ctx: &C, f: &Flow<I>) {
    *e = Event::zeroed();
    e.hook = ctx.hook();
    e.proto = f.proto;
    e.family = I::VERSION;
    e.saddr = I::event_addr(f.saddr);
    e.daddr = I::event_addr(f.daddr);
    e.sport = f.sport;
    e.dport = f.dport;
}

/// Counts a drop (with an event) without deciding the verdict: the packet
/// may still become an ICMP error.
#[inline(never)]
pub fn record_drop<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, reason: DropReason, service_id: u32) {
    match scratch::<I>() {
        Some(s) => {
            // SAFETY: per-CPU scratch; the event field is not the flow.
            let e = unsafe { &mut (*s).event };
            fill_event(e, ctx, f);
            e.service_id = service_id;
            drop::from_packet(reason, Direction::Ingress, e);
        }
        None => drop::count(reason, Direction::Ingress),
    }
}

#[inline(always)]
pub fn drop_packet<C: Hook, I: Ip>(
    ctx: &C,
    f: &Flow<I>,
    reason: DropReason,
    service_id: u32,
) -> Action {
    record_drop(ctx, f, reason, service_id);
    Action::DROP
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
        Some(p) if p == ETH_P_IP.to_be() => ingress_of::<C, V4>(ctx),
        Some(p) if p == ETH_P_IPV6.to_be() => {
            ctx.pull(IPV6_HEADERS);
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
    if a == Action::SEND_ICMP {
        return send_icmp(ctx, s);
    }
    a
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

/// The early exit, read straight from the packet: an IPv4 TCP or UDP
/// packet with a plain 20-byte header, not a fragment (or an IPv6 one whose
/// next header is TCP or UDP: no extension header), that is neither for a
/// frontend, nor for a known flow to one, nor a reply to our SNAT: the bits
/// of its (address, port) and of its address alone (a ClusterIP's marker:
/// its other ports are dropped) are clear in LB4_FE_FILTER, and its port is
/// outside the SNAT range (every SNATed flow's port is taken from it).
/// Everything else takes the full path, which decides as it always did: IP
/// options (a DSR option), fragments, ICMP, broken headers; and everything
/// while the agent has not said the filter is complete. Not on a pod-facing
/// device: a pod's reply to a hairpinned flow goes to the frontend's
/// address on the client's port, which no bit covers.
#[inline(always)]
fn cannot_concern_a_service<C: Hook>(ctx: &C) -> bool {
    if ctx.is_from_pod() || runtime::config(CFG_FRONTEND_FILTER) == 0 {
        return false;
    }
    let ip = ETH_HLEN;
    let Some(eth) = load::<u16, C>(ctx, 12) else {
        return false;
    };
    // The destination (an IPv6 one folded as the agent folds it) and port.
    let (daddr, dport) = if eth == ETH_P_IP.to_be() {
        if load::<u8, C>(ctx, ip) != Some(0x45) {
            return false;
        }
        let proto = load::<u8, C>(ctx, ip + IP_PROTO);
        if proto != Some(IPPROTO_TCP) && proto != Some(IPPROTO_UDP) {
            return false;
        }
        if load::<u16, C>(ctx, ip + IP_FRAG_OFF).is_none_or(|f| f & IP_MF_OR_OFFSET != 0) {
            return false;
        }
        match (
            load::<u32, C>(ctx, ip + IP_DADDR),
            load::<u16, C>(ctx, ip + 20 + L4_DPORT),
        ) {
            (Some(a), Some(p)) => (a, p),
            _ => return false,
        }
    } else if eth == ETH_P_IPV6.to_be() {
        let next = load::<u8, C>(ctx, ip + IP6_NEXT_HEADER);
        if next != Some(IPPROTO_TCP) && next != Some(IPPROTO_UDP) {
            return false;
        }
        match (
            load::<[u32; 4], C>(ctx, ip + 24),
            load::<u16, C>(ctx, ip + IPV6_HLEN + L4_DPORT),
        ) {
            (Some(a), Some(p)) => (fold6(a), p),
            _ => return false,
        }
    } else {
        return false;
    };
    // A frontend's own (address, port) first: a packet to a service, the
    // busiest kind here, then stops before the SNAT range's settings.
    if filter_has(daddr, dport) {
        return false;
    }
    if in_snat_ports(dport) {
        return false;
    }
    !filter_has(daddr, 0)
}

/// Whether `port` (network byte order) is in a SNAT range used since
/// install (the agent records the current one there too): flows SNATed
/// before a restart live on. Without a record (programs driven by hand),
/// the current range.
#[inline(always)]
fn in_snat_ports(port: u16) -> bool {
    let ever = runtime::config(CFG_SNAT_PORTS_EVER);
    let (low, high) = if ever != 0 {
        (ever >> 16, ever & 0xffff)
    } else {
        (
            runtime::config(CFG_SNAT_PORT_MIN),
            runtime::config(CFG_SNAT_PORT_MAX),
        )
    };
    let port = u32::from(u16::from_be(port));
    port >= low && port <= high
}

#[inline(always)]
fn filter_has(address: u32, port: u16) -> bool {
    let (word, mask) = word_and_mask(filter_bit(address, port));
    // A missing word (cannot happen: the array has every index) passes.
    LB4_FE_FILTER.get(word).is_none_or(|w| w & mask != 0)
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

/// A known flow to a frontend stays on its backend (NEXT: not a known flow).
#[inline(never)]
fn known_flow<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
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
fn backends_gen() -> u16 {
    LB_BACKENDS_GEN.get(0).map_or(0, |g| *g as u16)
}

/// A reply to a SNATed flow, addressed to our SNAT port (NEXT: not one).
#[inline(never)]
fn snat_reply<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
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
    reverse_snat(ctx, f, ct)
}

enum Frontend<K> {
    None,
    /// A known service address on a port it does not expose.
    UnknownPort,
    /// The service, its key, and whether that is the node-local view.
    Found(ServiceValue, K, bool),
}

/// The frontend a packet is addressed to; for traffic from outside, the
/// node-local view when the service has one (externalTrafficPolicy: Local).
#[inline(always)]
fn frontend<I: Ip>(f: &Flow<I>, is_from_pod: bool) -> Frontend<I::Key> {
    let key = I::service_key(f.daddr, f.dport, f.proto, SCOPE_ALL);
    match select::lookup_service::<I>(&key) {
        Lookup::NotService => Frontend::None,
        Lookup::UnknownPort => Frontend::UnknownPort,
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
fn new_flow<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
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

/// A new flow to a frontend with nothing to choose, as kube-proxy treats
/// it: no endpoint at all is refused with an ICMP port unreachable (its
/// REJECT rules); externalTrafficPolicy: Local with endpoints only on other
/// nodes is dropped (its "has no local endpoints" DROP), both counted.
#[inline(always)]
fn no_backend<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, svc: &ServiceValue, local: bool) -> Action {
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
fn pick<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
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
    if svc.flags & SVC_FLAG_SOURCE_RANGES != 0 && !I::source_allowed(svc.service_id, f.saddr) {
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

/// Backend on this node (or any backend, for a pod's packet): DNAT here,
/// the stack delivers or routes it, tc egress (of the device the reply
/// leaves by, or of the pod's device) undoes the DNAT on the reply.
#[inline(never)]
fn new_local<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
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
    bump(CNT_CT_CREATED);
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
fn new_remote<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
    let mode = runtime::config(CFG_LB_MODE);
    let dsr = mode == MODE_DSR || (mode == MODE_HYBRID && f.proto == IPPROTO_TCP);
    let needs_option = dsr && dsr::needs_option(f);
    if needs_option && C::IS_XDP {
        return Action::PUNT; // before anything changed: tc will redo it
    }
    let Some(sp) = scratch::<I>() else {
        return Action::DROP;
    };
    // SAFETY: per-CPU scratch; distinct fields.
    let (ct, rct) = unsafe { (&mut (*sp).ct, &mut (*sp).rct) };
    let (service_id, baddr, bport) = (ct.service_id, ct.addr, ct.port);
    let extra = if needs_option { I::DSR_LEN } else { 0 };
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
    if dsr {
        ct.flags |= CT_F_DSR;
    } else {
        // The device's address of the family (an IPv6 one may be missing).
        let Some(node) = I::device_address(egress) else {
            return drop_packet(ctx, f, DropReason::FibLookupFailed, service_id);
        };
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
    bump(CNT_CT_CREATED);
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
fn maglev<I: Ip>(f: &Flow<I>, svc: &ServiceValue) -> Result<(u32, I::Backend), DropReason> {
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

/// A packet of a known flow to a backend on this node (or from a pod):
/// DNAT, and the stack delivers it. Inlined into `known_flow`: a call and
/// its return less on the busiest path (a return costs more than a few
/// instructions on CPUs whose kernels mitigate SRSO or retbleed).
#[inline(always)]
fn forward_local<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, ct: &CtValue<I::Addr>) -> Action {
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
fn forward_known<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, ct: &CtValue<I::Addr>) -> Action {
    // The conntrack entry names the backend (`known_flow` checked it is
    // still the one its id names).
    let baddr = &ct.addr;
    let needs_option = ct.flags & CT_F_DSR != 0 && f.has_l4() && dsr::needs_option(f);
    if needs_option && C::IS_XDP {
        return Action::PUNT;
    }
    let extra = if needs_option { I::DSR_LEN } else { 0 };
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
fn rewrite_remote<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, ct: &CtValue<I::Addr>) -> Action {
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
    if needs_option && !dsr::insert(ctx, f) {
        return drop_packet(ctx, f, DropReason::InvalidPacket, ct.service_id);
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
            let (dmac, smac) = unsafe { ((*s).fib.dmac, (*s).fib.smac) };
            if !store(ctx, 0, dmac) || !store(ctx, 6, smac) {
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
fn reverse_snat<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, ct: &CtValue<I::Addr>) -> Action {
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
    reverse_local(ctx, f)
}

#[inline(never)]
fn reverse_local<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
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
