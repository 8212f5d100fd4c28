//! SVG plots of `spindle bench` results.
//!
//! One picture, two panels side by side:
//!
//! ```text
//!  ┌ title: transport, mode, members, senders, size, machine ───────────────┐
//!  │ delivered GB/s                    │ latency (ns, log scale)            │
//!  │  ██  ██  ██   ▒▒                  │  ██▒▒      ██▒▒      ██▒▒          │
//!  │  m0  m1  m2  baseline             │  p50       p99       p99.9         │
//!  └───────────────────────────────────┴────────────────────────────────────┘
//! ```
//!
//! Plotters is built without its `ttf` feature: the SVG backend writes
//! `<text>` elements and leaves the glyphs to the viewer, so text needs no
//! font files at plot time.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::BenchReport;

/// Pixels of the whole picture.
const WIDTH_PX: u32 = 1200;
const HEIGHT_PX: u32 = 520;
/// Fraction of a category's width that its bar group leaves empty.
const BAR_GAP: f64 = 0.15;

const MEMBER_COLOR: RGBColor = RGBColor(0x2b, 0x6c, 0xb0);
const BASELINE_COLOR: RGBColor = RGBColor(0x99, 0x99, 0x99);
const OWN_COLOR: RGBColor = RGBColor(0x38, 0xa1, 0x69);
const SLOWEST_COLOR: RGBColor = RGBColor(0xdd, 0x6b, 0x20);

/// Write the bench plot of `report` to `path` as SVG.
pub fn write_bench_plot(path: &Path, report: &BenchReport) -> Result<(), String> {
    let svg = render_bench_svg(report).map_err(|e| format!("plot {}: drawing failed: {e}", path.display()))?;
    assert!(svg.starts_with("<svg"), "the SVG backend writes an <svg> root");
    std::fs::write(path, svg).map_err(|e| format!("plot {}: {e}", path.display()))
}

/// The whole picture as an SVG document.
fn render_bench_svg(report: &BenchReport) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH_PX, HEIGHT_PX)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let body = root
            .titled(&title(report), ("sans-serif", 20).into_font())
            .map_err(err)?;
        let (left, right) = body.split_horizontally(WIDTH_PX / 2);
        draw_bandwidth(&left, report)?;
        draw_latency(&right, report)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn title(report: &BenchReport) -> String {
    let mut title = format!(
        "spindle bench multicast: {} {}, {} members, senders {}, {} B messages",
        nonempty(&report.transport, "shm"),
        nonempty(&report.mode, "?"),
        report.members,
        nonempty(&report.senders, "?"),
        report.size
    );
    if !report.machine.cpu_model.is_empty() {
        title.push_str(&format!(" ({})", report.machine.cpu_model));
    }
    title
}

fn nonempty<'a>(s: &'a str, fallback: &'a str) -> &'a str {
    if s.is_empty() {
        fallback
    } else {
        s
    }
}

/// NaN and infinities (a run that delivered nothing) plot as zero.
fn finite(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 {
        x
    } else {
        0.0
    }
}

/// Left panel: delivered GB/s of each member, then the raw shm baseline.
fn draw_bandwidth(area: &DrawingArea<SVGBackend<'_>, Shift>, report: &BenchReport) -> Result<(), String> {
    let mut bars: Vec<(String, f64, RGBColor)> = report
        .member_results
        .iter()
        .map(|m| (format!("member {}", m.rank), finite(m.delivered_gbps), MEMBER_COLOR))
        .collect();
    bars.push((
        "raw shm baseline".to_string(),
        finite(report.baseline_gbps),
        BASELINE_COLOR,
    ));
    let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let y_max = bars.iter().map(|b| b.1).fold(0.0, f64::max).max(0.001) * 1.15;
    let n = bars.len();

    let caption = if finite(report.ratio_to_baseline) > 0.0 {
        format!(
            "delivered GB/s (slowest {:.2}, {:.0}% of baseline)",
            finite(report.delivered_gbps_min),
            report.ratio_to_baseline * 100.0
        )
    } else {
        format!("delivered GB/s (slowest {:.2})", finite(report.delivered_gbps_min))
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(Categories { count: n }, 0.0..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| category_label(&labels, *x))
        .y_desc("GB/s")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (_, v, color))| {
            let x0 = i as f64 + BAR_GAP;
            let x1 = i as f64 + 1.0 - BAR_GAP;
            Rectangle::new([(x0, 0.0), (x1, *v)], color.filled())
        }))
        .map_err(err)?;
    chart
        .draw_series(
            bars.iter()
                .enumerate()
                .map(|(i, (_, v, _))| Text::new(format!("{v:.2}"), (i as f64 + 0.5, *v), value_label_style(13))),
        )
        .map_err(err)?;
    Ok(())
}

