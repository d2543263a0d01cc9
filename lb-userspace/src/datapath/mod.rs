//! Installing the data path: load the eBPF object, reuse or create the pinned
//! maps, attach the socket hooks to the cgroup and the tc/XDP programs to the
//! external devices, each through a pinned BPF link; on a restart or an
//! upgrade, swap the new program into the existing link. And the reverse:
//! uninstall.
pub mod config;
pub mod features;
pub mod native_xdp;
pub mod pins;
pub mod pods;
pub mod sock_filter;

use std::{
    fs::File,
    os::fd::{AsFd as _, BorrowedFd},
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _};
use aya::{
    maps::{HashMap as BpfHashMap, MapData},
    programs::{
        links::FdLink, CgroupAttachMode, CgroupSock, CgroupSockAddr, SchedClassifier, TcAttachType,
        Xdp, XdpMode,
    },
    Ebpf, EbpfLoader,
};
use lb_common::{
    devices::{Device, Device6},
    maps as names,
};
use tracing::{info, warn};

pub use crate::maps::MapSizes;
pub use pins::PinLayout;

use crate::{
    maps::{bpf::open_pinned, convert::ip4_to_map},
    sys::{self, bpf as sysbpf},
};

/// The eBPF object, built by build.rs (aya-build) for bpfel-unknown-none.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb-ebpf"));

/// One socket hook: program name in the object and kernel attach type.
#[derive(Clone, Copy, Debug)]
pub struct Hook {
    pub name: &'static str,
    pub program: &'static str,
    pub attach_type: u32,
    pub kind: HookKind,
}

/// The program type of a socket hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookKind {
    /// cgroup sock_addr: connect, sendmsg, recvmsg, getpeername.
    SockAddr,
    /// cgroup sock: sock_release.
    Sock,
}

/// In the order the agent swaps them: the readers of what connect and
/// sendmsg record, and sock_release, before the writers, so that an upgrade
/// never runs a new writer with an old reader (an older getpeername looks
/// only in the LRU, not in `LB_SOCK_TCP`).
pub const HOOKS: [Hook; 9] = [
    // Frees a closing socket's LB_SOCK_TCP slot and takes its entries out of
    // the reverse-translation LRU (lb-ebpf/src/sock/release.rs).
    Hook {
        name: "sock_release",
        program: "lb_sock_release",
        attach_type: sysbpf::BPF_CGROUP_INET_SOCK_RELEASE,
        kind: HookKind::Sock,
    },
    Hook {
        name: "recvmsg4",
        program: "lb_recvmsg4",
        attach_type: sysbpf::BPF_CGROUP_UDP4_RECVMSG,
        kind: HookKind::SockAddr,
    },
    Hook {
        name: "getpeername4",
        program: "lb_getpeername4",
        attach_type: sysbpf::BPF_CGROUP_INET4_GETPEERNAME,
        kind: HookKind::SockAddr,
    },
    Hook {
        name: "recvmsg6",
        program: "lb_recvmsg6",
        attach_type: sysbpf::BPF_CGROUP_UDP6_RECVMSG,
        kind: HookKind::SockAddr,
    },
    Hook {
        name: "getpeername6",
        program: "lb_getpeername6",
        attach_type: sysbpf::BPF_CGROUP_INET6_GETPEERNAME,
        kind: HookKind::SockAddr,
    },
    Hook {
        name: "connect4",
        program: "lb_connect4",
        attach_type: sysbpf::BPF_CGROUP_INET4_CONNECT,
        kind: HookKind::SockAddr,
    },
    Hook {
        name: "sendmsg4",
        program: "lb_sendmsg4",
        attach_type: sysbpf::BPF_CGROUP_UDP4_SENDMSG,
        kind: HookKind::SockAddr,
    },
    Hook {
        name: "connect6",
        program: "lb_connect6",
        attach_type: sysbpf::BPF_CGROUP_INET6_CONNECT,
        kind: HookKind::SockAddr,
    },
    Hook {
        name: "sendmsg6",
        program: "lb_sendmsg6",
        attach_type: sysbpf::BPF_CGROUP_UDP6_SENDMSG,
        kind: HookKind::SockAddr,
    },
];

