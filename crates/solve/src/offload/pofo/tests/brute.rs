//! pofo's model solved by brute force: every decision tree of Theorem 12's recursion
//! (each forward `F^all` or `F^ck` up to each kept `a_j`, its input kept or offloaded;
//! each reversal `F^all` first or `F^ck` up to each `a_j`), each timed on its own, the
//! least taken. Written from the module docs' equations (Shilova §4.2.3–4.2.4, digest
//! `seed001-part1-2.md` §5.3–5.6), on the chain's own byte sizes: nothing of the DP's
//! code (its `Sized`, memo tables, pruning bounds, schedule emission) is used, and no
//! value is memoized, so a tree is timed with its own subtrees' values.

use pebble_graph::Chain;

/// The chain in bytes, 0-based as the DP's docs: `x`, `xbar` to `L + 1` (0 past the
/// loss, `ā_0 = a_0`), `ftmp` and `ftime` to `L` (0 for the loss, whose time is its
/// backward's).
pub struct Model {
    l: usize,
    x: Vec<f64>,
    xbar: Vec<f64>,
    ftmp: Vec<f64>,
    btmp: Vec<f64>,
    uf: Vec<f64>,
    ub: Vec<f64>,
    memory: f64,
    /// `β↓`, `β↑`.
    off: f64,
    pre: f64,
}

/// `⌈v⌉⁺`: a quantity left to move, to the nearest byte, never negative.
fn left(v: f64) -> f64 {
    if v <= 0.5 {
        0.0
    } else {
        v.round()
    }
}

/// `e⁺ / β`.
fn delay(e: f64, beta: f64) -> f64 {
    e.max(0.0) / beta
}

impl Model {
    pub fn new(chain: &Chain, budget: u64, off: f64, pre: f64) -> Model {
        let l = chain.len();
        let f = |v: &[u64]| v.iter().map(|&b| b as f64).collect::<Vec<f64>>();
        let (mut x, mut xbar, mut ftmp, mut uf) = (f(&chain.x), f(&chain.xbar), f(&chain.ftmp), chain.ftime.clone());
        x.push(0.0);
        xbar[0] = x[0];
        xbar.push(0.0);
        ftmp.push(0.0);
        uf.push(0.0);
        let memory = (budget - chain.static_bytes) as f64;
        Model { l, x, xbar, ftmp, btmp: f(&chain.btmp), uf, ub: chain.btime.clone(), memory, off, pre }
    }

    /// `𝓜_{F_s^all}` with `δ_{t+1}` (`grad`) resident.
    fn f_all(&self, s: usize, grad: f64) -> f64 {
        grad + self.xbar[s + 1] + self.ftmp[s]
    }

    /// `𝓜_{F_s^ck}` (`h = s`) or `𝓜_{F_h^∅}` (`h > s`), `δ_{t+1}` (`grad`) resident.
    fn f_none(&self, s: usize, h: usize, grad: f64) -> f64 {
        let input = if h == s { 0.0 } else { self.x[h] };
        grad + input + self.x[h + 1] + self.ftmp[h]
    }

    /// `𝓜_{B_s}`.
    fn b(&self, s: usize) -> f64 {
        self.xbar[s + 1] + self.x[s + 1] + self.x[s] + self.btmp[s]
    }

    /// The time of every decision tree reversing `s..=t` with `m` bytes free beside the
    /// input while `delta` bytes of prefetch end with it (`C_Δ(s, t, m, Δ)`).
    pub fn back(&self, s: usize, t: usize, m: f64, delta: f64) -> Vec<f64> {
        let (bp, grad) = (self.pre, self.x[t + 1]);
        let free = m - delta;
        let (all, b) = (self.f_all(s, grad), self.b(s));
        let mut out = Vec::new();
        let fits_all = all <= m && b <= m;
        if s == t {
            if fits_all {
                let e = (all - self.ub[s] * bp - free).max(b - free);
                out.push(self.uf[s] + self.ub[s] + delay(e, bp));
            }
            return out;
        }
        if fits_all {
            // F_s^all, the rest reversed in what ā_{s+1} leaves, then B_s.
            let e_b = (b - free).max(0.0);
            let d1 = left(delta - self.ub[s] * bp - e_b);
            for inner in self.back(s + 1, t, m - self.xbar[s + 1], d1) {
                let d2 = (d1 - inner * bp).max(0.0);
                let e_f = (all - (m - d2)).max(0.0);
                out.push(self.uf[s] + inner + self.ub[s] + delay(e_f + e_b, bp));
            }
        }
        if (s..=t).all(|h| self.f_none(s, h, grad) <= m) {
            // F_s^ck and F^∅ up to a_j, s..t reversed as j..=t then s..j-1.
            for j in s + 1..=t {
                let forwards: f64 = (s..j).map(|k| self.uf[k]).sum();
                // max_k (𝓜_{F_k} − β↑ Σ_{h=k+1}^{j−1} u_{F_h}).
                let worst = (s..j)
                    .map(|k| self.f_none(s, k, grad) - bp * (k + 1..j).map(|h| self.uf[h]).sum::<f64>())
                    .fold(f64::NEG_INFINITY, f64::max);
                for last in self.back(s, j - 1, m, delta) {
                    let d2 = left(delta - last * bp);
                    for first in self.back(j, t, m - self.x[j], d2) {
                        let d3 = (d2 - first * bp).max(0.0);
                        out.push(forwards + first + last + delay(worst - (m - d3), bp));
                    }
                }
            }
        }
        out
    }

