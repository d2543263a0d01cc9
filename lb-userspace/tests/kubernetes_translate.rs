//! Translation of real-world Kubernetes objects (YAML fixtures) into the
//! model, one fixture per behaviour.
use std::{collections::BTreeMap, net::IpAddr};

use lb::source::kubernetes::slim::{EndpointSlice, Service as K8sService};
use lb::{
    model::{Algorithm, BackendState, FrontendKind, Protocol, Service, ServiceName},
    source::kubernetes::translate::{slice_service, translate, NodeContext, Translation},
};

fn load(fixture: &str) -> (Vec<K8sService>, Vec<EndpointSlice>) {
    let text = std::fs::read_to_string(format!(
        "{}/tests/fixtures/k8s/{fixture}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
    let (mut services, mut slices) = (Vec::new(), Vec::new());
    for doc in docs {
        match doc["kind"].as_str() {
            Some("Service") => services.push(serde_json::from_value(doc).unwrap()),
            Some("EndpointSlice") => slices.push(serde_json::from_value(doc).unwrap()),
            other => panic!("unexpected kind {other:?}"),
        }
    }
    (services, slices)
}

fn node() -> NodeContext {
    NodeContext {
        name: "node-a".into(),
        nodeport_addresses: vec!["192.168.1.10".parse().unwrap()],
        zone: "zone-a".into(),
        ..Default::default()
    }
}

/// Translates every service of a fixture with its slices.
fn translate_all(fixture: &str) -> BTreeMap<ServiceName, Translation> {
    let (services, slices) = load(fixture);
    services
        .iter()
        .map(|svc| {
            let name = lb::source::kubernetes::translate::service_name(svc);
            let own = slices
                .iter()
                .filter(|s| slice_service(s).as_ref() == Some(&name));
            let t = translate(svc, own, &node());
            (name, t)
        })
        .collect()
}

fn svc<'a>(t: &'a BTreeMap<ServiceName, Translation>, ns: &str, name: &str) -> &'a Service {
    t[&ServiceName::new(ns, name)]
        .service
        .as_ref()
        .expect("translated")
}

/// (address:port/proto kind) → backends "addr:port state"
fn summary(s: &Service) -> Vec<(String, Vec<String>)> {
    s.frontends
        .iter()
        .map(|f| {
            (
                format!(
                    "{}:{}/{} {}",
                    f.address,
                    f.port,
                    f.protocol.as_str(),
                    f.kind.as_str()
                ),
                f.backends
                    .iter()
                    .map(|b| format!("{}:{} {}", b.address, b.port, b.state.as_str()))
                    .collect(),
            )
        })
        .collect()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn kubeadm_kube_dns_has_three_frontends_by_port_name() {
    let t = translate_all("kube-dns.yaml");
    let s = svc(&t, "kube-system", "kube-dns");
    assert_eq!(
        summary(s),
        vec![
            (
                "10.96.0.10:53/TCP ClusterIP".into(),
                vec!["10.244.0.2:53 active".into(), "10.244.1.3:53 active".into()]
            ),
            (
                "10.96.0.10:53/UDP ClusterIP".into(),
                vec!["10.244.0.2:53 active".into(), "10.244.1.3:53 active".into()]
            ),
            (
                "10.96.0.10:9153/TCP ClusterIP".into(),
                vec![
                    "10.244.0.2:9153 active".into(),
                    "10.244.1.3:9153 active".into()
                ]
            ),
        ]
    );
    // nodeName marks the endpoint on this node.
    assert!(s.frontends[0].backends[0].local && !s.frontends[0].backends[1].local);
    assert!(t[&ServiceName::new("kube-system", "kube-dns")]
        .warnings
        .is_empty());
}

#[test]
fn nodeport_serves_node_addresses_and_named_target_port_resolves_through_the_slice() {
    let t = translate_all("nodeport-named-target.yaml");
    let s = svc(&t, "shop", "web");
    assert_eq!(
        summary(s),
        vec![
            (
                "10.96.20.1:80/TCP ClusterIP".into(),
                vec![
                    "10.244.0.10:8080 active".into(),
                    "10.244.1.11:8080 active".into()
                ]
            ),
            (
                "192.168.1.10:30080/TCP NodePort".into(),
                vec![
                    "10.244.0.10:8080 active".into(),
                    "10.244.1.11:8080 active".into()
                ]
            ),
        ]
    );
}

#[test]
fn loadbalancer_ingress_ips_become_frontends_and_external_policy_local_is_marked() {
    let t = translate_all("loadbalancer-status.yaml");
    let s = svc(&t, "edge", "ingress");
    let kinds: Vec<(IpAddr, u16, FrontendKind, bool)> = s
        .frontends
        .iter()
        .map(|f| (f.address, f.port, f.kind, f.external_traffic_local))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (ip("10.96.30.1"), 443, FrontendKind::ClusterIP, false),
            (ip("192.168.1.10"), 30443, FrontendKind::NodePort, true),
            (ip("203.0.113.10"), 443, FrontendKind::LoadBalancer, true),
        ],
        "ipMode Proxy and hostname-only ingresses are not frontends"
    );
    // Clients on the node keep every endpoint (kube-proxy does the same).
    assert!(s.frontends.iter().all(|f| f.backends.len() == 2));
    assert_eq!(s.health_check_node_port, Some(31999));
    assert_eq!(s.local_ready_endpoints(), 1, "10.244.0.20 on node-a");
}

