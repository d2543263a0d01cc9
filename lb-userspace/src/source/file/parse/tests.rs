//! The services file parser's unit tests: good files, and each bad field
//! named in its error.
use super::*;
use crate::model::{Algorithm, BackendState, FrontendKind};

const GOOD: &str = r#"
services:
  - name: web
    clusterIPs: [10.96.0.10]
    ports:
      - name: http
        port: 80
        targetPort: 8080
      - name: dns
        port: 53
        protocol: UDP
    backends:
      - address: 10.244.1.2
      - address: 10.244.1.3
        state: terminating
  - name: db
    namespace: prod
    clusterIPs: [10.96.0.20]
    externalIPs: [192.0.2.10]
    ports: [{port: 5432}]
"#;

#[test]
fn services_without_an_algorithm_take_the_agents_default() {
    let yaml = "services: [{name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}], backends: [{address: 10.0.0.1}]}, {name: b, algorithm: random, clusterIPs: [10.96.0.2], ports: [{port: 80}], backends: [{address: 10.0.0.1}]}]";
    let alg =
        |m: &Model, n: &str| m.services[&ServiceName::new("default", n)].frontends[0].algorithm;
    let m = parse(yaml).unwrap();
    assert_eq!(alg(&m, "a"), Algorithm::Random);
    let ctx = FileContext {
        default_algorithm: Algorithm::Maglev,
        ..Default::default()
    };
    let m = parse_with(yaml, &ctx).unwrap();
    assert_eq!(alg(&m, "a"), Algorithm::Maglev);
    assert_eq!(
        alg(&m, "b"),
        Algorithm::Random,
        "the file's own choice wins"
    );
}

#[test]
fn parses_multi_port_service_into_one_frontend_per_address_and_port() {
    let model = parse(GOOD).unwrap();
    let web = &model.services[&ServiceName::new("default", "web")];
    assert_eq!(web.frontends.len(), 2);
    let http = &web.frontends[0];
    assert_eq!(http.address, "10.96.0.10".parse::<IpAddr>().unwrap());
    assert_eq!(http.port, 80);
    assert_eq!(http.protocol, crate::model::Protocol::Tcp);
    assert_eq!(http.backends.len(), 2);
    assert!(http.backends.iter().all(|b| b.port == 8080));
    assert_eq!(http.backends[1].state, BackendState::Terminating);
    let dns = &web.frontends[1];
    assert_eq!((dns.port, dns.protocol), (53, crate::model::Protocol::Udp));
    assert!(
        dns.backends.iter().all(|b| b.port == 53),
        "targetPort defaults to port"
    );

    let db = &model.services[&ServiceName::new("prod", "db")];
    assert_eq!(db.frontends.len(), 2);
    assert_eq!(db.frontends[1].kind, FrontendKind::ExternalIP);
    assert!(db.frontends[0].backends.is_empty());
}

#[test]
fn empty_file_is_an_empty_model() {
    assert_eq!(parse("services: []").unwrap(), Model::default());
    assert_eq!(parse("services:").unwrap(), Model::default());
    assert_eq!(parse("").unwrap(), Model::default());
    assert_eq!(parse("{}").unwrap(), Model::default());
}

#[test]
fn the_streamed_parse_refuses_what_the_whole_file_parse_refuses() {
    let e = parse("servics: []").unwrap_err();
    assert!(e.message.contains("unknown field `servics`"), "{e}");
    let e = parse("services: []\nservices: []").unwrap_err();
    assert!(e.message.contains("services"), "{e}");
    let e = parse("services: {name: a}").unwrap_err();
    assert!(e.message.contains("not a valid services file"), "{e}");
    // The converter's own error, with its field, stops the parse at the
    // service it refuses (the third one is never looked at).
    let e = parse(
        "services:\n- {name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}]}\n\
         - {name: b, clusterIPs: [10.96.0.1], ports: [{port: 80}]}\n\
         - {name: c, clusterIPs: [nonsense], ports: [{port: 80}]}",
    )
    .unwrap_err();
    assert_eq!(e.field, "services[1]");
    assert!(
        e.message
            .contains("already a frontend of services[0] (default/a)"),
        "{e}"
    );
}

