//! The pipeline simulator: a schedule of the [pipeline view](pebble_schedule::pipeline)
//! on `P` devices and the links between them (Shilova, Part III).
//!
//! * Each device runs its [`Op::Run`]s in the order listed, each as soon as the device is
//!   free and its inputs are there: `F` of a stage needs `F` of the stage before (the
//!   same micro-batch); `B` or `I` needs the stage's own `F` and the `B` or `I` of the
//!   stage after; `W` needs the stage's `I`.
//! * An input from a stage on another device comes through an [`Op::Send`], which the
//!   schedule must list. The link between two devices carries one transfer at a time,
//!   both directions sharing it (the thesis's exclusive mode): in a periodic pattern in
//!   the order the sends are listed (the pattern gives the communications their slots),
//!   in a flushed step in the order they become ready; a transfer takes `bytes / β` plus
//!   the link's latency.
//! * Memory per device (§1.6, with the ILP's communication buffers of Assumption 5):
//!   the stages' static bytes, with two weight versions in a periodic schedule
//!   (PipeDream-2BW's stashing) and one with a flush; a buffer of `a_j` and one of `δ_j`
//!   on both sides of every boundary `j` that crosses devices; what each forward keeps,
//!   from its start to the end of its `B` (or `W`); the output gradient an `I` leaves
//!   for its `W`; and each pass's temporaries while it runs.
//! * A periodic schedule is unrolled over enough periods to reach its steady state; the
//!   period reported is the steady-state time per micro-batch. A flushed one runs once:
//!   its period is the step time over its micro-batches.

use pebble_graph::Layers;
use pebble_schedule::{Op, Pass, PipeStage, Schedule, View};
use serde::Serialize;

use crate::SimError;

/// How to simulate a pipeline schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PipeConfig {
    /// Each link's bandwidth in bytes per second (`f64::INFINITY`: free transfers).
    pub bandwidth: f64,
    /// Each transfer's latency in seconds.
    pub latency: f64,
    /// Each device's memory in bytes; `None` = unlimited.
    pub memory: Option<u64>,
    /// How many periods a periodic schedule is unrolled over (at least the schedule's
    /// span of micro-batch shifts plus its stage count, times four, is used).
    pub periods: usize,
    /// Weight versions each device keeps; `None`: two in a periodic schedule
    /// (PipeDream-2BW's stashing), one in a flushed one.
    pub weight_versions: Option<u64>,
}

impl PipeConfig {
    /// A link of `bandwidth` bytes per second, no latency, `memory` per device.
    pub fn new(bandwidth: f64, memory: Option<u64>) -> PipeConfig {
        PipeConfig { bandwidth, latency: 0.0, memory, periods: 24, weight_versions: None }
    }
}

/// Where a span ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PipeLane {
    /// A device's compute stream.
    Device(usize),
    /// The link between two devices (the lower index first).
    Link(usize, usize),
}

/// One pass or transfer of the simulated run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PipeSpan {
    /// Where.
    pub lane: PipeLane,
    /// The pipeline stage.
    pub stage: usize,
    /// The micro-batch (absolute, not the shift).
    pub micro: i64,
    /// The pass, or `None` for a transfer.
    pub pass: Option<Pass>,
    /// For a transfer: a gradient (backward), not an activation.
    pub grad: bool,
    /// Start.
    pub start: f64,
    /// End.
    pub end: f64,
}

/// What a valid pipeline schedule does.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PipeReport {
    /// Steady-state time per micro-batch: the period over the micro-batches it runs
    /// (the thesis's normalized period `T/k`), or a flushed step's time over its
    /// micro-batches.
    pub period: f64,
    /// Micro-batches per second, `1 / period`.
    pub throughput: f64,
    /// A flushed schedule's step time (its makespan); `None` for a periodic one.
    pub step_time: Option<f64>,
    /// Each device's peak memory.
    pub peak_bytes_per_device: Vec<u64>,
    /// Each device's compute time per micro-batch.
    pub busy_per_device: Vec<f64>,
    /// Idle time over busy time, all devices together: `(P·period − Σ busy) / Σ busy`,
    /// the convention of the published bubble fractions (GPipe's `(p−1)/m`).
    pub bubble: f64,
    /// The busiest link's transfer time per micro-batch.
    pub link_busy: f64,
    /// Devices that run at least one pass.
    pub devices_used: usize,
    /// The passes and transfers of a window of the run (a flushed step whole; three
    /// steady-state periods of a periodic one), for charts.
    pub spans: Vec<PipeSpan>,
}

