//! Which of this node's addresses serve NodePorts, for both sources: the
//! `--nodeport-addresses` flag (kube-proxy's) applied to the node's
//! addresses (every local address in Kubernetes mode, every address of the
//! --devices in standalone mode, followed as they change), with 127.0.0.1
//! and ::1 for the node's own processes. `primary`: in Kubernetes mode the
//! node's InternalIPs; in standalone mode, the first IPv4 and the first
//! IPv6 address of the --devices, in their order.
use std::net::IpAddr;

use crate::net::Cidr;

/// One value of --nodeport-addresses: a CIDR, or `primary` (the node's
/// primary address per family, as kube-proxy's `--nodeport-addresses primary`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodePortAddr {
    Cidr(Cidr),
    Primary,
}

impl std::str::FromStr for NodePortAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "primary" {
            Ok(NodePortAddr::Primary)
        } else {
            s.parse().map(NodePortAddr::Cidr)
        }
    }
}

/// Which addresses of this node serve NodePorts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodePortAddresses {
    /// Limit to these CIDRs (none: no limit).
    pub cidrs: Vec<Cidr>,
    /// Only the node's primary addresses (one per family).
    pub primary: bool,
    /// The node's own addresses (read at start). Unset flag: all of them,
    /// as kube-proxy's default.
    pub local: Vec<IpAddr>,
}

impl NodePortAddresses {
    /// Loopback and link-local addresses never serve NodePorts.
    pub fn from_flags(flags: &[NodePortAddr], local: Vec<IpAddr>) -> Self {
        Self {
            cidrs: flags
                .iter()
                .filter_map(|f| match f {
                    NodePortAddr::Cidr(c) => Some(*c),
                    NodePortAddr::Primary => None,
                })
                .collect(),
            primary: flags.contains(&NodePortAddr::Primary),
            local: local.into_iter().filter(serves_nodeports).collect(),
        }
    }

    /// The same flags over other local addresses (they changed at run time).
    pub fn with_local(&self, local: Vec<IpAddr>) -> Self {
        Self {
            local: local.into_iter().filter(serves_nodeports).collect(),
            ..self.clone()
        }
    }

    /// `primary` stands alone, as in kube-proxy: with CIDRs beside it, say
    /// which one is meant.
    pub fn check_flags(flags: &[NodePortAddr]) -> Result<(), String> {
        if flags.contains(&NodePortAddr::Primary) && flags.len() > 1 {
            return Err(
                "--nodeport-addresses: primary cannot be combined with CIDRs; give either primary or a list of CIDRs".into(),
            );
        }
        Ok(())
    }

    /// The addresses that serve NodePorts: with `primary`, the first of
    /// `primary` per family (never loopback or link-local); otherwise
    /// every local address, or `listed` (the Node object's addresses) when
    /// none were read; then the CIDR limit. Sorted, without duplicates.
    pub fn pick(&self, primary: &[IpAddr], listed: &[IpAddr]) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = if self.primary {
            let mut usable = primary.iter().filter(|a| serves_nodeports(a));
            let v4 = usable.clone().find(|a| a.is_ipv4()).copied();
            [v4, usable.find(|a| a.is_ipv6()).copied()]
                .into_iter()
                .flatten()
                .collect()
        } else if !self.local.is_empty() {
            self.local.clone()
        } else {
            listed.to_vec()
        };
        // Localhost NodePorts for the node's own processes (kube-proxy's
        // iptables mode serves 127.0.0.1, Cilium's socket LB both): not with
        // `primary`, and with CIDRs only where one holds them. The programs
        // serve them to sockets of the host's namespace alone, never to
        // packets (SVC_FLAG_HOST_LOOPBACK).
        if !self.primary && !out.is_empty() {
            out.extend(LOOPBACK);
        }
        out.retain(|ip| self.cidrs.is_empty() || self.cidrs.iter().any(|c| c.contains(ip)));
        out.sort();
        out.dedup();
        out
    }
}

/// The loopback addresses localhost NodePorts listen on.
pub const LOOPBACK: [IpAddr; 2] = [
    IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
    IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
];