#[test]
fn dual_stack_service_gets_one_frontend_per_family_with_that_familys_backends() {
    let t = translate_all("dual-stack.yaml");
    assert_eq!(
        summary(svc(&t, "default", "api")),
        vec![
            (
                "10.96.40.1:9000/TCP ClusterIP".into(),
                vec!["10.244.0.40:9000 active".into()]
            ),
            (
                "fd00:10:96::40:9000/TCP ClusterIP".into(),
                vec!["fd00:10:244::40:9000 active".into()]
            ),
        ]
    );
}

#[test]
fn terminating_rollout_serves_ready_and_serving_terminating_endpoints_and_drains_the_rest() {
    let t = translate_all("terminating-rollout.yaml");
    assert_eq!(
        summary(svc(&t, "default", "app")),
        vec![(
            "10.96.50.1:80/TCP ClusterIP".into(),
            vec![
                "10.244.0.51:8080 terminating".into(),
                "10.244.0.52:8080 terminating".into(),
                "10.244.0.53:8080 maintenance".into(),
                "10.244.0.54:8080 maintenance".into(),
                "10.244.0.60:8080 active".into()
            ]
        )],
        "not serving (.53) and not ready (.54) take no new flow but keep theirs \
         (maintenance) until they leave the slice; .60 listed in two slices counts once"
    );
}

#[test]
fn internal_policy_local_keeps_only_this_nodes_endpoints_and_affinity_is_read() {
    let t = translate_all("policies-and-skips.yaml");
    let s = svc(&t, "default", "local-only");
    assert_eq!(
        summary(s),
        vec![(
            "10.96.60.1:80/TCP ClusterIP".into(),
            vec!["10.244.0.70:80 active".into()]
        )]
    );
    assert_eq!(s.frontends[0].affinity_timeout_s, Some(60));
    assert_eq!(s.frontends[0].algorithm, Algorithm::Random);
    let w = &t[&ServiceName::new("default", "local-only")].warnings;
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].reason, "unsupported-protocol");
    assert!(w[0].message.contains("SCTP"));
}

/// policies-and-skips.yaml's "local-only" Service and its slices.
fn local_only() -> (K8sService, Vec<EndpointSlice>) {
    let (services, slices) = load("policies-and-skips.yaml");
    let svc = services
        .into_iter()
        .find(|s| s.metadata.name.as_deref() == Some("local-only"))
        .unwrap();
    let own = slices
        .into_iter()
        .filter(|s| slice_service(s) == Some(ServiceName::new("default", "local-only")))
        .collect();
    (svc, own)
}