pub const TC_INGRESS: &str = "lb_tc_ingress";
pub const TC_EGRESS: &str = "lb_tc_egress";
pub const XDP: &str = "lb_xdp";

/// XDP acceleration of the north-south path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Acceleration {
    /// tc only.
    #[default]
    Disabled,
    /// XDP in the driver on every device; refuse to start where it is not
    /// supported, or on a veth whose peer has no XDP program.
    Native,
    /// XDP in the driver where it can carry the traffic, tc alone elsewhere
    /// (logged).
    BestEffort,
}

#[derive(Clone, Debug)]
pub struct DatapathConfig {
    pub pin_dir: PathBuf,
    pub cgroup: PathBuf,
    pub sizes: MapSizes,
    /// External devices for NodePort/LoadBalancer/external-IP traffic.
    pub devices: Vec<String>,
    pub acceleration: Acceleration,
    /// Pod-facing devices: pods' packets to frontends are translated there.
    pub pod_devices: pods::PodDevices,
}

/// What `install` did with each hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookAction {
    /// No link was pinned: attached and pinned a new one.
    Attached,
    /// A pinned link existed: the new program was swapped into it.
    Updated,
    /// A pinned link existed on another cgroup or a vanished device: replaced.
    Moved,
    /// Native XDP is not supported on this device (best-effort): tc only.
    Skipped(String),
}

pub struct InstallReport {
    /// (link pin name, what happened)
    pub hooks: Vec<(String, HookAction)>,
    pub maps_reused: bool,
    /// Reads the programs' aya-log records (AYA_LOGS); poll it to forward
    /// them to the `log` crate. None if the object has no log map.
    pub logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
}

/// Loads the object with its maps pinned under `pin_dir` (reusing pinned
/// ones), without attaching anything. Returns the object and whether maps
/// were already pinned.
pub fn load(pin_dir: &Path, sizes: &MapSizes) -> anyhow::Result<(Ebpf, bool)> {
    let layout = PinLayout::new(pin_dir);
    sys::fs::ensure_pin_dir(pin_dir)?;
    let maps_reused = layout.check_pinned_maps(sizes)?;
    if sizes.preallocate {
        layout.create_preallocated(sizes)?;
    }
    let mut loader = EbpfLoader::new();
    loader.default_map_pin_directory(pin_dir);
    // BTF map definitions carry no pinning attribute: pin by path.
    for m in crate::maps::catalog::CATALOG.iter().filter(|m| m.btf) {
        loader.map_pin_path(m.name, layout.map(m.name));
    }
    for (name, size) in sizes.entries() {
        loader.map_max_entries(name, size);
    }
    // The programs take a TCP socket's LB_SOCK_TCP slot from its cookie's
    // low bits: they must know the table's size (lb-ebpf/src/sock/tcp_table.rs).
    let tcp_slots = lb_common::sock::sock_tcp_slots(sizes.sock_revnat);
    loader.override_global("SOCK_TCP_SLOTS", &tcp_slots, true);
    let mut ebpf = loader
        .load(EBPF_OBJECT)
        .context("loading the eBPF object (is this kernel new enough? see README requirements)")?;
    next_backends_generation(&mut ebpf)?;
    Ok((ebpf, maps_reused))
}

