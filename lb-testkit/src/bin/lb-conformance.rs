//! lb-conformance: Kubernetes' own e2e tests (the upstream `e2e.test` of
//! v1.35.8) against a cluster of the test bed where lb-agent, run as its
//! DaemonSet, replaces kube-proxy (lb-testkit `conformance`): three nodes
//! on a fabric by default, or one sharing the control plane's namespace.
//!
//!   lb-conformance [--nodes N] [--focus REGEX] [--skip REGEX] [--report FILE] [--timeout SECS]
//!
//! Default focus: the Services conformance tests. With --report, writes the
//! results as Markdown (docs/conformance.md is the published one). Exits
//! non-zero when a test failed.
use std::time::Duration;

use lb_testkit::conformance::{self, Cluster, Outcome};

const DEFAULT_FOCUS: &str = r"\[sig-network\] Services .*\[Conformance\]";
const DEFAULT_SKIP: &str = r"\[Serial\]|\[Disruptive\]";

fn main() {
    let mut focus = DEFAULT_FOCUS.to_string();
    let mut skip = DEFAULT_SKIP.to_string();
    let mut report = None;
    let mut timeout = 7200u64;
    let mut nodes = 3usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--focus" => focus = value(),
            "--skip" => skip = value(),
            "--report" => report = Some(value()),
            "--timeout" => timeout = value().parse().unwrap_or_else(|_| usage()),
            "--nodes" => nodes = value().parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    let started = std::time::Instant::now();
    // The commit the binaries and images are built from: named now, before
    // the hour the run takes (edits made meanwhile are not in it).
    let commit = conformance::run_commit();
    let tag = lb_testkit::unique("conformance");
    let cluster = if nodes == 1 {
        Cluster::start(&tag, "lbtest-node")
    } else {
        Cluster::start_nodes(&tag, nodes)
    };
    eprintln!(
        "lb-conformance: {} node(s) up after {:.0?}",
        cluster.nodes.len(),
        started.elapsed()
    );
    let log = std::env::temp_dir().join(format!("lb-conformance-{}.log", std::process::id()));
    let results = conformance::run(&cluster, &focus, &skip, &log, Duration::from_secs(timeout));
    drop(cluster);
    // The suite's own setup nodes ([SynchronizedBeforeSuite], ...) count
    // when they fail; the tests are the [It] entries.
    let ran: Vec<&Outcome> = results
        .iter()
        .filter(|o| o.status != "skipped" && (o.is_test() || o.status != "passed"))
        .collect();
    let failed: Vec<&Outcome> = ran
        .iter()
        .copied()
        .filter(|o| o.status != "passed")
        .collect();
    // Matched the focus but skipped themselves: a precondition this
    // one-node cluster does not meet. Listed with the reason, never counted
    // as passed.
    let skipped: Vec<&Outcome> = results.iter().filter(|o| o.skipped_at_run_time()).collect();
    for o in ran.iter().chain(&skipped) {
        println!("{:7} {:6.1}s  {}", o.status, o.seconds, o.name);
        if let Some(f) = o.failure.as_ref().or(o.skip_reason.as_ref()) {
            println!("        {f}");
        }
    }
    println!(
        "{} ran, {} passed, {} failed, {} skipped themselves ({} left out by the focus) in {:.0?}",
        ran.len(),
        ran.len() - failed.len(),
        failed.len(),
        skipped.len(),
        results.iter().filter(|o| o.status == "skipped").count() - skipped.len(),
        started.elapsed()
    );
    if let Some(path) = report {
        std::fs::write(
            &path,
            markdown(&ran, &skipped, &focus, &skip, nodes, &commit),
        )
        .unwrap();
        println!("wrote {path}");
    }
    if !failed.is_empty() || ran.is_empty() {
        std::process::exit(1);
    }
}

fn markdown(
    ran: &[&Outcome],
    skipped: &[&Outcome],
    focus: &str,
    skip: &str,
    nodes: usize,
    commit: &str,
) -> String {
    let passed = ran.iter().filter(|o| o.status == "passed").count();
    let mut s = format!(
        "# Kubernetes conformance, without kube-proxy\n\n\
         Written by `cargo xtask conformance` on {date} (`lb-conformance`), on commit `{commit}`: the upstream\n\
         `e2e.test` of Kubernetes {ver}, built from the k8s.io/kubernetes module (`testbed/e2e`), run with\n\
         `--provider=skeleton` against {bed}: kube-apiserver, controllers,\n\
         scheduler and kubelets {ver} from the same module, containerd/runc/CNI bridge from\n\
         Debian, CoreDNS as kube-dns, **no kube-proxy**: lb-agent, installed {how},\n\
         runs as the DaemonSet's pod on every node. Images are built here and imported\n\
         (agnhost under its upstream name); nothing is pulled.\n\n\
         Command: `cargo xtask conformance --nodes {nodes} --focus '{focus}' --skip '{skip}'`.{serial}\n\n\
         **{passed} of {n} passed.**{skips}\n\n\
         | Test | Result | Seconds | Cause, for a failure or a skip |\n|---|---|---:|---|\n",
        bed = if nodes == 1 {
            "one node of the test bed, in the control plane's network namespace".to_string()
        } else {
            format!(
                "{nodes} nodes of the test bed, each in a network namespace of its own on one \
                 bridge (docs/testbed.md), pod CIDRs allocated by the controller manager and \
                 routed between the nodes"
            )
        },
        how = if nodes == 1 {
            "with `kubectl apply -k` over deploy/kubernetes"
        } else {
            "with `helm install` of deploy/helm/lb-agent"
        },
        date = today(),
        serial = if skip.contains("Serial") {
            ""
        } else {
            " The suite runs one test at a time, so `[Serial]` tests run alone."
        },
        ver = conformance::VERSION,
        n = ran.len(),
        skips = if skipped.is_empty() {
            String::new()
        } else {
            format!(
                " {} more matched and skipped themselves (the suite's own check that \
                 the cluster can run them; the reason is in the last column).",
                skipped.len()
            )
        },
    );
    for o in ran.iter().chain(skipped) {
        s.push_str(&format!(
            "| {} | {} | {:.0} | {} |\n",
            o.name.trim_start_matches("[It] ").replace('|', "\\|"),
            o.status,
            o.seconds,
            o.failure
                .as_deref()
                .or(o.skip_reason.as_deref())
                .unwrap_or("")
                .replace('|', "\\|")
        ));
    }
    s
}

fn today() -> String {
    let out = std::process::Command::new("date")
        .args(["-u", "+%F"])
        .output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn usage() -> ! {
    eprintln!(
        "usage: lb-conformance [--nodes N] [--focus REGEX] [--skip REGEX] [--report FILE] [--timeout SECS]"
    );
    std::process::exit(2)
}
