//! The timeline of one schedule: compute ops, device→host and host→device transfers,
//! and device memory, on one time axis (`pebble plan --timeline`, `pebble simulate
//! --timeline`).

use std::path::Path;

use anyhow::anyhow;
use pebble_sim::SimReport;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{fitting_size, size_axis, text_width, COLORS};
use crate::source::{write_new_file, Units};

/// What a bar of the timeline chart is: its lane, its color and its legend entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarKind {
    /// A forward op run for the first time.
    Forward,
    /// A forward op run again: a recomputation.
    Recompute,
    /// A backward op.
    Backward,
    /// The loss (its forward and backward).
    Loss,
    /// A device→host transfer.
    Offload,
    /// A host→device transfer.
    Prefetch,
    /// An optimizer step on the host CPU.
    CpuUpdate,
}

impl BarKind {
    const ALL: [BarKind; 7] = [
        BarKind::Forward,
        BarKind::Recompute,
        BarKind::Backward,
        BarKind::Loss,
        BarKind::Offload,
        BarKind::Prefetch,
        BarKind::CpuUpdate,
    ];

    /// The lane, from the top: compute, device→host, host→device, host CPU.
    fn lane(self) -> usize {
        match self {
            BarKind::Offload => 1,
            BarKind::Prefetch => 2,
            BarKind::CpuUpdate => 3,
            _ => 0,
        }
    }

    fn fill(self) -> RGBColor {
        match self {
            BarKind::Forward => RGBColor(31, 119, 180),
            BarKind::Recompute => RGBColor(158, 202, 225),
            BarKind::Backward => RGBColor(255, 127, 14),
            BarKind::Loss => RGBColor(148, 103, 189),
            BarKind::Offload => RGBColor(44, 160, 44),
            BarKind::Prefetch => RGBColor(23, 190, 207),
            BarKind::CpuUpdate => RGBColor(140, 86, 75),
        }
    }

    /// Label color: white on the dark fills, black on the light ones.
    fn ink(self) -> RGBColor {
        match self {
            BarKind::Forward | BarKind::Loss | BarKind::Offload | BarKind::CpuUpdate => WHITE,
            BarKind::Recompute | BarKind::Backward | BarKind::Prefetch => BLACK,
        }
    }

    fn name(self) -> &'static str {
        match self {
            BarKind::Forward => "forward",
            BarKind::Recompute => "forward (recomputed)",
            BarKind::Backward => "backward",
            BarKind::Loss => "loss",
            BarKind::Offload => "device→host",
            BarKind::Prefetch => "host→device",
            BarKind::CpuUpdate => "CPU optimizer step",
        }
    }
}

/// One op of a schedule on its lane.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    /// What it is.
    pub kind: BarKind,
    /// When it starts.
    pub start: f64,
    /// When it ends.
    pub end: f64,
    /// Labels to try, most telling first; the first that fits the bar is drawn.
    pub labels: Vec<String>,
}

/// The timeline of one simulated schedule.
pub struct Timeline<'a> {
    /// The title: model, solver, budget.
    pub title: String,
    /// How sizes and times read.
    pub units: Units,
    /// Compute ops and transfers.
    pub bars: Vec<Bar>,
    /// The schedule's offloads, reloads and recomputations.
    pub moves: pebble_schedule::Moves,
    /// The simulator's report (with its memory timeline).
    pub report: &'a SimReport,
    /// The budget line: the bytes the schedule was checked against, and its legend entry.
    pub budget: Option<(u64, String)>,
}

const TIMELINE_SIZE: (u32, u32) = (1200, 720);
/// Height of the title, the figures line and the legend.
const HEAD: u32 = 92;
/// Height of the three lanes.
const LANES: u32 = 200;
/// Width of the lane names and of the memory axis, so that both charts share their x pixels.
const LEFT: u32 = 100;
const LANE_NAMES: [&str; 4] = ["compute", "device→host", "host→device", "host CPU"];
/// The font size of the labels in bars (plotters' size; the SVG's is 1.24 times smaller).
const LABEL_SIZE: f64 = 13.0;

/// A bar in pixels, after narrow neighbours of one kind have been merged.
#[derive(Debug, Clone, PartialEq)]
struct PixelBar<'a> {
    kind: BarKind,
    x0: f64,
    x1: f64,
    /// `None` for merged bars, which get no label.
    labels: Option<&'a [String]>,
}

