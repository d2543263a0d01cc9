//! Moving a node off kube-proxy: `lb-agent cleanup-kube-proxy` removes what
//! kube-proxy leaves behind once it is stopped, in the node's (the calling
//! process's) network namespace:
//!
//! * iptables: every KUBE-* chain and every rule that jumps to one, in every
//!   table, for both backends (iptables-legacy and iptables-nft) and both
//!   families; everything else in those tables is restored as it was;
//! * nftables mode: kube-proxy's own tables (`ip kube-proxy`, `ip6 kube-proxy`);
//! * IPVS mode: the kube-ipvs0 dummy device holding every ClusterIP;
//! * conntrack: entries whose original destination is a service address.
//!   kube-proxy DNATed those flows; UDP ones (DNS) would keep going to the old
//!   backend until they expire, past the point where socket LB takes over.
//!
//! It runs the distribution's own tools (iptables-save/-restore, nft, ip,
//! conntrack) with fixed arguments: no text from the apiserver reaches a
//! command line. A tool that is not installed means that kind of leftover
//! cannot exist here, and is reported as skipped.
use std::{
    io::Write as _,
    net::IpAddr,
    process::{Command, Stdio},
};

use anyhow::{bail, Context as _};

use crate::net::Cidr;

/// What a cleanup found and removed (or would remove, with `dry_run`).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Report {
    /// "iptables-legacy nat: 7 chains, 18 rules".
    pub iptables: Vec<String>,
    pub nftables_tables: Vec<String>,
    pub ipvs_device: bool,
    /// "10.96.0.0/12: 4 flow entries".
    pub conntrack: Vec<String>,
    pub skipped: Vec<String>,
}