#[test]
fn lb_algorithm_applies_to_services_without_the_annotation_and_the_annotation_wins() {
    let (mut plain, slices) = local_only();
    let own = || slices.iter();
    let maglev_node = NodeContext {
        default_algorithm: Algorithm::Maglev,
        ..node()
    };
    let s = translate(&plain, own(), &maglev_node).service.unwrap();
    assert_eq!(s.frontends[0].algorithm, Algorithm::Maglev);
    plain.metadata.annotations = Some(
        [("lb.dev/algorithm".to_string(), "random".to_string())]
            .into_iter()
            .collect(),
    );
    let s = translate(&plain, own(), &maglev_node).service.unwrap();
    assert_eq!(s.frontends[0].algorithm, Algorithm::Random);
    // A bad annotation falls back to the node's default, with a warning.
    plain.metadata.annotations = Some(
        [("lb.dev/algorithm".to_string(), "roundrobin".to_string())]
            .into_iter()
            .collect(),
    );
    let t = translate(&plain, own(), &maglev_node);
    assert_eq!(t.service.unwrap().frontends[0].algorithm, Algorithm::Maglev);
    assert!(t.warnings.iter().any(|w| w.reason == "invalid-annotation"));
}

/// `lb.dev/forwarding-mode` reaches the frontends that take traffic from
/// outside (a ClusterIP's never crosses nodes translated); a value that is
/// not snat or dsr is warned about and the agent's --lb-mode used.
#[test]
fn the_forwarding_mode_annotation_reaches_external_frontends_and_a_bad_one_is_warned() {
    use lb::model::ForwardingMode;
    let (services, slices) = load("loadbalancer-status.yaml");
    let mut svc = services
        .into_iter()
        .find(|s| s.metadata.name.as_deref() == Some("ingress"))
        .unwrap();
    let name = lb::source::kubernetes::translate::service_name(&svc);
    let own = || {
        slices
            .iter()
            .filter(|s| slice_service(s).as_ref() == Some(&name))
    };
    for (value, want) in [
        ("dsr", Some(ForwardingMode::Dsr)),
        ("snat", Some(ForwardingMode::Snat)),
        ("direct", None),
    ] {
        svc.metadata.annotations = Some(
            [("lb.dev/forwarding-mode".to_string(), value.to_string())]
                .into_iter()
                .collect(),
        );
        let t = translate(&svc, own(), &node());
        let fes = t.service.unwrap().frontends;
        assert!(
            fes.iter().any(|f| f.kind != FrontendKind::ClusterIP),
            "{fes:?}"
        );
        for fe in &fes {
            let expect = if fe.kind == FrontendKind::ClusterIP {
                None
            } else {
                want
            };
            assert_eq!(fe.forwarding, expect, "{value}: {:?}", fe.kind);
        }
        let warned = t.warnings.iter().any(|w| w.reason == "invalid-annotation");
        assert_eq!(warned, want.is_none(), "{value}: {:?}", t.warnings);
    }
}

/// `lb.dev/metrics: "true"` opts the service's counters into the metrics;
/// "false" or no annotation keeps them out, anything else is warned about.
#[test]
fn the_metrics_annotation_opts_a_service_in_and_a_bad_value_is_warned() {
    let (mut svc, slices) = local_only();
    for (value, want, warned) in [
        (Some("true"), true, false),
        (Some(" true "), true, false),
        (Some("false"), false, false),
        (None, false, false),
        (Some("yes"), false, true),
    ] {
        svc.metadata.annotations = value.map(|v| {
            [("lb.dev/metrics".to_string(), v.to_string())]
                .into_iter()
                .collect()
        });
        let t = translate(&svc, slices.iter(), &node());
        assert_eq!(t.service.unwrap().metrics, want, "{value:?}");
        let w = t.warnings.iter().any(|w| w.reason == "invalid-annotation");
        assert_eq!(w, warned, "{value:?}: {:?}", t.warnings);
    }
}

