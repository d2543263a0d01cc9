//! Bounds-checked direct packet access, shared by the tc and XDP programs.
//!
//! Every access checks `start + offset + size <= end` right before it, the
//! shape the verifier proves safe (kernel/bpf/verifier.c, packet range
//! tracking). Fields are read and written unaligned: the IPv4 header sits at
//! offset 14, so its 32-bit fields are not 4-byte aligned.
use core::mem::size_of;

pub const ETH_HLEN: usize = 14;
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const IPV6_HLEN: usize = 40;
/// IPv6 header field offsets (RFC 8200 §3).
pub const IP6_PAYLOAD_LEN: usize = 4;
pub const IP6_NEXT_HEADER: usize = 6;
pub const IP6_HOP_LIMIT: usize = 7;
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;

/// IPv4 header field offsets (from the start of the IP header).
pub const IP_TOT_LEN: usize = 2;
pub const IP_ID: usize = 4;
pub const IP_FRAG_OFF: usize = 6;
pub const IP_TTL: usize = 8;
pub const IP_PROTO: usize = 9;
pub const IP_CHECK: usize = 10;
pub const IP_SADDR: usize = 12;
pub const IP_DADDR: usize = 16;

/// TCP / UDP field offsets (from the start of the L4 header).
pub const L4_SPORT: usize = 0;
pub const L4_DPORT: usize = 2;
pub const TCP_DOFF: usize = 12;
pub const TCP_FLAGS: usize = 13;
pub const TCP_CHECK: usize = 16;
pub const UDP_CHECK: usize = 6;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

/// ICMP header offsets and the error types we translate (RFC 792).
pub const ICMP_TYPE: usize = 0;
pub const ICMP_CHECK: usize = 2;
pub const ICMP_HLEN: usize = 8;
pub const ICMP_DEST_UNREACH: u8 = 3;
pub const ICMP_FRAG_NEEDED: u8 = 4;
/// Destination unreachable code: port unreachable (RFC 792).
pub const ICMP_PORT_UNREACH: u8 = 3;
pub const ICMP_TIME_EXCEEDED: u8 = 11;
pub const ICMP_PARAMETER_PROB: u8 = 12;
/// ICMPv6 (RFC 4443): next header 58, the error types we translate.
pub const IPPROTO_ICMPV6: u8 = 58;
pub const IPPROTO_DSTOPTS: u8 = 60;
pub const IPPROTO_FRAGMENT: u8 = 44;
pub const ICMPV6_DEST_UNREACH: u8 = 1;
pub const ICMPV6_PKT_TOOBIG: u8 = 2;
pub const ICMPV6_TIME_EXCEED: u8 = 3;
pub const ICMPV6_PARAM_PROB: u8 = 4;

/// `frag_off` bits, in memory order of a little-endian load of the
/// big-endian field: MF (0x2000), DF (0x4000) and the 13-bit offset.
pub const IP_MF_OR_OFFSET: u16 = (0x3fffu16).to_be();
pub const IP_OFFSET: u16 = (0x1fffu16).to_be();
pub const IP_DF: u16 = (0x4000u16).to_be();

/// Packet bounds, read from the context afresh (volatile) for every
/// access. LLVM then cannot prove a check redundant from an earlier one
/// (say, a variable-length IP header check that implies it) and drop it:
/// the verifier does not follow such proofs and needs a comparison against
/// the packet end right before each access (kernel/bpf/verifier.c,
/// find_good_pkt_pointers).
pub trait Pkt {
    fn data(&self) -> usize;
    fn data_end(&self) -> usize;
    /// Whether the whole packet (not only what direct access reaches: an skb
    /// keeps payload in page fragments) is at least `len` bytes long.
    fn covers(&self, len: usize) -> bool;
    /// Makes the first `len` bytes directly readable (tc: bpf_skb_pull_data;
    /// an XDP frame is linear already).
    fn pull(&self, len: usize);
}

#[inline(always)]
pub fn ptr_at<T, P: Pkt>(p: &P, off: usize) -> Option<*mut T> {
    let start = p.data();
    let end = p.data_end();
    // For one byte LLVM rewrites `ptr + 1 > end` as `ptr >= end`, from
    // which the verifier grants no byte at all when the offset is variable
    // (kernel/bpf/verifier.c, find_good_pkt_pointers with range_right_open).
    // Hiding the size from LLVM keeps the `+ 1`.
    let size = if size_of::<T>() == 1 {
        core::hint::black_box(1)
    } else {
        size_of::<T>()
    };
    if start + off + size > end {
        return None;
    }
    Some((start + off) as *mut T)
}

