//! Percentiles and medians over measured samples.
use std::time::Duration;

/// The `q`-quantile (0..=1) by nearest rank; zero when there is no sample.
pub fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

pub fn median_f64(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The middle half of `v` (its 25th and 75th percentiles by nearest rank):
/// how far apart rounds of the same measurement land. None when empty.
pub fn middle_half(mut v: Vec<f64>) -> Option<(f64, f64)> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    Some((at(0.25), at(0.75)))
}

pub fn median(v: Vec<Duration>) -> Duration {
    Duration::from_secs_f64(median_f64(v.into_iter().map(|d| d.as_secs_f64()).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(percentile(&v, 0.5), Duration::from_micros(50));
        assert_eq!(percentile(&v, 0.99), Duration::from_micros(99));
        assert_eq!(percentile(&v[..1], 0.99), Duration::from_micros(1));
        assert_eq!(median_f64(vec![3.0, 1.0, 2.0, 10.0]), 2.5);
        let rounds = vec![9.0, 1.0, 5.0, 3.0, 7.0, 2.0, 8.0, 4.0];
        assert_eq!(middle_half(rounds), Some((2.0, 7.0)));
        assert_eq!(middle_half(vec![5.0, 1.0, 4.0, 2.0, 3.0]), Some((2.0, 4.0)));
        assert_eq!(middle_half(vec![4.0]), Some((4.0, 4.0)));
        assert_eq!(middle_half(Vec::new()), None);
    }
}
