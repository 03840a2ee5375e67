//! Exhaustive searches over allocations, the oracles of the pipeline solvers' tests.
//!
//! Each finds the best *load-only* period (Shilova §7: the load of the most loaded device
//! or link) over its class of allocations ([`contiguous`], [`madpipe_class`], [`general`]),
//! which is the best 1-periodic period whenever memory cannot bind the schedule: when
//! nothing is stored between forward and backward (every `stored` is 0: only the weights
//! count, and they do not depend on the schedule), or when memory is unlimited. Whatever
//! the memory, a schedule that fits runs each task once a period, so its period is never
//! below [`general`]'s (nor below its own allocation's [`load_period`]).
//!
//! The loads, links and memory are counted here on their own, not through the solvers'
//! [`super::onef1b::load_period`], so that the oracle checks that code rather than
//! repeating it.

use super::PipeProblem;

/// The load-only period of an allocation (`device[ℓ]` for each layer), or infinity if a
/// device's static bytes exceed the memory.
pub fn load_period(problem: &PipeProblem<'_>, device: &[usize]) -> f64 {
    let l = problem.layers;
    let n = l.len();
    let p = problem.devices;
    let mut load = vec![0.0; p];
    let mut bytes = vec![0u64; p];
    let versions = problem.weight_versions.unwrap_or(2);
    for i in 0..n {
        load[device[i]] += l.uf[i] + l.ub[i];
        bytes[device[i]] += l.static_bytes(i, i, versions) - if i == 0 { l.shared } else { 0 };
    }
    bytes[device[0]] += l.shared;
    let mut links = std::collections::HashMap::<(usize, usize), f64>::new();
    for j in 0..n.saturating_sub(1) {
        let (a, b) = (device[j], device[j + 1]);
        if a != b {
            *links.entry((a.min(b), a.max(b))).or_default() += problem.comm(j);
            bytes[a] += 2 * l.boundary[j];
            bytes[b] += 2 * l.boundary[j];
        }
    }
    if bytes.iter().any(|&b| !problem.fits(b)) {
        return f64::INFINITY;
    }
    load.into_iter().chain(links.into_values()).fold(0.0, f64::max)
}

/// The best load-only period over contiguous allocations (at most `P` stages, one per
/// device) and its stage bounds.
pub fn contiguous(problem: &PipeProblem<'_>) -> (f64, Vec<usize>) {
    let n = problem.layers.len();
    let mut best = (f64::INFINITY, Vec::new());
    // Each of the n−1 boundaries is cut or not.
    for mask in 0u64..(1u64 << (n - 1)) {
        if mask.count_ones() as usize + 1 > problem.devices {
            continue;
        }
        let mut device = vec![0; n];
        for i in 1..n {
            device[i] = device[i - 1] + ((mask >> (i - 1)) & 1) as usize;
        }
        let t = load_period(problem, &device);
        if t < best.0 {
            let bounds = (0..n).filter(|&i| i + 1 == n || device[i] != device[i + 1]).collect();
            best = (t, bounds);
        }
    }
    best
}

/// The best load-only period over every allocation of layers to devices, and the
/// allocation. Devices are numbered in order of first use, which visits each
/// allocation once up to renaming.
pub fn general(problem: &PipeProblem<'_>) -> (f64, Vec<usize>) {
    best_where(problem, |_| true)
}

/// The best load-only period over MadPipe's class of allocations (Shilova §7.1): `P − 1`
/// devices hold one interval of layers each, one device (the special one) any set; that
/// is, at most one device holds layers that are not contiguous.
pub fn madpipe_class(problem: &PipeProblem<'_>) -> (f64, Vec<usize>) {
    best_where(problem, |device| {
        // The runs of consecutive layers each device holds: more than one is a split.
        let mut runs = vec![0usize; problem.devices];
        for (i, &d) in device.iter().enumerate() {
            if i == 0 || device[i - 1] != d {
                runs[d] += 1;
            }
        }
        runs.iter().filter(|&&r| r > 1).count() <= 1
    })
}

/// The best load-only period over the allocations `keep` accepts, and the allocation.
fn best_where(problem: &PipeProblem<'_>, keep: impl Fn(&[usize]) -> bool) -> (f64, Vec<usize>) {
    struct Walk<'p, 'a, K> {
        problem: &'p PipeProblem<'a>,
        keep: K,
        device: Vec<usize>,
        best: (f64, Vec<usize>),
    }
    impl<K: Fn(&[usize]) -> bool> Walk<'_, '_, K> {
        fn walk(&mut self, i: usize, used: usize) {
            if i == self.device.len() {
                if (self.keep)(&self.device) {
                    let t = load_period(self.problem, &self.device);
                    if t < self.best.0 {
                        self.best = (t, self.device.clone());
                    }
                }
                return;
            }
            for d in 0..=used.min(self.problem.devices - 1) {
                self.device[i] = d;
                self.walk(i + 1, used.max(d + 1));
            }
        }
    }
    let n = problem.layers.len();
    let mut w = Walk { problem, keep, device: vec![0; n], best: (f64::INFINITY, Vec::new()) };
    w.walk(0, 0);
    w.best
}
