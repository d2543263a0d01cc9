//! Propagation delay on a real control plane: from a Pod's readiness being
//! written to the apiserver to the node's map entry changing, with N
//! services × 10 endpoints in the cluster and other pods churning meanwhile.
//!
//! The path is the one a cluster runs: status write → the real
//! EndpointSlice controller (kube-controller-manager) updates the slice →
//! the agent's watch → its debounce (--min-sync-period, the DaemonSet's
//! 100 ms) → reconcile → bpf(2). The bench watches the slices too, so each
//! sample splits into the controller's part (write → slice seen) and ours
//! (slice seen → map entry), both on the same clock.
//!
//! Bulk services are selectorless with hand-made EndpointSlices (10 000 ×
//! 10 pods would not fit this machine); the measured and churning services
//! are backed by Pods whose readiness the bench sets, as a kubelet would.
use std::{
    collections::HashMap,
    net::Ipv4Addr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use aya::maps::HashMap as BpfHashMap;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    api::{Patch, PatchParams, PostParams},
    runtime::{watcher, WatchStreamExt as _},
    Api,
};
use lb_common::service::{Service4Key, ServiceValue, SCOPE_ALL};
use lb_testkit::{
    agent::{Agent, PinDir},
    cgroup::ChildCgroup,
    k8s::{self, ControlPlane},
    unique,
};

use lb_testkit::kube_proxy::{self, KubeProxy, Mode};

use crate::{
    apiserver::{client, in_netns, json, selectorless, Selectorless},
    kube_proxy::real::Rules,
    profile::Profile,
    prom::Buckets,
    stats::percentile,
};

const NS: &str = "bench";
const NODE: &str = "bench-node";
/// Services whose pods are toggled for the samples, and in the background.
const MEASURED: usize = 10;
const BACKGROUND: usize = 10;
/// How long one sample waits for the proxy to show its change. The agent
/// missing it fails the bench; kube-proxy missing it is a result: the
/// sample counts as this long (a lower bound) and the next one goes on.
pub const SAMPLE_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Debug)]
pub struct PropagationResult {
    pub services: usize,
    pub samples: usize,
    /// Samples the proxy had not shown within [`SAMPLE_TIMEOUT`] (counted
    /// as that long, so a percentile that lands on one is a lower bound).
    pub missed: usize,
    /// Pod status write → EndpointSlice change seen (the controller).
    pub to_slice: [Duration; 2],
    /// EndpointSlice change seen → map entry changed (the agent).
    pub slice_to_map: [Duration; 2],
    /// Pod status write → map entry changed.
    pub to_map: [Duration; 2],
    /// Seconds to create the bulk objects (context for the run).
    pub setup_s: f64,
    pub background_changes: usize,
    /// One look at the target's state (p50, max): see `KubeProxyPropagation::poll`.
    pub poll: [Duration; 2],
    /// p50 and p99 of `kubeproxy_network_programming_duration_seconds` over
    /// the sampling (the samples and the background changes), as the agent
    /// itself accounts them, estimated from the buckets as
    /// `histogram_quantile` would; and how many changes it counted.
    pub programming: Option<([f64; 2], f64)>,
    /// The same samples with the real kube-proxy in each mode, started
    /// after the agent stopped: write → its rules showing the change.
    pub kube_proxy: Vec<KubeProxyPropagation>,
}

/// The real kube-proxy's part of a propagation run.
#[derive(Clone, Debug)]
pub struct KubeProxyPropagation {
    pub mode: &'static str,
    /// Its start → its first full sync programmed; Err(the limit) when it
    /// had not programmed one by then, and no samples were taken (the
    /// times below are zero).
    pub first_sync: Result<Duration, Duration>,
    /// Samples taken: fewer than the agent's when its sampling ran into
    /// the profile's time limit.
    pub samples: usize,
    pub missed: usize,
    pub to_slice: [Duration; 2],
    /// Slice seen → its rules list the new endpoint count.
    pub slice_to_rules: [Duration; 2],
    /// Pod status write → rules.
    pub to_rules: [Duration; 2],
    /// Its own `kubeproxy_network_programming_duration_seconds` over the
    /// sampling, as for the agent.
    pub programming: Option<([f64; 2], f64)>,
    /// How long one look at its rules took (p50, max): the resolution of
    /// its samples. Between looks the bench sleeps four times as long, so
    /// the looks (a dump of the nat table under the xtables lock, or a
    /// listing of nftables' ruleset) take at most a fifth of a core from
    /// kube-proxy and never hold the lock back-to-back.
    pub poll: [Duration; 2],
}

