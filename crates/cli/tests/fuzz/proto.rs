//! Protobuf's wire format, schema-free: ONNX files taken apart into fields, a field
//! changed anywhere in the tree (a dimension of 2^63, a negative stride, a name
//! pointing elsewhere, a field dropped or repeated), and put together again. Also the
//! encoder of the small ONNX model among the seeds.

use super::Rng;

/// One field on the wire.
#[derive(Debug, Clone)]
pub enum Field {
    Varint(u32, u64),
    Fixed64(u32, u64),
    Len(u32, Vec<u8>),
    Fixed32(u32, u32),
}

impl Field {
    fn number(&self) -> u32 {
        match *self {
            Field::Varint(n, _) | Field::Fixed64(n, _) | Field::Len(n, _) | Field::Fixed32(n, _) => n,
        }
    }
}

fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at)?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The fields of a message, or `None` if the bytes are not one.
pub fn parse(bytes: &[u8]) -> Option<Vec<Field>> {
    let mut at = 0;
    let mut fields = Vec::new();
    while at < bytes.len() {
        let key = varint(bytes, &mut at)?;
        let number = u32::try_from(key >> 3).ok().filter(|&n| n > 0)?;
        fields.push(match key & 7 {
            0 => Field::Varint(number, varint(bytes, &mut at)?),
            1 => {
                let b = bytes.get(at..at + 8)?;
                at += 8;
                Field::Fixed64(number, u64::from_le_bytes(b.try_into().ok()?))
            }
            2 => {
                let len = usize::try_from(varint(bytes, &mut at)?).ok()?;
                let b = bytes.get(at..at.checked_add(len)?)?;
                at += len;
                Field::Len(number, b.to_vec())
            }
            5 => {
                let b = bytes.get(at..at + 4)?;
                at += 4;
                Field::Fixed32(number, u32::from_le_bytes(b.try_into().ok()?))
            }
            _ => return None,
        });
    }
    Some(fields)
}