/// One service naming the same frontend twice (a node address among its
/// externalIPs, on its own NodePort) is refused, whole parse and
/// incremental read alike, as another service's would be.
#[test]
fn a_service_that_repeats_its_own_frontend_is_refused() {
    let ctx = FileContext {
        nodeport_addresses: vec!["192.168.1.2".parse().unwrap()],
        ..Default::default()
    };
    let yaml = "services:\n- {name: a, type: NodePort, clusterIPs: [10.96.0.1], externalIPs: [192.168.1.2], ports: [{port: 30001, nodePort: 30001}]}\n";
    let e = parse_with(yaml, &ctx).unwrap_err();
    assert_eq!(e.field, "services[0]");
    assert!(
        e.message
            .contains("192.168.1.2:30001/TCP is a frontend of this service twice"),
        "{e}"
    );
    // An edit into it, read incrementally after a good read.
    let mut cache = super::super::cache::FileCache::default();
    cache
        .read(&yaml.replace("externalIPs: [192.168.1.2], ", ""), &ctx)
        .unwrap();
    let e = cache.read(yaml, &ctx).unwrap_err();
    assert!(e.message.contains("twice"), "{e}");
}

fn bad(yaml: &str) -> FileError {
    parse(yaml).expect_err("must be rejected")
}

#[test]
fn rejects_port_zero_naming_the_field() {
    let e = bad("services: [{name: a, clusterIPs: [10.96.0.1], ports: [{port: 0}]}]");
    assert_eq!(e.field, "services[0].ports[0].port");
    assert!(e.message.contains("1-65535"), "{e}");
}

#[test]
fn rejects_out_of_range_target_port() {
    let e = bad(
        "services: [{name: a, clusterIPs: [10.96.0.1], ports: [{port: 80, targetPort: 70000}]}]",
    );
    assert_eq!(e.field, "services[0].ports[0].targetPort");
}

#[test]
fn rejects_bad_addresses_naming_the_field() {
    let e = bad("services: [{name: a, clusterIPs: [10.96.0.300], ports: [{port: 80}]}]");
    assert_eq!(e.field, "services[0].clusterIPs[0]");
    let e = bad(
        "services: [{name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}], backends: [{address: nope}]}]",
    );
    assert_eq!(e.field, "services[0].backends[0].address");
    let e = bad("services: [{name: a, clusterIPs: [0.0.0.0], ports: [{port: 80}]}]");
    assert!(e.message.contains("unicast"), "{e}");
    let e = bad("services: [{name: a, clusterIPs: ['ff02::1'], ports: [{port: 80}]}]");
    assert!(e.message.contains("unicast"), "{e}");
}

#[test]
fn rejects_unknown_protocol_and_sctp() {
    let e =
        bad("services: [{name: a, clusterIPs: [10.96.0.1], ports: [{port: 80, protocol: ICMP}]}]");
    assert_eq!(e.field, "services[0].ports[0].protocol");
    let e =
        bad("services: [{name: a, clusterIPs: [10.96.0.1], ports: [{port: 80, protocol: SCTP}]}]");
    assert!(e.message.contains("SCTP"), "{e}");
}

#[test]
fn rejects_duplicates() {
    let e = bad("services: [{name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}, {port: 80}]}]");
    assert_eq!(e.field, "services[0].ports[1].port");
    let e = bad(
        "services: [{name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}], backends: [{address: 10.0.0.1}, {address: 10.0.0.1}]}]",
    );
    assert_eq!(e.field, "services[0].backends[1].address");
    let e = bad(
        "services: [{name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}]}, {name: a, clusterIPs: [10.96.0.2], ports: [{port: 80}]}]",
    );
    assert_eq!(e.field, "services[1].name");
}

#[test]
fn rejects_the_same_frontend_in_two_services() {
    let e = bad(
        "services: [{name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}]}, {name: b, clusterIPs: [10.96.0.1], ports: [{port: 80}]}]",
    );
    assert_eq!(e.field, "services[1]");
    assert!(e.message.contains("services[0] (default/a)"), "{e}");
}

#[test]
fn rejects_a_backend_local_in_one_service_and_not_in_another() {
    let e = bad(
        "services: [{name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}], backends: [{address: 10.0.0.1, local: true}]}, {name: b, clusterIPs: [10.96.0.2], ports: [{port: 80}], backends: [{address: 10.0.0.1}]}]",
    );
    assert_eq!(e.field, "services[1].backends[0].local");
    assert!(e.message.contains("services[0].backends[0]"), "{e}");
}