/// Backends of a Service (name, ClusterIP) as the target programmed them.
type Programmed = Box<dyn FnMut(&str, Ipv4Addr) -> Option<usize>>;

/// What the samples poll: the agent's ClusterIP entry in its pinned
/// LB4_SERVICES, or the real kube-proxy's rules.
#[derive(Clone)]
enum Target {
    /// The agent's pin directory, and its metrics address in the control
    /// plane's namespace.
    Agent(std::path::PathBuf, std::net::SocketAddr),
    /// kube-proxy in this mode, its rules in this network namespace.
    KubeProxy(Mode, String),
}

pub fn run(p: &Profile) -> Vec<PropagationResult> {
    let limit = Duration::from_secs(p.kube_proxy_sync_limit_s);
    p.propagation_services
        .iter()
        .map(|&n| {
            one_scale(
                n,
                p.propagation_samples,
                limit,
                Duration::from_secs(p.kube_proxy_sampling_limit_s),
            )
        })
        .collect()
}

/// The real kube-proxy's modes the benches run it in: iptables with
/// either backend, and nftables (ipvs needs CONFIG_IP_VS, which this
/// kernel lacks).
pub const KUBE_PROXY_MODES: [Mode; 3] = [Mode::Iptables, Mode::IptablesLegacy, Mode::Nftables];

/// `limit` is kube-proxy's first full sync's; `sampling` how long its
/// samples may take in all (the agent's are not limited).
fn one_scale(
    services: usize,
    samples: usize,
    limit: Duration,
    sampling: Duration,
) -> PropagationResult {
    let cp = ControlPlane::start(&unique("benchprop"));
    k8s::install_manifests(&cp);
    let agent_kc = cp.service_account_kubeconfig("kube-system", "lb-agent");
    let admin_kc = cp.admin_kubeconfig();
    let netns = cp.netns.name.clone();
    let pins = PinDir::create(&unique("benchprop"));
    let cgroup = ChildCgroup::create(&unique("benchprop"));

    let setup_started = Instant::now();
    {
        let kc = admin_kc.clone();
        in_netns(&netns, move || async move {
            create_objects(&kc, services).await;
        });
    }
    let setup_s = setup_started.elapsed().as_secs_f64();
    eprintln!("lb-bench:   {services} services × 10 endpoints created in {setup_s:.0} s");

    // Each service: a frontend, 10 slots and its address marker; each
    // endpoint a backend (the defaults hold about 5 000 such services).
    let sizes = [
        format!(
            "--map-size-services={}",
            ((services + MEASURED + BACKGROUND) * 12 + 1_024).next_power_of_two()
        ),
        format!(
            "--map-size-backends={}",
            ((services + MEASURED + BACKGROUND) * 10 + 1_024).next_power_of_two()
        ),
    ];
    let sizes: Vec<&str> = sizes.iter().map(String::as_str).collect();
    let agent = Agent::start_kubernetes_with(
        &cp.netns.name,
        &agent_kc,
        NODE,
        &cgroup.path,
        &pins.path,
        "100ms",
        &sizes,
        Duration::from_secs(300),
    );
    let target = Target::Agent(pins.path.clone(), agent.metrics);
    let kc = admin_kc.clone();
    let result = in_netns(&netns, move || async move {
        measure(&kc, target, services, samples, None).await
    });
    drop(agent);

    // The real kube-proxy as the same node, on the same objects, one mode
    // after the other, each from empty rules (`stop_and_clean_up`).
    let kp_kc = kube_proxy::kubeconfig(&cp);
    let mut kube_proxy = Vec::new();
    for mode in KUBE_PROXY_MODES {
        let log = cp.dir.join(format!("kube-proxy-{}.log", mode.name()));
        let started = Instant::now();
        let mut kp = KubeProxy::start_in(&cp.netns.name, &kp_kc, mode, NODE, log);
        if let Err(why) = kp.wait_synced(limit, Duration::from_secs(1)) {
            eprintln!("lb-bench:   {why}\nlb-bench:   recorded as not synced; going on");
            kube_proxy.push(KubeProxyPropagation {
                mode: mode.name(),
                first_sync: Err(limit),
                samples: 0,
                missed: 0,
                poll: [Duration::ZERO; 2],
                to_slice: [Duration::ZERO; 2],
                slice_to_rules: [Duration::ZERO; 2],
                to_rules: [Duration::ZERO; 2],
                programming: None,
            });
            kp.stop_and_clean_up();
            continue;
        }
        let first_sync = started.elapsed();
        let kc = admin_kc.clone();
        let target = Target::KubeProxy(mode, cp.netns.name.clone());
        let r = in_netns(&netns, move || async move {
            measure(&kc, target, services, samples, Some(sampling)).await
        });
        eprintln!(
            "lb-bench:   kube-proxy {}: first sync in {first_sync:.1?}; {} samples ({} missed {SAMPLE_TIMEOUT:?}), write → rules p50 {:?}, p99 {:?}",
            mode.name(),
            r.samples,
            r.missed,
            r.to_map[0],
            r.to_map[1]
        );
        kube_proxy.push(KubeProxyPropagation {
            mode: mode.name(),
            first_sync: Ok(first_sync),
            samples: r.samples,
            missed: r.missed,
            poll: r.poll,
            to_slice: r.to_slice,
            slice_to_rules: r.slice_to_map,
            to_rules: r.to_map,
            programming: r.programming,
        });
        kp.stop_and_clean_up();
    }
    PropagationResult {
        setup_s,
        kube_proxy,
        ..result
    }
}

