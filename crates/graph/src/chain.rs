use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::GraphError;

/// A chain of `L` stages followed by the loss, in rotor's format.
///
/// Indices follow rotor (0-based). Stage `i` (for `i < L`) maps activation `a_i`
/// (size `x[i]`) to `a_{i+1}`. The loss is stage `L`: it reads `a_L` and produces
/// `δ_L`. Semantics follow Shilova's thesis, §2.1 (Table 2.1):
///
/// * `x[i]` is the size of `a_i`, the input of stage `i`, and of its gradient `δ_i`.
/// * `xbar[i+1]` is everything stage `i` saves when run with its graph kept
///   (`F_all`), including its output `a_{i+1}`; `xbar[0]` is conventionally `x[0]`.
/// * `ftmp[i]` and `btmp[i]` are the extra memory stage `i`'s forward and backward
///   use while they run; `btmp[L]` is the loss's.
/// * The backward of stage `i` needs `xbar[i+1]`, `δ_{i+1}` and `a_i`, produces `δ_i`.
/// * `static_bytes` is resident for the whole step (parameters, their gradients,
///   optimizer states). A budget counts it, `a_0`, and everything else resident.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chain {
    /// A label, e.g. the model it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Forward time of each stage, `L` entries.
    pub ftime: Vec<f64>,
    /// Backward time of each stage, `L+1` entries: the last one is the loss.
    pub btime: Vec<f64>,
    /// Activation sizes, `L+1` entries: `x[i]` is the input of stage `i`.
    pub x: Vec<u64>,
    /// Saved-for-backward sizes, `L+1` entries: `xbar[i+1]` is saved by stage `i`.
    pub xbar: Vec<u64>,
    /// Forward temporary memory, `L` entries.
    pub ftmp: Vec<u64>,
    /// Backward temporary memory, `L+1` entries: the last one is the loss's.
    pub btmp: Vec<u64>,
    /// Optional per-stage weight sizes, `L` entries (for weight offloading).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub w: Option<Vec<u64>>,
    /// Optional per-stage weight-gradient sizes, `L` entries: the trainable part of `w[i]`
    /// (for offloading gradients and updating on the CPU). Counted inside `static_bytes`:
    /// a gradient buffer is resident from the start unless a schedule frees it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub g: Option<Vec<u64>>,
    /// Optional per-stage optimizer-state sizes, `L` entries (Adam's moments, and the fp32
    /// master copy under mixed precision). Counted inside `static_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub o: Option<Vec<u64>>,
    /// Optional per-stage temporary memory of the optimizer step fused into stage `i`'s
    /// backward, `L` entries: what the update holds beside the parameters, their gradients
    /// and states while it runs, after the backward's own temporaries are gone. Counted
    /// where a schedule updates the stage on the device (one that names the statics).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utmp: Option<Vec<u64>>,
    /// Memory resident for the whole step: parameters, their gradients and optimizer
    /// states (the `w`, `g` and `o` given included).
    #[serde(default)]
    pub static_bytes: u64,
}

impl Chain {
    /// The number of stages `L`, not counting the loss.
    pub fn len(&self) -> usize {
        self.ftime.len()
    }