fn serves_nodeports(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local(),
        IpAddr::V6(v6) => !v6.is_loopback() && !v6.is_unicast_link_local(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn no_flag_takes_every_local_address_but_link_local_and_adds_localhost() {
        let n = NodePortAddresses::from_flags(
            &[],
            ips(&[
                "127.0.0.1",
                "192.168.1.10",
                "fe80::1",
                "fd00::10",
                "169.254.0.1",
            ]),
        );
        assert_eq!(
            n.pick(&[], &[]),
            ips(&["127.0.0.1", "192.168.1.10", "::1", "fd00::10"])
        );
    }

    #[test]
    fn localhost_nodeports_only_where_a_cidr_holds_them_never_with_primary_or_no_address() {
        let local = ips(&["192.168.1.10", "fd00::10"]);
        let flags: Vec<NodePortAddr> = vec!["127.0.0.0/8".parse().unwrap()];
        let n = NodePortAddresses::from_flags(&flags, local.clone());
        assert_eq!(n.pick(&[], &[]), ips(&["127.0.0.1"]));
        let flags: Vec<NodePortAddr> = vec!["192.168.0.0/16".parse().unwrap()];
        let n = NodePortAddresses::from_flags(&flags, local.clone());
        assert_eq!(n.pick(&[], &[]), ips(&["192.168.1.10"]));
        let flags: Vec<NodePortAddr> = vec!["primary".parse().unwrap()];
        let n = NodePortAddresses::from_flags(&flags, local.clone());
        assert_eq!(n.pick(&local, &[]), local);
        // A node whose addresses are unknown serves no NodePort at all.
        assert!(NodePortAddresses::default().pick(&[], &[]).is_empty());
    }

    #[test]
    fn primary_takes_one_address_per_family_and_cidrs_limit() {
        let flags: Vec<NodePortAddr> = vec!["primary".parse().unwrap()];
        let n = NodePortAddresses::from_flags(&flags, ips(&["10.0.0.1", "10.0.0.2"]));
        let primary = ips(&["10.0.0.2", "10.0.0.1", "fd00::2"]);
        assert_eq!(n.pick(&primary, &[]), ips(&["10.0.0.2", "fd00::2"]));
        let flags: Vec<NodePortAddr> = vec!["10.0.0.0/31".parse().unwrap()];
        let n = NodePortAddresses::from_flags(&flags, ips(&["10.0.0.1", "10.0.0.2"]));
        assert_eq!(n.pick(&[], &[]), ips(&["10.0.0.1"]));
    }

    #[test]
    fn primary_skips_link_local_and_stands_alone() {
        let flags: Vec<NodePortAddr> = vec!["primary".parse().unwrap()];
        let n = NodePortAddresses::from_flags(&flags, Vec::new());
        let primary = ips(&["169.254.1.1", "192.168.1.10"]);
        assert_eq!(n.pick(&primary, &[]), ips(&["192.168.1.10"]));
        assert!(NodePortAddresses::check_flags(&flags).is_ok());
        let both: Vec<NodePortAddr> =
            vec!["primary".parse().unwrap(), "10.0.0.0/8".parse().unwrap()];
        let e = NodePortAddresses::check_flags(&both).unwrap_err();
        assert!(e.contains("--nodeport-addresses"), "{e}");
    }

    #[test]
    fn local_addresses_win_over_the_listed_ones_and_primary_skips_v6_link_local_and_loopback() {
        let n = NodePortAddresses::from_flags(&[], ips(&["192.168.1.10"]));
        assert_eq!(
            n.pick(&[], &ips(&["10.9.9.9"])),
            ips(&["127.0.0.1", "192.168.1.10", "::1"])
        );
        let flags: Vec<NodePortAddr> = vec!["primary".parse().unwrap()];
        let n = NodePortAddresses::from_flags(&flags, Vec::new());
        let primary = ips(&["127.0.0.1", "fe80::1", "::1", "fd00::10", "192.168.1.10"]);
        assert_eq!(n.pick(&primary, &[]), ips(&["192.168.1.10", "fd00::10"]));
    }

    #[test]
    fn without_local_addresses_the_listed_ones_serve() {
        let n = NodePortAddresses::default();
        assert_eq!(
            n.pick(&[], &ips(&["192.168.1.10", "192.168.1.10"])),
            ips(&["127.0.0.1", "192.168.1.10", "::1"])
        );
    }
}