#[test]
fn a_maglev_service_takes_its_table_size_from_the_annotation_and_a_bad_one_is_warned_and_ignored() {
    let (mut svc, slices) = local_only();
    let own = || slices.iter();
    let annotate = |svc: &mut K8sService, pairs: &[(&str, &str)]| {
        svc.metadata.annotations = Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
    };
    annotate(
        &mut svc,
        &[
            ("lb.dev/algorithm", "maglev"),
            ("lb.dev/maglev-table-size", "131071"),
        ],
    );
    let t = translate(&svc, own(), &node());
    assert!(
        !t.warnings.iter().any(|w| w.reason == "invalid-annotation"),
        "{:?}",
        t.warnings
    );
    let s = t.service.unwrap();
    assert!(!s.frontends.is_empty());
    assert!(s
        .frontends
        .iter()
        .all(|f| f.maglev_table_size == Some(131_071)));
    // 65539 is prime but not a listed size.
    for (alg, size) in [
        ("maglev", "100000"),
        ("maglev", "65539"),
        ("maglev", "big"),
        ("random", "65537"),
    ] {
        annotate(
            &mut svc,
            &[
                ("lb.dev/algorithm", alg),
                ("lb.dev/maglev-table-size", size),
            ],
        );
        let t = translate(&svc, own(), &node());
        assert!(
            t.warnings.iter().any(|w| w.reason == "invalid-annotation"
                && w.message.contains("lb.dev/maglev-table-size")),
            "{alg} {size}: {:?}",
            t.warnings
        );
        let s = t.service.unwrap();
        assert!(!s.frontends.is_empty());
        assert!(
            s.frontends.iter().all(|f| f.maglev_table_size.is_none()),
            "{alg} {size}"
        );
    }
}

#[test]
fn selectorless_service_with_hand_made_slice_works_like_any_other() {
    let t = translate_all("policies-and-skips.yaml");
    assert_eq!(
        summary(svc(&t, "default", "external-db")),
        vec![(
            "10.96.60.2:5432/TCP ClusterIP".into(),
            vec!["192.0.2.50:5432 active".into()]
        )]
    );
    assert_eq!(
        svc(&t, "default", "external-db").frontends[0].protocol,
        Protocol::Tcp
    );
}

#[test]
fn headless_externalname_and_other_proxys_services_are_left_alone() {
    let t = translate_all("policies-and-skips.yaml");
    for name in ["headless", "alias", "other-proxy"] {
        assert!(
            t[&ServiceName::new("default", name)].service.is_none(),
            "{name} must be skipped"
        );
    }
}

#[test]
fn bad_values_in_objects_are_skipped_with_warnings() {
    let (mut services, slices) = load("kube-dns.yaml");
    let s = &mut services[0];
    let spec = s.spec.as_mut().unwrap();
    spec.cluster_ips = Some(vec!["10.96.0.300".into(), "10.96.0.11".into()]);
    spec.ports.as_mut().unwrap()[2].port = 70000;
    spec.ports.as_mut().unwrap()[1].port = 53;
    spec.ports.as_mut().unwrap()[1].protocol = Some("UDP".into()); // duplicate of port 0
    let t = translate(s, slices.iter(), &node());
    let reasons: Vec<&str> = t.warnings.iter().map(|w| w.reason).collect();
    assert_eq!(
        reasons,
        vec!["invalid-address", "invalid-port", "invalid-port"],
        "{:?}",
        t.warnings
    );
    let fe = &t.service.unwrap().frontends;
    assert_eq!(fe.len(), 1);
    assert_eq!((fe[0].address, fe[0].port), (ip("10.96.0.11"), 53));
    assert_eq!(fe[0].backends[0].state, BackendState::Active);
}

