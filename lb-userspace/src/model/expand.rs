//! The expansion both sources share. A service port becomes frontends:
//! every service address on the port, plus the NodePort on each of this
//! node's addresses of the service's families. Each frontend gets the
//! backends its traffic policy lets it use.
//!
//! The services file and the Kubernetes translator only read and check their
//! own input. They describe a service (`Shape`) and one of its ports
//! (`Port`, with candidate backends), and this module does the rest. So
//! "which frontends does a NodePort service with `internalTrafficPolicy:
//! Local` have, with which backends" has one answer, tested once.
use std::net::IpAddr;

use super::{
    serves_family, source_ranges_for, Algorithm, Backend, ForwardingMode, Frontend, FrontendKind,
    Protocol,
};
use crate::net::Cidr;

/// What a service's ports share.
#[derive(Clone, Copy, Debug)]
pub struct Shape<'a> {
    /// ClusterIPs, external IPs and LoadBalancer ingress IPs, with their kinds.
    pub addresses: &'a [(IpAddr, FrontendKind)],
    /// This node's addresses that serve NodePorts.
    pub nodeport_addresses: &'a [IpAddr],
    pub algorithm: Algorithm,
    /// The Maglev table size the service asks for (checked by the source).
    pub maglev_table_size: Option<u32>,
    /// sessionAffinity: ClientIP and its timeout.
    pub affinity_timeout_s: Option<u32>,
    /// internalTrafficPolicy: Local. The ClusterIPs use only this node's
    /// endpoints, whatever their topology hints (kube-proxy's
    /// CategorizeEndpoints).
    pub internal_local: bool,
    /// externalTrafficPolicy: Local. Traffic from outside the cluster uses
    /// only this node's endpoints (NodePorts, external and LoadBalancer IPs).
    pub external_local: bool,
    /// loadBalancerSourceRanges, as given. Each LoadBalancer address keeps
    /// the ones of its family.
    pub source_ranges: &'a [Cidr],
    /// The service's forwarding mode, for its frontends that take traffic
    /// from outside (a ClusterIP's traffic never crosses nodes translated).
    pub forwarding: Option<ForwardingMode>,
}

/// One service port.
#[derive(Clone, Copy, Debug)]
pub struct Port {
    /// The port's place in the service (sessionAffinity is per service port).
    pub index: u16,
    pub port: u16,
    pub protocol: Protocol,
    /// Already checked by the source: in range, and allowed by the service type.
    pub node_port: Option<u16>,
}

/// A backend of the port, and whether topology (hints) lets cluster traffic
/// from this node use it. A source without topology says true.
pub type Candidate = (Backend, bool);

