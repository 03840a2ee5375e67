//! Hand-computed and property tests. Every number asserted here was worked out by hand
//! (see the comments) or by the independent reference simulator at the bottom.

use std::collections::BTreeSet;

use pebble_graph::{Chain, ComputeKind, ComputeNode, DataKind, DataNode, TrainingGraph};
use pebble_schedule::{ForwardMode, Op, Schedule, Tensor, View};
use pebble_testkit::{ChainSpec, Rng};

use crate::{
    simulate_chain, simulate_graph, Lane, Link, Machine, MemoryPoint, SimConfig, SimError, SimReport, TransferMemory,
};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

fn cfg() -> SimConfig {
    SimConfig::default()
}

fn budget(b: u64) -> SimConfig {
    SimConfig { budget: Some(b), ..SimConfig::default() }
}

fn sched(text: &str, l: usize) -> Schedule {
    Schedule::from_notation(View::Chain, text).unwrap().resolve_loss(l)
}

/// Inserts transfers/frees into a chain schedule: `ops` with `extra` placed before index.
fn with(mut s: Schedule, extra: &[(usize, Op)]) -> Schedule {
    for &(at, op) in extra.iter().rev() {
        s.ops.insert(at, op);
    }
    s
}

/// L = 2, x = [1,2,3], xbar = [1,4,5], ftmp = [1,2], btmp = [3,1,2], ftime = [1,2],
/// btime = [3,4,5] (btime[2] is the loss), static 10.
fn chain2() -> Chain {
    Chain {
        utmp: None,
        name: None,
        ftime: vec![1.0, 2.0],
        btime: vec![3.0, 4.0, 5.0],
        x: vec![1, 2, 3],
        xbar: vec![1, 4, 5],
        ftmp: vec![1, 2],
        btmp: vec![3, 1, 2],
        w: None,
        g: None,
        o: None,
        static_bytes: 10,
    }
}

fn run(chain: &Chain, text: &str) -> SimReport {
    simulate_chain(chain, &sched(text, chain.len()), &cfg()).unwrap()
}

fn err(chain: &Chain, text: &str, config: &SimConfig) -> SimError {
    simulate_chain(chain, &sched(text, chain.len()), config).unwrap_err()
}

// ----- 1. hand-computed chain schedules ----------------------------------------------------

#[test]
fn store_all_by_hand() {
    // base = static 10 + a_0 1 = 11.
    // F0all [0,1]: 11 + ā_1 4 + tmp 1 = 16, then 15.
    // F1all [1,3]: 15 + ā_2 5 + tmp 2 = 22, then 20.
    // L     [3,8]: 20 + δ_2 3 + tmp 2 = 25, then 23.
    // B1   [8,12]: 23 + δ_1 2 + tmp 1 = 26; releases δ_2 3, ā_2 5 -> 17.
    // B0  [12,15]: 17 + δ_0 1 + tmp 3 = 21; releases δ_1 2, ā_1 4, a_0 1 -> 11.
    let chain = chain2();
    let s = sched("F0all F1all B2 B1 B0", 2);
    let r = simulate_chain(&chain, &s, &SimConfig { timeline: true, ..cfg() }).unwrap();
    assert_eq!(r.peak_bytes, 26);
    assert_eq!(r.makespan, 15.0);
    assert_eq!(r.compute_time, 15.0);
    assert_eq!(r.compute_ops, 5);
    assert_eq!(r.peak_host_bytes, 0);
    let pts: Vec<(f64, u64)> = r.timeline.iter().map(|p| (p.time, p.bytes)).collect();
    assert_eq!(pts, vec![(0.0, 11), (0.0, 16), (1.0, 22), (3.0, 25), (8.0, 26), (12.0, 21), (15.0, 11)]);
    // Without a timeline the report has none.
    assert!(run(&chain, "F0all F1all L B1 B0").timeline.is_empty());
}

/// Through the caching allocator every block is at least 512 bytes, in one 2 MiB segment
/// here: at `B1`'s start 7 blocks live (static, a_0, ā_1, ā_2, δ_2, δ_1 and its
/// temporary), 3,584 bytes allocated. A budget that holds the bytes (26) cannot hold the
/// segment: the allocator is out of memory before the first op.
#[test]
fn store_all_through_the_caching_allocator() {
    let chain = chain2();
    let caching = Some(crate::allocator::AllocatorConfig::default());
    let s = sched("F0all F1all B2 B1 B0", 2);
    let r = simulate_chain(&chain, &s, &SimConfig { allocator: caching, ..cfg() }).unwrap();
    let a = r.allocator.expect("the allocator's report");
    assert_eq!((a.peak_allocated, a.peak_reserved), (7 * 512, 2 << 20));
    assert_eq!(r.peak_bytes, 26, "the bytes are counted as without it");
    assert!(run(&chain, "F0all F1all B2 B1 B0").allocator.is_none());
    let e = simulate_chain(&chain, &s, &SimConfig { allocator: caching, ..budget(26) }).unwrap_err();
    assert!(matches!(e, SimError::OutOfMemory { op: 0, .. }), "{e}");
}

#[test]
fn recompute_by_hand() {
    // F0ck  [0,1]:   11 + a_1 2 + 1 = 14 -> 13
    // F1ck  [1,3]:   13 + a_2 3 + 2 = 18 -> 16
    // L     [3,8]:   16 + δ_2 3 + 2 = 21; releases a_2 -> 16
    // F1all [8,10]:  16 + ā_2 5 + 2 = 23 -> 21
    // B1    [10,14]: 21 + δ_1 2 + 1 = 24; releases δ_2, ā_2, a_1 -> 13
    // F0all [14,15]: 13 + ā_1 4 + 1 = 18 -> 17
    // B0    [15,18]: 17 + δ_0 1 + 3 = 21 -> 11
    let chain = chain2();
    let r = run(&chain, "F0ck F1ck L F1all B1 F0all B0");
    assert_eq!(r.peak_bytes, 24);
    assert_eq!(r.makespan, 18.0);
    assert_eq!(r.compute_ops, 7);

    // F0ck 14 -> 13; F1none: 13 + 3 + 2 = 18, releases a_1 -> 14; L: 14 + 3 + 2 = 19 -> 14;
    // F0all: 14 + 4 + 1 = 19 -> 18; F1all: 18 + 5 + 2 = 25 -> 23; B1: 23 + 2 + 1 = 26 -> 17;
    // B0: 17 + 1 + 3 = 21.
    let r = run(&chain, "F0ck F1none L F0all F1all B1 B0");
    assert_eq!(r.peak_bytes, 26);
    assert_eq!(r.makespan, 18.0);
}

#[test]
fn budget_exactly_at_peak() {
    let chain = chain2();
    let s = sched("F0ck F1ck L F1all B1 F0all B0", 2);
    assert!(simulate_chain(&chain, &s, &budget(24)).is_ok());
    assert_eq!(
        simulate_chain(&chain, &s, &budget(23)).unwrap_err(),
        SimError::BudgetExceeded { op: 4, text: "B1".into(), time: 10.0, bytes: 24, budget: 23 }
    );
    assert_eq!(
        err(&chain, "F0all F1all L B1 B0", &budget(25)),
        SimError::BudgetExceeded { op: 3, text: "B1".into(), time: 8.0, bytes: 26, budget: 25 }
    );
    // The static memory and a_0 alone exceed the budget.
    assert!(matches!(
        err(&chain, "F0all F1all L B1 B0", &budget(10)),
        SimError::BudgetExceeded { op: 0, bytes: 11, budget: 10, .. }
    ));
}

#[test]
fn zero_duration_ops_still_count_their_memory() {
    // All times 0: every event happens at t = 0, yet each op's peak is counted.
    // base a_0 1. F0all: 1 + 2 + 5 = 8 -> 3. L: 3 + δ_1 1 + 7 = 11 -> 4.
    // B0: 4 + δ_0 1 + 3 = 8 -> 1.
    let chain = Chain {
        utmp: None,
        name: None,
        ftime: vec![0.0],
        btime: vec![0.0, 0.0],
        x: vec![1, 1],
        xbar: vec![1, 2],
        ftmp: vec![5],
        btmp: vec![3, 7],
        w: None,
        g: None,
        o: None,
        static_bytes: 0,
    };
    let s = sched("F0all L B0", 1);
    let r = simulate_chain(&chain, &s, &SimConfig { timeline: true, ..cfg() }).unwrap();
    assert_eq!(r.peak_bytes, 11);
    assert_eq!(r.makespan, 0.0);
    assert_eq!(r.timeline.iter().map(|p| p.bytes).max(), Some(11));
    assert_eq!(r.timeline.last(), Some(&MemoryPoint { time: 0.0, bytes: 1 }));
    assert!(matches!(
        simulate_chain(&chain, &s, &budget(10)).unwrap_err(),
        SimError::BudgetExceeded { op: 1, bytes: 11, .. }
    ));
}

// ----- 2. rejections -----------------------------------------------------------------------

