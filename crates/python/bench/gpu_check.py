"""pebble.torch's acceptance runs on one device: each model, solver and budget trained for a
few SGD steps beside eager, with the peak measured by PyTorch alone.

    python crates/python/bench/gpu_check.py --device cuda --out gpu-out/torch.json

For each run: the plan's budget, predicted peak and step time; the measured peak
(`torch.cuda.max_memory_allocated` over the step on CUDA, MemTracker on the CPU: both
PyTorch's, fed nothing by pebble), the median step time (on the CPU, of as many steps again
outside MemTracker), and the largest difference of a
loss or parameter gradient from eager's over the steps (0 where bit for bit). One line per
run on stdout, and all of them as JSON. `scripts/gpu-check.sh torch` runs it on the GPU
machine; on the CPU it is the CI test's check, slower.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

import pebble.torch as pt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import MODELS  # noqa: E402  (the tests' models: GPT-2, ResNet-50, U-Net, MLP)

SOLVERS = ["rotor", "rockmate", "hiremate", "pytorch-mincut", "offload-dp", "pofo", "dtr", "auto"]


def logits(out: Any) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out


def step_peak(step: Any, model: torch.nn.Module, opt: Any, args: tuple[Any, ...], device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    from torch.distributed._tools.mem_tracker import MemTracker

    mt = MemTracker()
    mt.track_external(model, opt, *args)
    with mt:
        step()
    return int(mt.get_tracker_snapshot("peak")[device]["Total"])


def run(name: str, solver: str, share: str, device: torch.device, steps: int, time_limit: float) -> dict[str, Any]:
    model, args = MODELS[name]()
    model, args = model.to(device), tuple(a.to(device) for a in args)
    eager = copy.deepcopy(model)
    row: dict[str, Any] = {"model": name, "solver": solver, "share": share, "device": str(device)}
    try:
        planned = pt.wrap(model, args, activation_budget=share, solver=solver, time_limit=time_limit)
    except pt.PebbleError as e:
        return row | {"error": f"{type(e).__name__}: {e}"}
    opt, eager_opt = torch.optim.SGD(model.parameters(), lr=0.01), torch.optim.SGD(eager.parameters(), lr=0.01)
    peaks, secs, diff = [], [], 0.0
    for _ in range(steps):
        opt.zero_grad()
        eager_opt.zero_grad()
        loss: list[torch.Tensor] = []

        def step() -> None:
            t0 = time.perf_counter()
            out = logits(planned(*args)).sum()
            out.backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            secs.append(time.perf_counter() - t0)
            loss.append(out.detach())

        peaks.append(step_peak(step, model, opt, args, device))
        eager_loss = logits(eager(*args)).sum()
        eager_loss.backward()
        pairs = [(loss[0], eager_loss.detach())] + [(p.grad, q.grad) for p, q in zip(model.parameters(), eager.parameters())]
        diff = max([diff] + [float((a - b).abs().max()) for a, b in pairs if a is not None and b is not None])
        opt.step()
        eager_opt.step()
    if device.type == "cpu":  # the tracked steps ran under MemTracker's dispatch: time untracked ones
        secs.clear()
        for _ in range(steps):
            opt.zero_grad()
            step()
    r = planned.report
    return row | {"winner": r["solver"], "budget_bytes": r["budget_bytes"], "predicted_peak_bytes": r["predicted_peak_bytes"],
                  "measured_peak_bytes": max(peaks), "predicted_time": r["predicted_time"],
                  "measured_time": statistics.median(secs[1:] or secs), "max_abs_diff": diff}


def line(r: dict[str, Any]) -> str:
    head = f"{r['model']:9} {r['solver']:15} {r['share']:>4}"
    if "error" in r:
        return f"{head}  {r['error'][:120]}"
    mib = lambda b: b / 2**20  # noqa: E731
    peak, pred, budget = r["measured_peak_bytes"], r["predicted_peak_bytes"], r["budget_bytes"]
    verdict = "ok" if peak <= budget else "OVER"
    return (f"{head}  {r['winner']:14} peak {mib(peak):8.1f} MiB (pred {mib(pred):8.1f}, {100 * (peak / pred - 1):+5.1f}%; "
            f"budget {mib(budget):8.1f} {verdict})  step {1e3 * r['measured_time']:7.1f} ms "
            f"(pred {1e3 * r['predicted_time']:7.1f})  max |diff| {r['max_abs_diff']:.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", default="gpt2,resnet50,unet")
    ap.add_argument("--solvers", default=",".join(SOLVERS))
    ap.add_argument("--shares", default="40%,60%,80%")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=5.0, help="per solver, seconds (auto: in all)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    device = torch.device(a.device)
    rows = []
    for name in a.models.split(","):
        for solver in a.solvers.split(","):
            for share in a.shares.split(","):
                rows.append(run(name, solver, share, device, a.steps, a.time_limit))
                print(line(rows[-1]), flush=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
