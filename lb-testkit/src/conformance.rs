//! Kubernetes' own e2e tests against the test node: the upstream `e2e.test`
//! binary (built from k8s.io/kubernetes v1.35.8 by `testbed/e2e`), run with
//! the skeleton provider against a cluster with the agent in place of
//! kube-proxy (`kube_cluster::Cluster`: one node or several on a fabric,
//! the agent on each, CoreDNS as kube-dns).
//! Images resolve to the ones the node imported (agnhost under its upstream
//! name), so nothing is pulled.
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

pub use crate::kube_cluster::Cluster;

/// One upstream test's outcome, from the suite's JUnit report.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub name: String,
    /// passed, failed, skipped (ginkgo's words; "pending" and others as is).
    pub status: String,
    pub seconds: f64,
    /// The first line of the failure message, when it failed.
    pub failure: Option<String>,
    /// Why the test skipped itself at run time (ginkgo writes `skipped -
    /// <reason>` for a `Skip()`, for example "Requires at least 2 nodes");
    /// `None` for a pass, a failure, or a test the focus left out.
    pub skip_reason: Option<String>,
}

impl Outcome {
    /// A test (ginkgo's `[It]`), not one of the suite's setup nodes.
    pub fn is_test(&self) -> bool {
        self.name.starts_with("[It] ")
    }

    /// Matched the focus but skipped itself (a precondition the cluster
    /// does not meet), as opposed to one the focus left out.
    pub fn skipped_at_run_time(&self) -> bool {
        self.status == "skipped" && self.skip_reason.is_some()
    }
}

/// Where `cargo xtask conformance` builds the suite.
pub fn e2e_bin() -> PathBuf {
    let p = crate::sibling_bin_dir().join("../testbed/e2e.test");
    assert!(
        p.exists(),
        "{} is not built: `cargo xtask conformance` or `cargo xtask test` builds it (testbed/e2e; `cargo xtask testbed` does not)",
        p.display()
    );
    p
}

/// Runs the upstream tests matching `focus` (and not `skip`) against
/// `cluster`; the suite's output goes to `log`. Returns every test the
/// report lists (the skipped ones too).
pub fn run(
    cluster: &Cluster,
    focus: &str,
    skip: &str,
    log: &Path,
    timeout: Duration,
) -> Vec<Outcome> {
    let report = cluster.cp.dir.join("e2e-report");
    let _ = std::fs::remove_dir_all(&report);
    std::fs::create_dir_all(&report).unwrap();
    let kubectl = crate::sibling_bin_dir().join("../testbed/kubectl");
    let mut cmd = Command::new(e2e_bin());
    cmd.arg(format!(
        "--kubeconfig={}",
        cluster.cp.admin_kubeconfig().display()
    ))
    .arg("--provider=skeleton")
    .arg(format!("--kubectl-path={}", kubectl.display()))
    .arg("--dns-domain=cluster.local")
    .arg(format!("--num-nodes={}", cluster.nodes.len()))
    .arg(format!("--report-dir={}", report.display()))
    .arg(format!("--ginkgo.focus={focus}"))
    .arg(format!("--ginkgo.skip={skip}"))
    .arg("--ginkgo.no-color")
    .arg("--ginkgo.v")
    .arg(format!("--ginkgo.timeout={}s", timeout.as_secs()))
    .env("KUBECONFIG", cluster.cp.admin_kubeconfig())
    .stdout(std::fs::File::create(log).unwrap())
    .stderr(std::fs::File::create(log.with_extension("stderr")).unwrap());
    crate::netns::exec_in(&mut cmd, &cluster.cp.netns.name).unwrap();
    let started = Instant::now();
    // Dies with the caller (PR_SET_PDEATHSIG), like the cluster's processes.
    let status = crate::k8s::spawn(cmd).wait().expect("running e2e.test");
    eprintln!(
        "e2e.test exited with {status} after {:.0?}; output in {}",
        started.elapsed(),
        log.display()
    );
    let junit = std::fs::read_dir(&report)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "xml"))
        .unwrap_or_else(|| {
            panic!(
                "no JUnit report in {}; see {}",
                report.display(),
                log.display()
            )
        });
    let outcomes = parse_junit(&std::fs::read_to_string(junit).unwrap());
    // A suite that failed without a failed test (it could not start, a
    // setup node broke) must not read as a pass.
    if !status.success() {
        assert!(
            outcomes
                .iter()
                .any(|o| o.status != "passed" && o.status != "skipped"),
            "e2e.test failed ({status}) but its report shows no failure; see {}",
            log.display()
        );
    }
    outcomes
}