#[test]
fn rejections() {
    let c = chain2();
    let big = cfg();
    // B1 before its saved set: δ_2 is there, ā_2 is not.
    assert_eq!(
        err(&c, "F0ck F1ck L B1", &big),
        SimError::MissingInput { op: 3, text: "B1".into(), tensor: Tensor::Saved(2) }
    );
    // B1 before the loss.
    assert_eq!(
        err(&c, "F0all F1all B1", &big),
        SimError::MissingInput { op: 2, text: "B1".into(), tensor: Tensor::Grad(2) }
    );
    // F0none consumed a_0.
    assert_eq!(
        err(&c, "F0none F0ck", &big),
        SimError::MissingInput { op: 1, text: "F0ck".into(), tensor: Tensor::Activation(0) }
    );
    // F1 without a_1.
    assert_eq!(
        err(&c, "F1ck", &big),
        SimError::MissingInput { op: 0, text: "F1ck".into(), tensor: Tensor::Activation(1) }
    );
    assert_eq!(
        err(&c, "F0ck F0ck", &big),
        SimError::AlreadyResident { op: 1, text: "F0ck".into(), tensor: Tensor::Activation(1) }
    );
    assert_eq!(
        err(&c, "F0all F0all", &big),
        SimError::AlreadyResident { op: 1, text: "F0all".into(), tensor: Tensor::Saved(1) }
    );
    // F0ck then F0all: a_1 and ā_1 are different tensors, both may exist.
    assert!(matches!(err(&c, "F0ck F0all", &big), SimError::Incomplete(_)));
    assert_eq!(err(&c, "F0all F1all L B1", &big), SimError::Incomplete("δ_0 was never computed".into()));
    assert!(matches!(err(&c, "F0all F1all L L", &big), SimError::InvalidOp { op: 3, .. }));
    assert!(matches!(err(&c, "F0all F1all L B1 B1", &big), SimError::InvalidOp { op: 4, .. }));
    assert!(matches!(err(&c, "F0all F2all", &big), SimError::OutOfRange { op: 1, .. }));
    assert!(matches!(err(&c, "F0all F1all B3", &big), SimError::OutOfRange { op: 2, .. }));
    // An unresolved `L` marker.
    let s = Schedule::from_notation(View::Chain, "F0all F1all L").unwrap();
    assert!(matches!(simulate_chain(&c, &s, &big).unwrap_err(), SimError::OutOfRange { op: 2, .. }));
    // Tensors that do not exist in this chain.
    for t in [Tensor::Saved(0), Tensor::Activation(3), Tensor::Grad(3), Tensor::Weight(0), Tensor::Data(0)] {
        let s = with(sched("F0all", 2), &[(1, Op::Free { tensor: t })]);
        assert!(matches!(simulate_chain(&c, &s, &big).unwrap_err(), SimError::OutOfRange { op: 1, .. }), "{t:?}");
    }
    // Freeing something held nowhere.
    let s = with(sched("F0all", 2), &[(1, Op::Free { tensor: Tensor::Grad(1) })]);
    assert!(matches!(simulate_chain(&c, &s, &big).unwrap_err(), SimError::InvalidOp { op: 1, .. }));
    // A graph op in a chain schedule.
    let s = Schedule::new(View::Chain, vec![Op::Compute { node: 0, no_grad: false }]);
    assert!(matches!(simulate_chain(&c, &s, &big).unwrap_err(), SimError::InvalidOp { op: 0, .. }));
    // Wrong view, both ways.
    let s = Schedule::new(View::Graph, vec![]);
    assert_eq!(
        simulate_chain(&c, &s, &big).unwrap_err(),
        SimError::WrongView { found: View::Graph, expected: View::Chain }
    );
    let s = sched("F0all", 2);
    assert_eq!(
        simulate_graph(&graph(), &s, &big).unwrap_err(),
        SimError::WrongView { found: View::Chain, expected: View::Graph }
    );
    // A chain whose fields disagree.
    let mut bad = chain2();
    bad.x.pop();
    assert!(matches!(err(&bad, "F0all", &big), SimError::OutOfRange { op: 0, .. }));
}

#[test]
fn earlier_budget_violation_wins_over_later_invalid_op() {
    // F1all peaks at 22 (op 1); op 4 (B1 twice) is invalid.
    assert_eq!(
        err(&chain2(), "F0all F1all L B1 B1", &budget(20)),
        SimError::BudgetExceeded { op: 1, text: "F1all".into(), time: 1.0, bytes: 22, budget: 20 }
    );
    // An incomplete schedule over budget reports the budget.
    assert!(matches!(err(&chain2(), "F0all F1all L", &budget(20)), SimError::BudgetExceeded { op: 1, .. }));
    // Within budget, the invalid op is reported.
    assert!(matches!(err(&chain2(), "F0all F1all L B1 B1", &budget(30)), SimError::InvalidOp { op: 4, .. }));
}

#[test]
fn explicit_free_of_a_checkpoint() {
    // F0ck F1ck [free a_1] L ... a_1 was freed, so F1all cannot run.
    let s = with(sched("F0ck F1ck L F1all B1 F0all B0", 2), &[(2, Op::Free { tensor: Tensor::Activation(1) })]);
    assert_eq!(
        simulate_chain(&chain2(), &s, &cfg()).unwrap_err(),
        SimError::MissingInput { op: 4, text: "F1all".into(), tensor: Tensor::Activation(1) }
    );
    // Freeing a_2 before the loss makes the loss miss it.
    let s = with(sched("F0ck F1ck L", 2), &[(2, Op::Free { tensor: Tensor::Activation(2) })]);
    assert_eq!(
        simulate_chain(&chain2(), &s, &cfg()).unwrap_err(),
        SimError::MissingInput { op: 3, text: "B2".into(), tensor: Tensor::Activation(2) }
    );
}

// ----- 3. the thesis's sequences (2.1)-(2.3), L = 4 ------------------------------------------

fn chain4() -> Chain {
    Chain {
        utmp: None,
        name: None,
        ftime: vec![1.0, 1.1, 1.2, 1.3],
        btime: vec![2.0, 2.1, 2.2, 2.3, 2.4],
        x: vec![3, 5, 2, 4, 1],
        xbar: vec![3, 7, 6, 5, 2],
        ftmp: vec![1, 0, 2, 1],
        btmp: vec![2, 1, 0, 3, 1],
        w: None,
        g: None,
        o: None,
        static_bytes: 100,
    }
}

// 1-based in the thesis, F5all B5 being the loss; here 0-based, the loss is `L`.
const SEQ_2_1: &str = "F0ck F1none F2ck F3all L B3 F2all B2 F0all F1all B1 B0";
const SEQ_2_2: &str = "F0ck F1none F2ck F3ck L F3all B3 F2all B2 F0ck F1all B1 F0all B0";
const SEQ_2_3: &str = "F0ck F1none F2all F3ck L F3all B3 B2 F0all F1all B1 B0";

#[test]
fn thesis_sequences() {
    let c = chain4();
    let b: f64 = c.btime.iter().sum(); // 11
    let r1 = run(&c, SEQ_2_1);
    let r2 = run(&c, SEQ_2_2);
    let r3 = run(&c, SEQ_2_3);
    // (2.1): F0×2, F1×2, F2×2, F3×1.
    assert!(close(r1.makespan, 2.0 * (1.0 + 1.1 + 1.2) + 1.3 + b));
    // (2.2): F0×3, F1×2, F2×2, F3×2.
    assert!(close(r2.makespan, 3.0 * 1.0 + 2.0 * (1.1 + 1.2 + 1.3) + b));
    // (2.3): F0×2, F1×2, F2×1, F3×2.
    assert!(close(r3.makespan, 2.0 * 1.0 + 2.0 * 1.1 + 1.2 + 2.0 * 1.3 + b));
    assert!(close(r2.makespan - r3.makespan, c.ftime[0] + c.ftime[2]));
    assert_eq!((r1.compute_ops, r2.compute_ops, r3.compute_ops), (12, 14, 12));
    // Peaks against the independent reference.
    for text in [SEQ_2_1, SEQ_2_2, SEQ_2_3] {
        let s = sched(text, 4);
        let (peak, time, _) = reference(&c, &s.ops).unwrap();
        let r = run(&c, text);
        assert_eq!(r.peak_bytes, peak, "{text}");
        assert!(close(r.makespan, time));
    }
    // (2.3) by hand: base 103. F0ck 103+5+1=109 -> 108; F1none 108+2+0=110 -> 105 (a_1 gone);
    // F2all 105+5+2=112 -> 110; F3ck 110+1+1=112 -> 111; L 111+1+1=113 -> 111 (a_4 released);
    // F3all 111+2+1=114 -> 113; B3 113+4+3=120 -> 114; B2 114+2+0=116 -> 105 (δ_3, ā_3, a_2);
    // F0all 105+7+1=113 -> 112; F1all 112+6+0=118 -> 118; B1 118+5+1=124 -> 115; B0 115+3+2=120.
    assert_eq!(r3.peak_bytes, 124);
}

// ----- 4. offloading ----------------------------------------------------------------------

/// L = 2 whose loss needs a lot of temporary memory, so offloading a_1 during it pays.
fn chain_off() -> Chain {
    Chain {
        utmp: None,
        name: None,
        ftime: vec![1.0, 2.0],
        btime: vec![2.0, 2.0, 3.0],
        x: vec![1, 4, 1],
        xbar: vec![1, 4, 2],
        ftmp: vec![0, 0],
        btmp: vec![0, 0, 10],
        w: None,
        g: None,
        o: None,
        static_bytes: 0,
    }
}

