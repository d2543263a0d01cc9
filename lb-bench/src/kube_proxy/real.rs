//! What the real kube-proxy (not a re-created layout) has programmed for a
//! Service, read from its rules: the propagation bench polls it as it polls
//! the agent's map entry. A poll lists the Service port's chain (`iptables
//! -t nat -S CHAIN` after filter KUBE-SERVICES, `nft list chain ...`), a few
//! milliseconds each; that is the resolution of kube-proxy's samples.
use std::{collections::HashMap, process::Command};

use lb_testkit::kube_proxy::Mode;

/// The rules of one kube-proxy in one network namespace.
pub struct Rules {
    netns: String,
    mode: Mode,
    /// Service port (`ns/name:port`) → the chain that spreads its ClusterIP
    /// connections over the endpoints, learnt once while it has endpoints
    /// (kube-proxy derives the name from a hash of the port's name, so it
    /// stays the same when the chain goes and comes back).
    chains: HashMap<String, String>,
}

impl Rules {
    pub fn new(netns: &str, mode: Mode) -> Self {
        Self {
            netns: netns.to_string(),
            mode,
            chains: HashMap::new(),
        }
    }

    /// How many endpoints kube-proxy's ClusterIP rules for TCP port
    /// `port` of Service `ns/name` spread over; None until its chain has
    /// been seen (kube-proxy has not programmed the Service yet).
    pub fn endpoints(&mut self, ns: &str, name: &str, port: &str) -> Option<usize> {
        let key = format!("{ns}/{name}:{port}");
        if !self.chains.contains_key(&key) {
            let chain = self.find_chain(ns, name, port)?;
            self.chains.insert(key.clone(), chain);
        }
        // iptables mode: a Service without endpoints loses its jump in nat
        // KUBE-SERVICES and gets a REJECT in filter KUBE-SERVICES, but its
        // own chain may stay, unreferenced and unflushed, until the next
        // stale-chain cleanup (every sync period in large clusters,
        // pkg/proxy/iptables/proxier.go): the REJECT is what says so.
        // (nftables mode flushes such a chain in the same transaction.)
        if self.mode.is_iptables() {
            let rejects = self.run(
                self.mode.iptables(),
                &["-w", "-t", "filter", "-S", "KUBE-SERVICES"],
            )?;
            if rejects.contains(&format!("\"{key} has no endpoints\"")) {
                return Some(0);
            }
        }
        let chain = &self.chains[&key];
        // A chain that is gone: the Service has no endpoints now.
        let listed = match self.mode {
            m if m.is_iptables() => {
                self.run(self.mode.iptables(), &["-w", "-t", "nat", "-S", chain])
            }
            _ => self.run("nft", &["list", "chain", "ip", "kube-proxy", chain]),
        };
        let Some(text) = listed else {
            return Some(0);
        };
        Some(match self.mode {
            // -A KUBE-SVC-... -m statistic ... -j KUBE-SEP-...
            m if m.is_iptables() => text.lines().filter(|l| l.contains("-j KUBE-SEP-")).count(),
            // numgen random mod N vmap { 0 : goto endpoint-..., ... }
            _ => text.matches("goto endpoint-").count(),
        })
    }

    /// The Service port's chain, from the rule that sends its ClusterIP
    /// there (iptables: KUBE-SERVICES, with the port's name as comment;
    /// nftables: the chain list, the name ends with ns/name/tcp/port).
    fn find_chain(&self, ns: &str, name: &str, port: &str) -> Option<String> {
        match self.mode {
            m if m.is_iptables() => {
                let text = self.run(
                    self.mode.iptables(),
                    &["-w", "-t", "nat", "-S", "KUBE-SERVICES"],
                )?;
                let comment = format!("\"{ns}/{name}:{port} cluster IP\"");
                text.lines()
                    .filter(|l| l.contains(&comment))
                    .find_map(|l| l.split_once("-j KUBE-SVC-"))
                    .map(|(_, c)| format!("KUBE-SVC-{}", c.split_whitespace().next().unwrap_or("")))
            }
            _ => {
                let text = self.run("nft", &["list", "chains", "ip"])?;
                let suffix = format!("-{ns}/{name}/tcp/{port}");
                text.lines()
                    .filter_map(|l| l.trim().strip_prefix("chain "))
                    .map(|l| l.trim_end_matches('{').trim())
                    .find(|c| c.starts_with("service-") && c.ends_with(&suffix))
                    .map(str::to_string)
            }
        }
    }

    /// `program args` in the namespace: its stdout, None when it failed.
    fn run(&self, program: &str, args: &[&str]) -> Option<String> {
        let mut cmd = Command::new(program);
        cmd.args(args);
        lb_testkit::netns::exec_in(&mut cmd, &self.netns).ok()?;
        let out = cmd.output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}
