//! A compute sequence's tensor instances, reads and memory, as the simulator sees them.

use pebble_graph::Chain;
use pebble_schedule::{ForwardMode, Op, Tensor};

/// One tensor instance of a compute sequence: a tensor from its production to its release.
#[derive(Debug, Clone)]
pub(super) struct Inst {
    pub(super) tensor: Tensor,
    pub(super) size: u64,
    /// The gap its offload is issued in: right after its producer (`a_0`: 0).
    pub(super) off_gap: usize,
    /// The compute ops that read it, in order.
    pub(super) readers: Vec<usize>,
}

impl Inst {
    /// The last compute op that reads it (0 if none).
    pub(super) fn last_reader(&self) -> usize {
        self.readers.last().copied().unwrap_or(0)
    }
}

/// A compute sequence's instances, reads and memory, as the simulator sees them.
pub(super) struct Layout {
    pub(super) insts: Vec<Inst>,
    /// The instances op `k` reads.
    pub(super) reads: Vec<Vec<usize>>,
    /// The instance op `k` produces.
    pub(super) output: Vec<Option<usize>>,
    /// Everything on the device when op `k` allocates, nothing offloaded.
    pub(super) full: Vec<u64>,
    /// The instance whose offload may be issued in gap `g` (`g = 0..=n`).
    pub(super) gap_offload: Vec<Option<usize>>,
}

impl Layout {
    /// `Err` says why `ops` is not a compute sequence of the space (see the module docs).
    pub(super) fn new(chain: &Chain, ops: &[Op]) -> Result<Layout, String> {
        let l = chain.len();
        let mut insts = vec![Inst { tensor: Tensor::Activation(0), size: chain.x[0], off_gap: 0, readers: vec![] }];
        let mut act: Vec<Option<usize>> = vec![None; l + 1];
        let mut sav: Vec<Option<usize>> = vec![None; l + 1];
        act[0] = Some(0);
        let mut grad: Option<usize> = None;
        let mut f = l + 1;
        let mut reads = Vec::new();
        let mut output = Vec::new();
        let mut full = Vec::new();
        let mut gap_offload = vec![Some(0)];
        let alive = |act: &[Option<usize>], sav: &[Option<usize>], insts: &[Inst]| -> u64 {
            act.iter().chain(sav.iter()).flatten().map(|&j| insts[j].size).sum()
        };
        let input = |i: usize, act: &[Option<usize>], sav: &[Option<usize>]| -> Result<(usize, bool), String> {
            match (act[i], sav[i]) {
                (Some(j), _) => Ok((j, true)),
                (None, Some(j)) => Ok((j, false)),
                _ => Err(format!("a_{i} is not available")),
            }
        };
        for (k, op) in ops.iter().enumerate() {
            let held = alive(&act, &sav, &insts) + grad.map_or(0, |i| chain.x[i]) + chain.static_bytes;
            let (r, out, tmp): (Vec<usize>, Option<(Tensor, u64)>, u64);
            let mut released: Vec<usize> = Vec::new();
            match *op {
                Op::Forward { stage: i, mode } => {
                    if i >= l.min(f) {
                        return Err(format!("op {k} ({op}): forward of a stage whose backward is done or the loss"));
                    }
                    let (j, from_act) = input(i, &act, &sav).map_err(|e| format!("op {k} ({op}): {e}"))?;
                    let (tensor, size) = if mode == ForwardMode::KeepAll {
                        (Tensor::Saved(i + 1), chain.xbar[i + 1])
                    } else {
                        (Tensor::Activation(i + 1), chain.x[i + 1])
                    };
                    let slot = if mode == ForwardMode::KeepAll { &sav[i + 1] } else { &act[i + 1] };
                    if slot.is_some() {
                        return Err(format!("op {k} ({op}) produces {tensor:?}, which is held"));
                    }
                    if mode == ForwardMode::Discard && from_act {
                        released.push(j);
                    }
                    (r, out, tmp) = (vec![j], Some((tensor, size)), chain.ftmp[i]);
                }
                Op::Backward { stage } if stage == l && f == l + 1 => {
                    let (j, _) = input(l, &act, &sav).map_err(|e| format!("op {k} ({op}): {e}"))?;
                    released.extend(act[l]);
                    (r, out, tmp) = (vec![j], None, chain.btmp[l]);
                }
                Op::Backward { stage } if f <= l && stage + 1 == f => {
                    let i = stage;
                    let s = sav[i + 1].ok_or_else(|| format!("op {k} ({op}): ā_{} is not available", i + 1))?;
                    let (j, _) = input(i, &act, &sav).map_err(|e| format!("op {k} ({op}): {e}"))?;
                    released.extend([sav[i + 1], act[i + 1], act[i]].into_iter().flatten());
                    (r, out, tmp) = (vec![s, j], None, chain.btmp[i]);
                }
                _ => return Err(format!("op {k} ({op}) is not a move of the space")),
            }
            for &j in &r {
                insts[j].readers.push(k);
            }
            let mut allocs = tmp;
            let produced = out.map(|(tensor, size)| {
                insts.push(Inst { tensor, size, off_gap: k + 1, readers: vec![] });
                allocs += size;
                insts.len() - 1
            });
            if let Op::Backward { stage } = *op {
                allocs += chain.x[stage];
            }
            full.push(held + allocs);
            reads.push(r);
            output.push(produced);
            gap_offload.push(produced);
            for j in released {
                if insts[j].readers.is_empty() {
                    return Err(format!("op {k} ({op}) releases {:?}, which nothing read", insts[j].tensor));
                }
                for slot in act.iter_mut().chain(sav.iter_mut()) {
                    if *slot == Some(j) {
                        *slot = None;
                    }
                }
            }
            if let Some(j) = produced {
                match insts[j].tensor {
                    Tensor::Saved(i) => sav[i] = Some(j),
                    Tensor::Activation(i) => act[i] = Some(j),
                    _ => unreachable!(),
                }
            }
            if let Op::Backward { stage } = *op {
                grad = Some(stage);
                f = stage;
            }
        }
        if f != 0 {
            return Err("δ_0 is never computed".into());
        }
        if let Some(j) = act.iter().chain(sav.iter()).flatten().next() {
            return Err(format!("{:?} is still held at the end", insts[*j].tensor));
        }
        Ok(Layout { insts, reads, output, full, gap_offload })
    }
}
