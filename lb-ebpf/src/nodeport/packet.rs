//! Bounds-checked direct packet access and incremental checksums, shared by
//! the tc and XDP programs.
//!
//! Every access checks `start + offset + size <= end` right before it, the
//! shape the verifier proves safe (kernel/bpf/verifier.c, packet range
//! tracking). Fields are read and written unaligned: the IPv4 header sits at
//! offset 14, so its 32-bit fields are not 4-byte aligned.
//!
//! Checksums are updated with RFC 1624 (eqn. 3): HC' = ~(~HC + ~m + m'),
//! on values exactly as they sit in memory: the one's complement sum does not
//! depend on byte order (RFC 1071 §2(B)), so no conversion is needed.
use core::mem::size_of;

pub const ETH_HLEN: usize = 14;
pub const ETH_P_IP: u16 = 0x0800;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;

/// IPv4 header field offsets (from the start of the IP header).
pub const IP_TOT_LEN: usize = 2;
pub const IP_FRAG_OFF: usize = 6;
pub const IP_PROTO: usize = 9;
pub const IP_CHECK: usize = 10;
pub const IP_SADDR: usize = 12;
pub const IP_DADDR: usize = 16;

/// TCP / UDP field offsets (from the start of the L4 header).
pub const L4_SPORT: usize = 0;
pub const L4_DPORT: usize = 2;
pub const TCP_FLAGS: usize = 13;
pub const TCP_CHECK: usize = 16;
pub const UDP_CHECK: usize = 6;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;

/// `frag_off` bits, in memory order of a little-endian load of the
/// big-endian field: MF (0x2000) and the 13-bit offset (0x1fff).
pub const IP_MF_OR_OFFSET: u16 = (0x3fffu16).to_be();

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
}

#[inline(always)]
pub fn ptr_at<T, P: Pkt>(p: &P, off: usize) -> Option<*mut T> {
    let start = p.data();
    let end = p.data_end();
    if start + off + size_of::<T>() > end {
        return None;
    }
    Some((start + off) as *mut T)
}

#[inline(always)]
pub fn load<T: Copy, P: Pkt>(p: &P, off: usize) -> Option<T> {
    ptr_at::<T, P>(p, off).map(|ptr| unsafe { core::ptr::read_unaligned(ptr) })
}

#[inline(always)]
pub fn store<T: Copy, P: Pkt>(p: &P, off: usize, v: T) -> bool {
    match ptr_at::<T, P>(p, off) {
        Some(ptr) => {
            unsafe { core::ptr::write_unaligned(ptr, v) };
            true
        }
        None => false,
    }
}

/// ~m + m' for a 32-bit field, as a one's complement partial sum.
#[inline(always)]
pub fn diff32(old: u32, new: u32) -> u32 {
    let o = !old;
    (o >> 16) + (o & 0xffff) + (new >> 16) + (new & 0xffff)
}

#[inline(always)]
pub fn diff16(old: u16, new: u16) -> u32 {
    (!old) as u32 + new as u32
}

/// Applies a partial sum to a stored checksum.
#[inline(always)]
pub fn csum_apply(check: u16, diff: u32) -> u16 {
    let mut s = (!check) as u32 + diff;
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    !(s as u16)
}

/// Full IPv4 header checksum over `words` 16-bit words (the header must be
/// there; the caller checked the length). Unrolled for the two sizes we
/// write: 20 bytes and 28 bytes (with the DSR option).
#[inline(always)]
pub fn ipv4_csum<P: Pkt>(p: &P, ip: usize, with_option: bool) -> Option<u16> {
    let mut sum: u32 = 0;
    let words = if with_option { 14 } else { 10 };
    let mut i = 0;
    while i < 14 {
        if i < words && i != 5 {
            // word 5 is the checksum itself
            sum += load::<u16, P>(p, ip + i * 2)? as u32;
        }
        i += 1;
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    Some(!(sum as u16))
}
