"""Facts about FX values that the capture, the cost model and the executor share: how one
node runs, when a value of a compute node is no longer needed, and whether a gradient can
be a parameter's `.grad` as it is."""

from __future__ import annotations

from typing import Any, Callable

import torch.fx as fx
from torch.fx.node import map_arg


def run_node(n: fx.Node, get: Callable[[fx.Node], Any]) -> Any:
    """One call_function node on the values `get` gives for its inputs."""
    return n.target(*map_arg(n.args, get), **map_arg(n.kwargs, get))


def drops(nodes: list[fx.Node], kept: set[fx.Node]) -> list[list[fx.Node]]:
    """After each node of a compute node, the values of it no longer needed (not kept, and
    not read by a later node of it)."""
    last = {n: i for i, n in enumerate(nodes)}
    for i, n in enumerate(nodes):
        for m in n.all_input_nodes:
            if m in last:
                last[m] = i
    out: list[list[fx.Node]] = [[] for _ in nodes]
    for n in nodes:
        if n not in kept:
            out[last[n]].append(n)
    return out


def lays_out(grad: Any, param: Any) -> bool:
    """Whether a produced gradient can be a parameter's `.grad` as it is: its own storage,
    in the parameter's layout and type (else eager, and pebble's executor, copy it into a
    tensor laid out as the parameter)."""
    return grad._base is None and grad.stride() == param.stride() and grad.dtype == param.dtype

