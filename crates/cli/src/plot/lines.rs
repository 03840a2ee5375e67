//! The experiments' charts: lines with markers ([`lines`], [`lines_with`]) and grouped
//! bars ([`bars`]).

use anyhow::anyhow;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{fitting_size, legend_and_present, padded, reference_line, runs, COLORS, SIZE};

/// One line of [`lines`]: its name and its points, `None` where it has none.
pub type Series = (String, Vec<(f64, Option<f64>)>);

/// A line chart: one line with markers per series, `None` points left out (the line
/// broken there), its y axis from 0. Returns the SVG text.
pub fn lines(title: &str, x_desc: &str, y_desc: &str, series: &[Series]) -> anyhow::Result<String> {
    lines_with(title, x_desc, y_desc, series, &[])
}

/// [`lines`] with dashed horizontal reference lines (value, label) where `references` has
/// any; then the y axis spans the data and the references only, not from 0, so that a
/// band such as 1.0–1.4 fills the chart.
pub fn lines_with(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    references: &[(f64, &str)],
) -> anyhow::Result<String> {
    let draw_err = |e: &dyn std::fmt::Display| anyhow!("cannot draw `{title}`: {e}");
    let xs = series.iter().flat_map(|s| s.1.iter().map(|p| p.0));
    let (x0, x1) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
    let ys = series.iter().flat_map(|s| s.1.iter().filter_map(|p| p.1)).chain(references.iter().map(|r| r.0));
    let (y0, y1) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| (a.min(y), b.max(y)));
    let (x0, x1) = if x0.is_finite() { (x0, x1) } else { (0.0, 1.0) };
    let (y0, y1) = match (y0.is_finite(), references.is_empty()) {
        (false, _) => (0.0, 1.0),
        (true, true) => (y0.min(0.0), y1),
        (true, false) => (y0 - 0.1 * (y1 - y0).max(1e-9), y1),
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", fitting_size(title, 20.0, f64::from(SIZE.0) - 40.0, false)))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(padded(x0, x1), y0..(y1 + 0.3 * (y1 - y0).max(1e-9)))
            .map_err(|e| draw_err(&e))?;
        chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw().map_err(|e| draw_err(&e))?;
        for &(y, label) in references {
            reference_line(&mut chart, (x0, x1), y, (label, 13)).map_err(|e| draw_err(&e))?;
        }
        for (i, (name, points)) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let pts: Vec<Option<(f64, f64)>> = points.iter().map(|&(x, y)| y.map(|y| (x, y))).collect();
            for run in runs(&pts) {
                chart.draw_series(LineSeries::new(run, color.stroke_width(2))).map_err(|e| draw_err(&e))?;
            }
            chart
                .draw_series(pts.iter().flatten().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(|e| draw_err(&e))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        legend_and_present(&mut chart, &root, SeriesLabelPosition::UpperRight, &draw_err)?;
    }
    Ok(svg)
}

/// One series of [`bars`]: its name, its color (an index into [`COLORS`], so that one
/// planner keeps its color across charts) and one value per group, `None` where it has
/// none.
pub struct BarSeries {
    pub name: String,
    pub color: usize,
    pub values: Vec<Option<f64>>,
}

/// Width of [`bars`]' legend panel, right of the plot.
const LEGEND_WIDTH: u32 = 230;

