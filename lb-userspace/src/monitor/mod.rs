//! Events from the data path (`LB_EVENTS`): decoding, formatting in the style
//! of `cilium monitor`, and the ring-buffer reader behind `lbctl monitor`.
pub mod reader;

use std::net::IpAddr;

use lb_common::{
    drop::DropReason,
    event::{hook_name, Event, EVENT_DROP, EVENT_TRACE},
};
use serde::Serialize;

use crate::model::Protocol;

/// An event in user-space terms.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MonitorEvent {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub ktime_ns: u64,
    pub hook: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    pub protocol: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    pub destination: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub translated: Option<String>,
    pub service_id: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend_id: Option<u32>,
    pub pid: u32,
    pub comm: String,
    pub cookie: u64,
}

/// An event's address (`Addr6`; IPv4 in the first word).
fn addr(family: u8, words: &lb_common::Addr6) -> IpAddr {
    if family == 6 {
        IpAddr::V6(crate::maps::convert::ip6_from_map(*words))
    } else {
        IpAddr::V4(crate::maps::convert::ip4_from_map(words[0]))
    }
}

fn endpoint(a: IpAddr, port_be: u16) -> String {
    let port = u16::from_be(port_be);
    match a {
        IpAddr::V6(a) => format!("[{a}]:{port}"),
        IpAddr::V4(a) => format!("{a}:{port}"),
    }
}

pub fn decode(e: &Event) -> MonitorEvent {
    let source =
        (e.sport != 0 || e.saddr != [0; 4]).then(|| endpoint(addr(e.family, &e.saddr), e.sport));
    let comm_len = e.comm.iter().position(|b| *b == 0).unwrap_or(e.comm.len());
    MonitorEvent {
        kind: match e.kind {
            EVENT_DROP => "drop",
            EVENT_TRACE => "trace",
            _ => "unknown",
        },
        ktime_ns: e.ktime_ns,
        hook: hook_name(e.hook),
        reason: (e.kind == EVENT_DROP)
            .then(|| DropReason::from_u32(e.reason).map_or("unknown", |r| r.name())),
        protocol: Protocol::from_number(e.proto)
            .map_or_else(|| format!("proto-{}", e.proto), |p| p.as_str().to_string()),
        source,
        destination: endpoint(addr(e.family, &e.daddr), e.dport),
        translated: (e.kind == EVENT_TRACE).then(|| endpoint(addr(e.family, &e.xaddr), e.xport)),
        service_id: e.service_id,
        backend_id: (e.kind == EVENT_TRACE).then_some(e.backend_id),
        pid: e.pid,
        comm: String::from_utf8_lossy(&e.comm[..comm_len]).into_owned(),
        cookie: e.cookie,
    }
}

/// One line, readable like `cilium monitor`:
///
/// ```text
/// xx drop (no-backend) connect4 10.96.0.99:80/TCP service 2 by pid 4242 (curl) cookie 8193
/// -> trace connect4 10.96.0.10:80/TCP => 10.244.1.2:8080 service 3 backend 7 by pid 4242 (curl) cookie 8194
/// ```
pub fn format_line(e: &MonitorEvent) -> String {
    let from = e
        .source
        .as_ref()
        .map(|s| format!("{s} -> "))
        .unwrap_or_default();
    let service = if e.service_id != 0 {
        format!(" service {}", e.service_id)
    } else {
        String::new()
    };
    let who = format!(" by pid {} ({}) cookie {}", e.pid, e.comm, e.cookie);
    match e.kind {
        "drop" => format!(
            "xx drop ({}) {} {from}{}/{}{service}{who}",
            e.reason.unwrap_or("unknown"),
            e.hook,
            e.destination,
            e.protocol
        ),
        _ => format!(
            "-> trace {} {from}{}/{} => {}{service} backend {}{who}",
            e.hook,
            e.destination,
            e.protocol,
            e.translated.as_deref().unwrap_or("?"),
            e.backend_id.unwrap_or(0)
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use lb_common::event::{HOOK_CONNECT4, HOOK_SENDMSG6};

    use super::*;

    fn comm(s: &str) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[..s.len()].copy_from_slice(s.as_bytes());
        c
    }

    #[test]
    fn drop_line_matches_golden() {
        let mut e = Event::zeroed();
        e.kind = EVENT_DROP;
        e.hook = HOOK_CONNECT4;
        e.proto = 6;
        e.family = 4;
        e.reason = DropReason::NoBackend as u32;
        e.daddr[0] = crate::maps::convert::ip4_to_map(Ipv4Addr::new(10, 96, 0, 99));
        e.dport = 80u16.to_be();
        e.service_id = 2;
        e.pid = 4242;
        e.comm = comm("curl");
        e.cookie = 8193;
        assert_eq!(
            format_line(&decode(&e)),
            "xx drop (no-backend) connect4 10.96.0.99:80/TCP service 2 by pid 4242 (curl) cookie 8193"
        );
    }

    #[test]
    fn trace_line_matches_golden() {
        let mut e = Event::zeroed();
        e.kind = EVENT_TRACE;
        e.hook = HOOK_SENDMSG6;
        e.proto = 17;
        e.family = 6;
        e.daddr = crate::maps::convert::ip6_to_map("fd00:96::10".parse::<Ipv6Addr>().unwrap());
        e.dport = 53u16.to_be();
        e.xaddr = crate::maps::convert::ip6_to_map("fd00:250::12".parse::<Ipv6Addr>().unwrap());
        e.xport = 5353u16.to_be();
        e.service_id = 4;
        e.backend_id = 9;
        e.pid = 7;
        e.comm = comm("dig");
        e.cookie = 1;
        assert_eq!(
            format_line(&decode(&e)),
            "-> trace sendmsg6 [fd00:96::10]:53/UDP => [fd00:250::12]:5353 service 4 backend 9 by pid 7 (dig) cookie 1"
        );
        let json = serde_json::to_value(decode(&e)).unwrap();
        assert_eq!(json["type"], "trace");
        assert_eq!(json["translated"], "[fd00:250::12]:5353");
    }
}
