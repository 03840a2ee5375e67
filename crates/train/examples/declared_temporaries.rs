//! Each op's declared temporary memory on burn-flex (`OpDecl::burn_flex_tmp`) against what
//! burn-flex allocates for it, measured by the profiler with a counting allocator: one line
//! per op kind and shapes, forward and backward, in bytes, with OVER where the measure
//! is above the declaration.
//!
//! Usage: cargo run -p pebble-train --example declared_temporaries -- MODEL [LAYERS SEQ|IMAGE BATCH WIDTH HEADS]

use burn_flex::{Flex, FlexDevice};
use pebble_runtime::memory::CountingAlloc;
use pebble_zoo::{ModelOptions, Temporaries};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |k: usize| args.get(k).and_then(|a| a.parse().ok());
    let model = args.first().map(String::as_str).unwrap_or("gpt");
    // The second number is the image's side for an image model, the sequence otherwise.
    let (seq, image) = if model == "resnet" { (None, arg(2)) } else { (arg(2), None) };
    let options =
        ModelOptions { layers: arg(1), seq, image, batch: arg(3), width: arg(4), heads: arg(5), ..Default::default() };
    // What the ops declare for burn-flex, which is what runs here.
    let options = ModelOptions { temporaries: Some(Temporaries::BurnFlex), ..options };
    let net = pebble_zoo::build(model, &options).expect("a zoo model").network;
    let profile = pebble_runtime::profile::profile::<Flex>(&net, &FlexDevice, 1).expect("profiled");
    let float = net.dtype.bytes();
    let mut seen = std::collections::HashSet::new();
    for (o, op) in net.ops.iter().enumerate() {
        let shapes: Vec<&Vec<usize>> = op.inputs.iter().map(|&t| &net.tensors[t].shape).collect();
        if op.decl.view || !seen.insert(format!("{:?}{shapes:?}", op.kind)) {
            continue;
        }
        let (df, db) = op.decl.tmp_bytes(net.temporaries, float);
        let (mf, mb) = (profile.forward[o].1, profile.backward[o].1);
        // Above the declaration by more than the allocator's bookkeeping of an op, the
        // slack `pebble-runtime`'s `declared_temporaries` test allows.
        let flag = |m: u64, d: u64| if m > d + (8 << 10) { " OVER" } else { "" };
        println!(
            "{:<40} fwd declared {df:>11} measured {mf:>11}{}  bwd declared {db:>11} measured {mb:>11}{}",
            format!("{:?}", op.kind).chars().take(40).collect::<String>(),
            flag(mf, df),
            flag(mb, db)
        );
    }
}
