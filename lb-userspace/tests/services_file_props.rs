//! Property tests of the services file parser: whatever the values (good,
//! out of range, not addresses at all) and whatever the bytes, parsing never
//! panics; a refused file names the field at fault and says what to do; an
//! accepted file gives exactly the frontends and backends it describes.
use lb::model::file::parse;
use proptest::prelude::*;

fn address() -> impl Strategy<Value = String> {
    prop_oneof![
        (1u8..=254, 0u8..=255, 1u8..=254).prop_map(|(a, b, c)| format!("10.{a}.{b}.{c}")),
        Just("fd00::10".to_string()),
        Just("10.0.0.256".to_string()),
        Just("not-an-ip".to_string()),
        Just("".to_string()),
        "[a-z0-9.:]{1,20}",
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
        "[a-z][a-z0-9-]{0,8}",
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn refused_files_name_a_field_and_accepted_ones_match_their_text(svcs in prop::collection::vec(service(), 1..5)) {
        match parse(&render(&svcs)) {
            Err(e) => {
                prop_assert!(e.field.starts_with("services["), "a field path: {e:?}");
                prop_assert!(e.message.len() > 10, "a message that says what to do: {e:?}");
            }
            Ok(model) => {
                // Accepted: every service is there with its one frontend and
                // the backends of the frontend's family.
                prop_assert_eq!(model.services.len(), svcs.len());
                for s in &svcs {
                    let svc = model.services.values().find(|m| m.frontends[0].address.to_string() == s.vip.parse::<std::net::IpAddr>().unwrap().to_string());
                    let svc = svc.expect("the service's frontend");
                    let fe = &svc.frontends[0];
                    prop_assert_eq!(fe.port as i64, s.port);
                    prop_assert!((1..=65535).contains(&s.target));
                    prop_assert_eq!(fe.protocol.as_str(), s.proto);
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
