//! The packet path section (tc and XDP per packet) and the estimates and
//! anchors it derives from the timed runs.
use std::fmt::Write as _;

use super::*;

impl Report {
    pub(super) fn packet_section(&self, o: &mut String) {
        if self.packet.is_empty() {
            return;
        }
        o.push_str(
            "## 3. Packet path (tc and XDP)\n\n\
             ns per packet as the kernel measures it (BPF_PROG_TEST_RUN), N LoadBalancer services with\n\
             node-local backends. Established flow, `repeat` runs on one packet: \"DNAT writing nothing\"\n\
             sends it to a backend at the service's own address, so the rewrite finds nothing to change\n\
             (lookups only); \"real DNAT\" uses two services that forward to each other, so every run\n\
             rewrites address and port and updates both checksums.\n\
             Not a service: a packet to the node's own port 22, passed untouched; beside it an empty\n\
             program (`return PASS`) on the same packet, the floor of running anything on the hook.\n\n\
             | Services | Program | Path | ns/packet |\n|---:|---|---|---:|\n",
        );
        for r in self.packet.iter().filter(|r| r.timing == Timing::Repeated) {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {:.0} |",
                r.services, r.program, r.path, r.ns_per_packet
            );
        }
        o.push_str(
            "\nOne packet per run, the median of the runs: the paths a repeated run cannot time, because\n\
             their rewrite turns the packet into one the path would not take again (to a remote backend:\n\
             route, TTL, SNAT or DSR, redirect; replies through reverse NAT; new flows, whose first run\n\
             creates the conntrack entry). One run brackets the program with a clock read pair that\n\
             `repeat` spreads over many runs, after a syscall that leaves colder caches. Each row's runs\n\
             alternate with runs of an anchor, the local backend's established flow on the same program\n\
             type, whose repeated time is the \"real DNAT\" row above (two services forwarding to each\n\
             other: the same code on other entries). Estimate: the row's median less the anchor's median\n\
             in the same runs, plus the anchor's repeated time. Rows for paths the repeated table also\n\
             measures are hold-outs: their estimate set beside their repeated time shows the method's\n\
             error. The counters check every timed run: each forwarded or translated back one packet, and\n\
             the route cache answered (\"cached route\") or, in the \"route cache missed\" row, a FIB lookup\n\
             ran every time (its runs alternate the ingress device, for which the cache keeps one answer).\n\
             All rows time one hot flow, a best case for the caches, as the repeated rows do. Reply rows\n\
             run tc on ingress (a remote backend's reply, back to the client) or on egress (a local pod's\n\
             reply; DSR: on the backend's node). New flows: the median and the mean of the runs (reports\n\
             before 2026-12-02 gave only the mean), not estimated.\n\n\
             | Services | Program | Path | ns, one run (median) | anchor, same runs | estimate |\n\
             |---:|---|---|---:|---:|---:|\n",
        );
        for r in self.packet.iter().filter(|r| r.timing == Timing::PerRun) {
            let estimate = self
                .packet_estimate(r)
                .map_or("—".to_string(), |ns| format!("{ns:.0}"));
            let anchor = r.anchor_ns.map_or("—".to_string(), |ns| format!("{ns:.0}"));
            let _ = writeln!(
                o,
                "| {} | {} | {} | {:.0} | {anchor} | {estimate} |",
                r.services, r.program, r.path, r.ns_per_packet
            );
        }
        // The hold-outs: the estimate against the repeated measurement.
        let holdouts: Vec<String> = self
            .packet
            .iter()
            .filter(|r| r.timing == Timing::PerRun)
            .filter_map(|r| {
                let est = self.packet_estimate(r)?;
                let repeated = self.packet_twin(r)?;
                Some(format!(
                    "{} services, {}, {}: estimated {est:.0} ns, measured {repeated:.0} ns ({:+.0})",
                    r.services,
                    r.program,
                    r.path,
                    est - repeated
                ))
            })
            .collect();
        if !holdouts.is_empty() {
            o.push_str("\nHold-outs (the estimate of a path the repeated table measures):\n\n");
            for h in holdouts {
                let _ = writeln!(o, "* {h}");
            }
        }
        for services in self.packet_scales() {
            for program in ["tc", "XDP"] {
                if let (Some((once, repeated)), Some((empty_once, empty_repeated))) = (
                    self.packet_anchor(services, program),
                    self.packet_floor(services, program),
                ) {
                    let _ = writeln!(
                        o,
                        "\nWhat one run adds, {program}, {services} services: the anchor takes {once:.0} ns one \
                         packet per run and {repeated:.0} ns repeated; the empty program {empty_once:.0} ns and \
                         {empty_repeated:.0} ns. Beyond the clock read pair a single run leaves the anchor's \
                         lookups {:+.0} ns colder, which the anchored estimate takes off.",
                        (once - repeated) - (empty_once - empty_repeated)
                    );
                }
            }
        }
        // The same path at the smallest and the largest scale, side by side.
        let (min, max) = (
            self.packet.iter().map(|p| p.services).min(),
            self.packet.iter().map(|p| p.services).max(),
        );
        if let (Some(min), Some(max)) = (min, max) {
            if min != max {
                let _ = writeln!(
                    o,
                    "\n| Program | Path | {max} ÷ {min} services |\n|---|---|---:|"
                );
                for a in self.packet.iter().filter(|p| p.services == min) {
                    if let Some(b) = self.packet.iter().find(|p| {
                        p.services == max
                            && p.program == a.program
                            && p.path == a.path
                            && p.timing == a.timing
                    }) {
                        let _ = writeln!(
                            o,
                            "| {} | {} | {:.2}× |",
                            a.program,
                            a.path,
                            b.ns_per_packet / a.ns_per_packet
                        );
                    }
                }
            }
        }
        o.push('\n');
    }

    /// The packet bench's scales, smallest first.
    pub(super) fn packet_scales(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.packet.iter().map(|p| p.services).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// A row's ns per packet as a repeated run would measure it: repeated
    /// rows as they are; a one-packet-per-run row as its median less its
    /// anchor's median in the same runs, plus the anchor's repeated time
    /// (the "real DNAT" row on the same program type, same scale). That
    /// takes off what every per-run row pays alike (the clock read pair,
    /// the syscall's colder caches for the conntrack lookup and the
    /// packet); the hold-outs show how far that lands. None for rows
    /// without an anchor (the anchor itself, the empty program, new flows).
    pub(super) fn packet_estimate(&self, r: &PacketResult) -> Option<f64> {
        if r.timing == Timing::Repeated {
            return Some(r.ns_per_packet);
        }
        let (_, repeated) = self.packet_anchor(r.services, r.program)?;
        Some(r.ns_per_packet - r.anchor_ns? + repeated)
    }

    /// The repeated row of the same program and path as a per-run row (a
    /// hold-out), if any.
    pub(super) fn packet_twin(&self, r: &PacketResult) -> Option<f64> {
        self.packet
            .iter()
            .find(|p| {
                p.timing == Timing::Repeated
                    && p.services == r.services
                    && p.program == r.program
                    && p.path == r.path
            })
            .map(|p| p.ns_per_packet)
    }

    /// The ns of the row at `services` on `program`'s hook (tc on egress is
    /// the same program type as on ingress), timed `timing`, whose path is
    /// `path`.
    pub(super) fn packet_ns(
        &self,
        services: usize,
        program: &str,
        path: &str,
        timing: Timing,
    ) -> Option<f64> {
        let hook = if program == "XDP" { "XDP" } else { "tc" };
        self.packet
            .iter()
            .find(|p| {
                p.services == services && p.program == hook && p.path == path && p.timing == timing
            })
            .map(|p| p.ns_per_packet)
    }

    /// The local backend's established flow on `program`'s hook at
    /// `services`: its per-run and its repeated time.
    pub(super) fn packet_anchor(&self, services: usize, program: &str) -> Option<(f64, f64)> {
        Some((
            self.packet_ns(
                services,
                program,
                crate::packet_per_run::LOCAL,
                Timing::PerRun,
            )?,
            self.packet_ns(services, program, crate::packet::REWRITE, Timing::Repeated)?,
        ))
    }

    /// The empty program's per-run and repeated time on `program`'s hook.
    pub(super) fn packet_floor(&self, services: usize, program: &str) -> Option<(f64, f64)> {
        Some((
            self.packet_ns(
                services,
                program,
                crate::packet_per_run::EMPTY,
                Timing::PerRun,
            )?,
            self.packet_ns(services, program, crate::packet::EMPTY, Timing::Repeated)?,
        ))
    }
}
