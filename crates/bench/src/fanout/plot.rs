//! SVG plots of `spindle fanout` results: median latency vs group size,
//! one line per layout, log scale; real runs also draw the cache-line
//! round trip and twice it; simulated ones say SIMULATED in the title.

use std::path::Path;

use plotters::prelude::*;

use super::FanoutReport;

const COLORS: [RGBColor; 4] = [
    RGBColor(0x99, 0x99, 0x99),
    RGBColor(0xdd, 0x6b, 0x20),
    RGBColor(0x80, 0x5a, 0xd5),
    RGBColor(0x2b, 0x6c, 0xb0),
];

/// Plot `report`'s rows (of `cores` cores if given) to `path`.
pub fn write_curves(path: &Path, report: &FanoutReport, cores: Option<usize>) -> Result<(), String> {
    let rows: Vec<_> = report
        .rows
        .iter()
        .filter(|r| cores.is_none_or(|c| r.cores == c))
        .collect();
    if rows.is_empty() {
        return Err("no rows to plot".into());
    }
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    let cores_shown = rows[0].cores;
    let title = if report.simulated {
        format!("SIMULATED: fanout multicast+ack p50 vs group size, {cores_shown} modelled cores ({} tree; calibrated model)", report.shape)
    } else {
        format!(
            "real: fanout multicast+ack p50 vs group size, {cores_shown} slots on {} vCPUs ({}), load {:.2}",
            report.machine.cpus, report.machine.cpu_model, report.load_avg_1m
        )
    };
    let x_max = rows.iter().map(|r| r.members).max().unwrap_or(2) as f64 * 1.2;
    let y_max = rows.iter().map(|r| r.latency_ns.p50).fold(1.0, f64::max) * 2.0;
    let mut y_min = rows.iter().map(|r| r.latency_ns.p50).fold(f64::MAX, f64::min) / 2.0;
    if let Some(p) = &report.probes {
        y_min = y_min.min(p.cache_line_round_trip_ns / 2.0);
    }
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1100, 620)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d((1.5f64..x_max).log_scale(), (y_min.max(1.0)..y_max).log_scale())
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("group size (members, origin included)")
            .y_desc("p50 multicast+ack latency (ns)")
            .draw()
            .map_err(|e| err(&e))?;
        for (i, layout) in ["flat", "tree", "tree_help", "tree_help_skip"].into_iter().enumerate() {
            let color = COLORS[i];
            let points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.layout == layout)
                .map(|r| (r.members as f64, r.latency_ns.p50))
                .collect();
            if points.is_empty() {
                continue;
            }
            let label = if layout == "flat" {
                "flat (smp_call_function_many-like)".to_string()
            } else {
                layout.to_string()
            };
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            chart
                .draw_series(points.iter().map(|p| Circle::new(*p, 4, color.filled())))
                .map_err(|e| err(&e))?;
        }
        if let Some(p) = &report.probes {
            for (factor, name) in [(1.0, "cache-line round trip"), (2.0, "2x round trip")] {
                let y = p.cache_line_round_trip_ns * factor;
                chart
                    .draw_series(LineSeries::new(
                        vec![(1.5, y), (x_max, y)],
                        BLACK.mix(0.4 * factor).stroke_width(1),
                    ))
                    .map_err(|e| err(&e))?
                    .label(format!("{name} ({y:.0} ns)"))
                    .legend(move |(x, yy)| PathElement::new(vec![(x, yy), (x + 20, yy)], BLACK.stroke_width(1)));
            }
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    std::fs::write(path, svg).map_err(|e| format!("plot {}: {e}", path.display()))
}