/// Right panel: p50 / p99 / p99.9 latency to the sender's own member and
/// to the slowest member, log scale.
fn draw_latency(area: &DrawingArea<SVGBackend<'_>, Shift>, report: &BenchReport) -> Result<(), String> {
    let own = &report.latency_own_ns;
    let slowest = &report.latency_ns;
    let labels: Vec<String> = ["p50", "p99", "p99.9"].iter().map(|s| s.to_string()).collect();
    let series: [(&str, [u64; 3], RGBColor); 2] = [
        ("to own member", [own.p50, own.p99, own.p999], OWN_COLOR),
        (
            "to slowest member",
            [slowest.p50, slowest.p99, slowest.p999],
            SLOWEST_COLOR,
        ),
    ];
    let value_max = series
        .iter()
        .flat_map(|s| s.1.iter().copied())
        .max()
        .unwrap_or(0)
        .max(10) as f64;
    // The log axis starts at 1 ns: a bar of value v spans 1..v.
    let y_min = 1.0;
    let y_max = value_max * 3.0;
    let n = labels.len();

    let mut chart = ChartBuilder::on(area)
        .caption("latency, send commit → delivery (ns, log scale)", ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(Categories { count: n }, (y_min..y_max).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| category_label(&labels, *x))
        .y_label_formatter(&|y| format_ns(*y))
        .y_desc("ns")
        .draw()
        .map_err(err)?;
    let width = (1.0 - 2.0 * BAR_GAP) / series.len() as f64;
    for (s, (name, values, color)) in series.iter().enumerate() {
        let color = *color;
        let x_of = move |i: usize| i as f64 + BAR_GAP + s as f64 * width;
        chart
            .draw_series(values.iter().enumerate().map(|(i, v)| {
                let top = (*v as f64).max(y_min);
                Rectangle::new([(x_of(i), y_min), (x_of(i) + width, top)], color.filled())
            }))
            .map_err(err)?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        chart
            .draw_series(values.iter().enumerate().map(|(i, v)| {
                let top = (*v as f64).max(y_min);
                Text::new(
                    format_ns(*v as f64),
                    (x_of(i) + width / 2.0, top),
                    value_label_style(12),
                )
            }))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// An x axis of `count` categories: category `i` spans `i..i + 1`, its one
/// tick and label sit at its center. (Plotters' `with_key_points` would do,
/// but over `f64` it drops the label formatter that `configure_mesh` needs.)
struct Categories {
    count: usize,
}

impl Ranged for Categories {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let fraction = value / self.count.max(1) as f64;
        limit.0 + (fraction * (limit.1 - limit.0) as f64).round() as i32
    }

    fn key_points<Hint: plotters::coord::ranged1d::KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            return Vec::new(); // no light grid lines between categories
        }
        (0..self.count).map(|i| i as f64 + 0.5).collect()
    }

    fn range(&self) -> std::ops::Range<f64> {
        0.0..self.count as f64
    }
}

fn category_label(labels: &[String], x: f64) -> String {
    let i = x.floor();
    if i >= 0.0 && (i as usize) < labels.len() {
        labels[i as usize].clone()
    } else {
        String::new()
    }
}

/// Centered on its x, sitting on its y: for the value above a bar.
fn value_label_style(size_px: u32) -> TextStyle<'static> {
    TextStyle::from(("sans-serif", size_px).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom))
}

/// `950 ns`, `12.3 µs`, `4.1 ms`.
fn format_ns(ns: f64) -> String {
    if ns < 1_000.0 {
        format!("{ns:.0} ns")
    } else if ns < 1_000_000.0 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns < 1_000_000_000.0 {
        format!("{:.1} ms", ns / 1e6)
    } else {
        format!("{:.1} s", ns / 1e9)
    }
}

