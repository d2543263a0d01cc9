//! Thin wrappers over kernel interfaces that aya does not expose.
pub mod bpf;
pub mod caps;
pub mod fs;
pub mod heap;
pub mod netdev;
pub mod netlink;
pub mod sock_diag;
