//! `lbctl maglev get SVC`: a service's Maglev table, summarised as slots per backend.
use serde::Serialize;

use super::service_list::Endpoint;
use crate::{maps::MapState, model::Protocol};

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MaglevSummary {
    pub service_id: u32,
    pub frontend: String,
    /// Table size M.
    pub size: usize,
    /// The size the master names (the programs index the table with it);
    /// None for a master of an older agent, which uses --maglev-table-size
    /// as first installed.
    pub master_size: Option<u32>,
    pub backends: Vec<MaglevShare>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MaglevShare {
    pub backend_id: u32,
    pub backend: String,
    pub slots: usize,
    pub share: f64,
}

pub fn summary(state: &MapState, service_id: u32) -> Option<MaglevSummary> {
    let table = state.maglev.get(&service_id)?;
    let (key, master) = state
        .frontends()
        .find(|(_, v)| v.service_id == service_id)?;
    let mut counts: std::collections::BTreeMap<u32, usize> = std::collections::BTreeMap::new();
    for id in table.iter() {
        *counts.entry(*id).or_default() += 1;
    }
    let backends = counts
        .into_iter()
        .map(|(id, slots)| MaglevShare {
            backend_id: id,
            backend: state.backends.get(&id).map_or("missing".into(), |b| {
                Endpoint {
                    address: b.address.to_string(),
                    port: b.port,
                    protocol: Protocol::from_number(b.proto)
                        .map_or("?", |p| p.as_str())
                        .into(),
                }
                .to_string()
            }),
            slots,
            share: slots as f64 / table.len() as f64,
        })
        .collect();
    let frontend = Endpoint {
        address: key.address.to_string(),
        port: key.port,
        protocol: Protocol::from_number(key.proto)
            .map_or("?", |p| p.as_str())
            .into(),
    }
    .to_string();
    Some(MaglevSummary {
        service_id,
        frontend,
        size: table.len(),
        master_size: lb_common::maps::maglev_size_of(master.maglev_size),
        backends,
    })
}

pub fn render_table(s: &MaglevSummary) -> String {
    let mut out = format!(
        "Service {} {}: Maglev table of {} slots\n",
        s.service_id, s.frontend, s.size
    );
    if let Some(m) = s.master_size.filter(|m| *m as usize > s.size) {
        // Only between two writes of the agent, or after a failed one.
        out.push_str(&format!(
            "warning: the service entry names a table of {m} slots: new flows may be dropped (maglev-missing) until the agent writes both again\n"
        ));
    }
    let mut t = vec![[
        "ID".to_string(),
        "Backend".into(),
        "Slots".into(),
        "Share".into(),
    ]];
    for b in &s.backends {
        t.push([
            b.backend_id.to_string(),
            b.backend.clone(),
            b.slots.to_string(),
            format!("{:.2}%", b.share * 100.0),
        ]);
    }
    out.push_str(&super::align(&t));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        desired::BuildConfig, maps::fake::FakeMaps, reconcile::Reconciler,
        source::file::parse::parse,
    };

    #[test]
    fn table_matches_golden_output() {
        let model = parse("services: [{name: w, algorithm: maglev, clusterIPs: [10.96.0.1], ports: [{port: 80}], backends: [{address: 10.0.0.1}, {address: 10.0.0.2, weight: 3}]}]").unwrap();
        let mut r = Reconciler::restore(FakeMaps::default())
            .unwrap()
            .with_config(BuildConfig {
                maglev_m: 251,
                ..Default::default()
            });
        r.reconcile(&model).unwrap();
        let s = summary(r.state(), 1).unwrap();
        assert_eq!(s.master_size, Some(251));
        let golden = "\
Service 1 10.96.0.1:80/TCP: Maglev table of 251 slots
ID   Backend           Slots   Share
1    10.0.0.1:80/TCP   63      25.10%
2    10.0.0.2:80/TCP   188     74.90%
";
        assert_eq!(render_table(&s), golden, "\n{}", render_table(&s));
    }
}
