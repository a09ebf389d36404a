//! Timing: GB/s samples of one method at one size, and paired differences of two methods in
//! alternating blocks with the median's confidence interval.

use std::time::{Duration, Instant};

use gdrapi::copy::Direction;

use crate::method::Method;

#[derive(Clone, Copy)]
pub(crate) struct Stat {
    pub(crate) med: f64,
    pub(crate) p10: f64,
    pub(crate) p90: f64,
}

pub(crate) struct Timing {
    pub(crate) sample: Duration,
    pub(crate) samples: usize,
    pub(crate) cell_budget: Duration,
    /// Block pairs per paired difference ([`paired`]).
    pub(crate) pairs: usize,
}

/// GB/s samples of `m` at `len`: each sample repeats the call enough times to last `t.sample`.
pub(crate) fn measure(m: &Method, dir: Direction, dev: *mut u8, host: *mut u8, len: usize, t: &Timing) -> Stat {
    let once = || {
        let s = Instant::now();
        // SAFETY: the caller passes buffers sized for the largest length + slack.
        unsafe { m.run(dir, dev, host, len, 1) };
        s.elapsed()
    };
    once(); // warm-up: page in, fill caches/TLB, resolve lazily bound symbols
    let single = once().max(Duration::from_nanos(20));
    let iters = (t.sample.as_nanos() / single.as_nanos()).clamp(1, 1 << 24) as usize;
    let per_sample = single * iters as u32;
    let samples = if per_sample * t.samples as u32 > t.cell_budget {
        (t.cell_budget.as_nanos() / per_sample.as_nanos().max(1)).clamp(3, t.samples as u128) as usize
    } else {
        t.samples
    };
    let mut gbs: Vec<f64> = (0..samples)
        .map(|_| {
            let s = Instant::now();
            // SAFETY: as in `once`.
            unsafe { m.run(dir, dev, host, len, iters) };
            (len * iters) as f64 / s.elapsed().as_nanos().max(1) as f64
        })
        .collect();
    gbs.sort_by(f64::total_cmp);
    let pick = |q: f64| gbs[((gbs.len() - 1) as f64 * q).round() as usize];
    Stat { med: pick(0.5), p10: pick(0.1), p90: pick(0.9) }
}

/// The per-call time difference `a - b` in ns, measured in alternating blocks of equal length
/// (a, b, b, a, a, b, ...: each pair's order swapped from the last), so that a machine whose speed
/// drifts between the table's cells (a shared VM) shifts both sides of each pair alike and a drift
/// within a pair favours neither side: median and p10-p90 of the per-pair differences, and the
/// median's 95% confidence interval ([`Difference`]).
pub(crate) fn paired(a: &Method, b: &Method, len: usize, on: &PairedOn<'_>) -> Difference {
    let (dir, dev, host, t) = (on.dir, on.dev, on.host, on.t);
    let block = |m: &Method, iters: usize| {
        let s = Instant::now();
        // SAFETY: the caller passes buffers sized for the largest length + slack.
        unsafe { m.run(dir, dev, host, len, iters) };
        s.elapsed().as_nanos() as f64 / iters as f64
    };
    block(a, 16);
    block(b, 16);
    let once = block(a, 64).max(1.0);
    let iters = ((t.sample.as_nanos() as f64 / 4.0 / once) as usize).clamp(16, 1 << 22);
    let (mut d, mut r): (Vec<f64>, Vec<f64>) = (0..t.pairs)
        .map(|i| {
            let (ta, tb) = if i % 2 == 0 {
                let ta = block(a, iters);
                (ta, block(b, iters))
            } else {
                let tb = block(b, iters);
                (block(a, iters), tb)
            };
            (ta - tb, ta / tb.max(f64::MIN_POSITIVE))
        })
        .unzip();
    d.sort_by(f64::total_cmp);
    r.sort_by(f64::total_cmp);
    let pick = |q: f64| d[((d.len() - 1) as f64 * q).round() as usize];
    let (lo, hi) = median_ci_ranks(d.len());
    Difference { med: pick(0.5), p10: pick(0.1), p90: pick(0.9), ci: (d[lo], d[hi]), ratio: r[r.len() / 2] }
}

/// A paired difference (ns per call): median, p10-p90 spread, and the median's 95% confidence
/// interval, so that "within about 1 ns" can be told from noise where single blocks vary by tens
/// of nanoseconds (stores that flush non-temporal lines of cached memory: raise `--pairs`).
pub(crate) struct Difference {
    pub(crate) med: f64,
    pub(crate) p10: f64,
    pub(crate) p90: f64,
    pub(crate) ci: (f64, f64),
    /// Median of the per-pair time ratios `a / b`.
    pub(crate) ratio: f64,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:+.2} ns [{:+.2}..{:+.2}] (95% CI {:+.2}..{:+.2})",
            self.med, self.p10, self.p90, self.ci.0, self.ci.1
        )
    }
}

/// The ranks (0-based, in sorted order) bounding a distribution-free 95% confidence interval of
/// the median of `n` values: the number of values below the true median is Binomial(n, 1/2), so
/// the interval is n/2 -+ 1.96 * sqrt(n) / 2 ranks (normal approximation), clamped to the data.
fn median_ci_ranks(n: usize) -> (usize, usize) {
    let half = 0.98 * (n as f64).sqrt();
    let mid = (n as f64 - 1.0) / 2.0;
    let lo = (mid - half).floor().max(0.0) as usize;
    let hi = ((mid + half).ceil() as usize).min(n - 1);
    (lo, hi)
}

/// Where [`summary`] may run its paired measurements.
pub(crate) struct PairedOn<'a> {
    pub(crate) dir: Direction,
    pub(crate) dev: *mut u8,
    pub(crate) host: *mut u8,
    pub(crate) t: &'a Timing,
}
