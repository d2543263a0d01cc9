//! What the data path needs from the kernel, probed before anything is
//! loaded: an old kernel gets one message that names every missing feature,
//! what it is for and the Linux release that brought it, instead of a
//! verifier log or an attach error halfway through the install.
//!
//! Helpers and maps are probed the way libbpf does (aya's
//! `is_helper_supported` / `is_map_supported`: load a minimal program or map
//! and read the verdict), so a backport counts. tcx links have no such probe
//! short of attaching; the kernel release decides there.
use aya::{
    maps::MapType,
    programs::ProgramType,
    sys::{is_helper_supported, is_map_supported, BpfHelper},
};

/// One thing the programs use.
#[derive(Clone, Copy, Debug)]
pub struct Requirement {
    /// What the kernel must offer.
    pub what: &'static str,
    /// The Linux release that brought it.
    pub since: (u32, u32),
    /// What the data path does with it.
    pub why: &'static str,
    probe: Probe,
}

#[derive(Clone, Copy, Debug)]
enum Probe {
    Helper(ProgramType, BpfHelper),
    Map(MapType),
    /// No probe short of using it: the kernel release decides.
    Release,
}

/// Everything the socket hooks use, and with `devices` the tc/XDP path too.
pub fn requirements(devices: bool) -> Vec<Requirement> {
    use aya::sys::BpfHelper as H;
    use ProgramType::{CgroupSock, CgroupSockAddr, SchedClassifier, Xdp};
    let mut r = vec![
        Requirement {
            what: "bpf_get_netns_cookie in cgroup sock_addr programs",
            since: (5, 7),
            why: "tells the host's sockets from pods' (--socket-lb-host-namespace-only) and keys session affinity",
            probe: Probe::Helper(CgroupSockAddr, H::BPF_FUNC_get_netns_cookie),
        },
        Requirement {
            what: "bpf_set_retval in cgroup sock_addr programs",
            since: (5, 18),
            why: "refuses a connect to a service without endpoints with ECONNREFUSED",
            probe: Probe::Helper(CgroupSockAddr, H::BPF_FUNC_set_retval),
        },
        Requirement {
            what: "socket-local storage (BPF_MAP_TYPE_SK_STORAGE)",
            since: (5, 2),
            why: "keeps each UDP socket's translations with the socket, where churn cannot evict them",
            probe: Probe::Map(MapType::SkStorage),
        },
        Requirement {
            what: "bpf_sk_storage_get in cgroup sock_addr programs",
            since: (5, 3),
            why: "reads and writes a UDP socket's translations from connect/sendmsg/recvmsg",
            probe: Probe::Helper(CgroupSockAddr, H::BPF_FUNC_sk_storage_get),
        },
        Requirement {
            what: "bpf_get_socket_cookie in cgroup sock_release programs",
            // The helper came to cgroup sock programs in 5.7, the
            // sock_release attach type in 5.9 (not probed: the 5.18 of
            // bpf_set_retval covers it).
            since: (5, 9),
            why: "takes a closing socket's entry out of the reverse-translation LRU",
            probe: Probe::Helper(CgroupSock, H::BPF_FUNC_get_socket_cookie),
        },
        Requirement {
            what: "BPF ring buffers",
            since: (5, 8),
            why: "carries drop and trace events to `lbctl monitor` and the agent",
            probe: Probe::Map(MapType::RingBuf),
        },
        Requirement {
            what: "LPM trie maps",
            since: (4, 11),
            why: "holds loadBalancerSourceRanges",
            probe: Probe::Map(MapType::LpmTrie),
        },
        Requirement {
            what: "hash-of-maps",
            since: (4, 12),
            why: "holds the Maglev tables",
            probe: Probe::Map(MapType::HashOfMaps),
        },
    ];
    if devices {
        r.extend([
            Requirement {
                what: "bpf_fib_lookup in tc and XDP programs",
                since: (4, 18),
                why: "routes NodePort/LoadBalancer traffic to a backend on another node",
                probe: Probe::Helper(SchedClassifier, H::BPF_FUNC_fib_lookup),
            },
            Requirement {
                what: "bpf_fib_lookup in XDP programs",
                since: (4, 18),
                why: "forwards from XDP (--acceleration)",
                probe: Probe::Helper(Xdp, H::BPF_FUNC_fib_lookup),
            },
            Requirement {
                what: "bpf_ktime_get_coarse_ns in tc and XDP programs",
                since: (5, 11),
                why: "stamps conntrack entries once per packet at the tick's resolution, cheaper than the clocksource",
                probe: Probe::Helper(SchedClassifier, H::BPF_FUNC_ktime_get_coarse_ns),
            },
            Requirement {
                what: "bpf_redirect_neigh in tc programs",
                since: (5, 10),
                why: "sends forwarded packets out when the next hop's address is not resolved yet",
                probe: Probe::Helper(SchedClassifier, H::BPF_FUNC_redirect_neigh),
            },
            Requirement {
                what: "tcx links",
                since: (6, 6),
                why: "attaches the tc programs to the --devices beside other programs, with a pinned link",
                probe: Probe::Release,
            },
        ]);
    }
    r
}

