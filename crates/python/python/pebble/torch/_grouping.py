"""Which pebble compute node runs each FX node of a joint graph.

Forward aten nodes are grouped by `meta["seq_nr"]` (one autograd node); backward aten
nodes by the forward group whose `seq_nr` they carry (AOTAutograd stamps a backward node
with the forward's). A value that aliases an earlier storage (a view) runs in the group
that creates the storage; views of parameters and inputs are "fixed" (run once per step),
views of the output gradients run in the loss. Groups that would depend on each other both
ways are untangled: a node that reads a group begun after its own joins that group.
"""

from __future__ import annotations

import operator
from typing import Any, Hashable

import torch
import torch.fx as fx

Key = Hashable
FIXED, LOSS = "fixed", "loss"


class Grouping:
    """Union-find over group keys, and each FX node's initial key or the node it follows."""

    def __init__(self, nodes: list[fx.Node], env: dict[fx.Node, Any], cls: dict[fx.Node, int],
                 roots: list[fx.Node], tangents: set[fx.Node], forward_set: set[fx.Node]) -> None:
        self.nodes, self.env, self.cls, self.roots = nodes, env, cls, roots
        self.tangents, self.forward_set = tangents, forward_set
        self.index = {n: i for i, n in enumerate(nodes)}
        self.parent: dict[Key, Key] = {}
        self.home: dict[fx.Node, Any] = {}
        self.backward_of: dict[Key, Key] = {}

    # -- union-find ---------------------------------------------------------------
    def find(self, k: Key) -> Key:
        while self.parent.get(k, k) != k:
            k = self.parent[k]
        return k

    def union(self, keep: Key, other: Key) -> None:
        a, b = self.find(keep), self.find(other)
        if a != b:
            self.parent[b] = a

    # -- where a node runs --------------------------------------------------------
    def group(self, n: fx.Node) -> Key | None:
        """FIXED, LOSS, a group key, or None (placeholders, constants, the output)."""
        if n.op == "placeholder":
            return LOSS if n in self.tangents else FIXED
        if n.op == "get_attr":
            return FIXED
        h = self.home.get(n)
        if h is None:
            return None
        if isinstance(h, fx.Node):
            return self.group(h)
        return h if h in (FIXED, LOSS) else self.find(h)

    def is_alias(self, n: fx.Node) -> bool:
        v = self.env.get(n)
        if isinstance(v, torch.Tensor):
            return self.roots[self.cls[n]] is not n
        if isinstance(v, (tuple, list)) and v:
            items = [u for u in n.users if u.target is operator.getitem]
            return bool(items) and all(self.is_alias(u) for u in items)
        return False

    def assign(self) -> None:
        for n in self.nodes:
            if n.op != "call_function":
                continue
            if n.target is operator.getitem and not isinstance(self.env.get(n.args[0]), torch.Tensor):
                self.home[n] = n.args[0]
            elif self.is_alias(n):
                first = n if isinstance(self.env[n], torch.Tensor) else next(u for u in n.users if u.target is operator.getitem)
                self.home[n] = self.roots[self.cls[first]]
            else:
                side = "fwd" if n in self.forward_set else "bwd"
                self.home[n] = (side, n.meta.get("seq_nr", n.name))

    def keys(self, side: str) -> dict[Key, list[fx.Node]]:
        """The groups of one side ("fwd" or "bwd") and their nodes, in graph order."""
        by: dict[Key, list[fx.Node]] = {}
        for n in self.nodes:
            k = self.group(n)
            if isinstance(k, tuple) and k[0] == side:
                by.setdefault(k, []).append(n)
        return by

    def deps(self, by: dict[Key, list[fx.Node]]) -> dict[Key, set[Key]]:
        out: dict[Key, set[Key]] = {k: set() for k in by}
        for k, nodes in by.items():
            for n in nodes:
                for m in n.all_input_nodes:
                    km = self.group(m)
                    if km != k and km in out:
                        out[k].add(km)
        return out

    def untangle(self, side: str) -> None:
        """Moves each node that reads a group begun after its own into the latest such group
        (a gradient accumulation joins its last contribution, as in autograd's engine).
        Then every group reads only groups begun before it: listing groups by their first
        node is an execution order, and no group waits on one that waits on it."""
        first: dict[Key, int] = {}
        for n in self.nodes:
            k = self.group(n)
            if not (isinstance(k, tuple) and k[0] == side):
                continue
            i = first.setdefault(k, self.index[n])
            if isinstance(self.home[n], fx.Node):
                continue  # a view or an item: where its storage is made
            later = [self.group(m) for m in n.all_input_nodes]
            later = [d for d in later if d in first and d != k and first[d] > i]
            if later:
                self.home[n] = max(later, key=first.__getitem__)

    def link_backward(self) -> None:
        """Keys each backward node by its forward group ("bwd", forward key)."""
        fwd_of: dict[Any, Key] = {}
        for n in self.nodes:
            if n in self.forward_set and "seq_nr" in n.meta:
                g = self.group(n)
                if isinstance(g, tuple) and (not self.is_alias(n) or n.meta["seq_nr"] not in fwd_of):
                    fwd_of[n.meta["seq_nr"]] = g
        orphans = []
        for n in self.nodes:
            h = self.home.get(n)
            if isinstance(h, tuple) and h[0] == "bwd":
                f = fwd_of.get(h[1])
                if f is None:
                    orphans.append(n)
                else:
                    self.home[n] = ("bwd", f)
                    self.backward_of[("bwd", f)] = f
        for n in orphans:
            self.home[n] = self._neighbour(n)

    def _neighbour(self, n: fx.Node) -> Key:
        """An orphan backward node (its forward is a view of a parameter, or none) joins the
        backward group of the linked backward node before it, or else after it."""
        i = self.index[n]
        linked = [m for m in self.nodes if isinstance(self.home.get(m), tuple) and self.home[m] in self.backward_of]
        before = [m for m in linked if self.index[m] < i]
        after = [m for m in linked if self.index[m] > i]
        pick = before[-1] if before else after[0] if after else None
        return self.home[pick] if pick is not None else ("bwd", None)

    def forwards_of(self, k: Key) -> list[Key]:
        """The forward groups a (merged) backward group differentiates."""
        return [f for b, f in self.backward_of.items() if self.find(b) == k]

    def ordered(self, side: str) -> list[Key]:
        """The groups of one side by their first node: an execution order once untangled."""
        by = self.keys(side)
        return sorted(by, key=lambda k: self.index[by[k][0]])
