//! IPv4 fragments of north-south flows: the ports the first fragment
//! carried, for the ones after it.

/// `LB4_FRAGS`: an IPv4 datagram split into fragments. Only the first
/// fragment carries the ports; it records them here under the datagram's
/// identity (RFC 791: source, destination, protocol, identification), and
/// the later fragments find them, so all take the same flow.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Frag4Key {
    pub saddr: u32,
    pub daddr: u32,
    /// Identification field, network byte order.
    pub id: u16,
    pub proto: u8,
    pub pad: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Frag4Value {
    /// Network byte order.
    pub sport: u16,
    pub dport: u16,
}

crate::user_pod!(Frag4Key, Frag4Value);
