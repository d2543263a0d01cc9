//! The node's cgroup subtree, made and removed in every hierarchy (hybrid
//! cgroups: the v1 controllers and the unified cgroup2 one,
//! docs/testbed.md).
use std::path::{Path, PathBuf};

/// Every cgroup hierarchy mounted under /sys/fs/cgroup (v1 controllers,
/// name=systemd and the unified cgroup2 one).
pub(super) fn hierarchies() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let p = e.path();
        if p.join("cgroup.procs").exists() {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// Makes `rel` (e.g. `lbtest-node-x/runtime`) in every hierarchy; a new v1
/// cpuset is empty and takes no tasks until it has CPUs and memory nodes.
pub(super) fn make_cgroup(rel: &str) {
    for h in hierarchies() {
        let mut path = h.clone();
        for part in Path::new(rel).components() {
            let parent = path.clone();
            path = path.join(part);
            if !path.exists() {
                std::fs::create_dir(&path)
                    .unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
            }
            for f in ["cpuset.cpus", "cpuset.mems"] {
                if path.join(f).exists()
                    && std::fs::read_to_string(path.join(f))
                        .unwrap_or_default()
                        .trim()
                        .is_empty()
                {
                    let v = std::fs::read_to_string(parent.join(f)).unwrap();
                    std::fs::write(path.join(f), v.trim()).unwrap();
                }
            }
        }
    }
}

/// Every process in the subtree `rel` of the cgroup2 hierarchy.
pub(super) fn cgroup_pids(rel: &str) -> Vec<i32> {
    fn walk(dir: &Path, out: &mut Vec<i32>) {
        if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), out);
                }
            }
        }
    }
    let mut out = Vec::new();
    for h in hierarchies() {
        walk(&h.join(rel), &mut out);
    }
    out.sort();
    out.dedup();
    out
}

/// Removes the subtree `rel` from every hierarchy, leaves first.
pub(super) fn remove_cgroup(rel: &str) {
    fn rmdirs(dir: &Path) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    rmdirs(&e.path());
                }
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
    for h in hierarchies() {
        rmdirs(&h.join(rel));
    }
}
