//! Sources of the model: the services file (standalone mode) and the
//! Kubernetes apiserver. A source only produces `SourceEvent`s; it never
//! touches maps. The agent feeds them to the reconciler.
pub mod file;
pub mod kubernetes;
pub mod nodeports;

use std::time::{Instant, SystemTime};

use crate::model::{Model, Service, ServiceName};

/// A change made upstream at `at` to endpoints of `family` (an
/// EndpointSlice's last-change-trigger-time and address type): the start of
/// kube-proxy's network programming latency, which it reports per family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trigger {
    pub at: SystemTime,
    pub family: crate::maps::Family,
}

#[derive(Debug)]
pub enum SourceEvent {
    /// The complete set of services (a services file, a Kubernetes initial
    /// list or relist): services not in it are removed.
    Full {
        model: Model,
        observed: Instant,
        /// When the changes in it were made upstream, where the source knows
        /// (EndpointSlices' last-change-trigger-time): the start of
        /// kube-proxy's network programming latency.
        triggers: Vec<Trigger>,
    },
    /// Some services changed; `None` means the service is gone.
    Changes {
        changes: Vec<(ServiceName, Option<Service>)>,
        observed: Instant,
        triggers: Vec<Trigger>,
    },
    /// The source could not be read or gave invalid input; the maps keep
    /// their state. `source` ("file", "kubernetes") and `reason` are short
    /// codes for metrics.
    Error {
        source: &'static str,
        reason: &'static str,
        message: String,
    },
    /// Part of an input was skipped (an SCTP port, a bad address).
    Warning {
        source: &'static str,
        reason: &'static str,
        message: String,
    },
}