/// A ginkgo focus matching exactly the tests named `prefix` + each of
/// `names` (regex metacharacters escaped).
pub fn names_focus(prefix: &str, names: &[&str]) -> String {
    let escape = |s: &str| {
        s.chars()
            .flat_map(|c| {
                let special = "\\.+*?()|[]{}^$".contains(c);
                special.then_some('\\').into_iter().chain([c])
            })
            .collect::<String>()
    };
    names
        .iter()
        .map(|n| escape(&format!("{prefix}{n}")))
        .collect::<Vec<_>>()
        .join("|")
}

/// The `<testcase>` elements of ginkgo's JUnit report.
pub fn parse_junit(xml: &str) -> Vec<Outcome> {
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find("<testcase ") {
        let after = &rest[start..];
        let head_end = after.find('>').unwrap_or(after.len());
        let head = &after[..head_end];
        let self_closing = head.ends_with('/');
        let body_end = if self_closing {
            head_end
        } else {
            after.find("</testcase>").unwrap_or(after.len())
        };
        let body = &after[head_end.min(body_end)..body_end];
        let attr = |name: &str| -> Option<String> {
            let key = format!(" {name}=\"");
            let i = head.find(&key)? + key.len();
            let j = head[i..].find('"')? + i;
            Some(unescape(&head[i..j]))
        };
        let name = attr("name").unwrap_or_default();
        // The e2e framework leaves the message attribute out
        // (OmitFailureMessageAttr): the cause is the element's text. Panics
        // and interrupts are <error> elements.
        let failure = ["<failure", "<error"].iter().find_map(|tag| {
            let i = body.find(tag)?;
            let el = &body[i..];
            let open_end = el.find('>')?;
            let text = &el[open_end + 1..];
            let text = &text[..text.find("</").unwrap_or(text.len())];
            let attr_msg = el[..open_end].find(" message=\"").map(|k| {
                let k = k + " message=\"".len();
                let e = el[k..open_end].find('"').map_or(open_end, |e| e + k);
                unescape(&el[k..e])
            });
            let all = format!("{}\n{}", attr_msg.unwrap_or_default(), unescape(text));
            Some(
                all.lines()
                    .map(str::trim)
                    .find(|l| !l.is_empty())
                    .unwrap_or("")
                    .to_string(),
            )
        });
        let status = attr("status").unwrap_or_else(|| {
            if failure.is_some() {
                "failed".into()
            } else if body.contains("<skipped") {
                "skipped".into()
            } else {
                "passed".into()
            }
        });
        // ginkgo's JUnit reporter: message "skipped" for a spec the focus
        // left out, "skipped - <failure message>" for one that called Skip().
        let skip_reason = body.find("<skipped").and_then(|i| {
            let el = &body[i..];
            let k = el.find(" message=\"")? + " message=\"".len();
            let e = el[k..].find('"')? + k;
            let msg = unescape(&el[k..e]);
            let reason = msg.strip_prefix("skipped - ")?;
            Some(
                reason
                    .lines()
                    .map(str::trim)
                    .find(|l| !l.is_empty())?
                    .to_string(),
            )
        });
        out.push(Outcome {
            name,
            status,
            seconds: attr("time").and_then(|t| t.parse().ok()).unwrap_or(0.0),
            failure,
            skip_reason,
        });
        rest = &after[body_end.max(1)..];
    }
    out
}

fn unescape(s: &str) -> String {
    s.replace("&#34;", "\"")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&apos;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&#xA;", "\n")
        .replace("&amp;", "&")
}