/// Appends `port`'s frontends to `out`.
pub fn port_frontends(
    shape: &Shape<'_>,
    port: &Port,
    candidates: &[Candidate],
    out: &mut Vec<Frontend>,
) {
    let mut fronts: Vec<(IpAddr, u16, FrontendKind)> = shape
        .addresses
        .iter()
        .map(|(a, k)| (*a, port.port, *k))
        .collect();
    if let Some(np) = port.node_port {
        // On the node's addresses of the service's own families (its
        // ClusterIPs', Kubernetes' spec.ipFamilies): a single-stack IPv4
        // service has no IPv6 NodePort, even with an IPv6 external or
        // LoadBalancer IP, as kube-proxy's per-family proxiers skip a
        // service without a ClusterIP of their family.
        fronts.extend(
            shape
                .nodeport_addresses
                .iter()
                .filter(|n| serves_family(shape.addresses, n))
                .map(|a| (*a, np, FrontendKind::NodePort)),
        );
    }
    for (address, fport, kind) in fronts {
        let cluster_local = kind == FrontendKind::ClusterIP && shape.internal_local;
        let external_local = kind != FrontendKind::ClusterIP && shape.external_local;
        let mut backends: Vec<Backend> = candidates
            .iter()
            .filter(|(b, _)| b.address.is_ipv4() == address.is_ipv4())
            .filter(|(b, in_topology)| {
                if cluster_local {
                    b.local
                } else if external_local {
                    // The local view (traffic from outside) takes every local
                    // endpoint whatever its hints; the cluster view (clients
                    // on this node) keeps topology, plus those local ones.
                    *in_topology || b.local
                } else {
                    *in_topology
                }
            })
            .map(|(b, _)| b.clone())
            .collect();
        backends.sort();
        out.push(Frontend {
            address,
            port: fport,
            port_index: port.index,
            protocol: port.protocol,
            kind,
            algorithm: shape.algorithm,
            maglev_table_size: shape.maglev_table_size,
            affinity_timeout_s: shape.affinity_timeout_s,
            external_traffic_local: external_local,
            source_ranges: source_ranges_for(kind, address, shape.source_ranges),
            forwarding: shape.forwarding.filter(|_| kind != FrontendKind::ClusterIP),
            backends,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::BackendState;

    fn backend(a: &str, local: bool) -> Backend {
        Backend {
            address: a.parse().unwrap(),
            port: 8080,
            state: BackendState::Active,
            local,
            weight: 1,
        }
    }

    fn shape<'a>(
        addresses: &'a [(IpAddr, FrontendKind)],
        nodes: &'a [IpAddr],
        internal_local: bool,
        external_local: bool,
    ) -> Shape<'a> {
        Shape {
            addresses,
            nodeport_addresses: nodes,
            algorithm: Algorithm::Random,
            maglev_table_size: None,
            affinity_timeout_s: None,
            internal_local,
            external_local,
            source_ranges: &[],
            forwarding: None,
        }
    }

    fn addresses_of(out: &[Frontend], kind: FrontendKind) -> Vec<Vec<String>> {
        out.iter()
            .filter(|f| f.kind == kind)
            .map(|f| f.backends.iter().map(|b| b.address.to_string()).collect())
            .collect()
    }

    const PORT: Port = Port {
        index: 0,
        port: 80,
        protocol: Protocol::Tcp,
        node_port: Some(30080),
    };

    #[test]
    fn nodeports_open_on_node_addresses_of_the_cluster_ips_families_only() {
        let addrs = [
            ("10.96.0.10".parse().unwrap(), FrontendKind::ClusterIP),
            ("2001:db8::5".parse().unwrap(), FrontendKind::LoadBalancer),
        ];
        let nodes: Vec<IpAddr> = vec!["192.168.1.10".parse().unwrap(), "fd00::10".parse().unwrap()];
        let mut out = Vec::new();
        port_frontends(&shape(&addrs, &nodes, false, false), &PORT, &[], &mut out);
        let np: Vec<String> = out
            .iter()
            .filter(|f| f.kind == FrontendKind::NodePort)
            .map(|f| format!("{}:{}", f.address, f.port))
            .collect();
        assert_eq!(np, ["192.168.1.10:30080"]);
    }

    #[test]
    fn traffic_policies_choose_backends_per_frontend_kind() {
        let addrs = [("10.96.0.10".parse().unwrap(), FrontendKind::ClusterIP)];
        let nodes: Vec<IpAddr> = vec!["192.168.1.10".parse().unwrap()];
        // .1 local, hinted elsewhere; .2 remote, hinted here; .3 remote, elsewhere.
        let c = [
            (backend("10.0.0.1", true), false),
            (backend("10.0.0.2", false), true),
            (backend("10.0.0.3", false), false),
        ];
        let run = |internal, external| {
            let mut out = Vec::new();
            port_frontends(
                &shape(&addrs, &nodes, internal, external),
                &PORT,
                &c,
                &mut out,
            );
            (
                addresses_of(&out, FrontendKind::ClusterIP),
                addresses_of(&out, FrontendKind::NodePort),
            )
        };
        // Cluster: topology; both views alike.
        assert_eq!(
            run(false, false),
            (
                vec![vec!["10.0.0.2".to_string()]],
                vec![vec!["10.0.0.2".to_string()]]
            )
        );
        // internal Local: the ClusterIP takes the local one, hints ignored.
        assert_eq!(run(true, false).0, vec![vec!["10.0.0.1".to_string()]]);
        // external Local: the NodePort takes topology plus every local one.
        assert_eq!(
            run(false, true).1,
            vec![vec!["10.0.0.1".to_string(), "10.0.0.2".to_string()]]
        );
        let mut out = Vec::new();
        port_frontends(&shape(&addrs, &nodes, false, true), &PORT, &c, &mut out);
        assert!(out
            .iter()
            .all(|f| f.external_traffic_local == (f.kind != FrontendKind::ClusterIP)));
    }

    #[test]
    fn backends_of_the_other_family_are_left_out_and_the_rest_sorted() {
        let addrs = [("10.96.0.10".parse().unwrap(), FrontendKind::ClusterIP)];
        let c = [
            (backend("10.0.0.9", false), true),
            (backend("fd00::1", false), true),
            (backend("10.0.0.2", false), true),
        ];
        let mut out = Vec::new();
        let p = Port {
            node_port: None,
            ..PORT
        };
        port_frontends(&shape(&addrs, &[], false, false), &p, &c, &mut out);
        assert_eq!(
            addresses_of(&out, FrontendKind::ClusterIP),
            vec![vec!["10.0.0.2", "10.0.0.9"]]
        );
    }
}
