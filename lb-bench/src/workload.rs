//! The synthetic cluster every benchmark uses, rendered for each contender
//! from one description: our services file and model, kube-proxy's iptables
//! and nftables layouts.
use std::net::{Ipv4Addr, SocketAddrV4};

use lb::model::{
    Algorithm, Backend, BackendState, Frontend, FrontendKind, Model, Protocol, Service, ServiceName,
};

/// Service addresses: 10.96.0.1, 10.96.0.2, ... (the default service CIDR).
const VIP_BASE: u32 = u32::from_be_bytes([10, 96, 0, 0]);
/// Pod addresses of the services that are never dialed: 10.128.0.1, ...
const POD_BASE: u32 = u32::from_be_bytes([10, 128, 0, 0]);
pub const SERVICE_PORT: u16 = 80;
pub const TARGET_PORT: u16 = 8080;

#[derive(Clone, Debug)]
pub struct Svc {
    pub name: String,
    pub vip: Ipv4Addr,
    pub port: u16,
    pub endpoints: Vec<SocketAddrV4>,
}

pub struct Workload {
    pub services: Vec<Svc>,
}

impl Workload {
    /// `n` services with `endpoints` endpoints each. The last service, the
    /// one that is measured, gets `last` instead (real servers) when given:
    /// kube-proxy's iptables layout matches it after every other rule.
    pub fn new(n: usize, endpoints: usize, last: &[SocketAddrV4]) -> Self {
        let services = (0..n)
            .map(|i| {
                let eps = if i + 1 == n && !last.is_empty() {
                    last.to_vec()
                } else {
                    (0..endpoints)
                        .map(|j| {
                            SocketAddrV4::new(
                                Ipv4Addr::from(POD_BASE + (i * endpoints + j) as u32 + 1),
                                TARGET_PORT,
                            )
                        })
                        .collect()
                };
                Svc {
                    name: format!("s{i}"),
                    vip: vip(i),
                    port: SERVICE_PORT,
                    endpoints: eps,
                }
            })
            .collect();
        Self { services }
    }

    pub fn last(&self) -> &Svc {
        self.services.last().expect("at least one service")
    }

    /// Our services file (standalone mode), one flow-style line per service.
    pub fn services_yaml(&self) -> String {
        let mut out = String::with_capacity(self.services.len() * 160);
        out.push_str("services:\n");
        for s in &self.services {
            out.push_str(&format!(
                "  - {{name: {}, clusterIPs: [{}], ports: [{{port: {}, targetPort: {}}}], backends: [",
                s.name,
                s.vip,
                s.port,
                s.endpoints.first().map_or(TARGET_PORT, std::net::SocketAddrV4::port)
            ));
            let eps: Vec<String> = s
                .endpoints
                .iter()
                .map(|e| format!("{{address: {}}}", e.ip()))
                .collect();
            out.push_str(&eps.join(", "));
            out.push_str("]}\n");
        }
        out
    }

    /// The same as our model, with frontends of `kind`.
    pub fn model(&self, kind: FrontendKind) -> Model {
        let mut m = Model::default();
        for s in &self.services {
            m.services
                .insert(ServiceName::new("default", &s.name), service(s, kind));
        }
        m
    }
}

/// A map capacity for `needed` entries: the agent's default at least, a
/// power of two.
pub fn map_size(needed: usize) -> u32 {
    needed.max(65_536).next_power_of_two() as u32
}

/// The agent's map-size flags for `n` services with up to two endpoints.
pub fn agent_map_args(n: usize) -> Vec<String> {
    vec![
        format!("--map-size-services={}", map_size(4 * n + 16)),
        format!("--map-size-backends={}", map_size(2 * n + 16)),
    ]
}

pub fn vip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(VIP_BASE + i as u32 + 1)
}

pub fn service(s: &Svc, kind: FrontendKind) -> Service {
    Service {
        frontends: vec![Frontend {
            address: s.vip.into(),
            port: s.port,
            port_index: 0,
            protocol: Protocol::Tcp,
            kind,
            algorithm: Algorithm::Random,
            affinity_timeout_s: None,
            maglev_table_size: None,
            external_traffic_local: false,
            forwarding: None,
            source_ranges: Vec::new(),
            backends: s
                .endpoints
                .iter()
                .map(|e| Backend {
                    address: (*e.ip()).into(),
                    port: e.port(),
                    state: BackendState::Active,
                    local: kind != FrontendKind::ClusterIP,
                    weight: 1,
                })
                .collect(),
        }],
        health_check_node_port: None,
        metrics: false,
    }
}

/// The endpoint that replaces `svc`'s first endpoint in the "one endpoint
/// changed" measurements (a rolling update replacing one pod), and back.
pub fn replacement(svc: &Svc, toggle: bool) -> Svc {
    let mut s = svc.clone();
    if toggle {
        let e = s.endpoints[0];
        let [a, b, c, d] = e.ip().octets();
        s.endpoints[0] = SocketAddrV4::new(Ipv4Addr::new(a ^ 0x40, b, c, d), e.port());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_services_file_parses_to_the_same_model() {
        let w = Workload::new(3, 2, &["10.250.0.11:8080".parse().unwrap()]);
        let parsed = lb::source::file::parse::parse(&w.services_yaml()).unwrap();
        let built = w.model(FrontendKind::ClusterIP);
        assert_eq!(parsed.services.len(), 3);
        for (name, svc) in &built.services {
            let p = &parsed.services[name];
            assert_eq!(p.frontends[0].address, svc.frontends[0].address);
            assert_eq!(p.frontends[0].backends, svc.frontends[0].backends, "{name}");
        }
        assert_eq!(
            w.last().endpoints,
            vec!["10.250.0.11:8080".parse().unwrap()]
        );
    }
}
