//! The compute sequences: the states of [`crate::oracle::brute`]'s graph with what is still
//! unread, and the moves between them (the enumeration's edges).

use pebble_graph::Chain;
use pebble_machine::Machine;
use pebble_schedule::{ForwardMode, Op};

use super::Search;

/// A partial compute sequence: the state after its last op (bit `i` of `act` is
/// `Activation(i)`, of `sav` `Saved(i)`; the `unread` bits, outputs no op has read yet),
/// its compute time `g`, and the two running maxima of the transfer bound
/// (`m1 = max_k (A_k − P_k)`, `m2 = max_k (A_k + B_k)` with `A_k = max(P_k, Q̂_k/β↓)`,
/// `B_k = Q̂_k/β↑`; see the module docs).
#[derive(Clone, Copy)]
pub(super) struct Node {
    pub(super) parent: u32,
    pub(super) op: Op,
    pub(super) act: u32,
    pub(super) sav: u32,
    pub(super) unread_act: u32,
    pub(super) unread_sav: u32,
    pub(super) f: usize,
    pub(super) g: f64,
    pub(super) m1: f64,
    pub(super) m2: f64,
}

/// The compute ops from the root to node `id` of the arena.
pub(super) fn sequence(arena: &[Node], mut id: u32) -> Vec<Op> {
    let mut ops = Vec::new();
    while arena[id as usize].parent != u32::MAX {
        ops.push(arena[id as usize].op);
        id = arena[id as usize].parent;
    }
    ops.reverse();
    ops
}

/// The chain, the budget and the links.
pub(super) struct Ctx<'a> {
    pub(super) chain: &'a Chain,
    pub(super) l: usize,
    pub(super) budget: u64,
    pub(super) machine: Machine,
    /// Whether both links can move data at all.
    pub(super) links: bool,
    pub(super) recompute: bool,
}

