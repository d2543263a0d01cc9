//! Conversions between the model's types and the maps' network-byte-order
//! fields. The in-memory bytes of the map fields are in network order, which
//! is what `from_ne_bytes(octets)` and `to_be()` produce on any host.
use std::net::Ipv4Addr;

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
}