/// One pass or send of the unrolled schedule.
#[derive(Clone, Copy)]
struct Inst {
    /// Index into the schedule's ops.
    op: usize,
    stage: usize,
    micro: i64,
    /// The period of the unrolled schedule it belongs to.
    period: i64,
    /// `None` for a send.
    pass: Option<Pass>,
    grad: bool,
    lane: PipeLane,
    dur: f64,
}

impl Inst {
    /// What it is, as a key beside its stage and micro-batch: a pass, or a send.
    fn what(&self) -> u8 {
        match self.pass {
            Some(Pass::F) => 0,
            Some(Pass::B) => 1,
            Some(Pass::I) => 2,
            Some(Pass::W) => 3,
            None if self.grad => 5,
            None => 4,
        }
    }
}

impl PipeConfig {
    /// The time a transfer of `bytes` takes on a link.
    fn transfer_time(&self, bytes: u64) -> f64 {
        if self.bandwidth.is_infinite() {
            self.latency
        } else {
            bytes as f64 / self.bandwidth + self.latency
        }
    }
}

/// The compute time of `pass` over stage `s`'s layers.
fn pass_time(layers: &Layers, s: &PipeStage, pass: Pass) -> f64 {
    let r = s.first..=s.last;
    match pass {
        Pass::F => r.map(|l| layers.uf[l]).sum(),
        Pass::B => r.map(|l| layers.ub[l]).sum(),
        Pass::I => r.map(|l| layers.ub[l] - layers.uw[l]).sum(),
        Pass::W => r.map(|l| layers.uw[l]).sum(),
    }
}

/// The error for op `op` of `schedule`, which is invalid because of `why`.
fn invalid(schedule: &Schedule, op: usize, why: String) -> SimError {
    SimError::InvalidOp { op, text: schedule.ops.get(op).map_or(String::new(), |o| o.to_string()), why }
}

/// Simulates a pipeline schedule on `layers`.
pub fn simulate_pipeline(layers: &Layers, schedule: &Schedule, config: &PipeConfig) -> Result<PipeReport, SimError> {
    if schedule.view != View::Pipeline {
        return Err(SimError::WrongView { found: schedule.view, expected: View::Pipeline });
    }
    let stages = &schedule.stages;
    if stages.last().map(|s| s.last + 1) != Some(layers.len()) {
        return Err(SimError::Incomplete(format!(
            "the stages cover {} layers, the chain has {}",
            stages.last().map_or(0, |s| s.last + 1),
            layers.len()
        )));
    }
    let split = backward_split(schedule)?;
    check_unrolled_size(schedule, config)?;
    let mut run = Run::unroll(layers, schedule, config, split);
    run.link()?;
    run.place()?;
    let peak = run.peak_memory()?;
    Ok(run.report(peak))
}