/// The devices native XDP would lose traffic on, with why (`native_xdp`).
/// With `--acceleration native` any such device refuses the start, all
/// named; with best-effort they are left to tc. A veth that passes is
/// attached with a warning: its senders' checksums cannot be checked.
fn native_xdp_unfit(cfg: &DatapathConfig) -> anyhow::Result<Vec<(String, String)>> {
    if cfg.acceleration == Acceleration::Disabled {
        return Ok(Vec::new());
    }
    let mut unfit = Vec::new();
    for dev in &cfg.devices {
        let ifindex = sys::netdev::ifindex(dev)?;
        match native_xdp::check(dev, ifindex)? {
            native_xdp::Fit::NotVeth => {}
            native_xdp::Fit::Veth => warn!(
                device = %dev,
                "native XDP on a veth: the senders behind it must write full checksums (tx \
                 checksum offload off on their devices), which the agent cannot check; a \
                 packet whose checksum was left to offload is forwarded with a wrong one"
            ),
            native_xdp::Fit::Unfit(why) => unfit.push((dev.clone(), why)),
        }
    }
    if cfg.acceleration == Acceleration::Native && !unfit.is_empty() {
        let all: Vec<&str> = unfit.iter().map(|(_, why)| why.as_str()).collect();
        bail!(
            "--acceleration native: {}; use --acceleration best-effort (tc on such devices) \
             or disabled",
            all.join("; ")
        );
    }
    Ok(unfit)
}

/// Every load starts a new generation of the backends
/// (`LB_BACKENDS_GEN`): a conntrack entry from before it checks its backend
/// on its next packet. An agent that kept no generation (an older build)
/// may have deleted backends that pinned entries still name.
fn next_backends_generation(ebpf: &mut Ebpf) -> anyhow::Result<()> {
    let map = ebpf
        .map_mut(lb_common::maps::LB_BACKENDS_GEN)
        .context("LB_BACKENDS_GEN missing from the object")?;
    let mut gen: aya::maps::Array<&mut aya::maps::MapData, u32> = aya::maps::Array::try_from(map)?;
    crate::maps::bpf::move_generation(&mut gen).context("moving LB_BACKENDS_GEN on")?;
    Ok(())
}

/// Before any program of this build is attached: the programs must not
/// trust LB4_FE_FILTER until this agent's first full sync has written it
/// (`lb_common::config::CFG_FRONTEND_FILTER`). An older agent may have
/// changed the services without keeping the filter; a fresh filter is empty.
fn distrust_frontend_filter(ebpf: &mut Ebpf) -> anyhow::Result<()> {
    let map = ebpf
        .map_mut(lb_common::maps::LB_CONFIG)
        .context("LB_CONFIG missing from the object")?;
    let mut config: aya::maps::Array<&mut aya::maps::MapData, u32> =
        aya::maps::Array::try_from(map)?;
    config::ConfigSlots::set(&mut config, lb_common::config::CFG_FRONTEND_FILTER, 0)
        .context("clearing CFG_FRONTEND_FILTER")?;
    Ok(())
}