#[test]
fn rejects_missing_address_and_ports() {
    let e = bad("services: [{name: a, ports: [{port: 80}]}]");
    assert!(e.message.contains("clusterIPs"), "{e}");
    let e = bad("services: [{name: a, clusterIPs: [10.96.0.1]}]");
    assert_eq!(e.field, "services[0].ports");
}

#[test]
fn rejects_unknown_fields_and_syntax_errors() {
    let e = bad("services: [{name: a, clusterIP: 10.96.0.1, ports: [{port: 80}]}]");
    assert!(e.message.contains("clusterIP"), "{e}");
    let e = bad("services: [{name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}], backends: [{address: 10.0.0.1, state: sleeping}]}]");
    assert!(e.message.contains("sleeping"), "{e}");
    let e = bad("services: [ {name: a");
    assert!(e.field.is_empty());
}

#[test]
fn maglev_weights_and_affinity_are_read() {
    let m = parse("services: [{name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}], sessionAffinity: ClientIP, algorithm: maglev, backends: [{address: 10.0.0.1, weight: 3}]}]").unwrap();
    let fe = &m.services[&ServiceName::new("default", "a")].frontends[0];
    assert_eq!(fe.affinity_timeout_s, Some(10_800));
    assert_eq!(fe.algorithm, Algorithm::Maglev);
    assert_eq!(fe.backends[0].weight, 3);
    let e = bad("services: [{name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}], backends: [{address: 10.0.0.1, weight: 0}]}]");
    assert_eq!(e.field, "services[0].backends[0].weight");
}

#[test]
fn a_maglev_service_may_ask_for_its_table_size_from_the_listed_primes() {
    let svc = |extra: &str| {
        format!("services: [{{name: a, clusterIPs: [10.96.0.1], ports: [{{port: 80}}, {{port: 81}}], {extra} backends: [{{address: 10.0.0.1}}]}}]")
    };
    let m = parse(&svc("algorithm: maglev, maglevTableSize: 131071,")).unwrap();
    let fes = &m.services[&ServiceName::new("default", "a")].frontends;
    assert!(
        fes.iter().all(|fe| fe.maglev_table_size == Some(131_071)),
        "every port"
    );
    let m = parse(&svc("algorithm: maglev,")).unwrap();
    let fe = &m.services[&ServiceName::new("default", "a")].frontends[0];
    assert_eq!(fe.maglev_table_size, None, "unset: the agent's size");
    for wrong in ["100000", "16380", "-1", "0", "99999999999"] {
        let e = bad(&svc(&format!(
            "algorithm: maglev, maglevTableSize: {wrong},"
        )));
        assert_eq!(e.field, "services[0].maglevTableSize", "{wrong}");
        assert!(e.message.contains("65537"), "lists the sizes: {e}");
    }
    let e = bad(&svc("algorithm: random, maglevTableSize: 65537,"));
    assert_eq!(e.field, "services[0].maglevTableSize");
    assert!(e.message.contains("algorithm: maglev"), "{e}");
}

#[test]
fn nodeports_use_the_node_addresses_and_policies_apply() {
    let yaml = "services: [{name: a, type: NodePort, externalTrafficPolicy: Local, internalTrafficPolicy: Local, clusterIPs: [10.96.0.1], ports: [{port: 80, nodePort: 30080}], backends: [{address: 10.0.0.1, local: true}, {address: 10.0.0.2}]}]";
    let e = bad(yaml);
    assert_eq!(e.field, "services[0].ports[0].nodePort");
    assert!(e.message.contains("--devices"), "{e}");
    let ctx = FileContext {
        nodeport_addresses: vec!["192.168.1.10".parse().unwrap()],
        ..Default::default()
    };
    let m = parse_with(yaml, &ctx).unwrap();
    let fe = &m.services[&ServiceName::new("default", "a")].frontends;
    assert_eq!(fe.len(), 2);
    assert_eq!(
        (fe[1].port, fe[1].kind, fe[1].external_traffic_local),
        (30080, FrontendKind::NodePort, true)
    );
    assert_eq!(
        fe[1].backends.len(),
        2,
        "node-local clients use every backend"
    );
    assert_eq!(
        fe[0].backends.len(),
        1,
        "internalTrafficPolicy: Local keeps the local one"
    );
    let e =
        bad("services: [{name: a, clusterIPs: [10.96.0.1], ports: [{port: 80, nodePort: 30080}]}]");
    assert!(e.message.contains("type: NodePort"), "{e}");
}