/// Checks that `schedule`'s micro-batches are in range, that it runs each pass once per
/// micro-batch residue and sends each tensor once, and says which pass each stage's
/// backward uses: `B` (`Some(false)`), or `I` and `W` (`Some(true)`).
fn backward_split(schedule: &Schedule) -> Result<Vec<Option<bool>>, SimError> {
    let n = schedule.stages.len();
    let k = schedule.microbatches.unwrap_or(1).max(1) as i64;
    let invalid = |op: usize, why: String| invalid(schedule, op, why);
    let mut split = vec![None::<bool>; n];
    let mut seen = std::collections::HashSet::new();
    let mut sends = std::collections::HashSet::new();
    for (i, op) in schedule.ops.iter().enumerate() {
        // Before anything is unrolled: the shifts' span sets how many periods are unrolled.
        if let Op::Run { micro, .. } | Op::Send { micro, .. } = *op {
            if let Some(why) = schedule.micro_out_of_range(micro) {
                return Err(invalid(i, why));
            }
        }
        match *op {
            Op::Run { stage, micro, pass, .. } => {
                if stage >= n {
                    return Err(invalid(i, format!("stage {stage} does not exist ({n} stages)")));
                }
                let is_split = matches!(pass, Pass::I | Pass::W);
                if pass != Pass::F {
                    match split[stage] {
                        None => split[stage] = Some(is_split),
                        Some(s) if s != is_split => {
                            return Err(invalid(
                                i,
                                format!("stage {stage} mixes a whole backward B with a split one (I, W)"),
                            ))
                        }
                        _ => {}
                    }
                }
                if !seen.insert((stage, micro.rem_euclid(k), pass)) {
                    return Err(invalid(
                        i,
                        format!("stage {stage} runs {pass:?} twice for micro-batch {} (mod {k})", micro.rem_euclid(k)),
                    ));
                }
            }
            Op::Send { stage, .. } if stage >= n => {
                return Err(invalid(i, format!("stage {stage} does not exist ({n} stages)")));
            }
            Op::Send { stage, micro, grad, .. } => {
                if !sends.insert((stage, micro.rem_euclid(k), grad)) {
                    return Err(invalid(i, format!("a second send of the same tensor (micro-batch {micro} mod {k})")));
                }
            }
            _ => return Err(invalid(i, "a pipeline schedule runs only `run` and `send` ops".into())),
        }
    }
    for (s, &is_split) in split.iter().enumerate() {
        let passes: &[Pass] = if is_split == Some(true) { &[Pass::F, Pass::I, Pass::W] } else { &[Pass::F, Pass::B] };
        for &p in passes {
            for r in 0..k {
                if !seen.contains(&(s, r, p)) {
                    return Err(SimError::Incomplete(format!(
                        "stage {s} never runs {p:?} for micro-batch {r} (mod {k})"
                    )));
                }
            }
        }
    }
    Ok(split)
}

/// The most pass and send instances a schedule may unroll to (a few hundred bytes each,
/// with their dependencies and times: about a gigabyte).
pub const MAX_INSTANCES: u64 = 1 << 22;

/// The periods a schedule is unrolled over: a periodic one's steady state is reached
/// within four times its shifts' span plus its stage count; a flushed one runs once.
fn unrolled_periods(schedule: &Schedule, config: &PipeConfig) -> usize {
    let (lo, hi) = schedule.shift_span();
    let span = usize::try_from(hi - lo).unwrap_or(usize::MAX);
    match schedule.periodic {
        true => config.periods.max(span.saturating_add(schedule.stages.len() + 1).saturating_mul(4)),
        false => 1,
    }
}

/// Refuses, before anything is unrolled, a schedule whose periods times ops exceed
/// [`MAX_INSTANCES`]: shifts within range (±4096 periods) over thousands of ops, or
/// thousands of stages, once asked the simulator for hundreds of millions of instances
/// (a 555 KB file aborted `pebble simulate` out of memory). The error names an op of the
/// farthest shift.
fn check_unrolled_size(schedule: &Schedule, config: &PipeConfig) -> Result<(), SimError> {
    let periods = unrolled_periods(schedule, config);
    let instances = (periods as u128).saturating_mul(schedule.ops.len() as u128);
    if instances <= u128::from(MAX_INSTANCES) {
        return Ok(());
    }
    let k = schedule.microbatches.unwrap_or(1).max(1) as i64;
    let shift = |op: &Op| match *op {
        Op::Run { micro, .. } | Op::Send { micro, .. } => micro.div_euclid(k).unsigned_abs(),
        _ => 0,
    };
    let farthest = (0..schedule.ops.len()).max_by_key(|&i| shift(&schedule.ops[i])).unwrap_or(0);
    let (lo, hi) = schedule.shift_span();
    Err(invalid(
        schedule,
        farthest,
        format!(
            "the schedule unrolls to {periods} periods of {} ops (its shifts span {} periods; {} stage(s)): \
             {instances} instances, more than the simulator's {MAX_INSTANCES}",
            schedule.ops.len(),
            hi - lo,
            schedule.stages.len()
        ),
    ))
}