    /// A chain always has at least one stage; this is for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.ftime.is_empty()
    }

    /// A homogeneous chain of `l` stages: every forward costs `uf`, every backward
    /// (the loss included) `ub`, every activation and saved set has size `size`,
    /// no temporary memory. This is the model of Shilova's Ch. 1 (with `xbar = x`).
    pub fn homogeneous(l: usize, uf: f64, ub: f64, size: u64) -> Chain {
        Chain {
            name: None,
            ftime: vec![uf; l],
            btime: vec![ub; l + 1],
            x: vec![size; l + 1],
            xbar: vec![size; l + 1],
            ftmp: vec![0; l],
            btmp: vec![0; l + 1],
            w: None,
            g: None,
            o: None,
            utmp: None,
            static_bytes: 0,
        }
    }

    /// `btmp[i]` of a backward with the optimizer step fused into it (`i < L`): the larger
    /// of its own temporaries and the update's (`utmp[i]`), which runs after them.
    pub fn fused_btmp(&self, i: usize) -> u64 {
        let update = self.utmp.as_ref().and_then(|u| u.get(i)).copied().unwrap_or(0);
        self.btmp[i].max(update)
    }

    /// Total compute time of one store-all step: every forward and backward once.
    pub fn ideal_time(&self) -> f64 {
        self.ftime.iter().sum::<f64>() + self.btime.iter().sum::<f64>()
    }

    /// Checks lengths and the rule `xbar[i] >= x[i]` for `i >= 1`.
    pub fn validate(&self) -> Result<(), GraphError> {
        let l = self.ftime.len();
        if l == 0 {
            return Err(GraphError::EmptyChain);
        }
        let check = |field: &str, found: usize, expected: usize, why: &'static str| {
            if found != expected {
                Err(GraphError::Length { field: field.into(), found, expected, why })
            } else {
                Ok(())
            }
        };
        check("btime", self.btime.len(), l + 1, "len(ftime) + 1: the last entry is the loss")?;
        check("x", self.x.len(), l + 1, "len(ftime) + 1")?;
        check("xbar", self.xbar.len(), l + 1, "len(ftime) + 1")?;
        check("ftmp", self.ftmp.len(), l, "len(ftime)")?;
        check("btmp", self.btmp.len(), l + 1, "len(ftime) + 1: the last entry is the loss")?;
        for (field, v) in [("w", &self.w), ("g", &self.g), ("o", &self.o), ("utmp", &self.utmp)] {
            if let Some(v) = v {
                check(field, v.len(), l, "len(ftime)")?;
            }
        }
        if self.g.is_some() && self.w.is_none() {
            return Err(GraphError::Malformed {
                what: "chain",
                message: "field `g` (weight gradients) needs field `w` (the weights they belong to)".into(),
            });
        }
        let sized =
            [("x", Some(&self.x)), ("xbar", Some(&self.xbar)), ("ftmp", Some(&self.ftmp)), ("btmp", Some(&self.btmp))]
                .into_iter()
                .chain([
                    ("w", self.w.as_ref()),
                    ("g", self.g.as_ref()),
                    ("o", self.o.as_ref()),
                    ("utmp", self.utmp.as_ref()),
                ]);
        for (field, v) in sized {
            for (i, &b) in v.into_iter().flatten().enumerate() {
                checked_size(b, || format!("{field}[{i}]"))?;
            }
        }
        checked_size(self.static_bytes, || "static_bytes".into())?;
        let named: u64 =
            [&self.g, &self.o].iter().filter_map(|v| v.as_ref()).flatten().fold(0, |a, &b| a.saturating_add(b));
        if named > self.static_bytes && (self.g.is_some() || self.o.is_some()) {
            return Err(GraphError::Malformed {
                what: "chain",
                message: format!(
                    "field `static_bytes` = {} is below the gradients and optimizer states it counts ({named})",
                    self.static_bytes
                ),
            });
        }
        for (field, v) in [("ftime", &self.ftime), ("btime", &self.btime)] {
            for (i, &t) in v.iter().enumerate() {
                checked_time(t, || format!("{field}[{i}]"))?;
            }
        }
        for i in 1..=l {
            if self.xbar[i] < self.x[i] {
                return Err(GraphError::XbarBelowX { index: i, xbar: self.xbar[i], x: self.x[i] });
            }
        }
        Ok(())
    }

    /// Reads a chain from JSON text, naming the field at fault on any error.
    /// Unknown fields are errors too, so that a typo is caught rather than defaulted.
    pub fn from_json(text: &str) -> Result<Chain, GraphError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| GraphError::Malformed { what: "chain", message: e.to_string() })?;
        let obj = value.as_object().ok_or_else(|| GraphError::Malformed {
            what: "chain",
            message: "expected a JSON object with fields ftime, btime, x, xbar, ftmp, btmp".into(),
        })?;
        const KNOWN: [&str; 12] =
            ["name", "ftime", "btime", "x", "xbar", "ftmp", "btmp", "w", "g", "o", "utmp", "static_bytes"];
        if let Some(k) = obj.keys().find(|k| !KNOWN.contains(&k.as_str())) {
            return Err(GraphError::Malformed {
                what: "chain",
                message: format!("unknown field `{k}` (expected one of {})", KNOWN.join(", ")),
            });
        }
        let chain = Chain {
            name: match obj.get("name") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(_) => {
                    return Err(GraphError::Malformed {
                        what: "chain",
                        message: "field `name` must be a string".into(),
                    })
                }
            },
            ftime: times(obj, "ftime")?,
            btime: times(obj, "btime")?,
            x: sizes(obj, "x")?,
            xbar: sizes(obj, "xbar")?,
            ftmp: sizes(obj, "ftmp")?,
            btmp: sizes(obj, "btmp")?,
            w: optional_sizes(obj, "w")?,
            g: optional_sizes(obj, "g")?,
            o: optional_sizes(obj, "o")?,
            utmp: optional_sizes(obj, "utmp")?,
            static_bytes: match obj.get("static_bytes") {
                None => 0,
                Some(v) => size_value(v, "static_bytes")?,
            },
        };
        chain.validate()?;
        Ok(chain)
    }

    /// Writes the chain as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a chain always serializes")
    }
}

