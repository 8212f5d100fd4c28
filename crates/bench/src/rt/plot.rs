//! SVG plots of the rt commands.

use std::path::Path;

use plotters::prelude::*;

// ───────────────────────────── plots ─────────────────────────────

pub(super) type Series = Vec<(String, Vec<(f64, f64)>)>;

const PALETTE: [RGBColor; 6] = [
    RGBColor(0x2b, 0x6c, 0xb0),
    RGBColor(0xdd, 0x6b, 0x20),
    RGBColor(0x38, 0xa1, 0x69),
    RGBColor(0x80, 0x5a, 0xd5),
    RGBColor(0xc5, 0x30, 0x30),
    RGBColor(0x71, 0x80, 0x96),
];

pub(super) fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Two line charts side by side; `log2_x` plots x on a log2 scale.
pub(super) fn two_panel_plot(
    path: &Path,
    title: &str,
    left: (&str, &Series),
    right: (&str, &Series),
    log2_x: bool,
) -> Result<(), String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1200, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let body = root.titled(title, ("sans-serif", 18).into_font()).map_err(err)?;
        let (l, r) = body.split_horizontally(600);
        line_chart(&l, left.0, left.1, log2_x)?;
        line_chart(&r, right.0, right.1, log2_x)?;
        root.present().map_err(err)?;
    }
    std::fs::write(path, svg).map_err(|e| format!("plot {}: {e}", path.display()))?;
    println!("plot written to {}", path.display());
    Ok(())
}

pub(super) fn line_chart(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    series: &Series,
    log2_x: bool,
) -> Result<(), String> {
    let tx = |x: f64| if log2_x { x.max(1.0).log2() } else { x };
    let points = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points {
        x0 = x0.min(tx(x));
        x1 = x1.max(tx(x));
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    let pad = ((y1 - y0) * 0.1).max(0.5);
    let (y0, y1) = (y0.min(0.0) - if y0 < 0.0 { pad } else { 0.0 }, y1 + pad);
    let x1 = if x1 <= x0 { x0 + 1.0 } else { x1 };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 14))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_label_formatter(&|x| {
            if log2_x {
                format!("{:.0}", 2f64.powf(*x))
            } else {
                format!("{x:.1}")
            }
        })
        .y_label_formatter(&|y| format!("{y:.1}"))
        .draw()
        .map_err(err)?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let mapped: Vec<(f64, f64)> = pts.iter().map(|&(x, y)| (tx(x), y)).collect();
        chart
            .draw_series(LineSeries::new(mapped.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        if mapped.len() <= 64 {
            chart
                .draw_series(mapped.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(err)?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}
