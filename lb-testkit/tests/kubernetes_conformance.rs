//! Kubernetes' own Services tests (the upstream e2e.test of v1.35.8), run on
//! every submission against three nodes of the test bed on a fabric, where
//! the agent, installed on each by the Helm chart, replaces kube-proxy: all
//! 15 `[Conformance]` ones and the others that exercise what changes most
//! often here (`EVERY_SUBMISSION`), among them those that need two or three
//! nodes. `cargo xtask conformance` runs any focus and publishes the result
//! in docs/conformance.md.
use std::time::Duration;

use lb_testkit::conformance::{self, Cluster};

/// Every Services conformance test of v1.35.8: ClusterIP and NodePort by
/// name through CoreDNS, session affinity (ClientIP, switched on and off),
/// type changes to and from ExternalName, multiport, two protocols on one
/// port, and the API-only ones.
const CONFORMANCE: &str = r"\[sig-network\] Services .*\[Conformance\]";

/// Services tests beyond `[Conformance]` that run on every submission: the
/// behaviour the socket hooks, the translation and the packet path change
/// most often (external IPs, reject, hairpin, named ports, NodePorts,
/// LoadBalancer frontends, port changes; across nodes: the client's address
/// kept, traffic policies, health check node ports), all of them short.
/// Left to `cargo xtask conformance`: the affinity-timeout tests (over two
/// minutes each), the fallback-to-terminating and publishNotReadyAddresses
/// tests (30 to 60 s each, waiting out grace periods) and the label and
/// up/down tests (the source's filtering, not the data path).
const EVERY_SUBMISSION: &[&str] = &[
    "should be possible to connect to a service via ExternalIP when the external IP is not assigned to a node",
    "should be rejected when no endpoints exist",
    "should allow pods to hairpin back to themselves through services",
    "should support named targetPorts that resolve to different ports on different endpoints",
    "should connect to the named ports exposed by restartable init containers",
    "should be updated after adding or deleting ports",
    "should be able to update service type to NodePort listening on same port number but different protocols",
    "should serve endpoints on same port and different protocol for internal traffic on Type LoadBalancer",
    "should work after the service has been recreated",
    // Two or three nodes.
    "should preserve source pod IP for traffic thru service cluster IP [LinuxOnly]",
    "should respect internalTrafficPolicy=Local Pod to Pod",
    "should respect internalTrafficPolicy=Local Pod (hostNetwork: true) to Pod",
    "should respect internalTrafficPolicy=Local Pod and Node, to Pod (hostNetwork: true)",
    "should support externalTrafficPolicy=Local for type=NodePort",
    "should fail health check node port if there are only terminating endpoints",
    "should implement NodePort and HealthCheckNodePort correctly when ExternalTrafficPolicy changes",
];

#[test]
fn upstream_services_conformance_tests_and_the_chosen_others_pass_on_three_nodes_with_the_agent_in_place_of_kube_proxy(
) {
    let cluster = Cluster::start_nodes(&lb_testkit::unique("conform"), 3);
    let log = std::env::temp_dir().join(format!("lb-conformance-test-{}.log", std::process::id()));
    let focus = format!(
        "{CONFORMANCE}|{}",
        conformance::names_focus("[sig-network] Services ", EVERY_SUBMISSION)
    );
    let results = conformance::run(
        &cluster,
        &focus,
        r"\[Serial\]|\[Disruptive\]",
        &log,
        Duration::from_secs(1800),
    );
    let ran: Vec<_> = results
        .iter()
        .filter(|o| o.status != "skipped" && o.is_test())
        .collect();
    let names: Vec<&str> = ran
        .iter()
        .map(|o| o.name.trim_start_matches("[It] "))
        .collect();
    assert_eq!(
        names.iter().filter(|n| n.ends_with("[Conformance]")).count(),
        15,
        "the focus should select the 15 Services conformance tests; the report lists {names:#?}\nsee {}",
        log.display()
    );
    for want in EVERY_SUBMISSION {
        assert!(
            names.iter().any(|n| n.contains(want)),
            "{want:?} did not run; the report lists {names:#?}\nsee {}",
            log.display()
        );
    }
    let failed: Vec<_> = results
        .iter()
        .filter(|o| o.status != "skipped" && o.status != "passed")
        .collect();
    assert!(
        failed.is_empty(),
        "upstream tests failed: {failed:#?}\nsuite output: {}\n{}",
        log.display(),
        cluster.logs()
    );
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(log.with_extension("stderr"));
}
