//! ICMPv6 errors this node sends on the packet path (RFC 4443): "packet
//! too big" when a packet does not fit the path to its backend (IPv6
//! routers never fragment, so path MTU discovery lives on these, RFC 8201),
//! "time exceeded" when its hop limit runs out, "port unreachable" for a
//! frontend without endpoints. The packet becomes the error, sent back out
//! of the device it came in on, from the address it was sent to, quoting
//! its IPv6 header and first 8 bytes (enough for the sender to find its
//! socket; RFC 4443 allows up to the minimum MTU).
//!
//! tc only: XDP hands these packets to tc untouched.
//!
//! The checksum offload. A packet that asks for one (CHECKSUM_PARTIAL: GRO
//! merged it, or a local socket sent it over veth) keeps asking after we
//! rewrite it: on the way out, the offload sums from the original L4 header
//! (offset 54) to the end and writes the result at 54 + 16 (TCP) or 54 + 6
//! (UDP). A BPF program can neither read nor reset skb->ip_summed. So:
//!
//! * the program finds out: `bpf_skb_change_tail` refuses to cut a
//!   CHECKSUM_PARTIAL skb short of its checksum field (net/core/filter.c,
//!   __bpf_skb_min_len), so a cut to 60 bytes fails exactly then (the
//!   first 62 bytes are saved in the scratch map first);
//! * such an error carries a 24-byte Destination Options header between
//!   the IPv6 header and the ICMPv6 message, with one option of type 0x1e
//!   (RFC 4727's experiment value; its top bits say "skip if unknown",
//!   RFC 8200 §4.2), whose data covers both offsets the offload can write
//!   (60 and 70). Whatever it writes there lands in option data that
//!   receivers skip, outside the ICMPv6 checksum, which covers only the
//!   pseudo-header and the ICMPv6 message (RFC 8200 §8.1). (IPv4 has no
//!   such place: `icmp.rs` makes the offload rewrite a word with itself.)
//!
//! Other packets get the plain form (no extension header), which every
//! middlebox passes.
use lb_common::config::CNT_ICMP_SENT;

use super::{
    access::*,
    csum::{fold, sum_words},
    icmp::{admit, Error},
    parse::Flow,
    record_drop, scratch, Action, Hook,
};
use crate::{runtime::bump, select::V6};

const ICMPV6_PORT_UNREACH: u8 = 4;
/// Option type of the padding option that absorbs the offload's write.
const OPT_ABSORB: u8 = 0x1e;
/// The IPv6 header and 8 bytes of what follows.
pub const QUOTE6_LEN: usize = IPV6_HLEN + 8;
const L4: usize = ETH_HLEN + IPV6_HLEN;
const DSTOPTS_LEN: usize = 24;
const MSG_LEN: usize = ICMP_HLEN + QUOTE6_LEN;
/// A cut shorter than any CHECKSUM_PARTIAL skb's minimum (L4 + 6 + 2 for
/// UDP, L4 + 16 + 2 for TCP) and longer than any other's (L4 at most).
const PARTIAL_PROBE_LEN: u32 = (L4 + 6) as u32;
/// The IPv6 minimum MTU (RFC 8200 §5): no path is smaller.
const IPV6_MIN_MTU: u16 = 1280;

