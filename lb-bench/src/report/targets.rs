//! The targets table: each target of the benchmark issue, met or missed
//! by how much, from the results of this run.
use std::fmt::Write as _;

use super::*;

impl Report {
    pub(super) fn targets(&self, o: &mut String) {
        let mut rows: Vec<[String; 4]> = Vec::new();
        let verdict = |ok: bool, by: String| {
            if ok {
                format!("met ({by})")
            } else {
                format!("**missed** ({by})")
            }
        };
        // A ratio of medians a few points off its target says little when
        // the rounds themselves spread wider: the verdict says so.
        let spread = |s: &crate::connect::Scale, v: Variant, wanted: f64| -> String {
            match s.round_spread(v) {
                Some((lo, hi)) if lo <= wanted && wanted <= hi => format!(
                    "; within noise: the rounds' middle half, {lo:.2}-{hi:.2}×, holds the target"
                ),
                Some((lo, hi)) => format!("; the rounds' middle half {lo:.2}-{hi:.2}×"),
                None => String::new(),
            }
        };
        for s in &self.connect {
            if let (Some(lb), Some(d)) = (s.get(Variant::Lb), s.get(Variant::Direct)) {
                let r = lb.rate / d.rate;
                rows.push([
                    format!("connect via VIP ≥ 0.98× direct, {} services", s.services),
                    format!("{r:.2}×"),
                    "≥ 0.98×".into(),
                    verdict(
                        r >= 0.98,
                        format!(
                            "{:+.0}%{}",
                            (r / 0.98 - 1.0) * 100.0,
                            spread(s, Variant::Lb, 0.98)
                        ),
                    ),
                ]);
            }
            if let (Some(h), Some(d)) = (s.get(Variant::DirectHooked), s.get(Variant::Direct)) {
                let cost = 1.0 - h.rate / d.rate;
                rows.push([
                    format!(
                        "what the hooks cost a connect not to a service (rate), {} services",
                        s.services
                    ),
                    format!("{:+.1}%", -cost * 100.0),
                    "≤ 2% slower".into(),
                    verdict(
                        cost <= 0.02,
                        format!(
                            "{:.1} points{}",
                            (0.02 - cost) * 100.0,
                            spread(s, Variant::DirectHooked, 0.98)
                        ),
                    ),
                ]);
            }
            if let Some(h) = &s.hooks {
                for (to, c) in [
                    ("to a backend", &h.to_backend),
                    ("to an address no service uses", &h.elsewhere),
                ] {
                    rows.push([
                        format!(
                            "our programs' time in a connect {to} (BPF stats), {} services",
                            s.services
                        ),
                        format!(
                            "{:.0} ns of {:.1} µs, {:.2}%",
                            c.total_ns(),
                            c.connect_ns / 1e3,
                            c.share() * 100.0
                        ),
                        "≤ 2%".into(),
                        verdict(
                            c.share() <= 0.02,
                            format!("{:.0}% of the budget", c.share() / 0.02 * 100.0),
                        ),
                    ]);
                }
            }
        }
        if let (Some(first), Some(last)) = (self.connect.first(), self.connect.last()) {
            if let (Some(a), Some(b)) = (first.get(Variant::Lb), last.get(Variant::Lb)) {
                if first.services != last.services {
                    let r = b.rate / a.rate;
                    rows.push([
                        format!("flat from {} to {} services", first.services, last.services),
                        format!("{r:.2}× the rate"),
                        "≈ 1× (within noise, ±5%)".into(),
                        verdict(r >= 0.95, format!("{:+.0}%", (r - 1.0) * 100.0)),
                    ]);
                }
            }
        }
        if let Some(c) = self.control.iter().max_by_key(|c| c.services) {
            let v = c.lb_change.as_secs_f64() * 1e3;
            rows.push([
                format!("one endpoint change applied, {} services", c.services),
                format!("{} ms", ms(c.lb_change)),
                "≤ 1 ms".into(),
                verdict(v <= 1.0, format!("{:.0}% of the budget", v * 100.0)),
            ]);
        }
        if let Some(c) = self.control.iter().find(|c| c.services == 10_000) {
            for (what, took) in [
                ("full sync of 10 000 × 10", c.lb_full),
                (
                    "full sync of 10 000 × 10, maps preallocated (`--preallocate-maps`)",
                    c.lb_full_preallocated,
                ),
            ] {
                let v = took.as_secs_f64() * 1e3;
                rows.push([
                    what.into(),
                    format!("{} ms", ms(took)),
                    "≤ 300 ms".into(),
                    verdict(v <= 300.0, format!("{:.0}% of the budget", v / 3.0)),
                ]);
            }
        }
        if let Some(max) = self.packet.iter().map(|p| p.services).max() {
            // Every path of an established flow, both directions.
            // Per-run rows that have a repeated twin (hold-outs) count as
            // the twin; the route-cache-miss row is the exception path.
            for r in self.packet.iter().filter(|p| {
                p.services == max
                    && (p.path.contains("established") || p.path.contains("reply"))
                    && !(p.timing == Timing::PerRun && self.packet_twin(p).is_some())
                    && p.path != crate::packet_per_run::SNAT_FIB
            }) {
                let Some(ns) = self.packet_estimate(r) else {
                    continue;
                };
                let (value, detail) = match r.timing {
                    Timing::Repeated => (format!("{ns:.0} ns"), format!("{ns:.0}% of the budget")),
                    Timing::PerRun => (
                        format!("≈ {ns:.0} ns (estimate)"),
                        format!("by estimate from one packet per run, {ns:.0}% of the budget"),
                    ),
                };
                rows.push([
                    format!("{} per packet, {} services, {}", r.program, max, r.path),
                    value,
                    "≤ 100 ns".into(),
                    verdict(ns <= 100.0, detail),
                ]);
            }
        }
        if let Some(r) = self.file_edit.iter().max_by_key(|r| r.services) {
            let v = r.to_map[0].as_secs_f64() * 1e3;
            rows.push([
                format!("services-file edit → maps (p50), {} services", r.services),
                format!("{} ms", ms(r.to_map[0])),
                "≤ 50 ms".into(),
                verdict(v <= 50.0, format!("{:.0}% of the budget", v * 2.0)),
            ]);
        }
        if let Some(max) = self.packet.iter().map(|p| p.services).max() {
            for program in ["tc", "XDP"] {
                let at = |prefix: &str| {
                    self.packet.iter().find(|p| {
                        p.services == max
                            && p.program == program
                            && p.timing == Timing::Repeated
                            && p.path.starts_with(prefix)
                    })
                };
                if let (Some(miss), Some(empty)) = (at("not a service"), at("empty program")) {
                    let over = miss.ns_per_packet - empty.ns_per_packet;
                    rows.push([
                        format!(
                            "{program}: a packet not for a service, {max} services, over an empty program"
                        ),
                        format!("{over:+.0} ns"),
                        "≤ 10 ns".into(),
                        verdict(over <= 10.0, format!("{:+.0} ns", over - 10.0)),
                    ]);
                }
            }
        }
        if let Some(m) = self
            .maglev
            .iter()
            .find(|m| m.m == 65_537 && m.backends == 100)
        {
            let v = m.build.as_secs_f64() * 1e3;
            rows.push([
                "Maglev build, M = 65537, N = 100".into(),
                format!("{} ms", ms(m.build)),
                "≤ 5 ms".into(),
                verdict(v <= 5.0, format!("{:.0}% of the budget", v * 20.0)),
            ]);
        }
        // Disruption within 1.5× the ideal up to 100 backends: the
        // smallest M of the run that keeps it, for a service to ask for.
        let within = |m: u32| {
            let rows: Vec<_> = self
                .maglev
                .iter()
                .filter(|r| r.m == m && r.backends <= 100)
                .collect();
            !rows.is_empty() && rows.iter().all(|r| r.disruption * r.backends as f64 <= 1.5)
        };
        let mut sizes: Vec<u32> = self.maglev.iter().map(|r| r.m).collect();
        sizes.sort_unstable();
        sizes.dedup();
        if let Some(&largest) = sizes.last() {
            let worst = |m: u32| {
                self.maglev
                    .iter()
                    .filter(|r| r.m == m && r.backends <= 100)
                    .map(|r| r.disruption * r.backends as f64)
                    .fold(0.0, f64::max)
            };
            let default = lb_common::maps::DEFAULT_MAGLEV_M;
            if sizes.contains(&default) {
                rows.push([
                    format!("Maglev disruption, N ≤ 100, default M = {default}"),
                    format!("{:.2}× ideal", worst(default)),
                    "≤ 1.5× ideal".into(),
                    verdict(within(default), format!("{:.2}×", worst(default))),
                ]);
            }
            let chosen = sizes
                .iter()
                .copied()
                .find(|m| within(*m))
                .unwrap_or(largest);
            rows.push([
                format!(
                    "Maglev disruption, N ≤ 100, a service's own M = {chosen} ({} KiB)",
                    u64::from(chosen) * 4 / 1024
                ),
                format!("{:.2}× ideal", worst(chosen)),
                "≤ 1.5× ideal".into(),
                verdict(within(chosen), format!("{:.2}×", worst(chosen))),
            ]);
        }
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(
            o,
            "## Targets\n\n| Target | Measured | Wanted | Verdict |\n|---|---|---|---|"
        );
        for r in rows {
            let _ = writeln!(o, "| {} | {} | {} | {} |", r[0], r[1], r[2], r[3]);
        }
        o.push('\n');
    }
}
