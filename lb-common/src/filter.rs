//! `LB4_FE_FILTER`: one bit per (address, port) of every frontend (IPv6
//! addresses folded to 32 bits, `fold6`; the map's name predates them), so
//! the packet programs can let a packet that cannot concern a service go
//! with a few array reads instead of four hash lookups (conntrack twice,
//! the service and its address marker). A bitmap with one hash function, a
//! Bloom filter of k = 1: a set bit may be another frontend's (the packet
//! then takes the full path, as before); a clear bit is never wrong,
//! because the agent sets a frontend's bit before it writes the frontend
//! and clears it only after the last frontend on that bit is gone.
//!
//! 2^20 bits (128 KiB): at 100 000 frontends about 9% of bits are set, so
//! 9 in 100 packets that are not for a service still take the full path.

/// log2 of the number of bits.
pub const FILTER_BITS_LOG2: u32 = 20;
/// `LB4_FE_FILTER` entries: 64 bits each.
pub const FILTER_WORDS: u32 = 1 << (FILTER_BITS_LOG2 - 6);

/// The bit of a frontend, from the address and port as the packet carries
/// them (network order, the address read as a native u32). Two
/// multiplications (Fibonacci hashing, Knuth TAOCP 6.4), the top bits kept:
/// cheap in BPF, and every input bit reaches the result.
#[inline(always)]
pub const fn filter_bit(address: u32, port: u16) -> u32 {
    let h = address.wrapping_mul(0x9E37_79B1) ^ port as u32;
    h.wrapping_mul(0x85EB_CA77) >> (32 - FILTER_BITS_LOG2)
}

/// An IPv6 address (four words as the packet carries them) folded to the
/// 32 bits `filter_bit` takes: the xor of its words. IPv4 and IPv6
/// frontends share the filter; a bit two of them share only sends a
/// packet down the full path.
#[inline(always)]
pub const fn fold6(address: crate::Addr6) -> u32 {
    address[0] ^ address[1] ^ address[2] ^ address[3]
}

/// The word and the mask of a bit.
#[inline(always)]
pub const fn word_and_mask(bit: u32) -> (u32, u64) {
    (bit >> 6, 1u64 << (bit & 63))
}

/// `LB_SOCK_FILTER`: one flag per slot, for the sockets indexed in the
/// reverse LRU (`LB4/6_SOCK_REVNAT`, keyed by cookie and backend) or kept
/// in `LB_SOCK_TCP`. Every insert into the LRU (connect4/6, sendmsg4/6
/// spilling a UDP socket's storage) and every `LB_SOCK_TCP` claim first
/// sets the slot of the backend's (address, port), and the
/// agent sets those of the entries already there when it starts (entries
/// an older build made); nothing clears one. A clear slot therefore says
/// that no socket to that backend can have an entry, and sock_release
/// skips the lookup, a cold bucket in a map of 262 144 entries (most
/// closing sockets were never translated). A set slot may be another
/// backend's: the lookup runs, as it always did. Since flags are never
/// cleared, a node whose sockets reach many changing backends fills the
/// filter over time (about a third of the slots after 50 000 distinct
/// backends): those closes look up again, as before the filter. The agent
/// could clear it when the LRUs are empty; it does not yet.
///
/// 2^17 slots, one byte of value each (8 in the kernel's array): a slot is
/// only ever written whole, so the programs and the agent set flags without
/// a read-modify-write that could lose another's (the programs have no
/// atomic OR before BPF's v3 instruction set).
pub const SOCK_FILTER_SLOTS_LOG2: u32 = 17;
/// `LB_SOCK_FILTER` entries.
pub const SOCK_FILTER_SLOTS: u32 = 1 << SOCK_FILTER_SLOTS_LOG2;

/// The `LB_SOCK_FILTER` slot of a backend, from its address (an IPv6 one
/// folded, `fold6`) and port as the reverse LRU's key holds them.
#[inline(always)]
pub const fn sock_filter_slot(address: u32, port: u16) -> u32 {
    filter_bit(address, port) >> (FILTER_BITS_LOG2 - SOCK_FILTER_SLOTS_LOG2)
}

