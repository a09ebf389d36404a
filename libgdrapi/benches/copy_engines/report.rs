//! The markdown tables, and the summary and `bar` lines read by scripts/bench-bar-summary and
//! scripts/check-bench-compare.

#![forbid(unsafe_code)]

use gdrapi::copy::Direction;

use crate::method::Method;
use crate::timing::{PairedOn, Timing, measure, paired};

pub(crate) fn human(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

/// Prints one table; returns each size's median GB/s per method (None where not usable).
pub(crate) fn table(
    title: &str,
    methods: &[Method],
    dir: Direction,
    dev: *mut u8,
    host: *mut u8,
    sizes: &[usize],
    t: &Timing,
) -> Vec<(usize, Vec<Option<f64>>)> {
    println!("\n### {title}\n");
    println!("cell: median GB/s (p10-p90) and ratio to memcpy's median; * = selected by the dispatcher\n");
    print!("| size |");
    for m in methods {
        print!(" {} |", m.name());
    }
    println!();
    print!("|---:|");
    for _ in methods {
        print!("---:|");
    }
    println!();
    let mut rows = Vec::new();
    for &len in sizes {
        print!("| {} |", human(len));
        let mut base = None;
        let mut row = Vec::new();
        for m in methods {
            if !m.usable(len) {
                print!(" - |");
                row.push(None);
                continue;
            }
            let s = measure(m, dir, dev, host, len, t);
            if matches!(m, Method::Memcpy) {
                base = Some(s.med);
            }
            let ratio = base.map(|b| format!(" x{:.2}", s.med / b)).unwrap_or_default();
            print!(" {:.2} ({:.2}-{:.2}){} |", s.med, s.p10, s.p90, ratio);
            row.push(Some(s.med));
        }
        println!();
        rows.push((len, row));
    }
    rows
}

/// The offsets of the misaligned columns (dispatcher and public calls): device +7, host +3.
pub(crate) const MIS_DEV: usize = 7;
pub(crate) const MIS_HOST: usize = 3;
/// Label of our misaligned public column (`MIS_DEV`, `MIS_HOST`).
pub(crate) const MISALIGNED_PUBLIC: &str = "public dev+7 host+3";
/// Label of the other library's misaligned public column (the same offsets).
pub(crate) const MISALIGNED_OTHER: &str = "other dev+7 host+3";

/// One line per size comparing our public call with the dispatcher and with the other library:
/// nanoseconds per call and speed ratios (> 1: our public call is faster), plus the paired
/// public-dispatcher and public-other differences ([`paired`]).
pub(crate) fn summary(what: &str, methods: &[Method], rows: &[(usize, Vec<Option<f64>>)], on: &PairedOn<'_>) {
    let col = |want: &dyn Fn(&Method) -> bool| methods.iter().position(want);
    let aligned_public =
        |m: &Method| matches!(m, Method::Public { label, dev_off: 0, host_off: 0, .. } if label.starts_with("public"));
    let Some(public) = col(&aligned_public) else {
        return;
    };
    let dispatch = col(&|m| matches!(m, Method::Dispatch { dev_off: 0, host_off: 0 }));
    let other = col(&|m| matches!(m, Method::Public { label, .. } if label.starts_with("other gdr_copy")));
    let other_misaligned = col(&|m| matches!(m, Method::Public { label, .. } if label.starts_with(MISALIGNED_OTHER)));
    let called = col(&|m| matches!(m, Method::DispatchCalled));
    let misaligned = col(&|m| matches!(m, Method::Public { label, .. } if label.starts_with(MISALIGNED_PUBLIC)));
    let misaligned_dispatch = col(&|m| matches!(m, Method::Dispatch { dev_off: MIS_DEV, host_off: MIS_HOST }));
    // The largest paired public-dispatcher differences and misaligned/aligned ratio of this run,
    // with their sizes: issue 10's bars in one line.
    let mut worst = [Worst::default(); 3];
    println!();
    for (len, row) in rows {
        let ns = |i: Option<usize>| i.and_then(|i| row[i]).map(|gbs| *len as f64 / gbs);
        let Some(p) = ns(Some(public)) else { continue };
        let mut line = format!("summary {what} {}: public {p:.2} ns", human(*len));
        if let Some(d) = ns(dispatch) {
            let pd = dispatch.map(|i| paired(&methods[public], &methods[i], *len, on));
            worst[0].note(pd.as_ref().map(|d| d.med), *len);
            let pd = pd.map_or(String::new(), |s| format!(", paired {s}"));
            line += &format!(", dispatcher {d:.2} ns (public-dispatcher {:+.2} ns{pd}, speed x{:.2})", p - d, d / p);
        }
        if let Some(c) = called {
            let s = paired(&methods[public], &methods[c], *len, on);
            worst[1].note(Some(s.med), *len);
            line += &format!(", paired public-dispatcher(C call) {s}");
        }
        if let Some(o) = ns(other) {
            let po = other.map(|i| paired(&methods[public], &methods[i], *len, on));
            let po = po.map_or(String::new(), |s| format!(", paired public-other {s}"));
            line += &format!(", other {o:.2} ns (speed x{:.2}{po})", o / p);
        }
        // Misaligned (device +7, host +3) over aligned time, same size: public and dispatcher.
        if let (Some(mp), Some(md), Some(d)) = (ns(misaligned), ns(misaligned_dispatch), ns(dispatch)) {
            line += &format!(", misaligned/aligned time: public x{:.2}, dispatcher x{:.2}", mp / p, md / d);
        }
        if let Some(m) = misaligned {
            let s = paired(&methods[m], &methods[public], *len, on);
            // A 1-byte copy has no misaligned form (the column is then the aligned one).
            worst[2].note((*len > 1).then_some(s.ratio), *len);
            line += &format!(", paired misaligned-aligned public {s}, time x{:.2}", s.ratio);
        }
        if let (Some(m), Some(o)) = (misaligned, other_misaligned) {
            line += &format!(", paired misaligned public-other {}", paired(&methods[m], &methods[o], *len, on));
        }
        println!("{line}");
    }
    let [pd, pdc, mis] = worst;
    let mut bar = format!("bar {what}:");
    for (name, w, ns) in [
        ("paired public-dispatcher", pd, true),
        ("paired public-dispatcher(C call)", pdc, true),
        ("misaligned/aligned public time", mis, false),
    ] {
        if let Some((v, len)) = w.0 {
            let v = if ns { format!("{v:+.2} ns") } else { format!("x{v:.2}") };
            bar += &format!(" {name} at most {v} ({});", human(len));
        }
    }
    println!("{bar}");
}

/// The largest value seen so far and the copy size it was seen at.
#[derive(Clone, Copy, Default)]
struct Worst(Option<(f64, usize)>);

impl Worst {
    fn note(&mut self, v: Option<f64>, len: usize) {
        if let Some(v) = v
            && self.0.is_none_or(|(w, _)| v > w)
        {
            self.0 = Some((v, len));
        }
    }
}
