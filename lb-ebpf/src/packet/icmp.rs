//! ICMP errors on the packet path.
//!
//! * `reply`: this node answers a packet it cannot forward ("fragmentation
//!   needed" when it does not fit the path, "time exceeded" when its TTL ran
//!   out), as a router would (RFC 1812 §4.3.2), from the address the packet
//!   was sent to, quoting its IP header and first 8 bytes (RFC 792).
//! * `ingress_error` / `egress_error`: an ICMP or ICMPv6 error about a
//!   translated flow is translated in turn, outer and quoted headers alike
//!   (RFC 5508 §4.2), so it reaches the endpoint whose socket can use it: a
//!   router's "fragmentation needed" / "packet too big" for a SNATed flow
//!   reaches the client quoting the client's own packet to the frontend,
//!   and path MTU discovery works. Written once for both families; they
//!   differ in the checksums only (`quoted_addr`, `outer_addr`).
//!
//! tc only: XDP hands these packets to tc untouched.
use lb_common::{
    config::{CNT_ICMP_SENT, CNT_ICMP_TRANSLATED},
    conntrack::{CT_F_DSR, CT_F_HOST, CT_F_LOCAL, CT_F_SNAT, CT_REVERSE, CT_SERVICE},
    drop::DropReason,
};

use super::{
    access::*,
    csum::{diff16, diff32, fold, sum_words, update_field},
    ct,
    family::Ip,
    fib, finish_redirect,
    parse::Flow,
    record_drop, scratch, Action, Hook,
};
use crate::{maps::LB_EVENT_RATE, runtime::bump, select::V4};

/// Length of what we send: Ethernet, a 24-byte IPv4 header (see
/// `reply`), the ICMP header, the quoted IPv4 header and 8 bytes.
const REPLY_IP_LEN: usize = 24;
const QUOTE_LEN: usize = 28;
const REPLY_LEN: usize = ETH_HLEN + REPLY_IP_LEN + ICMP_HLEN + QUOTE_LEN;
/// Errors per second per CPU, as the kernel's default icmp_msgs_per_sec.
const ICMP_RATE: u64 = 1000;
const NS: u64 = 1_000_000_000;

/// Per-CPU token bucket (slot 1 of LB_EVENT_RATE): a flood of oversized
/// packets must not become a flood of errors toward a spoofed source.
#[inline(always)]
pub(super) fn admit() -> bool {
    let Some(state) = LB_EVENT_RATE.get_ptr_mut(1) else {
        return false;
    };
    // SAFETY: per-CPU slot, only this CPU's runs touch it.
    let state = unsafe { &mut *state };
    let t = ct::now();
    let cap = ICMP_RATE * NS;
    let elapsed = t.saturating_sub(state.last_ns);
    let refill = if elapsed >= NS {
        cap
    } else {
        elapsed * ICMP_RATE
    };
    let budget = if state.budget + refill > cap {
        cap
    } else {
        state.budget + refill
    };
    state.last_ns = t;
    if budget < NS {
        state.budget = budget;
        return false;
    }
    state.budget = budget - NS;
    true
}

/// The error this node sends, in one register (a BPF-to-BPF call passes at
/// most five, all in registers): the kind above 16 bits, the MTU below.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Error(u32);

impl Error {
    /// Destination unreachable, fragmentation needed, with the next-hop MTU.
    pub const fn frag_needed(mtu: u16) -> Self {
        Self(1 << 16 | mtu as u32)
    }
    /// Time exceeded in transit.
    pub const TTL_EXCEEDED: Self = Self(2 << 16);
    /// Destination unreachable, port unreachable: a frontend without any
    /// endpoint (kube-proxy's `REJECT --reject-with icmp-port-unreachable`).
    pub const PORT_UNREACHABLE: Self = Self(3 << 16);

    /// The error as one word (kept in the scratch map), and back.
    #[inline(always)]
    pub fn raw(self) -> u32 {
        self.0
    }
    #[inline(always)]
    pub fn from_raw(raw: u32) -> Self {
        Self(raw)
    }