/// Write `spindle dds perf`'s picture: NAPA's window occupancy and high
/// threshold W (left) and its inter-sample gap (right) over time, with
/// the run's latency and throughput in the title.
///
/// ```text
///  ┌ title: size, reliability, napa, latency p50/p99, throughput ───────────┐
///  │ occupancy (slots) ── and W ‥‥     │ gap (µs) ──                         │
///  └───────────────────────────────────┴─────────────────────────────────────┘
/// ```
pub fn write_napa_plot(path: &Path, result: &crate::dds_perf::PerfResult) -> Result<(), String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH_PX, HEIGHT_PX)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let title = format!(
            "spindle dds perf {} {} B {}, napa {}: p50 {:.1} µs, p99 {:.1} µs, {:.0} Mb/s",
            result.transport,
            result.size,
            if result.reliable { "reliable" } else { "best-effort" },
            if result.napa { "on" } else { "off" },
            result.latency_ns.p50 as f64 / 1e3,
            result.latency_ns.p99 as f64 / 1e3,
            result.throughput_mbps
        );
        let body = root.titled(&title, ("sans-serif", 18).into_font()).map_err(err)?;
        let (left, right) = body.split_horizontally(WIDTH_PX / 2);
        let t_max = result.trace.last().map_or(1.0, |p| p.t_s).max(1e-3);
        let occ_max = result
            .trace
            .iter()
            .map(|p| p.occupancy.max(p.high_threshold as u64))
            .max()
            .unwrap_or(1)
            .max(1) as f64
            * 1.1;
        let mut chart = ChartBuilder::on(&left)
            .caption("window occupancy (slots) and W", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..t_max, 0.0..occ_max)
            .map_err(err)?;
        chart.configure_mesh().x_desc("s").draw().map_err(err)?;
        chart
            .draw_series(LineSeries::new(
                result.trace.iter().map(|p| (p.t_s, p.occupancy as f64)),
                &MEMBER_COLOR,
            ))
            .map_err(err)?;
        chart
            .draw_series(LineSeries::new(
                result.trace.iter().map(|p| (p.t_s, p.high_threshold as f64)),
                &SLOWEST_COLOR,
            ))
            .map_err(err)?;
        let gap_max = result.trace.iter().map(|p| p.gap_ns).max().unwrap_or(1).max(1) as f64 / 1e3 * 1.1;
        let mut chart = ChartBuilder::on(&right)
            .caption("NAPA inter-sample gap (µs)", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..t_max, 0.0..gap_max)
            .map_err(err)?;
        chart.configure_mesh().x_desc("s").draw().map_err(err)?;
        chart
            .draw_series(LineSeries::new(
                result.trace.iter().map(|p| (p.t_s, p.gap_ns as f64 / 1e3)),
                &OWN_COLOR,
            ))
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    std::fs::write(path, svg).map_err(|e| format!("plot {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{MemberResult, Percentiles};

    fn synthetic_report() -> BenchReport {
        BenchReport {
            transport: "shm".into(),
            mode: "ordered".into(),
            members: 3,
            senders: "all".into(),
            sender_count: 3,
            size: 10_240,
            count: 1000,
            delivered_gbps_min: 4.2,
            latency_ns: Percentiles {
                p50: 2_500,
                p99: 40_000,
                p999: 900_000,
                max: 2_000_000,
                samples: 3000,
            },
            latency_own_ns: Percentiles {
                p50: 800,
                p99: 9_000,
                p999: 120_000,
                max: 500_000,
                samples: 3000,
            },
            baseline_gbps: 9.7,
            ratio_to_baseline: 4.2 / 9.7,
            member_results: (0..3)
                .map(|rank| MemberResult {
                    rank,
                    delivered_gbps: 4.2 + rank as f64 * 0.1,
                    ..MemberResult::default()
                })
                .collect(),
            ..BenchReport::default()
        }
    }

    #[test]
    fn bench_plot_is_an_svg_with_both_panels() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bench.svg");
        write_bench_plot(&path, &synthetic_report()).expect("plot");
        let svg = std::fs::read_to_string(&path).expect("read plot");
        assert!(svg.starts_with("<svg"), "not an SVG: {}", &svg[..svg.len().min(80)]);
        assert!(svg.contains("baseline"));
        assert!(svg.contains("member 2"));
        assert!(svg.contains("p99.9"));
        assert!(svg.contains("to slowest member"));
    }

    #[test]
    fn bench_plot_of_an_empty_report_still_draws() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("empty.svg");
        let report = BenchReport {
            ratio_to_baseline: f64::NAN,
            ..BenchReport::default()
        };
        write_bench_plot(&path, &report).expect("plot");
        let svg = std::fs::read_to_string(&path).expect("read plot");
        assert!(svg.starts_with("<svg") && svg.contains("baseline"));
    }

    #[test]
    fn bench_plot_error_names_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("no-such-dir").join("bench.svg");
        let e = write_bench_plot(&path, &synthetic_report()).expect_err("missing directory");
        assert!(e.contains("no-such-dir"), "{e}");
    }
}
