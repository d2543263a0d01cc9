//! Histograms read from a Prometheus text exposition (/metrics): both the
//! agent and the real kube-proxy export
//! `kubeproxy_network_programming_duration_seconds` with the same buckets,
//! so the bench can set their own accounts of a run side by side.

/// A histogram's cumulative buckets, (upper bound, count), ascending, summed
/// over every label set other than `le`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Buckets(pub Vec<(f64, f64)>);

impl Buckets {
    /// `name`'s buckets in `text`; empty when it has none.
    pub fn parse(text: &str, name: &str) -> Self {
        let prefix = format!("{name}_bucket{{");
        let mut out: Vec<(f64, f64)> = Vec::new();
        for line in text.lines().filter(|l| l.starts_with(&prefix)) {
            let Some((labels, value)) = line[prefix.len()..].rsplit_once("} ") else {
                continue;
            };
            let Some(le) = labels
                .split(',')
                .find_map(|l| l.trim().strip_prefix("le=\""))
                .map(|l| l.trim_end_matches('"'))
            else {
                continue;
            };
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                match le.parse() {
                    Ok(v) => v,
                    Err(_) => continue,
                }
            };
            let Ok(count) = value.trim().parse::<f64>() else {
                continue;
            };
            match out.iter_mut().find(|(b, _)| *b == le) {
                Some((_, c)) => *c += count,
                None => out.push((le, count)),
            }
        }
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        Self(out)
    }

    /// What was observed between `earlier` and `self` (counters only grow;
    /// a bucket missing earlier counts from zero).
    pub fn since(&self, earlier: &Buckets) -> Buckets {
        Buckets(
            self.0
                .iter()
                .map(|&(le, c)| {
                    let before = earlier
                        .0
                        .iter()
                        .find(|(b, _)| *b == le)
                        .map_or(0.0, |(_, c)| *c);
                    (le, c - before)
                })
                .collect(),
        )
    }

    /// Observations in all.
    pub fn count(&self) -> f64 {
        self.0.last().map_or(0.0, |(_, c)| *c)
    }

    /// The `q`-quantile as Prometheus' `histogram_quantile` estimates it:
    /// linear within the bucket the rank falls in, the lower bound of the
    /// first bucket taken as 0, and the last finite bound when the rank
    /// falls in +Inf. None without observations.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let (mut lower, mut below) = (0.0, 0.0);
        for &(le, c) in &self.0 {
            if c >= rank {
                if le.is_infinite() {
                    return Some(lower);
                }
                let inside = c - below;
                let share = if inside > 0.0 {
                    (rank - below) / inside
                } else {
                    0.0
                };
                return Some(lower + (le - lower) * share);
            }
            lower = le;
            below = c;
        }
        Some(lower)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAME: &str = "kubeproxy_network_programming_duration_seconds";

    fn exposition(v4: [u32; 4], v6: [u32; 4]) -> String {
        let mut t =
            String::from("# TYPE kubeproxy_network_programming_duration_seconds histogram\n");
        for (family, counts) in [("IPv4", v4), ("IPv6", v6)] {
            for (le, c) in ["0.25", "0.5", "1.0", "+Inf"].iter().zip(counts) {
                t.push_str(&format!(
                    "{NAME}_bucket{{ip_family=\"{family}\",le=\"{le}\"}} {c}\n"
                ));
            }
            t.push_str(&format!(
                "{NAME}_count{{ip_family=\"{family}\"}} {}\n",
                counts[3]
            ));
        }
        // Another histogram's buckets must not be read as these.
        t.push_str("kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.25\"} 99\n");
        t
    }

    #[test]
    fn buckets_sum_the_families_and_a_quantile_interpolates_inside_its_bucket() {
        let b = Buckets::parse(&exposition([2, 6, 8, 8], [2, 2, 2, 2]), NAME);
        assert_eq!(
            b.0,
            vec![(0.25, 4.0), (0.5, 8.0), (1.0, 10.0), (f64::INFINITY, 10.0)]
        );
        // Rank 5 of 10: one of the four in (0.25, 0.5].
        assert_eq!(b.quantile(0.5), Some(0.25 + 0.25 * 0.25));
        // Rank 9.9: in (0.5, 1.0], 1.9 of its 2.
        assert!((b.quantile(0.99).unwrap() - (0.5 + 0.5 * 0.95)).abs() < 1e-9);
        // Rank 2 of 10 in the first bucket, from 0.
        assert_eq!(b.quantile(0.2), Some(0.125));
    }

    #[test]
    fn a_delta_counts_only_what_was_observed_between_two_scrapes() {
        let before = Buckets::parse(&exposition([2, 6, 8, 8], [0, 0, 0, 0]), NAME);
        let after = Buckets::parse(&exposition([2, 6, 8, 12], [0, 0, 0, 0]), NAME);
        let d = after.since(&before);
        assert_eq!(d.count(), 4.0);
        // All four above the last finite bound: reported as that bound.
        assert_eq!(d.quantile(0.5), Some(1.0));
        assert_eq!(Buckets::default().quantile(0.5), None);
        assert_eq!(Buckets::parse("", NAME).since(&before).count(), 0.0);
    }
}