    /// The MTU of a "fragmentation needed" / "packet too big".
    #[inline(always)]
    pub fn mtu(self) -> u16 {
        self.0 as u16
    }

    /// The drop reason the packet answered with this error counts under.
    #[inline(always)]
    pub fn reason(self) -> DropReason {
        if self == Self::TTL_EXCEEDED {
            DropReason::TtlExceeded
        } else if self == Self::PORT_UNREACHABLE {
            DropReason::NoBackend
        } else {
            DropReason::FragNeeded
        }
    }
}

/// Answers `f` with an ICMP error sent back out of the device it came in
/// on, and counts the drop of `f`. The packet becomes the error.
///
/// The error's IPv4 header carries a 4-byte option of NOPs, and one word of
/// the quote is chosen, so that the message stays right if the skb still
/// asks for a checksum offload (CHECKSUM_PARTIAL: GRO'd packets, packets
/// from a local socket over veth): the offload sums from the original L4
/// header (now 4 bytes before the ICMP header) and writes at the original
/// checksum's offset (16 for TCP: the quote's IP id; 6 for UDP: the ICMP
/// checksum itself). We make the value there equal to what that sum
/// produces, so the offload rewrites a word with itself. A BPF program can
/// neither read nor reset skb->ip_summed, so the message must be right both
/// ways.
#[inline(never)]
pub fn reply<C: Hook>(ctx: &C, f: &Flow<V4>, error: Error, service_id: u32) -> Action {
    if C::IS_XDP {
        return Action::PUNT; // tc does it (and counts it)
    }
    let mtu = error.0 as u16;
    let (ty, code) = if error == Error::TTL_EXCEEDED {
        (ICMP_TIME_EXCEEDED, 0)
    } else if error == Error::PORT_UNREACHABLE {
        (ICMP_DEST_UNREACH, ICMP_PORT_UNREACH)
    } else {
        (ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED)
    };
    record_drop(ctx, f, error.reason(), service_id);
    if !f.has_l4() || f.ip_len != 20 || !admit() {
        return Action::DROP;
    }
    let Some(s) = scratch::<V4>() else {
        return Action::DROP;
    };
    // SAFETY: per-CPU scratch, used by this program run only.
    let (macs, quote) = unsafe { (&mut (*s).macs, &mut (*s).quote) };
    let (Some(m), Some(q)) = (
        load::<[u8; 12], C>(ctx, 0),
        load::<[u8; QUOTE_LEN], C>(ctx, ETH_HLEN),
    ) else {
        return Action::DROP;
    };
    *macs = m;
    *quote = q;
    if !ctx.change_tail(REPLY_LEN as u32) {
        return Action::DROP;
    }
    let ip = ETH_HLEN;
    let icmp = ip + REPLY_IP_LEN;
    let qoff = icmp + ICMP_HLEN;
    let mut dst = [0u8; 6];
    let mut src = [0u8; 6];
    dst.copy_from_slice(&macs[6..12]);
    src.copy_from_slice(&macs[0..6]);
    let hdr: [u8; 12] = [
        0x40 | (REPLY_IP_LEN / 4) as u8,
        0xc0, // precedence: internetwork control, as the kernel's icmp_send
        0,
        (REPLY_IP_LEN + ICMP_HLEN + QUOTE_LEN) as u8,
        0,
        0, // id
        0,
        0, // no DF: the error itself may be fragmented
        64,
        IPPROTO_ICMP,
        0,
        0, // checksum, below
    ];
    let [m0, m1] = mtu.to_be_bytes();
    let icmp_hdr: [u8; 8] = [ty, code, 0, 0, 0, 0, m0, m1];
    let nops: [u8; 4] = [1, 1, 1, 1];
    let ok = store(ctx, 0, dst)
        && store(ctx, 6, src)
        && store(ctx, 12, ETH_P_IP.to_be())
        && store(ctx, ip, hdr)
        && store(ctx, ip + IP_SADDR, f.daddr)
        && store(ctx, ip + IP_DADDR, f.saddr)
        && store(ctx, ip + 20, nops)
        && store(ctx, icmp, icmp_hdr)
        && store(ctx, qoff, *quote);
    if !ok {
        return Action::DROP;
    }
    // The NOPs sum to 0x0202 (either byte order); the offload would write
    // !(0x0202 + sum of a correct ICMP message) = !0x0202 = 0xfdfd.
    const OFFLOAD_WORD: u16 = 0xfdfd;
    let icmp_words = (ICMP_HLEN + QUOTE_LEN) / 2;
    let check = if f.proto == IPPROTO_TCP {
        // The offload's word is the quote's IP id: make it that value and
        // keep the quoted header's checksum right (the pair adds nothing to
        // the ICMP sum); then the ICMP checksum as usual.
        let Some(qcheck) = load::<u16, C>(ctx, qoff + IP_CHECK) else {
            return Action::DROP;
        };
        let Some(id) = load::<u16, C>(ctx, qoff + IP_ID) else {
            return Action::DROP;
        };
        let qcheck = super::csum::csum_apply(qcheck, diff16(id, OFFLOAD_WORD));
        if !store(ctx, qoff + IP_ID, OFFLOAD_WORD) || !store(ctx, qoff + IP_CHECK, qcheck) {
            return Action::DROP;
        }
        match sum_words(ctx, icmp, icmp_words, 1) {
            Some(sum) => !fold(sum),
            None => return Action::DROP,
        }
    } else {
        // The offload's word is the ICMP checksum itself: choose the quoted
        // UDP checksum (no receiver checks it) so that the ICMP checksum
        // comes out as that value.
        let udp_check = qoff + 20 + UDP_CHECK;
        if !store(ctx, udp_check, 0u16) {
            return Action::DROP;
        }
        let Some(sum) = sum_words(ctx, icmp, icmp_words, 1) else {
            return Action::DROP;
        };
        let w = fold(0x0202 + u32::from(!fold(sum)));
        if !store(ctx, udp_check, w) {
            return Action::DROP;
        }
        OFFLOAD_WORD
    };
    if !store(ctx, icmp + ICMP_CHECK, check) {
        return Action::DROP;
    }
    match sum_words(ctx, ip, REPLY_IP_LEN / 2, 5) {
        Some(sum) => {
            if !store(ctx, ip + IP_CHECK, !fold(sum)) {
                return Action::DROP;
            }
        }
        None => return Action::DROP,
    }
    bump(CNT_ICMP_SENT);
    Action::redirect(ctx.ingress_ifindex())
}