/// What a published conformance result depends on: the programs, the
/// translation from Kubernetes objects to maps and its application, the
/// agent's process, the dependencies' versions, the manifests the bed
/// installs, the bed itself and the suite. A commit touching any of them
/// after the one docs/conformance.md names makes that result stale
/// (`staleness`).
pub const RESULT_DEPENDS_ON: &[&str] = &[
    "lb-ebpf/src",
    "lb-common/src",
    "lb-userspace/src/agent",
    "lb-userspace/src/bin/lb-agent.rs",
    "lb-userspace/src/conntrack",
    "lb-userspace/src/datapath",
    "lb-userspace/src/desired",
    "lb-userspace/src/diff",
    "lb-userspace/src/health",
    "lb-userspace/src/maps",
    "lb-userspace/src/model",
    "lb-userspace/src/net.rs",
    "lb-userspace/src/reconcile",
    "lb-userspace/src/reconcile.rs",
    "lb-userspace/src/sockets.rs",
    "lb-userspace/src/source",
    "lb-userspace/src/sys",
    "Cargo.lock",
    "deploy/helm/lb-agent",
    "deploy/kubernetes",
    "lb-testkit/src/fabric.rs",
    "lb-testkit/src/images.rs",
    "lb-testkit/src/k8s.rs",
    "lb-testkit/src/kube_cluster.rs",
    "lb-testkit/src/node",
    "lb-testkit/src/node.rs",
    "testbed/e2e",
    "testbed/go.mod",
];

/// The marker of a published result that a later change made stale before
/// the run was redone; its line names the first such commit in backticks
/// ("**Stale:** this run predates `<hash>` ...").
pub const STALE_MARKER: &str = "**Stale:**";

/// `git` in the workspace: stdout, or None when git or the repository is
/// missing (a source tarball) or the command failed.
pub fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The commit a run is on, as a published result names it: the short hash,
/// and "+ uncommitted changes" when files the result depends on differ from
/// it (such a result is not tied to any commit: `staleness` refuses it).
pub fn run_commit() -> String {
    let Some(head) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return "unknown (not a git checkout)".into();
    };
    let mut args = vec!["status", "--porcelain", "--"];
    args.extend(RESULT_DEPENDS_ON);
    match git(&args) {
        Some(dirty) if !dirty.is_empty() => format!("{head} + uncommitted changes"),
        _ => head,
    }
}

/// The first hash in backticks after `anchor` in `text`.
fn hash_after(text: &str, anchor: &str) -> Option<String> {
    let i = text.find(anchor)? + anchor.len();
    let j = text[i..].find('`')? + i;
    let hash = &text[i..j];
    (hash.len() >= 7 && hash.chars().all(|c| c.is_ascii_hexdigit())).then(|| hash.to_string())
}

/// The commit a published result ran on ("on commit \`<hash>\`").
pub fn published_commit(doc: &str) -> Option<String> {
    hash_after(doc, "on commit `")
}

/// What `staleness` found.
#[derive(Debug, PartialEq, Eq)]
pub enum Staleness {
    /// No commit after the one the result names changed what it depends on.
    Current,
    /// Later commits did, and the result says so, naming the first of them.
    SaysStale,
    /// Nothing to compare with here (a source tarball, a shallow clone).
    Unknown(String),
}

