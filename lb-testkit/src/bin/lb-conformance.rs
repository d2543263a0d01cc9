//! lb-conformance: Kubernetes' own e2e tests (the upstream `e2e.test` of
//! v1.35.8) against a cluster of the test bed where lb-agent, run as its
//! DaemonSet, replaces kube-proxy (lb-testkit `conformance`): three nodes
//! on a fabric by default, or one sharing the control plane's namespace.
//!
//!   lb-conformance [--nodes N] [--proxy agent|kube-proxy-MODE] [--focus REGEX] [--skip REGEX]
//!                  [--report FILE] [--timeout SECS]
//!
//! Default focus: the Services conformance tests. With --report, writes the
//! results as Markdown (docs/conformance.md is the published one). Exits
//! non-zero when a test failed.
//!
//! `--proxy kube-proxy-iptables` (or `-nftables`, `-ipvs`) is a control run:
//! the real kube-proxy of the same release serves the Services in place of
//! the agent (lb-testkit `kube_proxy`), on several nodes. Its report goes
//! beside the agent's (docs/conformance-kube-proxy-MODE.md), and the agent's
//! report shows each control run's result per test in a column of its own:
//! a test that fails with both is the bed's problem, one that passes only
//! with kube-proxy is ours.
use std::time::Duration;

use lb_testkit::{
    conformance::{self, Cluster, Outcome},
    kube_cluster::Proxy,
};

const DEFAULT_FOCUS: &str = r"\[sig-network\] Services .*\[Conformance\]";
const DEFAULT_SKIP: &str = r"\[Serial\]|\[Disruptive\]";

fn main() {
    let mut focus = DEFAULT_FOCUS.to_string();
    let mut skip = DEFAULT_SKIP.to_string();
    let mut report = None;
    let mut timeout = 7200u64;
    let mut nodes = 3usize;
    let mut proxy = Proxy::Agent;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--focus" => focus = value(),
            "--skip" => skip = value(),
            "--report" => report = Some(value()),
            "--timeout" => timeout = value().parse().unwrap_or_else(|_| usage()),
            "--nodes" => nodes = value().parse().unwrap_or_else(|_| usage()),
            "--proxy" => proxy = Proxy::parse(&value()).unwrap_or_else(|| usage()),
            _ => usage(),
        }
    }
    let started = std::time::Instant::now();
    // The commit the binaries and images are built from: named now, before
    // the hour the run takes (edits made meanwhile are not in it).
    let commit = conformance::run_commit();
    let tag = lb_testkit::unique("conformance");
    let cluster = match (nodes, proxy) {
        (1, Proxy::Agent) => Cluster::start(&tag, "lbtest-node"),
        (1, _) => {
            eprintln!("lb-conformance: a control run with kube-proxy needs --nodes 2 or more");
            std::process::exit(2)
        }
        _ => Cluster::start_nodes_with(&tag, nodes, proxy),
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
        let run = Run {
            focus: &focus,
            skip: &skip,
            nodes,
            proxy,
            commit: &commit,
        };
        let controls = match proxy {
            Proxy::Agent => control_runs(std::path::Path::new(&path)),
            Proxy::KubeProxy(_) => Vec::new(),
        };
        std::fs::write(&path, markdown(&ran, &skipped, &run, &controls)).unwrap();
        println!("wrote {path}");
    }
    if !failed.is_empty() || ran.is_empty() {
        std::process::exit(1);
    }
}

/// What a report says about its run.
struct Run<'a> {
    focus: &'a str,
    skip: &'a str,
    nodes: usize,
    proxy: Proxy,
    commit: &'a str,
}

/// A control run's published report, read back for the agent's.
struct Control {
    /// `kube-proxy-iptables`, ...
    proxy: String,
    file: String,
    /// The line of the report that says how many passed, its commit and date.
    summary: String,
    /// Test name (as the table writes it) → result.
    results: std::collections::BTreeMap<String, String>,
}

