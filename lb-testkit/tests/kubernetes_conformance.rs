//! Kubernetes' own Services conformance tests (the upstream e2e.test of
//! v1.35.8, all 15), run on every submission against a node of the test bed
//! where the agent, installed from deploy/kubernetes, replaces kube-proxy.
//! `cargo xtask conformance` runs any focus and publishes the result in
//! docs/conformance.md.
use std::time::Duration;

use lb_testkit::conformance::{self, Cluster};

/// Every Services conformance test of v1.35.8: ClusterIP and NodePort by
/// name through CoreDNS, session affinity (ClientIP, switched on and off),
/// type changes to and from ExternalName, multiport, two protocols on one
/// port, and the API-only ones.
const FOCUS: &str = r"\[sig-network\] Services .*\[Conformance\]";

#[test]
fn upstream_services_conformance_tests_all_pass_with_the_agent_in_place_of_kube_proxy() {
    let cluster = Cluster::start(&lb_testkit::unique("conform"), "lbtest-node");
    let log = std::env::temp_dir().join(format!("lb-conformance-test-{}.log", std::process::id()));
    let results = conformance::run(
        &cluster,
        FOCUS,
        r"\[Serial\]|\[Disruptive\]",
        &log,
        Duration::from_secs(1500),
    );
    let ran: Vec<_> = results.iter().filter(|o| o.status != "skipped").collect();
    assert_eq!(
        ran.iter().filter(|o| o.is_test()).count(),
        15,
        "the focus should select the 15 Services conformance tests; the report lists {:?}\nsee {}",
        ran.iter().map(|o| &o.name).collect::<Vec<_>>(),
        log.display()
    );
    let failed: Vec<_> = ran.iter().filter(|o| o.status != "passed").collect();
    assert!(
        failed.is_empty(),
        "upstream tests failed: {failed:#?}\nsuite output: {}\n{}",
        log.display(),
        cluster.node.logs_of(&cluster.cp)
    );
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(log.with_extension("stderr"));
}
