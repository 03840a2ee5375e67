//! Random and hand-made chains.

use pebble_graph::Chain;

use crate::Rng;

/// How a random chain's stage times are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Times {
    /// Integers in `lo..=hi` seconds: sums of times are exact.
    Integers(u64, u64),
    /// `k / 7919` for `k` in `0..=1_000_000`: fractional, so that ties are rare.
    Fractions,
    /// `0` one time in five, else a multiple of `0.25` in `0.25..=5`: exact in binary,
    /// with zero-duration ops.
    Quarters,
}

impl Times {
    fn draw(self, rng: &mut Rng) -> f64 {
        match self {
            Times::Integers(lo, hi) => rng.range(lo, hi) as f64,
            Times::Fractions => rng.range(0, 1_000_000) as f64 / 7919.0,
            Times::Quarters => {
                if rng.one_in(5) {
                    0.0
                } else {
                    rng.range(1, 20) as f64 * 0.25
                }
            }
        }
    }
}

/// The ranges a random chain's figures are drawn from (every range inclusive).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChainSpec {
    /// The chain's name is `{name}-{L}`.
    pub name: &'static str,
    /// Activation sizes `x[i]`.
    pub x: (u64, u64),
    /// If nonzero, one `x[i]` in this many is 0 instead.
    pub zero_x_one_in: u64,
    /// `xbar[i] − x[i]` for `i ≥ 1` (`xbar[0] = x[0]`).
    pub xbar_extra: (u64, u64),
    /// Forward and backward times.
    pub times: Times,
    /// Temporary memory `ftmp`, `btmp`.
    pub tmp: (u64, u64),
    /// Static bytes.
    pub static_bytes: (u64, u64),
}

impl ChainSpec {
    /// Sizes `x` in `1..=20`, `xbar` up to 15 above, temporaries up to 6, static memory
    /// up to 50, integer times in `1..=9`: the DP and baseline tests' chains.
    pub const MEDIUM: ChainSpec = ChainSpec {
        name: "random",
        x: (1, 20),
        zero_x_one_in: 0,
        xbar_extra: (0, 15),
        times: Times::Integers(1, 9),
        tmp: (0, 6),
        static_bytes: (0, 50),
    };

    /// Small sizes for exhaustive search: `x` in `0..=10` (one in ten is 0), `xbar` up
    /// to 5 above, temporaries up to 3, static memory up to 5, integer times in `0..=9`.
    pub const SMALL: ChainSpec = ChainSpec {
        name: "small",
        x: (1, 10),
        zero_x_one_in: 10,
        xbar_extra: (0, 5),
        times: Times::Integers(0, 9),
        tmp: (0, 3),
        static_bytes: (0, 5),
    };

    /// Zero sizes and zero times allowed: `x` in `0..=9`, `xbar` up to 9 above,
    /// temporaries up to 5, static memory up to 49, [`Times::Quarters`]. The simulator's
    /// edge cases (zero-duration ops, empty tensors).
    pub const SPARSE: ChainSpec = ChainSpec {
        name: "sparse",
        x: (0, 9),
        zero_x_one_in: 0,
        xbar_extra: (0, 9),
        times: Times::Quarters,
        tmp: (0, 5),
        static_bytes: (0, 49),
    };

    /// The same ranges with other times.
    pub const fn with_times(self, times: Times) -> ChainSpec {
        ChainSpec { times, ..self }
    }

