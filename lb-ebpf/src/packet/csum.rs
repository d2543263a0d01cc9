//! Internet checksums (RFC 1071) and their incremental update (RFC 1624).
//!
//! Checksums are updated with RFC 1624 (eqn. 3): HC' = ~(~HC + ~m + m'),
//! on values exactly as they sit in memory: the one's complement sum does not
//! depend on byte order (RFC 1071 §2(B)), so no conversion is needed.
use super::access::{load, store, Pkt};

/// ~m + m' for a 32-bit field, as a one's complement partial sum.
#[inline(always)]
pub fn diff32(old: u32, new: u32) -> u32 {
    let o = !old;
    (o >> 16) + (o & 0xffff) + (new >> 16) + (new & 0xffff)
}

#[inline(always)]
pub fn diff16(old: u16, new: u16) -> u32 {
    u32::from(!old) + u32::from(new)
}

/// Folds a 32-bit one's complement sum to 16 bits.
#[inline(always)]
pub fn fold(mut s: u32) -> u16 {
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    s as u16
}

/// Applies a partial sum to a stored checksum.
#[inline(always)]
pub fn csum_apply(check: u16, diff: u32) -> u16 {
    !fold(u32::from(!check) + diff)
}

/// One's complement sum of `words` 16-bit words at `off` (at most 30, an
/// IPv4 header with options), skipping the word at `skip` (a checksum
/// field being computed). None when the bytes are not all there.
#[inline(always)]
pub fn sum_words<P: Pkt>(p: &P, off: usize, words: usize, skip: usize) -> Option<u32> {
    let mut sum: u32 = 0;
    let mut i = 0;
    while i < 30 {
        if i < words && i != skip {
            sum += u32::from(load::<u16, P>(p, off + i * 2)?);
        }
        i += 1;
    }
    Some(sum)
}

/// Full IPv4 header checksum of the `len`-byte header at `ip` (the caller
/// checked the length: 20..=60).
#[inline(always)]
pub fn ipv4_csum<P: Pkt>(p: &P, ip: usize, len: usize) -> Option<u16> {
    // word 5 is the checksum itself
    sum_words(p, ip, len / 2, 5).map(|s| !fold(s))
}

/// The XDP way for the L4 checksum at `off`: `d`, the one's complement
/// partial sum of the changes of the fields it covers, applied to the field.
#[inline(always)]
pub fn manual_csum_l4<P: Pkt>(p: &P, off: usize, d: u32, udp: bool) -> bool {
    let Some(check) = load::<u16, P>(p, off) else {
        return false;
    };
    if udp && check == 0 {
        return true; // no UDP checksum (allowed for IPv4): keep none
    }
    let mut c = csum_apply(check, d);
    if udp && c == 0 {
        c = 0xffff; // RFC 768: a computed zero is sent as all ones
    }
    store(p, off, c)
}

/// Updates a checksum field in the packet by a change `d` (no skb state:
/// the IPv4 header checksum, and fields inside an ICMP message, whose
/// checksum has no pseudo-header). tc writes the IPv4 header checksum this
/// way too: bpf_l3_csum_replace does no more (net/core/filter.c: the field
/// only, after making the header writable, which our direct stores have
/// already), and the header's one's-complement sum does not change, so
/// neither does skb->csum of a CHECKSUM_COMPLETE packet.
#[inline(always)]
pub fn update_field<P: Pkt>(p: &P, check_off: usize, d: u32) -> bool {
    match load::<u16, P>(p, check_off) {
        Some(c) => store(p, check_off, csum_apply(c, d)),
        None => false,
    }
}
