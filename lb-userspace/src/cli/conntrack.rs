//! `lbctl ct list`: the north-south conntrack tables (LB4_CT, LB6_CT).
use std::net::{Ipv4Addr, Ipv6Addr};

use lb_common::conntrack::*;
use serde::Serialize;

use crate::model::Protocol;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CtRow {
    /// "service" (a client's flow to a frontend) or "reverse" (a reply to translate back).
    pub kind: &'static str,
    pub protocol: String,
    pub source: String,
    pub destination: String,
    /// Where the flow goes (service entries) or what a reply's source becomes (reverse).
    pub target: String,
    /// For SNAT: the node address and port used (service) or the client (reverse).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nat: Option<String>,
    pub flags: Vec<&'static str>,
    pub backend_id: u32,
    pub service_id: u32,
    /// Seconds since the entry last saw a packet (refreshed at most once a second).
    pub idle_s: u64,
    /// Seconds the entry has left without traffic (negative: expired,
    /// waiting for the agent's sweep).
    pub expires_s: i64,
}

/// An address of a conntrack table, as the programs keep it (network byte
/// order in memory).
pub trait CtAddr: Copy {
    fn endpoint(self, port: u16) -> String;
}

impl CtAddr for u32 {
    fn endpoint(self, port: u16) -> String {
        format!(
            "{}:{}",
            Ipv4Addr::from(self.to_ne_bytes()),
            u16::from_be(port)
        )
    }
}

impl CtAddr for [u32; 4] {
    fn endpoint(self, port: u16) -> String {
        let mut b = [0u8; 16];
        for (i, w) in self.iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        format!("[{}]:{}", Ipv6Addr::from(b), u16::from_be(port))
    }
}

fn ep<A: CtAddr>(addr: A, port: u16) -> String {
    addr.endpoint(port)
}

pub fn rows<A: CtAddr>(
    entries: &[(CtKey<A>, CtValue<A>)],
    now_ns: u64,
    t: &CtTimeouts,
) -> Vec<CtRow> {
    let mut rows: Vec<CtRow> = entries
        .iter()
        .map(|(k, v)| {
            let mut flags = Vec::new();
            for (bit, name) in [
                (CT_F_SNAT, "snat"),
                (CT_F_DSR, "dsr"),
                (CT_F_LOCAL, "local"),
                (CT_F_HOST, "host"),
                (CT_F_DSR_ENCAP, "ipip"),
                (CT_F_ESTABLISHED, "established"),
                (CT_F_CLOSING, "closing"),
            ] {
                if v.flags & bit != 0 {
                    flags.push(name);
                }
            }
            CtRow {
                kind: match k.kind {
                    CT_SERVICE => "service",
                    CT_REVERSE => "reverse",
                    _ => "unknown",
                },
                protocol: Protocol::from_number(k.proto)
                    .map_or_else(|| k.proto.to_string(), |p| p.as_str().to_string()),
                source: ep(k.saddr, k.sport),
                destination: ep(k.daddr, k.dport),
                target: ep(v.addr, v.port),
                nat: (v.flags & CT_F_SNAT != 0).then(|| ep(v.nat_addr, v.nat_port)),
                flags,
                backend_id: v.backend_id,
                service_id: v.service_id,
                idle_s: now_ns.saturating_sub(v.last_seen_ns) / 1_000_000_000,
                expires_s: crate::conntrack::remaining_s(k, v, now_ns, t),
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        (a.kind, &a.source, &a.destination).cmp(&(b.kind, &b.source, &b.destination))
    });
    rows
}

pub fn render_table(rows: &[CtRow]) -> String {
    let mut t = vec![[
        "Kind".to_string(),
        "Flow".into(),
        "To".into(),
        "NAT".into(),
        "Flags".into(),
        "Service".into(),
        "Idle".into(),
        "Expires".into(),
    ]];
    for r in rows {
        t.push([
            r.kind.to_string(),
            format!("{} -> {}/{}", r.source, r.destination, r.protocol),
            r.target.clone(),
            r.nat.clone().unwrap_or_else(|| "-".into()),
            if r.flags.is_empty() {
                "-".into()
            } else {
                r.flags.join(",")
            },
            r.service_id.to_string(),
            format!("{}s", r.idle_s),
            if r.expires_s < 0 {
                "expired".into()
            } else {
                format!("{}s", r.expires_s)
            },
        ]);
    }
    super::align(&t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> u32 {
        u32::from_ne_bytes(s.parse::<Ipv4Addr>().unwrap().octets())
    }

    #[test]
    fn table_matches_golden_output() {
        let key = Ct4Key::new(
            a("192.168.60.1"),
            a("192.168.60.2"),
            40001u16.to_be(),
            30081u16.to_be(),
            6,
            CT_SERVICE,
        );
        let val = Ct4Value {
            backend_id: 3,
            service_id: 7,
            addr: a("10.244.2.10"),
            nat_addr: a("192.168.60.2"),
            port: 8080u16.to_be(),
            nat_port: 61234u16.to_be(),
            flags: CT_F_SNAT,
            backends_gen: 0,
            last_seen_ns: 1_000_000_000,
        };
        let out = render_table(&rows(&[(key, val)], 6_000_000_000, &Default::default()));
        let golden = "\
Kind      Flow                                           To                 NAT                  Flags   Service   Idle   Expires
service   192.168.60.1:40001 -> 192.168.60.2:30081/TCP   10.244.2.10:8080   192.168.60.2:61234   snat    7         5s     55s
";
        assert_eq!(out, golden, "\n{out}");
    }
}
