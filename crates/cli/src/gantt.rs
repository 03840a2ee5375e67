//! The Gantt chart of a pipeline schedule (`pebble pipeline --gantt`): one row per
//! device and one per link in use, time across; forwards, backwards and the two halves
//! of a split backward in their own colors, transfers on the links; each bar labelled
//! with its micro-batch where it fits. A flushed schedule is drawn whole; a periodic one
//! over three of its steady-state periods.

use pebble_schedule::{Pass, Schedule};
use pebble_sim::{PipeLane, PipeReport};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::plot::{fitting_size, COLORS};
use crate::source::significant;

const WIDTH: u32 = 1200;
const ROW: u32 = 34;
const HEAD: u32 = 96;
const LEFT: i32 = 110;
const RIGHT: i32 = 20;

fn fill(pass: Option<Pass>, grad: bool) -> RGBColor {
    match (pass, grad) {
        (Some(Pass::F), _) => COLORS[0],
        (Some(Pass::B), _) => COLORS[1],
        (Some(Pass::I), _) => COLORS[3],
        (Some(Pass::W), _) => COLORS[2],
        (None, false) => COLORS[7],
        (None, true) => COLORS[5],
    }
}

/// The chart as SVG text.
pub fn render(title: &str, schedule: &Schedule, report: &PipeReport) -> Result<String, String> {
    let mut lanes: Vec<PipeLane> = Vec::new();
    for d in 0..schedule.devices.unwrap_or(1) {
        lanes.push(PipeLane::Device(d));
    }
    let mut links: Vec<PipeLane> =
        report.spans.iter().map(|s| s.lane).filter(|l| matches!(l, PipeLane::Link(..))).collect();
    links.sort_by_key(|l| match *l {
        PipeLane::Link(a, b) => (a, b),
        PipeLane::Device(d) => (d, d),
    });
    links.dedup();
    lanes.extend(links);
    let end = report.spans.iter().map(|s| s.end).fold(0.0, f64::max).max(1e-12);
    let height = HEAD + ROW * lanes.len() as u32 + 40;
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|x| e(&x))?;
        let center = Pos::new(HPos::Center, VPos::Top);
        let title_size = fitting_size(title, 22.0, f64::from(WIDTH) - 20.0, true);
        root.draw(&Text::new(
            title.to_string(),
            (WIDTH as i32 / 2, 8),
            ("sans-serif", title_size).into_font().style(FontStyle::Bold).color(&BLACK).pos(center),
        ))
        .map_err(|x| e(&x))?;
        let figures = format!(
            "period {} per micro-batch, bubble {:.1}%{}",
            significant(report.period),
            100.0 * report.bubble,
            if schedule.periodic { ", three steady-state periods shown" } else { "" }
        );
        root.draw(&Text::new(
            figures,
            (WIDTH as i32 / 2, 38),
            ("sans-serif", 15).into_font().color(&BLACK).pos(center),
        ))
        .map_err(|x| e(&x))?;
        // Legend.
        let mut items = vec![("F", fill(Some(Pass::F), false))];
        for (name, pass) in [("B", Pass::B), ("I (input grad)", Pass::I), ("W (weight grad)", Pass::W)] {
            if report.spans.iter().any(|s| s.pass == Some(pass)) {
                items.push((name, fill(Some(pass), false)));
            }
        }
        items.push(("send a", fill(None, false)));
        items.push(("send δ", fill(None, true)));
        let mut x = LEFT;
        for (name, color) in items {
            root.draw(&Rectangle::new([(x, 62), (x + 14, 76)], color.filled())).map_err(|x| e(&x))?;
            root.draw(&Text::new(
                name.to_string(),
                (x + 19, 69),
                ("sans-serif", 14).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center)),
            ))
            .map_err(|x| e(&x))?;
            x += 40 + 8 * name.len() as i32;
        }
        let span_x = |t: f64| LEFT + ((WIDTH as i32 - LEFT - RIGHT) as f64 * t / end).round() as i32;
        for (row, lane) in lanes.iter().enumerate() {
            let y0 = HEAD as i32 + row as i32 * ROW as i32;
            if row % 2 == 1 {
                root.draw(&Rectangle::new([(0, y0), (WIDTH as i32, y0 + ROW as i32)], BLACK.mix(0.04).filled()))
                    .map_err(|x| e(&x))?;
            }
            let name = match *lane {
                PipeLane::Device(d) => format!("device {d}"),
                PipeLane::Link(a, b) => format!("link {a}↔{b}"),
            };
            root.draw(&Text::new(
                name,
                (8, y0 + ROW as i32 / 2),
                ("sans-serif", 14).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center)),
            ))
            .map_err(|x| e(&x))?;
            for s in report.spans.iter().filter(|s| s.lane == *lane) {
                let (a, b) = (span_x(s.start), span_x(s.end).max(span_x(s.start) + 1));
                let color = fill(s.pass, s.grad);
                root.draw(&Rectangle::new([(a, y0 + 4), (b, y0 + ROW as i32 - 4)], color.filled()))
                    .map_err(|x| e(&x))?;
                root.draw(&Rectangle::new([(a, y0 + 4), (b, y0 + ROW as i32 - 4)], WHITE.stroke_width(1)))
                    .map_err(|x| e(&x))?;
                let label = s.micro.to_string();
                if (b - a) as usize >= 8 * label.len() + 4 {
                    root.draw(&Text::new(
                        label,
                        ((a + b) / 2, y0 + ROW as i32 / 2),
                        ("sans-serif", 12).into_font().color(&WHITE).pos(Pos::new(HPos::Center, VPos::Center)),
                    ))
                    .map_err(|x| e(&x))?;
                }
            }
        }
        // The time axis.
        let y = HEAD as i32 + ROW as i32 * lanes.len() as i32 + 6;
        root.draw(&PathElement::new(vec![(LEFT, y), (WIDTH as i32 - RIGHT, y)], BLACK.stroke_width(1)))
            .map_err(|x| e(&x))?;
        for (t, label) in time_ticks(end) {
            let x = span_x(t);
            root.draw(&PathElement::new(vec![(x, y), (x, y + 5)], BLACK.stroke_width(1))).map_err(|x| e(&x))?;
            root.draw(&Text::new(
                label,
                (x, y + 8),
                ("sans-serif", 12).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Top)),
            ))
            .map_err(|x| e(&x))?;
        }
        root.present().map_err(|x| e(&x))?;
    }
    Ok(svg)
}

