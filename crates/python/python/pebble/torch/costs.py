"""Op times of a captured graph's compute nodes: profiled on the sample's device (the
default), or a roofline from `torch.utils.flop_counter`."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Mapping

import torch
import torch.fx as fx
from torch.fx.node import map_arg


def run_node(n: fx.Node, get: Callable[[fx.Node], Any]) -> Any:
    """One call_function node on the values `get` gives for its inputs."""
    return n.target(*map_arg(n.args, get), **map_arg(n.kwargs, get))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run_group(nodes: list[fx.Node], env: Mapping[fx.Node, Any]) -> dict[fx.Node, Any]:
    local: dict[fx.Node, Any] = {}
    get = lambda m: local[m] if m in local else env[m]  # noqa: E731
    for n in nodes:
        local[n] = run_node(n, get)
    return local


def profile(groups: list[list[fx.Node]], env: Mapping[fx.Node, Any], device: torch.device, repeats: int = 3) -> list[float]:
    """Median wall time (seconds) of each node list over `repeats` runs, after one warm-up."""
    times = []
    with torch.no_grad():
        for nodes in groups:
            if not nodes:
                times.append(0.0)
                continue
            samples = []
            for k in range(repeats + 1):
                _sync(device)
                t0 = time.perf_counter()
                _run_group(nodes, env)
                _sync(device)
                if k:
                    samples.append(time.perf_counter() - t0)
            times.append(statistics.median(samples))
    return times


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
