//! Rockmate and rk-Checkmate against Checkmate's optimum, checked by the simulator.

use pebble_graph::TrainingGraph;
use pebble_ilp::rockmate::Prepared;
use pebble_sim::{SimConfig, SimReport};
use pebble_solve::{Problem, SolveOptions};
use pebble_zoo::ModelOptions;

fn gpt(layers: usize, width: usize, seq: usize) -> TrainingGraph {
    pebble_testkit::gpt(layers, width, seq).graph
}

fn run(name: &str, g: &TrainingGraph, budget: u64) -> Option<SimReport> {
    let s = pebble_solve::solver(name).unwrap().solve(Problem::Graph(g), budget, &SolveOptions::default());
    checked(name, g, s.ok()?, budget)
}

/// The simulator's report on a schedule, which must fit its budget.
fn checked(name: &str, g: &TrainingGraph, s: pebble_schedule::Schedule, budget: u64) -> Option<SimReport> {
    let r = pebble_sim::simulate_graph(g, &s, &SimConfig::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(r.peak_bytes <= budget, "{name}: peak {} over the budget {budget}", r.peak_bytes);
    Some(r)
}

#[test]
fn gpt_blocks_are_cut_at_each_residual_and_identical_layers_share_a_class() {
    for layers in [1, 3] {
        let g = gpt(layers, 16, 8);
        let p = Prepared::new(&g, (2, 2), None).unwrap();
        // wte | wpe, add | dropout | (attention | mlp) × layers | ln_f | lm_head
        assert_eq!(p.blocks.len(), 5 + 2 * layers);
        assert_eq!(p.classes.len(), 7);
        assert_eq!(p.class_of[3], p.class_of[3 + 2 * (layers - 1)]);
        for c in &p.classes {
            assert!(!c.options.is_empty());
        }
    }
}

/// rk-Checkmate has every Checkmate schedule (and fast forwards besides), so on the whole
/// graph it is never slower; Rockmate and HiRemate, restricted to block and cluster
/// options, stay within 2% of Checkmate's optimum on GPTs of one and two layers at
/// budgets down to 80% of the activation peak (issue 15's acceptance). One layer here
/// (20 s in the test build); two in the next test, which CI's run leaves out (40 s;
/// `scripts/test.sh --slow` runs it).
#[test]
fn rockmate_and_rk_checkmate_against_checkmate() {
    assert_eq!(against_checkmate(1), 3);
}

#[test]
fn rockmate_and_rk_checkmate_against_checkmate_on_two_layers() {
    assert_eq!(against_checkmate(2), 3);
}

/// On a GPT of `layers` layers at 100%, 90% and 80% of its activations: how many budgets
/// Checkmate has a plan at, each one compared.
fn against_checkmate(layers: usize) -> usize {
    let mut compared = 0;
    let g = gpt(layers, 64, 32);
    let f = g.fixed_bytes();
    let peak = run("store-all", &g, u64::MAX).unwrap().peak_bytes;
    for pct in [100u64, 90, 80] {
        let budget = f + (peak - f) * pct / 100;
        let check = run("checkmate", &g, budget);
        let rk = run("rk-checkmate", &g, budget);
        let rock = run("rockmate", &g, budget);
        let hire = run("hiremate", &g, budget);
        eprintln!(
            "{layers} layers, {pct}%: checkmate {:?} rk-checkmate {:?} rockmate {:?} hiremate {:?}",
            check.as_ref().map(|r| r.makespan),
            rk.as_ref().map(|r| r.makespan),
            rock.as_ref().map(|r| r.makespan),
            hire.as_ref().map(|r| r.makespan)
        );
        if let Some(c) = check {
            let rk = rk.expect("rk-checkmate finds what checkmate finds");
            assert!(rk.makespan <= c.makespan * (1.0 + 1e-6), "{pct}%");
            for (name, plan) in [("rockmate", rock), ("hiremate", hire)] {
                let r = plan.unwrap_or_else(|| panic!("{pct}%: {name} finds no schedule where checkmate finds one"));
                assert!(
                    r.makespan <= c.makespan * 1.02,
                    "{layers} layers, {pct}%: {name} {} vs {}",
                    r.makespan,
                    c.makespan
                );
            }
            compared += 1;
        }
    }
    compared
}

/// HiRemate plans graphs that are not sequential: the encoder-decoder Transformer (the
/// decoder reads the encoder's output at every layer) and U-Net (skip connections across
/// the whole network). Every schedule fits in the simulator, and the tighter budget
/// never makes it faster.
#[test]
fn hiremate_plans_non_sequential_graphs() {
    // The Transformer's loss (its vocabulary-wide logits) alone takes most of the peak:
    // below about 75% nothing fits (DTR, too, runs out of tensors to evict).
    for (name, o, pct) in [
        ("transformer", ModelOptions { layers: Some(2), seq: Some(16), batch: Some(1), ..Default::default() }, 80),
        ("unet", ModelOptions { image: Some(32), batch: Some(1), ..Default::default() }, 70),
    ] {
        let g = pebble_zoo::build(name, &o).unwrap().graph;
        let f = g.fixed_bytes();
        let peak = run("store-all", &g, u64::MAX).unwrap();
        // Prepared once for both budgets, each ILP within half a second (the save axes
        // then get 12 s; a preparation takes about 10 s here): at the default 10 s the
        // save axes alone may take four minutes (`HiremateConfig::save_axes`); the
        // default's plans are the benchmarks' (docs/benchmarks.md). At 2 s each, these
        // plans were the same, in two and a half times the time.
        let options = SolveOptions { time_limit: Some(0.5), ..SolveOptions::default() };
        let hiremate = pebble_solve::solver("hiremate").unwrap().prepare(Problem::Graph(&g), &options).unwrap();
        let at = |budget| checked("hiremate", &g, hiremate.solve(budget).ok()?, budget);
        let full = at(peak.peak_bytes).expect("store-all's peak fits");
        let tight = at(f + (peak.peak_bytes - f) * pct / 100);
        eprintln!(
            "{name}: {} forward ops, store-all {:.4e}, hiremate at 100% {:.4e}, at {pct}% {:?}",
            g.compute.iter().filter(|c| c.kind == pebble_graph::ComputeKind::Forward).count(),
            peak.makespan,
            full.makespan,
            tight.as_ref().map(|r| r.makespan)
        );
        assert!(full.makespan <= peak.makespan * 1.01, "{name}");
        let tight = tight.unwrap_or_else(|| panic!("{name}: hiremate finds no schedule at {pct}%"));
        assert!(tight.makespan >= full.makespan * (1.0 - 1e-9), "{name}");
    }
}

/// A small zoo graph and 70% of its activations (static memory and inputs on top), with
/// the time of each solver's schedule there, `None` where it has none within the budget.
struct SmallCase {
    g: TrainingGraph,
    budget: u64,
}

impl SmallCase {
    fn at_70_percent(model: &str, options: ModelOptions) -> SmallCase {
        let g = pebble_zoo::build(model, &options).unwrap().graph;
        let f = g.fixed_bytes();
        let budget = f + (run("store-all", &g, u64::MAX).unwrap().peak_bytes - f) * 70 / 100;
        SmallCase { g, budget }
    }

    /// A ResNet: a sequence of Rockmate's blocks.
    fn resnet() -> SmallCase {
        let resnet =
            ModelOptions { image: Some(16), batch: Some(1), layers: Some(1), width: Some(4), ..Default::default() };
        SmallCase::at_70_percent("resnet", resnet)
    }

    fn time(&self, solver: &dyn pebble_solve::Solver) -> Option<f64> {
        self.plan(solver).map(|(time, _)| time)
    }

    /// The schedule's time and the solver it says it was kept from.
    fn plan(&self, solver: &dyn pebble_solve::Solver) -> Option<(f64, Option<String>)> {
        let s = solver.solve(Problem::Graph(&self.g), self.budget, &SolveOptions::default()).ok()?;
        let config = SimConfig { budget: Some(self.budget), ..SimConfig::default() };
        pebble_sim::simulate_graph(&self.g, &s, &config).ok().map(|r| (r.makespan, s.kept_from))
    }
}

/// Where a graph has Rockmate's blocks, `hiremate` plans both partitions (the blocks
/// first, H-Partition alone) and keeps the faster. On a small ResNet at 70% of its
/// activations H-Partition alone wins (5.263e-4 against 5.312e-4), and `hiremate` gets it.
#[test]
fn hiremate_keeps_the_faster_of_its_two_partitions() {
    use pebble_ilp::hiremate::{Hiremate, HiremateConfig};
    let own = HiremateConfig { rockmate_incumbent: false, ..HiremateConfig::DEFAULT };
    let blocks = Hiremate { config: HiremateConfig { also_h_partition: false, ..own } };
    let alone = Hiremate { config: HiremateConfig { blocks_first: false, ..own } };
    let case = SmallCase::resnet();
    let time = |solver: &dyn pebble_solve::Solver| case.time(solver).expect("fits");
    let (both, kept) = case.plan(pebble_solve::solver("hiremate").unwrap()).expect("fits");
    let (first, whole) = (time(&blocks), time(&alone));
    assert!(first != whole, "the two partitions should differ here: {first}");
    assert_eq!(kept, None, "HiRemate's own plan is the faster here");
    assert!(both <= first.min(whole) * (1.0 + 1e-12), "hiremate {both}, blocks first {first}, H-Partition {whole}");
}

/// `hiremate` with its own ILPs given a microsecond each and, of its incumbents, only
/// `incumbent`'s plan: alone it finds nothing as fast as the incumbent's plan; with it, it
/// gets that plan's time and says whose plan it kept. Fails if the incumbent is dropped.
fn hurried_hiremate_keeps(case: &SmallCase, incumbent: &str) {
    use pebble_ilp::hiremate::{Hiremate, HiremateConfig};
    let alone = HiremateConfig {
        time_limit: 1e-6,
        rockmate_incumbent: false,
        mincut_incumbent: false,
        start_incumbent: false,
        ..HiremateConfig::DEFAULT
    };
    let with = match incumbent {
        "rockmate" => HiremateConfig { rockmate_incumbent: true, ..alone },
        "pytorch-mincut" => HiremateConfig { mincut_incumbent: true, ..alone },
        other => panic!("{other} is no incumbent of hiremate"),
    };
    let theirs = case.time(pebble_solve::solver(incumbent).unwrap()).expect("the incumbent's plan fits");
    let (own, kept) = (case.time(&Hiremate { config: alone }), case.plan(&Hiremate { config: with }));
    eprintln!("{incumbent} {theirs:e}, hurried hiremate alone {own:?}, with {incumbent}'s plan {kept:?}");
    assert!(own.is_none_or(|t| t > theirs * 1.001), "its own ILPs, hurried, should lose: {own:?}");
    let (time, from) = kept.expect("the incumbent's plan fits");
    assert!(time <= theirs * (1.0 + 1e-12), "{time:e} against {incumbent}'s {theirs:e}");
    assert_eq!(from.as_deref(), Some(incumbent), "the plan says whose it is");
}

/// Where the graph has Rockmate's blocks, `hiremate` starts from Rockmate's plan: when
/// its own ILPs find nothing as good in their time limit (ResNet-50 at batch 4718 on the
/// a100: the top H-ILP finds no plan in 120 s), it keeps Rockmate's. Here, on a small
/// ResNet, its own ILPs get a microsecond each.
#[test]
fn hiremate_starts_from_rockmates_plan() {
    hurried_hiremate_keeps(&SmallCase::resnet(), "rockmate");
}

/// On any graph, `hiremate` also keeps PyTorch's min-cut plan where the simulator runs it
/// faster (the 24+24-layer Transformer at half its activations: +7.9% against HiRemate's
/// own +12.9%). Here, on a 2-layer GPT, its own ILPs get a microsecond each.
#[test]
fn hiremate_keeps_pytorchs_min_cut_plan_where_faster() {
    let gpt = ModelOptions { layers: Some(2), ..Default::default() };
    hurried_hiremate_keeps(&SmallCase::at_70_percent("gpt", gpt), "pytorch-mincut");
}

/// Where Rockmate's blocks are larger than `M^l` (the captured GPT-2's first block holds
/// its first layer and the second's attention, the causal mask crossing both), Rockmate
/// is not prepared up front; when HiRemate's own top H-ILP then finds nothing in its time
/// limit, Rockmate's plan is still kept where it fits. Here on a small ResNet whose
/// blocks (of 6 and more ops) exceed an `M^l` of 3, HiRemate's own ILPs get a
/// microsecond each.
#[test]
fn hurried_hiremate_keeps_rockmates_plan_on_large_blocks() {
    use pebble_ilp::hiremate::{Hiremate, HiremateConfig};
    use pebble_solve::Solver;
    let case = SmallCase::resnet();
    let mut partition = HiremateConfig::DEFAULT.partition;
    partition.max_sub = 3;
    let alone = HiremateConfig {
        time_limit: 1e-6,
        rockmate_incumbent: false,
        mincut_incumbent: false,
        start_incumbent: false,
        partition,
        ..HiremateConfig::DEFAULT
    };
    let with = HiremateConfig { rockmate_incumbent: true, ..alone };
    let problem = Problem::Graph(&case.g);
    let own = Hiremate { config: alone }.solve(problem, case.budget, &SolveOptions::default()).unwrap_err();
    assert!(own.to_string().contains("time limit") && own.to_string().contains("keeps no incumbent"), "{own}");
    let theirs = case.time(pebble_solve::solver("rockmate").unwrap()).expect("Rockmate's plan fits");
    let (time, from) = case.plan(&Hiremate { config: with }).expect("Rockmate's plan is kept");
    assert_eq!(from.as_deref(), Some("rockmate"));
    assert!(time <= theirs * (1.0 + 1e-12), "{time:e} against Rockmate's {theirs:e}");
    // Below Rockmate's least budget, the error says both.
    let least =
        pebble_solve::min_feasible_budget(pebble_solve::solver("rockmate").unwrap(), problem, &SolveOptions::default())
            .unwrap()
            .expect("Rockmate plans somewhere");
    let e = Hiremate { config: with }.solve(problem, least - 1, &SolveOptions::default()).unwrap_err().to_string();
    assert!(e.contains("time limit") && e.contains("no incumbent (rockmate) fits"), "{e}");
}

/// A hurried Checkmate keeps its warm start (DTR's plan or recompute-all, in its stages):
/// where its ILP proves nothing in its time limit it returns that plan, within the budget
/// and not proven optimal. (Where no start fits, the error says so: the GPT-2 unit test
/// `without_a_start_a_hurried_ilp_says_it_keeps_no_incumbent`.)
#[test]
fn hurried_checkmate_keeps_its_start() {
    let case = SmallCase::resnet();
    let options = SolveOptions { time_limit: Some(1e-6), ..SolveOptions::default() };
    let p =
        pebble_solve::plan(&pebble_ilp::checkmate::Checkmate, Problem::Graph(&case.g), case.budget, &options).unwrap();
    assert_eq!(p.schedule.optimal, Some(false));
    assert!(p.report.peak_bytes <= case.budget, "{} > {}", p.report.peak_bytes, case.budget);
}

/// On every graph, `hiremate` also keeps Checkmate's warm start (DTR's plan or
/// recompute-all, in Checkmate's stages, pruned): on transformers' GPT-2 as pebble.torch
/// captured it, at 60% of its activations (1,791,795 bytes), neither Rockmate's plan
/// (from 68%) nor the min cut's (from 87%) fits, and the top H-ILP found nothing in 2 s
/// (the Python tests' limit). Here its own ILPs get a microsecond each, and it keeps the
/// start's plan, at +7.6%. (Without it, HiRemate's last resort, Rockmate prepared with
/// 10 s ILPs, finds a plan 0.03% faster, in 190 s.)
#[test]
fn hurried_hiremate_keeps_checkmates_start() {
    use pebble_ilp::hiremate::{Hiremate, HiremateConfig};
    let case = SmallCase { g: pebble_testkit::captured::hf_gpt2(), budget: 1_791_795 };
    let hurried = HiremateConfig { time_limit: 1e-6, ..HiremateConfig::DEFAULT };
    let start = pebble_ilp::checkmate::start_schedule(&case.g, case.budget).expect("a start fits");
    let config = SimConfig { budget: Some(case.budget), ..SimConfig::default() };
    let theirs = pebble_sim::simulate_graph(&case.g, &start, &config).expect("the start runs in the budget").makespan;
    let (time, from) = case.plan(&Hiremate { config: hurried }).expect("the start's plan fits");
    assert_eq!(from.as_deref(), Some("checkmate"), "the plan says whose it is");
    assert!(time <= theirs * (1.0 + 1e-12), "{time:e} against the start's {theirs:e}");
    let store_all = run("store-all", &case.g, u64::MAX).unwrap().makespan;
    assert!(time < store_all * 1.2, "{time:e}: more than +20% over store-all's {store_all:e}");
}

/// Below what one node alone needs at its run with grad (1,356,800 bytes on the captured
/// GPT-2), no plan exists: HiRemate, whose top H-ILP there stops at its time limit, says
/// the budget is infeasible and why, so that the least budget is searched for, where it
/// said "time limit".
#[test]
fn hiremate_below_every_plan_is_infeasible() {
    use pebble_ilp::hiremate::{Hiremate, HiremateConfig};
    use pebble_solve::Solver;
    let g = pebble_testkit::captured::hf_gpt2();
    let hurried = Hiremate { config: HiremateConfig { time_limit: 1e-6, ..HiremateConfig::DEFAULT } };
    let e = hurried.solve(Problem::Graph(&g), 1_339_596, &SolveOptions::default()).unwrap_err();
    assert!(matches!(e, pebble_solve::SolveError::Infeasible { .. }), "{e}");
    assert!(e.to_string().contains("alone needs 1356800 bytes"), "{e}");
}