/// Writes a 16-bit word inside the ICMP message and keeps the ICMP checksum
/// (at `check`) right.
#[inline(always)]
fn set16<C: Hook>(ctx: &C, check: usize, off: usize, new: u16) -> bool {
    let Some(old) = load::<u16, C>(ctx, off) else {
        return false;
    };
    old == new || (store(ctx, off, new) && update_field(ctx, check, diff16(old, new)))
}

/// Offset of the quoted L4 checksum, when the quote is long enough to hold it.
#[inline(always)]
fn quoted_l4_check<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Option<usize> {
    let off = f.quoted_l4()
        + if f.quoted.proto == IPPROTO_TCP {
            TCP_CHECK
        } else {
            UDP_CHECK
        };
    let c = load::<u16, C>(ctx, off)?;
    // A UDP checksum of 0 means none (RFC 768): it stays 0.
    (f.quoted.proto == IPPROTO_TCP || c != 0).then_some(off)
}

/// The one's complement difference new − old of an address, over its words.
#[inline(always)]
fn addr_diff<I: Ip>(old: &I::Addr, new: &I::Addr) -> u32 {
    let mut d = 0u32;
    let mut i = 0;
    while i < I::WORDS {
        d += diff32(I::word(*old, i), I::word(*new, i));
        i += 1;
    }
    u32::from(fold(d))
}