fn pod_ip(svc: usize, pod: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 250, svc as u8, pod as u8 + 1)
}

/// The namespace, the Node, `services` selectorless services with a slice
/// of 10 endpoints each, and the pod-backed ones (2 ready pods each).
async fn create_objects(kubeconfig: &std::path::Path, services: usize) {
    let c = client(kubeconfig).await;
    let pp = PostParams::default();
    Api::<Namespace>::all(c.clone())
        .create(&pp, &json(serde_json::json!({"metadata": {"name": NS}})))
        .await
        .unwrap();
    Api::<Node>::all(c.clone())
        .create(&pp, &json(serde_json::json!({"metadata": {"name": NODE}})))
        .await
        .unwrap();
    // The namespace's default ServiceAccount must exist before pods.
    let sa = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(c.clone(), NS);
    while sa.get_opt("default").await.unwrap().is_none() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let svcs = Api::<Service>::namespaced(c.clone(), NS);
    let slices = Api::<EndpointSlice>::namespaced(c.clone(), NS);
    futures::stream::iter(0..services)
        .map(|i| {
            let (svcs, slices) = (svcs.clone(), slices.clone());
            async move {
                let endpoints: Vec<_> = (0..10)
                    .map(|e| Ipv4Addr::from(0x0a80_0000u32 + (i as u32) * 16 + e))
                    .collect();
                let name = format!("bulk-{i}");
                selectorless(
                    &svcs,
                    &slices,
                    Selectorless {
                        name: &name,
                        labels: serde_json::Value::Null,
                        port_name: "http",
                        target_port: 8080,
                        endpoints: &endpoints,
                        node: Some("elsewhere"),
                    },
                )
                .await;
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    let pods = Api::<Pod>::namespaced(c.clone(), NS);
    for s in 0..MEASURED + BACKGROUND {
        let name = format!("churn-{s}");
        svcs.create(&pp, &json(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
        })))
        .await
        .unwrap();
        for p in 0..2 {
            let pod = format!("{name}-{p}");
            pods.create(&pp, &json(serde_json::json!({
                "metadata": {"name": pod, "labels": {"app": name}},
                "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "ports": [{"containerPort": 8080}]}]}
            })))
            .await
            .unwrap();
            set_ready(&pods, &pod, pod_ip(s, p), true).await;
        }
    }
}

async fn set_ready(pods: &Api<Pod>, name: &str, ip: Ipv4Addr, ready: bool) {
    // The transition time, as a kubelet writes it: the EndpointSlice
    // controller carries it to the slice (last-change-trigger-time), where
    // both proxies start their network programming latency. API times
    // have whole seconds, so that metric reads up to 1 s long for both.
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let status = serde_json::json!({"status": {
        "phase": "Running",
        "podIP": ip.to_string(),
        "podIPs": [{"ip": ip.to_string()}],
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }, "lastTransitionTime": now}]
    }});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// Active backends of a ClusterIP:80/TCP in LB4_SERVICES (None: absent).
fn map_count(
    map: &BpfHashMap<aya::maps::MapData, Service4Key, ServiceValue>,
    ip: Ipv4Addr,
) -> Option<u16> {
    let key = Service4Key::new(
        u32::from(ip).to_be(),
        80u16.to_be(),
        libc::IPPROTO_TCP as u8,
        SCOPE_ALL,
        0,
    );
    map.get(&key, 0).ok().map(|v| v.count)
}

