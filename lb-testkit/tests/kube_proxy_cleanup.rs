//! `lb-agent cleanup-kube-proxy` against real kube-proxy-style leftovers in a
//! network namespace of its own: KUBE-* chains in iptables-legacy and
//! iptables-nft, kube-proxy's nftables table, the kube-ipvs0 device, and
//! conntrack entries of service addresses. What is not kube-proxy's (a user
//! chain, another nftables table, a flow to another address) stays.
use std::process::{Command, Stdio};

use lb_testkit::{netns::Netns, unique};

/// Runs a command inside `ns` (setns before exec), feeding `input`; returns stdout.
fn in_ns(ns: &Netns, program: &str, args: &[&str], input: Option<&str>) -> (bool, String) {
    use std::io::Write as _;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    lb_testkit::netns::exec_in(&mut cmd, &ns.name).unwrap();
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{program}: {e}"));
    if let Some(i) = input {
        child.stdin.take().unwrap().write_all(i.as_bytes()).unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn must(ns: &Netns, program: &str, args: &[&str], input: Option<&str>) -> String {
    let (ok, out) = in_ns(ns, program, args, input);
    assert!(ok, "{program} {args:?}: {out}");
    out
}

const NAT: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-TCOU7JCQXEZGVUNU - [0:0]
:KUBE-SEP-A - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:MY-CHAIN - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A OUTPUT -j MY-CHAIN
-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment \"kube-system/kube-dns:dns cluster IP\" -m udp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU
-A KUBE-SVC-TCOU7JCQXEZGVUNU -j KUBE-SEP-A
-A KUBE-SEP-A -p udp -m udp -j DNAT --to-destination 10.99.0.2:53
-A MY-CHAIN -d 192.0.2.1/32 -j RETURN
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD
-A INPUT -p tcp --dport 22 -j ACCEPT
-A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT
COMMIT
";

#[test]
fn cleanup_removes_kube_proxy_rules_devices_and_service_conntrack_and_keeps_the_rest() {
    let ns = Netns::create(&format!("lbt-{}", unique("kpclean")));
    // An isolated "node": a veth pair inside the namespace carries the
    // routes, so packets to the service and to other addresses leave nowhere.
    // (This kernel has no dummy driver; kube-ipvs0 is a dummy in real IPVS
    // mode, the cleanup goes by its name.)
    ns.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p",
    ]);
    ns.ip(&["addr", "add", "10.99.0.1/24", "dev", "eth0"]);
    ns.ip(&["link", "set", "eth0", "up"]);
    ns.ip(&["route", "add", "10.96.0.0/12", "dev", "eth0"]);
    ns.ip(&["route", "add", "192.0.2.0/24", "dev", "eth0"]);
    ns.ip(&[
        "link",
        "add",
        "kube-ipvs0",
        "type",
        "veth",
        "peer",
        "name",
        "kube-ipvs0p",
    ]);

    must(&ns, "iptables-legacy-restore", &[], Some(NAT));
    must(&ns, "iptables-nft-restore", &[], Some(NAT));
    must(&ns, "nft", &["-f", "-"], Some("table ip kube-proxy {\n chain services {\n }\n}\ntable inet keep-me {\n chain input {\n }\n}\n"));

    // Flows kube-proxy DNATed (DNS to the ClusterIP) and one that was not.
    for dst in ["10.96.0.10:53", "10.96.0.10:53", "192.0.2.9:53"] {
        let script = format!("import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.sendto(b'q',('{}',{}))\n", dst.split(':').next().unwrap(), dst.split(':').nth(1).unwrap());
        must(&ns, "python3", &["-c", &script], None);
    }
    let before = must(&ns, "conntrack", &["-L"], None);
    assert!(before.contains("dst=10.96.0.10"), "{before}");

    // A dry run changes nothing and says what it would do.
    let agent = lb_testkit::sibling_bin("lb-agent");
    let agent = agent.to_str().unwrap();
    let dry = must(
        &ns,
        agent,
        &[
            "cleanup-kube-proxy",
            "--service-cidr",
            "10.96.0.0/12",
            "--dry-run",
        ],
        None,
    );
    assert!(
        dry.contains("would remove iptables: iptables-legacy nat: 5 chains, 7 rules"),
        "{dry}"
    );
    assert!(must(&ns, "iptables-legacy-save", &[], None).contains("KUBE-SERVICES"));

    let out = must(
        &ns,
        agent,
        &["cleanup-kube-proxy", "--service-cidr", "10.96.0.0/12"],
        None,
    );
    for line in [
        "removed iptables: iptables-legacy nat: 5 chains, 7 rules",
        "removed iptables: iptables-legacy filter: 1 chains, 2 rules",
        "removed iptables: iptables-nft nat: 5 chains, 7 rules",
        "removed nftables table ip kube-proxy",
        "removed the kube-ipvs0 device",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
    for save in ["iptables-legacy-save", "iptables-nft-save"] {
        let rules = must(&ns, save, &[], None);
        assert!(!rules.contains("KUBE-"), "{save}:\n{rules}");
        assert!(
            rules.contains("-A OUTPUT -j MY-CHAIN")
                && rules.contains("-A MY-CHAIN -d 192.0.2.1/32 -j RETURN"),
            "{save}:\n{rules}"
        );
    }
    assert!(
        must(&ns, "iptables-legacy-save", &["-t", "filter"], None).contains("--dport 22 -j ACCEPT")
    );
    let tables = must(&ns, "nft", &["list", "tables"], None);
    assert!(
        !tables.contains("kube-proxy") && tables.contains("inet keep-me"),
        "{tables}"
    );
    let (exists, _) = in_ns(&ns, "ip", &["link", "show", "kube-ipvs0"], None);
    assert!(!exists, "kube-ipvs0 is gone");
    let after = must(&ns, "conntrack", &["-L"], None);
    assert!(
        !after.contains("dst=10.96.0.10"),
        "service flows deleted:\n{after}"
    );
    assert!(
        after.contains("dst=192.0.2.9"),
        "other flows kept:\n{after}"
    );
    assert!(
        dry.contains("would remove conntrack entries to 10.96.0.0/12: 2 flow entries"),
        "{dry}"
    );
    assert!(
        out.contains("removed conntrack entries to 10.96.0.0/12: 2 flow entries"),
        "{out}"
    );

    // Running it again finds nothing.
    let again = must(&ns, agent, &["cleanup-kube-proxy"], None);
    assert!(
        again.contains("no kube-proxy rules or devices found"),
        "{again}"
    );
}
