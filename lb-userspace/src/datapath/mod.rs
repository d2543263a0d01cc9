//! Installing the data path: load the eBPF object, reuse or create the pinned
//! maps, attach every socket hook to the cgroup through a pinned BPF link, or
//! swap the new program into the existing link. And the reverse: uninstall.
pub mod config;
pub mod pins;

use std::{
    fs::File,
    os::fd::AsFd as _,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _};
use aya::{
    programs::{links::FdLink, CgroupAttachMode, CgroupSockAddr},
    EbpfLoader,
};
use lb_common::maps as names;
use tracing::{info, warn};

pub use pins::{MapSizes, PinLayout};

use crate::sys::{self, bpf as sysbpf};

/// The eBPF object, built by build.rs (aya-build) for bpfel-unknown-none.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb-ebpf"));

/// One socket hook: program name in the object and kernel attach type.
#[derive(Clone, Copy, Debug)]
pub struct Hook {
    pub name: &'static str,
    pub program: &'static str,
    pub attach_type: u32,
}

pub const HOOKS: [Hook; 8] = [
    Hook { name: "connect4", program: "lb_connect4", attach_type: sysbpf::BPF_CGROUP_INET4_CONNECT },
    Hook { name: "sendmsg4", program: "lb_sendmsg4", attach_type: sysbpf::BPF_CGROUP_UDP4_SENDMSG },
    Hook { name: "recvmsg4", program: "lb_recvmsg4", attach_type: sysbpf::BPF_CGROUP_UDP4_RECVMSG },
    Hook { name: "getpeername4", program: "lb_getpeername4", attach_type: sysbpf::BPF_CGROUP_INET4_GETPEERNAME },
    Hook { name: "connect6", program: "lb_connect6", attach_type: sysbpf::BPF_CGROUP_INET6_CONNECT },
    Hook { name: "sendmsg6", program: "lb_sendmsg6", attach_type: sysbpf::BPF_CGROUP_UDP6_SENDMSG },
    Hook { name: "recvmsg6", program: "lb_recvmsg6", attach_type: sysbpf::BPF_CGROUP_UDP6_RECVMSG },
    Hook { name: "getpeername6", program: "lb_getpeername6", attach_type: sysbpf::BPF_CGROUP_INET6_GETPEERNAME },
];

#[derive(Clone, Debug)]
pub struct DatapathConfig {
    pub pin_dir: PathBuf,
    pub cgroup: PathBuf,
    pub sizes: MapSizes,
}

/// What `install` did with each hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookAction {
    /// No link was pinned: attached and pinned a new one.
    Attached,
    /// A pinned link existed: the new program was swapped into it.
    Updated,
    /// A pinned link existed on another cgroup: moved to the configured one.
    Moved { from_cgroup_id: u64 },
}

pub struct InstallReport {
    pub hooks: Vec<(Hook, HookAction)>,
    pub maps_reused: bool,
    /// Reads the programs' aya-log records (AYA_LOGS); poll it to forward
    /// them to the `log` crate. None if the object has no log map.
    pub logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
}

/// Loads the programs and makes every hook run them on `cfg.cgroup`, reusing
/// pinned maps and links. Idempotent: running it again (an agent restart or
/// upgrade) stacks nothing and keeps every map entry.
pub fn install(cfg: &DatapathConfig) -> anyhow::Result<InstallReport> {
    let layout = PinLayout::new(&cfg.pin_dir);
    sys::fs::ensure_pin_dir(&cfg.pin_dir)?;
    sys::fs::check_cgroup2(&cfg.cgroup)?;
    let maps_reused = layout.check_pinned_maps(&cfg.sizes)?;

    let mut loader = EbpfLoader::new();
    loader.default_map_pin_directory(&cfg.pin_dir);
    for (name, size) in cfg.sizes.entries() {
        loader.map_max_entries(name, size);
    }
    let mut ebpf = loader.load(EBPF_OBJECT).context("loading the eBPF object (is this kernel new enough? see README requirements)")?;
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
        let prog: &mut CgroupSockAddr = ebpf
            .program_mut(hook.program)
            .with_context(|| format!("program {} missing from the object", hook.program))?
            .try_into()?;
        prog.load().with_context(|| format!("verifier rejected {}", hook.program))?;
        let link_pin = layout.link(hook.name);
        let action = if link_pin.exists() {
            let link = sysbpf::obj_get(&link_pin).with_context(|| format!("opening pinned link {}", link_pin.display()))?;
            let linfo = sysbpf::cgroup_link_info(link.as_fd())?;
            if linfo.cgroup_id == cgroup_id {
                sysbpf::link_update(link.as_fd(), prog.fd()?.as_fd())
                    .with_context(|| format!("swapping the program of link {}", link_pin.display()))?;
                HookAction::Updated
            } else {
                // Attach on the new cgroup first, then drop the old link: no gap.
                let fd_link = attach(prog, &cfg.cgroup)?;
                std::fs::remove_file(&link_pin)?;
                fd_link.pin(&link_pin).with_context(|| format!("pinning {}", link_pin.display()))?;
                warn!(hook = hook.name, from_cgroup_id = linfo.cgroup_id, to = %cfg.cgroup.display(), "moved hook to another cgroup");
                HookAction::Moved { from_cgroup_id: linfo.cgroup_id }
            }
        } else {
            let fd_link = attach(prog, &cfg.cgroup)?;
            fd_link.pin(&link_pin).with_context(|| format!("pinning {}", link_pin.display()))?;
            HookAction::Attached
        };
        info!(hook = hook.name, action = ?action, cgroup = %cfg.cgroup.display(), "hook ready");
        hooks.push((hook, action));
    }
    Ok(InstallReport { hooks, maps_reused, logger })
}

fn attach(prog: &mut CgroupSockAddr, cgroup: &Path) -> anyhow::Result<FdLink> {
    let file = File::open(cgroup).with_context(|| format!("opening cgroup {}", cgroup.display()))?;
    let id = prog.attach(file, CgroupAttachMode::Single).context("attaching to the cgroup")?;
    let link = prog.take_link(id)?;
    Ok(FdLink::try_from(link)?)
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
    for hook in HOOKS {
        let p = layout.link(hook.name);
        if p.exists() {
            std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
            report.links.push(hook.name.to_string());
        }
    }
    for name in names::ALL {
        let p = pin_dir.join(name);
        if p.exists() {
            std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
            report.maps.push(name.to_string());
        }
    }
    let _ = std::fs::remove_dir(layout.links_dir());
    if let Err(e) = std::fs::remove_dir(pin_dir) {
        bail!("{} still holds files we did not create ({e}); left in place", pin_dir.display());
    }
    Ok(report)
}

/// A hook as the kernel sees it right now.
#[derive(Clone, Debug, serde::Serialize)]
pub struct HookStatus {
    pub hook: &'static str,
    pub pinned: bool,
    pub link_id: Option<u32>,
    pub prog_id: Option<u32>,
    pub cgroup_id: Option<u64>,
}

pub fn hook_status(pin_dir: &Path) -> Vec<HookStatus> {
    let layout = PinLayout::new(pin_dir);
    HOOKS
        .iter()
        .map(|hook| {
            let info = sysbpf::obj_get(&layout.link(hook.name))
                .ok()
                .and_then(|fd| sysbpf::cgroup_link_info(fd.as_fd()).ok());
            HookStatus {
                hook: hook.name,
                pinned: info.is_some(),
                link_id: info.map(|i| i.link_id),
                prog_id: info.map(|i| i.prog_id),
                cgroup_id: info.map(|i| i.cgroup_id),
            }
        })
        .collect()
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
