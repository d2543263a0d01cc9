//! The node's external devices, as the north-south programs see them: the
//! address SNATed packets leave each one with.

/// `LB_DEVICES`: the node's external devices (ifindex → its IPv4 address),
/// the source address of SNATed packets leaving that device.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Device {
    /// Network byte order.
    pub address: u32,
    pub flags: u32,
}

/// `LB6_DEVICES`: the node's external devices that have a global IPv6
/// address (ifindex → that address), the source of SNATed IPv6 packets
/// leaving the device. A device without one has no entry: IPv6 flows to
/// remote backends through it are dropped (`fib-lookup-failed`), and the
/// agent says so at start.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Device6 {
    /// Network byte order, as on the wire.
    pub address: crate::Addr6,
}

crate::user_pod!(Device, Device6);
