//! Kubernetes mode's memory per service, measured two ways (issue: 100 000
//! services at most 2 KB each):
//!
//! * **Offline, at 100 000 services**: a Service (applied with kubectl) and
//!   its EndpointSlice as the test bed's apiserver listed them, managedFields,
//!   kubectl's last-applied annotation and all (`fixtures/recorded-*.json`),
//!   multiplied into N services with distinct names and addresses, decoded
//!   from JSON text as the watches decode them and fed to the agent's `Store`
//!   as a list; its model reconciled into maps that keep nothing. The live
//!   heap is counted (`memory::CountingAlloc`): the store and the reconciler
//!   apart. For comparison, the same objects decoded as k8s-openapi types
//!   (what the store kept before the slim types), at up to 10 000 services.
//! * **Through the real apiserver** (`scale`): the agent runs on the test
//!   bed's control plane, N services × 2 endpoints are created by a parallel
//!   client, and the agent's RSS is read before and after; a second agent
//!   started then is timed to complete maps; the first one's CPU at rest.
use std::time::{Duration, Instant};

use kube::runtime::watcher::Event;
use lb::source::kubernetes::{
    slim::{self, Watched},
    store::{Output, Store},
};

use lb_testkit::kube_proxy::{self, KubeProxy, Mode};

use crate::memory::live;

const SERVICE: &str = include_str!("../fixtures/recorded-service.json");
const SLICE: &str = include_str!("../fixtures/recorded-endpointslice.json");
/// Where the comparison with the k8s-openapi types stops (it holds every
/// object whole: about 1.6 GB at 100 000 services).
const OPENAPI_AT_MOST: usize = 10_000;

/// The recorded objects, as templates.
struct Recorded {
    service: serde_json::Value,
    slice: serde_json::Value,
}

impl Recorded {
    fn load() -> Self {
        Self {
            service: serde_json::from_str(SERVICE).expect("fixtures/recorded-service.json"),
            slice: serde_json::from_str(SLICE).expect("fixtures/recorded-endpointslice.json"),
        }
    }

    /// Service `i` as JSON text, as the apiserver would send it: the
    /// recorded one with its own name, uid, resourceVersion and ClusterIP.
    fn service(&self, i: usize) -> String {
        let mut s = self.service.clone();
        let name = format!("svc-{i}");
        s["metadata"]["name"] = name.clone().into();
        s["metadata"]["uid"] = format!("00000000-0000-0000-0000-{i:012}").into();
        s["metadata"]["resourceVersion"] = (100_000 + i).to_string().into();
        let ip = std::net::Ipv4Addr::from(0x0a60_0000u32 + i as u32 + 1).to_string();
        s["spec"]["clusterIP"] = ip.clone().into();
        s["spec"]["clusterIPs"] = serde_json::json!([ip]);
        s.to_string()
    }

    /// Service `i`'s EndpointSlice with `endpoints` endpoints (the recorded
    /// one's first endpoint repeated with distinct addresses).
    fn slice(&self, i: usize, endpoints: usize) -> String {
        let mut s = self.slice.clone();
        let name = format!("svc-{i}");
        s["metadata"]["name"] = format!("{name}-x7k2p").into();
        s["metadata"]["uid"] = format!("10000000-0000-0000-0000-{i:012}").into();
        s["metadata"]["resourceVersion"] = (300_000 + i).to_string().into();
        s["metadata"]["labels"]["kubernetes.io/service-name"] = name.clone().into();
        s["metadata"]["ownerReferences"][0]["name"] = name.into();
        let template = s["endpoints"][0].clone();
        s["endpoints"] = (0..endpoints)
            .map(|e| {
                let mut ep = template.clone();
                let ip = std::net::Ipv4Addr::from(0x0a80_0000u32 + (i * 16 + e) as u32);
                ep["addresses"] = serde_json::json!([ip.to_string()]);
                ep["targetRef"]["name"] = format!("svc-{i}-pod-{e}").into();
                ep
            })
            .collect();
        s.to_string()
    }
}

