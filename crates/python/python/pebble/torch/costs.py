"""Op times of a captured graph's compute nodes from `torch.utils.flop_counter`'s roofline
(the profiled times, measured as the executor runs the steps, are `executor.profile`'s)."""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.fx as fx

from ._fx import run_node


def _run_group(nodes: list[fx.Node], env: Mapping[fx.Node, Any]) -> dict[fx.Node, Any]:
    local: dict[fx.Node, Any] = {}
    get = lambda m: local[m] if m in local else env[m]  # noqa: E731
    for n in nodes:
        local[n] = run_node(n, get)
    return local


def roofline(groups: list[list[fx.Node]], env: Mapping[fx.Node, Any], flops_per_s: float, bytes_per_s: float) -> list[float]:
    """max(FLOPs / rate, bytes moved / bandwidth) of each node list, from the FLOP counter."""
    from torch.utils.flop_counter import FlopCounterMode

    times = []
    with torch.no_grad():
        for nodes in groups:
            with FlopCounterMode(display=False) as fc:
                out = _run_group(nodes, env)
            moved = sum(v.numel() * v.element_size() for v in out.values() if isinstance(v, torch.Tensor))
            times.append(max(fc.get_total_flops() / flops_per_s, moved / bytes_per_s))
    return times
