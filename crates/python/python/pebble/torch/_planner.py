"""Every call `pebble.torch` makes to pebble's planner, in one place.

The planner is the Rust extension `pebble._core` (a JSON-string API: `plan`,
`least_budget`, `lower`, `simulate`). TEMPORARY: until `pebble._core` is importable, the
same calls go to the CLI (`target/debug/pebble plan --graph FILE --json --output FILE`,
or the binary `$PEBBLE_CLI` names); the CLI gives no lowered program, so the fallback turns
the schedule's ops into steps itself. Delete `_Cli` once `_core` builds everywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BudgetTooSmall, PlanError

try:  # the Rust extension, built by maturin
    from pebble import _core  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the build
    _core = None
if os.environ.get("PEBBLE_TORCH_PLANNER") == "cli":  # TEMPORARY, with the fallback
    _core = None


@dataclass
class Plan:
    """A solver's plan: its schedule (JSON) and the simulator's figures."""

    solver: str
    schedule: dict[str, Any]
    peak_bytes: int
    makespan: float
    solve_seconds: float
    candidates: list[dict[str, Any]]


def backend() -> str:
    """"core" (the extension) or "cli" (the temporary fallback)."""
    return "core" if _core is not None else "cli"


def _options(time_limit: float | None, profile: str | None) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if time_limit is not None:
        opts["time_limit"] = time_limit
    if profile is not None:
        opts["profile"] = profile
    return opts


def plan(graph: dict[str, Any], solver: str, budget: int, *, time_limit: float | None = None,
         profile: str | None = None) -> Plan:
    """Plans `graph` with `solver` in `budget` bytes; BudgetTooSmall names the least budget."""
    if _core is None:
        return _Cli().plan(graph, solver, budget, time_limit, profile)
    problem, opts = json.dumps({"graph": graph}), _options(time_limit, profile)
    try:
        out = json.loads(_core.plan(problem, solver, int(budget), json.dumps(opts)))
    except _core.InfeasibleError as e:
        least = getattr(e, "least_budget", None)
        raise BudgetTooSmall(_too_small(solver, budget, least), budget, least) from e
    except ValueError as e:
        raise PlanError(str(e)) from e
    report = out.get("report", {})
    return Plan(out.get("solver", solver), out["schedule"], int(report["peak_bytes"]), float(report["makespan"]),
                float(out.get("solve_seconds", 0.0)), list(out.get("candidates") or []))


def least_budget(graph: dict[str, Any], solver: str, *, time_limit: float | None = None,
                 profile: str | None = None) -> int | None:
    """The least budget in which `solver` has a plan, or None."""
    if _core is None:
        return _Cli().least(graph, solver, time_limit, profile)
    least = _core.least_budget(json.dumps({"graph": graph}), solver, json.dumps(_options(time_limit, profile)))
    return None if least is None else int(least)


def store_all_peak(graph: dict[str, Any]) -> int:
    """The simulated peak of plain autograd (keep every saved tensor): what 100% is."""
    return plan(graph, "store-all", 1 << 62).peak_bytes


def program(graph: dict[str, Any], schedule: dict[str, Any]) -> list[dict[str, Any]]:
    """The lowered program's steps, each {"action", "node", "no_grad"} or {"action", "data"}."""
    if _core is None:
        return [_step(op) for op in schedule["ops"]]
    lowered = json.loads(_core.lower(json.dumps({"graph": graph}), json.dumps(schedule)))
    steps = lowered["steps"]
    if len(steps) != len(schedule["ops"]) or any(s.get("fault") for s in steps):
        bad = next((s for s in steps if s.get("fault")), None)
        raise PlanError(f"the schedule does not lower: {bad or 'an op was refused'}")
    return [s["action"] if isinstance(s["action"], dict) else s for s in steps]


def _step(op: dict[str, Any]) -> dict[str, Any]:
    kind = op["op"]
    if kind == "compute":
        return {"action": "compute", "node": op["node"], "no_grad": bool(op.get("no_grad", False))}
    if kind in ("free", "offload", "prefetch"):
        tensor = op["tensor"]
        if "data" not in tensor:
            raise PlanError(f"a chain tensor in a graph schedule: {op}")
        return {"action": kind, "data": tensor["data"], "fraction": float(op.get("fraction", 1.0))}
    raise PlanError(f"op `{kind}` in a graph schedule")


def _too_small(solver: str, budget: int, least: int | None) -> str:
    if least is None:
        return f"no plan of `{solver}` fits in {budget} bytes, nor in any budget"
    return f"no plan of `{solver}` fits in {budget} bytes; the least feasible budget is {least} bytes"


class _Cli:
    """TEMPORARY fallback: the `pebble` CLI, until `pebble._core` is importable."""

    def __init__(self) -> None:
        root = Path(__file__).resolve().parents[5]
        self.binary = Path(os.environ.get("PEBBLE_CLI", root / "target" / "debug" / "pebble"))
        if not self.binary.exists():
            raise PlanError(f"neither pebble._core nor the CLI ({self.binary}) is available: "
                            "build the extension (maturin) or `cargo build -p pebble-cli`")

    def run(self, graph: dict[str, Any], solver: str, budget: int, time_limit: float | None,
            profile: str | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
        with tempfile.TemporaryDirectory() as tmp:
            gpath, spath = Path(tmp) / "graph.json", Path(tmp) / "schedule.json"
            gpath.write_text(json.dumps(graph))
            cmd = [str(self.binary), "plan", "--graph", str(gpath), "--solver", solver, "--budget", str(int(budget)),
                   "--json", "--output", str(spath)]
            if time_limit is not None:
                cmd += ["--time-limit", str(time_limit)]
            if profile is not None:
                cmd += ["--profile", profile]
            done = subprocess.run(cmd, capture_output=True, text=True)
            try:
                report = json.loads(done.stdout)
            except json.JSONDecodeError:
                raise PlanError(f"`pebble plan --solver {solver}` failed: {done.stderr.strip() or done.stdout.strip()}")
            schedule = json.loads(spath.read_text()) if spath.exists() else None
            return report, schedule

    def plan(self, graph: dict[str, Any], solver: str, budget: int, time_limit: float | None,
             profile: str | None) -> Plan:
        report, schedule = self.run(graph, solver, budget, time_limit, profile)
        if not report.get("feasible"):
            least = report.get("min_feasible_budget_bytes")
            if least is None or least > budget:
                raise BudgetTooSmall(_too_small(solver, budget, least), budget, least)
            raise PlanError(report.get("error") or f"`{solver}` found no plan")
        assert schedule is not None
        return Plan(report["solver"], schedule, int(report["predicted_peak_bytes"]), float(report["predicted_time"]),
                    float(report.get("solve_seconds", 0.0)), list(report.get("candidates") or []))

    def least(self, graph: dict[str, Any], solver: str, time_limit: float | None, profile: str | None) -> int | None:
        report, _ = self.run(graph, solver, 0, time_limit, profile)
        least = report.get("min_feasible_budget_bytes")
        return None if least is None else int(least)
