//! Single-crossing cuts: where a network can be cut into sequential blocks.
//!
//! The nodes of a DAG are numbered `0..nodes` in topological order, and each value (a
//! tensor, a data node) is made by one node, or before node 0 (a graph input), and read
//! by later nodes. Cutting after node `i` splits the nodes into `0..=i` and `i+1..`; the
//! values *crossing* the cut are those made at or before `i` and read after it. A cut is
//! *single-crossing* when exactly one value crosses and node `i` itself made it: the
//! block after it then reads nothing from the blocks before but that one value (the
//! 1-separators of rk-GB, Zhao §2.3; the stage boundaries of an imported network).
//!
//! Both the Rockmate block builder (`pebble_ilp::subgraph::sequential_blocks`, on a
//! training graph's forward nodes) and the ONNX importer (stages of an imported
//! network) cut with [`single_crossing_cuts`].
//!
//! ```
//! use pebble_graph::cut::single_crossing_cuts;
//! // a → b → c, with a read by c too (a skip connection over b), c read by a sink:
//! // after a, a's output alone crosses; after b, a's and b's; after c, c's.
//! let made_by = [Some(0), Some(1), Some(2)];
//! let reads = [(0, 1), (0, 2), (1, 2), (2, 3)];
//! assert_eq!(single_crossing_cuts(3, &made_by, reads), vec![0, 2]);
//! ```

/// The nodes after which exactly one value crosses, made by that node; ascending.
///
/// `nodes` nodes are numbered in topological order. `made_by[v]` is the node that makes
/// value `v`, or `None` when `v` exists before node 0 (an input). Each `(v, r)` in
/// `reads` says node `r` reads value `v`; `r == nodes` stands for a reader after every
/// node (a loss, a graph output), so a value read there crosses every cut after its
/// maker. Reads at or before a value's maker are ignored, and so are values nobody
/// reads: leave out of `reads` what should not count (parameters, say).
///
/// A value crosses the cut after node `i` when it is made at or before `i` (inputs
/// always are) and its last reader comes after `i`. The result holds every `i` in
/// `0..nodes` where exactly one value crosses and node `i` made it; the last node is
/// included when it makes the only value the final reader reads (a caller that wants
/// no empty block after it leaves it out).
///
/// # Panics
///
/// If a read names a value outside `made_by` or a reader above `nodes`.
pub fn single_crossing_cuts(
    nodes: usize,
    made_by: &[Option<usize>],
    reads: impl IntoIterator<Item = (usize, usize)>,
) -> Vec<usize> {
    let mut last_read: Vec<Option<usize>> = vec![None; made_by.len()];
    for (v, r) in reads {
        assert!(r <= nodes, "value {v} is read by node {r}, past the {nodes} nodes and the final reader");
        let last = &mut last_read[v];
        *last = Some(last.map_or(r, |l| l.max(r)));
    }
    // delta[i]: the change, at node i, in how many values cross the cut after it.
    let mut delta = vec![0i64; nodes + 1];
    let mut makes_crossing = vec![false; nodes];
    for (&made, last) in made_by.iter().zip(last_read) {
        let Some(last) = last else { continue };
        let first = match made {
            Some(m) if last > m => {
                makes_crossing[m] = true;
                m
            }
            Some(_) => continue,
            None if last > 0 => 0,
            None => continue,
        };
        delta[first] += 1;
        delta[last] -= 1;
    }
    let mut crossing = 0i64;
    let mut cuts = Vec::new();
    for i in 0..nodes {
        crossing += delta[i];
        if crossing == 1 && makes_crossing[i] {
            cuts.push(i);
        }
    }
    cuts
}

#[cfg(test)]
mod tests {
    use super::single_crossing_cuts;

    /// Values made by nodes `0..n` in order, value `i` by node `i`.
    fn one_each(n: usize) -> Vec<Option<usize>> {
        (0..n).map(Some).collect()
    }

    #[test]
    fn a_chain_cuts_after_every_node() {
        // in → 0 → 1 → 2 → 3 → sink
        let mut made = one_each(4);
        made.push(None); // value 4: the input, read by node 0
        let reads = [(4, 0), (0, 1), (1, 2), (2, 3), (3, 4)];
        assert_eq!(single_crossing_cuts(4, &made, reads), vec![0, 1, 2, 3]);
        // Without the final reader, the last node's output crosses nothing.
        assert_eq!(single_crossing_cuts(4, &made, reads[..4].iter().copied()), vec![0, 1, 2]);
    }

    #[test]
    fn an_input_read_late_crosses_every_cut_before_its_reader() {
        // Node 2 reads the input again: nothing before it is a single crossing.
        let made = [Some(0), Some(1), Some(2), None];
        let reads = [(3, 0), (0, 1), (1, 2), (3, 2), (2, 3)];
        assert_eq!(single_crossing_cuts(3, &made, reads), vec![2]);
    }

    #[test]
    fn a_residual_block_is_not_cut_inside() {
        // 0 (stem) → 1 → 2 → 3: add(0, 2) → 4 → sink. The skip from 0 to 3 crosses the
        // cuts after 1 and 2, so the block 1..=3 stays whole.
        let made = one_each(5);
        let reads = [(0, 1), (1, 2), (2, 3), (0, 3), (3, 4), (4, 5)];
        assert_eq!(single_crossing_cuts(5, &made, reads), vec![0, 3, 4]);
    }

    #[test]
    fn a_diamond_is_one_block() {
        // 0 → {1, 2} → 3: after 1, node 0's output (read by 2) and node 1's cross;
        // after 2, both branches.
        let made = one_each(4);
        let reads = [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)];
        assert_eq!(single_crossing_cuts(4, &made, reads), vec![0, 3]);
    }

    #[test]
    fn a_node_with_two_outputs_read_later_is_no_cut() {
        // Node 0 makes values 0 and 1, both read by node 2: two values cross after node
        // 0, three after node 1, one (value 3) after node 2.
        let made = [Some(0), Some(0), Some(1), Some(2)];
        let reads = [(0, 1), (0, 2), (1, 2), (2, 2), (3, 3)];
        assert_eq!(single_crossing_cuts(3, &made, reads), vec![2]);
        // An output nobody reads does not count: a chain again.
        let reads = [(0, 1), (2, 2), (3, 3)];
        assert_eq!(single_crossing_cuts(3, &made, reads), vec![0, 1, 2]);
    }

    #[test]
    fn the_crossing_value_must_be_made_by_the_node() {
        // Node 1 makes nothing read later (a view, an unread output): the one value
        // crossing after it is node 0's, so the cut is after 0 alone.
        let made = [Some(0), Some(1)];
        let reads = [(0, 1), (0, 2)];
        assert_eq!(single_crossing_cuts(2, &made, reads), vec![0]);
    }

    #[test]
    fn unread_values_and_backward_reads_are_ignored() {
        // Value 1 is never read; value 2 is "read" by its own maker.
        let made = [Some(0), Some(0), Some(1)];
        let reads = [(0, 1), (2, 1)];
        assert_eq!(single_crossing_cuts(2, &made, reads), vec![0]);
        assert_eq!(single_crossing_cuts(0, &[], []), Vec::<usize>::new());
    }
}