/// Ready endpoint counts of the churn services' slices as the bench's own
/// watch sees them: (service, ready count, when).
type SliceLog = Arc<Mutex<Vec<(String, usize, Instant)>>>;

async fn measure(
    kubeconfig: &std::path::Path,
    target: Target,
    services: usize,
    samples: usize,
    sampling_limit: Option<Duration>,
) -> PropagationResult {
    let c = client(kubeconfig).await;
    let svcs = Api::<Service>::namespaced(c.clone(), NS);
    let pods = Api::<Pod>::namespaced(c.clone(), NS);
    // Backends of Service `name` (ClusterIP `ip`) as the target programmed
    // them; None while it has not got the Service at all.
    let mut programmed: Programmed = match &target {
        Target::Agent(pin_dir, _) => {
            let map: BpfHashMap<_, Service4Key, ServiceValue> =
                BpfHashMap::try_from(lb::maps::bpf::open_pinned(pin_dir, "LB4_SERVICES").unwrap())
                    .unwrap();
            Box::new(move |_, ip| map_count(&map, ip).map(usize::from))
        }
        Target::KubeProxy(mode, netns) => {
            let mut rules = Rules::new(netns, *mode);
            Box::new(move |name, _| rules.endpoints(NS, name, "http"))
        }
    };
    // Every pod ready again (an earlier run leaves some not ready).
    for s in 0..MEASURED + BACKGROUND {
        for p in 0..2 {
            set_ready(&pods, &format!("churn-{s}-{p}"), pod_ip(s, p), true).await;
        }
    }

    let mut ips = HashMap::new();
    for s in 0..MEASURED {
        let svc = svcs.get(&format!("churn-{s}")).await.unwrap();
        let ip: Ipv4Addr = svc.spec.unwrap().cluster_ip.unwrap().parse().unwrap();
        ips.insert(s, ip);
    }
    // Everything in the maps: the last bulk service and every measured one
    // with both pods.
    let last: Ipv4Addr = svcs
        .get(&format!("bulk-{}", services - 1))
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap()
        .parse()
        .unwrap();
    let last_name = format!("bulk-{}", services - 1);
    let deadline = Instant::now() + Duration::from_secs(300);
    while !(programmed(&last_name, last) == Some(10)
        && ips
            .iter()
            .all(|(s, ip)| programmed(&format!("churn-{s}"), *ip) == Some(2)))
    {
        assert!(
            Instant::now() < deadline,
            "{} never had every service programmed",
            target.name()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The bench's own view of the churn slices.
    let log: SliceLog = Arc::default();
    let watch = {
        let log = log.clone();
        let api = Api::<EndpointSlice>::namespaced(c.clone(), NS);
        tokio::spawn(async move {
            let cfg = watcher::Config::default().labels("kubernetes.io/service-name");
            let mut s = watcher(api, cfg).applied_objects().boxed();
            while let Ok(Some(slice)) = s.try_next().await {
                let Some(svc) = slice
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("kubernetes.io/service-name"))
                    .cloned()
                else {
                    continue;
                };
                if !svc.starts_with("churn-") {
                    continue;
                }
                let ready = slice
                    .endpoints
                    .iter()
                    .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                    .count();
                log.lock().unwrap().push((svc, ready, Instant::now()));
            }
        })
    };
    // Background churn: other pods flip readiness continuously (~10/s).
    let churned = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let background = {
        let (pods, churned) = (pods.clone(), churned.clone());
        tokio::spawn(async move {
            let mut ready = [true; BACKGROUND * 2];
            for n in 0usize.. {
                let i = n % (BACKGROUND * 2);
                ready[i] = !ready[i];
                let (s, p) = (MEASURED + i / 2, i % 2);
                set_ready(&pods, &format!("churn-{s}-{p}"), pod_ip(s, p), ready[i]).await;
                churned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    let programming_before = target.programming();
    let (mut to_slice, mut slice_to_map, mut to_map) = (Vec::new(), Vec::new(), Vec::new());
    let mut ready = [[true; 2]; MEASURED];
    let mut missed = 0;
    let mut polls: Vec<Duration> = Vec::new();
    // The agent's map lookup is a syscall; kube-proxy's rules are a dump
    // (see `KubeProxyPropagation::poll`): pace the looks by their cost.
    let pace = matches!(target, Target::KubeProxy(..));
    let sampling_started = Instant::now();
    for i in 0..samples {
        if sampling_limit.is_some_and(|l| sampling_started.elapsed() >= l) {
            eprintln!(
                "lb-bench:   {}: sampling stopped after {i} samples at the profile's limit of {:?}",
                target.name(),
                sampling_limit.unwrap()
            );
            break;
        }
        let s = i % MEASURED;
        let p = (i / MEASURED) % 2;
        ready[s][p] = !ready[s][p];
        let want = ready[s].iter().filter(|r| **r).count();
        let name = format!("churn-{s}");
        let t0 = Instant::now();
        set_ready(&pods, &format!("{name}-{p}"), pod_ip(s, p), ready[s][p]).await;
        let ip = ips[&s];
        let deadline = t0 + SAMPLE_TIMEOUT;
        let mapped = loop {
            // An empty service keeps its master entry with count 0 (the
            // agent) or loses its chain (kube-proxy).
            let look = Instant::now();
            let count = programmed(&name, ip).unwrap_or(0);
            let took = look.elapsed();
            polls.push(took);
            if count == want {
                break Instant::now();
            }
            if Instant::now() >= deadline {
                assert!(
                    matches!(target, Target::KubeProxy(..)),
                    "{name}: {} never showed {want} backends",
                    target.name()
                );
                eprintln!(
                    "lb-bench:   {name}: {} had not shown {want} backends after {SAMPLE_TIMEOUT:?}; counted as that long",
                    target.name()
                );
                missed += 1;
                break deadline;
            }
            let pause = if pace {
                (took * 4).max(Duration::from_micros(500))
            } else {
                Duration::from_micros(500)
            };
            tokio::time::sleep(pause).await;
        };
        let seen = log
            .lock()
            .unwrap()
            .iter()
            .find(|(svc, n, t)| *svc == name && *n == want && *t >= t0)
            .map_or(mapped, |(_, _, t)| *t);
        to_slice.push(seen - t0);
        slice_to_map.push(mapped.saturating_duration_since(seen));
        to_map.push(mapped - t0);
        // Let the change settle before the next one (samples are one by one).
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    background.abort();
    // What the proxy still holds (kube-proxy batches changes for up to its
    // 1 s min-sync-period) is in its histogram before the second scrape.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let programmed_changes = target.programming().since(&programming_before);
    let programming = programmed_changes
        .quantile(0.5)
        .zip(programmed_changes.quantile(0.99))
        .map(|(p50, p99)| ([p50, p99], programmed_changes.count()));
    let background_changes = churned.load(std::sync::atomic::Ordering::Relaxed);
    watch.abort();
    let q = |mut v: Vec<Duration>| {
        v.sort();
        [percentile(&v, 0.5), percentile(&v, 0.99)]
    };
    polls.sort();
    let poll = [
        percentile(&polls, 0.5),
        polls.last().copied().unwrap_or_default(),
    ];
    PropagationResult {
        services,
        samples: to_map.len(),
        missed,
        to_slice: q(to_slice),
        slice_to_map: q(slice_to_map),
        to_map: q(to_map),
        setup_s: 0.0,
        background_changes,
        poll,
        programming,
        kube_proxy: Vec::new(),
    }
}

impl Target {
    fn name(&self) -> String {
        match self {
            Target::Agent(..) => "the agent".into(),
            Target::KubeProxy(m, _) => format!("kube-proxy ({})", m.name()),
        }
    }

    /// `kubeproxy_network_programming_duration_seconds` as the target
    /// exports it (the agent under kube-proxy's name, with its buckets).
    /// Called from a thread in the control plane's namespace.
    fn programming(&self) -> Buckets {
        let text = match self {
            Target::Agent(_, addr) => http_get(*addr, "/metrics"),
            Target::KubeProxy(_, netns) => kube_proxy::metrics(netns),
        };
        // A failed scrape would read as an empty histogram, and the
        // difference as everything since the proxy started. (A histogram
        // nothing was observed in yet may be missing from a good one.)
        assert!(
            text.contains("kubeproxy_sync_proxy_rules_last_timestamp_seconds"),
            "{}'s /metrics did not answer with kube-proxy's metrics: {text:.300}",
            self.name()
        );
        Buckets::parse(&text, PROGRAMMING)
    }
}

const PROGRAMMING: &str = "kubeproxy_network_programming_duration_seconds";

/// The body of a plain HTTP GET ("" when it fails).
fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use std::io::{Read as _, Write as _};
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.split_once("\r\n\r\n")
        .map_or(String::new(), |(_, body)| body.to_string())
}
