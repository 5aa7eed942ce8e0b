//! The benchmark's picture: grouped bars of A, and of B and C for each variant, per concurrency,
//! for throughput, server CPU per operation and p99 latency. Each variant has its own hue (B
//! light, C full, C-mutual dark; A grey); with many series the three panels are stacked. Plain
//! SVG written by hand; a plotting crate would bring a font stack and far more code than three
//! bar charts need.

use std::fmt::Write as _;

use crate::bench::{BenchResults, Setup, SetupResults};
use crate::report::Report;

const PANEL_W: f64 = 400.0;
const PANEL_H: f64 = 300.0;
/// With more series than this the panels are stacked, each the figure's full width, so that the
/// bars of one concurrency stay wide enough to tell apart.
const SIDE_BY_SIDE_MAX_SERIES: usize = 6;
const FULL_W: f64 = 1200.0;
/// Bars narrower than this carry no value label (it would overlap its neighbours'); the value
/// is in each bar's tooltip and in results.md either way.
const LABEL_MIN_BAR_W: f64 = 22.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 56.0;
const BOTTOM: f64 = 44.0;
const LEGEND_ROW: f64 = 14.0;
const LEGEND_COLUMN_W: f64 = 400.0;
const COMPACT_COLUMN_W: f64 = 200.0;
/// A's colour: it attests nothing and belongs to no variant.
const FLOOR: &str = "#7f7f7f";
/// One hue per variant, in the order of `--variant`; each as (B, C, C-mutual): light,
/// full and dark.
const HUES: [[&str; 3]; 10] = [
    ["#a6c8ec", "#4e79a7", "#2b4a6f"],
    ["#fbc48f", "#f28e2b", "#a85a12"],
    ["#f3a3a4", "#e15759", "#9c2f31"],
    ["#a9d3a3", "#59a14f", "#356630"],
    ["#f5e08a", "#edc948", "#a38820"],
    ["#d7b6cf", "#b07aa1", "#744b68"],
    ["#f9c6cd", "#ff9da7", "#c0606b"],
    ["#c9b2a5", "#9c755f", "#634737"],
    ["#c7e4e1", "#76b7b2", "#44807b"],
    ["#d2cdca", "#bab0ac", "#7d7470"],
];

/// A series' colour: grey for A; for B, C and C-mutual its variant's hue, lighter for B.
fn color(results: &BenchResults, s: &SetupResults) -> &'static str {
    let Some(variant) = s.variant else {
        return FLOOR;
    };
    let index = results
        .config
        .variants
        .iter()
        .position(|v| *v == variant)
        .unwrap_or(0);
    let hue = HUES[index % HUES.len()];
    match s.setup {
        Setup::A | Setup::B => hue[0],
        Setup::C => hue[1],
        Setup::CMutual => hue[2],
    }
}

/// A series' legend: its setup, and the variant for B and C. `compact`: the setup's letter
/// only, for a legend of many series, with the setups spelled out once in [`KEY`].
fn legend(s: &SetupResults, compact: bool) -> String {
    match (s.variant, compact) {
        (Some(v), true) => format!("{} {v}", s.setup.name()),
        (Some(v), false) => format!("{} ({v})", s.setup.short()),
        (None, _) => s.setup.short().to_owned(),
    }
}

/// What the setups are, above a compact legend.
const KEY: &str = "A: mutual TLS + one gRPC call to a trivial upstream (the floor) · B: aTLS + \
    the variant's attestation, attest-proxy, the same upstream · C: full joins, whole system · \
    C-mutual: C, nodes verifying the service";

/// One panel: a title and a figure taken from each report.
struct Panel {
    title: &'static str,
    value: fn(&Report) -> Option<f64>,
}

const PANELS: [Panel; 3] = [
    Panel {
        title: "throughput (operations/s)",
        value: |r| Some(r.joins_per_second),
    },
    Panel {
        title: "server CPU per operation (ms)",
        value: |r| r.server_cpu_ms_per_join,
    },
    Panel {
        title: "p99 latency (ms)",
        value: |r| (r.latency.count > 0).then_some(r.latency.p99_ms),
    },
];

/// A round axis maximum at or above `max` and its tick step (1, 2 or 5 times a power of ten).
pub fn axis(max: f64) -> (f64, f64) {
    if !max.is_finite() || max <= 0.0 {
        return (1.0, 0.2);
    }
    let raw = max / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude);
    ((max / step).ceil() * step, step)
}

