//! `pebble sweep`'s charts: time overhead against the budget ([`sweep`]), and
//! throughput against the simulated peak ([`throughput`]).

use std::path::Path;

use anyhow::anyhow;
use plotters::prelude::*;

use super::{fitting_size, legend_and_present, padded, runs, size_axis, COLORS, SIZE};
use crate::source::{write_new_file, Units};

/// One curve of a sweep: a solver's name and, for each budget, its overhead in percent
/// (`None` where it is infeasible).
pub struct Curve {
    /// The legend entry.
    pub name: String,
    /// `(budget, overhead %)`, one per budget.
    pub points: Vec<(u64, Option<f64>)>,
}

/// Plots overhead against budget, one line with markers per solver, and writes the SVG.
/// Lines connect consecutive feasible budgets only. Budgets where a solver finds no
/// schedule get a small × of its color in a strip under the axis's zero, labelled
/// "infeasible", one row per solver; what store-all needs (100%, no overhead) is a black
/// diamond with a dashed line up from it.
pub fn sweep(
    path: &Path,
    force: bool,
    title: &str,
    units: Units,
    budgets: (u64, u64),
    store_all: u64,
    curves: &[Curve],
) -> anyhow::Result<()> {
    let (scale, x_desc) = size_axis(units, "memory budget", budgets.1.max(store_all));
    let draw_err = |e: &dyn std::fmt::Display| anyhow!("--svg `{}`: cannot draw the plot: {e}", path.display());
    let overheads = curves.iter().flat_map(|c| c.points.iter().filter_map(|p| p.1));
    let (ymin, ymax) = overheads.fold((0.0f64, 0.0f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let span = if ymax > ymin { ymax - ymin } else { 1.0 };
    // The strip for infeasible points, under everything feasible: one row per solver.
    let row = 0.03 * span;
    let strip_top = ymin.min(0.0) - 0.03 * span;
    let strip = strip_top - row * curves.len().max(1) as f64;
    let row_y = |i: usize| strip_top - row * (i as f64 + 0.5);
    let x_hi = budgets.1.max(store_all);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", fitting_size(title, 22.0, f64::from(SIZE.0) - 40.0, false)))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(
                padded(budgets.0 as f64 / scale, x_hi as f64 / scale),
                // Room under zero for the infeasible strip, above the curves for the legend.
                (strip - 0.02 * span)..(ymax.max(0.0) + 0.35 * span),
            )
            .map_err(|e| draw_err(&e))?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc("time overhead over store-all (%)")
            .draw()
            .map_err(|e| draw_err(&e))?;
        let x = store_all as f64 / scale;
        chart
            .draw_series(DashedLineSeries::new(
                vec![(x, strip), (x, ymax.max(0.0) + 0.1 * span)],
                4,
                4,
                BLACK.mix(0.5).stroke_width(1),
            ))
            .map_err(|e| draw_err(&e))?;
        chart
            .draw_series(std::iter::once(EmptyElement::at((x, 0.0)) + diamond((0, 0))))
            .map_err(|e| draw_err(&e))?
            .label("what store-all needs (100%)")
            .legend(|(x, y)| EmptyElement::at((x + 12, y)) + diamond((0, 0)));
        chart
            .draw_series(std::iter::once(Text::new(
                "infeasible",
                (budgets.0 as f64 / scale, strip_top + 0.035 * span),
                ("sans-serif", 13).into_font().color(&BLACK.mix(0.6)),
            )))
            .map_err(|e| draw_err(&e))?;
        for (i, curve) in curves.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let y = row_y(i);
            let infeasible = curve.points.iter().filter(|p| p.1.is_none()).map(|&(b, _)| (b as f64 / scale, y));
            chart.draw_series(infeasible.map(|p| Cross::new(p, 4, color.stroke_width(2)))).map_err(|e| draw_err(&e))?;
            let points: Vec<Option<(f64, f64)>> =
                curve.points.iter().map(|&(b, y)| y.map(|y| (b as f64 / scale, y))).collect();
            for run in runs(&points) {
                chart.draw_series(LineSeries::new(run, color.stroke_width(2))).map_err(|e| draw_err(&e))?;
            }
            // Markers differ in shape too, so that coinciding points stay readable.
            let feasible = points.iter().flatten().copied();
            macro_rules! markers {
                ($marker:expr) => {{
                    let marker = $marker;
                    chart
                        .draw_series(feasible.map(|p| EmptyElement::at(p) + marker((0, 0))))
                        .map_err(|e| draw_err(&e))?
                        .label(curve.name.as_str())
                        .legend(move |(x, y)| {
                            EmptyElement::at((x, y))
                                + PathElement::new(vec![(0, 0), (24, 0)], color.stroke_width(2))
                                + marker((12, 0))
                        });
                }};
            }
            match i % 4 {
                0 => markers!(move |c| Circle::new(c, 4, color.filled())),
                1 => markers!(move |c| TriangleMarker::new(c, 6, color.filled())),
                2 => {
                    markers!(move |(x, y): (i32, i32)| Rectangle::new([(x - 4, y - 4), (x + 4, y + 4)], color.filled()))
                }
                _ => markers!(move |c| Cross::new(c, 5, color.stroke_width(2))),
            }
        }
        legend_and_present(&mut chart, &root, SeriesLabelPosition::UpperRight, &draw_err)?;
    }
    write_new_file(path, "--svg", &svg, force)
}