    /// A random valid chain of `l ≥ 1` stages.
    pub fn chain(&self, rng: &mut Rng, l: usize) -> Chain {
        let size = |rng: &mut Rng| {
            if self.zero_x_one_in > 0 && rng.one_in(self.zero_x_one_in) {
                0
            } else {
                rng.range(self.x.0, self.x.1)
            }
        };
        let x: Vec<u64> = (0..=l).map(|_| size(rng)).collect();
        let xbar = (0..=l).map(|i| if i == 0 { x[0] } else { x[i] + rng.range(self.xbar_extra.0, self.xbar_extra.1) });
        let xbar = xbar.collect();
        let chain = Chain {
            utmp: None,
            name: Some(format!("{}-{l}", self.name)),
            ftime: (0..l).map(|_| self.times.draw(rng)).collect(),
            btime: (0..=l).map(|_| self.times.draw(rng)).collect(),
            x,
            xbar,
            ftmp: (0..l).map(|_| rng.range(self.tmp.0, self.tmp.1)).collect(),
            btmp: (0..=l).map(|_| rng.range(self.tmp.0, self.tmp.1)).collect(),
            w: None,
            g: None,
            o: None,
            static_bytes: rng.range(self.static_bytes.0, self.static_bytes.1),
        };
        chain.validate().expect("random chains are valid");
        chain
    }
}

/// A random valid chain of `l` stages drawn from [`ChainSpec::MEDIUM`] (small integer sizes
/// and times, so that sums of times are exact).
pub fn random_chain(rng: &mut Rng, l: usize) -> Chain {
    ChainSpec::MEDIUM.chain(rng, l)
}

/// A random chain ([`ChainSpec::MEDIUM`]) whose weights `w` (20 to 80 per stage) dominate
/// its activations and make all of its static memory: weight offloading's test instances.
pub fn weighty_chain(rng: &mut Rng, l: usize) -> Chain {
    let mut c = random_chain(rng, l);
    let w: Vec<u64> = (0..l).map(|_| rng.range(20, 80)).collect();
    c.static_bytes = w.iter().sum();
    c.w = Some(w);
    c
}

/// `n` random chains ([`ChainSpec::MEDIUM`]) of 1 to `max_l` stages, the same on every run.
pub fn random_chains(seed: u64, n: usize, max_l: usize) -> Vec<Chain> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| {
            let l = rng.range(1, max_l as u64) as usize;
            random_chain(&mut rng, l)
        })
        .collect()
}

/// A random chain from [`ChainSpec::SMALL`], with integer times or [`Times::Fractions`].
pub fn small_chain(rng: &mut Rng, l: usize, integer_times: bool) -> Chain {
    let spec = if integer_times { ChainSpec::SMALL } else { ChainSpec::SMALL.with_times(Times::Fractions) };
    spec.chain(rng, l)
}

/// A hand-made 3-stage chain with distinct times and sizes, temporary memory and static
/// bytes: the fixture whose figures the baseline and discretization tests work out by hand.
pub fn hand_chain() -> Chain {
    Chain {
        utmp: None,
        name: Some("hand".into()),
        ftime: vec![1.0, 2.0, 4.0],
        btime: vec![10.0, 20.0, 30.0, 40.0],
        x: vec![4, 3, 5, 2],
        xbar: vec![4, 6, 9, 7],
        ftmp: vec![2, 1, 3],
        btmp: vec![3, 2, 4, 7],
        w: None,
        g: None,
        o: None,
        static_bytes: 10,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_are_valid_and_within_their_ranges() {
        let mut rng = Rng::new(3);
        for spec in
            [ChainSpec::MEDIUM, ChainSpec::SMALL, ChainSpec::SPARSE, ChainSpec::SMALL.with_times(Times::Fractions)]
        {
            for l in 1..8 {
                let c = spec.chain(&mut rng, l);
                assert_eq!(c.len(), l);
                assert!(c.x.iter().all(|&x| x <= spec.x.1));
                assert!(c.ftmp.iter().chain(&c.btmp).all(|&t| (spec.tmp.0..=spec.tmp.1).contains(&t)));
                assert_eq!(c.name.as_deref(), Some(format!("{}-{l}", spec.name).as_str()));
            }
        }
        hand_chain().validate().unwrap();
        assert_eq!(random_chains(5, 4, 3), random_chains(5, 4, 3));
    }
}
