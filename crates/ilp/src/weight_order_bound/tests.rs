use pebble_solve::weights::brute::Instance;

use super::*;
use crate::weight_bound::{weight_offload_bound, WeightBoundOptions};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1.0)
}

/// Two layers of 3 bytes, no activations, every op 1 time unit, β = 1 (a transfer is 3
/// units), M = 6: `B_2` holds `w_2` and `δw_2` (6), so `w_1` is away at `B_2`; `B_1`
/// likewise sends `w_2` away. The forwards have room for both weights.
fn two_layers() -> (WeightChain, Instance) {
    let inst = Instance { w: vec![3, 3], a: vec![0; 3], uf: vec![1, 1], ub: vec![1, 1], beta: 1, memory: 6 };
    let chain = WeightChain::new(inst.w.clone(), inst.a.clone(), vec![1.0; 2], vec![1.0; 2]).unwrap();
    (chain, inst)
}

/// The bound by hand, at `o = B_1` (positions `B_1` 0, `F_1` 1, `F_2` 2, `B_2` 3): `E = 3 +
/// 3 + 3 − 6 = 3`, so `w_2`, the only other layer, is away throughout `B_1` (`x = 1`).
/// Its prefetch starts after `B_1` ends (`u_o = 1`) and ends by `F_2`: `σ_2 ≥ 1 + 3 = 4`;
/// then `σ_3 ≥ σ_2 + 1 = 5` (`B_2`). Its offload starts after the previous `B_2` ends,
/// at `σ_3 + 1 − T`, and ends by `0`: `T ≥ σ_3 + 1 + 3 ≥ 9`. And 9 is the optimum: `F_1,
/// F_2, B_2`, 3 units idle while `w_2` leaves and `w_1` comes back, `B_1`, then `F_1`
/// and 2 units idle while `w_2` comes back (the brute force finds 9 too). The MILP gives
/// 8: it lets each transfer share an interval with the op that waits for it.
#[test]
fn the_two_layer_instance_by_hand() {
    let (chain, inst) = two_layers();
    let b = ordered_bound(&chain, 6, 1.0, 1.0, &OrderedBoundOptions::default()).unwrap();
    assert!(close(b.time, 9.0), "{b:?}");
    assert_eq!(b.op, Some(WeightOp::Backward(1)));
    assert_eq!(inst.optimum(20), Some(9));
    let milp = weight_offload_bound(&chain, 6, 1.0, &WeightBoundOptions::default()).unwrap();
    assert!(milp.optimal);
    assert!(close(milp.time, 8.0), "the MILP gives {}", milp.time);
    // The relaxation alone (no binaries) gives the same here: one candidate, x = 1.
    let relaxed = OrderedBoundOptions { integral_ops: 0, ..OrderedBoundOptions::default() };
    assert!(close(ordered_bound(&chain, 6, 1.0, 1.0, &relaxed).unwrap().time, 9.0));
}

/// With the links twice as fast, a transfer takes 1.5 units: `T ≥ 1 + 1.5 + 1 + 1 + 1.5 = 6`
/// by the same chain of constraints; with infinite bandwidth on both, `Σu = 4`; with room
/// for everything, `Σu` and no op.
#[test]
fn faster_links_and_more_memory() {
    let (chain, _) = two_layers();
    let o = OrderedBoundOptions::default();
    assert!(close(ordered_bound(&chain, 6, 2.0, 2.0, &o).unwrap().time, 6.0));
    assert!(close(ordered_bound(&chain, 6, f64::INFINITY, f64::INFINITY, &o).unwrap().time, 4.0));
    let roomy = ordered_bound(&chain, 9, 1.0, 1.0, &o).unwrap();
    assert_eq!((roomy.time, roomy.op), (4.0, None));
    // Only the offload link slow: the prefetch is instant, so σ_3 ≥ 3 by the chain alone
    // (B_1, F_1, F_2), and the offload of w_2 between B_2 and B_1 gives T ≥ 3 + 1 + 3 = 7,
    // the period of F_1, F_2, B_2, 3 units idle, B_1.
    let t = ordered_bound(&chain, 6, 1.0, 1e9, &o).unwrap().time;
    assert!((t - 7.0).abs() < 1e-6, "{t}");
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let (chain, _) = two_layers();
    let o = OrderedBoundOptions::default();
    for (out, back) in [(0.0, 1.0), (1.0, -1.0), (f64::NAN, 1.0)] {
        let e = ordered_bound(&chain, 6, out, back, &o).unwrap_err();
        assert!(e.to_string().contains("positive link bandwidths"), "{e}");
    }
    // B_2 needs 6 with its own weights alone: at 5 nothing fits.
    assert_eq!(ordered_bound(&chain, 5, 1.0, 1.0, &o), Err(IlpError::Infeasible));
    assert_eq!(ordered_bound(&chain, 0, 1.0, 1.0, &o), Err(IlpError::Infeasible));
}