/// A run of a checked schedule: its instances, what each waits for, and when each runs.
struct Run<'a> {
    layers: &'a Layers,
    schedule: &'a Schedule,
    config: &'a PipeConfig,
    /// Per stage: whether its backward is split into `I` and `W` (see [`backward_split`]).
    split: Vec<Option<bool>>,
    devices: usize,
    /// Micro-batches per period.
    k: i64,
    /// Micro-batches unrolled.
    total: i64,
    insts: Vec<Inst>,
    /// The instances each instance waits for.
    deps: Vec<Vec<usize>>,
    start: Vec<f64>,
    end: Vec<f64>,
}

impl<'a> Run<'a> {
    /// Unrolls `schedule` (a periodic one over enough periods to reach its steady state)
    /// into instances with their durations.
    fn unroll(layers: &'a Layers, schedule: &'a Schedule, config: &'a PipeConfig, split: Vec<Option<bool>>) -> Run<'a> {
        let stages = &schedule.stages;
        let k = schedule.microbatches.unwrap_or(1).max(1) as i64;
        let periods = unrolled_periods(schedule, config) as i64;
        let total = periods * k;
        let insts: Vec<Inst> = schedule
            .unroll(total as usize)
            .into_iter()
            .map(|u| match schedule.ops[u.op] {
                Op::Run { device, stage, pass, .. } => Inst {
                    op: u.op,
                    stage,
                    micro: u.micro,
                    period: u.period,
                    pass: Some(pass),
                    grad: false,
                    lane: PipeLane::Device(device),
                    dur: pass_time(layers, &stages[stage], pass),
                },
                Op::Send { from, to, stage, grad, .. } => {
                    let bytes = if grad {
                        layers.boundary[stages[stage].first - 1]
                    } else {
                        layers.boundary[stages[stage].last]
                    };
                    Inst {
                        op: u.op,
                        stage,
                        micro: u.micro,
                        period: u.period,
                        pass: None,
                        grad,
                        lane: PipeLane::Link(from.min(to), from.max(to)),
                        dur: config.transfer_time(bytes),
                    }
                }
                _ => unreachable!("checked by backward_split"),
            })
            .collect();
        let count = insts.len();
        Run {
            layers,
            schedule,
            config,
            split,
            devices: schedule.devices.unwrap_or(1),
            k,
            total,
            insts,
            deps: vec![Vec::new(); count],
            start: vec![f64::NAN; count],
            end: vec![f64::NAN; count],
        }
    }

    /// Finds what each instance waits for: the pass before it on its own device, or the
    /// send that brings its input from another.
    fn link(&mut self) -> Result<(), SimError> {
        let stages = &self.schedule.stages;
        let n = stages.len();
        let mut index = std::collections::HashMap::with_capacity(self.insts.len());
        for (x, inst) in self.insts.iter().enumerate() {
            index.insert((inst.stage, inst.micro, inst.what()), x);
        }
        let backward_of = |stage: usize| if self.split[stage] == Some(true) { 2u8 } else { 1 };
        for (x, inst) in self.insts.iter().enumerate() {
            let s = inst.stage;
            let u = inst.micro;
            let deps = &mut self.deps[x];
            let mut need = |stage: usize, what: u8, why: &str| -> Result<(), SimError> {
                match index.get(&(stage, u, what)) {
                    Some(&y) => {
                        deps.push(y);
                        Ok(())
                    }
                    None => Err(invalid(self.schedule, inst.op, format!("micro-batch {u}: {why}"))),
                }
            };
            match inst.pass {
                Some(Pass::F) if s > 0 => {
                    if stages[s - 1].device == stages[s].device {
                        need(s - 1, 0, "the stage before never runs F")?;
                    } else {
                        need(s - 1, 4, &format!("no send brings stage {}'s activation", s - 1))?;
                    }
                }
                Some(Pass::F) => {}
                Some(Pass::B | Pass::I) => {
                    need(s, 0, "its F never runs")?;
                    if s + 1 < n {
                        if stages[s + 1].device == stages[s].device {
                            need(s + 1, backward_of(s + 1), "the stage after never runs its backward")?;
                        } else {
                            need(s + 1, 5, &format!("no send brings stage {}'s gradient", s + 1))?;
                        }
                    }
                }
                Some(Pass::W) => need(s, 2, "its I never runs")?,
                None if inst.grad => need(s, backward_of(s), "the send's backward never runs")?,
                None => need(s, 0, "the send's F never runs")?,
            }
        }
        Ok(())
    }

    /// Times every instance: each lane takes the candidate that can start earliest.
    ///
    /// Lanes: the devices, then the links. A device runs its passes in the order listed;
    /// so does a link in a periodic pattern (the pattern gives the communications their
    /// slots, as the thesis's 2P−1 transformation makes them tasks). In a flushed step a
    /// link sends each tensor as soon as it is ready, first come first served: a send
    /// waits on one pass, and joins `ready_sends` when that pass ends.
    fn place(&mut self) -> Result<(), SimError> {
        let (insts, deps, devices) = (&self.insts, &self.deps, self.devices);
        let mut link_index: std::collections::HashMap<(usize, usize), usize> = Default::default();
        for inst in insts {
            if let PipeLane::Link(a, b) = inst.lane {
                let next = devices + link_index.len();
                link_index.entry((a, b)).or_insert(next);
            }
        }
        let lane_of = |lane: PipeLane| match lane {
            PipeLane::Device(d) => d,
            PipeLane::Link(a, b) => link_index[&(a, b)],
        };
        let lanes = devices + link_index.len();
        let mut queues: Vec<Vec<usize>> = vec![Vec::new(); lanes];
        let mut sends_after: Vec<Vec<usize>> = vec![Vec::new(); insts.len()];
        for (x, inst) in insts.iter().enumerate() {
            match inst.lane {
                PipeLane::Link(..) if !self.schedule.periodic => sends_after[deps[x][0]].push(x),
                lane => queues[lane_of(lane)].push(x),
            }
        }
        let mut ready_sends: Vec<usize> = Vec::new();
        let (start, end) = (&mut self.start, &mut self.end);
        let mut head = vec![0usize; lanes];
        let mut lane_free = vec![0.0f64; lanes];
        let ready_at = |x: usize, end: &[f64]| -> Option<f64> {
            deps[x].iter().try_fold(0.0f64, |t, &y| if end[y].is_nan() { None } else { Some(t.max(end[y])) })
        };
        for _ in 0..insts.len() {
            // The candidate that can start earliest.
            let mut best: Option<(f64, usize, Option<usize>)> = None;
            for d in 0..lanes {
                if let Some(&x) = queues[d].get(head[d]) {
                    if let Some(r) = ready_at(x, end) {
                        let t = r.max(lane_free[d]);
                        if best.is_none_or(|(bt, bx, _)| t < bt || (t == bt && x < bx)) {
                            best = Some((t, x, Some(d)));
                        }
                    }
                }
            }
            for &x in &ready_sends {
                if let Some(r) = ready_at(x, end) {
                    let t = r.max(lane_free[lane_of(insts[x].lane)]);
                    if best.is_none_or(|(bt, bx, _)| t < bt || (t == bt && x < bx)) {
                        best = Some((t, x, None));
                    }
                }
            }
            let Some((t, x, dev)) = best else {
                return Err(self.deadlock(&queues, &head));
            };
            start[x] = t;
            end[x] = t + insts[x].dur;
            match dev {
                Some(d) => {
                    head[d] += 1;
                    lane_free[d] = end[x];
                }
                None => {
                    lane_free[lane_of(insts[x].lane)] = end[x];
                    ready_sends.retain(|&y| y != x);
                }
            }
            ready_sends.extend(sends_after[x].iter().copied());
        }
        Ok(())
    }

    /// The error when no lane can go on: what each one waits with.
    fn deadlock(&self, queues: &[Vec<usize>], head: &[usize]) -> SimError {
        let waiting: Vec<String> = (0..queues.len())
            .filter_map(|d| {
                let what = if d < self.devices { format!("device {d}") } else { "a link".to_string() };
                queues[d].get(head[d]).map(|&x| {
                    format!("{what} at {} (micro-batch {})", self.schedule.ops[self.insts[x].op], self.insts[x].micro)
                })
            })
            .collect();
        SimError::Incomplete(format!(
            "deadlock: every device waits for an input that never comes ({})",
            waiting.join(", ")
        ))
    }

    /// Each device's memory before any pass: its stages' static bytes, and a buffer of
    /// `a` and one of `δ` on both sides of each boundary that crosses devices.
    fn base_memory(&self) -> Vec<u64> {
        let (stages, layers) = (&self.schedule.stages, self.layers);
        let versions = self.config.weight_versions.unwrap_or(if self.schedule.periodic { 2 } else { 1 });
        let mut base = vec![0u64; self.devices];
        for s in stages {
            base[s.device] += layers.static_bytes(s.first, s.last, versions);
        }
        for w in stages.windows(2) {
            if w[0].device != w[1].device {
                let b = 2 * layers.boundary[w[0].last];
                base[w[0].device] += b;
                base[w[1].device] += b;
            }
        }
        base
    }

    /// Each device's peak memory, checked against the budget: the base, what each
    /// forward keeps until its `B` (or `W`), the gradient an `I` leaves for its `W`, and
    /// the passes' temporaries.
    fn peak_memory(&self) -> Result<Vec<u64>, SimError> {
        let (stages, layers) = (&self.schedule.stages, self.layers);
        let base = self.base_memory();
        // Events: (time, order, device, delta); releases sort before allocations at a tie.
        let mut events: Vec<(f64, u8, usize, i128, usize)> = Vec::new();
        for (x, inst) in self.insts.iter().enumerate() {
            let PipeLane::Device(d) = inst.lane else { continue };
            let st = &stages[inst.stage];
            let range = st.first..=st.last;
            let stored = layers.stored_bytes(st.first, st.last) as i128;
            let out_grad = layers.boundary[st.last] as i128;
            let (tmp, keep): (u64, i128) = match inst.pass {
                Some(Pass::F) => (range.clone().map(|l| layers.ftmp[l]).max().unwrap_or(0), stored),
                Some(Pass::I) => (range.clone().map(|l| layers.btmp[l]).max().unwrap_or(0), out_grad),
                _ => (range.clone().map(|l| layers.btmp[l]).max().unwrap_or(0), 0),
            };
            events.push((self.start[x], 1, d, tmp as i128 + keep, x));
            events.push((self.end[x], 0, d, -(tmp as i128), x));
            match inst.pass {
                Some(Pass::B) => events.push((self.end[x], 0, d, -stored, x)),
                Some(Pass::W) => events.push((self.end[x], 0, d, -stored - out_grad, x)),
                _ => {}
            }
        }
        events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.4.cmp(&b.4)));
        let mut level: Vec<i128> = base.iter().map(|&b| b as i128).collect();
        let mut peak = base.clone();
        for &(time, _, d, delta, x) in &events {
            level[d] += delta;
            let now = level[d].max(0) as u64;
            if now > peak[d] {
                peak[d] = now;
                if let Some(m) = self.config.memory {
                    if now > m {
                        let op = self.insts[x].op;
                        let text = format!("{} on device {d}", self.schedule.ops[op]);
                        return Err(SimError::BudgetExceeded { op, text, time, bytes: now, budget: m });
                    }
                }
            }
        }
        if let Some(m) = self.config.memory {
            if let Some(d) = (0..self.devices).find(|&d| base[d] > m) {
                return Err(SimError::BudgetExceeded {
                    op: 0,
                    text: format!("the static bytes and buffers of device {d}"),
                    time: 0.0,
                    bytes: base[d],
                    budget: m,
                });
            }
        }
        Ok(peak)
    }

    /// The period per micro-batch and the window of the run shown as spans: a flushed
    /// step whole; three steady-state periods of a periodic run.
    fn period(&self) -> (f64, (f64, f64)) {
        let makespan = self.makespan();
        let k = self.k;
        if !self.schedule.periodic {
            return (makespan / k as f64, (0.0, makespan));
        }
        // Completion time of each micro-batch: the end of its last pass.
        let mut done = vec![0.0f64; self.total as usize];
        for (x, inst) in self.insts.iter().enumerate() {
            if inst.pass.is_some() {
                let u = inst.micro as usize;
                done[u] = done[u].max(self.end[x]);
            }
        }
        // Steady state: between the first and last quarter of the micro-batches, unless
        // the run has become exactly periodic (`c` periods later, every pass starts the
        // same time later), which gives the period exactly.
        let (a, b) = ((self.total / 4) as usize, (3 * self.total / 4) as usize);
        let average = (done[b] - done[a]) / (b - a) as f64;
        let period = self.exact_period().unwrap_or(average);
        (period, (done[a], done[a] + 3.0 * period * k as f64))
    }

    /// The end of the last instance.
    fn makespan(&self) -> f64 {
        self.end.iter().copied().fold(0.0, f64::max)
    }

    /// The period per micro-batch of an unrolled periodic run, read exactly where it can
    /// be: some pass starts the same time later in each of the last eight full periods
    /// before the drain (the run's slowest resource sets that pace; a pass elsewhere may
    /// oscillate around it). `None` if no pass keeps an even pace.
    fn exact_period(&self) -> Option<f64> {
        let (schedule, insts, start) = (self.schedule, &self.insts, &self.start);
        let (lo, hi) = schedule.shift_span();
        let span = hi - lo;
        let ops = schedule.ops.len();
        // starts[j][op] for the periods every pass of which ran.
        let mut by_period: std::collections::BTreeMap<i64, Vec<f64>> = Default::default();
        for (x, inst) in insts.iter().enumerate() {
            if inst.pass.is_none() {
                continue;
            }
            by_period.entry(inst.period).or_insert_with(|| vec![f64::NAN; ops])[inst.op] = start[x];
        }
        let runs: Vec<usize> = (0..ops).filter(|&i| matches!(schedule.ops[i], Op::Run { .. })).collect();
        let full: Vec<&Vec<f64>> = by_period.values().filter(|v| runs.iter().all(|&i| !v[i].is_nan())).collect();
        const WINDOWS: usize = 8;
        let last = full.len().checked_sub(span as usize + 3)?;
        let first = last.checked_sub(WINDOWS)?;
        let scale = full[last].iter().copied().filter(|t| !t.is_nan()).fold(1.0f64, f64::max);
        runs.iter()
            .filter_map(|&i| {
                let d0 = full[first + 1][i] - full[first][i];
                (first + 1..last)
                    .all(|j| (full[j + 1][i] - full[j][i] - d0).abs() <= 1e-9 * scale)
                    .then_some(d0 / self.k as f64)
            })
            .reduce(f64::max)
    }

    /// The report: the period, each device's busy time and peak, the bubble, the busiest
    /// link and the spans of the window.
    fn report(&self, peak: Vec<u64>) -> PipeReport {
        let (period, window) = self.period();
        let mut busy = vec![0.0f64; self.devices];
        let mut links: std::collections::HashMap<(usize, usize), f64> = Default::default();
        for inst in &self.insts {
            match inst.lane {
                PipeLane::Device(d) => busy[d] += inst.dur,
                PipeLane::Link(a, b) => *links.entry((a, b)).or_default() += inst.dur,
            }
        }
        let per = self.total as f64;
        let busy_per_device: Vec<f64> = busy.iter().map(|b| b / per).collect();
        let sum: f64 = busy_per_device.iter().sum();
        let used = busy_per_device.iter().filter(|&&b| b > 0.0).count();
        let bubble = if sum > 0.0 { (used as f64 * period - sum) / sum } else { 0.0 };
        let spans = self
            .insts
            .iter()
            .enumerate()
            .filter(|&(x, _)| self.start[x] >= window.0 - 1e-12 && self.start[x] < window.1 - 1e-12)
            .map(|(x, inst)| PipeSpan {
                lane: inst.lane,
                stage: inst.stage,
                micro: inst.micro,
                pass: inst.pass,
                grad: inst.grad,
                start: self.start[x] - window.0,
                end: self.end[x] - window.0,
            })
            .collect();
        PipeReport {
            period,
            throughput: if period > 0.0 { 1.0 / period } else { f64::INFINITY },
            step_time: (!self.schedule.periodic).then_some(self.makespan()),
            peak_bytes_per_device: peak,
            busy_per_device,
            bubble,
            link_busy: links.values().copied().fold(0.0, f64::max) / per,
            devices_used: used,
            spans,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_too_long_to_unroll_is_refused_before_anything_is_unrolled() {
        // 4096 micro-batches a period and shifts of ±4096 periods, all within range: 32,776
        // periods of 8192 ops, 2.7·10^8 instances. This 555 KB file aborted `pebble
        // simulate` out of memory (found by the CLI's fuzz test, issue 47).
        let layers = Layers::from_costs(&[1.0, 1.0]);
        let k = 4096i64;
        let mut ops = Vec::new();
        for r in 0..k {
            ops.push(Op::Run { device: 0, stage: 0, micro: r, pass: Pass::F });
            ops.push(Op::Run { device: 0, stage: 0, micro: r, pass: Pass::B });
        }
        let stages = vec![PipeStage { first: 0, last: 1, device: 0 }];
        let mut s = Schedule::pipeline(1, k as usize, stages, ops).repeated();
        let config = PipeConfig::new(f64::INFINITY, None);
        s.ops[0] = Op::Run { device: 0, stage: 0, micro: k * 4096, pass: Pass::F };
        s.ops[3] = Op::Run { device: 0, stage: 0, micro: 1 - k * 4096, pass: Pass::B };
        let start = std::time::Instant::now();
        let e = simulate_pipeline(&layers, &s, &config).unwrap_err();
        assert!(start.elapsed().as_secs_f64() < 5.0, "refused only after {:?}", start.elapsed());
        assert!(matches!(e, SimError::InvalidOp { op: 3, .. }), "{e}");
        assert!(e.to_string().contains("the schedule unrolls to 32776 periods of 8192 ops"), "{e}");
        // Without the shifts it unrolls over 24 periods and runs.
        s.ops[0] = Op::Run { device: 0, stage: 0, micro: 0, pass: Pass::F };
        s.ops[3] = Op::Run { device: 0, stage: 0, micro: 1, pass: Pass::B };
        simulate_pipeline(&layers, &s, &config).expect("within the limit");
    }

    #[test]
    fn a_shift_beyond_the_range_is_refused_before_anything_is_unrolled() {
        // 10^9 periods of shift once unrolled 4·10^9 periods (and `hi - lo` could overflow).
        let layers = Layers::from_costs(&[1.0, 1.0]);
        let stages = vec![PipeStage { first: 0, last: 0, device: 0 }, PipeStage { first: 1, last: 1, device: 1 }];
        let run = |device, stage, micro, pass| Op::Run { device, stage, micro, pass };
        let ops = vec![run(0, 0, 0, Pass::F), run(1, 1, 0, Pass::F), run(1, 1, 0, Pass::B), run(0, 0, 0, Pass::B)];
        let mut s = Schedule::pipeline(2, 1, stages, ops).with_sends().repeated();
        simulate_pipeline(&layers, &s, &PipeConfig::new(f64::INFINITY, None)).expect("valid as planned");
        for micro in [1_000_000_000, i64::MIN] {
            s.ops[0] = run(0, 0, micro, Pass::F);
            let e = simulate_pipeline(&layers, &s, &PipeConfig::new(f64::INFINITY, None)).unwrap_err();
            assert!(matches!(e, SimError::InvalidOp { op: 0, .. }), "{e}");
            assert!(e.to_string().contains(&format!("micro-batch shift {micro} is out of range")), "{e}");
        }
    }
}
