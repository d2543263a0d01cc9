//! The byte layout of every type the programs and the agent share, checked
//! twice (Cilium's alignchecker does the same for its C structs):
//!
//! - at compile time, for both the BPF target and the host: each type is
//!   exactly the sum of its fields (no implicit padding: padding is a named
//!   field, so the kernel, the object and user space agree byte for byte);
//! - by a test that hashes each type's size, alignment and field offsets
//!   and fails when one changes while `maps::LAYOUT_VERSION` does not: pins
//!   of an older layout must never be reused by a newer agent. A type that
//!   is new (the key or value of a new map, which an install creates beside
//!   the older pins) may join a released layout: it changes nothing an
//!   older agent pinned.

/// One line per type: `name size align field@offset:size ...`.
macro_rules! layouts {
    ($($m:ident::$t:ident { $($f:ident: $ft:ty),* $(,)? }),* $(,)?) => {
        $(
            const _: () = assert!(
                core::mem::size_of::<crate::$m::$t>() == 0 $(+ core::mem::size_of::<$ft>())*,
                concat!(stringify!($t), " has implicit padding: name it as a field")
            );
        )*

        /// Writes the layout description the hash is taken over.
        pub fn describe(out: &mut impl core::fmt::Write) -> core::fmt::Result {
            $(
                write!(
                    out,
                    "{} {} {}",
                    stringify!($t),
                    core::mem::size_of::<crate::$m::$t>(),
                    core::mem::align_of::<crate::$m::$t>()
                )?;
                $(
                    write!(
                        out,
                        " {}@{}:{}",
                        stringify!($f),
                        core::mem::offset_of!(crate::$m::$t, $f),
                        core::mem::size_of::<$ft>()
                    )?;
                )*
                writeln!(out)?;
            )*
            Ok(())
        }
    };
}

layouts! {
    affinity::AffinityKey { client: u64, service_id: u32, pad: u32 },
    affinity::AffinityValue { backend_id: u32, pad: u32, last_used_ns: u64 },
    affinity::AffinityMatchKey { service_id: u32, backend_id: u32 },
    backend::Backend4 { address: u32, port: u16, proto: u8, state: u8, flags: u8, pad: [u8; 3] },
    backend::Backend6 { address: crate::Addr6, port: u16, proto: u8, state: u8, flags: u8, pad: [u8; 3] },
    config::RateState { last_ns: u64, budget: u64 },
    event::Event { ktime_ns: u64, cookie: u64, kind: u8, hook: u8, proto: u8, family: u8, reason: u32, pid: u32, service_id: u32, backend_id: u32, sport: u16, dport: u16, xport: u16, pad: u16, saddr: crate::Addr6, daddr: crate::Addr6, xaddr: crate::Addr6, comm: [u8; 16], pad2: u32 },
    conntrack::Ct4Key { saddr: u32, daddr: u32, sport: u16, dport: u16, proto: u8, kind: u8, pad: [u8; 2] },
    conntrack::Ct4Value { backend_id: u32, service_id: u32, addr: u32, nat_addr: u32, port: u16, nat_port: u16, flags: u16, backends_gen: u16, last_seen_ns: u64 },
    conntrack::Ct6Key { saddr: crate::Addr6, daddr: crate::Addr6, sport: u16, dport: u16, proto: u8, kind: u8, pad: [u8; 2] },
    conntrack::Ct6Value { backend_id: u32, service_id: u32, addr: crate::Addr6, nat_addr: crate::Addr6, port: u16, nat_port: u16, flags: u16, backends_gen: u16, last_seen_ns: u64 },
    devices::Device { address: u32, flags: u32 },
    devices::Device6 { address: crate::Addr6 },
    fragments::Frag4Key { saddr: u32, daddr: u32, id: u16, proto: u8, pad: u8 },
    fragments::Frag4Value { sport: u16, dport: u16 },
    revnat::RevNat4 { address: u32, port: u16, pad: u16 },
    revnat::SockRevNat4Key { cookie: u64, address: u32, port: u16, pad: u16 },
    revnat::SockRevNat4Value { address: u32, port: u16, pad: u16, service_id: u32 },
    revnat::RevNat6 { address: crate::Addr6, port: u16, pad: u16 },
    revnat::SockRevNat6Key { cookie: u64, address: crate::Addr6, port: u16, pad: [u8; 6] },
    revnat::SockRevNat6Value { address: crate::Addr6, port: u16, pad: u16, service_id: u32 },
    service::SourceRange4 { service_id: u32, address: u32 },
    service::SourceRange6 { service_id: u32, address: crate::Addr6 },
    service::Service4Key { address: u32, dport: u16, backend_slot: u16, proto: u8, scope: u8, pad: [u8; 2] },
    service::ServiceValue { backend_id: u32, service_id: u32, count: u16, terminating_count: u16, flags: u16, algorithm: u8, maglev_size: u8, affinity_timeout_s: u32 },
    service::Service6Key { address: crate::Addr6, dport: u16, backend_slot: u16, proto: u8, scope: u8, pad: [u8; 2] },
    sock::SockPeer { backend: crate::Addr6, frontend: crate::Addr6, backend_port: u16, frontend_port: u16, service_id: u32, family: u8, pad: [u8; 3] },
    sock::SockPeers { entries: [crate::sock::SockPeer; crate::sock::SOCK_PEERS], next: u32 },
    sock::UdpChoice { address: crate::Addr6, port: u16, slot: u16, backend_id: u32, used: u32 },
    sock::UdpChoices { entries: [crate::sock::UdpChoice; crate::sock::UDP_CHOICES], next: u32, pad: u32 },
    sock::SockTcpSlot { cookie: u64, peer: crate::sock::SockPeer, pad: u32 },
    stats::ServiceStats { packets: u64, bytes: u64, flows: u64, connects: u64 },
}