/// A black diamond, store-all's marker.
fn diamond((x, y): (i32, i32)) -> Polygon<(i32, i32)> {
    Polygon::new(vec![(x, y - 7), (x + 6, y), (x, y + 7), (x - 6, y)], BLACK.filled())
}

/// One column of a throughput chart: a solver's schedules as `(peak bytes, throughput)`,
/// and whether they are drawn as separate schedules (markers with no line between them:
/// `sequential`'s segment counts, as Shilova's Fig. 2.5 draws them) or as one curve.
pub struct Throughput {
    /// The legend entry.
    pub name: String,
    /// `(simulated peak, samples per second)`, one per distinct schedule.
    pub points: Vec<(u64, f64)>,
    /// Markers only, no line.
    pub separate: bool,
}

/// Plots throughput against the simulated peak memory (Shilova's Fig. 2.5), writes the
/// SVG: a line with markers per solver, its points in order of peak, and crosses with no
/// line for a solver whose points are separate schedules. Solvers with no point are named
/// in the legend as such ([`super::legend_name`]). The y axis starts at 0.
pub fn throughput(
    path: &Path,
    force: bool,
    (title, y_desc): (&str, &str),
    units: Units,
    columns: &[Throughput],
) -> anyhow::Result<()> {
    let largest = columns.iter().flat_map(|c| c.points.iter().map(|p| p.0)).max().unwrap_or(0);
    let (scale, x_desc) = size_axis(units, "simulated peak memory", largest);
    let draw_err = |e: &dyn std::fmt::Display| anyhow!("--svg `{}`: cannot draw the plot: {e}", path.display());
    let drawn: Vec<Vec<(f64, f64)>> = columns
        .iter()
        .map(|c| {
            let mut points: Vec<(f64, f64)> = c.points.iter().map(|&(m, t)| (m as f64 / scale, t)).collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
            points
        })
        .collect();
    let xs = drawn.iter().flatten().map(|p| p.0);
    let (x0, x1) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
    let (x0, x1) = if x0.is_finite() { (x0, x1) } else { (0.0, 1.0) };
    let top = drawn.iter().flatten().map(|p| p.1).fold(0.0f64, f64::max);
    let top = if top > 0.0 { top } else { 1.0 };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", fitting_size(title, 22.0, f64::from(SIZE.0) - 40.0, false)))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(padded(x0, x1), 0.0..top * 1.1)
            .map_err(|e| draw_err(&e))?;
        chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw().map_err(|e| draw_err(&e))?;
        for (i, (column, points)) in columns.iter().zip(&drawn).enumerate() {
            let color = COLORS[i % COLORS.len()];
            let legend: Vec<(f64, Option<f64>)> = points.iter().map(|&(x, y)| (x, Some(y))).collect();
            let name = super::legend_name(&column.name, &legend);
            if !column.separate {
                chart.draw_series(LineSeries::new(points.clone(), color.stroke_width(2))).map_err(|e| draw_err(&e))?;
            }
            let line = !column.separate;
            macro_rules! markers {
                ($marker:expr) => {{
                    let marker = $marker;
                    chart
                        .draw_series(points.iter().map(|&p| EmptyElement::at(p) + marker((0, 0))))
                        .map_err(|e| draw_err(&e))?
                        .label(name)
                        .legend(move |(x, y)| {
                            let stroke = if line { color.stroke_width(2) } else { TRANSPARENT.stroke_width(0) };
                            EmptyElement::at((x, y)) + PathElement::new(vec![(0, 0), (24, 0)], stroke) + marker((12, 0))
                        });
                }};
            }
            match (column.separate, i % 3) {
                (true, _) => markers!(move |c| Cross::new(c, 6, color.stroke_width(2))),
                (false, 0) => markers!(move |c| Circle::new(c, 4, color.filled())),
                (false, 1) => markers!(move |c| TriangleMarker::new(c, 6, color.filled())),
                _ => {
                    markers!(move |(x, y): (i32, i32)| Rectangle::new([(x - 4, y - 4), (x + 4, y + 4)], color.filled()))
                }
            }
        }
        legend_and_present(&mut chart, &root, SeriesLabelPosition::LowerRight, &draw_err)?;
    }
    write_new_file(path, "--svg", &svg, force)
}
