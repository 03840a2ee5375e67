//! Fig. 7.3's chart as the thesis draws it: each solver's achieved period by memory, a
//! solid line, and the period its own DP expected (MadPipe's phase 1, PipeDream's DP), a
//! dashed line of the same color. A solver with no point says so in the legend.

use anyhow::anyhow;
use plotters::prelude::*;

use crate::plot::{legend_and_present, legend_name, COLORS, SIZE};

/// One solver's points by memory: achieved and expected periods, `None` where it has none.
pub struct PeriodLine {
    /// The solver.
    pub name: String,
    /// The simulated period at each memory.
    pub achieved: Vec<(f64, Option<f64>)>,
    /// The period its DP expected at each memory (empty if it has none).
    pub expected: Vec<(f64, Option<f64>)>,
}

/// The runs of consecutive points of a broken line, as [`crate::plot::runs`] takes them.
fn runs(points: &[(f64, Option<f64>)]) -> Vec<Vec<(f64, f64)>> {
    let pts: Vec<Option<(f64, f64)>> = points.iter().map(|&(x, y)| y.map(|y| (x, y))).collect();
    crate::plot::runs(&pts)
}

/// The chart's SVG: solid achieved periods with markers, dashed expected ones, the y axis
/// from 0.
pub fn periods(title: &str, x_desc: &str, y_desc: &str, lines: &[PeriodLine]) -> anyhow::Result<String> {
    let draw_err = |e: &dyn std::fmt::Display| anyhow!("cannot draw `{title}`: {e}");
    let all = lines.iter().flat_map(|l| l.achieved.iter().chain(&l.expected));
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for &(x, y) in all {
        (x0, x1) = (x0.min(x), x1.max(x));
        y1 = y1.max(y.unwrap_or(0.0));
    }
    let (x0, x1) = if x0.is_finite() { (x0, x1) } else { (0.0, 1.0) };
    let y1 = if y1 > 0.0 { y1 * 1.3 } else { 1.0 };
    let pad = (x1 - x0).max(1.0) * 0.04;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d((x0 - pad)..(x1 + pad), 0.0..y1)
            .map_err(|e| draw_err(&e))?;
        chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw().map_err(|e| draw_err(&e))?;
        for (i, line) in lines.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            for run in runs(&line.achieved) {
                chart.draw_series(LineSeries::new(run, color.stroke_width(2))).map_err(|e| draw_err(&e))?;
            }
            let marks = line.achieved.iter().filter_map(|&(x, y)| y.map(|y| Circle::new((x, y), 4, color.filled())));
            chart
                .draw_series(marks)
                .map_err(|e| draw_err(&e))?
                .label(legend_name(&line.name, &line.achieved))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            let expected = runs(&line.expected);
            for (k, run) in expected.iter().enumerate() {
                let dashed = DashedLineSeries::new(run.clone(), 7, 5, color.stroke_width(2));
                let drawn = chart.draw_series(dashed).map_err(|e| draw_err(&e))?;
                if k == 0 {
                    drawn.label(format!("{}: expected (its DP)", line.name)).legend(move |(x, y)| {
                        EmptyElement::at((x, y))
                            + PathElement::new(vec![(0, 0), (7, 0)], color.stroke_width(2))
                            + PathElement::new(vec![(12, 0), (20, 0)], color.stroke_width(2))
                    });
                }
            }
        }
        legend_and_present(&mut chart, &root, SeriesLabelPosition::UpperRight, &draw_err)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_lines_are_dashed_and_an_empty_solver_says_so() {
        let line = |name: &str, a: Option<f64>, e: Option<f64>| PeriodLine {
            name: name.into(),
            achieved: vec![(3.0, None), (8.0, a), (16.0, a)],
            expected: if e.is_some() { vec![(3.0, None), (8.0, e), (16.0, e)] } else { vec![] },
        };
        let blue = |svg: &str| svg.lines().filter(|l| l.contains("<polyline") && l.contains("#1F77B4")).count();
        // Without an expected line: the solid run 8–16 and its legend sample, 2 polylines
        // in the first color (tab10 blue).
        let solid = periods("t", "x", "y", &[line("madpipe", Some(0.4), None)]).unwrap();
        assert_eq!(blue(&solid), 2);
        assert!(!solid.contains("expected"));
        // With one: its legend sample's two dashes and at least two dashes along 8–16
        // (7 px on, 5 off over some 850 px), far more than 4 more.
        let dashed = periods("t", "x", "y", &[line("madpipe", Some(0.4), Some(0.3))]).unwrap();
        assert!(blue(&dashed) > 2 + 4, "{} polylines", blue(&dashed));
        assert!(dashed.contains("madpipe: expected (its DP)"));
        let empty = periods("t", "x", "y", &[line("interleaved-1f1b", None, None)]).unwrap();
        assert!(empty.contains("interleaved-1f1b (no feasible point)"));
    }
}
