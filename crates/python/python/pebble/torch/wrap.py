"""`pt.wrap`: capture a model, plan it within a budget, and run the plan as the model."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

import pebble

from . import _planner, chain
from .capture import Captured, capture
from .errors import BudgetTooSmall, PebbleError
from .executor import Program, execute


def parse_size(text: str | int, reference: int) -> int:
    """`6GiB`, `512MiB`, plain bytes, or `P%` of `reference`: a budget as the CLI reads it
    (the core's one parser; a bad one raises `pebble.PebbleError` naming it)."""
    if isinstance(text, int):
        return text
    parsed = pebble.parse_budget(text)
    if "percent" in parsed:
        return int(parsed["percent"] / 100 * reference)
    return int(parsed["bytes"])


def resolve_budget(cap: Captured, store_all: int, budget: str | int | None, activation_budget: str | int | None) -> int:
    """Total bytes. `activation_budget` is a share of what eager keeps beyond the resident
    bytes (parameters, the inputs), to which those are added, as the
    CLI's `--activation-budget`."""
    if (budget is None) == (activation_budget is None):
        raise ValueError("give exactly one of budget= and activation_budget=")
    if budget is not None:
        return parse_size(budget, store_all)
    fixed = cap.fixed_bytes
    return fixed + parse_size(activation_budget, max(store_all - fixed, 0))  # type: ignore[arg-type]


class Planned(torch.nn.Module):
    """A model that trains by a pebble plan: `planned(x)` gives `model(x)`'s outputs, and
    the backward follows the plan, its gradients landing in `model.parameters()`."""

    def __init__(self, model: torch.nn.Module, cap: Captured, program: Program, report: dict[str, Any]) -> None:
        super().__init__()
        self.model, self.captured, self.program, self.report = model, cap, program, report
        self._shapes = [tuple(n.meta["val"].shape) for n in cap.inputs]

    def forward(self, *args: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.model(*args)
        flat, spec = tree_flatten(args)
        shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else None for t in flat]
        if spec != self.captured.in_spec or shapes != self._shapes:
            raise PebbleError(f"the plan is for inputs of shapes {self._shapes}, not {shapes}: wrap again for new shapes")
        params = dict(self.model.named_parameters()) | dict(self.model.named_buffers())
        outs = execute(self.program, params, flat)
        return tree_unflatten(list(outs), self.captured.out_spec)


def wrap(model: torch.nn.Module, args: tuple[Any, ...], *, budget: str | int | None = None,
         activation_budget: str | int | None = None, solver: str = "auto", profile: str | None = None,
         time_limit: float | None = None, times: str = "profile", captured: Captured | None = None) -> Planned:
    """Captures `model` on `args`, plans it with `solver` within the budget, and returns the
    planned model. Raises BudgetTooSmall (with the least feasible budget), UnsupportedModel
    or PlanError; the model itself is left untouched. `captured` reuses an earlier
    `capture(model, args)` (same model, same input shapes). Without `profile`, the plan
    counts the op times and the links measured at capture (`times="profile"`, on the
    inputs' device); with it, the profile's links."""
    cap = captured or capture(model, args, times=times)
    store_all = _planner.store_all_peak(cap.graph)
    total = resolve_budget(cap, store_all, budget, activation_budget)
    try:
        plan = _planner.plan({"graph": cap.graph}, solver, total, time_limit=time_limit, profile=profile, link=cap.link)
    except BudgetTooSmall as e:
        share = _share(cap, store_all, e.least_budget)
        raise BudgetTooSmall(f"{e} ({share})", total, e.least_budget) from None
    schedule = plan.schedule
    if plan.view == "chain":  # rotor, pofo, offload-dp: expanded to the graph's ops
        schedule = chain.graph_schedule(cap, schedule)
    # What runs (a chain plan expanded to graph ops), simulated: the figures reported, and
    # the timeline that orders the transfers.
    sim = _planner.simulate(cap.graph, schedule, total, profile=profile, link=cap.link)
    program = Program(cap, _planner.program(cap.graph, schedule), sim["spans"])
    report = {"solver": plan.winner, "asked": plan.solver, "budget_bytes": total,
              "predicted_peak_bytes": int(sim["peak_bytes"]), "predicted_time": float(sim["makespan"]),
              "candidates": [_candidate(c) for c in plan.candidates], "solve_seconds": plan.solve_seconds,
              "store_all_peak_bytes": store_all, "fixed_bytes": cap.fixed_bytes, "view": plan.view}
    return Planned(model, cap, program, report)


def _candidate(c: dict[str, Any]) -> dict[str, Any]:
    """One of `auto`'s candidates: the solver, its predicted time and peak, or why none."""
    return {"solver": c["solver"], "view": c.get("view"), "predicted_time": c.get("time"),
            "predicted_peak_bytes": c.get("peak_bytes"), "solve_seconds": c.get("solve_seconds"),
            "error": c.get("error")}


def _share(cap: Captured, store_all: int, least: int | None) -> str:
    activations = store_all - cap.fixed_bytes
    if least is None or activations <= 0:
        return "no budget fits"
    return f"{100 * (least - cap.fixed_bytes) / activations:.1f}% of the activation memory eager keeps"