/// Changes an address in the quoted IP header: the field, the quoted IPv4
/// header checksum (IPv6 has none), the quoted L4 checksum (its
/// pseudo-header) when present, and the ICMP checksum for each.
#[inline(always)]
fn quoted_addr<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, field: usize, new: &I::Addr) -> bool {
    let check = f.l4() + ICMP_CHECK;
    let qip = f.quoted_ip();
    let Some(old) = load::<I::Addr, C>(ctx, qip + field) else {
        return false;
    };
    if old == *new {
        return true;
    }
    let d = addr_diff::<I>(&old, new);
    if !store(ctx, qip + field, *new) || !update_field(ctx, check, d) {
        return false;
    }
    if !I::IS_V6 {
        let Some(qcheck) = load::<u16, C>(ctx, qip + IP_CHECK) else {
            return false;
        };
        if !set16(
            ctx,
            check,
            qip + IP_CHECK,
            super::csum::csum_apply(qcheck, d),
        ) {
            return false;
        }
    }
    if let Some(l4c) = quoted_l4_check(ctx, f) {
        if let Some(c) = load::<u16, C>(ctx, l4c) {
            return set16(ctx, check, l4c, super::csum::csum_apply(c, d));
        }
    }
    true
}

/// Changes a port in the quoted L4 header (and its checksum, when present).
#[inline(always)]
fn quoted_port<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, field: usize, new: u16) -> bool {
    let check = f.l4() + ICMP_CHECK;
    let off = f.quoted_l4() + field;
    let Some(old) = load::<u16, C>(ctx, off) else {
        return false;
    };
    if old == new {
        return true;
    }
    let mut ok = set16(ctx, check, off, new);
    if let Some(l4c) = quoted_l4_check(ctx, f) {
        if let Some(c) = load::<u16, C>(ctx, l4c) {
            ok = ok
                && set16(
                    ctx,
                    check,
                    l4c,
                    super::csum::csum_apply(c, diff16(old, new)),
                );
        }
    }
    ok
}

/// An outer address: the field and, for IPv4, the IP header checksum
/// (ICMP has no pseudo-header); for IPv6 the ICMPv6 checksum, whose
/// pseudo-header holds both addresses (RFC 4443 §2.3). Plain stores: the
/// field's change and the checksum's cancel in the packet's sum, so a
/// CHECKSUM_COMPLETE skb->csum stays right.
#[inline(always)]
fn outer_addr<C: Hook, I: Ip>(
    ctx: &C,
    f: &Flow<I>,
    field: usize,
    old: &I::Addr,
    new: &I::Addr,
) -> bool {
    if old == new {
        return true;
    }
    if !store(ctx, ETH_HLEN + field, *new) {
        return false;
    }
    if I::IS_V6 {
        update_field(ctx, f.l4() + ICMP_CHECK, addr_diff::<I>(old, new))
    } else {
        update_field(ctx, ETH_HLEN + IP_CHECK, addr_diff::<I>(old, new))
    }
}

/// tc ingress: an ICMP or ICMPv6 error about one of our flows.
#[inline(never)]
pub fn ingress_error<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
    let a = to_client(ctx, f);
    if a != Action::NEXT {
        return a;
    }
    let a = to_backend(ctx, f);
    if a != Action::NEXT {
        return a;
    }
    Action::PASS
}

/// An error about a SNATed flow's packet to a remote backend, sent to our
/// SNAT address (by the backend's node or a router on the way): to the
/// client, quoting the packet the client sent to the frontend.
#[inline(always)]
fn to_client<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
    let q = &f.quoted;
    let Some(ct) = ct::peek::<I>(&f.quoted_reply_key(CT_REVERSE), q.proto) else {
        return Action::NEXT;
    };
    if ct.flags & CT_F_SNAT == 0 || f.daddr != q.saddr {
        return Action::NEXT;
    }
    // ct: addr/port = the frontend, nat_addr/nat_port = the client.
    let (frontend, client) = (&ct.addr, &ct.nat_addr);
    let outer_src = if f.saddr == q.daddr {
        frontend
    } else {
        &f.saddr
    };
    let ok = quoted_addr(ctx, f, I::SADDR, client)
        && quoted_port(ctx, f, L4_SPORT, ct.nat_port)
        && quoted_addr(ctx, f, I::DADDR, frontend)
        && quoted_port(ctx, f, L4_DPORT, ct.port)
        && outer_addr(ctx, f, I::DADDR, &f.daddr, client)
        && outer_addr(ctx, f, I::SADDR, &f.saddr, outer_src);
    if !ok {
        return Action::DROP;
    }
    bump(CNT_ICMP_TRANSLATED);
    if ct.flags & CT_F_HOST != 0 {
        // About a host connection moved to another port (`host_flow`):
        // now quoting the socket's own tuple, for this node's stack.
        return Action::PASS;
    }
    forward_error(ctx, f, outer_src, client)
}

