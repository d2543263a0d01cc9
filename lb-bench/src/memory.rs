//! What the agent and its maps cost in memory.
use std::{
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
};

#[derive(Clone, Debug, Default)]
pub struct Memory {
    pub services: usize,
    pub agent_rss_kib: u64,
    /// Sum of the kernel's own accounting (`memlock:` in each map's fdinfo).
    pub maps_bytes: u64,
    /// The largest maps: (name, bytes, max_entries).
    pub biggest: Vec<(String, u64, u32)>,
}

/// VmRSS of a process, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Every map pinned directly in `pin_dir`, with its memlock bytes.
pub fn maps(pin_dir: &Path) -> Vec<(String, u64, u32)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(pin_dir) else {
        return out;
    };
    for e in entries.flatten() {
        let path = e.path();
        if !path.is_file() {
            continue;
        }
        let Ok(map) = aya::maps::MapData::from_pin(&path) else {
            continue;
        };
        let fd = map.fd().as_fd().as_raw_fd();
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap_or_default();
        let field = |name: &str| -> u64 {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        out.push((
            e.file_name().to_string_lossy().into_owned(),
            field("memlock:"),
            field("max_entries:") as u32,
        ));
    }
    out.sort_by(|a, b| b.1.cmp(&a.1));
    out
}

pub fn measure(services: usize, pid: u32, pin_dir: &Path) -> Memory {
    let maps = maps(pin_dir);
    Memory {
        services,
        agent_rss_kib: rss_kib(pid),
        maps_bytes: maps.iter().map(|m| m.1).sum(),
        biggest: maps.into_iter().take(4).collect(),
    }
}