/// Loads the programs and makes every hook run them, reusing pinned maps and
/// links. Idempotent: running it again (an agent restart or upgrade) stacks
/// nothing and keeps every map entry.
pub fn install(cfg: &DatapathConfig) -> anyhow::Result<InstallReport> {
    // Before anything is loaded or attached: an old kernel is refused with
    // every missing feature named, not a verifier log halfway through.
    features::check(!cfg.devices.is_empty() || !cfg.pod_devices.is_none())?;
    sys::fs::check_cgroup2(&cfg.cgroup)?;
    // Before anything is loaded too: a device where native XDP would lose
    // traffic (a veth whose peer has no XDP program) is refused with native
    // acceleration, and left to tc with best-effort.
    let xdp_unfit = native_xdp_unfit(cfg)?;
    let (mut ebpf, maps_reused) = load(&cfg.pin_dir, &cfg.sizes)?;
    distrust_frontend_filter(&mut ebpf)?;
    let layout = PinLayout::new(&cfg.pin_dir);
    let logger = match aya_log::EbpfLogger::init(&mut ebpf) {
        Ok(l) => Some(l),
        Err(e) => {
            warn!("eBPF log records will not be shown: {e}");
            None
        }
    };

    let cgroup_id = sys::fs::cgroup_id(&cfg.cgroup)?;
    let mut hooks = Vec::new();
    for hook in HOOKS {
        let program = ebpf
            .program_mut(hook.program)
            .with_context(|| format!("program {} missing from the object", hook.program))?;
        let pin = layout.link(hook.name);
        let current =
            |link: BorrowedFd<'_>| Ok(sysbpf::cgroup_link_info(link)?.cgroup_id == cgroup_id);
        // The two cgroup program types share these steps but no trait.
        macro_rules! load_and_link {
            ($kind:ty) => {{
                let prog: &mut $kind = program.try_into()?;
                load_retrying(|| prog.load())
                    .with_context(|| format!("verifier rejected {}", hook.program))?;
                let fd = prog.fd()?.try_clone()?;
                ensure_link(&pin, fd.as_fd(), current, || {
                    let id = prog
                        .attach(open_cgroup(&cfg.cgroup)?, CgroupAttachMode::Single)
                        .with_context(|| format!("attaching {} to the cgroup", hook.program))?;
                    Ok(FdLink::try_from(prog.take_link(id)?)?)
                })?
            }};
        }
        let action = match hook.kind {
            HookKind::SockAddr => load_and_link!(CgroupSockAddr),
            HookKind::Sock => load_and_link!(CgroupSock),
        };
        info!(hook = hook.name, action = ?action, cgroup = %cfg.cgroup.display(), "hook ready");
        hooks.push((hook.name.to_string(), action));
    }

    // Now that the hooks hold this build's programs (see sock_filter). A
    // failure costs no translation: the entries it would have flagged only
    // wait for the LRU to evict them.
    match sock_filter::seed(&cfg.pin_dir, cfg.sizes.sock_revnat) {
        Ok(n) => info!(
            entries = n,
            "reverse LRU entries' backends and sockets flagged in LB_SOCK_FILTER and LB_SOCK_COOKIES"
        ),
        Err(e) => warn!(
            "LB_SOCK_FILTER and LB_SOCK_COOKIES not seeded ({e:#}): sockets translated by an earlier build keep their reverse LRU entries after they close, until the LRU evicts them"
        ),
    }

    let mut wanted_links: Vec<String> = HOOKS.iter().map(|h| h.name.to_string()).collect();
    if !cfg.devices.is_empty() {
        for (prog_name, attach) in [
            (TC_INGRESS, TcAttachType::Ingress),
            (TC_EGRESS, TcAttachType::Egress),
        ] {
            let prog: &mut SchedClassifier = ebpf
                .program_mut(prog_name)
                .context("tc program missing")?
                .try_into()?;
            load_retrying(|| prog.load())
                .with_context(|| format!("verifier rejected {prog_name}"))?;
            for dev in &cfg.devices {
                let ifindex = sys::netdev::ifindex(dev)?;
                let name = format!(
                    "{}@{dev}",
                    if attach == TcAttachType::Ingress {
                        "tc-ingress"
                    } else {
                        "tc-egress"
                    }
                );
                let current =
                    |link: BorrowedFd<'_>| Ok(sysbpf::netdev_link_ifindex(link)? == ifindex);
                let fd = prog.fd()?.try_clone()?;
                let action = ensure_link(&layout.link(&name), fd.as_fd(), current, || {
                    let id = prog
                        .attach(dev, attach)
                        .with_context(|| format!("attaching {prog_name} to {dev}"))?;
                    Ok(FdLink::try_from(prog.take_link(id)?)?)
                })?;
                info!(hook = %name, action = ?action, "device hook ready");
                hooks.push((name.clone(), action));
                wanted_links.push(name);
            }
        }
        if cfg.acceleration != Acceleration::Disabled {
            let prog: &mut Xdp = ebpf
                .program_mut(XDP)
                .context("xdp program missing")?
                .try_into()?;
            load_retrying(|| prog.load()).context("verifier rejected lb_xdp")?;
            for dev in &cfg.devices {
                let ifindex = sys::netdev::ifindex(dev)?;
                let name = format!("xdp@{dev}");
                if let Some((_, why)) = xdp_unfit.iter().find(|(d, _)| d == dev) {
                    warn!(device = %dev, "no native XDP ({why}): this device uses tc only");
                    hooks.push((name, HookAction::Skipped(why.clone())));
                    continue;
                }
                let current =
                    |link: BorrowedFd<'_>| Ok(sysbpf::netdev_link_ifindex(link)? == ifindex);
                let fd = prog.fd()?.try_clone()?;
                let attached = ensure_link(&layout.link(&name), fd.as_fd(), current, || {
                    let id = prog
                        .attach(dev, XdpMode::Driver)
                        .with_context(|| format!("attaching native XDP to {dev}"))?;
                    Ok(FdLink::try_from(prog.take_link(id)?)?)
                });
                match attached {
                    Ok(action) => {
                        info!(hook = %name, action = ?action, "XDP ready");
                        hooks.push((name.clone(), action));
                        wanted_links.push(name);
                    }
                    Err(e) if cfg.acceleration == Acceleration::BestEffort => {
                        warn!(device = %dev, "no native XDP ({e:#}): this device uses tc only");
                        hooks.push((name, HookAction::Skipped(format!("{e:#}"))));
                    }
                    Err(e) => {
                        return Err(e.context(
                            "--acceleration native: use best-effort or disabled on this device",
                        ))
                    }
                }
            }
        }
    }
    if !cfg.pod_devices.is_none() {
        pods::load_and_pin(&mut ebpf, &layout)?;
        let found = pods::current(&cfg.pod_devices, &cfg.devices)?;
        if found.is_empty() {
            warn!(
                pod_devices = ?cfg.pod_devices,
                "no pod-facing device matches yet: pods' packets to services are translated only once one appears"
            );
        }
        for l in found {
            pods::attach(&cfg.pin_dir, &l.name)?;
            info!(device = %l.name, "pod device served");
            wanted_links.extend(pods::link_names(&l.name));
        }
    }
    // Links of devices (or XDP) no longer configured: detach them.
    if let Ok(entries) = std::fs::read_dir(layout.links_dir()) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !wanted_links.contains(&name) {
                std::fs::remove_file(e.path())?;
                info!(hook = %name, "detached (no longer configured)");
            }
        }
    }
    write_devices(&cfg.pin_dir, &cfg.devices)?;
    Ok(InstallReport {
        hooks,
        maps_reused,
        logger,
    })
}

