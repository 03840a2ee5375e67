use super::*;
use crate::{Schedule, View};

fn with(text: &str, l: usize, extra: &[(usize, Op)]) -> Vec<Op> {
    let mut ops = Schedule::from_notation(View::Chain, text).unwrap().resolve_loss(l).ops;
    for &(at, op) in extra {
        ops.insert(at, op);
    }
    ops
}

fn lower(ops: &[Op], ids: Ids) -> ChainProgram {
    lower_chain(ops, ids, false, &[], 1)
}

const OFF1: Op = Op::Offload { tensor: Tensor::Saved(1), fraction: 1.0 };
const PRE1: Op = Op::Prefetch { tensor: Tensor::Saved(1), fraction: 1.0 };

fn plain(l: usize) -> Ids {
    Ids { l, weights: false, grads: false, states: false }
}

#[test]
fn table_2_1_on_a_rotor_sequence() {
    // F0ck F1none F2all L B2 F0all F1all B1 B0 on L = 3 (n = 4: ā_i is 4 + i, δ_i 8 + i).
    let ids = plain(3);
    let p = lower(&with("F0ck F1none F2all L B2 F0all F1all B1 B0", 3, &[]), ids).checked().unwrap();
    let s = &p.steps;
    let rcf = |k: usize| (s[k].reads.clone(), s[k].creates.clone(), s[k].frees.clone());
    // F0ck reads a_0 and creates Activation(1); F1∅ reads it and frees it.
    assert_eq!(rcf(0), (vec![0], vec![1], vec![]));
    assert_eq!(rcf(1), (vec![1], vec![2], vec![1]));
    // F2all keeps a_2 and creates ā_3.
    assert_eq!(rcf(2), (vec![2], vec![7], vec![]));
    // The loss reads a_3 through ā_3 (no Activation(3) was made) and frees nothing.
    assert_eq!(s[3].action, Action::Loss { input: 7, output: 11 });
    assert_eq!(rcf(3), (vec![7], vec![11], vec![]));
    // B2 reads δ_3, ā_3, a_2; frees them but a_2's saved set, which is ā_3 itself.
    assert_eq!(rcf(4), (vec![11, 7, 2], vec![10], vec![11, 7, 2]));
    // F1all reads a_1 through ā_1, since F1∅ freed Activation(1).
    assert_eq!(s[6].action, Action::Forward { stage: 1, mode: ForwardMode::KeepAll, input: 5, output: 6 });
    // B1 reads a_1 through ā_1 as well, and leaves ā_1 to B0.
    assert_eq!(
        s[7].action,
        Action::Backward { stage: 1, input: 5, grad_in: 10, saved: 6, output: 9, update_on_device: true }
    );
    assert_eq!(s[7].frees, vec![10, 6]);
    // B0 reads ā_1 as its saved set and a_0; frees δ_1, ā_1 and a_0.
    assert_eq!(rcf(8), (vec![9, 5, 0], vec![8], vec![9, 5, 0]));
    assert!(s.iter().all(|s| s.missing.is_none()));
}

#[test]
fn an_offloaded_saved_set_stays_on_the_device_for_the_forward_that_reads_it() {
    // F0all [offload ā_1] F1all F2all L B2 [prefetch ā_1] B1 B0: F1all reads a_1 from
    // ā_1 (no Activation(1) is held), so the device copy stays until op 2 ends.
    let ids = Ids::with_statics(3);
    let ops = with("F0all F1all F2all L B2 B1 B0", 3, &[(1, OFF1), (6, PRE1)]);
    let p = lower(&ops, ids).checked().unwrap();
    let hold = |k: usize| match p.steps[k].action {
        Action::Offload { hold_until, .. } => hold_until,
        _ => panic!("not an offload"),
    };
    assert_eq!(hold(1), Some(2));
    assert!(matches!(p.steps[2].action, Action::Forward { input: 5, .. }));
    assert_eq!(p.steps[2].reads, vec![5, 13]); // ā_1 is id L + 1 + 1, Weight(1) 3(L + 1) + 1
                                               // B1 reads a_1 from ā_1 too, but after the prefetch: no hold reaches it, and it waits.
    assert!(matches!(p.steps[7].action, Action::Backward { input: 5, .. }));
    assert_eq!(p.steps[7].waits, vec![6]);
    // With a checkpoint of a_1 held, F1 reads it, and the offload holds nothing.
    let ops = with("F0ck F0all F1all F2all L B2 B1 B0", 3, &[(2, OFF1), (7, PRE1)]);
    let p = lower(&ops, ids).checked().unwrap();
    assert!(matches!(p.steps[2].action, Action::Offload { hold_until: None, .. }));
    assert!(matches!(p.steps[3].action, Action::Forward { input: 1, .. }));
}

