"""pebble: plans one training step of a deep network within a device-memory budget.

The planner is Rust (`pebble._core`): a training graph or chain in, a plan (which
activations to keep, recompute or offload), its lowered program and the simulator's
report out. The functions here take and return Python values; `pebble._core` has the
same functions on JSON text. `pebble.torch` plans and runs a PyTorch `nn.Module`.

    import pebble
    pebble.solvers()                    # [{"name", "description", "views"}, ...]
    chain = {"ftime": [1, 2], "btime": [3, 4, 1], "x": [4, 4, 2], "xbar": [4, 8, 6],
             "ftmp": [0, 0], "btmp": [0, 0, 0]}
    out = pebble.plan({"chain": chain}, "rotor", 20)
    out["report"]["peak_bytes"], out["report"]["makespan"]

Errors: bad input raises `PebbleError` (a `ValueError`) naming the argument and field;
a budget no plan fits raises `InfeasibleError` (a `PebbleError`), whose `least_budget`
is the least budget that fits in bytes, or None.
"""

from __future__ import annotations

import json
from typing import Any

from . import _core
from ._core import InfeasibleError, PebbleError

__version__: str = _core.__version__

__all__ = [
    "InfeasibleError",
    "PebbleError",
    "__version__",
    "least_budget",
    "lower",
    "parse_budget",
    "parse_size",
    "plan",
    "profile",
    "profiles",
    "simulate",
    "solvers",
    "to_chain",
]


def _dumps(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def solvers() -> list[dict[str, Any]]:
    """Every registered solver: {"name", "description", "views"}, sorted by name."""
    return json.loads(_core.solvers())


def profiles() -> list[dict[str, Any]]:
    """The built-in machine profiles."""
    return json.loads(_core.profiles())


def profile(name: str) -> dict[str, Any]:
    """A built-in profile by name (or a JSON profile file's)."""
    return json.loads(_core.profile(name))


def parse_size(size: str) -> int:
    """A size as the CLI reads it ("6GiB", "512MB", "1024"), in bytes."""
    return _core.parse_size(size)


def parse_budget(budget: str) -> dict[str, Any]:
    """A budget as the CLI reads it: {"bytes": n} or {"percent": p}."""
    return json.loads(_core.parse_budget(budget))


def plan(problem: dict[str, Any] | str, solver: str, budget: int,
         options: dict[str, Any] | str | None = None) -> dict[str, Any]:
    """Plans `problem` ({"graph": ...}, {"chain": ...} or both) with `solver` within
    `budget` bytes. See `pebble._core.plan` for the options and the result."""
    return json.loads(_core.plan(_dumps(problem), solver, int(budget), _dumps(options or {})))


def least_budget(problem: dict[str, Any] | str, solver: str,
                 options: dict[str, Any] | str | None = None) -> int | None:
    """The least budget in bytes in which `solver` plans `problem`, or None."""
    return _core.least_budget(_dumps(problem), solver, _dumps(options or {}))


def lower(problem: dict[str, Any] | str, schedule: dict[str, Any] | str) -> dict[str, Any]:
    """The program `schedule` means on `problem` (pebble_schedule::lower)."""
    return json.loads(_core.lower(_dumps(problem), _dumps(schedule)))


def simulate(problem: dict[str, Any] | str, schedule: dict[str, Any] | str,
             options: dict[str, Any] | str | None = None) -> dict[str, Any]:
    """The simulator's report on `schedule` (options: machine fields, "budget", "timeline")."""
    return json.loads(_core.simulate(_dumps(problem), _dumps(schedule), _dumps(options or {})))


def to_chain(graph: dict[str, Any] | str) -> dict[str, Any] | None:
    """The chain view of a training graph, {"chain", "stages"}, or None."""
    out = _core.to_chain(_dumps(graph))
    return None if out is None else json.loads(out)
