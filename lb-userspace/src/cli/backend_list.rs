//! `lbctl backend list`: every backend with the number of service slots that
//! name it.
use serde::Serialize;

use super::service_list::Endpoint;
use crate::{maps::MapState, model::Protocol};

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BackendListRow {
    pub id: u32,
    #[serde(flatten)]
    pub endpoint: Endpoint,
    pub state: &'static str,
    pub local: bool,
    /// Service slots naming this backend.
    pub references: u32,
}

pub fn rows(state: &MapState) -> Vec<BackendListRow> {
    let mut rows: Vec<BackendListRow> = state
        .backends
        .iter()
        .map(|(id, b)| BackendListRow {
            id: *id,
            endpoint: Endpoint {
                address: b.address.to_string(),
                port: b.port,
                protocol: Protocol::from_number(b.proto)
                    .map_or("?", |p| p.as_str())
                    .to_string(),
            },
            state: match b.state {
                lb_common::backend::BACKEND_STATE_ACTIVE => "active",
                lb_common::backend::BACKEND_STATE_TERMINATING => "terminating",
                lb_common::backend::BACKEND_STATE_MAINTENANCE => "maintenance",
                _ => "unknown",
            },
            local: b.flags & lb_common::backend::BACKEND_FLAG_LOCAL != 0,
            references: state.backend_refs(*id),
        })
        .collect();
    rows.sort_by_key(|r| r.id);
    rows
}

pub fn render_table(rows: &[BackendListRow]) -> String {
    let mut table = vec![[
        "ID".to_string(),
        "Address".into(),
        "State".into(),
        "Local".into(),
        "Slots".into(),
    ]];
    for r in rows {
        table.push([
            r.id.to_string(),
            r.endpoint.to_string(),
            r.state.to_string(),
            if r.local { "yes" } else { "no" }.to_string(),
            r.references.to_string(),
        ]);
    }
    super::align(&table)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{maps::fake::FakeMaps, reconcile::Reconciler, source::file::parse::parse};

    #[test]
    fn table_matches_golden_output() {
        let model = parse(
            r#"
services:
  - name: a
    clusterIPs: [10.96.0.1, 'fd00:96::1']
    ports: [{port: 80, targetPort: 8080}]
    backends: [{address: 10.244.0.1, local: true}, {address: 'fd00:244::1', state: terminating}]
  - name: b
    clusterIPs: [10.96.0.2]
    ports: [{port: 80, targetPort: 8080}]
    backends: [{address: 10.244.0.1, local: true}]
"#,
        )
        .unwrap();
        let mut r = Reconciler::restore(FakeMaps::default()).unwrap();
        r.reconcile(&model).unwrap();
        let out = render_table(&rows(r.state()));
        let golden = "\
ID   Address                  State         Local   Slots
1    10.244.0.1:8080/TCP      active        yes     2
2    [fd00:244::1]:8080/TCP   terminating   no      1
";
        assert_eq!(out, golden, "\n{out}");
    }
}
