//! Conversions between the logical entries (host order, `IpAddr`) and the
//! kernel's per-family map types (network order). The in-memory bytes of
//! the map fields are in network order, which is what `from_ne_bytes(octets)`
//! and `to_be()` produce on any host.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use lb_common::{
    backend::{Backend4, Backend6},
    revnat::{RevNat4, RevNat6},
    service::{Service4Key, Service6Key},
    Addr6,
};

use super::{BackendEntry, RevNatEntry, SvcKey};

/// An IPv6 address as every map keeps it (`lb_common::Addr6`: four words
/// whose bytes in memory are the address's, network order).
pub fn ip6_to_map(a: Ipv6Addr) -> Addr6 {
    lb_common::sock::bytes_to_words(&a.octets())
}

pub fn ip6_from_map(a: Addr6) -> Ipv6Addr {
    Ipv6Addr::from(lb_common::sock::words_to_bytes(&a))
}

pub fn ip4_to_map(address: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(address.octets())
}

pub fn ip4_from_map(address: u32) -> Ipv4Addr {
    Ipv4Addr::from(address.to_ne_bytes())
}

pub fn port_to_map(port: u16) -> u16 {
    port.to_be()
}

pub fn port_from_map(port: u16) -> u16 {
    u16::from_be(port)
}

fn v4(a: IpAddr) -> Ipv4Addr {
    match a {
        IpAddr::V4(a) => a,
        IpAddr::V6(a) => panic!("{a} routed to an IPv4 map"),
    }
}

fn v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V6(a) => a,
        IpAddr::V4(a) => panic!("{a} routed to an IPv6 map"),
    }
}

pub fn svc_key4(k: &SvcKey) -> Service4Key {
    Service4Key::new(
        ip4_to_map(v4(k.address)),
        port_to_map(k.port),
        k.proto,
        k.scope,
        k.slot,
    )
}

pub fn svc_key6(k: &SvcKey) -> Service6Key {
    Service6Key::new(
        ip6_to_map(v6(k.address)),
        port_to_map(k.port),
        k.proto,
        k.scope,
        k.slot,
    )
}

pub fn svc_key_from4(k: &Service4Key) -> SvcKey {
    SvcKey::new(
        IpAddr::V4(ip4_from_map(k.address)),
        port_from_map(k.dport),
        k.proto,
        k.scope,
    )
    .with_slot(k.backend_slot)
}

pub fn svc_key_from6(k: &Service6Key) -> SvcKey {
    SvcKey::new(
        IpAddr::V6(ip6_from_map(k.address)),
        port_from_map(k.dport),
        k.proto,
        k.scope,
    )
    .with_slot(k.backend_slot)
}

pub fn backend4(b: &BackendEntry) -> Backend4 {
    Backend4 {
        address: ip4_to_map(v4(b.address)),
        port: port_to_map(b.port),
        proto: b.proto,
        state: b.state,
        flags: b.flags,
        pad: [0; 3],
    }
}

pub fn backend6(b: &BackendEntry) -> Backend6 {
    Backend6 {
        address: ip6_to_map(v6(b.address)),
        port: port_to_map(b.port),
        proto: b.proto,
        state: b.state,
        flags: b.flags,
        pad: [0; 3],
    }
}

pub fn backend_from4(b: &Backend4) -> BackendEntry {
    BackendEntry {
        address: IpAddr::V4(ip4_from_map(b.address)),
        port: port_from_map(b.port),
        proto: b.proto,
        state: b.state,
        flags: b.flags,
    }
}

pub fn backend_from6(b: &Backend6) -> BackendEntry {
    BackendEntry {
        address: IpAddr::V6(ip6_from_map(b.address)),
        port: port_from_map(b.port),
        proto: b.proto,
        state: b.state,
        flags: b.flags,
    }
}

pub fn revnat4(r: &RevNatEntry) -> RevNat4 {
    RevNat4 {
        address: ip4_to_map(v4(r.address)),
        port: port_to_map(r.port),
        pad: 0,
    }
}

pub fn revnat6(r: &RevNatEntry) -> RevNat6 {
    RevNat6 {
        address: ip6_to_map(v6(r.address)),
        port: port_to_map(r.port),
        pad: 0,
    }
}

pub fn revnat_from4(r: &RevNat4) -> RevNatEntry {
    RevNatEntry {
        address: IpAddr::V4(ip4_from_map(r.address)),
        port: port_from_map(r.port),
    }
}

pub fn revnat_from6(r: &RevNat6) -> RevNatEntry {
    RevNatEntry {
        address: IpAddr::V6(ip6_from_map(r.address)),
        port: port_from_map(r.port),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_fields_hold_network_order_bytes() {
        let a = ip4_to_map(Ipv4Addr::new(10, 96, 0, 1));
        assert_eq!(a.to_ne_bytes(), [10, 96, 0, 1]);
        assert_eq!(ip4_from_map(a), Ipv4Addr::new(10, 96, 0, 1));
        let p = port_to_map(8080);
        assert_eq!(p.to_ne_bytes(), [0x1f, 0x90]);
        assert_eq!(port_from_map(p), 8080);
    }

    #[test]
    fn keys_round_trip_per_family() {
        let k4 = SvcKey::new("10.96.0.1".parse().unwrap(), 443, 6, 0).with_slot(3);
        assert_eq!(svc_key_from4(&svc_key4(&k4)), k4);
        let k6 = SvcKey::new("fd00::10".parse().unwrap(), 53, 17, 1).with_slot(2);
        let raw = svc_key6(&k6);
        assert_eq!(raw.address[0], 0xfd);
        assert_eq!(raw.dport.to_ne_bytes(), [0, 53]);
        assert_eq!(svc_key_from6(&raw), k6);
        let b = BackendEntry {
            address: "fd00::1".parse().unwrap(),
            port: 8080,
            proto: 6,
            state: 1,
            flags: 1,
        };
        assert_eq!(backend_from6(&backend6(&b)), b);
    }
}