fn array<'a>(obj: &'a Map<String, Value>, field: &str) -> Result<&'a Vec<Value>, GraphError> {
    match obj.get(field) {
        None => Err(GraphError::MissingField { field: field.into() }),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => Err(GraphError::Malformed {
            what: "chain",
            message: format!("field `{field}` must be an array of numbers"),
        }),
    }
}

/// The largest size one entry of a chain or graph may have (2^50: 1 PiB in bytes), so that
/// the sums of a schedule's live sizes stay far inside a `u64`.
pub const MAX_SIZE: u64 = 1 << 50;

/// The largest time one entry may have (10^15, in whatever unit the file uses), so that
/// every sum of times stays finite.
pub const MAX_TIME: f64 = 1e15;

/// `value` if it is within [`MAX_SIZE`], else the error naming `field`.
pub(crate) fn checked_size(value: u64, field: impl FnOnce() -> String) -> Result<u64, GraphError> {
    if value > MAX_SIZE {
        return Err(GraphError::BadSize { field: field(), value: value.to_string() });
    }
    Ok(value)
}

/// Whether `t` is a time a chain or graph may hold: non-negative and within [`MAX_TIME`]
/// (so finite).
fn time_ok(t: f64) -> bool {
    (0.0..=MAX_TIME).contains(&t)
}

/// `value` if it is a time a chain or graph may hold ([`time_ok`]), else the error naming `field`.
pub(crate) fn checked_time(value: f64, field: impl FnOnce() -> String) -> Result<f64, GraphError> {
    if !time_ok(value) {
        return Err(GraphError::BadTime { field: field(), value: value.to_string() });
    }
    Ok(value)
}

/// Reads a non-negative integer size, naming `field` on failure.
pub(crate) fn size_value(v: &Value, field: &str) -> Result<u64, GraphError> {
    let bad = || GraphError::BadSize { field: field.into(), value: v.to_string() };
    if let Some(u) = v.as_u64() {
        return checked_size(u, || field.into());
    }
    match v.as_f64() {
        Some(f) if f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f <= MAX_SIZE as f64 => Ok(f as u64),
        _ => Err(bad()),
    }
}

fn optional_sizes(obj: &Map<String, Value>, field: &str) -> Result<Option<Vec<u64>>, GraphError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => sizes(obj, field).map(Some),
    }
}