/// The control runs' reports beside `report` (conformance-kube-proxy-*.md
/// in its directory), sorted by mode.
fn control_runs(report: &std::path::Path) -> Vec<Control> {
    let dir = report.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = dir.unwrap_or(std::path::Path::new("."));
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().to_string();
        let Some(proxy) = file
            .strip_prefix("conformance-")
            .and_then(|f| f.strip_suffix(".md"))
            .filter(|p| p.starts_with("kube-proxy-"))
        else {
            continue;
        };
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        let commit = conformance::published_commit(&text).unwrap_or_else(|| "?".into());
        let date = text
            .split_once("conformance` on ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or("?")
            .to_string();
        let passed = text
            .lines()
            .find(|l| l.starts_with("**") && l.contains(" passed."))
            .and_then(|l| l.split("**").nth(1))
            .unwrap_or("no result")
            .trim_end_matches('.')
            .to_string();
        let mut results = std::collections::BTreeMap::new();
        for line in text.lines().filter(|l| l.starts_with("| [")) {
            // Pipes inside a name are escaped (`\|`).
            let cells: Vec<String> = line
                .replace("\\|", "\u{1}")
                .split('|')
                .map(|c| c.trim().replace('\u{1}', "\\|"))
                .collect();
            if cells.len() > 2 {
                results.insert(cells[1].clone(), cells[2].clone());
            }
        }
        out.push(Control {
            summary: format!("{passed} on commit `{commit}`, {date}"),
            proxy: proxy.to_string(),
            file,
            results,
        });
    }
    out.sort_by(|a, b| a.proxy.cmp(&b.proxy));
    out
}

/// The name as the report's table writes it.
fn row_name(o: &Outcome) -> String {
    o.name.trim_start_matches("[It] ").replace('|', "\\|")
}

