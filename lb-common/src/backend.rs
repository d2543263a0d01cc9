//! `LB4_BACKENDS`: backend id → address.

pub const BACKEND_STATE_ACTIVE: u8 = 0;
pub const BACKEND_STATE_TERMINATING: u8 = 1;
/// Administratively drained: kept in the table, never selected.
pub const BACKEND_STATE_MAINTENANCE: u8 = 2;

/// The backend runs on this node (used by `Local` traffic policies).
pub const BACKEND_FLAG_LOCAL: u8 = 1 << 0;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Backend4 {
    /// Network byte order.
    pub address: u32,
    /// Network byte order.
    pub port: u16,
    pub proto: u8,
    /// `BACKEND_STATE_*`.
    pub state: u8,
    /// `BACKEND_FLAG_*`.
    pub flags: u8,
    pub pad: [u8; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Backend6 {
    /// Network byte order.
    pub address: crate::Addr6,
    /// Network byte order.
    pub port: u16,
    pub proto: u8,
    pub state: u8,
    pub flags: u8,
    pub pad: [u8; 3],
}

crate::user_pod!(Backend4, Backend6);