/// Whether the published result `doc` still describes HEAD. `Err` says what
/// is wrong: the result names no commit or one that does not exist, later
/// commits changed what it depends on and it does not say so, or it says it
/// is stale when nothing changed (a marker left after a rerun) or names a
/// commit that did not change it.
pub fn staleness(doc: &str) -> Result<Staleness, String> {
    if git(&["rev-parse", "HEAD"]).is_none() {
        return Ok(Staleness::Unknown("not a git checkout".into()));
    }
    let commit =
        published_commit(doc).ok_or("it names no commit it ran on (\"on commit `<hash>`\")")?;
    let full = |c: &str| {
        git(&[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{c}^{{commit}}"),
        ])
    };
    let Some(published) = full(&commit) else {
        if git(&["rev-parse", "--is-shallow-repository"]).as_deref() == Some("true") {
            return Ok(Staleness::Unknown(format!(
                "{commit} is not in this shallow clone"
            )));
        }
        return Err(format!(
            "it names commit {commit}, which is not in this repository"
        ));
    };
    let range = format!("{published}..HEAD");
    let mut args = vec!["log", "--format=%H %s", range.as_str(), "--"];
    args.extend(RESULT_DEPENDS_ON);
    let later: Vec<String> = git(&args)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    let marker = doc.lines().find(|l| l.contains(STALE_MARKER));
    match (marker, later.is_empty()) {
        (None, true) => Ok(Staleness::Current),
        (None, false) => Err(format!(
            "it ran on commit {commit} and these later commits change what it measured:\n  {}\n\
             Redo it (`cargo xtask conformance` with the focus it names) or add a line \
             starting with {STALE_MARKER} that names the first of them in backticks",
            later.join("\n  ")
        )),
        (Some(_), true) => Err(format!(
            "it says it is stale, but no commit after {commit} changes what it depends on: \
             remove the {STALE_MARKER} line"
        )),
        (Some(line), false) => {
            let since = hash_after(line, "`")
                .and_then(|h| full(&h))
                .ok_or_else(|| {
                    format!("its {STALE_MARKER} line names no commit in backticks: {line}")
                })?;
            if later.iter().any(|l| l.starts_with(&since)) {
                Ok(Staleness::SaysStale)
            } else {
                Err(format!(
                    "its {STALE_MARKER} line names {since}, which is not a commit after {commit} \
                     that changes what it depends on"
                ))
            }
        }
    }
}