/// A grouped bar chart: one group of bars per entry of `groups`, one bar per series in
/// each, in the series' color, with its value (`label`) above it; a missing value is
/// written "n/a" where its bar would be. The legend is a panel right of the plot. Returns
/// the SVG text.
pub fn bars(
    title: &str,
    y_desc: &str,
    groups: &[String],
    series: &[BarSeries],
    label: impl Fn(f64) -> String,
) -> anyhow::Result<String> {
    let draw_err = |e: &dyn std::fmt::Display| anyhow!("cannot draw `{title}`: {e}");
    let top = series.iter().flat_map(|s| s.values.iter().flatten().copied()).fold(0.0f64, f64::max);
    let top = if top > 0.0 { top * 1.12 } else { 1.0 };
    // Each group spans one unit of x: bars side by side in its middle 80%.
    let width = 0.8 / series.len().max(1) as f64;
    let x = |group: usize, bar: usize| group as f64 + 0.1 + bar as f64 * width;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(&e))?;
        let (plot, legend) = root.split_horizontally(SIZE.0 - LEGEND_WIDTH);
        let mut chart = ChartBuilder::on(&plot)
            .caption(title, ("sans-serif", fitting_size(title, 18.0, f64::from(SIZE.0 - LEGEND_WIDTH) - 40.0, false)))
            .margin(20)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..groups.len().max(1) as f64, 0.0..top)
            .map_err(|e| draw_err(&e))?;
        chart.configure_mesh().disable_x_mesh().x_labels(0).y_desc(y_desc).draw().map_err(|e| draw_err(&e))?;
        let value_style = ("sans-serif", 13).into_text_style(&plot).pos(Pos::new(HPos::Center, VPos::Bottom));
        for (j, s) in series.iter().enumerate() {
            let color = COLORS[s.color % COLORS.len()];
            for (i, value) in s.values.iter().enumerate().take(groups.len()) {
                let (x0, x1) = (x(i, j), x(i, j) + width * 0.9);
                let (cx, y) = ((x0 + x1) / 2.0, value.unwrap_or(0.0));
                if let Some(v) = value {
                    chart
                        .draw_series(std::iter::once(Rectangle::new([(x0, 0.0), (x1, *v)], color.filled())))
                        .map_err(|e| draw_err(&e))?;
                }
                let (px, py) = chart.backend_coord(&(cx, y));
                let text = value.map_or("n/a".to_string(), &label);
                root.draw(&Text::new(text, (px, py - 2), value_style.clone())).map_err(|e| draw_err(&e))?;
            }
        }
        let group_style = ("sans-serif", 15).into_text_style(&plot).pos(Pos::new(HPos::Center, VPos::Top));
        for (i, name) in groups.iter().enumerate() {
            let (px, py) = chart.backend_coord(&(i as f64 + 0.5, 0.0));
            root.draw(&Text::new(name.as_str(), (px, py + 8), group_style.clone())).map_err(|e| draw_err(&e))?;
        }
        let name_style = ("sans-serif", 14).into_text_style(&legend).pos(Pos::new(HPos::Left, VPos::Center));
        for (j, s) in series.iter().enumerate() {
            let y = 70 + 24 * j as i32;
            let color = COLORS[s.color % COLORS.len()];
            legend.draw(&Rectangle::new([(10, y - 7), (28, y + 7)], color.filled())).map_err(|e| draw_err(&e))?;
            legend.draw(&Text::new(s.name.as_str(), (36, y), name_style.clone())).map_err(|e| draw_err(&e))?;
        }
        root.present().map_err(|e| draw_err(&e))?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_bars_draw_one_rectangle_per_value_and_name_each_group_and_series() {
        let groups = vec!["ResNet-50".to_string(), "ResNet-101".to_string()];
        let series = vec![
            BarSeries { name: "rotor".into(), color: 0, values: vec![Some(3.32), Some(4.83)] },
            BarSeries { name: "delta".into(), color: 1, values: vec![Some(4.72), None] },
        ];
        let svg = bars("max batch", "× store-all", &groups, &series, |v| format!("{v:.2}×")).expect("drawn");
        for text in ["ResNet-50", "ResNet-101", "rotor", "delta", "3.32×", "4.83×", "4.72×", "n/a"] {
            assert!(svg.contains(text), "{text} missing");
        }
        // The background, the plot's, three bars and two legend swatches.
        let filled = |c: RGBColor| format!("fill=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2);
        assert_eq!(svg.matches(&filled(COLORS[0])).count(), 3, "rotor: two bars and a swatch");
        assert_eq!(svg.matches(&filled(COLORS[1])).count(), 2, "delta: one bar and a swatch");
    }
}
