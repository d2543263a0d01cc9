//! The calling thread's effective capabilities.
//!
//! Read from /proc/self/status (`CapEff`, a hex mask of capability numbers,
//! include/uapi/linux/capability.h) rather than through capget(2): the
//! same mask, no versioned struct to get right, and it is what an operator
//! compares with `capsh --decode`. Nothing more is needed than this, so no
//! crate.

/// Capability numbers (include/uapi/linux/capability.h).
pub const CAP_NET_ADMIN: u32 = 12;
pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// The effective set of this process.
pub fn effective() -> std::io::Result<u64> {
    effective_of("self")
}

/// The effective set of process `pid` ("self" for this one).
pub fn effective_of(pid: &str) -> std::io::Result<u64> {
    let path = format!("/proc/{pid}/status");
    parse_status(&std::fs::read_to_string(&path)?)
        .ok_or_else(|| std::io::Error::other(format!("{path} has no readable CapEff line")))
}

fn parse_status(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

pub fn has(mask: u64, cap: u32) -> bool {
    mask & (1u64 << cap) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_effective_mask_is_read_from_the_capeff_line() {
        let status = "Name:\tlb-agent\nCapInh:\t0000000000000000\nCapPrm:\t000000c000281000\nCapEff:\t000000c000281000\nCapBnd:\t000001ffffffffff\n";
        let mask = parse_status(status).unwrap();
        for cap in [
            CAP_NET_ADMIN,
            CAP_SYS_PTRACE,
            CAP_SYS_ADMIN,
            CAP_PERFMON,
            CAP_BPF,
        ] {
            assert!(has(mask, cap), "capability {cap}");
        }
        assert!(!has(mask, 0), "CAP_CHOWN is not in the mask");
        assert_eq!(parse_status("Name:\tx\n"), None);
    }
}