fn sizes(obj: &Map<String, Value>, field: &str) -> Result<Vec<u64>, GraphError> {
    array(obj, field)?.iter().enumerate().map(|(i, v)| size_value(v, &format!("{field}[{i}]"))).collect()
}

/// Reads a non-negative finite time, naming `field` on failure.
pub(crate) fn time_value(v: &Value, field: &str) -> Result<f64, GraphError> {
    match v.as_f64() {
        Some(t) if time_ok(t) => Ok(t),
        // The value as written in the file, not as parsed.
        _ => Err(GraphError::BadTime { field: field.into(), value: v.to_string() }),
    }
}

fn times(obj: &Map<String, Value>, field: &str) -> Result<Vec<f64>, GraphError> {
    array(obj, field)?.iter().enumerate().map(|(i, v)| time_value(v, &format!("{field}[{i}]"))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"ftime":[1,2],"btime":[2,3,1],"x":[4,5,6],"xbar":[4,7,8],"ftmp":[0,1],"btmp":[1,0,0]}"#;

    #[test]
    fn round_trip() {
        let c = Chain::from_json(GOOD).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c.ideal_time(), 9.0);
        assert_eq!(Chain::from_json(&c.to_json()).unwrap(), c);
    }

    fn err(text: &str) -> String {
        Chain::from_json(text).unwrap_err().to_string()
    }

    #[test]
    fn bad_inputs_name_the_field() {
        assert_eq!(
            err(&GOOD.replace("[4,5,6]", "[4,-5,6]")),
            "field `x[1]`: a size must be a non-negative integer of at most 2^50 (1 PiB), got -5"
        );
        assert_eq!(
            err(&GOOD.replace("[4,5,6]", "[4,5.5,6]")),
            "field `x[1]`: a size must be a non-negative integer of at most 2^50 (1 PiB), got 5.5"
        );
        // Absurd sizes and times: their sums would overflow a u64 or reach infinity.
        assert_eq!(
            err(&GOOD.replace("[4,5,6]", "[4,5,18446744073709551615]")),
            "field `x[2]`: a size must be a non-negative integer of at most 2^50 (1 PiB), got 18446744073709551615"
        );
        assert!(err(&GOOD.replace("[4,5,6]", "[4,5,1125899906842625]")).starts_with("field `x[2]`"));
        assert!(Chain::from_json(
            &GOOD.replace("[4,5,6]", "[4,5,1125899906842624]").replace("[4,7,8]", "[4,7,1125899906842624]")
        )
        .is_ok());
        assert_eq!(
            err(&GOOD.replace("[1,2]", "[1,1e308]")),
            "field `ftime[1]`: a time must be a non-negative number of at most 1e15, got 1e+308"
        );
        assert_eq!(
            err(&GOOD.replace("[1,2]", "[1,-2]")),
            "field `ftime[1]`: a time must be a non-negative number of at most 1e15, got -2"
        );
        assert_eq!(err(&GOOD.replace("[4,7,8]", "[4,7]")), "field `xbar` has length 2, expected 3 (len(ftime) + 1)");
        assert_eq!(err(&GOOD.replace("\"ftmp\":[0,1],", "")), "missing field `ftmp`");
        assert!(err(&GOOD.replace("\"ftmp\"", "\"ftemp\"")).contains("unknown field `ftemp`"));
        assert!(err("{").starts_with("malformed chain"));
        assert!(err("[1]").starts_with("malformed chain"));
        assert_eq!(
            err(&GOOD.replace("[4,7,8]", "[4,4,8]")),
            "field `xbar[1]` = 4 is smaller than `x[1]` = 5; a stage's saved set includes its output"
        );
        assert_eq!(
            err(r#"{"ftime":[],"btime":[1],"x":[1],"xbar":[1],"ftmp":[],"btmp":[0]}"#),
            "a chain needs at least one stage (field `ftime` is empty)"
        );
    }
}
