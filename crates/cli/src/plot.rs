//! SVG figures (plotters): the overhead-versus-memory trade-off of `pebble sweep` and the
//! memory timeline of `pebble simulate --timeline`.

use std::path::Path;

use anyhow::anyhow;
use pebble_sim::MemoryPoint;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::source::{write_file, Units};

/// Matplotlib's `tab10`: ten colors told apart easily, also in print.
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

const SIZE: (u32, u32) = (960, 600);

/// Draws the legend at `position` and renders the figure into its string.
fn legend_and_present<'a, 'b: 'a>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    root: &DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    position: SeriesLabelPosition,
    draw_err: &dyn Fn(&dyn std::fmt::Display) -> anyhow::Error,
) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| draw_err(&e))?;
    root.present().map_err(|e| draw_err(&e))
}

/// Divisor and axis name of sizes.
fn size_axis(units: Units, what: &str) -> (f64, String) {
    match units {
        Units::Bytes => ((1u64 << 30) as f64, format!("{what} (GiB)")),
        Units::Plain => (1.0, format!("{what} (units)")),
    }
}

/// An axis range around `[lo, hi]` with a little room on both sides, never empty.
fn padded(lo: f64, hi: f64) -> std::ops::Range<f64> {
    let span = hi - lo;
    let pad = if span > 0.0 { span * 0.04 } else { hi.abs().max(1.0) * 0.05 };
    (lo - pad)..(hi + pad)
}

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
    title: &str,
    units: Units,
    budgets: (u64, u64),
    store_all: u64,
    curves: &[Curve],
) -> anyhow::Result<()> {
    let (scale, x_desc) = size_axis(units, "memory budget");
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
            .caption(title, ("sans-serif", 22))
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
            for run in points.split(|p| p.is_none()).filter(|r| !r.is_empty()) {
                let run: Vec<(f64, f64)> = run.iter().flatten().copied().collect();
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
    write_file(path, "--svg", &svg)
}

/// A black diamond, store-all's marker.
fn diamond((x, y): (i32, i32)) -> Polygon<(i32, i32)> {
    Polygon::new(vec![(x, y - 7), (x + 6, y), (x, y + 7), (x - 6, y)], BLACK.filled())
}

/// Plots device memory over time as steps, with the budget as a red line, and writes
/// the SVG.
pub fn timeline(
    path: &Path,
    title: &str,
    timeline: &[MemoryPoint],
    makespan: f64,
    budget: Option<u64>,
    units: Units,
) -> anyhow::Result<()> {
    let (scale, y_desc) = size_axis(units, "device memory");
    let x_desc = match units {
        Units::Bytes => "time (s)",
        Units::Plain => "time (units)",
    };
    let draw_err = |e: &dyn std::fmt::Display| anyhow!("--timeline `{}`: cannot draw the plot: {e}", path.display());
    let mut steps: Vec<(f64, f64)> = Vec::with_capacity(2 * timeline.len() + 1);
    for p in timeline {
        if let Some(&(_, last)) = steps.last() {
            steps.push((p.time, last));
        }
        steps.push((p.time, p.bytes as f64 / scale));
    }
    if let Some(&(t, last)) = steps.last() {
        if makespan > t {
            steps.push((makespan, last));
        }
    }
    let end = steps.iter().map(|p| p.0).fold(makespan, f64::max);
    let top = steps.iter().map(|p| p.1).fold(budget.map_or(0.0, |b| b as f64 / scale), f64::max);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..if end > 0.0 { end } else { 1.0 }, 0.0..if top > 0.0 { top * 1.08 } else { 1.0 })
            .map_err(|e| draw_err(&e))?;
        chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw().map_err(|e| draw_err(&e))?;
        chart
            .draw_series(LineSeries::new(steps, COLORS[0].stroke_width(2)))
            .map_err(|e| draw_err(&e))?
            .label("in use")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], COLORS[0].stroke_width(2)));
        if let Some(b) = budget {
            let b = b as f64 / scale;
            chart
                .draw_series(LineSeries::new(vec![(0.0, b), (end, b)], COLORS[3].stroke_width(1)))
                .map_err(|e| draw_err(&e))?
                .label("budget")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], COLORS[3].stroke_width(1)));
        }
        legend_and_present(&mut chart, &root, SeriesLabelPosition::LowerRight, &draw_err)?;
    }
    write_file(path, "--timeline", &svg)
}