fn off_sched(fraction: f64) -> Schedule {
    // F0ck [offload a_1] F1all L [prefetch a_1] F0all B1 B0
    with(
        sched("F0ck F1all L F0all B1 B0", 2),
        &[
            (1, Op::Offload { tensor: Tensor::Activation(1), fraction }),
            (3, Op::Prefetch { tensor: Tensor::Activation(1), fraction }),
        ],
    )
}

fn bw(b: f64) -> SimConfig {
    SimConfig { machine: Machine::default().with_bandwidth(b), ..cfg() }
}

#[test]
fn offload_prefetch() {
    let c = chain_off();
    // Keeping a_1: the loss peaks at a_0 1 + a_1 4 + ā_2 2 + δ_2 1 + tmp 10 = 18.
    let keep = run(&c, "F0ck F1all L F0all B1 B0");
    assert_eq!(keep.peak_bytes, 18);
    assert_eq!(keep.makespan, 11.0);

    // β = 4: offload [1,2], released at 3 (F1all reads a_1 until then); the loss peaks at 14.
    // Prefetch [6,7] overlaps F0all [6,7]: no stall. B1 [7,9] peaks at
    // a_0 1 + ā_2 2 + δ_2 1 + a_1 4 + ā_1 4 + δ_1 4 = 16.
    let s = off_sched(1.0);
    let r = simulate_chain(&c, &s, &bw(4.0)).unwrap();
    assert_eq!(r.peak_bytes, 16);
    assert_eq!(r.makespan, 11.0);
    assert_eq!(r.compute_time, 11.0);
    assert_eq!(r.peak_host_bytes, 4);
    assert_eq!(r.compute_ops, 6);

    // β = 2: offload [1,3], prefetch [6,8]: B1 waits until 8, one unit of stall.
    let r = simulate_chain(&c, &s, &bw(2.0)).unwrap();
    assert_eq!(r.peak_bytes, 16);
    assert_eq!(r.makespan, 12.0);
    assert_eq!(r.compute_time, 11.0);

    // β = 0.5: offload [1,9] still holds a_1 during the loss (peak 18); the prefetch waits
    // for the host copy, [9,17]; B1 [17,19], B0 [19,21].
    let r = simulate_chain(&c, &s, &bw(0.5)).unwrap();
    assert_eq!(r.peak_bytes, 18);
    assert_eq!(r.makespan, 21.0);

    // The offload lowers the peak enough to fit a budget the plain schedule does not.
    assert!(simulate_chain(
        &c,
        &sched("F0ck F1all L F0all B1 B0", 2),
        &SimConfig { budget: Some(16), machine: Machine::default().with_bandwidth(4.0), timeline: false, ..cfg() }
    )
    .is_err());
    assert!(simulate_chain(
        &c,
        &s,
        &SimConfig { budget: Some(16), machine: Machine::default().with_bandwidth(4.0), timeline: false, ..cfg() }
    )
    .is_ok());

    // Half of a_1 (2 bytes): the loss peaks at 16; the prefetch [6,6.5] ends before B1.
    let r = simulate_chain(&c, &off_sched(0.5), &bw(4.0)).unwrap();
    assert_eq!(r.peak_bytes, 16);
    assert_eq!(r.makespan, 11.0);
    assert_eq!(r.peak_host_bytes, 2);
}

#[test]
fn each_direction_has_its_own_link() {
    let c = chain_off();
    let s = off_sched(1.0);
    // Offload at β 4 with latency 1: [1,3], released at 3 as before. Prefetch at β 2 with
    // latency 0.5: issued at 6, [6,8.5]; B1 waits for it: 11 + 1.5.
    let machine = Machine {
        d2h: Link { bandwidth: 4.0, latency: 1.0 },
        h2d: Link { bandwidth: 2.0, latency: 0.5 },
        ..Machine::default()
    };
    let r = simulate_chain(&c, &s, &SimConfig::on(machine)).unwrap();
    assert_eq!(r.makespan, 12.5);
    assert_eq!(r.compute_time, 11.0);
    // A zero or negative bandwidth in either direction is an invalid transfer.
    let dead = Machine { h2d: Link { bandwidth: 0.0, latency: 0.0 }, ..Machine::default() };
    assert!(matches!(simulate_chain(&c, &s, &SimConfig::on(dead)), Err(SimError::InvalidOp { .. })));
}

#[test]
fn sizes_beyond_i64_do_not_wrap() {
    // Two tensors of 2^63 bytes: their sum is 2^64, which a signed 64-bit count would wrap
    // to a negative (or small) number and let through a budget.
    let big = 1u64 << 63;
    let c = Chain::homogeneous(1, 1.0, 1.0, big);
    let s = sched("F0all L B0", 1);
    let r = simulate_chain(&c, &s, &cfg()).unwrap();
    assert_eq!(r.peak_bytes, u64::MAX);
    let over = simulate_chain(&c, &s, &SimConfig { budget: Some(u64::MAX - 1), ..cfg() });
    assert!(matches!(over, Err(SimError::BudgetExceeded { .. })), "{over:?}");
}

#[test]
fn offload_timeline_and_free() {
    let c = chain_off();
    let r = simulate_chain(
        &c,
        &off_sched(1.0),
        &SimConfig { machine: Machine::default().with_bandwidth(4.0), timeline: true, budget: None, ..cfg() },
    )
    .unwrap();
    // 0: a_0 1 + a_1 4 = 5; 1: + ā_2 2 = 7; 3: - a_1 4 + δ_2 1 + 10 = 14; 6: - 10, + a_1 4
    // (prefetch) + ā_1 4 (F0all) = 12; 7: + δ_1 4 = 16; 9: - δ_2 1 - ā_2 2 - a_1 4 = 9;
    // 9: + δ_0 1 = 10; 11: - δ_1 4 - ā_1 4 - a_0 1 = 1.
    let pts: Vec<(f64, u64)> = r.timeline.iter().map(|p| (p.time, p.bytes)).collect();
    assert_eq!(pts, vec![(0.0, 1), (0.0, 5), (1.0, 7), (3.0, 14), (6.0, 12), (7.0, 16), (9.0, 10), (11.0, 1)]);

    // An offload that is never prefetched: later readers keep the device copy, and the
    // memory is only released after the last one (B1), so the peak is the plain one.
    let s = with(
        sched("F0ck F1all L F0all B1 B0", 2),
        &[(1, Op::Offload { tensor: Tensor::Activation(1), fraction: 1.0 })],
    );
    let r = simulate_chain(&c, &s, &bw(4.0)).unwrap();
    assert_eq!(r.peak_bytes, 18);

    // Freeing a tensor while its offload runs releases it at the offload's end:
    // F0ck [0,1], offload a_1 [1,9] at β = 0.5, free at 1 -> released at 9, so F0all [1,2]
    // runs with a_0 1 + a_1 4 + ā_1 4 = 9.
    let s = Schedule::new(
        View::Chain,
        vec![
            Op::Forward { stage: 0, mode: ForwardMode::Checkpoint },
            Op::Offload { tensor: Tensor::Activation(1), fraction: 1.0 },
            Op::Free { tensor: Tensor::Activation(1) },
            Op::Forward { stage: 0, mode: ForwardMode::KeepAll },
        ],
    );
    let r = simulate_chain(
        &c,
        &s,
        &SimConfig { machine: Machine::default().with_bandwidth(0.5), timeline: true, budget: Some(9), ..cfg() },
    );
    assert_eq!(r.unwrap_err(), SimError::Incomplete("δ_0 was never computed".into()));
    // Budget 8: a_0 1 + a_1 4 + ā_1 4 = 9 at time 1 > 8, because a_1 is held until 9; F0all
    // waits for the release (O.3) and runs [9,10].
    let config = SimConfig { machine: Machine::default().with_bandwidth(0.5), budget: Some(8), ..cfg() };
    assert_eq!(simulate_chain(&c, &s, &config).unwrap_err(), SimError::Incomplete("δ_0 was never computed".into()));
}

#[test]
fn compute_waits_for_an_offload_to_release_memory() {
    let c = chain_off();
    // β = 0.5: the offload of a_1 runs [1,9]. Without a budget the loss runs at once, [3,6],
    // over a_1 still on the device (peak 18). With a budget of 16 it waits for the release
    // at 9 (a_0 1 + ā_2 2 + δ_2 1 + tmp 10 = 14) and runs [9,12]; the prefetch runs [12,20];
    // F0all [12,13]; B1 waits for a_1 until 20, [20,22]; B0 [22,24].
    let config = SimConfig { budget: Some(16), timeline: true, ..bw(0.5) };
    let r = simulate_chain(&c, &off_sched(1.0), &config).unwrap();
    assert_eq!(r.peak_bytes, 16);
    assert_eq!(r.makespan, 24.0);
    assert_eq!(r.compute_time, 11.0);
    assert_eq!(r.compute_stall, 13.0);
    assert_eq!((r.d2h_busy, r.h2d_busy), (8.0, 8.0));
    let spans: Vec<(Lane, f64, f64)> = r.spans.iter().map(|s| (s.lane, s.start, s.end)).collect();
    use Lane::*;
    assert_eq!(
        spans,
        vec![
            (Compute, 0.0, 1.0),
            (D2h, 1.0, 9.0),
            (Compute, 1.0, 3.0),
            (Compute, 9.0, 12.0),
            (H2d, 12.0, 20.0),
            (Compute, 12.0, 13.0),
            (Compute, 20.0, 22.0),
            (Compute, 22.0, 24.0)
        ]
    );
    // The prefetch (op 4) took its memory at 12, after the loss (op 3, [9,12]) took its
    // own, and before F0all (op 5), which starts at 12 too but comes after it: an executor
    // holds it until the loss has started.
    assert_eq!(r.prefetch_gates(), vec![(4, 3)]);
    // Under the progressive relaxation (O.7″) a_1 leaves at 0.5 byte per unit from 1 on:
    // the loss needs memory down to 16 − 11 = 5, i.e. 2 of a_1's 4 bytes gone, at 5.
    let relaxed = SimConfig { transfers: TransferMemory::Progressive, ..config };
    let r = simulate_chain(&c, &off_sched(1.0), &relaxed).unwrap();
    assert_eq!(r.spans[3].start, 5.0);
    assert_eq!(r.peak_bytes, 16);
}