#[test]
fn nodeports_exist_only_on_node_addresses_of_the_services_clusterip_families() {
    let ctx = FileContext {
        nodeport_addresses: vec![
            "192.168.1.10".parse().unwrap(),
            "fd00:1::10".parse().unwrap(),
        ],
        ..Default::default()
    };
    let nodeports = |yaml: &str| -> Vec<IpAddr> {
        let m = parse_with(yaml, &ctx).unwrap();
        let mut v: Vec<IpAddr> = m.services[&ServiceName::new("default", "a")]
            .frontends
            .iter()
            .filter(|f| f.kind == FrontendKind::NodePort)
            .map(|f| f.address)
            .collect();
        v.sort();
        v
    };
    // Single-stack IPv4, even with an IPv6 external IP: IPv4 only.
    assert_eq!(
        nodeports("services: [{name: a, type: NodePort, clusterIPs: [10.96.0.1], externalIPs: [\"2001:db8::1\"], ports: [{port: 80, nodePort: 30080}], backends: [{address: 10.244.1.2}]}]"),
        vec!["192.168.1.10".parse::<IpAddr>().unwrap()]
    );
    // Single-stack IPv6.
    assert_eq!(
        nodeports("services: [{name: a, type: NodePort, clusterIPs: [\"fd00:96::1\"], ports: [{port: 80, nodePort: 30080}], backends: [{address: \"fd00:244::2\"}]}]"),
        vec!["fd00:1::10".parse::<IpAddr>().unwrap()]
    );
    // Dual-stack: both.
    assert_eq!(
        nodeports("services: [{name: a, type: NodePort, clusterIPs: [10.96.0.1, \"fd00:96::1\"], ports: [{port: 80, nodePort: 30080}], backends: [{address: 10.244.1.2}, {address: \"fd00:244::2\"}]}]").len(),
        2
    );
}

#[test]
fn session_affinity_values_are_checked() {
    let e = bad("services: [{name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}], sessionAffinity: Cookie}]");
    assert_eq!(e.field, "services[0].sessionAffinity");
    let e = bad("services: [{name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}], sessionAffinity: ClientIP, sessionAffinityTimeoutSeconds: 0}]");
    assert_eq!(e.field, "services[0].sessionAffinityTimeoutSeconds");
}

/// The examples users copy from the README must be valid files.
#[test]
fn every_services_file_example_in_the_readme_parses() {
    let readme = include_str!("../../../../../README.md");
    let blocks: Vec<&str> = readme
        .split("```yaml\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .filter(|b| b.starts_with("services:"))
        .collect();
    assert!(blocks.len() >= 2, "README has services file examples");
    // As run with --devices (the NodePort example needs node addresses).
    let ctx = FileContext {
        nodeport_addresses: vec!["192.168.1.10".parse().unwrap()],
        ..Default::default()
    };
    for b in blocks {
        if let Err(e) = parse_with(b, &ctx) {
            panic!("README example does not parse: {e}\n{b}");
        }
    }
}

/// Beyond serde-saphyr's default budget (250 000 nodes: about 16 000
/// services like these); the benchmark parses 100 000 in release mode.
#[test]
fn a_file_of_30000_services_parses() {
    let mut text = String::from("services:\n");
    for i in 0..30_000u32 {
        let vip = std::net::Ipv4Addr::from(u32::from_be_bytes([10, 96, 0, 0]) + i + 1);
        let pod = std::net::Ipv4Addr::from(u32::from_be_bytes([10, 128, 0, 0]) + i + 1);
        text.push_str(&format!(
            "  - {{name: s{i}, clusterIPs: [{vip}], ports: [{{port: 80}}], backends: [{{address: {pod}}}]}}\n"
        ));
    }
    let m = parse(&text).expect("parses");
    assert_eq!(m.services.len(), 30_000);
}
