//! `lbctl status`: what the kernel offers and what is installed, so an
//! operator sees at once what is missing.
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::{datapath, maps::bpf, sys};

#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct HookRow {
    pub hook: String,
    pub attached: bool,
    pub link_id: Option<u32>,
    pub prog_id: Option<u32>,
    pub cgroup: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MapRow {
    pub map: &'static str,
    pub entries: Option<usize>,
    pub capacity: Option<u32>,
    /// Kernel memory in bytes (`bpf::memory`): with `--preallocate-maps`
    /// the services, backends and reverse-NAT maps show their whole capacity.
    pub memory: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Status {
    pub version: &'static str,
    pub kernel: String,
    pub checks: Vec<Check>,
    pub hooks: Vec<HookRow>,
    pub maps: Vec<MapRow>,
    /// Services the agent could not apply (from its status file).
    pub refused: Vec<crate::agent::worker::RefusedService>,
    /// The Maglev seed's fingerprint (from the status file; None before
    /// the agent wrote one).
    pub maglev_seed: Option<String>,
}

impl Status {
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "?".into(), |s| s.trim().to_string())
}

/// Finds the cgroup directory with this id (inode) under the cgroup2 mount.
fn cgroup_path(root: &Path, id: u64, depth: usize) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt as _;
    if std::fs::metadata(root).ok()?.ino() == id {
        return Some(root.to_path_buf());
    }
    if depth == 0 {
        return None;
    }
    for e in std::fs::read_dir(root).ok()?.flatten() {
        if e.file_type().ok()?.is_dir() {
            if let Some(p) = cgroup_path(&e.path(), id, depth - 1) {
                return Some(p);
            }
        }
    }
    None
}

pub fn gather(pin_dir: &Path) -> Status {
    let mut checks = Vec::new();
    let cgroup2 = sys::fs::cgroup2_mount();
    checks.push(Check {
        name: "cgroup2",
        ok: cgroup2.is_ok(),
        detail: match &cgroup2 {
            Ok(p) => format!("mounted at {}", p.display()),
            Err(e) => format!("{e:#}"),
        },
    });
    let bpffs = std::fs::read_to_string("/proc/mounts").is_ok_and(|m| {
        m.lines()
            .any(|l| l.split_whitespace().nth(2) == Some("bpf"))
    });
    checks.push(Check {
        name: "bpffs",
        ok: bpffs,
        detail: if bpffs {
            "mounted".into()
        } else {
            "not mounted: mount -t bpf bpf /sys/fs/bpf".into()
        },
    });
    let btf = Path::new("/sys/kernel/btf/vmlinux").exists();
    checks.push(Check {
        name: "btf",
        ok: btf,
        detail: if btf {
            "/sys/kernel/btf/vmlinux".into()
        } else {
            "no /sys/kernel/btf/vmlinux: the kernel lacks CONFIG_DEBUG_INFO_BTF".into()
        },
    });
    let installed = pin_dir.join(lb_common::maps::LB4_SERVICES).exists();
    checks.push(Check {
        name: "datapath",
        ok: installed,
        detail: if installed {
            format!("installed at {}", pin_dir.display())
        } else {
            format!(
                "nothing pinned at {}: the agent has not installed the data path there (start lb-agent, or pass --pin-dir)",
                pin_dir.display()
            )
        },
    });

    let hooks = datapath::hook_status(pin_dir)
        .into_iter()
        .map(|h| HookRow {
            hook: h.hook,
            attached: h.pinned,
            link_id: h.link_id,
            prog_id: h.prog_id,
            cgroup: match (h.cgroup_id, h.ifindex) {
                (Some(id), _) => Some(
                    cgroup2
                        .as_ref()
                        .ok()
                        .and_then(|root| cgroup_path(root, id, 4))
                        .map_or_else(|| format!("cgroup id {id}"), |p| p.display().to_string()),
                ),
                (None, Some(ifindex)) => Some(format!("ifindex {ifindex}")),
                _ => None,
            },
        })
        .collect::<Vec<_>>();
    if installed {
        let missing: Vec<&str> = hooks
            .iter()
            .filter(|h| !h.attached)
            .map(|h| h.hook.as_str())
            .collect();
        checks.push(Check {
            name: "hooks",
            ok: missing.is_empty(),
            detail: if missing.is_empty() {
                format!("{} attached", hooks.len())
            } else {
                format!(
                    "not attached: {} (restart lb-agent to re-attach)",
                    missing.join(", ")
                )
            },
        });
    }

    let maps = if installed {
        crate::maps::catalog::CATALOG
            .iter()
            .map(|m| m.name)
            .map(|name| MapRow {
                map: name,
                entries: if name == lb_common::maps::LB_SOCK_TCP {
                    bpf::count_tcp_table(pin_dir).ok()
                } else {
                    bpf::count_entries(pin_dir, name).ok().flatten()
                },
                capacity: bpf::max_entries(pin_dir, name).ok(),
                memory: bpf::memory(pin_dir, name).ok(),
            })
            .collect()
    } else {
        Vec::new()
    };
    let agent = std::fs::read(crate::agent::status_file(pin_dir))
        .ok()
        .and_then(|b| serde_json::from_slice::<crate::agent::worker::AgentStatus>(&b).ok());
    let maglev_seed = agent
        .as_ref()
        .map(|s| s.maglev_seed.clone())
        .filter(|s| !s.is_empty());
    let refused = agent.map(|s| s.refused).unwrap_or_default();
    Status {
        version: env!("CARGO_PKG_VERSION"),
        kernel: kernel_release(),
        checks,
        hooks,
        maps,
        refused,
        maglev_seed,
    }
}

