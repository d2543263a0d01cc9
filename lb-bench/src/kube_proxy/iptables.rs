//! kube-proxy's iptables mode (pkg/proxy/iptables/proxier.go): every
//! ClusterIP is one rule in KUBE-SERVICES, walked in order by the first
//! packet of each connection; it jumps to the service's KUBE-SVC-* chain,
//! which picks an endpoint with `statistic --mode random --probability` and
//! jumps to its KUBE-SEP-* chain, which DNATs.
use std::fmt::Write as _;

use super::chain_hash;
use crate::workload::Svc;

fn svc_chain(s: &Svc) -> String {
    format!(
        "KUBE-SVC-{}",
        chain_hash(&format!("default/{}:http/tcp", s.name))
    )
}

fn sep_chain(s: &Svc, ep: &std::net::SocketAddrV4) -> String {
    format!(
        "KUBE-SEP-{}",
        chain_hash(&format!("default/{}:http/tcp/{ep}", s.name))
    )
}

/// The KUBE-SERVICES rule of a service, in the order kube-proxy writes it.
fn services_rule(out: &mut String, s: &Svc) {
    let _ = writeln!(
        out,
        "-A KUBE-SERVICES -d {}/32 -p tcp -m comment --comment \"default/{}:http cluster IP\" -m tcp --dport {} -j {}",
        s.vip,
        s.name,
        s.port,
        svc_chain(s)
    );
}

/// A service's own chains: its KUBE-SVC rules and every KUBE-SEP chain.
fn service_chains(out: &mut String, s: &Svc) {
    let svc = svc_chain(s);
    let n = s.endpoints.len();
    for (i, ep) in s.endpoints.iter().enumerate() {
        let sep = sep_chain(s, ep);
        if i + 1 < n {
            // Endpoint i of n is taken with probability 1/(n-i) among those left.
            let _ = writeln!(
                out,
                "-A {svc} -m comment --comment \"default/{}:http -> {ep}\" -m statistic --mode random --probability {:.10} -j {sep}",
                s.name,
                1.0 / (n - i) as f64
            );
        } else {
            let _ = writeln!(
                out,
                "-A {svc} -m comment --comment \"default/{}:http -> {ep}\" -j {sep}",
                s.name
            );
        }
    }
    for ep in &s.endpoints {
        let sep = sep_chain(s, ep);
        let _ = writeln!(
            out,
            "-A {sep} -s {}/32 -m comment --comment \"default/{}:http\" -j KUBE-MARK-MASQ",
            ep.ip(),
            s.name
        );
        let _ = writeln!(out, "-A {sep} -p tcp -m comment --comment \"default/{}:http\" -m tcp -j DNAT --to-destination {ep}", s.name);
    }
}

fn declare(out: &mut String, chain: &str) {
    let _ = writeln!(out, ":{chain} - [0:0]");
}

/// The whole nat table, as a full sync writes it (`iptables-restore`).
pub fn full(services: &[Svc]) -> String {
    let mut out = String::with_capacity(services.len() * 600);
    out.push_str("*nat\n");
    for c in [
        "PREROUTING ACCEPT",
        "INPUT ACCEPT",
        "OUTPUT ACCEPT",
        "POSTROUTING ACCEPT",
    ] {
        let _ = writeln!(out, ":{c} [0:0]");
    }
    for c in ["KUBE-SERVICES", "KUBE-MARK-MASQ", "KUBE-POSTROUTING"] {
        declare(&mut out, c);
    }
    for s in services {
        declare(&mut out, &svc_chain(s));
        for ep in &s.endpoints {
            declare(&mut out, &sep_chain(s, ep));
        }
    }
    out.push_str(
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
    );
    out.push_str(
        "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
    );
    out.push_str("-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n");
    out.push_str("-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n");
    out.push_str("-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n");
    out.push_str("-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n");
    out.push_str("-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n");
    for s in services {
        services_rule(&mut out, s);
    }
    for s in services {
        service_chains(&mut out, s);
    }
    out.push_str("COMMIT\n");
    out
}

/// One endpoint of `after` replaced (it was `before`), as kube-proxy's
/// partial sync writes it (`iptables-restore --noflush`, MinimizeIPTablesRestore,
/// GA in 1.28): KUBE-SERVICES is always rewritten whole, the changed
/// service's chains are rewritten, the new endpoint chain is added and the
/// old one deleted.
pub fn one_endpoint_changed(services: &[Svc], before: &Svc, after: &Svc) -> String {
    let mut out = String::with_capacity(services.len() * 160);
    out.push_str("*nat\n");
    declare(&mut out, "KUBE-SERVICES");
    declare(&mut out, &svc_chain(after));
    for ep in &after.endpoints {
        declare(&mut out, &sep_chain(after, ep));
    }
    // A chain must be empty to be deleted: declaring it flushes it (as kube-proxy does).
    let gone: Vec<_> = before
        .endpoints
        .iter()
        .filter(|e| !after.endpoints.contains(e))
        .collect();
    for ep in &gone {
        declare(&mut out, &sep_chain(before, ep));
    }
    for s in services {
        services_rule(&mut out, if s.name == after.name { after } else { s });
    }
    service_chains(&mut out, after);
    for ep in gone {
        let _ = writeln!(out, "-X {}", sep_chain(before, ep));
    }
    out.push_str("COMMIT\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{replacement, Workload};

    #[test]
    fn layout_walks_services_then_statistic_then_dnat() {
        let w = Workload::new(2, 3, &[]);
        let text = full(&w.services);
        let svc = svc_chain(&w.services[0]);
        assert!(text.contains(&format!("-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment \"default/s0:http cluster IP\" -m tcp --dport 80 -j {svc}")));
        assert!(text.contains("--probability 0.3333333333"));
        assert!(text.contains("--probability 0.5000000000"));
        assert!(text.contains("-j DNAT --to-destination 10.128.0.1:8080"));
        assert_eq!(text.matches("-A KUBE-SERVICES").count(), 2);
        // The change rewrites KUBE-SERVICES and removes the old endpoint's chain.
        let after = replacement(&w.services[1], true);
        let change = one_endpoint_changed(&w.services, &w.services[1], &after);
        assert_eq!(change.matches("-A KUBE-SERVICES").count(), 2);
        assert!(change.contains(&format!(
            "-X {}",
            sep_chain(&w.services[1], &w.services[1].endpoints[0])
        )));
    }
}
