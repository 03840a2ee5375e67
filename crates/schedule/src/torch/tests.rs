use super::*;
use crate::PipeStage;

fn run(device: usize, stage: usize, micro: i64, pass: Pass) -> Op {
    Op::Run { device, stage, micro, pass }
}

/// Stages of `layers` chain stages each, stage `i` on device `device(i)`.
fn stages(n: usize, layers: usize, device: impl Fn(usize) -> usize) -> Vec<PipeStage> {
    (0..n).map(|i| PipeStage { first: i * layers, last: i * layers + layers - 1, device: device(i) }).collect()
}

/// The periodic 1F1B\* pattern of `p` balanced stages (`u_F = 1`, `u_B = 2`) at
/// period `t` (Shilova, Alg. 6), as `pebble_solve::pipeline::onef1b::pattern`
/// builds it: (time, F before B at a tie, op), sorted.
fn one_f_one_b_star(p: usize, layers: usize, t: i64) -> Schedule {
    let (uf, ub) = (1i64, 2i64);
    // Groups from the last stage, each as long as its load fits in t.
    let mut g = vec![0i64; p];
    let (mut group, mut load) = (1, 0);
    for r in (0..p).rev() {
        if load > 0 && load + uf + ub > t {
            group += 1;
            load = 0;
        }
        load += uf + ub;
        g[r] = group;
    }
    let big_g = g[0];
    let tf: Vec<i64> = (0..p as i64).map(|r| r * uf).collect();
    let mut tb = vec![0; p];
    let mut r = p;
    while r > 0 {
        let j = r - 1;
        let mut i = j;
        while i > 0 && g[i - 1] == g[j] {
            i -= 1;
        }
        let mut clock = tf[j] + uf;
        for m in (i..=j).rev() {
            tb[m] = clock;
            clock += ub;
        }
        r = i;
    }
    let mut timed = Vec::new();
    for s in 0..p {
        timed.push((tf[s] % t, 0, run(s, s, big_g - 1 - tf[s] / t, Pass::F)));
        timed.push((tb[s] % t, 1, run(s, s, big_g - g[s] - tb[s] / t, Pass::B)));
    }
    timed.sort_by_key(|&(at, kind, _)| (at, kind));
    let ops = timed.into_iter().map(|(_, _, op)| op).collect();
    let mut s = Schedule::pipeline(p, 1, stages(p, layers, |i| i), ops).with_sends();
    s.periodic = true;
    s
}

/// 4 stages on 2 devices, interleaved (stages 0 and 2 on device 0, 1 and 3 on 1),
/// one flushed step over 4 micro-batches: breadth first, stages 2 and 3 with a split
/// backward, stage 3's W right after each I, stage 2's deferred to the end.
fn interleaved_split() -> Schedule {
    // Each (device, stage, passes) over micro-batches 0..4, in this order.
    let blocks: [(usize, usize, &[Pass]); 9] = [
        (0, 0, &[Pass::F]),
        (1, 1, &[Pass::F]),
        (0, 2, &[Pass::F]),
        (1, 3, &[Pass::F]),
        (1, 3, &[Pass::I, Pass::W]),
        (0, 2, &[Pass::I]),
        (1, 1, &[Pass::B]),
        (0, 0, &[Pass::B]),
        (0, 2, &[Pass::W]),
    ];
    let ops = blocks
        .iter()
        .flat_map(|&(device, stage, passes)| {
            (0..4).flat_map(move |m| passes.iter().map(move |&p| run(device, stage, m, p)))
        })
        .collect();
    Schedule::pipeline(2, 4, stages(4, 2, |i| i % 2), ops).with_sends()
}

