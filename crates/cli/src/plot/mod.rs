//! SVG figures (plotters): the overhead-versus-memory trade-off of `pebble sweep` and its
//! throughput-versus-peak chart ([`sweep`]), the timeline of one schedule (`pebble plan
//! --timeline`, `pebble simulate --timeline`: compute ops, device→host and host→device
//! transfers, and device memory, on one time axis; [`timeline`]), and the line and bar
//! charts of the experiments ([`lines`]). What they share is here: colors, axes, legends.

mod lines;
mod sweep;
mod timeline;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

pub use lines::{bars, lines, lines_with, BarSeries, Series};
pub use sweep::{sweep, throughput, Curve, Throughput};
pub use timeline::{timeline, Bar, BarKind, Timeline};

use crate::source::Units;

/// Matplotlib's `tab10`: ten colors told apart easily, also in print.
pub(crate) const COLORS: [RGBColor; 10] = [
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

pub(crate) const SIZE: (u32, u32) = (960, 600);

/// Draws the legend at `position` and renders the figure into its string.
pub(crate) fn legend_and_present<'a, 'b: 'a>(
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
fn size_axis(units: Units, what: &str, largest: u64) -> (f64, String) {
    match units {
        Units::Bytes => {
            let (shift, unit) = match largest {
                b if b >= 1 << 30 => (30, "GiB"),
                b if b >= 1 << 20 => (20, "MiB"),
                _ => (10, "KiB"),
            };
            ((1u64 << shift) as f64, format!("{what} ({unit})"))
        }
        Units::Plain => (1.0, format!("{what} (units)")),
    }
}

/// The font size at which `text` fits in `width` pixels: `size`, or smaller for a long
/// title (a model's label grows with its options), never below 9. Bold text is estimated
/// as [`text_width`] does (0.6 em a character), regular text at 0.55 em (DejaVu Sans, the
/// usual renderer's sans-serif, sets pebble's figure lines, digits and `·` among them, at
/// 0.49–0.54 em).
pub(crate) fn fitting_size(text: &str, size: f64, width: f64, bold: bool) -> f64 {
    let at_size = text_width(text, size) * if bold { 1.0 } else { 0.55 / 0.6 };
    if at_size <= width {
        size
    } else {
        (size * width / at_size).max(9.0)
    }
}

/// An axis range around `[lo, hi]` with a little room on both sides, never empty.
fn padded(lo: f64, hi: f64) -> std::ops::Range<f64> {
    let span = hi - lo;
    let pad = if span > 0.0 { span * 0.04 } else { hi.abs().max(1.0) * 0.05 };
    (lo - pad)..(hi + pad)
}

/// What a legend marks a series with no point in its chart by.
/// The runs of consecutive points of a broken line (`None` breaks it), each drawn as
/// one line.
pub(crate) fn runs(points: &[Option<(f64, f64)>]) -> Vec<Vec<(f64, f64)>> {
    points.split(|p| p.is_none()).filter(|r| !r.is_empty()).map(|r| r.iter().flatten().copied().collect()).collect()
}

pub const NO_FEASIBLE_POINT: &str = "(no feasible point)";

/// The legend entry of a series of `(x, y)` points (`None` where it has none, as in
/// [`Series`] and Ch. 4's panels): its name, and [`NO_FEASIBLE_POINT`] after it when
/// not one point is drawn, so that an entry with no line in the chart reads as what it
/// is. Any chart can call it on its series' names before drawing.
pub fn legend_name(name: &str, points: &[(f64, Option<f64>)]) -> String {
    if points.iter().any(|p| p.1.is_some()) {
        name.to_string()
    } else {
        format!("{name} {NO_FEASIBLE_POINT}")
    }
}

/// Estimated width in pixels of `text` at plotters' font size `size` (sans-serif: about
/// 0.6 em a character; an SVG has no font metrics to ask).
fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * 0.6 * size / 1.24
}

/// A dashed horizontal line at `y` from `x.0` to `x.1`, its label (in `font`-point text)
/// at its left end: a reference value on a chart ([`lines_with`], Ch. 4's panels).
pub(crate) fn reference_line<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    x: (f64, f64),
    y: f64,
    (label, font): (&str, u32),
) -> Result<(), String> {
    let line = DashedLineSeries::new(vec![(x.0, y), (x.1, y)], 8, 5, BLACK.mix(0.5).stroke_width(1));
    chart.draw_series(line).map_err(|e| e.to_string())?;
    let text = Text::new(label.to_string(), (x.0, y), ("sans-serif", font).into_font().color(&BLACK.mix(0.7)));
    chart.draw_series(std::iter::once(text)).map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_line_splits_into_runs() {
        let r = runs(&[None, Some((2.0, 3.0)), Some((3.0, 4.0)), None, Some((5.0, 1.0))]);
        assert_eq!(r, vec![vec![(2.0, 3.0), (3.0, 4.0)], vec![(5.0, 1.0)]]);
    }

    #[test]
    fn a_series_with_no_point_is_marked_in_the_legend() {
        assert_eq!(legend_name("rotor", &[(1.0, None), (2.0, Some(3.0))]), "rotor");
        assert_eq!(legend_name("paged-adam", &[(1.0, None), (2.0, None)]), "paged-adam (no feasible point)");
        assert_eq!(legend_name("l2l", &[]), "l2l (no feasible point)");
    }

    #[test]
    fn the_memory_axis_counts_in_the_unit_of_its_largest_value() {
        assert_eq!(size_axis(Units::Bytes, "m", 5 << 30), ((1u64 << 30) as f64, "m (GiB)".to_string()));
        assert_eq!(size_axis(Units::Bytes, "m", 1 << 30).1, "m (GiB)");
        assert_eq!(size_axis(Units::Bytes, "m", (1 << 30) - 1), ((1u64 << 20) as f64, "m (MiB)".to_string()));
        assert_eq!(size_axis(Units::Bytes, "m", 900 << 10), (1024.0, "m (KiB)".to_string()));
        assert_eq!(size_axis(Units::Plain, "m", 5 << 30), (1.0, "m (units)".to_string()));
    }

    #[test]
    fn a_long_title_is_set_smaller_to_fit_the_chart() {
        assert_eq!(fitting_size("pofo on gpt2-small", 24.0, 1180.0, true), 24.0);
        let long = "x".repeat(120);
        let size = fitting_size(&long, 24.0, 1180.0, true);
        assert!(size < 24.0, "{size}");
        assert!((text_width(&long, size) - 1180.0).abs() < 1e-6, "{}", text_width(&long, size));
        // Regular text is narrower: the same line fits at a larger size.
        let regular = fitting_size(&long, 24.0, 1180.0, false);
        assert!((regular - size * 0.6 / 0.55).abs() < 1e-9, "{regular} against {size}");
        // Never unreadably small.
        assert_eq!(fitting_size(&"x".repeat(10_000), 24.0, 1180.0, true), 9.0);
    }
}
