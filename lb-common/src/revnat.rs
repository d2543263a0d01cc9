//! Reverse translation: from a backend back to the service address the
//! application asked for.

/// `LB4_REVNAT`: service id → frontend, written by the agent.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RevNat4 {
    /// Network byte order.
    pub address: u32,
    /// Network byte order.
    pub port: u16,
    pub pad: u16,
}

/// `LB4_SOCK_REVNAT` key: which backend a given socket was sent to.
/// The socket cookie scopes the entry to one socket.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SockRevNat4Key {
    pub cookie: u64,
    /// Backend address, network byte order.
    pub address: u32,
    /// Backend port, network byte order.
    pub port: u16,
    pub pad: u16,
}

/// `LB4_SOCK_REVNAT` value, written by connect4 / sendmsg4.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SockRevNat4Value {
    /// Frontend address, network byte order.
    pub address: u32,
    /// Frontend port, network byte order.
    pub port: u16,
    pub pad: u16,
    pub service_id: u32,
}

/// `LB6_REVNAT`: service id → IPv6 frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RevNat6 {
    pub address: crate::Addr6,
    pub port: u16,
    pub pad: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SockRevNat6Key {
    pub cookie: u64,
    pub address: crate::Addr6,
    pub port: u16,
    pub pad: [u8; 6],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SockRevNat6Value {
    pub address: crate::Addr6,
    pub port: u16,
    pub pad: u16,
    pub service_id: u32,
}

crate::user_pod!(
    RevNat4,
    SockRevNat4Key,
    SockRevNat4Value,
    RevNat6,
    SockRevNat6Key,
    SockRevNat6Value
);
