//! The control runs' bed stays runnable: the real kube-proxy of v1.35.8
//! (`lb_testkit::kube_proxy`), in each mode this kernel can run, serves two
//! nodes of the test bed in place of the agent and passes upstream Services
//! tests that go through a ClusterIP and a NodePort. `cargo xtask
//! conformance --proxy kube-proxy-MODE` runs the whole selection with it and
//! docs/conformance.md shows the result beside the agent's.
use std::time::Duration;

use lb_testkit::{
    conformance::{self, Cluster},
    kube_cluster::Proxy,
    kube_proxy::Mode,
};

const TESTS: &[&str] = &[
    "should serve a basic endpoint from pods [Conformance]",
    "should be able to create a functioning NodePort service [Conformance]",
];

#[test]
fn the_real_kube_proxy_in_iptables_mode_serves_clusterips_and_nodeports_of_two_nodes_with_no_agent()
{
    control_bed_passes(Mode::Iptables);
}

/// The same bed in nftables mode: a second cluster, a minute of CI's hour,
/// for a mode the side-by-side benchmark (`cargo xtask bench`) and
/// `cargo xtask conformance --proxy kube-proxy-nftables` run anyway.
#[test]
#[ignore = "CI's hour: run with `cargo test -p lb-testkit --test kube_proxy_control -- --ignored`"]
fn the_real_kube_proxy_in_nftables_mode_serves_clusterips_and_nodeports_of_two_nodes_with_no_agent()
{
    control_bed_passes(Mode::Nftables);
}

fn control_bed_passes(mode: Mode) {
    let tag = lb_testkit::unique(&format!("kp{}", &mode.name()[..3]));
    let cluster = Cluster::start_nodes_with(&tag, 2, Proxy::KubeProxy(mode));
    // No agent anywhere: kube-proxy serves the Services, in the mode asked for.
    for node in &cluster.nodes {
        assert!(
            node.pids_named("lb-agent").is_empty(),
            "an agent runs on {}",
            node.name
        );
        let log = std::fs::read_to_string(node.dir.join("kube-proxy.log")).unwrap();
        let want = format!("Using {} Proxier", mode.name());
        assert!(log.contains(&want), "{} has no {want:?}:\n{log}", node.name);
    }
    let log = std::env::temp_dir().join(format!("lb-kube-proxy-control-{tag}.log"));
    let results = conformance::run(
        &cluster,
        &conformance::names_focus("[sig-network] Services ", TESTS),
        r"\[Serial\]|\[Disruptive\]",
        &log,
        Duration::from_secs(600),
    );
    let ran: Vec<_> = results
        .iter()
        .filter(|o| o.status != "skipped" && o.is_test())
        .collect();
    assert_eq!(
        ran.len(),
        TESTS.len(),
        "{mode:?}: the focus should select {TESTS:?}; the report lists {ran:#?}"
    );
    let failed: Vec<_> = ran.iter().filter(|o| o.status != "passed").collect();
    assert!(
        failed.is_empty(),
        "{mode:?}: upstream tests failed with the real kube-proxy: {failed:#?}\nsuite output: {}\n{}",
        log.display(),
        cluster.logs()
    );
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(log.with_extension("stderr"));
}
