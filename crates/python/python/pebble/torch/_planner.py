"""Every call `pebble.torch` makes to pebble's planner, in one place: the `pebble`
package's functions over the Rust extension (`plan`, `least_budget`, `lower`, `to_chain`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pebble

from .errors import BudgetTooSmall, PlanError


@dataclass
class Plan:
    """A solver's plan: its schedule (JSON) and the simulator's figures."""

    solver: str  # the solver asked
    winner: str  # the solver whose plan it is (auto's pick; else `solver`)
    view: str  # "graph" | "chain"
    schedule: dict[str, Any]
    peak_bytes: int
    makespan: float
    solve_seconds: float
    candidates: list[dict[str, Any]]


def _options(time_limit: float | None, profile: str | None, solvers: list[str] | None = None,
             link: dict[str, float] | None = None) -> dict[str, Any]:
    """The core's options. `link`: the links measured at capture ({"bandwidth",
    "latency"}), which stand for the profile's where no profile is named."""
    opts: dict[str, Any] = {}
    if time_limit is not None:
        opts["time_limit"] = time_limit
    if profile is not None:
        opts["profile"] = profile
    elif link is not None:
        opts["bandwidth"], opts["latency"] = link["bandwidth"], link["latency"]
    if solvers is not None:
        opts["solvers"] = solvers
    return opts


def plan(problem: dict[str, Any], solver: str, budget: int, *, time_limit: float | None = None,
         profile: str | None = None, solvers: list[str] | None = None, link: dict[str, float] | None = None) -> Plan:
    """Plans `problem` ({"graph"}, or with its "chain" view) with `solver` in `budget`
    bytes; BudgetTooSmall names the least budget. `solvers`: those `auto` may run."""
    opts = _options(time_limit, profile, solvers, link)
    try:
        out = pebble.plan(problem, solver, budget, opts)
    except pebble.InfeasibleError as e:
        least = getattr(e, "least_budget", None)
        raise BudgetTooSmall(_too_small(solver, budget, least), budget, least) from e
    except ValueError as e:
        raise PlanError(str(e)) from e
    report = out["report"]
    return Plan(out.get("solver", solver), out.get("winner") or solver, out.get("view", "graph"), out["schedule"],
                int(report["peak_bytes"]), float(report["makespan"]), float(out.get("solve_seconds", 0.0)),
                list(out.get("candidates") or []))


def least_budget(problem: dict[str, Any], solver: str, *, time_limit: float | None = None,
                 profile: str | None = None, link: dict[str, float] | None = None) -> int | None:
    """The least budget in which `solver` has a plan, or None."""
    least = pebble.least_budget(problem, solver, _options(time_limit, profile, link=link))
    return None if least is None else int(least)


def store_all(graph: dict[str, Any]) -> Plan:
    """Plain autograd's plan (keep every saved tensor), in no budget."""
    return plan({"graph": graph}, "store-all", 1 << 62)


def store_all_peak(graph: dict[str, Any]) -> int:
    """The simulated peak of plain autograd: what 100% is."""
    return store_all(graph).peak_bytes


def solver_views() -> dict[str, list[str]]:
    """Each registered solver's views ("graph", "chain")."""
    return {s["name"]: list(s["views"]) for s in pebble.solvers()}


def chain_view(graph: dict[str, Any]) -> dict[str, Any] | None:
    """The graph's chain view {"chain", "stages"} (a stage per compute node, the loss's
    the chain length), or None where the graph is not a sequence of blocks."""
    return pebble.to_chain(graph)


def lower(problem: dict[str, Any], schedule: dict[str, Any]) -> dict[str, Any]:
    """The lowered program (`pebble_schedule::lower`) of a schedule of either view."""
    try:
        return pebble.lower(problem, schedule)
    except ValueError as e:
        raise PlanError(f"the schedule does not lower: {e}") from e


def program(graph: dict[str, Any], schedule: dict[str, Any]) -> list[dict[str, Any]]:
    """A graph schedule's lowered steps, each {"action", "node", "no_grad"} or {"action", "data"}."""
    steps = lower({"graph": graph}, schedule)["steps"]
    if len(steps) != len(schedule["ops"]) or any(s.get("fault") for s in steps):
        bad = next((s for s in steps if s.get("fault")), None)
        raise PlanError(f"the schedule does not lower: {bad or 'an op was refused'}")
    return [s["action"] for s in steps]


def simulate(graph: dict[str, Any], schedule: dict[str, Any], budget: int, *,
             profile: str | None = None, link: dict[str, float] | None = None) -> dict[str, Any]:
    """The simulator's report on a graph schedule within `budget`, on the machine the plan
    was made for, with its spans ({"lane", "op", "start", "end"} of each op)."""
    opts = _options(None, profile, link=link) | {"timeline": True, "budget": budget}
    try:
        return dict(pebble.simulate({"graph": graph}, schedule, opts))
    except ValueError as e:
        raise PlanError(f"the plan, as graph ops, does not run within the budget: {e}") from e


def _too_small(solver: str, budget: int, least: int | None) -> str:
    if least is None:
        return f"no plan of `{solver}` fits in {budget} bytes, nor in any budget"
    return f"no plan of `{solver}` fits in {budget} bytes; the least feasible budget is {least} bytes"
