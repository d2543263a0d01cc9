//! The packet path for pods: tc on the pod-facing devices (the host ends of
//! pods' veths), so a pod whose sockets socket LB leaves alone
//! (`--socket-lb-host-namespace-only`, for service meshes) still reaches
//! ClusterIPs and every other frontend, as kube-proxy gives it in
//! PREROUTING and Cilium in bpf_lxc.
//!
//! Pods come and go: the programs are pinned once (`progs/`), attached to
//! every matching device at start, and a watcher on rtnetlink attaches them
//! to each new device as it appears (and forgets the links of devices that
//! went). Each attachment is a pinned tcx link, `tc-pod-ingress@DEV` and
//! `tc-pod-egress@DEV`, like the external devices'.
use std::{
    os::fd::AsFd as _,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};

use anyhow::Context as _;
use aya::{
    programs::{links::FdLink, SchedClassifier, TcAttachType},
    Ebpf,
};
use tracing::{info, warn};

use super::{ensure_link, PinLayout};
use crate::sys::{
    self, bpf as sysbpf,
    netlink::{Link, LinkEvent, LinkWatch},
};

pub const TC_POD_INGRESS: &str = "lb_tc_pod_ingress";
pub const TC_POD_EGRESS: &str = "lb_tc_pod_egress";

/// Which devices face pods.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PodDevices {
    /// None: pods are served by socket LB alone.
    #[default]
    None,
    /// Every veth of the node that is not an external device: the host ends
    /// of pods' veths, whatever the CNI names them.
    Auto,
    /// Names, or prefixes ending in `*` (`veth*`, `lxc*`, `cali*`).
    Patterns(Vec<String>),
}

impl std::str::FromStr for PodDevices {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "" | "none" => Ok(PodDevices::None),
            "auto" => Ok(PodDevices::Auto),
            list => {
                let pats: Vec<String> = list
                    .split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(str::to_string)
                    .collect();
                if let Some(bad) = pats.iter().find(|p| p[..p.len() - 1].contains('*')) {
                    return Err(format!(
                        "{bad}: a pattern is a name or a prefix ending in *, e.g. veth* or cali*"
                    ));
                }
                Ok(PodDevices::Patterns(pats))
            }
        }
    }
}

impl PodDevices {
    pub fn is_none(&self) -> bool {
        *self == PodDevices::None
    }

    /// Whether `link` faces pods. `external`: the `--devices`, never pods'.
    pub fn matches(&self, link: &Link, external: &[String]) -> bool {
        if external.contains(&link.name) || link.name == "lo" {
            return false;
        }
        match self {
            PodDevices::None => false,
            PodDevices::Auto => link.kind == "veth",
            PodDevices::Patterns(p) => p.iter().any(|pat| match pat.strip_suffix('*') {
                Some(prefix) => link.name.starts_with(prefix),
                None => link.name == *pat,
            }),
        }
    }
}

fn prog_pin(layout: &PinLayout, name: &str) -> PathBuf {
    layout.map("progs").join(name)
}

/// Loads the pod programs and pins them (replacing an older build's), so
/// devices that appear later can be given them.
pub fn load_and_pin(ebpf: &mut Ebpf, layout: &PinLayout) -> anyhow::Result<()> {
    std::fs::create_dir_all(layout.map("progs"))?;
    for name in [TC_POD_INGRESS, TC_POD_EGRESS] {
        let prog: &mut SchedClassifier = ebpf
            .program_mut(name)
            .with_context(|| format!("{name} missing from the object"))?
            .try_into()?;
        super::load_retrying(|| prog.load())
            .with_context(|| format!("verifier rejected {name}"))?;
        let pin = prog_pin(layout, name);
        let _ = std::fs::remove_file(&pin);
        prog.pin(&pin)
            .with_context(|| format!("pinning {}", pin.display()))?;
    }
    Ok(())
}

/// The link pin names of a pod device.
pub fn link_names(dev: &str) -> [String; 2] {
    [
        format!("tc-pod-ingress@{dev}"),
        format!("tc-pod-egress@{dev}"),
    ]
}

/// Gives `dev` the pod programs (from their pins); a link already there is
/// swapped to the current programs.
pub fn attach(pin_dir: &Path, dev: &str) -> anyhow::Result<()> {
    let layout = PinLayout::new(pin_dir);
    let ifindex = sys::netdev::ifindex(dev)?;
    for ((name, attach_type), link) in [
        (TC_POD_INGRESS, TcAttachType::Ingress),
        (TC_POD_EGRESS, TcAttachType::Egress),
    ]
    .into_iter()
    .zip(link_names(dev))
    {
        let mut prog = SchedClassifier::from_pin(prog_pin(&layout, name))
            .with_context(|| format!("opening the pinned {name}"))?;
        let current =
            |l: std::os::fd::BorrowedFd<'_>| Ok(sysbpf::netdev_link_ifindex(l)? == ifindex);
        let fd = prog.fd()?.try_clone()?;
        ensure_link(&layout.link(&link), fd.as_fd(), current, || {
            let id = prog
                .attach(dev, attach_type)
                .with_context(|| format!("attaching {name} to {dev}"))?;
            Ok(FdLink::try_from(prog.take_link(id)?)?)
        })?;
    }
    Ok(())
}

/// Forgets the links of a device that went (the kernel detached them).
pub fn forget(pin_dir: &Path, dev: &str) {
    let layout = PinLayout::new(pin_dir);
    for l in link_names(dev) {
        let _ = std::fs::remove_file(layout.link(&l));
    }
}

/// The pod-facing devices there now.
pub fn current(devices: &PodDevices, external: &[String]) -> anyhow::Result<Vec<Link>> {
    Ok(sys::netlink::links()
        .context("listing network devices (rtnetlink)")?
        .into_iter()
        .filter(|l| devices.matches(l, external))
        .collect())
}

/// Follows devices as they appear and go, on a thread of its own, until
/// `stop` is set. Opened before it returns, so no device made after the
/// call is missed.
pub fn watch(
    pin_dir: PathBuf,
    devices: PodDevices,
    external: Vec<String>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let mut w = LinkWatch::open().context("subscribing to rtnetlink link events")?;
    // Devices made between the install and the subscription.
    for l in current(&devices, &external)? {
        if let Err(e) = attach(&pin_dir, &l.name) {
            warn!(device = %l.name, "pod device: {e:#}");
        }
    }
    Ok(std::thread::Builder::new()
        .name("pod-devices".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let events = match w.next_events() {
                    Ok(e) => e,
                    Err(e) => {
                        warn!("rtnetlink: {e}; pod devices made from now on are not served");
                        return;
                    }
                };
                for ev in events {
                    match ev {
                        LinkEvent::New(l) if devices.matches(&l, &external) => {
                            // RTM_NEWLINK also reports changes (up/down): the
                            // attach is idempotent.
                            match attach(&pin_dir, &l.name) {
                                Ok(()) => info!(device = %l.name, "pod device served"),
                                Err(e) => warn!(device = %l.name, "pod device: {e:#}"),
                            }
                        }
                        LinkEvent::Gone(l) if devices.matches(&l, &external) => {
                            forget(&pin_dir, &l.name);
                            info!(device = %l.name, "pod device gone");
                        }
                        _ => {}
                    }
                }
            }
        })?)
}
