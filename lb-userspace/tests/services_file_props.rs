//! Property tests of the services file parser: whatever the values (good,
//! out of range, not addresses at all) and whatever the bytes, parsing never
//! panics; a refused file names the field at fault and says what to do; an
//! accepted file gives exactly the frontends and backends it describes.
use lb::source::file::parse::parse;
use proptest::prelude::*;

fn address() -> impl Strategy<Value = String> {
    // Mostly good addresses, so that some whole files are valid (roughly
    // one in ten, nearly all of one service) and the oracle checks
    // acceptance as well as refusal. The rules across services (names,
    // frontends) are met here rarely; parse/mod.rs's unit tests cover them.
    prop_oneof![
        12 => (1u8..=254, 0u8..=255, 1u8..=254).prop_map(|(a, b, c)| format!("10.{a}.{b}.{c}")),
        2 => Just("fd00::10".to_string()),
        1 => Just("10.0.0.256".to_string()),
        1 => Just("not-an-ip".to_string()),
        1 => Just("".to_string()),
        1 => Just("224.0.0.1".to_string()),
        1 => "[a-z0-9.:]{1,20}",
    ]
}

fn port() -> impl Strategy<Value = i64> {
    prop_oneof![8 => 1i64..=65535, 1 => Just(0i64), 1 => 65536i64..100_000, 1 => -5i64..0]
}

fn protocol() -> impl Strategy<Value = &'static str> {
    prop_oneof![4 => Just("TCP"), 4 => Just("UDP"), 1 => Just("SCTP"), 1 => Just("tcp "), 1 => Just("ICMP")]
}

#[derive(Debug, Clone)]
struct Svc {
    name: String,
    vip: String,
    port: i64,
    target: i64,
    proto: &'static str,
    backends: Vec<String>,
}

fn service() -> impl Strategy<Value = Svc> {
    (
        // Starts with 's': never a YAML keyword (null, true, ...).
        "s[a-z0-9-]{0,8}",
        address(),
        port(),
        port(),
        protocol(),
        prop::collection::vec(address(), 0..4),
    )
        .prop_map(|(name, vip, port, target, proto, backends)| Svc {
            name,
            vip,
            port,
            target,
            proto,
            backends,
        })
}

/// The file's rules, written from its documentation rather than from the
/// parser: whether `svcs` must be accepted. A unicast IP address (not
/// unspecified, multicast or broadcast); ports 1-65535; TCP or UDP; each
/// backend once per service; each service name once; each address, port and
/// protocol the frontend of one service only.
fn valid(svcs: &[Svc]) -> bool {
    use std::{collections::BTreeSet, net::IpAddr};
    let unicast = |text: &str| match text.trim().parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) => !(a.is_unspecified() || a.is_multicast() || a.is_broadcast()),
        Ok(IpAddr::V6(a)) => !(a.is_unspecified() || a.is_multicast()),
        Err(_) => false,
    };
    let port = |p: i64| (1..=65535).contains(&p);
    let mut names = BTreeSet::new();
    let mut frontends = BTreeSet::new();
    for s in svcs {
        if !unicast(&s.vip) || !port(s.port) || !port(s.target) {
            return false;
        }
        if !matches!(s.proto, "TCP" | "UDP") || !names.insert(&s.name) {
            return false;
        }
        let vip: IpAddr = s.vip.trim().parse().unwrap();
        if !frontends.insert((vip, s.port, s.proto)) {
            return false;
        }
        let mut seen = BTreeSet::new();
        for b in &s.backends {
            if !unicast(b) || !seen.insert(b.trim().parse::<IpAddr>().unwrap()) {
                return false;
            }
        }
    }
    true
}

fn render(svcs: &[Svc]) -> String {
    let mut y = String::from("services:\n");
    for s in svcs {
        let b: Vec<String> = s
            .backends
            .iter()
            .map(|a| format!("{{address: '{a}'}}"))
            .collect();
        y.push_str(&format!(
            "  - name: {}\n    clusterIPs: ['{}']\n    ports: [{{port: {}, targetPort: {}, protocol: {}}}]\n    backends: [{}]\n",
            s.name,
            s.vip,
            s.port,
            s.target,
            s.proto,
            b.join(", ")
        ));
    }
    y
}