/// The bars of one lane in pixels (`x` maps a time to a pixel column). Consecutive bars of
/// one kind narrower than a pixel, less than a pixel apart, are drawn as one, so that a
/// schedule of thousands of ops stays a picture of a few thousand rectangles at most.
fn pixel_bars<'a>(bars: impl Iterator<Item = &'a Bar>, x: impl Fn(f64) -> f64) -> Vec<PixelBar<'a>> {
    let mut out: Vec<PixelBar<'a>> = Vec::new();
    for bar in bars {
        let (x0, x1) = (x(bar.start), x(bar.end.max(bar.start)));
        if let Some(last) = out.last_mut() {
            if last.kind == bar.kind && last.x1 - last.x0 < 1.0 && x1 - x0 < 1.0 && x0 - last.x1 < 1.0 {
                last.x1 = last.x1.max(x1);
                last.labels = None;
                continue;
            }
        }
        out.push(PixelBar { kind: bar.kind, x0, x1, labels: Some(&bar.labels) });
    }
    out
}

/// The first label that fits in `width` pixels.
fn fitting_label(labels: &[String], width: i32) -> Option<&str> {
    labels.iter().map(String::as_str).find(|l| text_width(l, LABEL_SIZE) + 4.0 <= width as f64)
}

/// The figures line under the title.
fn timeline_figures(report: &SimReport, moves: pebble_schedule::Moves, units: Units) -> String {
    let share = |busy: f64| {
        if report.makespan > 0.0 {
            format!("{} ({:.0}%)", units.time(busy), 100.0 * busy / report.makespan)
        } else {
            units.time(busy)
        }
    };
    // A periodic schedule is drawn unrolled; its figures are per steady-state period.
    let makespan = if report.periods > 1 {
        format!("{} periods shown; per period: makespan {}", report.periods, units.time(report.makespan))
    } else {
        format!("makespan {}", units.time(report.makespan))
    };
    format!(
        "{makespan} · compute stall {} · device→host busy {} · host→device busy {}{} · device peak {} · host peak {} · \
         {} offloads, {} reloads, {} recomputations",
        share(report.compute_stall),
        share(report.d2h_busy),
        share(report.h2d_busy),
        if report.cpu_busy > 0.0 { format!(" · CPU busy {}", share(report.cpu_busy)) } else { String::new() },
        units.size(report.peak_bytes),
        units.size(report.peak_host_bytes),
        moves.offloads,
        moves.reloads,
        moves.recomputes,
    )
}

/// Draws the timeline of one schedule as an SVG document: three lanes of bars (compute,
/// device→host, host→device) over the device memory curve with its budget, one time axis.
pub fn render_timeline(chart: &Timeline<'_>) -> Result<String, String> {
    let report = chart.report;
    let units = chart.units;
    let largest = report.timeline.iter().map(|p| p.bytes).chain(chart.budget.as_ref().map(|b| b.0)).max();
    let (scale, y_desc) = size_axis(units, "device memory", largest.unwrap_or(0));
    let x_desc = match units {
        Units::Bytes => "time (s)",
        Units::Plain => "time (units)",
    };
    let (steps, end) = memory_steps(report, &chart.bars, scale);
    let budget = chart.budget.as_ref().map(|(b, _)| *b as f64 / scale);
    let top = steps.iter().map(|p| p.1).fold(budget.unwrap_or(0.0), f64::max);
    let top = if top > 0.0 { top * 1.08 } else { 1.0 };

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, TIMELINE_SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|x| x.to_string())?;
        let (head, body) = root.split_vertically(HEAD);
        let (lanes_area, memory_area) = body.split_vertically(LANES);
        draw_head(&head, chart)?;
        draw_lanes(&root, &lanes_area, &chart.bars, end)?;
        draw_memory(&memory_area, steps, budget, (end, top), (x_desc, &y_desc))?;
        root.present().map_err(|x| x.to_string())?;
    }
    Ok(svg)
}

/// The device memory curve as steps of `(time, memory / scale)`, held to the time axis's
/// end, which it returns: the last bar's or step's end, or the makespan (1 if none).
fn memory_steps(report: &SimReport, bars: &[Bar], scale: f64) -> (Vec<(f64, f64)>, f64) {
    let mut steps: Vec<(f64, f64)> = Vec::with_capacity(2 * report.timeline.len() + 1);
    for p in &report.timeline {
        if let Some(&(_, last)) = steps.last() {
            steps.push((p.time, last));
        }
        steps.push((p.time, p.bytes as f64 / scale));
    }
    let end = bars.iter().map(|b| b.end).chain(steps.iter().map(|p| p.0)).fold(report.makespan, f64::max);
    let end = if end > 0.0 && end.is_finite() { end } else { 1.0 };
    if let Some(&(t, last)) = steps.last() {
        if end > t {
            steps.push((end, last));
        }
    }
    (steps, end)
}

