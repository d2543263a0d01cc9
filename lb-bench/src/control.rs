//! The control plane: putting N services × 10 endpoints into the data path
//! (full sync), then one endpoint of one service replaced (a pod of a
//! rolling update), side by side with kube-proxy's two layouts.
//!
//! Ours is timed inside the agent's own pipeline, on real pinned maps: the
//! reconciler takes the model (full sync) or the one changed service (what
//! the Kubernetes source hands it), computes the desired entries, diffs them
//! against its mirror of the maps and writes the difference. kube-proxy's
//! are timed as it pays them: iptables-restore / nft -f from spawn to exit
//! (kube-proxy also builds the text first; that part is not counted).
use std::time::{Duration, Instant};

use lb::{
    datapath::{self, MapSizes},
    maps::{bpf::BpfMaps, LbMaps, MapOp, MapState, MapWriteError},
    model::{FrontendKind, ServiceName},
    reconcile::{Reconciler, FROM_SERVICES},
};
use lb_testkit::{agent::PinDir, netns::Netns, unique};

use crate::{
    kube_proxy::{self, timed_in_netns},
    profile::Profile,
    stats::median,
    workload::{map_size as size, replacement, service, Workload},
};

pub const ENDPOINTS: usize = 10;

#[derive(Clone, Debug)]
pub struct ControlResult {
    pub services: usize,
    /// As the agent does it: pipelined (a writer thread makes the writes
    /// while the next services are computed), maps not preallocated.
    pub lb_full: Duration,
    /// The same, everything on one thread (the writes in between).
    pub lb_full_serial: Duration,
    /// Pipelined into preallocated maps (`--preallocate-maps`).
    pub lb_full_preallocated: Duration,
    pub lb_full_writes: usize,
    /// The same full sync writing nowhere: the share of the time that is
    /// our own computation rather than bpf(2) calls.
    pub lb_full_in_memory: Duration,
    pub lb_change: Duration,
    pub lb_change_writes: usize,
    pub iptables_full: Option<Duration>,
    pub iptables_change: Option<Duration>,
    pub nftables_full: Option<Duration>,
    pub nftables_change: Option<Duration>,
}

/// Maps that accept every write and keep nothing (the reconciler keeps its
/// own mirror): what is left of a full sync is our computation.
struct NullMaps;

impl LbMaps for NullMaps {
    fn apply(&mut self, _: &MapOp) -> Result<(), MapWriteError> {
        Ok(())
    }
    fn dump(&self) -> anyhow::Result<MapState> {
        Ok(MapState::default())
    }
    fn capacity(&self) -> MapSizes {
        let big = u32::MAX / 2;
        MapSizes {
            services: big,
            backends: big,
            maglev: big,
            source_ranges: big,
            ..MapSizes::default()
        }
    }
}

pub fn run(p: &Profile) -> Vec<ControlResult> {
    p.control_services
        .iter()
        .map(|&n| one_scale(p, n))
        .collect()
}