/// A fixed seed per CI run: the same cases every time, so a failure is
/// reproducible; `PROPTEST_RNG_SEED` picks other ones (proptest prints the
/// failing case; it is kept in services_file_props.proptest-regressions and
/// replayed first on every run).
fn config(cases: u32) -> ProptestConfig {
    let seed = std::env::var("PROPTEST_RNG_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_f11e);
    eprintln!("services_file_props: seed {seed} (set PROPTEST_RNG_SEED to change it)");
    ProptestConfig {
        cases,
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(500))]

    #[test]
    fn refused_files_name_a_field_and_accepted_ones_match_their_text(svcs in prop::collection::vec(service(), 1..5)) {
        let parsed = parse(&render(&svcs));
        // A parser that refuses everything, or accepts garbage, fails here.
        prop_assert_eq!(parsed.is_ok(), valid(&svcs), "{:?} for {:?}", parsed.as_ref().err(), svcs);
        match parsed {
            Err(e) => {
                prop_assert!(e.field.starts_with("services["), "a field path: {e:?}");
                prop_assert!(e.message.len() > 10, "a message that says what to do: {e:?}");
            }
            Ok(model) => {
                // Accepted: every service is there with its one frontend and
                // the backends of the frontend's family.
                prop_assert_eq!(model.services.len(), svcs.len());
                for s in &svcs {
                    // By name: two services may share an address (and a
                    // port, with different protocols).
                    let svc = model
                        .services
                        .get(&lb::model::ServiceName::new("default", &s.name))
                        .expect("every accepted service is in the model");
                    prop_assert_eq!(svc.frontends.len(), 1);
                    let fe = &svc.frontends[0];
                    let vip: std::net::IpAddr = s.vip.parse().unwrap();
                    prop_assert_eq!(fe.address, vip);
                    prop_assert_eq!(i64::from(fe.port), s.port);
                    prop_assert!((1..=65535).contains(&s.target));
                    prop_assert_eq!(fe.protocol.as_str(), s.proto);
                    // The backends of the frontend's family, on targetPort.
                    let mut want: Vec<std::net::IpAddr> = s
                        .backends
                        .iter()
                        .map(|b| b.parse().unwrap())
                        .filter(|b: &std::net::IpAddr| b.is_ipv4() == vip.is_ipv4())
                        .collect();
                    want.sort();
                    want.dedup();
                    let mut got: Vec<std::net::IpAddr> = fe.backends.iter().map(|b| b.address).collect();
                    got.sort();
                    got.dedup();
                    prop_assert_eq!(got, want);
                    prop_assert!(fe.backends.iter().all(|b| i64::from(b.port) == s.target));
                }
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_parser(text in "\\PC{0,300}") {
        if let Err(e) = parse(&text) {
            prop_assert!(!e.message.is_empty());
        }
    }
}

/// A service and a changed version of it under the same name (another
/// port, another backend list), so a cache that kept the old version of a
/// service it had seen would be caught.
fn versions() -> impl Strategy<Value = (Svc, Svc)> {
    (service(), port(), prop::collection::vec(address(), 0..3)).prop_map(|(s, port, backends)| {
        let changed = Svc {
            port,
            backends,
            ..s.clone()
        };
        (s, changed)
    })
}

proptest! {
    #![proptest_config(config(300))]

    /// The agent's file cache (a service's text → its parse, kept from one
    /// read to the next) reads every file of a sequence exactly as a whole
    /// parse does: the same model, or the same error naming the same field.
    #[test]
    fn the_file_cache_reads_every_file_of_a_sequence_as_a_whole_parse_does(
        pool in prop::collection::vec(versions(), 1..8),
        files in prop::collection::vec(prop::collection::vec((0usize..8, any::<bool>()), 0..8), 1..6),
    ) {
        let ctx = lb::source::file::parse::FileContext::default();
        let mut cache = lb::source::file::cache::FileCache::default();
        for picks in &files {
            let svcs: Vec<Svc> = picks
                .iter()
                .map(|(i, changed)| {
                    let (a, b) = &pool[i % pool.len()];
                    if *changed { b.clone() } else { a.clone() }
                })
                .collect();
            let text = render(&svcs);
            let whole = lb::source::file::parse::parse_with(&text, &ctx);
            let cached = cache.parse(&text, &ctx);
            prop_assert_eq!(cached, whole, "file:\n{}", text);
        }
    }

    /// `read`, the agent's way: the changes it gives, applied to the model
    /// of the last good read (as the reconciler applies them), give the
    /// whole parse's model for every file of a sequence; a refused file
    /// gives the whole parse's error and changes nothing; a change lists
    /// only services that changed. The services are nearly all valid and
    /// drawn from a few names, addresses, ports and backends, so
    /// edits move frontends and backends between services and often clash
    /// (a name twice, a frontend twice, a backend local in one service and
    /// not in another), then come back.
    #[test]
    fn reading_changes_gives_every_file_of_a_sequence_as_a_whole_parse_does(
        pool in prop::collection::vec(crowded_service(), 1..10),
        files in prop::collection::vec(prop::collection::vec(0usize..10, 0..7), 1..10),
    ) {
        use lb::source::file::cache::Read;
        let ctx = lb::source::file::parse::FileContext::default();
        let mut cache = lb::source::file::cache::FileCache::default();
        let mut held: Option<lb::model::Model> = None;
        for picks in &files {
            let text = render_crowded(picks.iter().map(|i| &pool[i % pool.len()]));
            let whole = lb::source::file::parse::parse_with(&text, &ctx);
            match (cache.read(&text, &ctx), whole) {
                (Ok(Read::Whole(model)), Ok(want)) => {
                    prop_assert_eq!(&model, &want, "file:\n{}", text);
                    held = Some(model);
                }
                (Ok(Read::Changes(changes)), Ok(want)) => {
                    let Some(model) = held.as_mut() else {
                        return Err(TestCaseError::fail("changes before any whole read"));
                    };
                    for (name, service) in &changes {
                        // Only what changed: a text that did not change
                        // gives the same service, and is not in the list.
                        prop_assert_ne!(model.services.get(name), service.as_ref(), "{} listed unchanged", name);
                    }
                    for (name, service) in changes {
                        match service {
                            Some(s) => { model.services.insert(name, s); }
                            None => { model.services.remove(&name); }
                        }
                    }
                    prop_assert_eq!(&*model, &want, "file:\n{}", text);
                }
                (Err(e), Err(want)) => prop_assert_eq!(e, want, "file:\n{}", text),
                (got, want) => prop_assert!(false, "read {:?}, whole parse {:?}, file:\n{}", got, want, text),
            }
        }
    }
}

/// A service from few choices (nearly always valid): services of one file
/// often share a name, a frontend or a backend address (with its own
/// `local`).
#[derive(Debug, Clone)]
struct Crowded {
    name: u8,
    vip: u8,
    port: u16,
    udp: bool,
    backends: Vec<(u8, bool)>,
}

fn crowded_service() -> impl Strategy<Value = Crowded> {
    (
        0u8..5,
        1u8..4,
        // Now and then a port the conversion refuses: the quick path
        // must hand that file to the whole parse for its error.
        prop_oneof![8 => Just(80u16), 8 => Just(443), 1 => Just(0)],
        any::<bool>(),
        prop::collection::btree_map(1u8..5, any::<bool>(), 0..3),
    )
        .prop_map(|(name, vip, port, udp, backends)| Crowded {
            name,
            vip,
            port,
            udp,
            backends: backends.into_iter().collect(),
        })
}

fn render_crowded<'a>(svcs: impl Iterator<Item = &'a Crowded>) -> String {
    let mut y = String::from("services:\n");
    for s in svcs {
        let b: Vec<String> = s
            .backends
            .iter()
            .map(|(a, local)| format!("{{address: 10.244.0.{a}, local: {local}}}"))
            .collect();
        y.push_str(&format!(
            "  - name: s{}\n    clusterIPs: [10.96.0.{}]\n    ports: [{{port: {}, protocol: {}}}]\n    backends: [{}]\n",
            s.name,
            s.vip,
            s.port,
            if s.udp { "UDP" } else { "TCP" },
            b.join(", ")
        ));
    }
    y
}

/// 50 valid services, each on its own address with its own backend.
fn fifty_services() -> Vec<Svc> {
    (0..50)
        .map(|i| Svc {
            name: format!("s{i}"),
            vip: format!("10.96.0.{}", i + 1),
            port: 80,
            target: 8080,
            proto: "TCP",
            backends: vec![format!("10.244.0.{}", i + 1)],
        })
        .collect()
}

/// An edit of one service of many is read as a change of that service
/// alone, and a file that clashes is refused as a whole parse refuses it,
/// after which the next good file is read whole.
#[test]
fn an_edit_is_read_as_the_change_of_one_service_and_a_clash_as_the_whole_error() {
    use lb::source::file::cache::Read;
    let svcs = fifty_services();
    let ctx = lb::source::file::parse::FileContext::default();
    let mut cache = lb::source::file::cache::FileCache::default();
    assert!(matches!(
        cache.read(&render(&svcs), &ctx),
        Ok(Read::Whole(_))
    ));
    let mut edited = svcs.clone();
    edited[17].backends = vec!["10.244.9.9".to_string()];
    let Ok(Read::Changes(changes)) = cache.read(&render(&edited), &ctx) else {
        panic!("an edit is read as changes");
    };
    assert_eq!(cache.last_parsed, 1, "only services[17] parsed");
    let want = lb::source::file::parse::parse_with(&render(&edited), &ctx).unwrap();
    let name = lb::model::ServiceName::new("default", "s17");
    assert_eq!(
        changes,
        vec![(name.clone(), want.services.get(&name).cloned())]
    );

    // services[3] takes services[4]'s address and port: refused as a whole
    // parse refuses it, naming the same field.
    let mut clash = edited.clone();
    clash[3].vip = clash[4].vip.clone();
    let got = cache.read(&render(&clash), &ctx).unwrap_err();
    let whole = lb::source::file::parse::parse_with(&render(&clash), &ctx).unwrap_err();
    assert_eq!(got, whole);
    assert!(matches!(
        cache.read(&render(&edited), &ctx),
        Ok(Read::Whole(_))
    ));
}

/// Layouts the cache does not cut are parsed whole, with the same result:
/// flow style, anchors and aliases, comments and blank lines between
/// services, a block scalar, another document marker.
#[test]
fn the_file_cache_reads_other_layouts_as_a_whole_parse_does() {
    let files = [
        "services: [{name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}]}]\n",
        "services:\n  - &one {name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}]}\n",
        "# top\n\nservices:\n  # first\n  - name: a\n    clusterIPs: [10.96.0.1]\n\n    ports: [{port: 80}]\n  # second\n  - name: b\n    clusterIPs: [10.96.0.2]\n    ports: [{port: 80}]\n",
        "services:\n- name: a\n  clusterIPs: [10.96.0.1]\n  ports: [{port: 80}]\n- name: b\n  clusterIPs: [10.96.0.2]\n  ports: [{port: 81}]\n",
        "services:\n  - name: a\n    namespace: >-\n      team\n    clusterIPs: [10.96.0.1]\n    ports: [{port: 80}]\n",
        "---\nservices:\n  - {name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}]}\n",
        "services:\n  - {name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}]}\nextra: 1\n",
        "services:\n  - {name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}]}\n  - {name: a, clusterIPs: [10.96.0.2], ports: [{port: 80}]}\n",
        "services:\n    - {name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}]}\n  - {name: b, clusterIPs: [10.96.0.2], ports: [{port: 80}]}\n",
        "services:\n  - {name: a, clusterIPs: [10.96.0.1], ports: [{port: 80}]\n",
        "",
        "services:\n",
    ];
    let ctx = lb::source::file::parse::FileContext::default();
    let mut cache = lb::source::file::cache::FileCache::default();
    for text in files {
        assert_eq!(
            cache.parse(text, &ctx),
            lb::source::file::parse::parse_with(text, &ctx),
            "file:\n{text}"
        );
    }
}

/// An edit of one service of many parses that service only.
#[test]
fn the_file_cache_parses_only_the_edited_service() {
    let svcs = fifty_services();
    let ctx = lb::source::file::parse::FileContext::default();
    let mut cache = lb::source::file::cache::FileCache::default();
    let first = cache.parse(&render(&svcs), &ctx).unwrap();
    assert_eq!(cache.last_parsed, 50);
    let mut edited = svcs.clone();
    edited[17].backends = vec!["10.244.9.9".to_string()];
    let second = cache.parse(&render(&edited), &ctx).unwrap();
    assert_eq!(cache.last_parsed, 1, "only services[17]");
    assert_ne!(first, second);
    assert_eq!(
        second,
        lb::source::file::parse::parse_with(&render(&edited), &ctx).unwrap()
    );
}

/// Found by the property test (its oracle looked services up by address):
/// two services on one address and port, TCP and UDP, are both accepted,
/// each with its own frontend.
#[test]
fn two_services_on_one_address_and_port_with_different_protocols_are_both_accepted() {
    let svcs = [("a", "TCP"), ("b", "UDP")].map(|(name, proto)| Svc {
        name: name.to_string(),
        vip: "fd00::10".to_string(),
        port: 1,
        target: 1,
        proto,
        backends: Vec::new(),
    });
    let model = parse(&render(&svcs)).unwrap();
    for s in &svcs {
        let svc = &model.services[&lb::model::ServiceName::new("default", &s.name)];
        assert_eq!(svc.frontends[0].protocol.as_str(), s.proto);
    }
}
