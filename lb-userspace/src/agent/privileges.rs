//! The capabilities the agent needs, checked before anything is installed.
//!
//! Run in a container with a capability list instead of `privileged: true`,
//! an agent missing one would otherwise fail half way: maps created but no
//! program attached, or every sync working but the sockets of a removed
//! backend never closed. So it refuses at start and names what is missing
//! and which operation needs it.
//!
//! CAP_SYS_ADMIN would satisfy the kernel's checks for CAP_BPF and
//! CAP_PERFMON too (`bpf_capable()` and `perfmon_capable()` fall back to it,
//! include/linux/capability.h), so today a list without those two would
//! work. They are still required by name (Cilium's chart keeps them
//! commented out, relying on CAP_SYS_ADMIN): the list then says what each
//! operation needs, and stays right the day CAP_SYS_ADMIN is no longer
//! needed for pods' sockets (a socket iterator with bpf_sock_destroy).
use crate::sys::caps::{self, CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE};

/// A capability and what needs it. The words are the chart's comments.
pub struct Need {
    pub cap: u32,
    pub name: &'static str,
    pub why: &'static str,
}

/// Every capability the agent needs, in the order the chart lists them.
pub const NEEDS: &[Need] = &[
    Need {
        cap: CAP_BPF,
        name: "CAP_BPF",
        why: "bpf(): creating, pinning and updating the maps and loading the programs",
    },
    Need {
        cap: CAP_NET_ADMIN,
        name: "CAP_NET_ADMIN",
        why: "loading programs of networking types (cgroup sock_addr, tc, XDP), attaching them to the cgroup and the devices, and destroying sockets (sock_diag SOCK_DESTROY)",
    },
    Need {
        cap: CAP_PERFMON,
        name: "CAP_PERFMON",
        why: "the verifier's pointer rules (CAP_SYS_ADMIN grants them too): without either, the programs are checked as unprivileged ones (Spectre v1 masking of pointer arithmetic) and refused",
    },
    Need {
        cap: CAP_SYS_ADMIN,
        name: "CAP_SYS_ADMIN",
        why: "setns() into pods' network namespaces, to destroy their connected UDP sockets to a removed backend",
    },
    Need {
        cap: CAP_SYS_PTRACE,
        name: "CAP_SYS_PTRACE",
        why: "opening /proc/<pid>/ns/net of processes in other containers (the kernel's ptrace access check), to find pods' network namespaces",
    },
];

/// The needs `effective` lacks.
pub fn missing(effective: u64) -> Vec<&'static Need> {
    NEEDS
        .iter()
        .filter(|n| !caps::has(effective, n.cap))
        .collect()
}

/// Refuses, naming every missing capability and what needs it.
pub fn check() -> anyhow::Result<()> {
    let effective = caps::effective()?;
    let missing = missing(effective);
    if missing.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = missing
        .iter()
        .map(|n| format!("{} ({})", n.name, n.why))
        .collect();
    anyhow::bail!(
        "missing capabilit{} {}; nothing was installed. Add {} to the container's \
         securityContext.capabilities.add (the chart's securityContext.capabilities.agent \
         lists all the agent needs) or run the agent as root",
        if missing.len() == 1 { "y" } else { "ies" },
        list.join(", "),
        missing
            .iter()
            .map(|n| n.name.trim_start_matches("CAP_"))
            .collect::<Vec<_>>()
            .join(", "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_missing_capability_is_named_and_the_full_set_passes() {
        let all: u64 = NEEDS.iter().map(|n| 1u64 << n.cap).sum();
        assert!(missing(all).is_empty());
        for need in NEEDS {
            let without = all & !(1u64 << need.cap);
            let names: Vec<&str> = missing(without).iter().map(|n| n.name).collect();
            assert_eq!(names, vec![need.name]);
        }
        // Other capabilities do not stand in for a named one.
        assert_eq!(missing(!(1u64 << CAP_BPF)).len(), 1);
    }
}