/// The running kernel's release as (major, minor), from uname.
pub fn kernel_release() -> Option<(u32, u32)> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    parse_release(&release)
}

fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Whether this kernel offers `r`. A probe that cannot run at all (no
/// privilege, say) is an error, not a missing feature.
pub fn present(r: &Requirement) -> anyhow::Result<bool> {
    Ok(match r.probe {
        Probe::Helper(program, helper) => is_helper_supported(program, helper)
            .map_err(|e| anyhow::anyhow!("probing {}: {e}", r.what))?,
        Probe::Map(map) => {
            is_map_supported(map).map_err(|e| anyhow::anyhow!("probing {}: {e}", r.what))?
        }
        Probe::Release => kernel_release().is_some_and(|v| v >= r.since),
    })
}

/// The error for the requirements `missing` on a kernel `release`: each
/// with its release and use, and the release that has them all.
pub fn refusal(release: &str, missing: &[Requirement]) -> String {
    let mut s = format!(
        "this kernel (Linux {}) lacks what the data path needs:",
        release.trim()
    );
    for r in missing {
        s.push_str(&format!(
            "\n  - {} (Linux {}.{}): {}",
            r.what, r.since.0, r.since.1, r.why
        ));
    }
    let need = missing.iter().map(|r| r.since).max().unwrap_or((0, 0));
    s.push_str(&format!(
        "\nrun lb-agent on Linux {}.{} or later (socket load balancing alone needs 5.18; --devices 6.6)",
        need.0, need.1
    ));
    s
}

/// Probes everything `requirements(devices)` lists; refuses with one
/// message naming every missing feature.
pub fn check(devices: bool) -> anyhow::Result<()> {
    let mut missing = Vec::new();
    for r in requirements(devices) {
        if !present(&r)? {
            missing.push(r);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    anyhow::bail!("{}", refusal(&release, &missing))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_parse_from_osrelease() {
        assert_eq!(parse_release("6.18.44-fc-v857\n"), Some((6, 18)));
        assert_eq!(parse_release("5.10.0-28-amd64"), Some((5, 10)));
        assert_eq!(parse_release("6.6"), Some((6, 6)));
        assert_eq!(parse_release("garbage"), None);
    }

    #[test]
    fn a_refusal_names_each_missing_feature_its_release_and_the_release_to_run() {
        let all = requirements(true);
        let missing: Vec<Requirement> = all.iter().filter(|r| r.since > (5, 10)).copied().collect();
        let text = refusal("5.10.0-28-amd64", &missing);
        assert!(
            text.starts_with("this kernel (Linux 5.10.0-28-amd64) lacks"),
            "{text}"
        );
        assert!(
            text.contains(
                "bpf_set_retval in cgroup sock_addr programs (Linux 5.18): refuses a connect"
            ),
            "{text}"
        );
        assert!(text.contains("tcx links (Linux 6.6)"), "{text}");
        assert!(
            !text.contains("bpf_redirect_neigh"),
            "present ones are not listed: {text}"
        );
        assert!(text.contains("on Linux 6.6 or later"), "{text}");
    }

    #[test]
    fn the_packet_path_needs_more_than_the_socket_hooks() {
        let socket = requirements(false);
        let all = requirements(true);
        assert!(all.len() > socket.len());
        assert_eq!(socket.iter().map(|r| r.since).max(), Some((5, 18)));
        assert_eq!(all.iter().map(|r| r.since).max(), Some((6, 6)));
    }
}
