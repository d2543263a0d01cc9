//! Per-socket state of socket LB, kept in the socket's own storage
//! (`BPF_MAP_TYPE_SK_STORAGE`): it is created with the first translation a
//! socket makes and freed by the kernel with the socket, so there is no
//! global table to fill, evict or clean (Linux 5.2+, from sock_addr hooks
//! 5.11+: net/core/bpf_sk_storage.c, `bpf_sk_storage_get_cg_sock_proto`).
//!
//! Addresses are four 32-bit words as they sit in `bpf_sock_addr.user_ip6`
//! (network order); an IPv4 address fills the first word, the rest zero.

/// An address's four words as the bytes a map key holds (each word's
/// bytes in memory order).
#[inline(always)]
pub fn words_to_bytes(w: &crate::Addr6) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&w[0].to_ne_bytes());
    b[4..8].copy_from_slice(&w[1].to_ne_bytes());
    b[8..12].copy_from_slice(&w[2].to_ne_bytes());
    b[12..16].copy_from_slice(&w[3].to_ne_bytes());
    b
}

/// The four words of an address a map key holds, as the programs read them.
#[inline(always)]
pub fn bytes_to_words(b: &[u8; 16]) -> crate::Addr6 {
    [
        u32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
        u32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
        u32::from_ne_bytes([b[8], b[9], b[10], b[11]]),
        u32::from_ne_bytes([b[12], b[13], b[14], b[15]]),
    ]
}

/// Translations remembered per socket (`LB_SOCK_PEERS`).
pub const SOCK_PEERS: usize = 4;
/// Frontends whose backend an unconnected UDP socket keeps (`LB_SOCK_UDP`).
pub const UDP_CHOICES: usize = 4;

/// One translation a socket made: what it asked for (the frontend) and
/// where it was sent (the backend). recvmsg and getpeername show the
/// frontend again for the backend's address.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SockPeer {
    pub backend: crate::Addr6,
    pub frontend: crate::Addr6,
    /// Network order.
    pub backend_port: u16,
    /// Network order.
    pub frontend_port: u16,
    pub service_id: u32,
    /// 4 or 6; 0: the entry is free.
    pub family: u8,
    pub pad: [u8; 3],
}

/// `LB_SOCK_PEERS` value. A connected socket uses one entry; an unconnected
/// UDP socket one per backend it sends to, the oldest reused after
/// `SOCK_PEERS` (its translation then moves to `LB4/6_SOCK_REVNAT`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SockPeers {
    pub entries: [SockPeer; SOCK_PEERS],
    /// The entry to reuse next when all are taken.
    pub next: u32,
}

/// One frontend an unconnected UDP socket sends to, and its backend.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct UdpChoice {
    /// The frontend.
    pub address: crate::Addr6,
    /// Network order.
    pub port: u16,
    /// The backend's slot when it was chosen.
    pub slot: u16,
    pub backend_id: u32,
    pub used: u32,
}

/// `LB_SOCK_UDP` value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct UdpChoices {
    pub entries: [UdpChoice; UDP_CHOICES],
    /// The entry to reuse next when all are taken.
    pub next: u32,
    pub pad: u32,
}

/// `LB_SOCK_TCP` element: the translation of the open TCP socket whose
/// cookie is `cookie`, in the slot of that cookie's low bits
/// (`sock_tcp_slot`). `cookie` 0: the slot is free (the kernel never hands
/// out 0).
///
/// Why a table indexed by cookie and not only the `LB4/6_SOCK_REVNAT` LRU:
/// an insert into the LRU lands in a bucket its hash scatters over a
/// 262 144-entry map, a cache and TLB miss that made connect4 through a
/// VIP take 470-600 ns on an Intel Xeon against 235-330 ns writing this
/// table (`lb-bench --profile quick --only connect`, 2026-12-02). Cookies
/// are handed out in sequence (net/core/sock_diag.c, `__sock_gen_cookie`),
/// so sockets made one after another write neighbouring slots. A slot is
/// claimed again by a socket about `slots` cookies later (1 to 2 × `slots`:
/// see `sock_tcp_slot`); if its occupant is still open then (sock_release
/// frees a closing socket's slot), the occupant's translation moves to the
/// LRU first, so a long-lived socket keeps it as before: only sockets that
/// outlive that many newer cookies pay the LRU insert, once.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SockTcpSlot {
    pub cookie: u64,
    pub peer: SockPeer,
    pub pad: u32,
}