#[test]
fn transfer_rejections() {
    let c = chain_off();
    let t = Tensor::Activation(1);
    let mk = |ops: Vec<Op>| Schedule::new(View::Chain, ops);
    let f0 = Op::Forward { stage: 0, mode: ForwardMode::Checkpoint };
    // Offloading something not on the device.
    let e = simulate_chain(&c, &mk(vec![Op::Offload { tensor: t, fraction: 1.0 }]), &cfg()).unwrap_err();
    assert_eq!(e, SimError::MissingInput { op: 0, text: "[offload Activation(1) 1]".into(), tensor: t });
    // Prefetching what is on the device, or what has no host copy.
    let e = simulate_chain(&c, &mk(vec![f0, Op::Prefetch { tensor: t, fraction: 1.0 }]), &cfg()).unwrap_err();
    assert!(matches!(e, SimError::AlreadyResident { op: 1, .. }));
    let e = simulate_chain(&c, &mk(vec![Op::Prefetch { tensor: t, fraction: 1.0 }]), &cfg()).unwrap_err();
    assert!(matches!(e, SimError::InvalidOp { op: 0, .. }));
    // More than what is there.
    let e = simulate_chain(
        &c,
        &mk(vec![f0, Op::Offload { tensor: t, fraction: 0.5 }, Op::Offload { tensor: t, fraction: 0.75 }]),
        &cfg(),
    )
    .unwrap_err();
    assert!(matches!(e, SimError::InvalidOp { op: 2, .. }));
    let e = simulate_chain(
        &c,
        &mk(vec![f0, Op::Offload { tensor: t, fraction: 0.5 }, Op::Prefetch { tensor: t, fraction: 1.0 }]),
        &cfg(),
    )
    .unwrap_err();
    assert!(matches!(e, SimError::InvalidOp { op: 2, .. }));
    // A bad fraction.
    let e = simulate_chain(&c, &mk(vec![f0, Op::Offload { tensor: t, fraction: 1.5 }]), &cfg()).unwrap_err();
    assert!(matches!(e, SimError::InvalidOp { op: 1, .. }));
    // Fully offloaded, then settled by a prefetch that is not the whole: not readable.
    let e = simulate_chain(
        &c,
        &mk(vec![
            f0,
            Op::Offload { tensor: t, fraction: 1.0 },
            Op::Prefetch { tensor: t, fraction: 0.5 },
            Op::Forward { stage: 1, mode: ForwardMode::KeepAll },
        ]),
        &cfg(),
    )
    .unwrap_err();
    assert_eq!(e, SimError::MissingInput { op: 3, text: "F1all".into(), tensor: t });
}

#[test]
fn weights_can_be_offloaded() {
    // L = 2 with weights w = [3, 2] inside static_bytes = 7 (2 bytes of other static data).
    let mut c = chain_off();
    c.w = Some(vec![3, 2]);
    c.static_bytes = 7;
    let plain = run(&c, "F0ck F1all L F0all B1 B0");
    assert_eq!(plain.peak_bytes, 18 + 7);
    // Offload W0 after F0ck, bring it back before F0all: the loss peaks 3 lower.
    let s = with(
        sched("F0ck F1all L F0all B1 B0", 2),
        &[
            (1, Op::Offload { tensor: Tensor::Weight(0), fraction: 1.0 }),
            (3, Op::Prefetch { tensor: Tensor::Weight(0), fraction: 1.0 }),
        ],
    );
    let r = simulate_chain(&c, &s, &bw(3.0)).unwrap();
    // The loss now peaks at 22; B1 (which needs W1, not W0) at 16 + 7 = 23.
    assert_eq!(r.peak_bytes, 23);
    // Offload [1,2]; prefetch [6,7]: F0all waits for W0 until 7, one unit of stall.
    assert_eq!(r.makespan, 12.0);
    assert_eq!(r.peak_host_bytes, 3);
    // Without the prefetch, F0all still finds W0 on the device: the offload's memory is only
    // released after F0all, so the peak is the plain one.
    let s =
        with(sched("F0ck F1all L F0all B1 B0", 2), &[(1, Op::Offload { tensor: Tensor::Weight(0), fraction: 1.0 })]);
    assert_eq!(simulate_chain(&c, &s, &bw(3.0)).unwrap().peak_bytes, 25);
    // A partial prefetch settles the offload: F0all then misses W0.
    let s = with(
        sched("F0ck F1all L F0all B1 B0", 2),
        &[
            (1, Op::Offload { tensor: Tensor::Weight(0), fraction: 1.0 }),
            (3, Op::Prefetch { tensor: Tensor::Weight(0), fraction: 0.5 }),
        ],
    );
    assert_eq!(
        simulate_chain(&c, &s, &bw(3.0)).unwrap_err(),
        SimError::MissingInput { op: 5, text: "F0all".into(), tensor: Tensor::Weight(0) }
    );
    // A weight with no up-to-date host copy cannot be freed.
    let s = with(sched("F0ck", 2), &[(1, Op::Free { tensor: Tensor::Weight(1) })]);
    assert!(matches!(simulate_chain(&c, &s, &cfg()).unwrap_err(), SimError::InvalidOp { op: 1, .. }));
}

// ----- 4b. periodic schedules: weights in a steady-state cycle -----------------------------

/// L = 2 with weights `w = [10, 10]` (all of `static_bytes`), unit times, unit activations.
fn weight_chain() -> Chain {
    let mut c = Chain::homogeneous(2, 1.0, 1.0, 1);
    c.w = Some(vec![10, 10]);
    c.static_bytes = 20;
    c
}

fn periodic(text: &str, extra: &[(usize, Op)]) -> Schedule {
    with(sched(text, 2), extra).repeated()
}

fn off(i: usize) -> Op {
    Op::Offload { tensor: Tensor::Weight(i), fraction: 1.0 }
}

fn pre(i: usize) -> Op {
    Op::Prefetch { tensor: Tensor::Weight(i), fraction: 1.0 }
}

fn free_w(i: usize) -> Op {
    Op::Free { tensor: Tensor::Weight(i) }
}

#[test]
fn a_periodic_schedule_without_transfers_runs_at_its_compute_time() {
    let c = weight_chain();
    let once = run(&c, "F0all F1all L B1 B0");
    let r = simulate_chain(&c, &periodic("F0all F1all L B1 B0", &[]), &cfg()).unwrap();
    assert_eq!(r.periods, crate::PERIODS);
    assert_eq!(r.makespan, 5.0, "the period");
    assert_eq!(r.compute_time, 5.0);
    assert_eq!(r.compute_ops, 5);
    assert_eq!(r.compute_stall, 0.0);
    assert_eq!(r.peak_bytes, once.peak_bytes, "every period peaks as the first");
}

#[test]
fn a_weight_offloaded_every_period_bounds_the_period_by_the_link() {
    // Offload W1 after F1 (10 at bandwidth 1), bring it back after the loss for B1: per
    // period F0, F1 (2), the offload (10), the prefetch after it (10), B1, B0 (2); the
    // loss overlaps the offload.
    let c = weight_chain();
    let s = periodic("F0all F1all L B1 B0", &[(2, off(1)), (3, pre(1))]);
    let once = simulate_chain(&c, &Schedule { periodic: false, ..s.clone() }, &bw(1.0)).unwrap();
    assert_eq!(once.makespan, 24.0);
    let r = simulate_chain(&c, &s, &bw(1.0)).unwrap();
    assert_eq!(r.makespan, 24.0);
    assert_eq!(r.compute_stall, 19.0);
    assert_eq!(r.d2h_busy, 10.0, "per period");
    // B1 holds both weights, a_0, ā_1, ā_2, δ_2 and δ_1, as in store-all.
    assert_eq!(run(&c, "F0all F1all L B1 B0").peak_bytes, 25);
    assert_eq!(r.peak_bytes, 25);
    // Under a budget of 15, B1 cannot run with W1 back: the period is refused.
    let tight = SimConfig { budget: Some(15), ..bw(1.0) };
    assert!(matches!(simulate_chain(&c, &s, &tight).unwrap_err(), SimError::BudgetExceeded { .. }));
}

