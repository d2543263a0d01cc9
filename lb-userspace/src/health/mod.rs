//! The health endpoints kube-proxy serves and cloud load balancers and
//! kubelet-style probes rely on:
//!
//! * `proxy`: the node's proxy health server (kube-proxy's
//!   `--healthz-bind-address`, port 10256): `/healthz` (200 while changes
//!   reach the maps in time and the node is eligible for load-balancer
//!   traffic) and `/livez` (the same, ignoring eligibility);
//! * `services`: one HTTP server per `healthCheckNodePort` of a LoadBalancer
//!   Service with externalTrafficPolicy: Local, answering 200 while this
//!   node has a ready endpoint of it, so the cloud load balancer sends
//!   traffic only to nodes that keep it local.
//!
//! Both follow kube-proxy's pkg/proxy/healthcheck (status codes, JSON
//! fields, headers) so the load balancers and dashboards built for it work
//! unchanged.
pub mod proxy;
pub mod services;

use std::sync::atomic::{AtomicU8, Ordering};

/// Whether this node should receive traffic from cloud load balancers
/// (kube-proxy's NodeEligible: the Node is not being deleted nor tainted
/// ToBeDeletedByClusterAutoscaler). Written by the Kubernetes source, read
/// by the health servers. Unknown (standalone mode, Node not seen yet)
/// counts as eligible, as in kube-proxy.
#[derive(Debug, Default)]
pub struct NodeEligibility(AtomicU8);

const UNKNOWN: u8 = 0;
const ELIGIBLE: u8 = 1;
const NOT_ELIGIBLE: u8 = 2;

impl NodeEligibility {
    pub fn set(&self, eligible: Option<bool>) {
        let v = match eligible {
            None => UNKNOWN,
            Some(true) => ELIGIBLE,
            Some(false) => NOT_ELIGIBLE,
        };
        self.0.store(v, Ordering::Relaxed);
    }

    pub fn eligible(&self) -> bool {
        self.0.load(Ordering::Relaxed) != NOT_ELIGIBLE
    }
}