#[test]
fn a_two_stage_flushed_schedule_exports_exactly() {
    // GPipe-like on device 0, 1F1B on device 1, over 2 micro-batches.
    let s = Schedule::pipeline(
        2,
        2,
        vec![PipeStage { first: 0, last: 1, device: 0 }, PipeStage { first: 2, last: 2, device: 1 }],
        vec![
            run(0, 0, 0, Pass::F),
            run(0, 0, 1, Pass::F),
            run(1, 1, 0, Pass::F),
            run(1, 1, 0, Pass::B),
            run(1, 1, 1, Pass::F),
            run(1, 1, 1, Pass::B),
            run(0, 0, 0, Pass::B),
            run(0, 0, 1, Pass::B),
        ],
    )
    .with_sends();
    assert_eq!(export(&s, 2).unwrap(), "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
    assert_eq!(export(&s, 0).unwrap(), export(&s, 2).unwrap(), "0 means the schedule's own count");
    assert_eq!(stage_to_rank(&s), vec![0, 1]);
    let e = export(&s, 3).unwrap_err();
    assert_eq!(
        e,
        "this schedule is one flushed step over 2 micro-batches; it cannot run 3 (plan it for 3, or export 2)"
    );
}

#[test]
fn a_periodic_schedule_unrolls_with_a_fill_and_a_drain() {
    // 1F1B* at the period of one stage is 1F1B: stage r holds P − r activations.
    let s = one_f_one_b_star(2, 4, 3);
    assert_eq!(
        s.ops.iter().filter(|o| matches!(o, Op::Run { .. })).copied().collect::<Vec<_>>(),
        vec![run(0, 0, 1, Pass::F), run(1, 1, 1, Pass::F), run(0, 0, 0, Pass::B), run(1, 1, 1, Pass::B)]
    );
    assert_eq!(export(&s, 4).unwrap(), "0F0,0F1,0B0,0F2,0B1,0F3,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n");
    assert_eq!(export(&s, 1).unwrap(), "0F0,0B0\n1F0,1B0\n");
    let four = export(&one_f_one_b_star(4, 2, 3), 6).unwrap();
    let rows: Vec<&str> = four.lines().collect();
    assert_eq!(rows[0], "0F0,0F1,0F2,0F3,0B0,0F4,0B1,0F5,0B2,0B3,0B4,0B5", "P − 1 forwards of fill, then 1F1B");
    assert_eq!(rows[2], "2F0,2F1,2B0,2F2,2B1,2F3,2B2,2F4,2B3,2F5,2B4,2B5");
    assert_eq!(rows[3], "3F0,3B0,3F1,3B1,3F2,3B2,3F3,3B3,3F4,3B4,3F5,3B5");
    assert!(export(&s, 0).unwrap_err().contains("at least 1"));
}

#[test]
fn a_schedule_that_is_not_a_pipeline_is_refused() {
    let chain = Schedule::from_notation(View::Chain, "F0all L B0").unwrap().resolve_loss(1);
    assert_eq!(
        export(&chain, 4).unwrap_err(),
        "PyTorch's pipeline runtime runs pipeline schedules (view `pipeline`, as `pebble pipeline` plans them), not a chain schedule"
    );
    let graph = Schedule::new(View::Graph, vec![Op::Compute { node: 0, no_grad: false }]);
    assert!(export(&graph, 4).unwrap_err().ends_with("not a graph schedule"));
}

#[test]
fn what_pytorch_would_reject_is_refused_with_the_reason() {
    let mut s = one_f_one_b_star(2, 1, 3);
    s.devices = Some(3);
    assert!(export(&s, 2).unwrap_err().starts_with("device 2 runs no stage"), "{}", export(&s, 2).unwrap_err());
    // A missing backward.
    let mut s = one_f_one_b_star(2, 1, 3);
    s.ops.retain(|o| !matches!(o, Op::Run { stage: 1, pass: Pass::B, .. }));
    assert_eq!(export(&s, 2).unwrap_err(), "stage 1 never runs its backward on micro-batch 0");
    // Stage 1's backward before stage 0's forward reaches it: each rank waits.
    let s = Schedule::pipeline(
        2,
        1,
        stages(2, 1, |i| i),
        vec![run(1, 1, 0, Pass::B), run(1, 1, 0, Pass::F), run(0, 0, 0, Pass::F), run(0, 0, 0, Pass::B)],
    );
    assert_eq!(export(&s, 1).unwrap_err(), "stage 1 runs its backward before its forward on micro-batch 0");
    // Rank 0 runs B of micro-batch 0 before F of micro-batch 1, which rank 1 needs first.
    let s = Schedule::pipeline(
        2,
        2,
        stages(2, 1, |i| i),
        vec![
            run(0, 0, 0, Pass::F),
            run(0, 0, 0, Pass::B),
            run(0, 0, 1, Pass::F),
            run(0, 0, 1, Pass::B),
            run(1, 1, 0, Pass::F),
            run(1, 1, 1, Pass::F),
            run(1, 1, 0, Pass::B),
            run(1, 1, 1, Pass::B),
        ],
    );
    assert_eq!(
        export(&s, 2).unwrap_err(),
        "the order cannot run: each rank waits on another (rank 0 at 0B0, rank 1 at 1F1)"
    );
    // W before I.
    let mut s = interleaved_split();
    let w = s.ops.iter().position(|o| matches!(o, Op::Run { stage: 3, micro: 0, pass: Pass::W, .. })).unwrap();
    let i = s.ops.iter().position(|o| matches!(o, Op::Run { stage: 3, micro: 0, pass: Pass::I, .. })).unwrap();
    s.ops.swap(w, i);
    assert_eq!(export(&s, 4).unwrap_err(), "stage 3 runs W before I on micro-batch 0");
}

// The plans `scripts/torch_pipeline.py` runs on PyTorch ranks: the plan in pebble's
// format and its export, both files checked here against the schedules built in code,
// so that neither drifts.
const FIXTURES: [(&str, &str, &str, usize); 3] = [
    (
        "1f1b-2",
        include_str!("../../../../scripts/fixtures/torch/1f1b-2.json"),
        include_str!("../../../../scripts/fixtures/torch/1f1b-2.csv"),
        4,
    ),
    (
        "1f1b-star-4",
        include_str!("../../../../scripts/fixtures/torch/1f1b-star-4.json"),
        include_str!("../../../../scripts/fixtures/torch/1f1b-star-4.csv"),
        8,
    ),
    (
        "interleaved-split-4",
        include_str!("../../../../scripts/fixtures/torch/interleaved-split-4.json"),
        include_str!("../../../../scripts/fixtures/torch/interleaved-split-4.csv"),
        4,
    ),
];

#[test]
fn the_fixtures_are_these_schedules_and_their_exports() {
    let built = [one_f_one_b_star(2, 4, 3), one_f_one_b_star(4, 2, 6), interleaved_split()];
    let expected = [
        "0F0,0F1,0B0,0F2,0B1,0F3,0B2,0B3\n\
         1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n",
        // 1F1B* at twice the period: groups of two stages, so stages 0 and 1 hold
        // two activations and stages 2 and 3 one (1F1B holds 4, 3, 2, 1).
        "0F0,0F1,0B0,0F2,0B1,0F3,0B2,0F4,0B3,0F5,0B4,0F6,0B5,0F7,0B6,0B7\n\
         1F0,1F1,1B0,1F2,1B1,1F3,1B2,1F4,1B3,1F5,1B4,1F6,1B5,1F7,1B6,1B7\n\
         2F0,2B0,2F1,2B1,2F2,2B2,2F3,2B3,2F4,2B4,2F5,2B5,2F6,2B6,2F7,2B7\n\
         3F0,3B0,3F1,3B1,3F2,3B2,3F3,3B3,3F4,3B4,3F5,3B5,3F6,3B6,3F7,3B7\n",
        "0F0,0F1,0F2,0F3,2F0,2F1,2F2,2F3,2I0,2I1,2I2,2I3,0B0,0B1,0B2,0B3,2W0,2W1,2W2,2W3\n\
         1F0,1F1,1F2,1F3,3F0,3F1,3F2,3F3,3I0,3W0,3I1,3W1,3I2,3W2,3I3,3W3,1B0,1B1,1B2,1B3\n",
    ];
    for (((name, json, csv, count), s), text) in FIXTURES.iter().zip(&built).zip(expected) {
        assert_eq!(&Schedule::from_json(json).unwrap(), s, "{name}.json");
        assert_eq!(export(s, *count).unwrap(), text, "{name}");
        assert_eq!(*csv, text, "{name}.csv");
    }
    assert_eq!(stage_to_rank(&built[2]), vec![0, 1, 0, 1]);
}
