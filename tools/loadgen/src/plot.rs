//! The benchmark's picture: grouped bars of A, and of B and C for each variant, per concurrency,
//! for throughput, server CPU per operation and p99 latency. Plain SVG written by hand; a plotting crate would bring a font
//! stack and far more code than three bar charts need.

use std::fmt::Write as _;

use crate::bench::{BenchResults, SetupResults};
use crate::report::Report;

const PANEL_W: f64 = 400.0;
const PANEL_H: f64 = 300.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 56.0;
const BOTTOM: f64 = 44.0;
/// One colour per series (a setup for one variant), in the order the benchmark ran them.
const COLORS: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#ffbe7d", "#e15759", "#59a14f", "#8cd17d", "#b6992d", "#76b7b2",
    "#b07aa1", "#9c755f",
];

fn color(series: usize) -> &'static str {
    COLORS[series % COLORS.len()]
}

/// A series' legend: its setup, and the variant for B and C.
fn legend(s: &SetupResults) -> String {
    match s.variant {
        Some(v) => format!("{} ({v})", s.setup.short()),
        None => s.setup.short().to_owned(),
    }
}

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
    let width = PANEL_W * PANELS.len() as f64;
    let legend_height = 14.0 * results.setups.len().div_ceil(3).max(1) as f64;
    let height = PANEL_H + 26.0 + legend_height;
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
    let series = &results.setups;
    let columns = series.len().clamp(1, 3);
    let legend_rows = series.len().div_ceil(columns);
    for (i, s) in series.iter().enumerate() {
        let x = width / 2.0 - 600.0 + (i % columns) as f64 * 400.0;
        let y = 30.0 + (i / columns) as f64 * 14.0;
        let _ = writeln!(
            out,
            r#"<rect x="{x}" y="{y}" width="10" height="10" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            color(i),
            x + 14.0,
            y + 9.0,
            escape(&legend(s))
        );
    }
    for (i, panel) in PANELS.iter().enumerate() {
        let x0 = i as f64 * PANEL_W;
        let y0 = 26.0 + 14.0 * legend_rows as f64;
        let plot_w = PANEL_W - LEFT - RIGHT;
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
            let _ = writeln!(
                out,
                r#"<rect x="{bx:.1}" y="{by:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{} at concurrency {}: {}</title></rect><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="8">{}</text>"#,
                bar_w - 1.0,
                bottom - by,
                color(*si),
                escape(&legend(&series[*si])),
                concurrencies[*ci],
                label(*v),
                bx + bar_w / 2.0,
                by - 3.0,
                label(*v)
            );
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