/// A table's `iptables-save` text without kube-proxy's chains and the rules
/// that jump to them; with the count of each removed.
pub fn strip_kube_chains(save: &str) -> (String, usize, usize) {
    let (mut chains, mut rules) = (0, 0);
    let mut out = String::with_capacity(save.len());
    for line in save.lines() {
        let is_kube_chain = line.starts_with(":KUBE-");
        let is_kube_rule = line.starts_with("-A ")
            && (line.starts_with("-A KUBE-")
                || line
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .windows(2)
                    .any(|w| {
                        (w[0] == "-j" || w[0] == "-g" || w[0] == "--jump" || w[0] == "--goto")
                            && w[1].starts_with("KUBE-")
                    }));
        if is_kube_chain {
            chains += 1;
        } else if is_kube_rule {
            rules += 1;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    (out, chains, rules)
}

fn tool_exists(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

fn output(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn restore(program: &str, input: &str) -> anyhow::Result<()> {
    let mut child = Command::new(program)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {program}"))?;
    child.stdin.take().unwrap().write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("{program}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn iptables(report: &mut Report, dry_run: bool) -> anyhow::Result<()> {
    for base in [
        "iptables-legacy",
        "iptables-nft",
        "ip6tables-legacy",
        "ip6tables-nft",
    ] {
        let (save, rest) = (format!("{base}-save"), format!("{base}-restore"));
        if !tool_exists(&save) || !tool_exists(&rest) {
            report.skipped.push(format!("{base}: not installed"));
            continue;
        }
        let all = output(&save, &[])?;
        // One table at a time: a table without kube-proxy's chains is not rewritten.
        for table in all.split_inclusive("COMMIT\n").filter(|t| t.contains('*')) {
            let name = table
                .lines()
                .find_map(|l| l.strip_prefix('*'))
                .unwrap_or("?")
                .to_string();
            let (kept, chains, rules) = strip_kube_chains(table);
            if chains + rules == 0 {
                continue;
            }
            report
                .iptables
                .push(format!("{base} {name}: {chains} chains, {rules} rules"));
            if !dry_run {
                restore(&rest, &kept).with_context(|| format!("{base} table {name}"))?;
            }
        }
    }
    Ok(())
}

fn nftables(report: &mut Report, dry_run: bool) -> anyhow::Result<()> {
    if !tool_exists("nft") {
        report.skipped.push("nft: not installed".into());
        return Ok(());
    }
    for line in output("nft", &["list", "tables"])?.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if let ["table", family @ ("ip" | "ip6"), "kube-proxy"] = words[..] {
            report.nftables_tables.push(format!("{family} kube-proxy"));
            if !dry_run {
                output("nft", &["delete", "table", family, "kube-proxy"])?;
            }
        }
    }
    Ok(())
}

fn ipvs(report: &mut Report, dry_run: bool) -> anyhow::Result<()> {
    if crate::sys::netdev::ifindex("kube-ipvs0").is_ok() {
        report.ipvs_device = true;
        if !dry_run {
            output("ip", &["link", "del", "kube-ipvs0"])?;
        }
    }
    Ok(())
}

fn mask(c: &Cidr) -> String {
    match c.address {
        IpAddr::V4(_) => {
            let m = if c.prefix == 0 {
                0
            } else {
                u32::MAX << (32 - c.prefix)
            };
            std::net::Ipv4Addr::from(m).to_string()
        }
        IpAddr::V6(_) => {
            let m = if c.prefix == 0 {
                0
            } else {
                u128::MAX << (128 - c.prefix)
            };
            std::net::Ipv6Addr::from(m).to_string()
        }
    }
}

fn conntrack(report: &mut Report, cidrs: &[Cidr], dry_run: bool) -> anyhow::Result<()> {
    if cidrs.is_empty() {
        return Ok(());
    }
    if !tool_exists("conntrack") {
        report.skipped.push("conntrack: not installed (apt install conntrack) - stale entries of service addresses were not deleted".into());
        return Ok(());
    }
    for c in cidrs {
        let family = if c.address.is_ipv4() { "ipv4" } else { "ipv6" };
        let (addr, m) = (c.address.to_string(), mask(c));
        let verb = if dry_run { "-L" } else { "-D" };
        let out = Command::new("conntrack")
            .args([verb, "-f", family, "-d", &addr, "--mask-dst", &m])
            .output()?;
        // conntrack says how many on stderr, and exits 1 when there were none.
        let text = String::from_utf8_lossy(&out.stderr);
        // "conntrack v1.4.7 (conntrack-tools): 2 flow entries have been deleted."
        let n = text
            .lines()
            .find_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.windows(3)
                    .find(|x| x[1] == "flow" && x[2] == "entries")
                    .and_then(|x| x[0].parse::<usize>().ok())
            })
            .unwrap_or(0);
        if !out.status.success() && n != 0 {
            bail!("conntrack {verb} for {addr}/{}: {}", c.prefix, text.trim());
        }
        report
            .conntrack
            .push(format!("{addr}/{}: {n} flow entries", c.prefix));
    }
    Ok(())
}

/// Removes kube-proxy's leftovers from this network namespace.
pub fn cleanup(service_cidrs: &[Cidr], dry_run: bool) -> anyhow::Result<Report> {
    let mut report = Report::default();
    iptables(&mut report, dry_run)?;
    nftables(&mut report, dry_run)?;
    ipvs(&mut report, dry_run)?;
    conntrack(&mut report, service_cidrs, dry_run)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_kube_chains_and_jumps_and_keeps_everything_else() {
        let save = "\
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-ABC - [0:0]
:MY-CHAIN - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A OUTPUT -j MY-CHAIN
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -j KUBE-SVC-ABC
-A KUBE-SVC-ABC -j DNAT --to-destination 10.0.0.1:443
-A MY-CHAIN -d 192.0.2.1/32 -j RETURN
COMMIT
";
        let (kept, chains, rules) = strip_kube_chains(save);
        assert_eq!((chains, rules), (2, 3));
        assert_eq!(
            kept,
            "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:MY-CHAIN - [0:0]\n-A OUTPUT -j MY-CHAIN\n-A MY-CHAIN -d 192.0.2.1/32 -j RETURN\nCOMMIT\n"
        );
    }

    #[test]
    fn masks_of_service_cidrs() {
        assert_eq!(mask(&"10.96.0.0/12".parse().unwrap()), "255.240.0.0");
        assert_eq!(
            mask(&"fd00:96::/108".parse().unwrap()),
            "ffff:ffff:ffff:ffff:ffff:ffff:fff0:0"
        );
    }
}
