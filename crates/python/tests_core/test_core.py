"""pebble._core from Python: solvers, a plan within its budget that the simulator
replays to the same peak, the least budget of an infeasible one, and errors that name
their cause. Run: target/py-venv/bin/python -m pytest crates/python/tests_core
(scripts/py-venv.sh builds and installs the package first)."""

from __future__ import annotations

import json

import pytest

import pebble
from pebble import _core

# A four-stage chain by hand, rotor's format: x[i] the activation entering stage i,
# xbar[i] what stage i-1's forward keeps with it, ftmp/btmp their temporaries; sizes in
# bytes, times in seconds; static_bytes resident throughout.
CHAIN = {
    "name": "hand-4",
    "ftime": [1.0, 2.0, 4.0, 1.0],
    "btime": [2.0, 4.0, 8.0, 2.0, 1.0],
    "x": [400, 300, 500, 300, 100],
    "xbar": [400, 900, 1300, 800, 300],
    "ftmp": [50, 20, 30, 10],
    "btmp": [60, 20, 40, 20, 10],
    "static_bytes": 1000,
}
PROBLEM = json.dumps({"chain": CHAIN})


def plan(solver: str, budget: int, options: dict | None = None) -> dict:
    return json.loads(_core.plan(PROBLEM, solver, budget, json.dumps(options or {})))


def store_all_peak() -> int:
    return plan("store-all", 1 << 40)["report"]["peak_bytes"]


def test_solvers_lists_both_crates_and_auto():
    solvers = json.loads(_core.solvers())
    names = {s["name"] for s in solvers}
    assert {"rotor", "checkmate", "auto", "hiremate", "pofo"} <= names
    views = {s["name"]: s["views"] for s in solvers}
    assert views["rotor"] == ["chain"] and views["checkmate"] == ["graph"]
    assert all(s["description"] for s in solvers)
    assert pebble.solvers() == solvers


def test_profiles_and_their_errors():
    names = [p["name"] for p in json.loads(_core.profiles())]
    assert "v100" in names
    v100 = json.loads(_core.profile("v100"))
    assert v100["machine"]["device_memory"] == 16 << 30
    with pytest.raises(pebble.PebbleError, match=r"v10.*did you mean.*v100"):
        _core.profile("v10")


def between(solver: str, share: float) -> int:
    """A budget `share` of the way from `solver`'s least feasible one to store-all's peak."""
    least = _core.least_budget(PROBLEM, solver, "{}")
    return least + int((store_all_peak() - least) * share)


def test_a_plan_fits_and_the_simulator_agrees():
    peak = store_all_peak()
    budget = between("rotor", 0.3)
    out = plan("rotor", budget)
    assert out["solver"] == "rotor" and out["view"] == "chain"
    report = out["report"]
    assert report["peak_bytes"] <= budget < peak
    # Below store-all's peak, rotor recomputes: slower than store-all, and says so.
    assert out["moves"]["recomputes"] > 0
    assert report["makespan"] > plan("store-all", peak)["report"]["makespan"]
    schedule = json.dumps(out["schedule"])
    again = json.loads(_core.simulate(PROBLEM, schedule, json.dumps({"budget": budget})))
    assert again["peak_bytes"] == report["peak_bytes"]
    assert again["makespan"] == report["makespan"]
    with pytest.raises(pebble.PebbleError, match="rejects"):
        _core.simulate(PROBLEM, schedule, json.dumps({"budget": report["peak_bytes"] - 1}))
    lowered = json.loads(_core.lower(PROBLEM, schedule))
    assert lowered["view"] == "chain"
    assert len(lowered["steps"]) == len(out["schedule"]["ops"])
    assert all(step["missing"] is None for step in lowered["steps"])


def test_an_infeasible_budget_names_the_least_one_which_then_plans():
    least = _core.least_budget(PROBLEM, "rotor", "{}")
    assert isinstance(least, int) and 0 < least < store_all_peak()
    with pytest.raises(pebble.InfeasibleError) as caught:
        _core.plan(PROBLEM, "rotor", least - 1, "{}")
    assert caught.value.least_budget == least
    assert f"{least} bytes" in str(caught.value)
    assert isinstance(caught.value, ValueError)
    out = plan("rotor", least)
    assert out["report"]["peak_bytes"] <= least


def test_auto_keeps_the_fastest_candidate():
    budget = between("rotor", 0.2)
    out = plan("auto", budget, {"time_limit": 20})
    candidates = out["candidates"]
    assert {"rotor", "revolve", "pofo"} <= {c["solver"] for c in candidates}
    times = [c["time"] for c in candidates if c["time"] is not None]
    assert out["report"]["makespan"] == min(times)
    assert out["schedule"]["kept_from"] == out["winner"]
    winner = next(c for c in candidates if c["solver"] == out["winner"])
    assert winner["time"] == out["report"]["makespan"]
    assert all(c["error"] for c in candidates if c["time"] is None)


def test_bad_json_names_the_field():
    bad = dict(CHAIN, btime=[1.0, 2.0])
    with pytest.raises(ValueError, match=r"problem\.chain.*btime"):
        _core.plan(json.dumps({"chain": bad}), "rotor", 10_000, "{}")
    with pytest.raises(pebble.PebbleError, match="time_limt"):
        _core.plan(PROBLEM, "rotor", 10_000, json.dumps({"time_limt": 3}))
    with pytest.raises(pebble.PebbleError, match="problem"):
        _core.plan("{not json", "rotor", 10_000, "{}")


def test_an_unknown_solver_is_named():
    with pytest.raises(pebble.PebbleError, match=r"rotr.*did you mean.*rotor"):
        _core.plan(PROBLEM, "rotr", 10_000, "{}")
    with pytest.raises(pebble.PebbleError, match="checkmate"):
        _core.plan(PROBLEM, "checkmate", 10_000, "{}")  # a graph solver, a chain problem


def test_the_python_wrappers_take_values():
    out = pebble.plan({"chain": CHAIN}, "rotor", store_all_peak())
    assert pebble.simulate({"chain": CHAIN}, out["schedule"])["peak_bytes"] == out["report"]["peak_bytes"]
    assert pebble.parse_size("2KiB") == 2048
    assert pebble.parse_budget("50%") == {"percent": 50.0}
    assert pebble.__version__