    /// Table 4.1: the state after a step whose links move `moved_off` and `moved_pre`,
    /// the input offloaded or kept.
    fn next(state: (f64, f64, f64), input: f64, moved: (f64, f64), offload: bool) -> (f64, f64, f64) {
        let (a, df, db) = state;
        if offload {
            (a, left(df + input - moved.0), left(db - moved.1) + input)
        } else {
            (a + input, left(df - moved.0), left(db - moved.1))
        }
    }

    /// The time of every decision tree from `F_s` to the end of `B_s`, the input `ā_s`
    /// (`bar`) or `a_s` stored, `a` bytes kept before it, `df` still to offload and `db`
    /// to prefetch (`OC_x(s, A, Δ_F, Δ_B)`).
    pub fn fwd(&self, s: usize, bar: bool, state: (f64, f64, f64)) -> Vec<f64> {
        let (a, df, db) = state;
        let (bo, bp, mm) = (self.off, self.pre, self.memory);
        let input = if bar { self.xbar[s] } else { self.x[s] };
        let (m_f, m_b) = (a + df + input, a + db + input);
        let room = mm - a;
        let mut out = Vec::new();
        if s == self.l {
            // The loss: its backward, then the links finish (OR.3).
            let b = self.b(s);
            if b + input <= room {
                let e_f = (m_f - mm).max(0.0);
                let e_b = (b - (mm - m_b)).max(0.0);
                let rest_f = (df - e_f).max(0.0);
                let rest_b = (db - self.ub[s] * bp - e_b).max(0.0);
                out.push(self.ub[s] + delay(e_f, bo) + delay(e_b, bp) + delay(rest_f, bo) + delay(rest_b, bp));
            }
            return out;
        }
        let choices = |fits_keep: bool, fits_off: bool| {
            [(false, fits_keep), (true, fits_off && input > 0.0)].into_iter().filter(|c| c.1).map(|c| c.0)
        };
        // F_s^all first.
        let (all, b) = (self.f_all(s, 0.0), self.b(s));
        if all + input <= room && b + input <= room {
            let e_f = (all - (mm - m_f)).max(0.0);
            let e_b = (b - (mm - m_b)).max(0.0);
            let moved = (self.uf[s] * bo + e_f, self.ub[s] * bp + e_b);
            let here = self.uf[s] + self.ub[s] + delay(e_f, bo) + delay(e_b, bp);
            for offload in choices(true, true) {
                let after = Self::next(state, input, moved, offload);
                out.extend(self.fwd(s + 1, true, after).into_iter().map(|v| here + v));
            }
        }
        // F_s^ck first, F^∅ up to a_j kept.
        for j in s + 1..=self.l {
            let need = |k: usize| self.f_none(s, k, 0.0);
            let fits_keep = (s..j).all(|k| need(k) + input <= room);
            let fits_off = need(s) + input <= room && (s + 1..j).all(|k| need(k) <= room);
            if !fits_keep && !fits_off {
                continue;
            }
            let forwards: f64 = (s..j).map(|k| self.uf[k]).sum();
            // max_k (𝓜_{F_k} − β↓ Σ_{h=s}^{k−1} u_{F_h}).
            let worst = (s..j)
                .map(|k| need(k) - bo * (s..k).map(|h| self.uf[h]).sum::<f64>())
                .fold(f64::NEG_INFINITY, f64::max);
            let e_f = (worst - (mm - m_f)).max(0.0);
            for seg in self.back(s, j - 1, room - input, db) {
                let moved = (forwards * bo + e_f, seg * bp);
                let here = forwards + delay(e_f, bo) + seg;
                for offload in choices(fits_keep, fits_off) {
                    let after = Self::next(state, input, moved, offload);
                    out.extend(self.fwd(j, false, after).into_iter().map(|v| here + v));
                }
            }
        }
        out
    }

    /// The least time over every decision tree (`OC_0(0, 0, 0, 0)`) and how many trees
    /// fit; `None` if none does.
    pub fn optimum(&self) -> Option<(f64, usize)> {
        let all = self.fwd(0, false, (0.0, 0.0, 0.0));
        let best = all.iter().copied().fold(f64::INFINITY, f64::min);
        (best < f64::INFINITY).then_some((best, all.len()))
    }
}