/// Answers `f` with an ICMPv6 error, and counts the drop of `f`.
#[inline(never)]
pub fn reply<C: Hook>(ctx: &C, f: &Flow<V6>, error: Error, service_id: u32) -> Action {
    if C::IS_XDP {
        return Action::PUNT; // tc does it (and counts it)
    }
    record_drop(ctx, f, error.reason(), service_id);
    // RFC 4443 §2.4 (e): never to a multicast or unspecified source.
    let first = f.saddr[0].to_ne_bytes()[0];
    let unspecified = f.saddr == [0; 4];
    if first == 0xff || unspecified {
        return Action::DROP;
    }
    // Rate-limited like ICMP, except "packet too big": path MTU discovery
    // depends on it, and Linux exempts it too (icmpv6_ratemask's default
    // leaves type 2 out). Each answers one oversized packet, smaller than
    // it: no amplification.
    let too_big = error != Error::TTL_EXCEEDED && error != Error::PORT_UNREACHABLE;
    if !too_big && !admit() {
        return Action::DROP;
    }
    let (ty, code, field) = if error == Error::TTL_EXCEEDED {
        (ICMPV6_TIME_EXCEED, 0, 0u32)
    } else if error == Error::PORT_UNREACHABLE {
        (ICMPV6_DEST_UNREACH, ICMPV6_PORT_UNREACH, 0)
    } else {
        let mtu = error.mtu().max(IPV6_MIN_MTU);
        (ICMPV6_PKT_TOOBIG, 0, u32::from(mtu))
    };
    let Some(s) = scratch::<V6>() else {
        return Action::DROP;
    };
    // SAFETY: per-CPU scratch, used by this program run only.
    let (macs, quote) = unsafe { (&mut (*s).macs, &mut (*s).quote6) };
    let Some(m) = load::<[u8; 12], C>(ctx, 0) else {
        return Action::DROP;
    };
    *macs = m;
    // Word by word, straight into the scratch map (48 bytes would not sit
    // well on this call chain's stack).
    let mut i = 0;
    while i < QUOTE6_LEN / 8 {
        match load::<u64, C>(ctx, ETH_HLEN + i * 8) {
            Some(w) => quote[i & 7] = w,
            None => return Action::DROP,
        }
        i += 1;
    }
    let partial = !ctx.change_tail(PARTIAL_PROBE_LEN);
    let icmp = if partial { L4 + DSTOPTS_LEN } else { L4 };
    let total = icmp + MSG_LEN;
    if !ctx.change_tail(total as u32) {
        return Action::DROP;
    }
    let mut dst = [0u8; 6];
    let mut src = [0u8; 6];
    dst.copy_from_slice(&macs[6..12]);
    src.copy_from_slice(&macs[0..6]);
    let payload = (total - L4) as u16;
    let [p0, p1] = payload.to_be_bytes();
    let next = if partial {
        IPPROTO_DSTOPTS
    } else {
        IPPROTO_ICMPV6
    };
    // Version 6, no traffic class or flow label; hop limit 64.
    let hdr: [u8; 8] = [0x60, 0, 0, 0, p0, p1, next, 64];
    let [f0, f1, f2, f3] = field.to_be_bytes();
    let icmp_hdr: [u8; 8] = [ty, code, 0, 0, f0, f1, f2, f3];
    let ip = ETH_HLEN;
    let ok = store(ctx, 0, dst)
        && store(ctx, 6, src)
        && store(ctx, 12, ETH_P_IPV6.to_be())
        && store(ctx, ip, hdr)
        && store(ctx, ip + 8, f.daddr)
        && store(ctx, ip + 24, f.saddr)
        && store(ctx, icmp, icmp_hdr);
    if !ok {
        return Action::DROP;
    }
    let mut i = 0;
    while i < QUOTE6_LEN / 8 {
        if !store(ctx, icmp + ICMP_HLEN + i * 8, quote[i & 7]) {
            return Action::DROP;
        }
        i += 1;
    }
    if partial {
        // Next header, length ((2 + 1) × 8 bytes), the option, its data.
        let opts: [u8; 4] = [IPPROTO_ICMPV6, 2, OPT_ABSORB, 20];
        if !store(ctx, L4, opts) {
            return Action::DROP;
        }
        let mut i = 0;
        while i < 5 {
            if !store(ctx, L4 + 4 + i * 4, 0u32) {
                return Action::DROP;
            }
            i += 1;
        }
    }
    // The checksum: the pseudo-header (RFC 8200 §8.1: both addresses, the
    // message length, next header 58), then the message, all summed as
    // they sit in memory (RFC 1071 §2(B)).
    let mut pseudo: u32 = 0;
    let mut i = 0;
    while i < 4 {
        let (a, b) = (f.saddr[i], f.daddr[i]);
        pseudo += (a & 0xffff) + (a >> 16) + (b & 0xffff) + (b >> 16);
        i += 1;
    }
    pseudo += u32::from((MSG_LEN as u16).to_be()) + u32::from(u16::from(IPPROTO_ICMPV6).to_be());
    let Some(msg) = sum_words(ctx, icmp, MSG_LEN / 2, 1) else {
        return Action::DROP;
    };
    if !store(ctx, icmp + ICMP_CHECK, !fold(pseudo + msg)) {
        return Action::DROP;
    }
    bump(CNT_ICMP_SENT);
    Action::redirect(ctx.ingress_ifindex())
}
