//! `lbctl top`: the busiest frontends now, from two readings of
//! LB_SVC_STATS a moment apart (rates, not totals), refreshed until
//! interrupted, like top(1).
use std::collections::BTreeMap;

use lb_common::stats::ServiceStats;
use serde::Serialize;

use super::service_list::ServiceRow;

/// What the rows are ordered by (highest first).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SortBy {
    /// Socket-path connects per second, then packets per second.
    #[default]
    Connects,
    Flows,
    Packets,
    Bytes,
}

/// One frontend's rates over the interval.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TopRow {
    pub id: u32,
    pub frontend: String,
    /// The service type; ", local" for the node-local view of an
    /// externalTrafficPolicy: Local frontend (its own id and counters).
    #[serde(rename = "type")]
    pub kind: String,
    pub connects_per_s: f64,
    pub flows_per_s: f64,
    pub packets_per_s: f64,
    /// Bits per second on the wire (bytes × 8), as link rates are given.
    pub bits_per_s: f64,
}

fn rate(now: u64, before: u64, secs: f64) -> f64 {
    // A frontend whose id was reused between the readings starts again
    // from zero: no negative rate.
    now.saturating_sub(before) as f64 / secs
}

/// The frontends that had traffic in the interval (`before` → `now`,
/// `secs` apart), busiest first, at most `limit`.
pub fn rows(
    frontends: &[ServiceRow],
    before: &BTreeMap<u32, ServiceStats>,
    now: &BTreeMap<u32, ServiceStats>,
    secs: f64,
    sort: SortBy,
    limit: usize,
) -> Vec<TopRow> {
    let secs = secs.max(f64::EPSILON);
    let mut out: Vec<TopRow> = frontends
        .iter()
        .filter_map(|f| {
            let n = now.get(&f.id)?;
            let b = before.get(&f.id).copied().unwrap_or_default();
            let row = TopRow {
                id: f.id,
                frontend: f.frontend.to_string(),
                kind: if f.local_view {
                    format!("{}, local", f.kind)
                } else {
                    f.kind.to_string()
                },
                connects_per_s: rate(n.connects, b.connects, secs),
                flows_per_s: rate(n.flows, b.flows, secs),
                packets_per_s: rate(n.packets, b.packets, secs),
                bits_per_s: rate(n.bytes, b.bytes, secs) * 8.0,
            };
            let idle = row.connects_per_s == 0.0 && row.packets_per_s == 0.0;
            (!idle).then_some(row)
        })
        .collect();
    let key = |r: &TopRow| match sort {
        SortBy::Connects => (r.connects_per_s, r.packets_per_s),
        SortBy::Flows => (r.flows_per_s, r.packets_per_s),
        SortBy::Packets => (r.packets_per_s, r.connects_per_s),
        SortBy::Bytes => (r.bits_per_s, r.packets_per_s),
    };
    out.sort_by(|a, b| {
        key(b)
            .partial_cmp(&key(a))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.id.cmp(&b.id))
    });
    out.truncate(limit);
    out
}

/// A rate with an SI prefix, as top and iftop show them (1.2k, 3.4M).
pub fn si(v: f64) -> String {
    let (v, unit) = if v >= 1e9 {
        (v / 1e9, "G")
    } else if v >= 1e6 {
        (v / 1e6, "M")
    } else if v >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    if unit.is_empty() {
        format!("{v:.0}")
    } else {
        format!("{v:.1}{unit}")
    }
}

/// The table of one refresh, under a line that says what it covers.
pub fn render(rows: &[TopRow], secs: f64, active: usize, sort: SortBy) -> String {
    let mut out = format!(
        "lbctl top: {} of {active} frontends with traffic in the last {secs:.1} s, by {}\n",
        rows.len(),
        match sort {
            SortBy::Connects => "connects",
            SortBy::Flows => "flows",
            SortBy::Packets => "packets",
            SortBy::Bytes => "bytes",
        }
    );
    let mut table = vec![[
        "ID".to_string(),
        "Frontend".into(),
        "Service Type".into(),
        "Connects/s".into(),
        "Flows/s".into(),
        "Packets/s".into(),
        "Bits/s".into(),
    ]];
    for r in rows {
        table.push([
            r.id.to_string(),
            r.frontend.clone(),
            r.kind.clone(),
            si(r.connects_per_s),
            si(r.flows_per_s),
            si(r.packets_per_s),
            si(r.bits_per_s),
        ]);
    }
    out.push_str(&super::align(&table));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::service_list::Endpoint;

    fn fe(id: u32) -> ServiceRow {
        ServiceRow {
            id,
            frontend: Endpoint {
                address: format!("10.96.0.{id}"),
                port: 80,
                protocol: "TCP".into(),
            },
            kind: "ClusterIP",
            affinity_timeout_s: None,
            affinity_group: None,
            algorithm: "random",
            local_view: false,
            source_ranges: vec![],
            foreign_external_ip: false,
            backends: vec![],
            stats: None,
        }
    }

    fn st(connects: u64, packets: u64, bytes: u64) -> ServiceStats {
        ServiceStats {
            packets,
            bytes,
            flows: 0,
            connects,
        }
    }

    #[test]
    fn rates_are_the_difference_over_the_interval_busiest_first_idle_left_out() {
        let frontends = [fe(1), fe(2), fe(3), fe(4)];
        let before = BTreeMap::from([(1, st(10, 0, 0)), (2, st(0, 100, 1000)), (3, st(5, 5, 5))]);
        // 4 appeared between the readings: counted from zero.
        let now = BTreeMap::from([
            (1, st(30, 0, 0)),
            (2, st(0, 500, 9000)),
            (3, st(5, 5, 5)),
            (4, st(2, 0, 0)),
        ]);
        let r = rows(&frontends, &before, &now, 2.0, SortBy::Connects, 10);
        let ids: Vec<u32> = r.iter().map(|r| r.id).collect();
        assert_eq!(ids, vec![1, 4, 2], "3 was idle");
        assert_eq!(r[0].connects_per_s, 10.0);
        assert_eq!(r[2].packets_per_s, 200.0);
        assert_eq!(r[2].bits_per_s, 8000.0 * 8.0 / 2.0);
        let by_bytes = rows(&frontends, &before, &now, 2.0, SortBy::Bytes, 1);
        assert_eq!(by_bytes.len(), 1);
        assert_eq!(by_bytes[0].id, 2);
    }

    #[test]
    fn a_counter_that_went_back_is_no_negative_rate() {
        let before = BTreeMap::from([(1, st(100, 100, 100))]);
        let now = BTreeMap::from([(1, st(3, 3, 3))]);
        assert!(rows(&[fe(1)], &before, &now, 1.0, SortBy::Connects, 10).is_empty());
    }

    #[test]
    fn si_prefixes() {
        assert_eq!(si(999.0), "999");
        assert_eq!(si(1_500.0), "1.5k");
        assert_eq!(si(2_500_000.0), "2.5M");
        assert_eq!(si(9.4e9), "9.4G");
    }
}