/// The timeline's head: the title, the figures, the legend.
fn draw_head(head: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>, chart: &Timeline<'_>) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let width = TIMELINE_SIZE.0 as i32;
    let centered = Pos::new(HPos::Center, VPos::Top);
    let room = f64::from(width) - 20.0;
    let title_size = fitting_size(&chart.title, 24.0, room, true);
    head.draw(&Text::new(
        chart.title.clone(),
        (width / 2, 10),
        ("sans-serif", title_size).into_font().style(FontStyle::Bold).color(&BLACK).pos(centered),
    ))
    .map_err(|x| e(&x))?;
    let figures = timeline_figures(chart.report, chart.moves, chart.units);
    let figures_size = fitting_size(&figures, 15.0, room, false);
    head.draw(&Text::new(
        figures,
        (width / 2, 42),
        ("sans-serif", figures_size).into_font().color(&BLACK.mix(0.75)).pos(centered),
    ))
    .map_err(|x| e(&x))?;
    let kinds: Vec<BarKind> = BarKind::ALL.into_iter().filter(|k| chart.bars.iter().any(|b| b.kind == *k)).collect();
    let legend_font = ("sans-serif", 14).into_font();
    let item = |name: &str| 14.0 + 5.0 + text_width(name, 14.0) + 18.0;
    // A legend entry: a bar's color, or a line (the memory curve's, the budget's).
    let mut items: Vec<(String, Result<RGBColor, RGBColor>)> =
        kinds.iter().map(|k| (k.name().to_string(), Ok(k.fill()))).collect();
    items.push(("device memory".into(), Err(MEMORY)));
    if let Some((_, name)) = &chart.budget {
        items.push((name.clone(), Err(COLORS[3])));
    }
    let total: f64 = items.iter().map(|(n, _)| item(n)).sum();
    let mut x = ((width as f64 - total) / 2.0).max(4.0);
    let y = 70;
    for (name, kind) in &items {
        let x0 = x.round() as i32;
        match kind {
            Ok(fill) => head.draw(&Rectangle::new([(x0, y - 6), (x0 + 14, y + 6)], fill.filled())),
            Err(line) => head.draw(&PathElement::new(vec![(x0, y), (x0 + 14, y)], line.stroke_width(2))),
        }
        .map_err(|x| e(&x))?;
        head.draw(&Text::new(
            name.clone(),
            (x0 + 19, y),
            legend_font.clone().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(|x| e(&x))?;
        x += item(name);
    }
    Ok(())
}

/// The lanes, in `area`, time across to `end`: compute on top, then each link, then the
/// host CPU if it runs optimizer steps; names and bars are drawn on `root`, in pixels.
fn draw_lanes(
    root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    bars: &[Bar],
    end: f64,
) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let lane_count = if bars.iter().any(|b| b.kind == BarKind::CpuUpdate) { 4 } else { 3 };
    let mut lanes = ChartBuilder::on(area)
        .margin_left(20)
        .margin_right(30)
        .margin_top(6)
        .margin_bottom(6)
        .y_label_area_size(LEFT)
        .build_cartesian_2d(0.0..end, 0.0..lane_count as f64)
        .map_err(|x| e(&x))?;
    lanes
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_label_formatter(&|_| String::new())
        .bold_line_style(BLACK.mix(0.1))
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(|x| e(&x))?;
    let lane_top = |lane: usize| lane_count as f64 - lane as f64;
    for (lane, name) in LANE_NAMES.into_iter().enumerate().take(lane_count) {
        if lane % 2 == 1 {
            lanes
                .draw_series(std::iter::once(Rectangle::new(
                    [(0.0, lane_top(lane)), (end, lane_top(lane) - 1.0)],
                    BLACK.mix(0.04).filled(),
                )))
                .map_err(|x| e(&x))?;
        }
        let (lx, ly) = lanes.backend_coord(&(0.0, lane_top(lane) - 0.5));
        root.draw(&Text::new(
            name,
            (lx - 10, ly),
            ("sans-serif", 15).into_font().color(&BLACK).pos(Pos::new(HPos::Right, VPos::Center)),
        ))
        .map_err(|x| e(&x))?;
        if !bars.iter().any(|b| b.kind.lane() == lane) {
            root.draw(&Text::new(
                if lane == 0 { "no compute ops" } else { "no transfers" },
                (lx + 8, ly),
                ("sans-serif", 13).into_font().color(&BLACK.mix(0.45)).pos(Pos::new(HPos::Left, VPos::Center)),
            ))
            .map_err(|x| e(&x))?;
        }
    }
    let (left, _) = lanes.backend_coord(&(0.0, 0.0));
    let (right, _) = lanes.backend_coord(&(end, 0.0));
    let px = |t: f64| left as f64 + (t / end) * (right - left) as f64;
    for lane in 0..lane_count {
        let (_, y0) = lanes.backend_coord(&(0.0, lane_top(lane) - 0.14));
        let (_, y1) = lanes.backend_coord(&(0.0, lane_top(lane) - 0.86));
        let mut in_lane: Vec<&Bar> = bars.iter().filter(|b| b.kind.lane() == lane).collect();
        in_lane.sort_by(|a, b| a.start.total_cmp(&b.start));
        for bar in pixel_bars(in_lane.into_iter(), px) {
            let x0 = bar.x0.round() as i32;
            let mut x1 = (bar.x1.round() as i32).max(x0 + 1);
            // A pixel of white between neighbours that are wide enough to spare it.
            if x1 - x0 >= 4 {
                x1 -= 1;
            }
            root.draw(&Rectangle::new([(x0, y0), (x1, y1)], bar.kind.fill().filled())).map_err(|x| e(&x))?;
            if let Some(label) = bar.labels.and_then(|l| fitting_label(l, x1 - x0)) {
                root.draw(&Text::new(
                    label.to_string(),
                    ((x0 + x1) / 2, (y0 + y1) / 2),
                    ("sans-serif", LABEL_SIZE)
                        .into_font()
                        .color(&bar.kind.ink())
                        .pos(Pos::new(HPos::Center, VPos::Center)),
                ))
                .map_err(|x| e(&x))?;
            }
        }
    }
    Ok(())
}

/// Device memory in `area`, on the lanes' time axis to `end` and up to `top`: the area
/// under its curve, the curve, and the budget's dashed line.
fn draw_memory(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    steps: Vec<(f64, f64)>,
    budget: Option<f64>,
    (end, top): (f64, f64),
    (x_desc, y_desc): (&str, &str),
) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let mut memory = ChartBuilder::on(area)
        .margin_left(20)
        .margin_right(30)
        .margin_top(8)
        .margin_bottom(12)
        .x_label_area_size(50)
        .y_label_area_size(LEFT)
        .build_cartesian_2d(0.0..end, 0.0..top)
        .map_err(|x| e(&x))?;
    memory
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .bold_line_style(BLACK.mix(0.15))
        .light_line_style(BLACK.mix(0.04))
        .draw()
        .map_err(|x| e(&x))?;
    // The area under the curve (plotters' `AreaSeries` is a feature this build leaves out).
    let mut under = steps.clone();
    if let (Some(&(first, _)), Some(&(last, _))) = (steps.first(), steps.last()) {
        under.extend([(last, 0.0), (first, 0.0)]);
    }
    memory.draw_series(std::iter::once(Polygon::new(under, MEMORY.mix(0.12).filled()))).map_err(|x| e(&x))?;
    memory.draw_series(LineSeries::new(steps, MEMORY.stroke_width(2))).map_err(|x| e(&x))?;
    if let Some(b) = budget {
        memory
            .draw_series(DashedLineSeries::new(vec![(0.0, b), (end, b)], 8, 5, COLORS[3].stroke_width(2)))
            .map_err(|x| e(&x))?;
    }
    Ok(())
}