impl<'a> Ctx<'a> {
    /// The context of a search of `chain` within `budget` on `machine`.
    pub(super) fn new(chain: &'a Chain, budget: u64, machine: &Machine, how: Search) -> Ctx<'a> {
        let ok = |b: f64, lat: f64| b > 0.0 && b.is_finite() && lat >= 0.0 && lat.is_finite();
        let links = ok(machine.d2h.bandwidth, machine.d2h.latency) && ok(machine.h2d.bandwidth, machine.h2d.latency);
        Ctx { chain, l: chain.len(), budget, machine: *machine, links, recompute: how.recompute }
    }

    /// The time an offload of `bytes` takes on the d2h link.
    pub(super) fn off_time(&self, bytes: u64) -> f64 {
        self.machine.d2h.transfer_time(bytes as f64)
    }

    /// The time a prefetch of `bytes` takes on the h2d link.
    pub(super) fn pre_time(&self, bytes: u64) -> f64 {
        self.machine.h2d.transfer_time(bytes as f64)
    }

    /// Everything resident in state `n` beside static memory: its activations and saved
    /// sets, and `δ_f`.
    fn resident(&self, n: &Node) -> u64 {
        let c = self.chain;
        let mut total = 0;
        for i in 0..=self.l {
            if n.act >> i & 1 == 1 {
                total += c.x[i];
            }
            if i >= 1 && n.sav >> i & 1 == 1 {
                total += c.xbar[i];
            }
        }
        if n.f <= self.l {
            total += c.x[n.f];
        }
        total
    }

    /// The compute time still needed: every backward to come, and `F_i^all` for each
    /// `B_i` to come whose `ā_{i+1}` is not held.
    fn heuristic(&self, n: &Node) -> f64 {
        let c = self.chain;
        let back: f64 = c.btime[..n.f.min(self.l + 1)].iter().sum();
        let fwd: f64 = (0..n.f.min(self.l)).filter(|&i| n.sav >> (i + 1) & 1 == 0).map(|i| c.ftime[i]).sum();
        back + fwd
    }

    /// A lower bound on the makespan of every schedule whose compute sequence starts
    /// with `n`'s: with `cuts`, the compute time to come and the transfer bound of the
    /// ops so far; without, the compute time alone.
    pub(super) fn priority(&self, n: &Node, cuts: bool) -> f64 {
        let compute = n.g + self.heuristic(n);
        if cuts {
            (compute + n.m1.max(0.0)).max(n.m2)
        } else {
            compute
        }
    }

    /// The moves from `n`: each op with the state after it (its `parent` unset) and the
    /// bytes `Q̂` its excess needs moved.
    pub(super) fn moves(&self, n: &Node, out: &mut Vec<(Op, Node, u64)>) {
        let c = self.chain;
        let l = self.l;
        let f = n.f;
        let held = self.resident(n) + c.static_bytes;
        let grad = if f <= l { c.x[f] } else { 0 };
        // The input `a_i`: read from `Activation(i)` (true) or `Saved(i)` (false).
        let input = |i: usize| -> Option<bool> {
            if n.act >> i & 1 == 1 {
                Some(true)
            } else if i >= 1 && n.sav >> i & 1 == 1 {
                Some(false)
            } else {
                None
            }
        };
        // Marks `a_i` read.
        let read = |s: &mut Node, i: usize, from_act: bool| {
            if from_act {
                s.unread_act &= !(1 << i);
            } else {
                s.unread_sav &= !(1 << i);
            }
        };
        let size_of = |act: u32, sav: u32| -> Vec<u64> {
            let mut v = Vec::new();
            for i in 0..=l {
                if act >> i & 1 == 1 {
                    v.push(c.x[i]);
                }
                if i >= 1 && sav >> i & 1 == 1 {
                    v.push(c.xbar[i]);
                }
            }
            v
        };
        // `reads`: the tensors the op reads (bits of `act`, `sav`).
        let mut push = |op: Op, mut s: Node, dt: f64, reads: (u32, u32), allocs: u64, tmp: u64| {
            // What never leaves the device during the op, then what must have left: whole
            // tensors held and not read, at least `q` bytes.
            let pinned: u64 = size_of(reads.0, reads.1).iter().sum();
            if c.static_bytes + grad + pinned + allocs + tmp > self.budget {
                return;
            }
            let full = held + allocs + tmp;
            let q = least_cover(&size_of(n.act & !reads.0, n.sav & !reads.1), full.saturating_sub(self.budget));
            let (a, b) = if q == 0 {
                (n.g, 0.0)
            } else if !self.links {
                return;
            } else {
                (n.g.max(self.off_time(q)), self.pre_time(q))
            };
            s.m1 = n.m1.max(a - n.g);
            s.m2 = n.m2.max(a + b);
            s.g = n.g + dt;
            out.push((op, s, q));
        };
        let mask = |i: usize, from_act: bool| if from_act { (1u32 << i, 0) } else { (0, 1u32 << i) };
        for i in 0..l.min(f) {
            let Some(from_act) = input(i) else { continue };
            let r = mask(i, from_act);
            let mut base = *n;
            read(&mut base, i, from_act);
            if self.recompute && n.act >> (i + 1) & 1 == 0 {
                let mut s = base;
                s.act |= 1 << (i + 1);
                s.unread_act |= 1 << (i + 1);
                push(Op::Forward { stage: i, mode: ForwardMode::Checkpoint }, s, c.ftime[i], r, c.x[i + 1], c.ftmp[i]);
                if from_act {
                    s.act &= !(1 << i);
                }
                push(Op::Forward { stage: i, mode: ForwardMode::Discard }, s, c.ftime[i], r, c.x[i + 1], c.ftmp[i]);
            }
            if n.sav >> (i + 1) & 1 == 0 {
                let mut s = base;
                s.sav |= 1 << (i + 1);
                s.unread_sav |= 1 << (i + 1);
                push(Op::Forward { stage: i, mode: ForwardMode::KeepAll }, s, c.ftime[i], r, c.xbar[i + 1], c.ftmp[i]);
            }
        }
        if f == l + 1 {
            if let Some(from_act) = input(l) {
                let mut s = *n;
                read(&mut s, l, from_act);
                s.act &= !(1 << l);
                s.f = l;
                push(Op::Backward { stage: l }, s, c.btime[l], mask(l, from_act), c.x[l], c.btmp[l]);
            }
        } else if f >= 1 {
            let i = f - 1;
            if let (Some(from_act), true) = (input(i), n.sav >> (i + 1) & 1 == 1) {
                // An `Activation(i+1)` released unread was a dead output.
                if n.unread_act >> (i + 1) & 1 == 0 {
                    let mut s = *n;
                    read(&mut s, i, from_act);
                    s.unread_sav &= !(1 << (i + 1));
                    let gone = !((1u32 << (i + 1)) | (1 << i));
                    s.act &= gone;
                    s.sav &= !(1 << (i + 1));
                    s.unread_act &= gone;
                    s.f = i;
                    // δ_f is counted in `grad`; B_i reads ā_{i+1} and a_i.
                    let (ra, rs) = mask(i, from_act);
                    push(Op::Backward { stage: i }, s, c.btime[i], (ra, rs | 1 << (i + 1)), c.x[i], c.btmp[i]);
                }
            }
        }
        // Nothing may be released unread; at the end nothing is left.
        out.retain(|(_, s, _)| s.f > 0 || (s.act | s.sav) == 0);
    }
}

/// The least sum of some of `sizes` that reaches `q` (`q` itself if none does or `q` is 0):
/// what must move when `q` bytes must leave the device, tensors moving whole.
fn least_cover(sizes: &[u64], q: u64) -> u64 {
    if q == 0 {
        return 0;
    }
    let total: u64 = sizes.iter().sum();
    if total < q {
        return q;
    }
    // Subset sums up to `total`, as a bit set.
    let mut sums = vec![false; total as usize + 1];
    sums[0] = true;
    for &s in sizes {
        for v in (s as usize..=total as usize).rev() {
            if sums[v - s as usize] {
                sums[v] = true;
            }
        }
    }
    (q..=total).find(|&v| sums[v as usize]).unwrap_or(q)
}