/// A Service with 100 000 endpoints in 100 slices (the EndpointSlice limit
/// is 1000 endpoints each), plus an endpoint with a bad address. A frontend
/// holds at most 65 535 backends (the slot count is 16 bits): the most
/// usable ones are kept and a warning says so; the bad endpoint is skipped
/// with a warning of its own.
#[test]
fn a_service_with_100000_endpoints_keeps_65535_loudly_and_skips_a_bad_address() {
    let (services, slices) = load("kube-dns.yaml");
    let template = slices[0].clone();
    let big: Vec<EndpointSlice> = (0..100u32)
        .map(|s| {
            let mut slice = template.clone();
            slice.metadata.name = Some(format!("big-{s}"));
            let ep = slice.endpoints[0].clone();
            slice.endpoints = (0..1000u32)
                .map(|i| {
                    let mut e = ep.clone();
                    let n = s * 1000 + i;
                    e.addresses =
                        vec![
                            std::net::Ipv4Addr::from(u32::from_be_bytes([10, 128, 0, 0]) + n)
                                .to_string(),
                        ];
                    e
                })
                .collect();
            slice
        })
        .collect();
    let mut bad = template.clone();
    bad.metadata.name = Some("bad".into());
    bad.endpoints.truncate(1);
    bad.endpoints[0].addresses = vec!["10.0.0.999".into()];
    let started = std::time::Instant::now();
    let t = translate(
        &services[0],
        big.iter().chain(std::iter::once(&bad)),
        &node(),
    );
    let took = started.elapsed();
    let svc = t.service.expect("translated");
    for fe in &svc.frontends {
        assert_eq!(fe.backends.len(), 65_535, "{}:{}", fe.address, fe.port);
    }
    let too_many = t
        .warnings
        .iter()
        .filter(|w| w.reason == "too-many-endpoints")
        .count();
    assert_eq!(
        too_many,
        svc.frontends.len(),
        "one warning per port: {:?}",
        t.warnings.iter().map(|w| &w.message).collect::<Vec<_>>()
    );
    assert!(
        t.warnings
            .iter()
            .any(|w| w.reason == "invalid-address" && w.message.contains("10.0.0.999")),
        "{:?}",
        t.warnings
    );
    println!(
        "translated 100000 endpoints x {} ports in {took:?}",
        svc.frontends.len()
    );
}

/// Backend addresses of the frontend at `addr`.
fn backends_of(s: &Service, addr: &str) -> Vec<String> {
    s.frontends
        .iter()
        .find(|f| f.address == ip(addr))
        .expect("frontend")
        .backends
        .iter()
        .map(|b| format!("{} {}", b.address, b.state.as_str()))
        .collect()
}

#[test]
fn zone_hints_keep_cluster_traffic_in_this_nodes_zone_and_terminating_endpoints_stay_as_fallback() {
    let t = translate_all("topology-hints.yaml");
    assert_eq!(
        backends_of(svc(&t, "topo", "zoned"), "10.96.40.1"),
        vec![
            "10.244.0.10 active",
            "10.244.1.11 terminating",
            "10.244.2.10 active"
        ],
        "zone-b's ready endpoint is left to zone-b's nodes"
    );
}

#[test]
fn node_hints_win_over_zone_hints_when_one_is_for_this_node() {
    let t = translate_all("topology-hints.yaml");
    assert_eq!(
        backends_of(svc(&t, "topo", "by-node"), "10.96.40.2"),
        vec!["10.244.0.20 active"]
    );
    // The same slice seen from a node without its own endpoint falls back
    // to the zone hints.
    let (services, slices) = load("topology-hints.yaml");
    let by_node = services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("by-node"))
        .unwrap();
    let own = slices
        .iter()
        .filter(|s| s.metadata.name.as_deref() == Some("by-node-1"));
    let other = NodeContext {
        name: "node-z".into(),
        ..node()
    };
    let s = translate(by_node, own, &other).service.unwrap();
    assert_eq!(
        backends_of(&s, "10.96.40.2"),
        vec!["10.244.0.20 active", "10.244.2.20 active"],
        "node-z is in zone-a but has no node hint"
    );
}