/// FNV-1a, 64 bits: a hash with no dependency, stable across builds.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The layout version the per-type hashes below were recorded for.
pub const RECORDED_VERSION: u32 = 2;

/// FNV-1a of each type's line of `describe`, as released with
/// `RECORDED_VERSION`. Version 2 was recorded when this check came, with
/// LB4_SRC_RANGES' key (a new map); the socket storage types joined later
/// with their maps (LB_SOCK_UDP had been pinned unchecked until then, with
/// the same layout); IPv6 conntrack and devices (LB6_CT, LB6_DEVICES) with
/// their maps, and LB6_SRC_RANGES' key. Ct4Value and Ct6Value were recorded
/// again when their 16-bit `pad` became `backends_gen`: the same bytes, and
/// the 0 every older entry holds there means "never checked", so pinned
/// conntrack of this version reads right (a new version would have made
/// every upgrade drop it). SockTcpSlot joined with LB_SOCK_TCP, ServiceStats with LB_SVC_STATS. Backend6,
/// RevNat6 and Service6Key were recorded again when their address became
/// `Addr6` (four words instead of 16 bytes): the same bytes at the same
/// offsets and the same size; only the Rust alignment went from 2 to 4,
/// which no pinned map sees.
pub const RECORDED: [(&str, u64); 32] = [
    ("AffinityKey", 0xae7692cdde92f917),
    ("AffinityValue", 0xb90e3ef7df6cb90e),
    ("AffinityMatchKey", 0x6446390e934adce6),
    ("Backend4", 0x7724d85c5bc0e9b2),
    ("Backend6", 0xec3eda75f240f563),
    ("RateState", 0x53de71e3148aaf82),
    ("Event", 0xc05c1a7b71b2507c),
    ("Ct4Key", 0x9b2ace0d098b107a),
    ("Ct4Value", 0xb2b97796d27c2107),
    ("Device", 0x9ee151f8de9624a4),
    ("Ct6Key", 0xd03a6d8fac7a5939),
    ("Ct6Value", 0x6a524041daf30dce),
    ("Device6", 0x09723eedb0f74ec3),
    ("Frag4Key", 0x394d9972adf768db),
    ("Frag4Value", 0xbdd6178c8ef036a1),
    ("RevNat4", 0x704811ae190edfaf),
    ("SockRevNat4Key", 0x6b8ecf82a746788b),
    ("SockRevNat4Value", 0x44ca9eaafc2d8dca),
    ("RevNat6", 0x1c8d50231b81f7ee),
    ("SockRevNat6Key", 0x56bf8ae5be472a32),
    ("SockRevNat6Value", 0x2f2bae032aa40650),
    ("SourceRange4", 0xde6d5989befde97c),
    ("SourceRange6", 0x225050d0a4989b31),
    ("Service4Key", 0x2956a6738867d2e7),
    // Recorded again without a new version: its pad byte became
    // `maglev_size`, whose 0 (what older agents wrote) keeps the old meaning.
    ("ServiceValue", 0xe8af8e9b832990ed),
    ("Service6Key", 0xda1aea6be8ef94c4),
    ("SockPeer", 0xcd6a730083c2b4a4),
    ("SockPeers", 0xe07079ae361946c2),
    ("UdpChoice", 0x25b6a2c7ebf25d0c),
    ("UdpChoices", 0xc5c3e61d58566a91),
    ("SockTcpSlot", 0xbed9e560cc7ef78f),
    ("ServiceStats", 0x38a297f827a59841),
];

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{format, string::String, vec::Vec};

    use super::*;

    #[test]
    fn no_released_type_changes_without_a_new_layout_version() {
        let mut text = String::new();
        describe(&mut text).unwrap();
        let version = crate::maps::LAYOUT_VERSION;
        let mut problems = Vec::new();
        let mut current = Vec::new();
        for line in text.lines() {
            let name = line.split(' ').next().unwrap();
            let hash = fnv1a(line.as_bytes());
            current.push(name);
            match RECORDED.iter().find(|(n, _)| *n == name) {
                _ if version != RECORDED_VERSION => {}
                Some((_, h)) if *h == hash => {}
                Some(_) => problems.push(format!(
                    "{name} changed ({line}): a pinned map of the old layout would be \
                     misread. Bump LAYOUT_VERSION in maps.rs and record every type again \
                     for it"
                )),
                None => problems.push(format!(
                    "{name} is new: if it belongs to a new map only, add (\"{name}\", \
                     {hash:#018x}) to RECORDED; if an existing map now uses it, bump \
                     LAYOUT_VERSION"
                )),
            }
        }
        if version != RECORDED_VERSION {
            let all: Vec<String> = text
                .lines()
                .map(|l| {
                    let name = l.split(' ').next().unwrap();
                    format!("(\"{name}\", {:#018x}),", fnv1a(l.as_bytes()))
                })
                .collect();
            problems.push(format!(
                "LAYOUT_VERSION is {version}: set RECORDED_VERSION to it and RECORDED to\n{}",
                all.join("\n")
            ));
        }
        for (name, _) in &RECORDED {
            if !current.contains(name) {
                problems.push(format!("{name} was removed: bump LAYOUT_VERSION"));
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    #[test]
    fn the_description_covers_every_field_of_a_type() {
        let mut text = String::new();
        describe(&mut text).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("ServiceValue "))
            .unwrap();
        assert_eq!(
            line,
            "ServiceValue 20 4 backend_id@0:4 service_id@4:4 count@8:2 terminating_count@10:2 flags@12:2 algorithm@14:1 maglev_size@15:1 affinity_timeout_s@16:4"
        );
    }
}
