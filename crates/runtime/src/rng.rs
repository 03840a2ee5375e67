//! The executor's one random generator: splitmix64 (Steele, Lea & Flood), tiny, fast and
//! the same on every platform. It draws the parameters and the synthetic batch of a
//! [`Session`](crate::Session), the profiler's random operands, each op's seed in a step,
//! and the dropout masks, which the executor draws on the host from that seed so that a
//! recomputed forward replays its mask bit for bit.

/// splitmix64's increment (the golden ratio in 64 bits).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's output function: a bijective mix of 64 bits.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A splitmix64 stream; the state is the seed, advanced by [`GOLDEN`] at each draw.
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        mix(self.0)
    }

    /// Uniform in `[0, 1)`, 24 bits (an exact `f32`): parameters, data, operands.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `[0, 1)`, 53 bits (an exact `f64`): dropout draws.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[0, n)` (modulo `n`; `n = 0` counts as 1).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// The seed of op `op` in a step seeded `seed`: `mix(seed ^ op · GOLDEN)`.
pub fn op_seed(seed: u64, op: usize) -> u64 {
    mix(seed ^ (op as u64).wrapping_mul(GOLDEN))
}

/// The seed of the stream `tag` of an op whose seed is `seed`: the first draw of the
/// stream seeded `seed ^ tag`, so that two streams of one op never coincide.
pub fn derive_seed(seed: u64, tag: u64) -> u64 {
    SplitMix(seed ^ tag).next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_reference_values() {
        // First outputs of splitmix64 seeded with 1234567 (the reference implementation).
        let mut r = SplitMix(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
    }

    #[test]
    fn seeds_are_the_executors_of_before() {
        // Computed with the formulas the executor used before the generators were one
        // module: changing them would change every dropout mask and step seed.
        assert_eq!(op_seed(7 ^ 0x5EED, 0), 2644183460996977134);
        assert_eq!(op_seed(7 ^ 0x5EED, 3), 13866352091181170927);
        assert_eq!(op_seed(0, 1), 16294208416658607535);
        assert_eq!(derive_seed(42, 0x6472_6f70_6f75_7401), 10765412604844237169);
    }

    #[test]
    fn draws_are_in_range() {
        let mut r = SplitMix(9);
        for _ in 0..1000 {
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
            let f = r.uniform();
            assert!((0.0..1.0).contains(&f));
            assert!(r.below(7) < 7);
            assert_eq!(r.below(0), 0);
        }
    }
}
