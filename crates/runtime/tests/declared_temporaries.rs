//! Each op's declaration is true of what burn-flex allocates: the temporary memory an op
//! declares for pebble's executor on burn-flex (`OpDecl::burn_flex_tmp`, forward and
//! backward) bounds what the profiler measures for it with a
//! counting allocator, and is not far above it, on every op of the zoo's models the
//! executor runs (small sizes, several shapes per kind).
//!
//! What is measured is the peak above what was live before the op plus what it leaves
//! (`pebble_runtime::profile`), the quantity the simulator adds to the live set while an
//! op runs. Where a declaration is under, a plan on the default (analytic) costs runs over
//! its budget; where it is far over, the planner wastes the budget.
//!
//! Each op also leaves nothing live but its results (`Profile::leftover`).
//!
//! One test in this binary: the allocation counters are global to the process.

use std::collections::HashSet;

use burn_flex::{Flex, FlexDevice};
use pebble_runtime::memory::CountingAlloc;
use pebble_zoo::{ModelOptions, Temporaries};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Measured bytes a declaration may miss: the allocator's bookkeeping of an op (shapes,
/// strides, small index buffers), not tensors.
const SLACK_BYTES: u64 = 8 << 10;

/// How far above the measure a declaration may go, beyond [`SLACK_BYTES`].
const OVER: f64 = 4.0;

fn models() -> Vec<(&'static str, ModelOptions)> {
    let o = ModelOptions::default;
    vec![
        (
            "gpt",
            ModelOptions { layers: Some(1), width: Some(64), heads: Some(2), seq: Some(64), batch: Some(4), ..o() },
        ),
        (
            "gpt",
            ModelOptions { layers: Some(1), width: Some(96), heads: Some(3), seq: Some(32), batch: Some(2), ..o() },
        ),
        (
            "gpt",
            ModelOptions { layers: Some(1), width: Some(128), heads: Some(4), seq: Some(256), batch: Some(8), ..o() },
        ),
        ("mlp", ModelOptions { layers: Some(3), batch: Some(16), ..o() }),
        ("mlp", ModelOptions { layers: Some(2), batch: Some(64), width: Some(256), ..o() }),
        ("resnet", ModelOptions { layers: Some(2), image: Some(32), batch: Some(2), ..o() }),
    ]
}

#[test]
fn declared_temporaries_bound_what_burn_flex_allocates() {
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (model, options) in models() {
        let net = pebble_zoo::build(model, &options).expect("a zoo model").network;
        let profile = pebble_runtime::profile::profile::<Flex>(&net, &FlexDevice, 1).expect("profiled");
        let float = net.dtype.bytes();
        let mut seen = HashSet::new();
        for (o, op) in net.ops.iter().enumerate() {
            let shapes: Vec<&Vec<usize>> = op.inputs.iter().map(|&t| &net.tensors[t].shape).collect();
            if op.decl.view || !seen.insert(format!("{:?}{shapes:?}", op.kind)) {
                continue;
            }
            // A loss's forward and backward run as one op, measured as its backward.
            let (fwd, bwd) = op.decl.tmp_bytes(Temporaries::BurnFlex, float);
            let grad = net.tensors[op.output].requires_grad || op.decl.loss;
            let pairs =
                [("forward", fwd, profile.forward[o].1, !op.decl.loss), ("backward", bwd, profile.backward[o].1, grad)];
            // An op leaves its results and nothing more (a result that is a slice of a
            // larger buffer keeps it whole: what no declaration frees).
            if profile.leftover[o] > SLACK_BYTES {
                let left = profile.leftover[o];
                wrong.push(format!("{model} {:?} on {shapes:?}: leaves {left} B beyond its results", op.kind));
            }
            for (what, declared, measured, ran) in pairs {
                if !ran {
                    continue;
                }
                checked += 1;
                let under = measured > declared + SLACK_BYTES;
                let over = declared as f64 > OVER * measured as f64 + SLACK_BYTES as f64;
                if under || over {
                    wrong.push(format!(
                        "{model} {:?} on {shapes:?}: {what} declares {declared} B, burn-flex allocates {measured} B",
                        op.kind
                    ));
                }
            }
        }
    }
    assert!(checked >= 40, "only {checked} ops measured");
    assert!(wrong.is_empty(), "{} of {checked} declarations are not true:\n{}", wrong.len(), wrong.join("\n"));
}
