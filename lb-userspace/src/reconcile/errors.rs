//! What a reconcile reports: a service refused (its desired state is wrong,
//! or it does not fit the maps) and a run that stopped, with the one-line
//! summary an operator reads when many services are refused.
use std::collections::BTreeMap;

use crate::{desired::DesiredError, maps::MapWriteError, model::ServiceName};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Desired(#[from] DesiredError),
    #[error(
        "{map} would need {needed} entries but holds at most {max}: raise {flag} or remove services; \
         nothing of this service was changed"
    )]
    Capacity {
        map: &'static str,
        needed: usize,
        max: u32,
        flag: &'static str,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// These services were refused (the others applied); retried on the next
    /// reconcile. Displayed as one summary line (the per-service detail is in
    /// the list), however many there are.
    #[error("{}", refusal_summary(.0))]
    Refused(Vec<(ServiceName, ServiceError)>),
    /// Stopped between two services (the agent is shutting down); what was
    /// written stays, the next start syncs the rest.
    #[error("reconcile cancelled after {done} of {total} services")]
    Cancelled { done: usize, total: usize },
    /// After a failed pipelined write the maps could not be read back, so
    /// nothing is written until they can (the next run tries again).
    #[error("reading the maps back after a failed write failed: {0}; will retry")]
    ReadBack(String),
    #[error("applying {service} failed after {applied} of {total} writes: {source}; will retry with a full sync")]
    Apply {
        service: String,
        applied: usize,
        total: usize,
        #[source]
        source: MapWriteError,
    },
}

/// "N service(s) not applied (first names); K: MAP is full (would need X,
/// holds Y): raise FLAG; M other(s): first names and errors".
pub fn refusal_summary(refused: &[(ServiceName, ServiceError)]) -> String {
    use std::fmt::Write as _;
    let mut full: BTreeMap<(&str, &str), (usize, usize, u32)> = BTreeMap::new();
    let mut other = Vec::new();
    for (name, e) in refused {
        match e {
            ServiceError::Capacity {
                map,
                needed,
                max,
                flag,
            } => {
                let entry = full.entry((map, flag)).or_insert((0, 0, *max));
                entry.0 += 1;
                entry.1 = entry.1.max(*needed);
            }
            ServiceError::Desired(d) => other.push((name, d)),
        }
    }
    let mut out = format!("{} service(s) not applied (", refused.len());
    let names: Vec<String> = refused.iter().take(3).map(|(n, _)| n.to_string()).collect();
    out.push_str(&names.join(", "));
    out.push_str(if refused.len() > 3 { ", …)" } else { ")" });
    for ((map, flag), (n, needed, max)) in &full {
        let _ = write!(
            out,
            "; {n}: {map} is full (would need {needed}, holds {max}): raise {flag} or remove services"
        );
    }
    if !other.is_empty() {
        let _ = write!(out, "; {} other(s): ", other.len());
        let shown: Vec<String> = other
            .iter()
            .take(3)
            .map(|(n, e)| format!("{n}: {e}"))
            .collect();
        out.push_str(&shown.join("; "));
        if other.len() > 3 {
            out.push_str("; …");
        }
    }
    out.push_str(" (nothing of those services was changed; every refused service is listed at debug level and in `lbctl status`)");
    out
}