#[test]
fn what_a_chain_does_not_have_is_refused_and_a_missing_input_named() {
    let w = Op::Prefetch { tensor: Tensor::Weight(2), fraction: 1.0 };
    let (at, why) = lower(&with("F0all F1all L B1 B0", 2, &[(0, w)]), Ids::with_statics(2)).checked().unwrap_err();
    assert_eq!(at, 0);
    assert!(why.to_string().contains("Weight(2) (the chain has 2 stages)"), "{why}");
    let (at, why) = lower(&with("F0all F1all L B1 B0", 2, &[(0, w)]), plain(2)).checked().unwrap_err();
    assert!(at == 0 && why.to_string().contains("no weights"), "{why}");
    let p = lower(&with("F0all L B1 B0", 2, &[]), plain(2)).checked().unwrap();
    // F0all makes ā_1 only: the loss finds no a_2.
    assert_eq!(p.steps[1].missing, Some(2));
    let (at, why) = lower(&with("F0all F1all L B1 B1 B0", 2, &[]), plain(2)).checked().unwrap_err();
    assert!(at == 4 && why.to_string().contains("B1 already ran"), "{why}");
}

#[test]
fn a_fused_update_on_the_device_reads_the_state_and_makes_host_copies_stale() {
    let ids = Ids::with_statics(2);
    let g0 = Op::Offload { tensor: Tensor::WeightGrad(0), fraction: 1.0 };
    let cpu = Op::CpuUpdate { stage: 0 };
    let ops = with("F0all F1all L B1 B0", 2, &[(5, g0), (6, cpu)]);
    let p = lower(&ops, ids).checked().unwrap();
    // B1 runs its update on the device: it reads OptState(1) and updates Weight(1) and
    // OptState(1) in place; B0 leaves stage 0 to the CPU.
    let b1 = &p.steps[3];
    assert!(b1.reads.contains(&ids.state(1)) && b1.updates == vec![ids.weight(1), ids.state(1)]);
    let b0 = &p.steps[4];
    assert!(!b0.reads.contains(&ids.state(0)) && b0.updates.is_empty());
    assert!(matches!(b0.action, Action::Backward { update_on_device: false, .. }));
    assert_eq!(
        p.steps[6].action,
        Action::CpuUpdate { stage: 0, grad: ids.wgrad(0), weight: ids.weight(0), state: Some(ids.state(0)) }
    );
    // A gradient offloaded is created again by the next backward of its stage.
    let ops = with("F0all F1all L B1 B0 F0all F1all L B1 B0", 2, &[(5, g0)]);
    let p = lower(&ops, Ids::with_statics(2));
    let (at, _) = p.clone().checked().unwrap_err(); // the second loss: a period has one
    assert_eq!(at, 8);
    assert!(p.steps[4].reads.contains(&ids.wgrad(0)));
}

#[test]
fn a_periodic_schedule_takes_a_new_input_each_period() {
    let ops = with("F0all F1all L B1 B0", 2, &[]);
    let p = lower_chain(&ops, plain(2), true, &[], 3).checked().unwrap();
    assert_eq!(p.steps.len(), 15);
    // Each period's F0 reads the new a_0, and B0 frees it.
    for period in 0..3 {
        assert_eq!(p.steps[5 * period].reads, vec![0]);
        assert_eq!(p.steps[5 * period + 4].frees, vec![7, 4, 0]); // δ_1, ā_1, a_0
    }
}