/// The live heap of Kubernetes mode's long-lived state for `services`
/// services with one slice of `endpoints` endpoints each.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct KubeBreakdown {
    pub services: usize,
    pub endpoints: usize,
    /// What the JSON text of one service and its slice weighs on the wire.
    pub wire_bytes_per_service: u64,
    /// The store: the slim objects, frontend claims, published fingerprints.
    pub store: u64,
    /// The reconciler: the model, the mirror of the maps, ids.
    pub reconciler: u64,
    pub total: u64,
    /// Live heap blocks (allocations), all and the reconciler's: each
    /// costs the allocator a header and rounding that `total` does not
    /// count and RSS does.
    pub blocks: u64,
    pub reconciler_blocks: u64,
    /// How much the process's resident memory grew meanwhile (the heap
    /// above plus the allocator's overhead and what it keeps).
    pub rss_kib: u64,
    /// Seconds to decode and feed everything and reconcile the model.
    pub feed_s: f64,
    /// The same objects decoded as k8s-openapi types, bytes per service
    /// (service and slice), over at most `OPENAPI_AT_MOST` services.
    pub openapi_per_service: u64,
}

fn node() -> k8s_openapi::api::core::v1::Node {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "bench-node"},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.80.11"}]}
    }))
    .unwrap()
}

