//! The `options` argument: what the CLI's `--profile`, `--time-limit`, `--slots`, `--allocator` and
//! `--bandwidth` give `pebble plan` (see the CLI's `cmd::solve_options`), and a link
//! `latency` (pebble.torch's measured links), as one JSON object. Every field is optional; an unknown one is an error naming it.

use pebble_machine::{Machine, Profile, ProfileError};
use pebble_solve::{Slots, SolveOptions};
use serde::Deserialize;
use serde_json::Value;

use crate::error::{ApiError, Result};

/// The options as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    /// A built-in profile's name or a JSON profile file: its machine.
    profile: Option<String>,
    /// A whole machine, as `pebble_machine::Machine` reads it.
    machine: Option<Machine>,
    /// Seconds: the MILPs' limit, or `auto`'s in all.
    time_limit: Option<f64>,
    /// A slot count or `"exact"`.
    slots: Option<Value>,
    /// Host↔device bandwidth, bytes per second, both directions.
    bandwidth: Option<f64>,
    /// Host↔device latency, seconds, both directions (a transfer's fixed cost).
    latency: Option<f64>,
    /// `auto`'s candidates.
    solvers: Option<Vec<String>>,
    /// `simulate`'s budget, bytes.
    budget: Option<u64>,
    /// `simulate`: record the memory timeline and the spans.
    timeline: Option<bool>,
    /// How the simulator counts device memory: `"none"`, `"caching"` or `"expandable"`.
    allocator: Option<String>,
}

/// The options, resolved.
#[derive(Debug, Clone)]
pub struct Options {
    /// What the solvers and the simulator read.
    pub solve: SolveOptions,
    /// `auto`'s candidates, if restricted.
    pub solvers: Option<Vec<String>>,
    /// `simulate`'s budget.
    pub budget: Option<u64>,
    /// `simulate`'s timeline.
    pub timeline: bool,
}

/// Which call reads the options: each takes its own fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// `plan` and `least_budget`.
    Plan,
    /// `simulate`.
    Simulate,
}

/// The machine of `profile` (a built-in name or a JSON file), as `--profile` finds it.
pub fn lookup_profile(name: &str) -> Result<Profile> {
    Profile::lookup(name).map_err(|e| match e {
        ProfileError::Unknown { .. } => ApiError::bad(format!("profile: {e}")),
        _ => ApiError::bad(format!("profile `{name}`: {e}")),
    })
}

/// Reads `options` (a JSON object; `""` and `null` are no options) for `call`.
pub fn parse(text: &str, call: Call) -> Result<Options> {
    let raw: Raw = if text.trim().is_empty() || text.trim() == "null" {
        Raw::default()
    } else {
        let de = &mut serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if path == "." {
                ApiError::bad(format!("options: {inner}"))
            } else {
                ApiError::bad(format!("options.{path}: {inner}"))
            }
        })?
    };
    let misplaced = match call {
        Call::Plan => [(raw.budget.is_some(), "budget"), (raw.timeline.is_some(), "timeline")],
        Call::Simulate => [(raw.solvers.is_some(), "solvers"), (raw.slots.is_some(), "slots")],
    };
    if let Some((_, field)) = misplaced.iter().find(|(given, _)| *given) {
        let why = match call {
            Call::Plan => "plan and least_budget take the budget as an argument, and draw no timeline",
            Call::Simulate => "simulate runs a schedule: it chooses no solver",
        };
        return Err(ApiError::bad(format!("options.{field}: not an option here ({why})")));
    }
    let machine = match (&raw.profile, raw.machine) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad("options: give `profile` or `machine`, not both (a profile holds a machine)"))
        }
        (Some(name), None) => lookup_profile(name)?.machine,
        (None, Some(m)) => {
            m.validate().map_err(|e| ApiError::bad(format!("options.machine: {e}")))?;
            m
        }
        // As the CLI plans a chain or graph file with no --profile: the abstract machine.
        (None, None) => Machine::default(),
    };
    let machine = match raw.bandwidth {
        Some(b) if b.is_finite() && b > 0.0 => machine.with_bandwidth(b),
        Some(b) => {
            return Err(ApiError::bad(format!("options.bandwidth: {b} is not a positive number of bytes per second")))
        }
        None => machine,
    };
    let machine = match raw.latency {
        Some(l) if l.is_finite() && l >= 0.0 => Machine {
            d2h: pebble_machine::Link { latency: l, ..machine.d2h },
            h2d: pebble_machine::Link { latency: l, ..machine.h2d },
            ..machine
        },
        Some(l) => return Err(ApiError::bad(format!("options.latency: {l} is not a number of seconds (0 or more)"))),
        None => machine,
    };
    if let Some(t) = raw.time_limit {
        if !(t.is_finite() && t > 0.0) {
            return Err(ApiError::bad(format!("options.time_limit: {t} is not a positive number of seconds")));
        }
    }
    let defaults = SolveOptions::default();
    let slots = match &raw.slots {
        None => defaults.slots,
        Some(v) => slots(v)?,
    };
    Ok(Options {
        solve: SolveOptions {
            slots,
            time_limit: raw.time_limit,
            machine,
            progress: defaults.progress,
            allocator: allocator(raw.allocator.as_deref())?,
        },
        solvers: raw.solvers,
        budget: raw.budget,
        timeline: raw.timeline.unwrap_or(false),
    })
}