/// Ticks at round times (1, 2 or 5 times a power of ten apart, five or so) from 0
/// to `end`, each labelled with as many decimals as its step needs.
fn time_ticks(end: f64) -> Vec<(f64, String)> {
    let raw = end / 5.0;
    let power = 10f64.powf(raw.log10().floor());
    // The round step nearest the fifth of the span, on a log scale.
    let off = |s: f64| (s / raw).ln().abs();
    let step =
        [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * power).fold(power, |b, s| if off(s) < off(b) { s } else { b });
    let digits = (-step.log10().floor()).max(0.0) as usize;
    (0..)
        .map(|i| f64::from(i) * step)
        .take_while(|t| *t <= end * (1.0 + 1e-9))
        .map(|t| (t, format!("{t:.digits$}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::time_ticks;

    #[test]
    fn time_ticks_fall_on_round_values_within_the_chart() {
        let labels = |end: f64| time_ticks(end).into_iter().map(|(_, l)| l).collect::<Vec<_>>();
        // A step of about 0.0103 s: 0.002 apart, none past the end.
        assert_eq!(labels(0.01027), ["0.000", "0.002", "0.004", "0.006", "0.008", "0.010"]);
        assert_eq!(labels(10.0), ["0", "2", "4", "6", "8", "10"]);
        assert_eq!(labels(3.0), ["0.0", "0.5", "1.0", "1.5", "2.0", "2.5", "3.0"]);
        assert_eq!(labels(740.0), ["0", "200", "400", "600"]);
    }
}
