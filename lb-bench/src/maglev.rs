//! Maglev table builds (NSDI'16, Pseudocode 1): time per table, balance
//! (the most and the fewest slots any backend has, against M/N), and
//! disruption (slots that change owner when one backend of N goes, against
//! the ideal 1/N).
use std::time::{Duration, Instant};

use lb::desired::maglev::{build, MaglevBackend};

use crate::{profile::Profile, stats::median};

#[derive(Clone, Debug)]
pub struct MaglevResult {
    pub m: u32,
    pub backends: usize,
    pub build: Duration,
    /// max slots / (M/N) and min slots / (M/N).
    pub max_over_ideal: f64,
    pub min_over_ideal: f64,
    /// Share of slots that moved when one backend was removed (mean of
    /// `REMOVALS` removals).
    pub disruption: f64,
}

/// Backends removed, one at a time, for the mean disruption.
const REMOVALS: usize = 5;

fn backends(n: usize) -> Vec<MaglevBackend> {
    (0..n)
        .map(|i| MaglevBackend {
            name: format!("10.244.{}.{}:8080/TCP", i / 250, i % 250 + 1),
            id: i as u32 + 1,
            weight: 1,
        })
        .collect()
}

pub fn run(p: &Profile) -> Vec<MaglevResult> {
    let mut out = Vec::new();
    for &m in &p.maglev_sizes {
        for &n in &p.maglev_backends {
            let set = backends(n);
            let times: Vec<Duration> = (0..5)
                .map(|_| {
                    let t = Instant::now();
                    std::hint::black_box(build(std::hint::black_box(&set), m));
                    t.elapsed()
                })
                .collect();
            let table = build(&set, m);
            let mut counts = vec![0usize; n + 1];
            for &id in &table {
                counts[id as usize] += 1;
            }
            let ideal = f64::from(m) / n as f64;
            let (max, min) = (
                counts[1..].iter().max().copied().unwrap_or(0),
                counts[1..].iter().min().copied().unwrap_or(0),
            );
            // Remove one backend; count slots whose owner changed. Which
            // one matters (by ±10% at N = 100): the mean over REMOVALS
            // backends spread over the name order.
            let removals = REMOVALS.min(n);
            let moved: usize = (0..removals)
                .map(|k| {
                    let mut fewer = set.clone();
                    fewer.remove(n * (2 * k + 1) / (2 * removals));
                    let after = build(&fewer, m);
                    table.iter().zip(&after).filter(|(a, b)| a != b).count()
                })
                .sum();
            let moved = moved as f64 / removals as f64;
            out.push(MaglevResult {
                m,
                backends: n,
                build: median(times),
                max_over_ideal: max as f64 / ideal,
                min_over_ideal: min as f64 / ideal,
                disruption: moved / f64::from(m),
            });
        }
    }
    out
}
