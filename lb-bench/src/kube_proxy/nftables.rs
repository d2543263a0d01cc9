//! kube-proxy's nftables mode (pkg/proxy/nftables/proxier.go, GA in 1.33):
//! one verdict map `service-ips` keyed by address . protocol . port sends a
//! connection to the service's chain, which picks an endpoint with `numgen
//! random mod N vmap`, and the endpoint chain DNATs. The lookup is a hash,
//! so unlike iptables mode the walk does not grow with the services.
use std::fmt::Write as _;

use super::chain_hash;
use crate::workload::Svc;

const T: &str = "ip kube-proxy";

fn svc_chain(s: &Svc) -> String {
    format!(
        "service-{}-default/{}/tcp/http",
        &chain_hash(&s.name)[..8],
        s.name
    )
}

fn ep_chain(s: &Svc, ep: &std::net::SocketAddrV4) -> String {
    format!(
        "endpoint-{}-default/{}/tcp/http__{}/{}",
        &chain_hash(&format!("{}{ep}", s.name))[..8],
        s.name,
        ep.ip(),
        ep.port()
    )
}

fn service_chains(out: &mut String, s: &Svc) {
    let svc = svc_chain(s);
    let _ = writeln!(out, "add chain {T} {svc}");
    let arms: Vec<String> = s
        .endpoints
        .iter()
        .enumerate()
        .map(|(i, ep)| format!("{i} : goto {}", ep_chain(s, ep)))
        .collect();
    for ep in &s.endpoints {
        endpoint_chain(out, s, ep);
    }
    let _ = writeln!(
        out,
        "add rule {T} {svc} numgen random mod {} vmap {{ {} }}",
        s.endpoints.len(),
        arms.join(" , ")
    );
}

fn endpoint_chain(out: &mut String, s: &Svc, ep: &std::net::SocketAddrV4) {
    let c = ep_chain(s, ep);
    let _ = writeln!(out, "add chain {T} {c}");
    let _ = writeln!(
        out,
        "add rule {T} {c} ip saddr {} jump mark-for-masquerade",
        ep.ip()
    );
    let _ = writeln!(out, "add rule {T} {c} meta l4proto tcp dnat to {ep}");
}

/// The whole table, as a full sync writes it (one `nft -f` transaction).
pub fn full(services: &[Svc]) -> String {
    let mut out = String::with_capacity(services.len() * 700);
    // Start from nothing (a later scale reuses the namespace).
    let _ = writeln!(out, "add table {T}");
    let _ = writeln!(out, "delete table {T}");
    let _ = writeln!(out, "add table {T}");
    let _ = writeln!(
        out,
        "add map {T} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}"
    );
    for (name, hook, prio) in [
        ("nat-prerouting", "prerouting", "-100"),
        ("nat-output", "output", "-100"),
        ("nat-postrouting", "postrouting", "100"),
    ] {
        let _ = writeln!(
            out,
            "add chain {T} {name} {{ type nat hook {hook} priority {prio} ; }}"
        );
    }
    let _ = writeln!(out, "add chain {T} services");
    let _ = writeln!(out, "add chain {T} masquerading");
    let _ = writeln!(out, "add chain {T} mark-for-masquerade");
    let _ = writeln!(out, "add rule {T} nat-prerouting jump services");
    let _ = writeln!(out, "add rule {T} nat-output jump services");
    let _ = writeln!(out, "add rule {T} nat-postrouting jump masquerading");
    let _ = writeln!(
        out,
        "add rule {T} mark-for-masquerade mark set mark or 0x4000"
    );
    let _ = writeln!(out, "add rule {T} masquerading mark and 0x4000 == 0 return");
    let _ = writeln!(out, "add rule {T} masquerading mark set mark xor 0x4000");
    let _ = writeln!(out, "add rule {T} masquerading masquerade fully-random");
    let _ = writeln!(
        out,
        "add rule {T} services ip daddr . meta l4proto . th dport vmap @service-ips"
    );
    for s in services {
        service_chains(&mut out, s);
        let _ = writeln!(
            out,
            "add element {T} service-ips {{ {} . tcp . {} : goto {} }}",
            s.vip,
            s.port,
            svc_chain(s)
        );
    }
    out
}

/// One endpoint of `after` replaced (it was `before`): one transaction that
/// adds the new endpoint chain, rewrites the service chain and deletes the
/// old endpoint chain; the map and every other service are untouched.
pub fn one_endpoint_changed(before: &Svc, after: &Svc) -> String {
    let mut out = String::new();
    for ep in after
        .endpoints
        .iter()
        .filter(|e| !before.endpoints.contains(e))
    {
        endpoint_chain(&mut out, after, ep);
    }
    let svc = svc_chain(after);
    let arms: Vec<String> = after
        .endpoints
        .iter()
        .enumerate()
        .map(|(i, ep)| format!("{i} : goto {}", ep_chain(after, ep)))
        .collect();
    let _ = writeln!(out, "flush chain {T} {svc}");
    let _ = writeln!(
        out,
        "add rule {T} {svc} numgen random mod {} vmap {{ {} }}",
        after.endpoints.len(),
        arms.join(" , ")
    );
    for ep in before
        .endpoints
        .iter()
        .filter(|e| !after.endpoints.contains(e))
    {
        let _ = writeln!(out, "delete chain {T} {}", ep_chain(before, ep));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{replacement, Workload};

    #[test]
    fn layout_is_a_verdict_map_then_numgen_then_dnat() {
        let w = Workload::new(2, 2, &[]);
        let text = full(&w.services);
        assert!(text.contains(
            "add element ip kube-proxy service-ips { 10.96.0.1 . tcp . 80 : goto service-"
        ));
        assert!(text.contains("numgen random mod 2 vmap { 0 : goto endpoint-"));
        assert!(text.contains("meta l4proto tcp dnat to 10.128.0.1:8080"));
        let after = replacement(&w.services[0], true);
        let change = one_endpoint_changed(&w.services[0], &after);
        assert!(change.contains("flush chain ip kube-proxy service-"));
        assert!(change.contains("delete chain ip kube-proxy endpoint-"));
        assert!(!change.contains("service-ips"), "the map is untouched");
    }
}