/// The device memory curve's color.
const MEMORY: RGBColor = RGBColor(64, 64, 64);

/// Draws the timeline of one schedule (see [`render_timeline`]) and writes it to `path`,
/// which must not exist unless `force` (`--force`).
pub fn timeline(path: &Path, force: bool, chart: &Timeline<'_>) -> anyhow::Result<()> {
    let svg =
        render_timeline(chart).map_err(|e| anyhow!("--timeline `{}`: cannot draw the plot: {e}", path.display()))?;
    write_new_file(path, "--timeline", &svg, force)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bar(kind: BarKind, start: f64, end: f64, label: &str) -> Bar {
        Bar { kind, start, end, labels: vec![label.to_string()] }
    }

    #[test]
    fn narrow_neighbours_of_one_kind_are_drawn_as_one() {
        let bars = [
            bar(BarKind::Forward, 0.0, 0.25, "F0"),
            bar(BarKind::Forward, 0.25, 0.5, "F1"),
            bar(BarKind::Forward, 0.5, 0.75, "F2"),
            bar(BarKind::Forward, 0.75, 1.0, "F3"),
            // A pixel of forwards is full: the next starts a bar of its own.
            bar(BarKind::Forward, 1.0, 1.25, "F4"),
            // Another kind is never merged in.
            bar(BarKind::Loss, 1.25, 1.5, "L"),
            // Nor is a wide bar.
            bar(BarKind::Backward, 1.5, 11.5, "B0"),
            bar(BarKind::Backward, 11.5, 11.75, "B1"),
        ];
        let px = pixel_bars(bars.iter(), |t| t);
        let spans: Vec<(BarKind, f64, f64, bool)> =
            px.iter().map(|b| (b.kind, b.x0, b.x1, b.labels.is_some())).collect();
        assert_eq!(
            spans,
            vec![
                (BarKind::Forward, 0.0, 1.0, false),
                (BarKind::Forward, 1.0, 1.25, true),
                (BarKind::Loss, 1.25, 1.5, true),
                (BarKind::Backward, 1.5, 11.5, true),
                (BarKind::Backward, 11.5, 11.75, true),
            ]
        );
    }

    #[test]
    fn the_first_label_that_fits_is_drawn() {
        let labels = vec!["layer1.0.conv1".to_string(), "C12".to_string()];
        assert_eq!(fitting_label(&labels, 200), Some("layer1.0.conv1"));
        assert_eq!(fitting_label(&labels, 40), Some("C12"));
        assert_eq!(fitting_label(&labels, 10), None);
    }

    #[test]
    fn thousands_of_ops_stay_a_small_picture() {
        // Store-all on a chain of 3,000 stages: 6,001 compute ops on 1,040 pixels.
        let chain = pebble_graph::Chain::homogeneous(3000, 1.0, 2.0, 1);
        let problem = pebble_solve::Problem::Chain(&chain);
        let schedule = pebble_solve::baseline::store_all::store_all_schedule(problem);
        let config = pebble_sim::SimConfig { timeline: true, ..Default::default() };
        let report = pebble_solve::simulate(problem, &schedule, &config).expect("valid");
        let bars = crate::cmd::timeline_bars(problem, &schedule, &report.spans);
        assert_eq!(bars.len(), 6001);
        let chart = Timeline {
            title: "t".into(),
            units: Units::Plain,
            bars,
            moves: Default::default(),
            report: &report,
            budget: None,
        };
        let svg = render_timeline(&chart).expect("drawn");
        let rects = svg.matches("<rect").count();
        assert!(rects < 1500, "{rects} rectangles");
        // No op label fits a bar of a third of a pixel.
        assert!(!svg.contains(">F17all"), "labels are skipped where they do not fit");
        assert!(svg.contains("no transfers"));
    }

    #[test]
    fn a_periodic_schedule_is_drawn_over_every_period_it_ran() {
        // Store-all, periodic: each period runs every forward once, so none is a
        // recomputation, and the bars cover the memory curve's whole time axis.
        let chain = pebble_graph::Chain::homogeneous(3, 1.0, 2.0, 1);
        let problem = pebble_solve::Problem::Chain(&chain);
        let schedule = pebble_solve::baseline::store_all::store_all_schedule(problem).repeated();
        let config = pebble_sim::SimConfig { timeline: true, ..Default::default() };
        let report = pebble_solve::simulate(problem, &schedule, &config).expect("valid");
        assert_eq!(report.periods, pebble_sim::PERIODS);
        let bars = crate::cmd::timeline_bars(problem, &schedule, &report.spans);
        let count = |kind: BarKind| bars.iter().filter(|b| b.kind == kind).count();
        assert_eq!(count(BarKind::Forward), 3 * report.periods);
        assert_eq!(count(BarKind::Recompute), 0);
        assert_eq!(count(BarKind::Backward), 3 * report.periods);
        let last_bar = bars.iter().map(|b| b.end).fold(0.0, f64::max);
        let last_point = report.timeline.last().expect("a timeline").time;
        assert!(last_bar >= last_point, "bars end at {last_bar}, the memory curve at {last_point}");
        let figures = timeline_figures(&report, Default::default(), Units::Plain);
        assert!(figures.starts_with("6 periods shown; per period: makespan "), "{figures}");
    }
}