#[test]
fn a_weight_with_an_up_to_date_host_copy_is_dropped_not_offloaded_again() {
    // The discount of Beaumont et al.: W0 offloaded after B0 (its update), brought back
    // for F0, dropped after it (the host copy is still valid), brought back for B0.
    let c = weight_chain();
    let text = "F0all F1all L B1 B0";
    let s = periodic(text, &[(0, pre(0)), (1, free_w(0)), (4, pre(0)), (5, off(0))]);
    let r = simulate_chain(&c, &s, &bw(10.0)).unwrap();
    // Each period moves W0 twice in and once out.
    assert!(close(r.h2d_busy, 2.0), "{}", r.h2d_busy);
    assert!(close(r.d2h_busy, 1.0), "{}", r.d2h_busy);
    assert_eq!(r.peak_host_bytes, 10);
    // F1, the loss and B1 run without W0.
    let under = simulate_chain(&c, &s, &SimConfig { budget: Some(24), ..bw(10.0) }).unwrap();
    assert!(under.peak_bytes <= 24);
    // Without the offload after B0 the period ends with W0 on the device (and its host
    // copy stale), so the next period's first prefetch finds it there.
    let stale = periodic(text, &[(0, pre(0)), (1, free_w(0)), (4, pre(0))]);
    assert_eq!(
        simulate_chain(&c, &stale, &bw(10.0)).unwrap_err(),
        SimError::AlreadyResident { op: 0, text: "[prefetch Weight(0) 1]".into(), tensor: Tensor::Weight(0) }
    );
    // Dropping W0 after B0 instead: its host copy is stale, so no copy is left anywhere
    // when the next period begins.
    let dropped = periodic(text, &[(0, pre(0)), (1, free_w(0)), (4, pre(0)), (5, free_w(0))]);
    match simulate_chain(&c, &dropped, &bw(10.0)).unwrap_err() {
        SimError::InvalidOp { op: 0, why, .. } => assert!(why.contains("no host copy"), "{why}"),
        e => panic!("{e}"),
    }
    // In one step from the usual start, the drop after B0 is refused where it stands.
    let once = with(sched(text, 2), &[(5, free_w(0))]);
    match simulate_chain(&c, &once, &bw(10.0)).unwrap_err() {
        SimError::InvalidOp { op: 5, why, .. } => assert!(why.contains("no up-to-date host copy"), "{why}"),
        e => panic!("{e}"),
    }
}

#[test]
fn an_upload_at_the_end_of_a_period_keeps_the_weight_for_the_next_forward() {
    // W0 uploaded after B0: the next period's F0 still reads the device copy, which is
    // dropped after it and prefetched back for B0.
    let c = weight_chain();
    let s = periodic("F0all F1all L B1 B0", &[(1, free_w(0)), (4, pre(0)), (5, off(0))]);
    let r = simulate_chain(&c, &s, &SimConfig { budget: Some(24), ..bw(10.0) }).unwrap();
    assert!(r.peak_bytes <= 24);
    assert!(close(r.h2d_busy, 1.0) && close(r.d2h_busy, 1.0));
    // Not periodic, the first F0 finds W0 resident and the drop has no host copy to keep.
    let once = Schedule { periodic: false, ..s };
    assert!(matches!(simulate_chain(&c, &once, &bw(10.0)).unwrap_err(), SimError::InvalidOp { .. }));
}

#[test]
fn host_copies_beyond_the_machines_host_memory_are_refused() {
    // Each period offloads W0 (10 bytes) after its update; a host of 9 bytes cannot hold it.
    let c = weight_chain();
    let text = "F0all F1all L B1 B0";
    let s = periodic(text, &[(0, pre(0)), (1, free_w(0)), (4, pre(0)), (5, off(0))]);
    let small = Machine { host_memory: 9, ..Machine::default().with_bandwidth(10.0) };
    match simulate_chain(&c, &s, &SimConfig::on(small)).unwrap_err() {
        SimError::HostMemoryExceeded { bytes: 10, host_memory: 9, .. } => {}
        e => panic!("{e}"),
    }
    let enough = Machine { host_memory: 10, ..small };
    assert_eq!(simulate_chain(&c, &s, &SimConfig::on(enough)).unwrap().peak_host_bytes, 10);
}

#[test]
fn a_period_that_does_not_finish_its_step_is_refused() {
    let c = weight_chain();
    let s = periodic("F0all F1all L B1", &[]);
    assert_eq!(
        simulate_chain(&c, &s, &cfg()).unwrap_err(),
        SimError::Incomplete("period 1 ended before δ_0 was computed".into())
    );
}

// ----- 5. graph view ----------------------------------------------------------------------

/// h = f1(x; W1) (saves s1); y = f2(h; W2); loss(y, h) -> dy, dh (dh has two producers:
/// the loss, through the skip connection, and b2); b2(dy, h, W2) -> dh, gW2;
/// b1(dh, s1, x, W1) -> gW1.
fn graph() -> TrainingGraph {
    let d = |name: &str, kind: DataKind, size: u64| DataNode { name: name.into(), kind, size };
    let c = |name: &str, kind: ComputeKind, time: f64, tmp: u64, inputs: Vec<usize>, outputs: Vec<usize>| ComputeNode {
        name: name.into(),
        kind,
        time,
        tmp,
        inputs,
        outputs,
        op: None,
        forward: None,
        stage: None,
    };
    use ComputeKind::*;
    use DataKind::*;
    let g = TrainingGraph {
        name: None,
        data: vec![
            d("x", Input, 2),
            d("W1", Parameter, 3),
            d("W2", Parameter, 3),
            d("gW1", ParamGrad, 3),
            d("gW2", ParamGrad, 3),
            d("h", Activation, 4),
            d("s1", Saved, 5),
            d("y", Activation, 1),
            d("dy", Gradient, 1),
            d("dh", Gradient, 4),
        ],
        compute: vec![
            c("f1", Forward, 1.0, 1, vec![0, 1], vec![5, 6]),
            c("f2", Forward, 2.0, 2, vec![5, 2], vec![7]),
            c("loss", Loss, 3.0, 0, vec![7, 5], vec![8, 9]),
            c("b2", Backward, 4.0, 3, vec![8, 5, 2], vec![9, 4]),
            c("b1", Backward, 5.0, 2, vec![9, 6, 0, 1], vec![3]),
        ],
        param_grads_from_backward: false,
    };
    g.validate().unwrap();
    g
}

/// `C3`, `C0ng`, `f7` (free data 7), `o1`/`p1` (offload/prefetch data 1).
fn gsched(text: &str) -> Schedule {
    let ops = text
        .split_whitespace()
        .map(|t| {
            let num = |s: &str| s.trim_end_matches("ng").parse::<usize>().unwrap();
            match &t[..1] {
                "C" => Op::Compute { node: num(&t[1..]), no_grad: t.ends_with("ng") },
                "f" => Op::Free { tensor: Tensor::Data(num(&t[1..])) },
                "o" => Op::Offload { tensor: Tensor::Data(num(&t[1..])), fraction: 1.0 },
                "p" => Op::Prefetch { tensor: Tensor::Data(num(&t[1..])), fraction: 1.0 },
                _ => panic!("{t}"),
            }
        })
        .collect();
    Schedule::new(View::Graph, ops)
}

fn grun(text: &str, config: &SimConfig) -> Result<SimReport, SimError> {
    simulate_graph(&graph(), &gsched(text), config)
}

#[test]
fn graph_store_all_by_hand() {
    // base: x 2 + W1 3 + W2 3 + gW1 3 + gW2 3 = 14.
    // C0 [0,1]: 14 + h 4 + s1 5 + 1 = 24 -> 23.   C1 [1,3]: 23 + y 1 + 2 = 26 -> 24.
    // C2 [3,6]: 24 + dy 1 + dh 4 = 29.            free y at 6 -> 28.
    // C3 [6,10]: dh accumulates, gW2 static: 28 + 3 = 31 -> 28.   free dy, h -> 23.
    // C4 [10,15]: 23 + 2 = 25 -> 23.               free dh, s1, x -> 12.
    let r = grun("C0 C1 C2 f7 C3 f8 f5 C4 f9 f6 f0", &SimConfig { timeline: true, ..cfg() }).unwrap();
    assert_eq!(r.peak_bytes, 31);
    assert_eq!(r.makespan, 15.0);
    assert_eq!(r.compute_ops, 5);
    assert_eq!(r.timeline.last(), Some(&MemoryPoint { time: 15.0, bytes: 12 }));
    // Without frees, C3 peaks at 29 + 3 = 32.
    assert_eq!(grun("C0 C1 C2 C3 C4", &cfg()).unwrap().peak_bytes, 32);
    assert_eq!(
        grun("C0 C1 C2 f7 C3 f8 f5 C4", &budget(30)).unwrap_err(),
        SimError::BudgetExceeded { op: 4, text: "C3".into(), time: 6.0, bytes: 31, budget: 30 }
    );
}

#[test]
fn graph_param_grads_made_by_the_backward() {
    // base: x 2 + W1 3 + W2 3 = 8 (gW1, gW2 not yet made).
    // C0 [0,1]: 8 + h 4 + s1 5 + 1 = 18 -> 17.   C1 [1,3]: 17 + y 1 + 2 = 20 -> 18.
    // C2 [3,6]: 18 + dy 1 + dh 4 = 23.            free y at 6 -> 22.
    // C3 [6,10]: dh accumulates, gW2 made: 22 + 3 + 3 = 28 -> 25.   free dy, h -> 20.
    // C4 [10,15]: gW1 made: 20 + 3 + 2 = 25 -> 23. free dh, s1, x -> 12 (as resident ones).
    let mut g = graph();
    g.param_grads_from_backward = true;
    let sched = gsched("C0 C1 C2 f7 C3 f8 f5 C4 f9 f6 f0");
    let r = simulate_graph(&g, &sched, &SimConfig { timeline: true, ..cfg() }).unwrap();
    assert_eq!(r.peak_bytes, 28);
    assert_eq!(r.timeline.last(), Some(&MemoryPoint { time: 15.0, bytes: 12 }));
    // Never freed, even so.
    let freed = simulate_graph(&g, &gsched("C0 C1 C2 f7 C3 f4"), &cfg()).unwrap_err();
    assert!(matches!(freed, SimError::InvalidOp { op: 5, .. }), "{freed:?}");
}