/// Kubernetes test-bed version the suite comes from.
pub const VERSION: &str = "v1.35.8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn junit_cases_with_their_status_and_first_failure_line() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="Kubernetes e2e suite">
<testcase name="[sig-network] Services should serve a basic endpoint from pods  [Conformance]" classname="Kubernetes e2e suite" status="passed" time="12.5"></testcase>
<testcase name="[sig-network] Services should be able to change the type &#34;ClusterIP&#34;" classname="Kubernetes e2e suite" status="failed" time="40.1"><failure message="timed out&#xA;more detail" type="failed">stack</failure></testcase>
<testcase name="[sig-network] Services skipped one" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
<testcase name="[It] [sig-network] Services needs two nodes" classname="Kubernetes e2e suite" status="skipped" time="0.2"><skipped message="skipped - Requires at least 2 nodes (not 1)&#xA;In [It] at: service.go:1"></skipped></testcase>
<testcase name="[It] [sig-network] Services as e2e writes it" classname="Kubernetes e2e suite" status="failed" time="3"><failure type="failed">&#xA;  [FAILED] service is not reachable within 2m0s timeout&#xA;  In [It] at: service.go:4291</failure></testcase>
<testcase name="[It] [sig-network] Services that panicked" classname="Kubernetes e2e suite" status="panicked" time="1"><error type="panicked">[PANICKED] runtime error: index out of range</error></testcase>
</testsuite></testsuites>"#;
        let mut got = parse_junit(xml);
        assert_eq!(got.len(), 6);
        let two_nodes = got.remove(3);
        assert!(two_nodes.skipped_at_run_time());
        assert_eq!(
            two_nodes.skip_reason.as_deref(),
            Some("Requires at least 2 nodes (not 1)")
        );
        assert_eq!(got[0].status, "passed");
        assert_eq!(got[0].seconds, 12.5);
        assert_eq!(got[0].failure, None);
        assert_eq!(
            got[1].name,
            "[sig-network] Services should be able to change the type \"ClusterIP\""
        );
        assert_eq!(got[1].status, "failed");
        assert_eq!(got[1].failure.as_deref(), Some("timed out"));
        assert_eq!(got[2].status, "skipped");
        assert!(!got[2].skipped_at_run_time(), "the focus left it out");
        assert_eq!(got[3].status, "failed");
        assert_eq!(
            got[3].failure.as_deref(),
            Some("[FAILED] service is not reachable within 2m0s timeout")
        );
        assert!(got[3].is_test());
        assert_eq!(got[4].status, "panicked");
        assert_eq!(
            got[4].failure.as_deref(),
            Some("[PANICKED] runtime error: index out of range")
        );
    }

    #[test]
    fn a_names_focus_matches_the_named_tests_literally() {
        let focus = names_focus(
            "[sig-network] Services ",
            &["should serve a basic endpoint from pods", "a (b) c"],
        );
        assert_eq!(
            focus,
            r"\[sig-network\] Services should serve a basic endpoint from pods|\[sig-network\] Services a \(b\) c"
        );
    }

    #[test]
    fn a_published_commit_is_read_only_as_a_hash_after_on_commit() {
        assert_eq!(
            published_commit("Ran on commit `0123456789ab` (x)").as_deref(),
            Some("0123456789ab")
        );
        assert_eq!(
            published_commit("**Stale:** predates commit `aaaaaaa`; ran on commit `bbbbbbbb`")
                .as_deref(),
            Some("bbbbbbbb"),
            "only the commit it ran on counts"
        );
        assert_eq!(published_commit("on commit `HEAD`"), None);
        assert_eq!(published_commit("on commit `abc`"), None, "too short");
        assert_eq!(published_commit("no commit named"), None);
    }

    /// The staleness rules against this repository's own history: the
    /// first commit and HEAD are real commits, and every commit after the
    /// first changed something a result depends on (the workspace was built
    /// after it).
    #[test]
    fn staleness_refuses_unnamed_unknown_stale_and_leftover_markers() {
        let (Some(first), Some(head)) = (
            git(&["rev-list", "--max-parents=0", "HEAD"]),
            git(&["rev-parse", "HEAD"]),
        ) else {
            eprintln!("not a git checkout: nothing to check against");
            return;
        };
        if git(&["rev-parse", "--is-shallow-repository"]).as_deref() == Some("true") {
            eprintln!("a shallow clone: the history is not here");
            return;
        }
        let first = first.lines().last().unwrap().to_string();
        let on = |c: &str| format!("Ran on commit `{c}`.\n");
        assert!(staleness("nothing").is_err());
        assert!(
            staleness(&on("0123456789abcdef")).is_err(),
            "an unknown commit"
        );
        assert_eq!(staleness(&on(&head)), Ok(Staleness::Current));
        let stale = staleness(&on(&first)).expect_err("the first commit's result is stale");
        assert!(stale.contains("later commits"), "{stale}");
        // The first later commit that changed what it depends on.
        let mut args = vec!["log", "--reverse", "--format=%H", "HEAD", "--"];
        args.extend(RESULT_DEPENDS_ON);
        let cause = git(&args)
            .unwrap()
            .lines()
            .find(|c| *c != first)
            .unwrap()
            .to_string();
        let marked = |c: &str| format!("{STALE_MARKER} this run predates `{c}`.\n");
        assert_eq!(
            staleness(&format!("{}{}", marked(&cause[..12]), on(&first))),
            Ok(Staleness::SaysStale)
        );
        assert!(
            staleness(&format!("{}{}", marked(&first), on(&first))).is_err(),
            "the marker names the commit it ran on, not a later one"
        );
        assert!(
            staleness(&format!("{STALE_MARKER} nothing named\n{}", on(&first))).is_err(),
            "the marker names no commit"
        );
        assert!(
            staleness(&format!("{}{}", marked(&cause), on(&head))).is_err(),
            "a marker left after a rerun"
        );
    }

    /// docs/conformance.md names the commit it ran on, and no later commit
    /// touched the programs, the translation, the agent, the manifests, the
    /// bed or the suite, unless the document says it is stale and names
    /// the first such commit: a change to any of them lands with the wider
    /// run redone (`cargo xtask conformance`) or with the document marked
    /// stale.
    #[test]
    fn published_conformance_results_name_their_commit_and_are_current_or_say_they_are_stale() {
        let doc = include_str!("../../docs/conformance.md");
        match staleness(doc) {
            Ok(Staleness::Unknown(why)) => eprintln!("docs/conformance.md not checked: {why}"),
            Ok(_) => {}
            Err(e) => panic!("docs/conformance.md: {e}"),
        }
    }

    #[test]
    fn kubernetes_version_matches_the_test_bed() {
        let gomod = include_str!("../../testbed/go.mod");
        assert!(gomod.contains(&format!("k8s.io/kubernetes {VERSION}")));
    }
}