/// Makes the pinned link at `pin` run the program `prog`: swapped into an
/// existing link that is still `current` (same cgroup / device), else a new
/// link attached first and the old one dropped after, so there is no gap.
/// Loads a program, again if the kernel answers EAGAIN: the verifier gives
/// up with EAGAIN when a signal arrives while it works (kernel/bpf/verifier.c,
/// do_check: signal_pending), which a process with a SIGCHLD handler (tokio's
/// child processes) meets now and then. libbpf retries such loads too
/// (PROG_LOAD_ATTEMPTS, 5 attempts).
pub fn load_retrying(
    mut load: impl FnMut() -> Result<(), aya::programs::ProgramError>,
) -> Result<(), aya::programs::ProgramError> {
    let mut attempts = 1;
    loop {
        match load() {
            Err(aya::programs::ProgramError::LoadError { io_error, .. })
                if io_error.raw_os_error() == Some(libc::EAGAIN) && attempts < 5 =>
            {
                attempts += 1;
            }
            other => return other,
        }
    }
}

pub(crate) fn ensure_link(
    pin: &Path,
    prog: BorrowedFd<'_>,
    current: impl Fn(BorrowedFd<'_>) -> anyhow::Result<bool>,
    attach: impl FnOnce() -> anyhow::Result<FdLink>,
) -> anyhow::Result<HookAction> {
    if pin.exists() {
        let link = sysbpf::obj_get(pin)
            .with_context(|| format!("opening pinned link {}", pin.display()))?;
        if current(link.as_fd())? {
            sysbpf::link_update(link.as_fd(), prog)
                .with_context(|| format!("swapping the program of {}", pin.display()))?;
            return Ok(HookAction::Updated);
        }
        let new = attach()?;
        std::fs::remove_file(pin)?;
        new.pin(pin)
            .with_context(|| format!("pinning {}", pin.display()))?;
        return Ok(HookAction::Moved);
    }
    attach()?
        .pin(pin)
        .with_context(|| format!("pinning {}", pin.display()))?;
    Ok(HookAction::Attached)
}

fn open_cgroup(cgroup: &Path) -> anyhow::Result<File> {
    File::open(cgroup).with_context(|| format!("opening cgroup {}", cgroup.display()))
}

/// LB_DEVICES: ifindex → the device's IPv4 address (the SNAT source), and
/// LB6_DEVICES: ifindex → its global IPv6 address, for the devices of the
/// caller's network namespace. A device without a global IPv6 address gets
/// no LB6_DEVICES entry, and the log says what that means.
pub fn write_devices(pin_dir: &Path, devices: &[String]) -> anyhow::Result<()> {
    let mut map: BpfHashMap<MapData, u32, Device> =
        BpfHashMap::try_from(open_pinned(pin_dir, names::LB_DEVICES)?)?;
    let mut map6: BpfHashMap<MapData, u32, Device6> =
        BpfHashMap::try_from(open_pinned(pin_dir, names::LB6_DEVICES)?)?;
    let mut wanted = Vec::new();
    let mut wanted6 = Vec::new();
    for dev in devices {
        let ifindex = sys::netdev::ifindex(dev)?;
        let v4 = sys::netdev::ipv4_address(dev)?;
        let v6 = sys::netdev::ipv6_address(dev)?;
        if v4.is_none() && v6.is_none() {
            bail!("device {dev} has neither an IPv4 nor a global IPv6 address: SNAT to remote backends needs one (add it, or drop it from --devices)");
        }
        if let Some(addr) = v4 {
            map.insert(
                ifindex,
                Device {
                    address: ip4_to_map(addr),
                    flags: 0,
                },
                0,
            )?;
            wanted.push(ifindex);
        }
        if let Some(addr) = v6 {
            map6.insert(
                ifindex,
                Device6 {
                    address: crate::maps::convert::ip6_to_map(addr),
                },
                0,
            )?;
            wanted6.push(ifindex);
        }
        info!(device = %dev, ifindex, ipv4 = ?v4, ipv6 = ?v6, "external device");
        // A node without IPv6 is common: said, not warned.
        if v4.is_none() {
            warn!(device = %dev, "no IPv4 address: IPv4 NodePort/LoadBalancer flows to backends on other nodes cannot be SNATed out of this device and are dropped (fib-lookup-failed); add one to serve them");
        }
        if v6.is_none() {
            info!(device = %dev, "no global IPv6 address: IPv6 flows to backends on other nodes cannot be SNATed out of this device (dropped as fib-lookup-failed)");
        }
    }
    let stale: Vec<u32> = map
        .keys()
        .filter_map(Result::ok)
        .filter(|k| !wanted.contains(k))
        .collect();
    for k in stale {
        map.remove(&k)?;
    }
    let stale6: Vec<u32> = map6
        .keys()
        .filter_map(Result::ok)
        .filter(|k| !wanted6.contains(k))
        .collect();
    for k in stale6 {
        map6.remove(&k)?;
    }
    Ok(())
}

/// What `uninstall` removed.
#[derive(Clone, Debug, Default)]
pub struct UninstallReport {
    pub links: Vec<String>,
    pub maps: Vec<String>,
}

/// Detaches every hook (by unpinning its link) and removes the pinned maps.
pub fn uninstall(pin_dir: &Path) -> anyhow::Result<UninstallReport> {
    let layout = PinLayout::new(pin_dir);
    let mut report = UninstallReport::default();
    if !pin_dir.exists() {
        return Ok(report);
    }
    if let Ok(entries) = std::fs::read_dir(layout.links_dir()) {
        let mut entries: Vec<_> = entries.flatten().collect();
        entries.sort_by_key(std::fs::DirEntry::file_name);
        for e in entries {
            std::fs::remove_file(e.path())
                .with_context(|| format!("removing {}", e.path().display()))?;
            report
                .links
                .push(e.file_name().to_string_lossy().into_owned());
        }
    }
    for name in crate::maps::catalog::CATALOG.iter().map(|m| m.name) {
        let p = pin_dir.join(name);
        if p.exists() {
            std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
            report.maps.push(name.to_string());
        }
    }
    let _ = std::fs::remove_dir(layout.links_dir());
    if let Ok(entries) = std::fs::read_dir(layout.map("progs")) {
        for e in entries.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
        let _ = std::fs::remove_dir(layout.map("progs"));
    }
    if let Err(e) = std::fs::remove_dir(pin_dir) {
        bail!(
            "{} still holds files we did not create ({e}); left in place",
            pin_dir.display()
        );
    }
    Ok(report)
}

/// A hook as the kernel sees it right now.
#[derive(Clone, Debug, serde::Serialize)]
pub struct HookStatus {
    pub hook: String,
    pub pinned: bool,
    pub link_id: Option<u32>,
    pub prog_id: Option<u32>,
    /// Socket hooks: the cgroup id.
    pub cgroup_id: Option<u64>,
    /// Device hooks: the ifindex.
    pub ifindex: Option<u32>,
}

/// Every pinned link: the socket hooks first, then the device hooks.
pub fn hook_status(pin_dir: &Path) -> Vec<HookStatus> {
    let layout = PinLayout::new(pin_dir);
    let mut out: Vec<HookStatus> = HOOKS
        .iter()
        .map(|hook| {
            let info = sysbpf::obj_get(&layout.link(hook.name))
                .ok()
                .and_then(|fd| sysbpf::cgroup_link_info(fd.as_fd()).ok());
            HookStatus {
                hook: hook.name.to_string(),
                pinned: info.is_some(),
                link_id: info.map(|i| i.link_id),
                prog_id: info.map(|i| i.prog_id),
                cgroup_id: info.map(|i| i.cgroup_id),
                ifindex: None,
            }
        })
        .collect();
    let mut devices: Vec<String> = std::fs::read_dir(layout.links_dir())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains('@'))
        .collect();
    devices.sort();
    for name in devices {
        let fd = sysbpf::obj_get(&layout.link(&name)).ok();
        let info = fd
            .as_ref()
            .and_then(|fd| sysbpf::cgroup_link_info(fd.as_fd()).ok());
        let ifindex = fd
            .as_ref()
            .and_then(|fd| sysbpf::netdev_link_ifindex(fd.as_fd()).ok());
        out.push(HookStatus {
            hook: name,
            pinned: info.is_some(),
            link_id: info.map(|i| i.link_id),
            prog_id: info.map(|i| i.prog_id),
            cgroup_id: None,
            ifindex,
        });
    }
    out
}

/// Programs attached to `cgroup` per hook, ours or not (for checks that no
/// second program got stacked).
pub fn attached_programs(cgroup: &Path) -> anyhow::Result<Vec<(&'static str, Vec<u32>)>> {
    let dir = File::open(cgroup).with_context(|| format!("opening {}", cgroup.display()))?;
    HOOKS
        .iter()
        .map(|h| Ok((h.name, sysbpf::cgroup_prog_ids(dir.as_fd(), h.attach_type)?)))
        .collect()
}