#[test]
fn graph_no_grad_recompute() {
    // C0ng [0,1]: 14 + h 4 + 1, and s1 5, made and dropped at its end = 24 -> 18.
    // C1: 18 + 1 + 2 = 21 -> 19.  C2: 19 + 5 = 24.  free y -> 23.  C3: 23 + 3 = 26 -> 23.
    // free dy, h -> 18.  C0 [10,11]: 18 + 4 + 5 + 1 = 28 -> 27.  free h -> 23.  C4 [11,16]: 25.
    let r = grun("C0ng C1 C2 f7 C3 f8 f5 C0 f5 C4 f9 f6 f0", &SimConfig { timeline: true, ..cfg() }).unwrap();
    assert_eq!(r.peak_bytes, 28);
    let during_c0ng = r.timeline.iter().filter(|p| p.time < 1.0).map(|p| p.bytes).max();
    assert_eq!(during_c0ng, Some(24));
    assert_eq!(r.makespan, 16.0);
    assert_eq!(r.compute_ops, 6);
    // Without the recomputation, b1 misses s1.
    assert_eq!(
        grun("C0ng C1 C2 C3 C4", &cfg()).unwrap_err(),
        SimError::MissingInput { op: 4, text: "C4".into(), tensor: Tensor::Data(6) }
    );
}

#[test]
fn graph_rejections() {
    let big = cfg();
    // dh read after only one of its two producers.
    assert_eq!(
        grun("C0 C1 C2 C4", &big).unwrap_err(),
        SimError::MissingInput { op: 3, text: "C4".into(), tensor: Tensor::Data(9) }
    );
    // dh freed mid-accumulation, then b2 re-allocates it: never complete.
    assert_eq!(
        grun("C0 C1 C2 f9 C3 C4", &big).unwrap_err(),
        SimError::MissingInput { op: 5, text: "C4".into(), tensor: Tensor::Data(9) }
    );
    assert_eq!(
        grun("C0 C0", &big).unwrap_err(),
        SimError::AlreadyResident { op: 1, text: "C0".into(), tensor: Tensor::Data(5) }
    );
    assert!(matches!(grun("C0 C1 C2 C2", &big).unwrap_err(), SimError::InvalidOp { op: 3, .. }));
    assert!(matches!(grun("C0 C1 C2 C3 C3", &big).unwrap_err(), SimError::InvalidOp { op: 4, .. }));
    assert!(matches!(grun("C0 C1 C2 C3ng", &big).unwrap_err(), SimError::InvalidOp { op: 3, .. }));
    assert!(matches!(grun("C0 f1", &big).unwrap_err(), SimError::InvalidOp { op: 1, .. }));
    assert!(matches!(grun("C0 f7", &big).unwrap_err(), SimError::InvalidOp { op: 1, .. }));
    assert!(matches!(grun("C0 C9", &big).unwrap_err(), SimError::OutOfRange { op: 1, .. }));
    assert!(matches!(grun("C0 f10", &big).unwrap_err(), SimError::OutOfRange { op: 1, .. }));
    assert!(matches!(grun("C1", &big).unwrap_err(), SimError::MissingInput { op: 0, tensor: Tensor::Data(5), .. }));
    let e = grun("C0 C1 C2 C3", &big).unwrap_err();
    assert_eq!(e, SimError::Incomplete("backward node 4 `b1` never ran".into()));
    assert_eq!(
        grun("C0 C1", &big).unwrap_err(),
        SimError::Incomplete("the loss (compute node 2 `loss`) never ran".into())
    );
    let s = Schedule::new(View::Graph, vec![Op::Forward { stage: 0, mode: ForwardMode::KeepAll }]);
    assert!(matches!(simulate_graph(&graph(), &s, &big).unwrap_err(), SimError::InvalidOp { op: 0, .. }));
    let s = Schedule::new(View::Graph, vec![Op::Free { tensor: Tensor::Activation(0) }]);
    assert!(matches!(simulate_graph(&graph(), &s, &big).unwrap_err(), SimError::OutOfRange { op: 0, .. }));
}

#[test]
fn graph_parameter_offload() {
    // Offload W1 (3) after f1 and prefetch it back before b1, at β = 100 (0.03 per transfer).
    // C3 then peaks at 32 - 3 = 29, C4 at 29 + 2 = 31 (W1 back); b1 waits 0.03 for W1.
    let r = grun("C0 o1 C1 C2 C3 p1 C4", &bw(100.0)).unwrap();
    assert_eq!(r.peak_bytes, 31);
    assert!(close(r.makespan, 15.03));
    assert_eq!(r.peak_host_bytes, 3);
    // Without the prefetch the device copy stays readable (until prefetched or freed), so
    // the schedule is valid but W1 is held until b1 ends: the plain peak.
    assert_eq!(grun("C0 o1 C1 C2 C3 C4", &bw(100.0)).unwrap().peak_bytes, 32);
}

// ----- 6. properties ----------------------------------------------------------------------

/// A random chain with zero sizes and zero-duration ops among the others.
fn random_chain(rng: &mut Rng, l: usize) -> Chain {
    ChainSpec::SPARSE.chain(rng, l)
}

fn store_all(l: usize) -> Schedule {
    let mut ops: Vec<Op> = (0..l).map(|i| Op::Forward { stage: i, mode: ForwardMode::KeepAll }).collect();
    ops.extend((0..=l).rev().map(|i| Op::Backward { stage: i }));
    Schedule::new(View::Chain, ops)
}

#[test]
fn store_all_peak_formula() {
    let mut rng = Rng::new(0x9E37_79B9_7F4A_7C15);
    for _ in 0..500 {
        let l = 1 + rng.below(8) as usize;
        let c = random_chain(&mut rng, l);
        let base = c.static_bytes + c.x[0];
        let saved = |i: usize| -> u64 { c.xbar[1..=i].iter().sum() };
        // F_i: a_0, ā_1..ā_i resident, plus ā_{i+1} and tmp.
        let mut peak = base;
        for i in 0..l {
            peak = peak.max(base + saved(i) + c.xbar[i + 1] + c.ftmp[i]);
        }
        // Loss: everything saved, plus δ_L and tmp.
        peak = peak.max(base + saved(l) + c.x[l] + c.btmp[l]);
        // B_i: a_0, ā_1..ā_{i+1}, δ_{i+1}, plus δ_i and tmp.
        for i in 0..l {
            peak = peak.max(base + saved(i + 1) + c.x[i + 1] + c.x[i] + c.btmp[i]);
        }
        let r = simulate_chain(&c, &store_all(l), &cfg()).unwrap();
        assert_eq!(r.peak_bytes, peak, "{c:?}");
        assert!(close(r.makespan, c.ideal_time()));
        assert_eq!(r.compute_ops, 2 * l + 1);
        assert!(simulate_chain(&c, &store_all(l), &budget(peak)).is_ok());
        if peak == 0 {
            continue;
        }
        assert!(matches!(
            simulate_chain(&c, &store_all(l), &budget(peak - 1)).unwrap_err(),
            SimError::BudgetExceeded { bytes, .. } if bytes == peak
        ));
    }
}

/// An independent, set-based model of Table 2.1 (compute ops only), op by op.
#[derive(Clone)]
struct RefState {
    present: BTreeSet<Tensor>,
    done: Vec<bool>,
    cur: u64,
    peak: u64,
    time: f64,
}

impl RefState {
    fn new(c: &Chain) -> RefState {
        let cur = c.static_bytes + c.x[0];
        RefState { present: [Tensor::Activation(0)].into(), done: vec![false; c.len() + 1], cur, peak: cur, time: 0.0 }
    }

    fn size(c: &Chain, t: Tensor) -> u64 {
        match t {
            Tensor::Activation(i) | Tensor::Grad(i) => c.x[i],
            Tensor::Saved(i) => c.xbar[i],
            _ => unreachable!(),
        }
    }

    fn has_a(&self, i: usize) -> bool {
        self.present.contains(&Tensor::Activation(i)) || (i >= 1 && self.present.contains(&Tensor::Saved(i)))
    }

