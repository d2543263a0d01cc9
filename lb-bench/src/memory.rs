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
    out.sort_by_key(|e| std::cmp::Reverse(e.1));
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

/// Counts the bench process's live heap bytes, so the breakdown below can
/// say which structure holds what (RSS cannot: it mixes the heap with free
/// pages not yet returned and with the binary).
pub struct CountingAlloc;

static LIVE: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);
static PEAK: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);
/// Live allocations: each costs the allocator a header and rounding beside
/// its bytes (glibc: 8 B and a 16 B multiple, at least 32 B a block), which
/// RSS shows and `LIVE` does not.
static BLOCKS: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; the counters
// are plain atomics and allocate nothing.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's layout, passed on as is.
        let p = unsafe { std::alloc::System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size() as isize, Relaxed) + l.size() as isize;
            PEAK.fetch_max(now, Relaxed);
            BLOCKS.fetch_add(1, Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        LIVE.fetch_sub(l.size() as isize, Relaxed);
        BLOCKS.fetch_sub(1, Relaxed);
        // SAFETY: `p` and `l` come from our alloc, which is System's.
        unsafe { std::alloc::System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        // SAFETY: `p` and `l` come from our alloc, which is System's.
        let q = unsafe { std::alloc::System.realloc(p, l, new) };
        if !q.is_null() {
            let now = LIVE.fetch_add(new as isize - l.size() as isize, Relaxed) + new as isize
                - l.size() as isize;
            PEAK.fetch_max(now, Relaxed);
        }
        q
    }
}

use std::sync::atomic::Ordering::Relaxed;

pub fn live() -> isize {
    LIVE.load(Relaxed)
}

/// Live heap allocations (blocks).
pub fn blocks() -> isize {
    BLOCKS.load(Relaxed)
}

/// Live heap bytes of the agent's long-lived structures after a standalone
/// start: the services file parsed (as the agent does) and reconciled into
/// maps that keep nothing, so only the reconciler's own state remains.
#[derive(Clone, Debug, Default)]
pub struct Breakdown {
    pub services: usize,
    pub backends: usize,
    pub parse_peak: u64,
    /// The target model (names, frontends, backends).
    pub model: u64,
    /// The mirror of the maps (entries and their indexes).
    pub mirror: u64,
    /// Ids, owners and the rest of the reconciler.
    pub indexes: u64,
    pub total: u64,
}

/// Maps that keep nothing: what remains is the reconciler's own state.
pub struct NullMaps;
impl lb::maps::LbMaps for NullMaps {
    fn apply(&mut self, _: &lb::maps::MapOp) -> Result<(), lb::maps::MapWriteError> {
        Ok(())
    }
    fn dump(&self) -> anyhow::Result<lb::maps::MapState> {
        Ok(Default::default())
    }
    fn capacity(&self) -> lb::maps::MapSizes {
        lb::maps::MapSizes {
            services: u32::MAX,
            backends: u32::MAX,
            maglev: u32::MAX,
            source_ranges: u32::MAX,
            ..Default::default()
        }
    }
}

pub fn breakdown(services: usize, endpoints: usize) -> Breakdown {
    let text = crate::workload::Workload::new(services, endpoints, &[]).services_yaml();
    let before = live();
    PEAK.store(before, Relaxed);
    let model = lb::source::file::parse::parse_with(&text, &Default::default())
        .expect("bench services file");
    let parse_peak = (PEAK.load(Relaxed) - before) as u64;
    drop(text);
    let start = live();
    let mut r = lb::reconcile::Reconciler::restore(NullMaps).expect("null maps");
    r.reconcile_model(model).expect("reconcile into null maps");
    let total = (live() - start) as u64;
    // Measured as copies: a copy is as big as the original, give or take
    // the spare capacity of its tables (the names are shared, so the model
    // is measured from an empty one).
    let b = live();
    let mirror = r.state().clone();
    let mirror_bytes = (live() - b) as u64;
    drop(mirror);
    let b = live();
    let mut m = lb::model::Model::default();
    for (name, svc) in &r.target().services {
        m.services.insert(
            lb::model::ServiceName::new(name.namespace(), name.name()),
            svc.clone(),
        );
    }
    let model_bytes = (live() - b) as u64;
    drop(m);
    Breakdown {
        services,
        backends: services * endpoints,
        parse_peak,
        model: model_bytes,
        mirror: mirror_bytes,
        indexes: total.saturating_sub(model_bytes + mirror_bytes),
        total,
    }
}
