//! Connected UDP sockets left pointing at a backend that is gone.
//!
//! Socket LB translates a connected UDP socket once, at connect(). When the
//! backend it chose goes away (a CoreDNS pod restarts), the socket keeps
//! sending to the dead address: the classic "DNS stops working after
//! CoreDNS restarts", which kube-proxy answers by flushing conntrack
//! entries. Here there is no conntrack entry to flush, so the socket itself
//! is destroyed (SOCK_DESTROY): the application's next call fails
//! (ECONNABORTED from recv, EDESTADDRREQ from send on the now disconnected
//! socket) and it opens a new socket, which connect4 sends to a live
//! backend. Like Cilium's socket-LB termination, only sockets this load
//! balancer translated are touched: the socket's cookie and backend must be
//! in LB4/6_SOCK_REVNAT, so an application that dialed the pod address
//! itself keeps its socket.
//!
//! sock_diag sees one network namespace at a time, so every namespace on the
//! node is visited (found through /proc/*/ns/net: in Kubernetes the agent
//! runs with hostPID for this, and through /run/netns).
use std::{
    collections::BTreeSet,
    net::IpAddr,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
};

use aya::maps::{HashMap, MapData};
use lb_common::{
    maps as names,
    revnat::{SockRevNat4Key, SockRevNat4Value, SockRevNat6Key, SockRevNat6Value},
};

use crate::{
    maps::bpf::open_pinned,
    sys::sock_diag::{self, SockId},
};

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub namespaces: usize,
    pub destroyed: usize,
    pub errors: Vec<String>,
}

/// The node's network namespaces, one path each, and the ones that could
/// not be looked at.
#[derive(Debug, Default)]
pub struct Namespaces {
    pub paths: Vec<PathBuf>,
    /// `/proc/<pid>/ns/net` refused other than by the process exiting:
    /// the kernel's ptrace access check without CAP_SYS_PTRACE, or a
    /// security module. Counted, and the first named, never skipped
    /// silently: a namespace not visited keeps its sockets.
    pub refused: usize,
    pub first_refusal: Option<String>,
}

/// Every network namespace on the node: those of all processes, and the
/// named ones under /run/netns.
pub fn namespaces() -> Namespaces {
    let mut seen = BTreeSet::new();
    let mut out = Namespaces::default();
    let mut consider = |p: PathBuf| match std::fs::metadata(&p) {
        Ok(m) => {
            if seen.insert((m.dev(), m.ino())) {
                out.paths.push(p);
            }
        }
        // The process exited since the listing.
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::ESRCH) => {}
        Err(e) => {
            out.refused += 1;
            if out.first_refusal.is_none() {
                out.first_refusal = Some(format!("{}: {e}", p.display()));
            }
        }
    };
    if let Ok(procs) = std::fs::read_dir("/proc") {
        for e in procs.flatten() {
            if e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
            {
                consider(e.path().join("ns/net"));
            }
        }
    }
    if let Ok(named) = std::fs::read_dir("/run/netns") {
        for e in named.flatten() {
            consider(e.path());
        }
    }
    out
}

struct RevNat {
    v4: HashMap<MapData, SockRevNat4Key, SockRevNat4Value>,
    v6: HashMap<MapData, SockRevNat6Key, SockRevNat6Value>,
}

impl RevNat {
    fn open(pin_dir: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            v4: HashMap::try_from(open_pinned(pin_dir, names::LB4_SOCK_REVNAT)?)?,
            v6: HashMap::try_from(open_pinned(pin_dir, names::LB6_SOCK_REVNAT)?)?,
        })
    }

    /// Whether connect4/6 translated this socket to this backend.
    fn translated(&self, s: &SockId) -> bool {
        let v4 = match s.dst {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(a) => a.to_ipv4_mapped(),
        };
        match (v4, s.dst) {
            (Some(a), _) => {
                let key = SockRevNat4Key {
                    cookie: s.cookie,
                    address: u32::from_ne_bytes(a.octets()),
                    port: s.dport.to_be(),
                    pad: 0,
                };
                self.v4.get(&key, 0).is_ok()
            }
            (None, IpAddr::V6(a)) => {
                let key = SockRevNat6Key {
                    cookie: s.cookie,
                    address: crate::maps::convert::ip6_to_map(a),
                    port: s.dport.to_be(),
                    pad: [0; 6],
                };
                self.v6.get(&key, 0).is_ok()
            }
            (None, IpAddr::V4(_)) => false,
        }
    }
}

fn gone_key(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

/// Destroys, in every namespace, the connected UDP sockets that socket LB
/// sent to one of `gone` (backend address, port).
pub fn terminate_udp(pin_dir: &Path, gone: &[(IpAddr, u16)]) -> anyhow::Result<Report> {
    let mut report = Report::default();
    if gone.is_empty() {
        return Ok(report);
    }
    let revnat = RevNat::open(pin_dir)?;
    let gone: BTreeSet<(IpAddr, u16)> = gone.iter().map(|(a, p)| (gone_key(*a), *p)).collect();
    let all = namespaces();
    if let Some(first) = &all.first_refusal {
        report.errors.push(format!(
            "{} processes' network namespaces could not be opened, their sockets were not \
             looked at (first: {first}); the agent needs CAP_SYS_PTRACE and no security \
             module confining it",
            all.refused
        ));
    }
    for ns in all.paths {
        report.namespaces += 1;
        // setns() moves the calling thread: a thread of its own per namespace.
        let found = std::thread::scope(|scope| {
            scope
                .spawn(|| -> std::io::Result<Vec<SockId>> {
                    let f = std::fs::File::open(&ns)?;
                    // SAFETY: an open namespace file; only this scoped thread moves, and it ends with the scope.
                    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let mut victims = Vec::new();
                    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
                        for s in sock_diag::udp_sockets(family)? {
                            let connected = s.dport != 0 && !s.dst.is_unspecified();
                            if connected
                                && gone.contains(&(gone_key(s.dst), s.dport))
                                && revnat.translated(&s)
                            {
                                victims.push(s);
                            }
                        }
                    }
                    let mut destroyed = Vec::new();
                    for s in victims {
                        match sock_diag::destroy(&s) {
                            Ok(()) => destroyed.push(s),
                            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    Ok(destroyed)
                })
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("socket scan panicked")))
        });
        match found {
            Ok(d) => report.destroyed += d.len(),
            // A process that exited between the listing and the visit.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // A named namespace being deleted: `ip netns del` unmounts it
            // first, leaving for a moment the mode-000 file `ip netns add`
            // mounted it on (iproute2's netns_add): open() refuses it
            // without CAP_DAC_OVERRIDE, setns() refuses it as no namespace.
            Err(_) if placeholder(&ns) => {}
            Err(e) => report.errors.push(format!("{}: {e}", ns.display())),
        }
    }
    Ok(report)
}

/// Whether `path` is the mode-000 file a named namespace is mounted on (a
/// namespace file itself, nsfs, is readable by all).
fn placeholder(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o777 == 0)
}