    /// Applies `op`; returns its own peak, or `None` if it is invalid.
    fn apply(&mut self, c: &Chain, op: Op) -> Option<u64> {
        let l = c.len();
        let (out, tmp, dur, consumed) = match op {
            Op::Forward { stage: i, mode } => {
                if !self.has_a(i) {
                    return None;
                }
                let out = if mode == ForwardMode::KeepAll { Tensor::Saved(i + 1) } else { Tensor::Activation(i + 1) };
                // F∅ reads a_i alone when it is there (else through ā_i, which persists).
                let consumed = if mode == ForwardMode::Discard { vec![Tensor::Activation(i)] } else { vec![] };
                (out, c.ftmp[i], c.ftime[i], consumed)
            }
            Op::Backward { stage: i } => {
                if self.done[i] || !self.has_a(i) {
                    return None;
                }
                if i < l
                    && (!self.present.contains(&Tensor::Grad(i + 1)) || !self.present.contains(&Tensor::Saved(i + 1)))
                {
                    return None;
                }
                let consumed = if i == l {
                    vec![Tensor::Activation(l)]
                } else {
                    vec![Tensor::Grad(i + 1), Tensor::Saved(i + 1), Tensor::Activation(i + 1), Tensor::Activation(i)]
                };
                self.done[i] = true;
                (Tensor::Grad(i), c.btmp[i], c.btime[i], consumed)
            }
            _ => unreachable!(),
        };
        if self.present.contains(&out) {
            return None;
        }
        let op_peak = self.cur + Self::size(c, out) + tmp;
        self.peak = self.peak.max(op_peak);
        self.cur += Self::size(c, out);
        self.present.insert(out);
        for t in consumed {
            if self.present.remove(&t) {
                self.cur -= Self::size(c, t);
            }
        }
        self.time += dur;
        Some(op_peak)
    }
}

/// Runs the reference: the peak, the total time and each op's own peak; `None` if the
/// schedule is invalid or incomplete.
fn reference(c: &Chain, ops: &[Op]) -> Option<(u64, f64, Vec<u64>)> {
    let mut st = RefState::new(c);
    let per_op = ops.iter().map(|&op| st.apply(c, op)).collect::<Option<Vec<u64>>>()?;
    st.done[0].then_some((st.peak, st.time, per_op))
}

/// A random walk over the valid compute ops, biased towards progress; `None` if it gets
/// stuck or takes too long.
fn random_schedule(rng: &mut Rng, c: &Chain) -> Option<Vec<Op>> {
    let l = c.len();
    let mut ops: Vec<Op> = Vec::new();
    let mut st = RefState::new(c);
    let mut next_b = l; // the next backward to run
    for _ in 0..400 {
        let mut cands = vec![Op::Backward { stage: next_b }];
        for i in 0..l.min(next_b + 1) {
            for mode in [ForwardMode::Discard, ForwardMode::Checkpoint, ForwardMode::KeepAll] {
                cands.push(Op::Forward { stage: i, mode });
            }
        }
        let valid: Vec<(Op, RefState)> = cands
            .into_iter()
            .filter_map(|op| {
                let mut trial = st.clone();
                trial.apply(c, op).map(|_| (op, trial))
            })
            .collect();
        if valid.is_empty() {
            return None;
        }
        let pick = if matches!(valid[0].0, Op::Backward { .. }) && rng.below(2) == 0 {
            0
        } else {
            rng.below(valid.len() as u64) as usize
        };
        let (op, next) = valid.into_iter().nth(pick).unwrap();
        st = next;
        ops.push(op);
        if let Op::Backward { stage } = op {
            if stage == 0 {
                return Some(ops);
            }
            next_b = stage - 1;
        }
    }
    None
}

#[test]
fn random_schedules_match_the_reference() {
    let mut rng = Rng::new(0xD1B5_4A32_D192_ED03);
    let mut checked = 0;
    for _ in 0..1000 {
        let l = 1 + rng.below(5) as usize;
        let c = random_chain(&mut rng, l);
        let Some(ops) = random_schedule(&mut rng, &c) else { continue };
        let (peak, time, per_op) = reference(&c, &ops).expect("the walk builds valid schedules");
        let s = Schedule::new(View::Chain, ops);
        let r = simulate_chain(&c, &s, &SimConfig { timeline: true, ..cfg() }).unwrap();
        assert_eq!(r.peak_bytes, peak, "{c:?} {}", s.to_notation());
        assert!(close(r.makespan, time));
        assert!(close(r.compute_time, time));
        assert_eq!(r.compute_ops, s.ops.len());
        assert_eq!(r.timeline.iter().map(|p| p.bytes).max(), Some(peak));
        assert!(r.timeline.windows(2).all(|w| w[0].time <= w[1].time));
        // The first op over a budget below the peak is the first whose own peak exceeds it.
        if peak == 0 {
            continue;
        }
        let b = peak - 1 - rng.below(peak.min(8));
        if b >= c.static_bytes + c.x[0] {
            let first = per_op.iter().position(|&p| p > b).unwrap();
            match simulate_chain(&c, &s, &budget(b)).unwrap_err() {
                SimError::BudgetExceeded { op, bytes, .. } => {
                    assert_eq!(op, first, "{c:?} {} budget {b}", s.to_notation());
                    assert_eq!(bytes, per_op[first]);
                }
                e => panic!("{e}"),
            }
        }
        checked += 1;
    }
    eprintln!("checked {checked}");
    assert!(checked > 200, "only {checked} random schedules completed");
}

#[test]
fn large_schedule_runs() {
    // 100k ops; mostly a smoke test for complexity (run with --release to time it).
    let l = 50_000;
    let c = Chain::homogeneous(l, 1.0, 2.0, 3);
    let r = simulate_chain(&c, &store_all(l), &cfg()).unwrap();
    // a_0 + L saved sets + δ_L + δ_{L-1} during B_{L-1}.
    assert_eq!(r.peak_bytes, 3 * (l as u64 + 1) + 3 + 3);
    assert_eq!(r.makespan, 3.0 * l as f64 + 2.0);
}

// ----- engine-level tie rules ---------------------------------------------------------------

#[test]
fn releases_come_before_allocations_at_equal_times() {
    use crate::engine::{Effect, Engine, TensorSpec};
    // X 5, Y 2, Z 1 resident; W 4 not. β = 1.
    // op0 offload Y [0,2]; op1 offload Z [2,3]; op2 compute [0,3] reading X;
    // op3 prefetch Y [3,5]; op4 prefetch Z waits for the stream: [5,6];
    // op5 compute [3,5] reads X, produces W, releases X at 5.
    // At t = 5, op5's release of X (5) goes before op4's allocation of Z (1), even though
    // op4 comes first in program order: 11 -> 6 -> 7, so the peak is 11, not 12.
    let ops: Vec<Op> = (0..6).map(|node| Op::Compute { node, no_grad: false }).collect();
    let config =
        SimConfig { budget: Some(11), machine: Machine::default().with_bandwidth(1.0), timeline: true, ..cfg() };
    let spec = |d: usize, size: u64, resident: bool| TensorSpec { name: Tensor::Data(d), size, resident, host: false };
    let mut eng =
        Engine::new(&ops, &config, 0, [spec(0, 5, true), spec(1, 2, true), spec(2, 1, true), spec(3, 4, false)]);
    eng.offload(0, 1, 1.0).unwrap();
    eng.offload(1, 2, 1.0).unwrap();
    eng.compute(2, &Effect { duration: 3.0, tmp: 0, reads: &[0], allocs: &[], frees: &[] }).unwrap();
    eng.prefetch(3, 1, 1.0).unwrap();
    eng.prefetch(4, 2, 1.0).unwrap();
    eng.compute(5, &Effect { duration: 2.0, tmp: 0, reads: &[0], allocs: &[3], frees: &[0] }).unwrap();
    let r = eng.finish().unwrap();
    assert_eq!(r.peak_bytes, 11);
    assert_eq!(r.makespan, 6.0);
    assert_eq!(r.peak_host_bytes, 3);
    let pts: Vec<(f64, u64)> = r.timeline.iter().map(|p| (p.time, p.bytes)).collect();
    assert_eq!(pts, vec![(0.0, 8), (2.0, 6), (3.0, 11), (5.0, 7)]);
}

#[test]
fn zero_duration_graph_ops_and_explicit_frees() {
    // The same store-all schedule as `graph_store_all_by_hand` (peak 31, at C3), with some
    // or all durations zero: a free right after a zero-duration op must not release its
    // inputs before the op's own allocations, so the peak is unchanged.
    let text = "C0 C1 C2 f7 C3 f8 f5 C4 f9 f6 f0";
    for times in [[0.0; 5], [1.0, 0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 0.0, 0.0, 5.0], [1.0, 2.0, 3.0, 4.0, 5.0]] {
        let mut g = graph();
        for (c, t) in g.compute.iter_mut().zip(times) {
            c.time = t;
        }
        let r = simulate_graph(&g, &gsched(text), &SimConfig { timeline: true, ..cfg() }).unwrap();
        assert_eq!(r.peak_bytes, 31, "{times:?}");
        assert_eq!(r.timeline.iter().map(|p| p.bytes).max(), Some(31));
        assert_eq!(r.timeline.last().map(|p| p.bytes), Some(12));
        assert!(close(r.makespan, times.iter().sum()));
    }
}

/// A budget of `u64::MAX` means "anything fits"; it must not wrap to a negative limit.
#[test]
fn the_largest_budget_admits_everything() {
    let chain = pebble_graph::Chain::homogeneous(2, 1.0, 1.0, 3);
    let s = pebble_schedule::Schedule::from_notation(pebble_schedule::View::Chain, "F0all F1all L B1 B0")
        .unwrap()
        .resolve_loss(2);
    let config = SimConfig { budget: Some(u64::MAX), ..SimConfig::default() };
    assert!(simulate_chain(&chain, &s, &config).is_ok());
}

// ----- 4c. weight gradients, optimizer states and the host CPU's optimizer step ------------