/// `breakdown` in a process of its own (this binary, `kube-memory`), so
/// that the resident memory it reports grew from a fresh start.
pub fn breakdown_apart(services: usize, endpoints: usize) -> KubeBreakdown {
    let out = std::process::Command::new(std::env::current_exe().expect("lb-bench's path"))
        .args(["kube-memory", &services.to_string(), &endpoints.to_string()])
        .output()
        .expect("lb-bench kube-memory");
    assert!(
        out.status.success(),
        "lb-bench kube-memory {services} {endpoints}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("lb-bench kube-memory's JSON")
}

/// `watched`: the objects arrive as watch events after empty lists, as
/// services created through the apiserver do, instead of as one list.
pub fn breakdown(services: usize, endpoints: usize, watched: bool) -> KubeBreakdown {
    let rec = Recorded::load();
    let wire = (rec.service(0).len() + rec.slice(0, endpoints).len()) as u64;
    let started = Instant::now();
    // Trimmed first too: the recorded list's own freed buffers would
    // otherwise be counted against the store.
    lb::sys::heap::release_free_memory();
    let rss_before = crate::memory::rss_kib(std::process::id());
    let before = live();
    let blocks_before = crate::memory::blocks();
    let mut store = Store::new("bench-node", Default::default());
    store.on_node(Event::Init);
    store.on_node(Event::InitApply(node()));
    store.on_node(Event::InitDone);
    let mut r = lb::reconcile::Reconciler::restore(crate::memory::NullMaps).expect("null maps");
    let decode_service = |i: usize| -> slim::Service {
        let w: Watched<slim::Service> =
            serde_json::from_str(&rec.service(i)).expect("recorded service");
        w.object
    };
    let decode_slice = |i: usize| -> slim::EndpointSlice {
        let w: Watched<slim::EndpointSlice> =
            serde_json::from_str(&rec.slice(i, endpoints)).expect("recorded slice");
        w.object
    };
    if watched {
        // As services created through the apiserver reach the agent: empty
        // lists, then each object as a watch event, applied a batch at a
        // time (what one debounce gathers while a parallel client writes).
        for done in [Event::Init, Event::InitDone] {
            store.on_service(done);
        }
        for done in [Event::Init, Event::InitDone] {
            store.on_slice(done);
        }
        let Some(Output::Full(model)) = store.take_output() else {
            panic!("the store gave no full model after complete lists");
        };
        r.reconcile_model(model).expect("reconcile into null maps");
        const BATCH: usize = 64;
        let mut changed = 0;
        for i in 0..services {
            store.on_service(Event::Apply(decode_service(i)));
            store.on_slice(Event::Apply(decode_slice(i)));
            if (i + 1) % BATCH == 0 || i + 1 == services {
                if let Some(Output::Changes(changes)) = store.take_output() {
                    changed += changes.len();
                    r.reconcile_changes(changes)
                        .expect("reconcile into null maps");
                }
                let _ = store.take_warnings();
                let _ = store.take_triggers();
            }
        }
        assert_eq!(changed, services, "every service translated once");
    } else {
        store.on_service(Event::Init);
        for i in 0..services {
            store.on_service(Event::InitApply(decode_service(i)));
        }
        store.on_service(Event::InitDone);
        store.on_slice(Event::Init);
        for i in 0..services {
            store.on_slice(Event::InitApply(decode_slice(i)));
        }
        store.on_slice(Event::InitDone);
        let Some(Output::Full(model)) = store.take_output() else {
            panic!("the store gave no full model after complete lists");
        };
        assert_eq!(model.services.len(), services, "every service translated");
        let _ = store.take_warnings();
        let _ = store.take_triggers();
        r.reconcile_model(model).expect("reconcile into null maps");
    }
    let total = (live() - before) as u64;
    let feed_s = started.elapsed().as_secs_f64();
    // As the agent does after every full model (agent/worker.rs): the
    // decoding's freed buffers go back to the kernel; what stays resident
    // is the heap the store and the reconciler hold, and the allocator's
    // overhead on it.
    lb::sys::heap::release_free_memory();
    let rss_kib = crate::memory::rss_kib(std::process::id()).saturating_sub(rss_before);
    let blocks = (crate::memory::blocks() - blocks_before) as u64;
    // Each part is what dropping it gives back.
    let b = live();
    let bb = crate::memory::blocks();
    drop(r);
    let reconciler = (b - live()) as u64;
    let reconciler_blocks = (bb - crate::memory::blocks()) as u64;
    drop(store);

    // What the store held before: the k8s-openapi types, whole.
    let openapi_services = services.min(OPENAPI_AT_MOST);
    let b = live();
    let mut held = Vec::with_capacity(openapi_services);
    for i in 0..openapi_services {
        let s: k8s_openapi::api::core::v1::Service = serde_json::from_str(&rec.service(i)).unwrap();
        let e: k8s_openapi::api::discovery::v1::EndpointSlice =
            serde_json::from_str(&rec.slice(i, endpoints)).unwrap();
        held.push((s, e));
    }
    let openapi = (live() - b) as u64;
    drop(held);
    KubeBreakdown {
        services,
        endpoints,
        wire_bytes_per_service: wire,
        store: total.saturating_sub(reconciler),
        reconciler,
        total,
        blocks,
        reconciler_blocks,
        rss_kib,
        feed_s,
        openapi_per_service: openapi / openapi_services.max(1) as u64,
    }
}

/// The agent at scale on the real control plane.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct KubeScale {
    pub services: usize,
    /// Seconds to create the services and their slices through the
    /// apiserver (a parallel client, 32 requests at a time).
    pub create_s: f64,
    /// The first agent's RSS with an empty cluster and with every service.
    pub rss_before_kib: u64,
    pub rss_after_kib: u64,
    /// A second agent started with every service already there: seconds
    /// from its start to every service in its maps, and its RSS then.
    pub sync_s: f64,
    pub second_rss_kib: u64,
    /// The first agent's CPU while nothing changes, percent of one core
    /// over 30 s.
    pub idle_cpu_percent: f64,
    /// The second agent's CPU seconds from its start to every service in
    /// its maps (user + system).
    pub sync_cpu_s: f64,
    /// The real kube-proxy started the same way, in each mode that runs
    /// here: the full sync after a restart, beside the second agent's.
    pub kube_proxy: Vec<KubeProxyScale>,
}

/// The real kube-proxy (cmd/kube-proxy v1.35.8) started with every service
/// already in the apiserver.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct KubeProxyScale {
    /// `iptables`, `iptables-legacy` or `nftables` (`Mode::name`).
    pub mode: String,
    /// Whether it programmed its first full sync within the bench's limit
    /// (`Profile::kube_proxy_sync_limit_s`); when not, `sync_s`,
    /// `sync_cpu_s` and `rss_kib` are those at the limit: lower bounds.
    pub synced: bool,
    /// Not started: it had not synced at a smaller scale of the same run.
    pub skipped: bool,
    /// Seconds from its start to its first full sync programmed
    /// (`lb_testkit::kube_proxy::synced`).
    pub sync_s: f64,
    /// CPU seconds until then, its own and its children's (the
    /// iptables-restore and nft it runs and waits for).
    pub sync_cpu_s: f64,
    /// Its RSS then (children excluded: they have exited).
    pub rss_kib: u64,
}

