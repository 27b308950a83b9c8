//! Latency samples and their summaries.

use std::time::Duration;

use serde::Serialize;

/// Percentiles of a set of durations, in microseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    /// How many samples.
    pub count: usize,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// The largest sample.
    pub max_us: f64,
    /// The distribution for the charts: (latency in µs, share of samples at
    /// or below it), at most [`CDF_POINTS`] points.
    pub cdf: Vec<(f64, f64)>,
}

/// How many points of a distribution the JSON and the charts keep.
pub const CDF_POINTS: usize = 120;

impl Summary {
    /// Summarises `samples` (any order).
    pub fn of(samples: &[Duration]) -> Summary {
        if samples.is_empty() {
            return Summary::default();
        }
        let mut us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        us.sort_by(f64::total_cmp);
        let n = us.len();
        let at = |p: f64| us[((n as f64 * p).ceil() as usize).clamp(1, n) - 1];
        let step = n.div_ceil(CDF_POINTS).max(1);
        let mut cdf: Vec<(f64, f64)> = (step - 1..n)
            .step_by(step)
            .map(|i| (us[i], (i + 1) as f64 / n as f64))
            .collect();
        if cdf.last().map(|p| p.1) != Some(1.0) {
            cdf.push((us[n - 1], 1.0));
        }
        Summary {
            count: n,
            p50_us: at(0.50),
            p90_us: at(0.90),
            p99_us: at(0.99),
            max_us: us[n - 1],
            cdf,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).rev().map(Duration::from_micros).collect();
        let s = Summary::of(&samples);
        assert_eq!(s.count, 100);
        assert_eq!(s.p50_us.round(), 50.0);
        assert_eq!(s.p99_us.round(), 99.0);
        assert_eq!(s.max_us.round(), 100.0);
        assert_eq!(s.cdf.last().unwrap().1, 1.0);
        assert!(s
            .cdf
            .windows(2)
            .all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
        assert_eq!(Summary::of(&[]).count, 0);
    }
}
