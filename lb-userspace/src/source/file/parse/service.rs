//! One service of the file turned into the model's service, with the
//! checks that need only that service (the checks between services are
//! `super::Converter`'s).
use std::{collections::BTreeSet, net::IpAddr};

use super::spec::{err, BackendSpec, FileContext, FileError, ServiceSpec};
use crate::model::{
    expand::{port_frontends, Candidate, Port, Shape},
    Algorithm, Backend, FrontendKind, Service, MAX_BACKENDS_PER_FRONTEND,
};

/// One service of a file as the model holds it, checked on its own (the
/// checks between services are the caller's); the error names it `at`.
pub(crate) fn convert(
    at: &str,
    spec: &ServiceSpec,
    ctx: &FileContext,
) -> Result<Service, FileError> {
    let mut service = to_service(at, spec, ctx)?;
    service.shrink_to_fit();
    Ok(service)
}

fn to_service(at: &str, spec: &ServiceSpec, ctx: &FileContext) -> Result<Service, FileError> {
    if spec.name.trim().is_empty() {
        return Err(err(
            format!("{at}.name"),
            "must not be empty; name the service",
        ));
    }
    if spec.namespace.trim().is_empty() {
        return Err(err(
            format!("{at}.namespace"),
            "must not be empty; leave it out for \"default\"",
        ));
    }

    let mut addresses = Vec::new();
    for (field, list, kind) in [
        ("clusterIPs", &spec.cluster_ips, FrontendKind::ClusterIP),
        ("externalIPs", &spec.external_ips, FrontendKind::ExternalIP),
        (
            "loadBalancerIPs",
            &spec.load_balancer_ips,
            FrontendKind::LoadBalancer,
        ),
    ] {
        for (j, text) in list.iter().enumerate() {
            let field = format!("{at}.{field}[{j}]");
            let address = parse_service_address(&field, text)?;
            if addresses.iter().any(|(a, _)| *a == address) {
                return Err(err(
                    field,
                    format!("{address} is listed twice; remove the duplicate"),
                ));
            }
            addresses.push((address, kind));
        }
    }
    if addresses.is_empty() {
        return Err(err(
            at.to_string(),
            "has no address; set clusterIPs (or externalIPs / loadBalancerIPs)",
        ));
    }
    if spec.ports.is_empty() {
        return Err(err(
            format!("{at}.ports"),
            "is empty; list at least one port",
        ));
    }
    let mut source_ranges = Vec::new();
    for (j, text) in spec.load_balancer_source_ranges.iter().enumerate() {
        let range: crate::net::Cidr = text.trim().parse().map_err(|e| {
            err(
                format!("{at}.loadBalancerSourceRanges[{j}]"),
                format!("{e}; give a network like 203.0.113.0/24"),
            )
        })?;
        source_ranges.push(range);
    }

    let algorithm = spec.algorithm.unwrap_or(ctx.default_algorithm);
    let maglev_table_size = match spec.maglev_table_size {
        None => None,
        Some(_) if algorithm != Algorithm::Maglev => {
            return Err(err(
                format!("{at}.maglevTableSize"),
                "is set but the service does not use Maglev; set algorithm: maglev or remove it",
            ))
        }
        Some(m) => match u32::try_from(m) {
            Ok(m) if crate::desired::maglev::valid_size(m) => Some(m),
            _ => {
                return Err(err(
                    format!("{at}.maglevTableSize"),
                    format!(
                        "{m} is not a supported table size; use one of {:?} (a prime, about 100 × the backends or more)",
                        lb_common::maps::MAGLEV_PRIMES
                    ),
                ))
            }
        },
    };
    let affinity_timeout_s = match spec.session_affinity.as_deref() {
        None | Some("None") => {
            if spec.session_affinity_timeout_seconds.is_some() {
                return Err(err(
                    format!("{at}.sessionAffinityTimeoutSeconds"),
                    "is set but sessionAffinity is not ClientIP; set sessionAffinity: ClientIP or remove it",
                ));
            }
            None
        }
        // Kubernetes' default timeout: 3 hours (10800 s); at most one day.
        Some("ClientIP") => match spec.session_affinity_timeout_seconds.unwrap_or(10_800) {
            t @ 1..=86_400 => Some(t as u32),
            t => {
                return Err(err(
                    format!("{at}.sessionAffinityTimeoutSeconds"),
                    format!("{t} is out of range; use 1 to 86400 seconds"),
                ))
            }
        },
        Some(other) => {
            return Err(err(
                format!("{at}.sessionAffinity"),
                format!("unknown value {other:?}; use None or ClientIP"),
            ))
        }
    };

    let kind = spec.kind.as_deref().unwrap_or("ClusterIP");
    if !matches!(kind, "ClusterIP" | "NodePort" | "LoadBalancer") {
        return Err(err(
            format!("{at}.type"),
            format!("{kind:?} is not supported; use ClusterIP, NodePort or LoadBalancer"),
        ));
    }
    let policy = |field: &str, v: &Option<String>| match v.as_deref() {
        None | Some("Cluster") => Ok(false),
        Some("Local") => Ok(true),
        Some(other) => Err(err(
            format!("{at}.{field}"),
            format!("{other:?} is not a policy; use Cluster or Local"),
        )),
    };
    let internal_local = policy("internalTrafficPolicy", &spec.internal_traffic_policy)?;
    let external_local = policy("externalTrafficPolicy", &spec.external_traffic_policy)?;

    let mut backends_by_address: Vec<(IpAddr, &BackendSpec)> = Vec::new();
    for (j, b) in spec.backends.iter().enumerate() {
        if let Some(w) = b.weight {
            if !(1..=65_535).contains(&w) {
                return Err(err(
                    format!("{at}.backends[{j}].weight"),
                    format!("{w} is out of range; use 1-65535"),
                ));
            }
        }
        let field = format!("{at}.backends[{j}].address");
        let address: IpAddr = b.address.trim().parse().map_err(|_| {
            err(
                field.clone(),
                format!(
                    "{:?} is not an IP address; write e.g. 10.244.1.2",
                    b.address
                ),
            )
        })?;
        check_unicast(&field, address)?;
        if backends_by_address.iter().any(|(a, _)| *a == address) {
            return Err(err(
                field,
                format!("{address} is listed twice; remove the duplicate"),
            ));
        }
        backends_by_address.push((address, b));
    }
    if backends_by_address.len() > MAX_BACKENDS_PER_FRONTEND {
        return Err(err(
            format!("{at}.backends"),
            format!(
                "has {} backends, at most {MAX_BACKENDS_PER_FRONTEND} are supported; split the service",
                backends_by_address.len()
            ),
        ));
    }

    let shape = Shape {
        addresses: &addresses,
        nodeport_addresses: &ctx.nodeport_addresses,
        algorithm,
        maglev_table_size,
        affinity_timeout_s,
        internal_local,
        external_local,
        source_ranges: &source_ranges,
        forwarding: spec.forwarding_mode,
    };
    let mut seen_ports = BTreeSet::new();
    let mut seen_names = BTreeSet::new();
    let mut frontends = Vec::new();
    for (j, p) in spec.ports.iter().enumerate() {
        let pat = format!("{at}.ports[{j}]");
        let port = check_port(&format!("{pat}.port"), p.port)?;
        let target = check_port(
            &format!("{pat}.targetPort"),
            p.target_port.unwrap_or(p.port),
        )?;
        let protocol = match crate::model::Protocol::from_name(&p.protocol) {
            Some(protocol) => protocol,
            None if p.protocol == "SCTP" => {
                return Err(err(
                    format!("{pat}.protocol"),
                    "SCTP is not supported by the socket load balancer; use TCP or UDP",
                ))
            }
            None => {
                return Err(err(
                    format!("{pat}.protocol"),
                    format!("unknown protocol {:?}; use TCP or UDP", p.protocol),
                ))
            }
        };
        if !seen_ports.insert((port, protocol)) {
            return Err(err(
                format!("{pat}.port"),
                format!(
                    "{port}/{} is listed twice; remove the duplicate",
                    protocol.as_str()
                ),
            ));
        }
        if let Some(name) = &p.name {
            if !seen_names.insert(name.clone()) {
                return Err(err(
                    format!("{pat}.name"),
                    format!("port name {name:?} is used twice; port names must be unique"),
                ));
            }
        }
        let node_port = match p.node_port {
            None => None,
            Some(np) => {
                let field = format!("{pat}.nodePort");
                if kind == "ClusterIP" {
                    return Err(err(
                        field,
                        "a ClusterIP service has no nodePort; set type: NodePort or LoadBalancer",
                    ));
                }
                let np = check_port(&field, np)?;
                if ctx.nodeport_addresses.is_empty() {
                    return Err(err(
                        field,
                        "NodePorts need this node's addresses: start lb-agent with --devices",
                    ));
                }
                Some(np)
            }
        };
        // No topology in a services file: every backend is a candidate.
        let candidates: Vec<Candidate> = backends_by_address
            .iter()
            .map(|(a, b)| {
                let backend = Backend {
                    address: *a,
                    port: target,
                    state: b.state,
                    local: b.local,
                    weight: b.weight.unwrap_or(1) as u32,
                };
                (backend, true)
            })
            .collect();
        let port = Port {
            index: j as u16,
            port,
            protocol,
            node_port,
        };
        port_frontends(&shape, &port, &candidates, &mut frontends);
    }
    Ok(Service {
        frontends,
        health_check_node_port: None,
        metrics: spec.metrics,
    })
}

fn parse_service_address(field: &str, text: &str) -> Result<IpAddr, FileError> {
    let address: IpAddr = text.trim().parse().map_err(|_| {
        err(
            field,
            format!("{text:?} is not an IP address; write e.g. 10.96.0.10"),
        )
    })?;
    check_unicast(field, address)?;
    Ok(address)
}

fn check_unicast(field: &str, address: IpAddr) -> Result<(), FileError> {
    let bad = match address {
        IpAddr::V4(a) => a.is_unspecified() || a.is_multicast() || a.is_broadcast(),
        IpAddr::V6(a) => a.is_unspecified() || a.is_multicast(),
    };
    if bad {
        return Err(err(
            field,
            format!("{address} is not a unicast address; use a unicast address"),
        ));
    }
    Ok(())
}

fn check_port(field: &str, port: i64) -> Result<u16, FileError> {
    match port {
        1..=65535 => Ok(port as u16),
        _ => Err(err(
            field,
            format!("{port} is not a valid port; use 1-65535"),
        )),
    }
}