/// An error from the client's side about a reply (say, "fragmentation
/// needed" from a router toward the client), sent to the frontend: to the
/// backend, quoting the reply as the backend sent it.
#[inline(always)]
fn to_backend<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
    let q = &f.quoted;
    let Some(ct) = ct::peek::<I>(&f.quoted_reply_key(CT_SERVICE), q.proto) else {
        return Action::NEXT;
    };
    if f.daddr != q.saddr {
        return Action::NEXT;
    }
    let backend = &ct.addr;
    let snat = ct.flags & CT_F_SNAT != 0;
    let local = ct.flags & CT_F_LOCAL != 0;
    let mut ok = quoted_addr(ctx, f, I::SADDR, backend)
        && quoted_port(ctx, f, L4_SPORT, ct.port)
        && outer_addr(ctx, f, I::DADDR, &f.daddr, backend);
    let mut outer_src = &f.saddr;
    if snat {
        let node = &ct.nat_addr;
        ok = ok
            && quoted_addr(ctx, f, I::DADDR, node)
            && quoted_port(ctx, f, L4_DPORT, ct.nat_port)
            && outer_addr(ctx, f, I::SADDR, &f.saddr, node);
        outer_src = node;
    }
    if !ok {
        return Action::DROP;
    }
    bump(CNT_ICMP_TRANSLATED);
    if local {
        return Action::PASS;
    }
    forward_error(ctx, f, outer_src, backend)
}

/// Routes a translated error toward `daddr` and sends it.
#[inline(always)]
fn forward_error<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>, saddr: &I::Addr, daddr: &I::Addr) -> Action {
    let route = fib::lookup(ctx, saddr, daddr, f, 0);
    if let fib::Route::Failed(_) | fib::Route::TooBig(_) = route {
        record_drop(ctx, f, DropReason::FibLookupFailed, 0);
        return Action::DROP;
    }
    if fib::decrement_ttl(ctx, f).is_err() {
        return Action::DROP;
    }
    finish_redirect::<C, I>(ctx, route)
}

/// tc egress: an error a local backend (or, on a DSR backend's node, its
/// pod) sends about a packet it got through a frontend: it leaves quoting
/// the frontend, from the frontend when the backend itself sent it.
#[inline(never)]
pub fn egress_error<C: Hook, I: Ip>(ctx: &C, f: &Flow<I>) -> Action {
    let q = &f.quoted;
    // The quoted packet went client → backend; its reply entry says which
    // frontend the backend answers for.
    let Some(ct) = ct::peek::<I>(&f.quoted_reply_key(CT_REVERSE), q.proto) else {
        return Action::PASS;
    };
    if ct.flags & CT_F_SNAT != 0 || ct.flags & (CT_F_LOCAL | CT_F_DSR) == 0 {
        return Action::PASS;
    }
    let frontend = &ct.addr;
    let outer_src = if f.saddr == q.daddr {
        frontend
    } else {
        &f.saddr
    };
    let ok = quoted_addr(ctx, f, I::DADDR, frontend)
        && quoted_port(ctx, f, L4_DPORT, ct.port)
        && outer_addr(ctx, f, I::SADDR, &f.saddr, outer_src);
    if !ok {
        return Action::DROP;
    }
    bump(CNT_ICMP_TRANSLATED);
    Action::PASS
}