/// 1536 → "1.5 KiB", 37755168 → "36.0 MiB".
fn human_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / (1024.0 * 1024.0))
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{bytes} B")
    }
}

pub fn render_table(s: &Status) -> String {
    let mut out = format!("Version:   lbctl {}\nKernel:    {}\n", s.version, s.kernel);
    if let Some(seed) = &s.maglev_seed {
        out.push_str(&format!("Maglev:    seed {seed}\n"));
    }
    out.push('\n');
    let mut t = vec![["Check".to_string(), "State".into(), "Detail".into()]];
    for c in &s.checks {
        t.push([
            c.name.to_string(),
            if c.ok { "ok" } else { "MISSING" }.to_string(),
            c.detail.clone(),
        ]);
    }
    out.push_str(&super::align(&t));
    if s.hooks.iter().any(|h| h.attached) {
        let mut t = vec![[
            "Hook".to_string(),
            "Link".into(),
            "Program".into(),
            "Attached to".into(),
        ]];
        for h in &s.hooks {
            let opt = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
            t.push([
                h.hook.clone(),
                opt(h.link_id),
                opt(h.prog_id),
                h.cgroup.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        out.push('\n');
        out.push_str(&super::align(&t));
    }
    if !s.maps.is_empty() {
        let mut t = vec![[
            "Map".to_string(),
            "Entries".into(),
            "Capacity".into(),
            "Fill".into(),
            "Memory".into(),
        ]];
        for m in &s.maps {
            let fill = match (m.entries, m.capacity) {
                (Some(e), Some(c)) if c > 0 => format!("{:.1}%", e as f64 * 100.0 / f64::from(c)),
                _ => "-".into(),
            };
            t.push([
                m.map.to_string(),
                m.entries.map_or("-".into(), |e| e.to_string()),
                m.capacity.map_or("-".into(), |c| c.to_string()),
                fill,
                m.memory.map_or("-".into(), human_bytes),
            ]);
        }
        out.push('\n');
        out.push_str(&super::align(&t));
    }
    if !s.refused.is_empty() {
        let mut t = vec![["Refused service".to_string(), "Why".into()]];
        for r in &s.refused {
            t.push([r.service.clone(), r.error.clone()]);
        }
        out.push('\n');
        out.push_str(&super::align(&t));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_golden_output() {
        let s = Status {
            refused: Vec::new(),
            maglev_seed: None,
            version: "0.1.0",
            kernel: "6.18.0".into(),
            checks: vec![
                Check {
                    name: "cgroup2",
                    ok: true,
                    detail: "mounted at /sys/fs/cgroup".into(),
                },
                Check {
                    name: "datapath",
                    ok: false,
                    detail: "nothing pinned at /x".into(),
                },
            ],
            hooks: vec![HookRow {
                hook: "connect4".into(),
                attached: true,
                link_id: Some(7),
                prog_id: Some(42),
                cgroup: Some("/sys/fs/cgroup/a".into()),
            }],
            maps: vec![
                MapRow {
                    map: "LB4_SERVICES",
                    entries: Some(10),
                    capacity: Some(400),
                    memory: Some(6_816_832),
                },
                MapRow {
                    map: "LB_EVENTS",
                    entries: None,
                    capacity: Some(262144),
                    memory: None,
                },
            ],
        };
        let golden = "\
Version:   lbctl 0.1.0
Kernel:    6.18.0

Check      State     Detail
cgroup2    ok        mounted at /sys/fs/cgroup
datapath   MISSING   nothing pinned at /x

Hook       Link   Program   Attached to
connect4   7      42        /sys/fs/cgroup/a

Map            Entries   Capacity   Fill   Memory
LB4_SERVICES   10        400        2.5%   6.5 MiB
LB_EVENTS      -         262144     -      -
";
        assert_eq!(render_table(&s), golden, "\n{}", render_table(&s));
    }
}