/// `lb_services` of an agent's /metrics.
fn services_in(agent: &lb_testkit::agent::Agent) -> Option<usize> {
    let (code, body) = agent.http_get("/metrics");
    if code != 200 {
        return None;
    }
    body.lines()
        .find_map(|l| l.strip_prefix("lb_services "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as usize)
}

/// utime + stime of `pid`, and with `children` also of the children it
/// waited for (cutime, cstime), in clock ticks.
fn cpu_ticks(pid: u32, children: bool) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces): state is field 3.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime, stime, cutime, cstime are fields 14 to 17; `rest` starts at
    // field 3.
    let own = n(11) + n(12);
    if children {
        own + n(13) + n(14)
    } else {
        own
    }
}

/// Kubernetes mode at `services` through the real apiserver, then the real
/// kube-proxy's restart in each mode of `propagation::KUBE_PROXY_MODES`
/// but those in `skip` (they did not sync at a smaller scale of the same
/// run), each given `kube_proxy_limit` for its first sync.
pub fn scale(services: usize, kube_proxy_limit: Duration, skip: &[String]) -> KubeScale {
    use lb_testkit::{agent::Agent, agent::PinDir, cgroup::ChildCgroup, k8s, unique};
    let cp = k8s::ControlPlane::start(&unique("benchscale"));
    k8s::install_manifests(&cp);
    let agent_kc = cp.service_account_kubeconfig("kube-system", "lb-agent");
    let admin_kc = cp.admin_kubeconfig();
    let netns = cp.netns.name.clone();
    // One frontend, two slots and the address marker per service.
    let sizes = [
        format!(
            "--map-size-services={}",
            (services * 4 + 4_096).next_power_of_two()
        ),
        format!(
            "--map-size-backends={}",
            (services * 2 + 4_096).next_power_of_two()
        ),
    ];
    let sizes: Vec<&str> = sizes.iter().map(String::as_str).collect();
    let start = |tag: &str| {
        let pins = PinDir::create(&unique(tag));
        let cgroup = ChildCgroup::create(&unique(tag));
        let agent = Agent::start_kubernetes_with(
            &cp.netns.name,
            &agent_kc,
            "bench-node",
            &cgroup.path,
            &pins.path,
            "100ms",
            &sizes,
            std::time::Duration::from_secs(600),
        );
        (agent, pins, cgroup)
    };
    let (first, _pins, _cgroup) = start("scalea");
    let base = services_in(&first).expect("the agent's /metrics");
    let rss_before_kib = crate::memory::rss_kib(first.pid().unwrap());

    let created = Instant::now();
    let kc = admin_kc.clone();
    let ns = netns.clone();
    crate::apiserver::in_netns(&ns, move || async move {
        create(&kc, services).await;
    });
    let create_s = created.elapsed().as_secs_f64();
    eprintln!("lb-bench:   {services} services × 2 endpoints created in {create_s:.0} s");
    let want = base + services;
    assert!(
        wait_for(std::time::Duration::from_secs(600), || services_in(&first)
            == Some(want)),
        "the agent did not reach {want} services: {:?}",
        services_in(&first)
    );
    let rss_after_kib = crate::memory::rss_kib(first.pid().unwrap());
    let pid = first.pid().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let t0 = cpu_ticks(pid, false);
    std::thread::sleep(std::time::Duration::from_secs(30));
    let idle_cpu_percent = (cpu_ticks(pid, false) - t0) as f64 / hz / 30.0 * 100.0;

    let synced = Instant::now();
    let (second, _pins2, _cgroup2) = start("scaleb");
    assert!(
        wait_for(std::time::Duration::from_secs(600), || services_in(&second)
            == Some(want)),
        "the second agent did not reach {want} services"
    );
    let sync_s = synced.elapsed().as_secs_f64();
    let sync_cpu_s = cpu_ticks(second.pid().unwrap(), false) as f64 / hz;
    let second_rss_kib = crate::memory::rss_kib(second.pid().unwrap());
    drop(second);
    drop(first);
    let kube_proxy = crate::propagation::KUBE_PROXY_MODES
        .into_iter()
        .map(|mode| {
            if skip.iter().any(|s| s == mode.name()) {
                eprintln!(
                    "lb-bench:   kube-proxy {}: not started (no first sync at a smaller scale)",
                    mode.name()
                );
                KubeProxyScale {
                    mode: mode.name().to_string(),
                    skipped: true,
                    ..Default::default()
                }
            } else {
                kube_proxy_resync(&cp, mode, hz, kube_proxy_limit)
            }
        })
        .collect();
    KubeScale {
        services,
        create_s,
        rss_before_kib,
        rss_after_kib,
        sync_s,
        second_rss_kib,
        idle_cpu_percent,
        sync_cpu_s,
        kube_proxy,
    }
}