fn label(v: f64) -> String {
    if v == 0.0 {
        "0".to_owned()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The SVG document.
pub fn svg(results: &BenchResults) -> String {
    let concurrencies = &results.config.concurrencies;
    let series = &results.setups;
    let stacked = series.len() > SIDE_BY_SIDE_MAX_SERIES;
    let (panel_w, width) = if stacked {
        (FULL_W, FULL_W)
    } else {
        (PANEL_W, PANEL_W * PANELS.len() as f64)
    };
    let column_w = if stacked {
        COMPACT_COLUMN_W
    } else {
        LEGEND_COLUMN_W
    };
    let columns = ((width / column_w) as usize).clamp(1, series.len().max(1));
    let legend_rows = series.len().div_ceil(columns).max(1);
    // A compact legend has the key to the setups on a line of its own above it.
    let key_height = if stacked { LEGEND_ROW } else { 0.0 };
    let legend_height = LEGEND_ROW * legend_rows as f64 + key_height;
    let panels_height = if stacked {
        PANEL_H * PANELS.len() as f64
    } else {
        PANEL_H
    };
    let height = panels_height + 26.0 + legend_height;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let title = format!(
        "join service benchmark: {} CPUs ({}), {} s per step",
        results.machine.cpus,
        results.machine.cpu_model,
        results.config.step.as_secs_f64()
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="14">{}</text>"#,
        width / 2.0,
        escape(&title)
    );
    // Legend.
    if stacked {
        let _ = writeln!(
            out,
            r#"<text x="{}" y="39" text-anchor="middle">{}</text>"#,
            width / 2.0,
            escape(KEY)
        );
    }
    for (i, s) in series.iter().enumerate() {
        let x = 10.0 + (i % columns) as f64 * column_w;
        let y = 30.0 + key_height + (i / columns) as f64 * LEGEND_ROW;
        let _ = writeln!(
            out,
            r#"<rect x="{x}" y="{y}" width="10" height="10" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            color(results, s),
            x + 14.0,
            y + 9.0,
            escape(&legend(s, stacked))
        );
    }
    for (i, panel) in PANELS.iter().enumerate() {
        let (x0, y0) = if stacked {
            (0.0, 26.0 + legend_height + i as f64 * PANEL_H)
        } else {
            (i as f64 * PANEL_W, 26.0 + legend_height)
        };
        let plot_w = panel_w - LEFT - RIGHT;
        let plot_h = PANEL_H - TOP - BOTTOM;
        let bottom = y0 + TOP + plot_h;
        // (concurrency index, series index, value)
        let values: Vec<(usize, usize, f64)> = concurrencies
            .iter()
            .enumerate()
            .flat_map(|(ci, &c)| {
                series.iter().enumerate().filter_map(move |(si, s)| {
                    let report = s.steps.iter().find(|r| r.concurrency == Some(c))?;
                    Some((ci, si, (panel.value)(report)?))
                })
            })
            .collect();
        let max = values.iter().map(|v| v.2).fold(0.0, f64::max);
        let (axis_max, step) = axis(max);
        let y = |v: f64| bottom - v / axis_max * plot_h;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle" font-size="13">{}</text>"#,
            x0 + LEFT + plot_w / 2.0,
            y0 + TOP - 16.0,
            panel.title
        );
        // Grid and y labels.
        let mut tick = 0.0;
        while tick <= axis_max + step / 2.0 {
            let ty = y(tick);
            let _ = writeln!(
                out,
                r##"<line x1="{}" y1="{ty:.1}" x2="{}" y2="{ty:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                x0 + LEFT,
                x0 + LEFT + plot_w,
                x0 + LEFT - 6.0,
                ty + 4.0,
                label(tick)
            );
            tick += step;
        }
        let _ = writeln!(
            out,
            r#"<line x1="{0}" y1="{1}" x2="{0}" y2="{2}" stroke="black"/><line x1="{0}" y1="{2}" x2="{3}" y2="{2}" stroke="black"/>"#,
            x0 + LEFT,
            y0 + TOP,
            bottom,
            x0 + LEFT + plot_w
        );
        // Bars: one group per concurrency, one bar per setup.
        let group_w = plot_w / concurrencies.len().max(1) as f64;
        let bar_w = (group_w - 12.0) / series.len().max(1) as f64;
        for (ci, c) in concurrencies.iter().enumerate() {
            let gx = x0 + LEFT + ci as f64 * group_w;
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{c}</text>"#,
                gx + group_w / 2.0,
                bottom + 16.0
            );
        }
        for (ci, si, v) in &values {
            let bx = x0 + LEFT + *ci as f64 * group_w + 6.0 + *si as f64 * bar_w;
            let by = y(*v);
            let _ = write!(
                out,
                r#"<rect x="{bx:.1}" y="{by:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{} at concurrency {}: {}</title></rect>"#,
                bar_w - 1.0,
                bottom - by,
                color(results, &series[*si]),
                escape(&legend(&series[*si], false)),
                concurrencies[*ci],
                label(*v),
            );
            if bar_w >= LABEL_MIN_BAR_W {
                let _ = write!(
                    out,
                    r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="8">{}</text>"#,
                    bx + bar_w / 2.0,
                    by - 3.0,
                    label(*v)
                );
            }
            out.push('\n');
        }
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">concurrency</text>"#,
            x0 + LEFT + plot_w / 2.0,
            bottom + 32.0
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_are_round() {
        let close = |(max, step): (f64, f64), (want_max, want_step): (f64, f64)| {
            (max - want_max).abs() < 1e-9 && (step - want_step).abs() < 1e-9
        };
        assert!(close(axis(0.0), (1.0, 0.2)));
        assert!(close(axis(f64::NAN), (1.0, 0.2)));
        // At most five ticks of 1, 2 or 5 times a power of ten.
        assert!(close(axis(1234.0), (1500.0, 500.0)));
        assert!(close(axis(900.0), (1000.0, 200.0)));
        assert!(close(axis(1.0), (1.0, 0.2)));
        assert!(close(axis(0.37), (0.4, 0.1)));
        assert!(close(axis(48.0), (50.0, 10.0)));
    }

    #[test]
    fn labels_and_escaping() {
        assert_eq!(label(1234.4), "1234");
        assert_eq!(label(12.34), "12.3");
        assert_eq!(label(0.1234), "0.12");
        assert_eq!(label(0.0), "0");
        assert_eq!(escape("a<b>&c"), "a&lt;b&gt;&amp;c");
    }
}
