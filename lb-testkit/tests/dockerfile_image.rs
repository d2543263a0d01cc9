//! deploy/Dockerfile's image, built for real (`cargo xtask image`: buildah,
//! the Debian bases made with mmdebstrap), as the DaemonSet's pod on a real
//! node: the bpffs init container's shell runs in it, the agent serves a
//! ClusterIP, `lbctl` answers in it, and it runs without `privileged`.
//!
//! Ignored in `cargo test` (CI's hour has no room for a container build of
//! the workspace): `cargo xtask image` builds the image and runs this with
//! LB_AGENT_IMAGE_ARCHIVE naming it.
use std::time::Duration;

use lb_testkit::{
    k8s::ControlPlane,
    kube_cluster::{Cluster, Install},
    unique,
};

/// `kubectl exec` in the agent's container; None when the command failed.
fn in_agent(cp: &ControlPlane, args: &[&str]) -> Option<String> {
    let mut full = vec![
        "-n",
        "kube-system",
        "exec",
        "ds/lb-agent",
        "-c",
        "agent",
        "--",
    ];
    full.extend_from_slice(args);
    cp.kubectl_try(&full)
}

#[test]
#[ignore = "needs the image `cargo xtask image` builds; it runs this test"]
fn the_image_built_from_the_dockerfile_runs_as_the_daemonset_unprivileged_and_serves_a_cluster_ip()
{
    let archive = std::env::var("LB_AGENT_IMAGE_ARCHIVE")
        .expect("LB_AGENT_IMAGE_ARCHIVE: run `cargo xtask image`, which builds it and sets it");
    assert!(
        std::path::Path::new(&archive).exists(),
        "{archive}: no such file"
    );
    let cluster = Cluster::start_installed(&unique("image"), "lbtest-node", Install::Helm);
    let cp = &cluster.cp;

    // It is the Dockerfile's image, not the one the test bed assembles from
    // the built binaries (busybox, no Debian userland): Debian's release
    // file, and the binaries where the Dockerfile puts them.
    let release = in_agent(cp, &["cat", "/etc/debian_version"]).unwrap_or_default();
    assert!(
        release.starts_with("12."),
        "not a bookworm image: {release:?}"
    );
    let found = in_agent(
        cp,
        &[
            "sh",
            "-c",
            "for b in lb-agent lbctl; do command -v $b; done",
        ],
    )
    .unwrap_or_default();
    assert_eq!(
        found.split_whitespace().collect::<Vec<_>>(),
        ["/usr/local/bin/lb-agent", "/usr/local/bin/lbctl"],
        "{found}"
    );
    // Unprivileged, with the chart's capability list.
    let security = cp.kubectl(&[
        "-n",
        "kube-system",
        "get",
        "ds/lb-agent",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].securityContext}",
    ]);
    assert!(
        security.contains(r#""privileged":false"#) && security.contains(r#""drop":["ALL"]"#),
        "{security}"
    );

    cp.apply(&lb_testkit::k8s::web_backends(2, "ClusterIP"));
    cp.kubectl(&["rollout", "status", "deploy/web", "--timeout=180s"]);
    cp.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "pod/client",
        "--timeout=120s",
    ]);
    let cluster_ip = cp.kubectl(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    let frontend = format!("{cluster_ip}:80/TCP");
    assert!(
        lb_testkit::wait_until(Duration::from_secs(60), || {
            in_agent(cp, &["lbctl", "service", "get", &frontend])
                .unwrap_or_default()
                .matches("(active)")
                .count()
                == 2
        }),
        "{frontend} in lbctl:\n{:?}",
        in_agent(cp, &["lbctl", "service", "list"])
    );
    let pods = cp.kubectl(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ]);
    let out = cp.kubectl(&[
        "exec",
        "client",
        "--",
        "sh",
        "-c",
        &format!(
            "i=0; while [ $i -lt 30 ]; do printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {cluster_ip} 80 | tail -n 1; i=$((i+1)); done"
        ),
    ]);
    let answers: Vec<&str> = out.lines().collect();
    assert_eq!(answers.len(), 30, "every fetch answered: {out}");
    for p in pods.split_whitespace() {
        assert!(
            answers.contains(&p),
            "backend {p} never answered: {answers:?}"
        );
    }
    assert!(
        answers
            .iter()
            .all(|a| pods.split_whitespace().any(|p| p == *a)),
        "only backends answer: {answers:?}"
    );
}