/// `LB_SOCK_COOKIES`: one flag per slot of socket cookies, for the same
/// LRU and for `LB_SOCK_TCP` (whose claims set it too). A direct connect to a backend that other sockets were translated
/// to passes `LB_SOCK_FILTER` (its backend's slot is set), and the lookup
/// it then made was a cold bucket of the 262 144-entry LRU: sock_release
/// took 352-378 ns on such a close on an Intel Xeon, 169-183 ns with a
/// 4 096-entry LRU (`lb-bench --profile quick --only connect` with
/// `--map-size-sock-revnat`, 2026-12-02). So every LRU insert also sets
/// its socket's cookie slot, and sock_release looks up only a socket whose
/// slot is set, and clears the slot when it is done. Cookies are handed
/// out in sequence (net/core/sock_diag.c, `__sock_gen_cookie`), so the
/// slots of sockets made one after another share cache lines and pages,
/// where the LRU's buckets are scattered by a hash.
///
/// A slot holds the tag of the socket that set it (`sock_cookie_tag`, the
/// cookie's next bits, which repeat every 254 × 2^18 cookies), so a close
/// clears only its own tag, and a socket whose slot holds another's tag is
/// known to hold nothing. Sockets 2^18 cookies
/// apart share a slot: a long-lived socket's with those made after it. The
/// second to set a slot that holds another tag makes it `SOCK_COOKIE_SHARED`,
/// which no close clears (it would forget the other), so a long-lived
/// socket keeps its flag; such slots only cost the sockets that later fall
/// on them a lookup, and they add up over time (nothing clears them, as
/// nothing clears `LB_SOCK_FILTER`). A flag can still be lost, and the
/// socket's translation then outlives it, until a claim of its
/// `LB_SOCK_TCP` slot moves it to the LRU and the LRU evicts it: without
/// atomic instructions, when two sockets set one slot at the same instant,
/// or a close clears its tag as another socket marks the slot shared, or
/// the agent's seed rewrites a slot as a program sets it; and when a socket
/// 254 × 2^18 cookies younger, with the same tag, closes first. None of
/// these can show a socket another's translation: the readers check the
/// translation itself, not the flag. A slot is written whole (one byte), for
/// the same reason as `LB_SOCK_FILTER`'s.
pub const SOCK_COOKIE_SLOTS_LOG2: u32 = 18;
/// `LB_SOCK_COOKIES` entries.
pub const SOCK_COOKIE_SLOTS: u32 = 1 << SOCK_COOKIE_SLOTS_LOG2;

/// The tag a socket leaves in its `LB_SOCK_COOKIES` slot: the cookie's bits
/// above the slot's, as 1..=254 (0 is a clear slot).
#[inline(always)]
pub const fn sock_cookie_tag(cookie: u64) -> u8 {
    ((cookie >> SOCK_COOKIE_SLOTS_LOG2) % 254) as u8 + 1
}

/// An `LB_SOCK_COOKIES` slot two sockets with different tags set.
pub const SOCK_COOKIE_SHARED: u8 = 255;

/// The `LB_SOCK_COOKIES` slot of a socket cookie: its low bits, so that
/// sockets made in sequence take neighbouring slots.
#[inline(always)]
pub const fn sock_cookie_slot(cookie: u64) -> u32 {
    (cookie as u32) & (SOCK_COOKIE_SLOTS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_stay_in_range_and_spread() {
        let mut seen = [0u8; 1 << 12];
        // 10.96.0.0/20 × a few ports, as a cluster's ClusterIPs look.
        for host in 0..4096u32 {
            let a = u32::from_ne_bytes([10, 96, (host >> 8) as u8, host as u8]);
            for port in [53u16, 80, 443] {
                let bit = filter_bit(a, port.to_be());
                assert!(bit < 1 << FILTER_BITS_LOG2);
                seen[(bit >> (FILTER_BITS_LOG2 - 12)) as usize] = 1;
            }
        }
        // 12 288 frontends over 4096 buckets: a good spread leaves about
        // e^-3 = 5% of them empty; a hash that ignored the address or the
        // port would leave most empty.
        let empty = seen.iter().filter(|s| **s == 0).count();
        assert!(empty < 4096 / 10, "{empty} of 4096 buckets empty");
    }

    #[test]
    fn sock_filter_slots_stay_in_range_and_spread() {
        let mut seen = [false; SOCK_FILTER_SLOTS as usize];
        let mut distinct = 0;
        // 2 000 pod backends (10.244.x.y) on two ports.
        for host in 0..1000u32 {
            let a = u32::from_ne_bytes([10, 244, (host >> 8) as u8, host as u8]);
            for port in [8080u16, 53] {
                let slot = sock_filter_slot(a, port.to_be());
                assert!(slot < SOCK_FILTER_SLOTS);
                if !seen[slot as usize] {
                    seen[slot as usize] = true;
                    distinct += 1;
                }
            }
        }
        // Few collisions: a slot two backends share only costs a lookup.
        assert!(distinct > 1980, "{distinct} distinct slots of 2000");
    }

    #[test]
    fn sockets_made_in_sequence_take_neighbouring_cookie_slots() {
        let first = 0x1_2345_6789u64;
        let slots: [u32; 64] = core::array::from_fn(|i| sock_cookie_slot(first + i as u64));
        assert!(slots.iter().all(|s| *s < SOCK_COOKIE_SLOTS));
        // 64 sockets in a row: 64 distinct bytes of one 64-byte span (a
        // hash would scatter them over 64 lines).
        let (lo, hi) = (slots.iter().min().unwrap(), slots.iter().max().unwrap());
        assert_eq!(hi - lo, 63, "{slots:?}");
        // The slots repeat only after 2^18 cookies, with another tag.
        let later = first + u64::from(SOCK_COOKIE_SLOTS);
        assert_ne!(sock_cookie_slot(first), sock_cookie_slot(first + 1_000));
        assert_eq!(sock_cookie_slot(first), sock_cookie_slot(later));
        assert_ne!(sock_cookie_tag(first), sock_cookie_tag(later));
        for c in [0, first, later, u64::MAX] {
            assert!((1..SOCK_COOKIE_SHARED).contains(&sock_cookie_tag(c)), "{c}");
        }
    }
}