#[test]
fn hints_are_ignored_when_one_ready_endpoint_lacks_them_or_none_is_for_this_zone() {
    let t = translate_all("topology-hints.yaml");
    assert_eq!(
        backends_of(svc(&t, "topo", "partial"), "10.96.40.3").len(),
        2
    );
    assert_eq!(
        backends_of(svc(&t, "topo", "elsewhere"), "10.96.40.4").len(),
        2
    );
    // A node without a zone label uses no zone hints.
    let (services, slices) = load("topology-hints.yaml");
    let zoned = services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("zoned"))
        .unwrap();
    let own = slices
        .iter()
        .filter(|s| s.metadata.name.as_deref() == Some("zoned-1"));
    let unzoned = NodeContext {
        zone: String::new(),
        ..node()
    };
    let s = translate(zoned, own, &unzoned).service.unwrap();
    assert_eq!(backends_of(&s, "10.96.40.1").len(), 4);
}

#[test]
fn internal_policy_local_ignores_hints_and_external_local_keeps_its_own_endpoint() {
    let t = translate_all("topology-hints.yaml");
    assert_eq!(
        backends_of(svc(&t, "topo", "local-policy"), "10.96.40.5"),
        vec!["10.244.0.50 active"],
        "this node's endpoint, though hinted for zone-b"
    );
    let s = svc(&t, "topo", "external-local");
    assert_eq!(
        backends_of(s, "10.96.40.6"),
        vec!["10.244.2.60 active"],
        "the ClusterIP follows the zone hints"
    );
    let np = s
        .frontends
        .iter()
        .find(|f| f.kind == FrontendKind::NodePort)
        .unwrap();
    let local: Vec<String> = np
        .backends
        .iter()
        .filter(|b| b.local)
        .map(|b| b.address.to_string())
        .collect();
    assert_eq!(
        local,
        vec!["10.244.0.60"],
        "traffic from outside reaches this node's endpoint whatever its hint"
    );
}

/// spec.loadBalancerSourceRanges restricts the LoadBalancer addresses only,
/// each by the networks of its own family; a range that does not parse is
/// skipped with a warning.
#[test]
fn load_balancer_source_ranges_restrict_only_the_load_balancer_addresses_by_family() {
    let svc: K8sService = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "guarded", "namespace": "default"},
        "spec": {
            "type": "LoadBalancer",
            "clusterIP": "10.96.0.9", "clusterIPs": ["10.96.0.9"],
            "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30090}],
            "loadBalancerSourceRanges": ["203.0.113.7/24", "fd00::/8", "nonsense"]
        },
        "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.9"}, {"ip": "2001:db8::9"}]}}
    }))
    .unwrap();
    let t = translate(&svc, std::iter::empty(), &node());
    assert!(
        t.warnings
            .iter()
            .any(|w| w.reason == "invalid-source-range"),
        "{:?}",
        t.warnings
    );
    let s = t.service.unwrap();
    let ranges = |addr: &str| -> Vec<String> {
        let a: IpAddr = addr.parse().unwrap();
        s.frontends
            .iter()
            .find(|f| f.address == a)
            .unwrap()
            .source_ranges
            .iter()
            .map(std::string::ToString::to_string)
            .collect()
    };
    assert_eq!(ranges("198.51.100.9"), ["203.0.113.0/24"]);
    assert_eq!(ranges("2001:db8::9"), ["fd00::/8"]);
    assert!(ranges("10.96.0.9").is_empty(), "the ClusterIP is open");
    assert!(ranges("192.168.1.10").is_empty(), "the NodePort is open");
}