#[inline(always)]
pub fn load<T: Copy, P: Pkt>(p: &P, off: usize) -> Option<T> {
    // SAFETY: ptr_at checked that the T lies inside the packet.
    ptr_at::<T, P>(p, off).map(|ptr| unsafe { core::ptr::read_unaligned(ptr) })
}

#[inline(always)]
pub fn store<T: Copy, P: Pkt>(p: &P, off: usize, v: T) -> bool {
    match ptr_at::<T, P>(p, off) {
        Some(ptr) => {
            // SAFETY: ptr_at checked that the T lies inside the packet.
            unsafe { core::ptr::write_unaligned(ptr, v) };
            true
        }
        None => false,
    }
}

/// A MAC address as a 32-bit and a 16-bit word (its bytes in memory
/// order), read unaligned.
///
/// Why not `*dst = *src` on the `[u8; 6]`: between two pointers LLVM cannot
/// tell apart (map values, the packet) it forwards the copy through its
/// temporary as a `memmove`, and the BPF backend emits that as a call to a
/// subprogram copying byte by byte (llvm-objdump showed six such calls on
/// the remote paths, about a twentieth of their time in a profile, plus a
/// call and a return each). Scalar loads and stores are never turned into
/// such a call.
#[inline(always)]
pub fn mac_words(m: &[u8; 6]) -> (u32, u16) {
    let p = m.as_ptr();
    // SAFETY: both reads lie inside the six bytes.
    unsafe {
        (
            core::ptr::read_unaligned(p.cast::<u32>()),
            core::ptr::read_unaligned(p.add(4).cast::<u16>()),
        )
    }
}

/// `*dst = *src` for a MAC address, as two scalar stores (`mac_words`).
#[inline(always)]
pub fn copy_mac(dst: &mut [u8; 6], src: &[u8; 6]) {
    let (hi, lo) = mac_words(src);
    let p = dst.as_mut_ptr();
    // SAFETY: both writes lie inside the six bytes.
    unsafe {
        core::ptr::write_unaligned(p.cast::<u32>(), hi);
        core::ptr::write_unaligned(p.add(4).cast::<u16>(), lo);
    }
}

/// Stores a MAC address into the packet at `off` (`mac_words`).
#[inline(always)]
pub fn store_mac<P: Pkt>(p: &P, off: usize, m: &[u8; 6]) -> bool {
    let (hi, lo) = mac_words(m);
    store(p, off, hi) && store(p, off + 4, lo)
}

/// bpf_skc_lookup_tcp / bpf_sk_lookup_udp in the current namespace, for
/// `Hook::socket_holds`: is there a socket for packets of `key`'s tuple?
/// The reference the lookup takes is released before returning, on every
/// path (the verifier checks it). A subprogram of its own: its frame is not
/// added to its caller's.
#[inline(never)]
pub fn socket_holds<I: super::family::Ip>(
    ctx: *mut core::ffi::c_void,
    key: &lb_common::conntrack::CtKey<I::Addr>,
) -> bool {
    let tcp = key.proto == IPPROTO_TCP;
    use aya_ebpf::{
        bindings::bpf_sock_tuple,
        helpers::{bpf_sk_lookup_udp, bpf_sk_release, bpf_skc_lookup_tcp},
    };
    const BPF_F_CURRENT_NETNS: u64 = u64::MAX; // (u64)-1
    const TCP_LISTEN: u32 = 10;
    // SAFETY: plain data; all zero is a valid tuple.
    let mut tuple: bpf_sock_tuple = unsafe { core::mem::zeroed() };
    let size = I::sock_tuple(key, &mut tuple);
    // SAFETY: the helpers read `tuple`, which lives across the call, and
    // take the program's own context.
    let sk = unsafe {
        if tcp {
            bpf_skc_lookup_tcp(ctx, &mut tuple, size, BPF_F_CURRENT_NETNS, 0)
        } else {
            bpf_sk_lookup_udp(ctx, &mut tuple, size, BPF_F_CURRENT_NETNS, 0)
        }
    };
    if sk.is_null() {
        return false;
    }
    // SAFETY: a socket the kernel just returned, released right after.
    let state = unsafe { (*sk).state };
    // SAFETY: the reference bpf_sk_lookup_* took, released once.
    unsafe { bpf_sk_release(sk.cast()) };
    !tcp || state != TCP_LISTEN
}