/// `LB_SOCK_TCP`'s size for a `--map-size-sock-revnat`: a quarter of the
/// LRU's, a power of two (the slot is the cookie's low bits), at least 16.
/// At the default 262 144 that is 65 536 slots of 56 bytes, 3.5 MiB, and a
/// TCP socket moves to the LRU once about 65 536 newer sockets have a
/// cookie.
pub const fn sock_tcp_slots(sock_revnat: u32) -> u32 {
    let quarter = (sock_revnat / 4).next_power_of_two();
    if quarter < 16 {
        16
    } else {
        quarter
    }
}

/// The `LB_SOCK_TCP` slot of a cookie in a table of `slots` (a power of
/// two): its low bits, shifted by a hash of the bits above them (the
/// cookie ÷ `slots`). Within each run of `slots` cookies the slots follow
/// the cookie; the shift keeps two CPUs apart that draw cookies a multiple
/// of `slots` apart at once (each CPU takes cookies in batches of its own,
/// include/linux/cookie.h since Linux 5.12), which would otherwise claim
/// the same slots at the same time. The price: the next run's shift is
/// another, so a slot is claimed again after 1 to 2 × `slots` cookies,
/// `slots` on average.
#[inline(always)]
pub const fn sock_tcp_slot(cookie: u64, slots: u32) -> u32 {
    // Never a division by zero (`slots` is at least 16): the `if` lets the
    // compiler see it, so no panic path reaches the BPF program.
    let run = cookie / if slots == 0 { 1 } else { slots as u64 };
    let shift = (run as u32).wrapping_mul(0x9e37_79b1);
    (cookie as u32).wrapping_add(shift) & (slots - 1)
}

crate::user_pod!(SockPeer, SockPeers, UdpChoice, UdpChoices, SockTcpSlot);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_words_and_key_bytes_round_trip_in_memory_order() {
        let b: [u8; 16] = core::array::from_fn(|i| i as u8);
        let w = bytes_to_words(&b);
        assert_eq!(w[0], u32::from_ne_bytes([0, 1, 2, 3]));
        assert_eq!(w[3], u32::from_ne_bytes([12, 13, 14, 15]));
        assert_eq!(words_to_bytes(&w), b);
    }

    #[test]
    fn the_tcp_table_is_a_quarter_of_the_lru_in_a_power_of_two_and_its_slots_follow_the_cookie() {
        assert_eq!(sock_tcp_slots(262_144), 65_536);
        assert_eq!(sock_tcp_slots(100_000), 32_768);
        assert_eq!(sock_tcp_slots(256), 64);
        assert_eq!(sock_tcp_slots(1), 16);
        let slots = sock_tcp_slots(262_144);
        // In sequence, neighbouring slots.
        let base = 5 * 65_536 + 100;
        for i in 0..1000u64 {
            let (a, b) = (
                sock_tcp_slot(base + i, slots),
                sock_tcp_slot(base + i + 1, slots),
            );
            assert_eq!(b, (a + 1) % slots, "{i}");
            assert!(a < slots);
        }
        // A multiple of the table apart (two CPUs' batches): not the same slot.
        for n in [16u32, 1024, slots] {
            for k in 1..4u64 {
                let apart = base + k * u64::from(n);
                assert_ne!(sock_tcp_slot(base, n), sock_tcp_slot(apart, n), "{n} {k}");
            }
        }
        assert!(sock_tcp_slot(u64::MAX, 16) < 16);
    }
}
