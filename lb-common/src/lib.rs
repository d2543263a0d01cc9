//! Map keys, values and constants shared by the eBPF programs and the agent.
//!
//! Every type here is `#[repr(C)]` with explicit padding so that the kernel,
//! the eBPF object and user space agree byte for byte. Addresses and ports are
//! in network byte order (see docs/datapath.md, "Byte order").
#![no_std]

/// An IPv6 address as every shared type keeps it: four 32-bit words in
/// network byte order, as `bpf_sock_addr.user_ip6` and the kernel's
/// `in6_addr.in6_u.u6_addr32` hold it (where a type holds either family,
/// an IPv4 address fills the first word). In memory its bytes are the
/// address's bytes in order, so a key made from the 16 bytes of a header
/// and one made from the words are the same key; the programs never
/// convert. User space: `maps::convert::ip6_to_map` and `ip6_from_map`.
pub type Addr6 = [u32; 4];

pub mod affinity;
pub mod backend;
pub mod config;
pub mod conntrack;
pub mod devices;
pub mod drop;
pub mod event;
pub mod filter;
pub mod fragments;
pub mod layout;
pub mod maps;
pub mod nodeport;
pub mod revnat;
pub mod service;
pub mod sock;
pub mod stats;

/// IP protocol numbers as they appear in `bpf_sock_addr.protocol` and IP headers.
pub mod proto {
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
}

/// Marks a type as plain old data for aya when built for user space.
/// SAFETY (of the impl it writes): every type it is used on is `repr(C)`,
/// `Copy`, and made of integers and arrays of them with no implicit padding
/// (checked at compile time in `layout`), so any bytes are a valid value.
#[cfg(feature = "user")]
macro_rules! user_pod {
    ($($t:ty),* $(,)?) => { $(
        // SAFETY: see the macro's doc: repr(C), Copy, integers without padding.
        unsafe impl aya::Pod for $t {}
    )* };
}
#[cfg(not(feature = "user"))]
macro_rules! user_pod {
    ($($t:ty),* $(,)?) => {};
}
pub(crate) use user_pod;