/// The bytes of a message.
pub fn encode(fields: &[Field]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in fields {
        match f {
            Field::Varint(n, v) => {
                put_varint(&mut out, u64::from(*n) << 3);
                put_varint(&mut out, *v);
            }
            Field::Fixed64(n, v) => {
                put_varint(&mut out, u64::from(*n) << 3 | 1);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Field::Len(n, b) => {
                put_varint(&mut out, u64::from(*n) << 3 | 2);
                put_varint(&mut out, b.len() as u64);
                out.extend_from_slice(b);
            }
            Field::Fixed32(n, v) => {
                put_varint(&mut out, u64::from(*n) << 3 | 5);
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    out
}

/// Names the ONNX importer gives meaning to: ops, attributes, `auto_pad` values.
const NAMES: &[&str] = &[
    "Conv",
    "Relu",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "Gemm",
    "MatMul",
    "Add",
    "Sum",
    "Mul",
    "Concat",
    "Transpose",
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Softmax",
    "LogSoftmax",
    "Dropout",
    "LRN",
    "BatchNormalization",
    "LayerNormalization",
    "Gather",
    "Constant",
    "ConstantOfShape",
    "Shape",
    "Cast",
    "Identity",
    "Gelu",
    "Sigmoid",
    "Loop",
    "If",
    "Split",
    "kernel_shape",
    "strides",
    "pads",
    "dilations",
    "group",
    "axis",
    "axes",
    "perm",
    "auto_pad",
    "ceil_mode",
    "epsilon",
    "value",
    "to",
    "transA",
    "transB",
    "SAME_UPPER",
    "SAME_LOWER",
    "VALID",
    "NOTSET",
    "x",
    "y",
    "w",
    "",
    "N",
];

/// Varints worth trying: edges of signed and unsigned 32- and 64-bit integers (a
/// negative `int64` is ten bytes of ones), zero, counts no model has.
fn interesting_varint(rng: &mut Rng, old: u64) -> u64 {
    *rng.pick(&[
        0,
        1,
        2,
        3,
        7,
        u64::MAX,
        u64::MAX - 1,
        (-2i64) as u64,
        (-1000i64) as u64,
        i64::MIN as u64,
        i64::MAX as u64,
        u32::MAX as u64,
        1 << 31,
        1 << 32,
        1 << 40,
        1_000_000_000,
        1_000_000_000_000,
        old.wrapping_add(1),
        old.wrapping_sub(1),
        old.wrapping_mul(1000),
    ])
}

/// One change somewhere in the message's tree, `names`: strings of the file (value
/// names) a field may be set to.
pub fn mutate(rng: &mut Rng, bytes: &[u8], names: &[Vec<u8>]) -> Vec<u8> {
    let Some(mut fields) = parse(bytes).filter(|f| !f.is_empty()) else {
        let mut b = bytes.to_vec();
        super::mutate_bytes(rng, &mut b, b"");
        return b;
    };
    let i = rng.below(fields.len());
    // Into a nested message, most of the time.
    if let Field::Len(n, inner) = &fields[i] {
        if !rng.one_in(4) && parse(inner).is_some_and(|f| !f.is_empty()) {
            fields[i] = Field::Len(*n, mutate(rng, inner, names));
            return encode(&fields);
        }
    }
    match rng.below(8) {
        0 => {
            fields.remove(i);
        }
        1 => {
            let f = fields[i].clone();
            let copies = if rng.one_in(8) { 1 + rng.below(2000) } else { 1 };
            let at = rng.below(fields.len() + 1);
            fields.splice(at..at, std::iter::repeat_n(f, copies));
        }
        2 => {
            let j = rng.below(fields.len());
            fields.swap(i, j);
        }
        _ => {
            fields[i] = match &fields[i] {
                Field::Varint(n, v) => Field::Varint(*n, interesting_varint(rng, *v)),
                Field::Fixed32(n, v) => Field::Fixed32(
                    *n,
                    *rng.pick(&[0f32.to_bits(), (-1f32).to_bits(), f32::NAN.to_bits(), f32::INFINITY.to_bits(), !*v]),
                ),
                Field::Fixed64(n, v) => Field::Fixed64(*n, *rng.pick(&[0, u64::MAX, f64::NAN.to_bits(), !*v])),
                Field::Len(n, b) => Field::Len(*n, mutate_len(rng, b, names)),
            };
            // Sometimes the same number with another wire type.
            if rng.one_in(16) {
                let n = fields[i].number();
                fields[i] = Field::Varint(n, interesting_varint(rng, 0));
            }
        }
    }
    encode(&fields)
}

/// A string, bytes or packed array changed: another name, a packed varint changed or
/// repeated, bytes mutated.
fn mutate_len(rng: &mut Rng, b: &[u8], names: &[Vec<u8>]) -> Vec<u8> {
    match rng.below(4) {
        0 => rng.pick(NAMES).as_bytes().to_vec(),
        1 if !names.is_empty() => rng.pick(names).clone(),
        2 => {
            // As packed varints (dims, int64 data).
            let mut at = 0;
            let mut vs = Vec::new();
            while at < b.len() {
                match varint(b, &mut at) {
                    Some(v) => vs.push(v),
                    None => break,
                }
            }
            if vs.is_empty() {
                vs.push(0);
            }
            let k = rng.below(vs.len());
            vs[k] = interesting_varint(rng, vs[k]);
            if rng.one_in(4) {
                let v = vs[k];
                vs.extend(std::iter::repeat_n(v, rng.below(5000)));
            }
            let mut out = Vec::new();
            vs.iter().for_each(|&v| put_varint(&mut out, v));
            out
        }
        _ => {
            let mut out = b.to_vec();
            super::mutate_bytes(rng, &mut out, b"");
            out
        }
    }
}

/// Every string-like field of the tree: the value and node names of a model.
pub fn strings(bytes: &[u8], out: &mut Vec<Vec<u8>>) {
    for f in parse(bytes).unwrap_or_default() {
        if let Field::Len(_, b) = f {
            match parse(&b) {
                Some(inner) if !inner.is_empty() && !b.iter().all(|c| c.is_ascii_graphic()) => strings(&b, out),
                _ if b.len() < 32 && !out.contains(&b) => out.push(b),
                _ => {}
            }
        }
    }
}

/// A message builder: fields in the order given.
#[derive(Default)]
pub struct Msg(Vec<Field>);

impl Msg {
    pub fn int(mut self, n: u32, v: i64) -> Msg {
        self.0.push(Field::Varint(n, v as u64));
        self
    }
    pub fn str(mut self, n: u32, s: &str) -> Msg {
        self.0.push(Field::Len(n, s.as_bytes().to_vec()));
        self
    }
    pub fn bytes(mut self, n: u32, b: &[u8]) -> Msg {
        self.0.push(Field::Len(n, b.to_vec()));
        self
    }
    pub fn msg(mut self, n: u32, m: Msg) -> Msg {
        self.0.push(Field::Len(n, encode(&m.0)));
        self
    }
    pub fn encode(&self) -> Vec<u8> {
        encode(&self.0)
    }
}

// onnx.proto's field numbers, as `pebble_onnx::proto` declares them.
fn ints_attr(name: &str, v: &[i64]) -> Msg {
    v.iter().fold(Msg::default().str(1, name).int(20, 7), |m, &x| m.int(8, x))
}
fn int_attr(name: &str, v: i64) -> Msg {
    Msg::default().str(1, name).int(20, 2).int(3, v)
}
fn node(op: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<Msg>) -> Msg {
    let m = inputs.iter().fold(Msg::default(), |m, i| m.str(1, i));
    let m = outputs.iter().fold(m, |m, o| m.str(2, o)).str(3, outputs[0]).str(4, op);
    attrs.into_iter().fold(m, |m, a| m.msg(5, a))
}
fn weight(name: &str, dims: &[i64]) -> Msg {
    dims.iter().fold(Msg::default(), |m, &d| m.int(1, d)).int(2, 1).str(8, name)
}
fn shape_value(name: &str, dims: &[i64], batch: Option<&str>) -> Msg {
    let shape = dims.iter().enumerate().fold(Msg::default(), |m, (k, &d)| match (k, batch) {
        (0, Some(sym)) => m.msg(1, Msg::default().str(2, sym)),
        _ => m.msg(1, Msg::default().int(1, d)),
    });
    Msg::default().str(1, name).msg(2, Msg::default().msg(1, Msg::default().int(1, 1).msg(2, shape)))
}

/// A small CNN written here, as `crates/onnx/tests/import.rs`'s `small_cnn`: a
/// `SAME_UPPER` strided convolution, per-channel scale and bias, a ceil-mode pool, a
/// shape computed with `Shape`, `Gather` and `Concat`, two `MatMul`s, a trailing softmax;
/// and a `ConstantOfShape` weight, as the ONNX test suite's light models have.
pub fn small_cnn() -> Vec<u8> {
    let auto_pad = Msg::default().str(1, "auto_pad").int(20, 3).bytes(4, b"SAME_UPPER");
    let nodes = vec![
        node("Conv", &["x", "w"], &["c"], vec![ints_attr("strides", &[2, 2]), auto_pad]),
        node("Mul", &["c", "s"], &["m"], vec![]),
        node("Add", &["m", "b"], &["a"], vec![]),
        node("Relu", &["a"], &["r"], vec![]),
        node(
            "MaxPool",
            &["r"],
            &["p"],
            vec![ints_attr("kernel_shape", &[3, 3]), ints_attr("strides", &[2, 2]), int_attr("ceil_mode", 1)],
        ),
        node("Shape", &["p"], &["ps"], vec![]),
        node("Gather", &["ps", "zero"], &["n"], vec![int_attr("axis", 0)]),
        node("Concat", &["n", "minus1"], &["t"], vec![int_attr("axis", 0)]),
        node("Reshape", &["p", "t"], &["f"], vec![]),
        node("MatMul", &["f", "wfc"], &["h"], vec![]),
        node("Add", &["h", "bfc"], &["hb"], vec![]),
        node("Relu", &["hb"], &["h2"], vec![]),
        node("ConstantOfShape", &["sqshape"], &["wsq"], vec![]),
        node("MatMul", &["h2", "wsq"], &["o"], vec![]),
        node("Softmax", &["o"], &["y"], vec![]),
    ];
    let int64s = |name: &str, v: &[i64]| {
        let mut packed = Vec::new();
        v.iter().for_each(|&x| put_varint(&mut packed, x as u64));
        Msg::default().int(1, v.len() as i64).int(2, 7).bytes(7, &packed).str(8, name)
    };
    let inits = vec![
        weight("w", &[8, 3, 3, 3]),
        weight("s", &[8, 1, 1]),
        weight("b", &[1, 8, 1, 1]),
        Msg::default().int(1, 1).int(2, 7).str(8, "zero").bytes(9, &0i64.to_le_bytes()),
        int64s("minus1", &[-1]),
        int64s("sqshape", &[16, 16]),
        weight("wfc", &[8 * 5 * 5, 16]),
        weight("bfc", &[16]),
    ];
    let graph = nodes.into_iter().fold(Msg::default(), |g, n| g.msg(1, n)).str(2, "g");
    let graph = inits.into_iter().fold(graph, |g, t| g.msg(5, t));
    let graph = graph.msg(11, shape_value("x", &[1, 3, 19, 19], Some("N"))).msg(12, Msg::default().str(1, "y"));
    Msg::default().int(1, 8).msg(8, Msg::default().str(1, "").int(2, 13)).str(2, "pebble fuzz").msg(7, graph).encode()
}
