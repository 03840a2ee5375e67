"""Measured peak against pebble's prediction, at every budget, for the tests' models.

    target/torch-venv/bin/python crates/python/bench/peak_sweep.py --model unet --solvers lru,delta --captures 5

For each capture (each profiles the model again, so the plans differ with the machine's
pace) and each solver, plans at every activation budget from `--from` to 100% in steps of
1%, runs one step (the plan's first, as a user's is) under PyTorch's MemTracker, which
pebble feeds nothing, and prints every run whose measured peak is above the predicted one.
A run over the prediction is traced again step by step (MemTracker's current and peak after
each step of the program) and written to `--dump` as JSON with its graph and program.
The models are the Python tests' (`crates/python/tests/conftest.py`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch.distributed._tools.mem_tracker import MemTracker

import pebble.torch as pt
from pebble.torch import executor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import conftest  # noqa: E402

CPU = torch.device("cpu")
USER_LOSS_BYTES = 8  # the `.sum()` and its gradient, outside the model


def tensor_of(out: Any) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out


def tracker(model: torch.nn.Module, args: tuple[Any, ...]) -> MemTracker:
    mt = MemTracker()
    mt.track_external(model, torch.optim.SGD(model.parameters(), lr=0.0), *args)
    return mt


def total(mt: MemTracker, which: str) -> int:
    return int(mt.get_tracker_snapshot(which).get(CPU, {}).get("Total", 0))


def measured_peak(planned: pt.Planned, model: torch.nn.Module, args: tuple[Any, ...]) -> int:
    mt = tracker(model, args)
    with mt:
        tensor_of(planned(*args)).sum().backward()
    model.zero_grad(set_to_none=True)
    return total(mt, "peak") - USER_LOSS_BYTES


def trace(planned: pt.Planned, model: torch.nn.Module, args: tuple[Any, ...]) -> list[dict[str, Any]]:
    """One more step, with MemTracker's current and peak bytes after each program step."""
    mt, rows = tracker(model, args), []
    steps = planned.program.steps

    class Traced(executor.Run):
        def _steps(self, start: int, end: int) -> None:
            for k in range(start, end):
                super()._steps(k, k + 1)
                rows.append({"step": k, **steps[k], "current": total(mt, "current"), "peak": total(mt, "peak")})

    params = dict(model.named_parameters()) | dict(model.named_buffers())
    with mt:
        outs = executor._launch(Traced(planned.program, params), args)
        tensor_of(outs[0]).sum().backward()
    model.zero_grad(set_to_none=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="unet", choices=sorted(conftest.MODELS))
    ap.add_argument("--solvers", default="lru,delta,largest,dtr")
    ap.add_argument("--captures", type=int, default=3)
    ap.add_argument("--from", dest="lowest", type=int, default=40, help="the lowest budget, in %% of the activations")
    ap.add_argument("--dump", type=Path, default=None, help="a directory for the runs over the prediction")
    a = ap.parse_args()
    model, args = conftest.MODELS[a.model]()
    over = runs = 0
    for c in range(a.captures):
        cap = pt.capture(model, args)
        for solver in a.solvers.split(","):
            for pct in range(a.lowest, 101):
                try:
                    planned = pt.wrap(model, args, activation_budget=f"{pct}%", solver=solver, captured=cap,
                                      time_limit=2.0)
                except pt.PebbleError:
                    continue
                runs += 1
                peak, r = measured_peak(planned, model, args), planned.report
                if peak <= r["predicted_peak_bytes"]:
                    continue
                over += 1
                print(f"capture {c}, {solver} at {pct}%: measured {peak} B, predicted {r['predicted_peak_bytes']} B, "
                      f"budget {r['budget_bytes']} B", flush=True)
                if a.dump:
                    a.dump.mkdir(parents=True, exist_ok=True)
                    out = {"report": r, "graph": cap.graph, "trace": trace(planned, model, args)}
                    (a.dump / f"{a.model}-{solver}-{c}-{pct}.json").write_text(json.dumps(out))
    print(f"{a.model}: {over} of {runs} runs over the predicted peak")


if __name__ == "__main__":
    main()