/// L = 2, forwards 1, backwards 2, loss 1, unit activations; weights 10, gradients 10,
/// optimizer states 20 per stage, and 5 more static bytes.
fn optimizer_chain() -> Chain {
    let mut c = Chain::homogeneous(2, 1.0, 2.0, 1);
    c.btime[2] = 1.0;
    c.w = Some(vec![10, 10]);
    c.g = Some(vec![10, 10]);
    c.o = Some(vec![20, 20]);
    c.static_bytes = 85;
    c
}

/// Links at 10 bytes per time unit, the CPU updating 5 bytes per unit, the device 10.
fn optimizer_machine() -> SimConfig {
    let machine = Machine { cpu_optimizer_rate: 5.0, gpu_optimizer_rate: Some(10.0), ..Machine::default() };
    SimConfig { timeline: true, ..SimConfig::on(machine.with_bandwidth(10.0)) }
}

fn t_op(kind: &str, tensor: Tensor) -> Op {
    match kind {
        "off" => Op::Offload { tensor, fraction: 1.0 },
        "pre" => Op::Prefetch { tensor, fraction: 1.0 },
        _ => Op::Free { tensor },
    }
}

#[test]
fn a_device_update_is_timed_at_the_gpu_optimizer_rate() {
    let c = optimizer_chain();
    let s = sched("F0all F1all L B1 B0", 2);
    // F0 + F1 + L + (B1 + 10/10) + (B0 + 10/10).
    let r = simulate_chain(&c, &s, &optimizer_machine()).unwrap();
    assert!(close(r.makespan, 9.0), "{}", r.makespan);
    // The peak is what the static bytes and activations make, as before gradients had names:
    // 85 static + a_0 + ā_1 + ā_2 + δ_2 while B1... = the unnamed chain's peak.
    let mut plain = c.clone();
    (plain.g, plain.o) = (None, None);
    let before = simulate_chain(&plain, &s, &cfg()).unwrap();
    assert_eq!(r.peak_bytes, before.peak_bytes);
    // No rate, no time: the update is part of `btime`.
    let r = simulate_chain(&c, &s, &cfg()).unwrap();
    assert!(close(r.makespan, 7.0), "{}", r.makespan);
}

#[test]
fn a_cpu_update_waits_for_its_gradient_and_leaves_the_device_copy_stale() {
    let c = optimizer_chain();
    // Stage 1's state goes to the host for good, its weights are uploaded (read again by F1
    // and B1); after B1 its gradient is offloaded and the CPU updates the host copies; the
    // stale device copy is dropped and the new weights come back after B0.
    let s = with(
        sched("F0all F1all L B1 B0", 2),
        &[
            (0, t_op("off", Tensor::OptState(1))),
            (0, t_op("off", Tensor::Weight(1))),
            (4, t_op("off", Tensor::WeightGrad(1))),
            (4, Op::CpuUpdate { stage: 1 }),
            (4, t_op("free", Tensor::Weight(1))),
            (5, t_op("pre", Tensor::Weight(1))),
        ],
    );
    let r = simulate_chain(&c, &s, &optimizer_machine()).unwrap();
    // d2h: state 0–2, weights 2–3, gradient 5–6; the CPU 6–8 (10 bytes at 5 a unit); B1
    // skips the device update (3–5), B0 does it (5–8); the weights come back 8–9.
    assert!(close(r.makespan, 9.0), "{}", r.makespan);
    assert!(close(r.cpu_busy, 2.0), "{}", r.cpu_busy);
    let cpu: Vec<_> = r.spans.iter().filter(|sp| sp.lane == Lane::Cpu).collect();
    assert_eq!(cpu.len(), 1);
    assert!(close(cpu[0].start, 6.0) && close(cpu[0].end, 8.0));
    // Host: the state (20) and the weights (10), then the gradient (10) until the update ends.
    assert_eq!(r.peak_host_bytes, 40);
    // Device: everything at first (5 + 80 + a_0), then ā_1 and ā_2 before the state leaves at 2.
    assert_eq!(r.peak_bytes, 88);

    // Without the gradient's offload, the CPU has nothing to update.
    let mut no_grad = s.clone();
    no_grad.ops.retain(|op| op.tensor() != Some(Tensor::WeightGrad(1)));
    match simulate_chain(&c, &no_grad, &optimizer_machine()).unwrap_err() {
        SimError::InvalidOp { why, .. } => assert!(why.contains("not on the host"), "{why}"),
        e => panic!("{e}"),
    }
    // With the state still on the device, the CPU would update a copy the device also holds.
    let mut state_home = s.clone();
    state_home.ops.retain(|op| op.tensor() != Some(Tensor::OptState(1)));
    match simulate_chain(&c, &state_home, &optimizer_machine()).unwrap_err() {
        SimError::InvalidOp { why, .. } => assert!(why.contains("no host copy"), "{why}"),
        e => panic!("{e}"),
    }
    // A CPU update before its backward has nothing to read.
    let early = with(sched("F0all F1all L B1 B0", 2), &[(3, Op::CpuUpdate { stage: 1 })]);
    match simulate_chain(&c, &early, &optimizer_machine()).unwrap_err() {
        SimError::InvalidOp { op: 3, why, .. } => assert!(why.contains("before B1"), "{why}"),
        e => panic!("{e}"),
    }
    // A chain without gradients has no CPU update to run.
    let mut plain = c.clone();
    (plain.g, plain.o) = (None, None);
    assert!(matches!(simulate_chain(&plain, &s, &cfg()).unwrap_err(), SimError::OutOfRange { .. }));
}

#[test]
fn a_periodic_cpu_update_feeds_the_next_periods_forward() {
    let c = optimizer_chain();
    // F0all [pre W1] F1all L B1 [off G1] [cpu 1] [free W1] B0: the state of stage 1 lives on
    // the host, so the period starts with W1 on the host only.
    let tail = [
        (4, t_op("off", Tensor::WeightGrad(1))),
        (4, Op::CpuUpdate { stage: 1 }),
        (4, t_op("free", Tensor::Weight(1))),
    ];
    let late = periodic("F0all F1all L B1 B0", &[&[(1, t_op("pre", Tensor::Weight(1)))][..], &tail].concat());
    let r = simulate_chain(&c, &late, &optimizer_machine()).unwrap();
    // Per period: F0 (1), W1's prefetch (1) before F1, F1, L, B1 (2), B0 (2 + 1): the update
    // ends with B0, so the prefetch issued after F0 costs a unit of stall.
    assert!(close(r.makespan, 9.0), "{}", r.makespan);
    assert!(close(r.compute_time, 8.0) && close(r.compute_stall, 1.0));
    assert!(close(r.cpu_busy, 2.0));
    // Issued at the period's start, the prefetch hides behind F0.
    let early = periodic("F0all F1all L B1 B0", &[&[(0, t_op("pre", Tensor::Weight(1)))][..], &tail].concat());
    let r = simulate_chain(&c, &early, &optimizer_machine()).unwrap();
    assert!(close(r.makespan, 8.0), "{}", r.makespan);
    // Without the drop, the next period's F1 would read the stale device copy.
    let mut stale = late.clone();
    stale.ops.retain(|op| *op != t_op("free", Tensor::Weight(1)));
    stale.ops.retain(|op| *op != t_op("pre", Tensor::Weight(1)));
    match simulate_chain(&c, &stale, &optimizer_machine()).unwrap_err() {
        SimError::InvalidOp { why, .. } => assert!(why.contains("stale"), "{why}"),
        e => panic!("{e}"),
    }
}

#[test]
fn a_paged_state_comes_in_for_its_update_and_goes_out_after() {
    let c = optimizer_chain();
    // Both states paged: each comes in before its backward and goes out after it (periodic,
    // so each period starts with them on the host). O0 comes in once O1 is on its way out.
    let s = periodic(
        "F0all F1all L B1 B0",
        &[
            (3, t_op("pre", Tensor::OptState(1))),
            (4, t_op("off", Tensor::OptState(1))),
            (4, t_op("pre", Tensor::OptState(0))),
            (5, t_op("off", Tensor::OptState(0))),
        ],
    );
    let config = |b| SimConfig { budget: Some(b), ..optimizer_machine() };
    let r = simulate_chain(&c, &s, &optimizer_machine()).unwrap();
    // 40 bytes of state in and out each period, at 10 a unit.
    assert!(close(r.h2d_busy, 4.0) && close(r.d2h_busy, 4.0), "{} {}", r.h2d_busy, r.d2h_busy);
    // Store-all holds both states throughout: 5 + 80 + a_0 + ā_1 + ā_2 + δ_2 + δ_1 = 90 in B1.
    let all = simulate_chain(&c, &periodic("F0all F1all L B1 B0", &[]), &optimizer_machine()).unwrap();
    assert_eq!(all.peak_bytes, 90);
    // Paged, B1 holds one state (70); O0 waits for O1 to leave when the budget says so:
    // during B0, 5 + 40 + O0 + a_0 + ā_1 + δ_1 + δ_0 = 69.
    let tight = simulate_chain(&c, &s, &config(70)).unwrap();
    assert_eq!(tight.peak_bytes, 70);
    assert!(tight.makespan > r.makespan, "{} vs {}", tight.makespan, r.makespan);
    assert!(matches!(simulate_chain(&c, &s, &config(69)).unwrap_err(), SimError::BudgetExceeded { .. }));
    assert_eq!(r.peak_host_bytes, 40);
}