/// `allocator`: as `--allocator`.
fn allocator(name: Option<&str>) -> Result<Option<pebble_sim::allocator::AllocatorConfig>> {
    use pebble_sim::allocator::{AllocatorConfig, AllocatorMode};
    let mode = match name {
        None | Some("none") => return Ok(None),
        Some("caching") => AllocatorMode::Caching,
        Some("expandable") => AllocatorMode::ExpandableSegments,
        Some(other) => {
            return Err(ApiError::bad(format!(
                "options.allocator: `{other}` is not one of \"none\", \"caching\", \"expandable\""
            )))
        }
    };
    Ok(Some(AllocatorConfig { mode, ..AllocatorConfig::default() }))
}

/// `slots`: a positive count, or `"exact"` (as `--slots`).
fn slots(v: &Value) -> Result<Slots> {
    match v {
        Value::String(s) if s.eq_ignore_ascii_case("exact") => Ok(Slots::Exact),
        Value::Number(n) => match n.as_u64() {
            Some(k) if k > 0 => Ok(Slots::Count(k as usize)),
            _ => Err(ApiError::bad(format!("options.slots: {n} is not a positive slot count"))),
        },
        other => Err(ApiError::bad(format!("options.slots: {other} is not a positive slot count or \"exact\""))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_mirror_the_cli_flags() {
        let o =
            parse(r#"{"profile": "v100", "time_limit": 5, "slots": "exact", "bandwidth": 1e9}"#, Call::Plan).unwrap();
        assert_eq!(o.solve.slots, Slots::Exact);
        assert_eq!(o.solve.time_limit, Some(5.0));
        let v100 = Profile::lookup("v100").unwrap().machine;
        assert_eq!(o.solve.machine, v100.with_bandwidth(1e9));
        let o = parse("", Call::Plan).unwrap();
        assert_eq!(o.solve.machine, Machine::default());
        assert_eq!(o.solve.slots, Slots::Count(500));
        assert_eq!(parse(r#"{"slots": 40}"#, Call::Plan).unwrap().solve.slots, Slots::Count(40));
        let m = parse(r#"{"bandwidth": 4e9, "latency": 2e-5}"#, Call::Simulate).unwrap().solve.machine;
        assert_eq!((m.d2h.bandwidth, m.d2h.latency, m.h2d.bandwidth, m.h2d.latency), (4e9, 2e-5, 4e9, 2e-5));
        let a = parse(r#"{"allocator": "expandable"}"#, Call::Plan).unwrap().solve.allocator.unwrap();
        assert_eq!(a.mode, pebble_sim::allocator::AllocatorMode::ExpandableSegments);
        assert!(parse(r#"{"allocator": "none"}"#, Call::Plan).unwrap().solve.allocator.is_none());
    }

    #[test]
    fn errors_name_the_field() {
        let e = |text: &str, call| parse(text, call).unwrap_err().message;
        assert!(e(r#"{"time_limt": 5}"#, Call::Plan).contains("time_limt"));
        assert!(e(r#"{"slots": 0}"#, Call::Plan).starts_with("options.slots"));
        assert!(e(r#"{"time_limit": -1}"#, Call::Plan).starts_with("options.time_limit"));
        assert!(e(r#"{"budget": 5}"#, Call::Plan).starts_with("options.budget"));
        assert!(e(r#"{"latency": -1}"#, Call::Plan).starts_with("options.latency"));
        assert!(e(r#"{"allocator": "cuda"}"#, Call::Plan).starts_with("options.allocator"));
        let m = e(r#"{"profile": "v10"}"#, Call::Plan);
        assert!(m.starts_with("profile:") && m.contains("v100"), "{m}");
        let m = e(r#"{"machine": {"device_memory": "x"}}"#, Call::Simulate);
        assert!(m.starts_with("options.machine.device_memory"), "{m}");
        assert!(e("[1]", Call::Plan).starts_with("options"));
    }
}
