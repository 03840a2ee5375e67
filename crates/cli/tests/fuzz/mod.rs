//! What the fuzz tests share (issue 47): a seeded RNG, the mutations of a valid input
//! (bytes, JSON values, protobuf fields), and the seed corpus (`seeds.rs`): files the
//! `pebble` binary itself writes, the chain fixture and a small ONNX model.
#![allow(dead_code)] // each test binary uses its own share

pub mod proto;
pub mod seeds;

use serde_json::{Map, Value};

/// `pebble-testkit`'s generator, in the `usize` terms the mutations index with: the same
/// seed gives the same cases everywhere.
#[derive(Debug, Clone)]
pub struct Rng(pebble_testkit::Rng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(pebble_testkit::Rng::new(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n`, `n > 0`.
    pub fn below(&mut self, n: usize) -> usize {
        self.0.index(n)
    }

    /// True with probability `1/n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.0.one_in(n as u64)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// The number of cases: `PEBBLE_FUZZ_CASES` if set (the long local run), else `ci`.
pub fn cases(ci: usize) -> usize {
    match std::env::var("PEBBLE_FUZZ_CASES") {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("PEBBLE_FUZZ_CASES=`{v}` is not a count")),
        Err(_) => ci,
    }
}

/// The first seed: `PEBBLE_FUZZ_SEED` if set (to replay a failure), else `default`.
pub fn first_seed(default: u64) -> u64 {
    std::env::var("PEBBLE_FUZZ_SEED").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

/// Raw JSON text a `Value` cannot hold (integers beyond 64 bits, NaN, overflowing
/// exponents), put in as a marked string and substituted after serialization.
const RAW: [&str; 12] = [
    "18446744073709551616",
    "18446744073709551615",
    "-9223372036854775809",
    "340282366920938463463374607431768211456",
    "1e999",
    "-1e999",
    "NaN",
    "Infinity",
    "-0",
    "1e-400",
    "9007199254740993",
    "0.30000000000000004",
];
const MARK: &str = "@@raw@@";

/// Numbers that break arithmetic: zero, negatives, the edges of the integer types,
/// counts and sizes no machine has, fractions where integers belong.
fn interesting_number(rng: &mut Rng) -> Value {
    let n: f64 = *rng.pick(&[
        0.0,
        -1.0,
        1.0,
        2.0,
        0.5,
        -0.5,
        1e308,
        -1e308,
        1e-300,
        4096.0,
        4097.0,
        1e6,
        1e9,
        1e12,
        4294967296.0,
        9007199254740992.0,
        1.8446744073709552e19,
        f64::MAX,
    ]);
    match rng.below(4) {
        0 => Value::from(*rng.pick(&[u64::MAX, u64::MAX - 1, i64::MAX as u64, 1 << 32, 1 << 53, 1 << 63])),
        1 => Value::from(*rng.pick(&[i64::MIN, -1, -2, i32::MIN as i64, -4096, -4097])),
        _ => Value::from(n),
    }
}

/// A value of another type, or a special one.
fn random_value(rng: &mut Rng, dict: &[String]) -> Value {
    match rng.below(10) {
        0..=2 => interesting_number(rng),
        3 => Value::String(format!("{MARK}{}{MARK}", rng.pick(&RAW))),
        4 => Value::Null,
        5 => Value::Bool(rng.one_in(2)),
        6 if !dict.is_empty() => Value::String(rng.pick(dict).clone()),
        6 => Value::String(String::new()),
        7 => Value::Array(vec![]),
        8 => Value::Object(Map::new()),
        _ => Value::String(match rng.below(4) {
            0 => String::new(),
            1 => "x".repeat(1 + rng.below(1000)),
            2 => "\u{1F600}\u{0}\u{FFFF}é".into(),
            _ => "NaN".into(),
        }),
    }
}

/// Every strings and keys of the values: the names a mutation may swap in.
pub fn dictionary<'a>(values: impl IntoIterator<Item = &'a Value>) -> Vec<String> {
    fn walk(v: &Value, out: &mut std::collections::BTreeSet<String>) {
        match v {
            Value::String(s) if s.len() < 64 => {
                out.insert(s.clone());
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            Value::Object(o) => o.iter().for_each(|(k, x)| {
                out.insert(k.clone());
                walk(x, out)
            }),
            _ => {}
        }
    }
    let mut out = std::collections::BTreeSet::new();
    values.into_iter().for_each(|v| walk(v, &mut out));
    out.into_iter().collect()
}

/// The number of nodes of a value.
fn count(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(count).sum(),
        Value::Object(o) => o.values().map(count).sum(),
        _ => 0,
    }
}

/// The `n`-th node in preorder, `n < count(v)`: its path found in one walk, then followed.
fn nth(v: &mut Value, n: usize) -> &mut Value {
    fn find(v: &Value, n: &mut usize, path: &mut Vec<usize>) -> bool {
        if *n == 0 {
            return true;
        }
        *n -= 1;
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(a) => Box::new(a.iter()),
            Value::Object(o) => Box::new(o.values()),
            _ => return false,
        };
        for (i, c) in children.enumerate() {
            path.push(i);
            if find(c, n, path) {
                return true;
            }
            path.pop();
        }
        false
    }
    let (mut k, mut path) = (n, Vec::new());
    assert!(find(v, &mut k, &mut path), "n < count(v)");
    path.into_iter().fold(v, |node, i| match node {
        Value::Array(a) => &mut a[i],
        Value::Object(o) => o.values_mut().nth(i).expect("on the path"),
        _ => unreachable!("a path goes through arrays and objects"),
    })
}

/// One structured change to one node of a JSON value: a number replaced by an edge
/// value, a type changed, a field dropped or added, an array grown, shrunk or shuffled,
/// a subtree copied from elsewhere (`donor`: another input of the same kind), a value
/// buried in deep nesting.
pub fn mutate_json(rng: &mut Rng, v: &mut Value, donor: &Value, dict: &[String], max_grow: usize) {
    let n = count(v);
    let node = nth(v, rng.below(n));
    match rng.below(12) {
        0..=2 => {
            *node = match node {
                Value::Number(x) if rng.one_in(2) => {
                    let f = x.as_f64().unwrap_or(0.0);
                    let g = *rng.pick(&[f + 1.0, f - 1.0, f * 2.0, f * 1000.0, -f, f / 3.0, f * 1e12]);
                    match x.as_i64() {
                        Some(_) if g.fract() == 0.0 && g.abs() < 9e15 => Value::from(g as i64),
                        Some(i) => Value::from(i.wrapping_mul(1_000_003)),
                        None => Value::from(g),
                    }
                }
                _ => interesting_number(rng),
            }
        }
        3 | 4 => *node = random_value(rng, dict),
        5 => match node {
            Value::Object(o) if !o.is_empty() => {
                let k = o.keys().nth(rng.below(o.len())).cloned().unwrap_or_default();
                o.remove(&k);
            }
            Value::Array(a) if !a.is_empty() => {
                a.remove(rng.below(a.len()));
            }
            _ => *node = random_value(rng, dict),
        },
        6 => match node {
            Value::Object(o) => {
                let key = if dict.is_empty() || rng.one_in(3) { "surplus".to_string() } else { rng.pick(dict).clone() };
                o.insert(key, random_value(rng, dict));
            }
            Value::Array(a) => a.insert(rng.below(a.len() + 1), random_value(rng, dict)),
            _ => *node = random_value(rng, dict),
        },
        7 => match node {
            // A long array: copies of one element (a schedule of 10^5 ops, a chain of
            // 10^5 stages), or one element added.
            Value::Array(a) if !a.is_empty() => {
                let e = a[rng.below(a.len())].clone();
                // No more than a megabyte of copies.
                let size = serde_json::to_string(&e).map_or(1, |t| t.len() + 1);
                let k = 1 + rng.below(max_grow.min((1 << 20) / size).max(1));
                let at = rng.below(a.len() + 1);
                a.splice(at..at, std::iter::repeat_n(e, k));
            }
            _ => *node = Value::Array(vec![node.clone(); 1 + rng.below(16)]),
        },
        8 => match node {
            Value::Array(a) if a.len() > 1 => {
                let (i, j) = (rng.below(a.len()), rng.below(a.len()));
                a.swap(i, j);
                if rng.one_in(2) {
                    a.truncate(rng.below(a.len()));
                }
            }
            _ => *node = random_value(rng, dict),
        },
        9 => {
            let depth = *rng.pick(&[8, 64, 126, 127, 128, 129, 300, 1000]);
            for _ in 0..depth {
                let inner = std::mem::take(node);
                *node = if rng.one_in(2) {
                    Value::Array(vec![inner])
                } else {
                    Value::Object(Map::from_iter([("a".to_string(), inner)]))
                };
            }
        }
        _ => {
            let mut d = donor.clone();
            let m = count(&d);
            *node = std::mem::take(nth(&mut d, rng.below(m)));
        }
    }
}

/// The text of a mutated value, the marked raw numbers put in.
pub fn json_text(rng: &mut Rng, v: &Value) -> String {
    let text = if rng.one_in(2) { serde_json::to_string(v) } else { serde_json::to_string_pretty(v) };
    let text = text.expect("a JSON value serializes");
    if !text.contains(MARK) {
        return text;
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(i) = rest.find(&format!("\"{MARK}")) {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1 + MARK.len()..];
        let end = after.find(&format!("{MARK}\"")).expect("a marked raw value ends");
        out.push_str(&after[..end]);
        rest = &after[end + MARK.len() + 1..];
    }
    out.push_str(rest);
    out
}

/// Bytes JSON and protobuf give meaning to.
const SPECIAL: &[u8] = b"\0\xff\"{}[],:-+.eE0919\\ \n\x80\x7f\x08\x0a\x12\x1a";

/// One byte-level change: a bit flipped, a byte set, a range deleted, duplicated or
/// filled with random bytes, a truncation, or a splice with `donor` (any other input).
pub fn mutate_bytes(rng: &mut Rng, bytes: &mut Vec<u8>, donor: &[u8]) {
    if bytes.is_empty() {
        bytes.extend_from_slice(&donor[..donor.len().min(64)]);
        return;
    }
    let len = bytes.len();
    let at = rng.below(len);
    let span = 1 + rng.below(len.min(64));
    match rng.below(8) {
        0 => bytes[at] ^= 1 << rng.below(8),
        1 => bytes[at] = *rng.pick(SPECIAL),
        2 => {
            bytes.drain(at..(at + span).min(len));
        }
        3 => {
            let chunk: Vec<u8> = bytes[at..(at + span).min(len)].to_vec();
            let to = rng.below(len + 1);
            bytes.splice(to..to, chunk);
        }
        4 => {
            let chunk: Vec<u8> = (0..span).map(|_| rng.next_u64() as u8).collect();
            bytes.splice(at..at, chunk);
        }
        5 => bytes.truncate(at),
        6 if !donor.is_empty() => {
            let from = rng.below(donor.len());
            bytes.truncate(at);
            bytes.extend_from_slice(&donor[from..]);
        }
        _ => {
            let end = (at + span).min(len);
            let fill = *rng.pick(SPECIAL);
            bytes[at..end].iter_mut().for_each(|b| *b = fill);
        }
    }
}