/// The real kube-proxy in `mode` started in the control plane's namespace as
/// node `bench-node` (the agents' node) with every service there: its first
/// full sync timed, its CPU and RSS then; its rules removed afterwards
/// (`--cleanup`) so that the next mode starts from an empty table, as the
/// agent started from empty maps.
fn kube_proxy_resync(
    cp: &lb_testkit::k8s::ControlPlane,
    mode: Mode,
    hz: f64,
    limit: Duration,
) -> KubeProxyScale {
    let kubeconfig = kube_proxy::kubeconfig(cp);
    let log = cp.dir.join(format!("kube-proxy-{}.log", mode.name()));
    let started = Instant::now();
    let mut kp = KubeProxy::start_in(&cp.netns.name, &kubeconfig, mode, "bench-node", log);
    // Looked for every 200 ms: the sync time is read to that grain.
    let synced = kp.wait_synced(limit, Duration::from_millis(200));
    if let Err(why) = &synced {
        eprintln!("lb-bench:   {why}\nlb-bench:   recorded as not synced; going on");
    }
    let sync_s = started.elapsed().as_secs_f64();
    let result = KubeProxyScale {
        mode: mode.name().to_string(),
        synced: synced.is_ok(),
        skipped: false,
        sync_s,
        sync_cpu_s: cpu_ticks(kp.pid(), true) as f64 / hz,
        rss_kib: crate::memory::rss_kib(kp.pid()),
    };
    eprintln!(
        "lb-bench:   kube-proxy {}: {} {sync_s:.1} s, {:.1} CPU s, RSS {:.0} MiB",
        mode.name(),
        if result.synced {
            "first full sync in"
        } else {
            "no first sync in"
        },
        result.sync_cpu_s,
        result.rss_kib as f64 / 1024.0
    );
    kp.stop_and_clean_up();
    result
}

fn wait_for(timeout: std::time::Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    false
}

/// `services` selectorless services in namespace `scale`, each with a
/// slice of 2 endpoints, created 32 at a time.
async fn create(kubeconfig: &std::path::Path, services: usize) {
    use futures::StreamExt as _;
    use k8s_openapi::api::{
        core::v1::{Namespace, Service},
        discovery::v1::EndpointSlice,
    };
    use kube::{api::PostParams, Api};

    use crate::apiserver::{client, json, selectorless, Selectorless};
    let c = client(kubeconfig).await;
    let pp = PostParams::default();
    Api::<Namespace>::all(c.clone())
        .create(
            &pp,
            &json(serde_json::json!({"metadata": {"name": "scale"}})),
        )
        .await
        .unwrap();
    let svcs = Api::<Service>::namespaced(c.clone(), "scale");
    let slices = Api::<EndpointSlice>::namespaced(c, "scale");
    futures::stream::iter(0..services)
        .map(|i| {
            let (svcs, slices) = (svcs.clone(), slices.clone());
            async move {
                let endpoints: Vec<_> = (0..2u32)
                    .map(|e| std::net::Ipv4Addr::from(0x0a80_0000u32 + (i as u32) * 4 + e))
                    .collect();
                let name = format!("svc-{i}");
                selectorless(
                    &svcs,
                    &slices,
                    Selectorless {
                        name: &name,
                        labels: serde_json::json!({"app": "scale"}),
                        port_name: "http",
                        target_port: 8080,
                        endpoints: &endpoints,
                        node: Some("elsewhere"),
                    },
                )
                .await;
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
}