fn one_scale(p: &Profile, n: usize) -> ControlResult {
    eprintln!("lb-bench: control plane at {n} services x {ENDPOINTS} endpoints");
    let tag = unique(&format!("bench-cp{n}"));
    let w = Workload::new(n, ENDPOINTS, &[]);
    let changed = w.last().clone();

    // Ours: real maps, sized for the load.
    let pins = PinDir::create(&tag);
    let sizes = MapSizes {
        services: size(n * (ENDPOINTS + 2) + 16),
        backends: size(n * ENDPOINTS + 16),
        ..MapSizes::default()
    };
    let (_ebpf, _) = datapath::load(&pins.path, &sizes).expect("loading the object");
    let mut r = Reconciler::restore(BpfMaps::open(&pins.path).unwrap()).unwrap();
    let model = w.model(FrontendKind::ClusterIP);
    let stats = r.reconcile(&model).expect("full sync");
    let (lb_full, lb_full_writes) = (stats.duration, stats.ops);
    let name = ServiceName::new("default", &changed.name);
    let mut lb_times = Vec::new();
    let mut lb_change_writes = 0;
    for i in 0..p.change_repeats {
        let next = replacement(&changed, i % 2 == 0);
        let t = Instant::now();
        let s = r
            .reconcile_changes([(name.clone(), Some(service(&next, FrontendKind::ClusterIP)))])
            .expect("one change");
        lb_times.push(t.elapsed());
        lb_change_writes = s.ops;
    }
    drop(r);
    drop(pins);
    let lb_full_serial = full_sync_alone(&tag, "serial", &sizes, &model, usize::MAX);
    let preallocated = MapSizes {
        preallocate: true,
        ..sizes
    };
    let lb_full_preallocated =
        full_sync_alone(&tag, "prealloc", &preallocated, &model, FROM_SERVICES);
    let mut null = Reconciler::restore(NullMaps).unwrap();
    let lb_full_in_memory = null
        .reconcile(&model)
        .expect("in-memory full sync")
        .duration;
    drop(null);
    let kube_proxy = n <= p.kube_proxy_control_max;

    // kube-proxy, iptables mode.
    let ipt = Netns::create(&format!("lbt-{tag}-ipt"));
    // A layout that does not load is a bug of the bench: fail loudly.
    let iptables_full = kube_proxy.then(|| {
        timed_in_netns(
            &ipt.name,
            "iptables-legacy-restore",
            &[],
            &kube_proxy::iptables::full(&w.services),
        )
        .unwrap_or_else(|e| panic!("iptables full sync at {n}: {e:#}"))
    });
    let mut ipt_times = Vec::new();
    if iptables_full.is_some() {
        for i in 0..p.change_repeats {
            let (before, after) = (
                replacement(&changed, i % 2 == 1),
                replacement(&changed, i % 2 == 0),
            );
            let text = kube_proxy::iptables::one_endpoint_changed(&w.services, &before, &after);
            ipt_times.push(
                timed_in_netns(&ipt.name, "iptables-legacy-restore", &["--noflush"], &text)
                    .unwrap_or_else(|e| panic!("iptables change at {n}: {e:#}")),
            );
        }
    }
    drop(ipt);

    // kube-proxy, nftables mode.
    let nft = Netns::create(&format!("lbt-{tag}-nft"));
    let nftables_full = kube_proxy.then(|| {
        timed_in_netns(
            &nft.name,
            "nft",
            &["-f", "-"],
            &kube_proxy::nftables::full(&w.services),
        )
        .unwrap_or_else(|e| panic!("nft full sync at {n}: {e:#}"))
    });
    let mut nft_times = Vec::new();
    if nftables_full.is_some() {
        for i in 0..p.change_repeats {
            let (before, after) = (
                replacement(&changed, i % 2 == 1),
                replacement(&changed, i % 2 == 0),
            );
            nft_times.push(
                timed_in_netns(
                    &nft.name,
                    "nft",
                    &["-f", "-"],
                    &kube_proxy::nftables::one_endpoint_changed(&before, &after),
                )
                .unwrap_or_else(|e| panic!("nft change at {n}: {e:#}")),
            );
        }
    }
    drop(nft);

    ControlResult {
        services: n,
        lb_full,
        lb_full_serial,
        lb_full_preallocated,
        lb_full_writes,
        lb_full_in_memory,
        lb_change: median(lb_times),
        lb_change_writes,
        iptables_full,
        iptables_change: (!ipt_times.is_empty()).then(|| median(ipt_times)),
        nftables_full,
        nftables_change: (!nft_times.is_empty()).then(|| median(nft_times)),
    }
}

/// One full sync of `model` into maps of their own, made with `sizes`,
/// pipelined from `pipeline_from` services on.
fn full_sync_alone(
    tag: &str,
    what: &str,
    sizes: &MapSizes,
    model: &lb::model::Model,
    pipeline_from: usize,
) -> Duration {
    let pins = PinDir::create(&format!("{tag}-{what}"));
    let (_ebpf, _) = datapath::load(&pins.path, sizes).expect("loading the object");
    let mut r = Reconciler::restore(BpfMaps::open(&pins.path).unwrap())
        .unwrap()
        .with_pipeline_from(pipeline_from);
    r.reconcile(model).expect("full sync").duration
}

#[cfg(test)]
mod tests {
    /// Not a test: a fixed load to profile the reconciler's full sync with
    /// `perf record` (cargo test --release -p lb-bench -- --ignored profile).
    #[test]
    #[ignore]
    fn profile_in_memory_full_sync() {
        use super::*;
        let w = Workload::new(10_000, ENDPOINTS, &[]);
        let model = w.model(FrontendKind::ClusterIP);
        let mut r = Reconciler::restore(NullMaps).unwrap();
        let s = r.reconcile(&model).unwrap();
        eprintln!("{:?}", s.duration);
        assert_eq!(s.ops, 230_000);
    }

    /// The same against real maps (root).
    #[test]
    #[ignore]
    fn profile_bpf_full_sync() {
        use super::*;
        let w = Workload::new(10_000, ENDPOINTS, &[]);
        let model = w.model(FrontendKind::ClusterIP);
        let pins = PinDir::create("profile-bpf");
        let sizes = MapSizes {
            services: 1 << 18,
            backends: 1 << 17,
            ..MapSizes::default()
        };
        let (_ebpf, _) = datapath::load(&pins.path, &sizes).unwrap();
        let mut r = Reconciler::restore(BpfMaps::open(&pins.path).unwrap()).unwrap();
        let s = r.reconcile(&model).unwrap();
        eprintln!("{:?}", s.duration);
        // The batched writes all landed: the maps read back equal the mirror.
        assert_eq!(s.ops, 230_000);
        assert_eq!(
            &BpfMaps::open(&pins.path).unwrap().dump().unwrap(),
            r.state()
        );
    }
}
