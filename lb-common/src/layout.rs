//! The byte layout of every type the programs and the agent share, checked
//! twice (Cilium's alignchecker does the same for its C structs):
//!
//! - at compile time, for both the BPF target and the host: each type is
//!   exactly the sum of its fields (no implicit padding: padding is a named
//!   field, so the kernel, the object and user space agree byte for byte);
//! - by a test that hashes every type's size, alignment and field offsets
//!   and fails when they change while `maps::LAYOUT_VERSION` does not: pins
//!   of an older layout must never be reused by a newer agent.

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
    backend::Backend6 { address: [u8; 16], port: u16, proto: u8, state: u8, flags: u8, pad: [u8; 3] },
    config::RateState { last_ns: u64, budget: u64 },
    event::Event { ktime_ns: u64, cookie: u64, kind: u8, hook: u8, proto: u8, family: u8, reason: u32, pid: u32, service_id: u32, backend_id: u32, sport: u16, dport: u16, xport: u16, pad: u16, saddr: [u8; 16], daddr: [u8; 16], xaddr: [u8; 16], comm: [u8; 16], pad2: u32 },
    nodeport::Ct4Key { saddr: u32, daddr: u32, sport: u16, dport: u16, proto: u8, kind: u8, pad: [u8; 2] },
    nodeport::Ct4Value { backend_id: u32, service_id: u32, addr: u32, nat_addr: u32, port: u16, nat_port: u16, flags: u16, pad: u16, last_seen_ns: u64 },
    nodeport::Device { address: u32, flags: u32 },
    nodeport::Frag4Key { saddr: u32, daddr: u32, id: u16, proto: u8, pad: u8 },
    nodeport::Frag4Value { sport: u16, dport: u16 },
    revnat::RevNat4 { address: u32, port: u16, pad: u16 },
    revnat::SockRevNat4Key { cookie: u64, address: u32, port: u16, pad: u16 },
    revnat::SockRevNat4Value { address: u32, port: u16, pad: u16, service_id: u32 },
    revnat::RevNat6 { address: [u8; 16], port: u16, pad: u16 },
    revnat::SockRevNat6Key { cookie: u64, address: [u8; 16], port: u16, pad: [u8; 6] },
    revnat::SockRevNat6Value { address: [u8; 16], port: u16, pad: u16, service_id: u32 },
    service::SourceRange4 { service_id: u32, address: u32 },
    service::Service4Key { address: u32, dport: u16, backend_slot: u16, proto: u8, scope: u8, pad: [u8; 2] },
    service::ServiceValue { backend_id: u32, service_id: u32, count: u16, terminating_count: u16, flags: u16, algorithm: u8, pad: u8, affinity_timeout_s: u32 },
    service::Service6Key { address: [u8; 16], dport: u16, backend_slot: u16, proto: u8, scope: u8, pad: [u8; 2] },
}

/// FNV-1a, 64 bits: a hash with no dependency, stable across builds.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The layout hash each layout version was released with. Version 2 was
/// recorded when this check came (with LB4_SRC_RANGES' key, a new map that
/// an install adds beside older pins; no existing type changed).
pub const LAYOUT_HASHES: [(u32, u64); 1] = [(2, 0xf520_c19a_e7f7_e8b2)];

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::String;

    use super::*;

    #[test]
    fn the_layout_hash_changes_only_with_the_layout_version() {
        let mut text = String::new();
        describe(&mut text).unwrap();
        let hash = fnv1a(text.as_bytes());
        let version = crate::maps::LAYOUT_VERSION;
        let recorded = LAYOUT_HASHES.iter().find(|(v, _)| *v == version);
        assert_eq!(
            recorded,
            Some(&(version, hash)),
            "the shared types' layout is {hash:#018x} but layout version {version} was \
             released with another: a pinned map of the old layout would be misread. Bump \
             LAYOUT_VERSION in maps.rs and add ({}, {hash:#018x}) to LAYOUT_HASHES.\n{text}",
            version + 1
        );
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
            "ServiceValue 20 4 backend_id@0:4 service_id@4:4 count@8:2 terminating_count@10:2 flags@12:2 algorithm@14:1 pad@15:1 affinity_timeout_s@16:4"
        );
    }
}