fn markdown(ran: &[&Outcome], skipped: &[&Outcome], run: &Run, controls: &[Control]) -> String {
    let Run {
        focus,
        skip,
        nodes,
        proxy,
        commit,
    } = *run;
    let passed = ran.iter().filter(|o| o.status == "passed").count();
    let bed = if nodes == 1 {
        "one node of the test bed, in the control plane's network namespace".to_string()
    } else {
        format!(
            "{nodes} nodes of the test bed, each in a network namespace of its own on one \
             bridge (docs/testbed.md), pod CIDRs allocated by the controller manager and \
             routed between the nodes"
        )
    };
    let (title, proxy_text, proxy_arg) = match proxy {
        Proxy::Agent => (
            "Kubernetes conformance, without kube-proxy".to_string(),
            format!(
                "**no kube-proxy**: lb-agent, installed {},\n\
                 runs as the DaemonSet's pod on every node",
                if nodes == 1 {
                    "with `kubectl apply -k` over deploy/kubernetes"
                } else {
                    "with `helm install` of deploy/helm/lb-agent"
                }
            ),
            String::new(),
        ),
        Proxy::KubeProxy(mode) => (
            format!(
                "Kubernetes conformance, control run: the real kube-proxy ({} mode)",
                mode.name()
            ),
            format!(
                "**the real kube-proxy {ver}** (`cmd/kube-proxy` of the same module, built by\n\
                 `cargo xtask testbed`) in `--proxy-mode={mode}`, one process per node in the node's\n\
                 namespaces, with kubeadm's identity (ServiceAccount kube-system/kube-proxy bound to\n\
                 `system:node-proxier`); **no lb-agent**. This is the control run for\n\
                 docs/conformance.md: a test that fails here and with the agent is the bed's problem",
                ver = conformance::VERSION,
                mode = mode.name()
            ),
            format!(" --proxy {}", proxy.name()),
        ),
    };
    let mut s = format!(
        "# {title}\n\n\
         Written by `cargo xtask conformance` on {date} (`lb-conformance`), on commit `{commit}`: the upstream\n\
         `e2e.test` of Kubernetes {ver}, built from the k8s.io/kubernetes module (`testbed/e2e`), run with\n\
         `--provider=skeleton` against {bed}: kube-apiserver, controllers,\n\
         scheduler and kubelets {ver} from the same module, containerd/runc/CNI bridge from\n\
         Debian, CoreDNS as kube-dns, {proxy_text}. Images are built here and imported\n\
         (agnhost under its upstream name); nothing is pulled.\n\n\
         Command: `cargo xtask conformance --nodes {nodes}{proxy_arg} --focus '{focus}' --skip '{skip}'`.{serial}\n\n\
         **{passed} of {n} passed.**{skips}\n\n",
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
    if !controls.is_empty() {
        s.push_str(
            "Control runs, the same selection on the same bed with the real kube-proxy in the \
             agent's place (`--proxy kube-proxy-MODE`); their results are in the columns below:\n\n",
        );
        for c in controls {
            s.push_str(&format!("- {}: {} ({})\n", c.proxy, c.summary, c.file));
        }
        let rows = |want_agent: bool| -> Vec<String> {
            ran.iter()
                .flat_map(|o| {
                    let name = row_name(o);
                    controls.iter().filter_map(move |c| {
                        let theirs = c.results.get(&name)?;
                        let ours_pass = o.status == "passed";
                        let theirs_pass = theirs == "passed";
                        (ours_pass == want_agent && theirs_pass != want_agent)
                            .then(|| format!("{name} ({}: {theirs})", c.proxy))
                    })
                })
                .collect()
        };
        let ours_only = rows(false);
        let theirs_only = rows(true);
        s.push_str(&format!(
            "\nPassed with kube-proxy but not with the agent (ours to fix): {}.\n\
             Passed with the agent but not with kube-proxy: {}.\n\n",
            if ours_only.is_empty() {
                "none".to_string()
            } else {
                ours_only.join("; ")
            },
            if theirs_only.is_empty() {
                "none".to_string()
            } else {
                theirs_only.join("; ")
            },
        ));
    }
    s.push_str("| Test | Result | Seconds |");
    for c in controls {
        s.push_str(&format!(" {} |", c.proxy));
    }
    s.push_str(" Cause, for a failure or a skip |\n|---|---|---:|");
    for _ in controls {
        s.push_str("---|");
    }
    s.push_str("---|\n");
    for o in ran.iter().chain(skipped) {
        let name = row_name(o);
        s.push_str(&format!("| {name} | {} | {:.0} |", o.status, o.seconds));
        for c in controls {
            s.push_str(&format!(
                " {} |",
                c.results.get(&name).map_or("not run", String::as_str)
            ));
        }
        s.push_str(&format!(
            " {} |\n",
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
        "usage: lb-conformance [--nodes N] [--proxy agent|kube-proxy-iptables|kube-proxy-nftables|kube-proxy-ipvs] [--focus REGEX] [--skip REGEX] [--report FILE] [--timeout SECS]"
    );
    std::process::exit(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(name: &str, status: &str) -> Outcome {
        Outcome {
            name: format!("[It] {name}"),
            status: status.into(),
            seconds: 1.0,
            failure: (status == "failed").then(|| "boom".into()),
            skip_reason: None,
        }
    }

    #[test]
    fn the_agents_report_shows_each_control_run_per_test_and_names_the_tests_whose_results_differ()
    {
        let dir = std::env::temp_dir().join(format!("lb-conf-controls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let a = "[sig-network] Services a \\| b";
        let (b, c, d) = (
            "[sig-network] Services b",
            "[sig-network] Services c",
            "[sig-network] Services d",
        );
        // What a control run writes (its own `markdown`), read back.
        let (x, y, z) = (
            outcome("[sig-network] Services a | b", "passed"),
            outcome(b, "passed"),
            outcome(c, "failed"),
        );
        let control = Run {
            focus: "f",
            skip: "s",
            nodes: 3,
            proxy: Proxy::parse("kube-proxy-nftables").unwrap(),
            commit: "0123456789ab",
        };
        std::fs::write(
            dir.join("conformance-kube-proxy-nftables.md"),
            markdown(&[&x, &y, &z], &[], &control, &[]),
        )
        .unwrap();
        std::fs::write(dir.join("conformance-other.md"), "| [x] | failed |").unwrap();
        let controls = control_runs(&dir.join("conformance.md"));
        assert_eq!(
            controls.len(),
            1,
            "only kube-proxy-* reports are control runs"
        );
        assert_eq!(controls[0].proxy, "kube-proxy-nftables");
        assert_eq!(
            controls[0].results.get(a).map(String::as_str),
            Some("passed")
        );
        assert_eq!(
            controls[0].results.get(c).map(String::as_str),
            Some("failed")
        );
        assert!(
            controls[0]
                .summary
                .starts_with("2 of 3 passed on commit `0123456789ab`"),
            "{}",
            controls[0].summary
        );

        // The agent: b fails (kube-proxy passed it: ours), c passes (kube-proxy
        // failed it), d was not in the control run.
        let ours = [
            outcome("[sig-network] Services a | b", "passed"),
            outcome(b, "failed"),
            outcome(c, "passed"),
            outcome(d, "passed"),
        ];
        let ours: Vec<&Outcome> = ours.iter().collect();
        let agent = Run {
            proxy: Proxy::Agent,
            ..control
        };
        let text = markdown(&ours, &[], &agent, &controls);
        assert!(text.contains(&format!(
            "Passed with kube-proxy but not with the agent (ours to fix): {b} (kube-proxy-nftables: passed)."
        )), "{text}");
        assert!(
            text.contains(&format!(
                "Passed with the agent but not with kube-proxy: {c} (kube-proxy-nftables: failed)."
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!("| {a} | passed | 1 | passed |")),
            "{text}"
        );
        assert!(
            text.contains(&format!("| {d} | passed | 1 | not run |")),
            "{text}"
        );
        assert!(text.contains("| Test | Result | Seconds | kube-proxy-nftables | Cause"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
