"""A chain schedule (rotor, pofo, offload-dp) run on the captured graph: each step of its
lowered program (`pebble_schedule::lower`, Table 2.1) expanded to graph ops, in this one
place. The graph's chain view (`_core.to_chain`) gives each compute node a stage `i`:

* `F_i` in KeepAll runs stage `i`'s forward nodes keeping what they make (`Saved(i+1)`:
  every data node stage `i`'s forward makes); in Discard or Checkpoint it runs them without
  grad and then frees all they made but the stage boundary (`Activation(i+1)`: what a
  later stage's forward or the loss reads);
* the loss is the loss node; `B_i` runs stage `i`'s backward nodes, then frees the
  gradients they made that no other stage reads;
* a chain tensor freed, offloaded or prefetched by the lowered step is each of its data
  nodes that no other resident chain tensor holds (`Activation(i)` lies inside `Saved(i)`);
  the model's inputs are none (the caller holds them: the chain view counts them as
  resident, `Retention::Step`), so moving `a_0` moves nothing.

The expanded ops are a graph schedule, lowered by the core like any other (which checks
that every read is resident), and run by the graph executor.
"""

from __future__ import annotations

from typing import Any

from .capture import Captured
from .errors import PlanError


def _tensor(t: dict[str, Any]) -> tuple[str, int]:
    ((kind, i),) = t.items()
    return kind, int(i)


def expand(cap: Captured, stages: list[int], program: dict[str, Any]) -> list[dict[str, Any]]:
    """The graph ops of a lowered chain program (`_core.lower` of a chain schedule)."""
    compute, data = cap.graph["compute"], cap.graph["data"]
    kinds = [d["kind"] for d in data]
    producer: dict[int, int] = {}
    readers: dict[int, set[int]] = {d: set() for d in range(len(data))}
    for k, c in enumerate(compute):
        for d in c["outputs"]:
            producer[d] = k
        for d in c["inputs"]:
            readers[d].add(k)
    fwd = lambda k: compute[k]["kind"] in ("forward", "loss")  # noqa: E731
    members: dict[tuple[str, int], set[int]] = {}
    for d, k in producer.items():
        s, kind = stages[k], compute[k]["kind"]
        if kinds[d] == "param_grad":
            continue
        if kind == "forward":
            members.setdefault(("saved", s + 1), set()).add(d)
            if any(fwd(r) and stages[r] > s for r in readers[d]):
                members.setdefault(("activation", s + 1), set()).add(d)
        elif any(compute[r]["kind"] == "backward" and stages[r] < s for r in readers[d]):
            members.setdefault(("grad", s), set()).add(d)
    by_stage: dict[tuple[str, int], list[int]] = {}
    for k, c in enumerate(compute):
        by_stage.setdefault((c["kind"], stages[k]), []).append(k)
    ids = [_tensor(t["tensor"]) for t in program["tensors"]]
    resident: set[int] = set()  # graph data made by this program and not freed
    held: set[tuple[str, int]] = set()  # chain tensors resident
    ops: list[dict[str, Any]] = []

    def drop(d: int, op: str = "free") -> None:
        if d in resident:
            resident.discard(d)
            ops.append({"op": op, "tensor": {"data": d}})

    def release(t: tuple[str, int], op: str = "free") -> None:
        held.discard(t)
        keep = set().union(*(members.get(h, set()) for h in held)) if held else set()
        for d in sorted(members.get(t, set()) - keep):
            drop(d, op)

    def run(k: int, no_grad: bool) -> None:
        ops.append({"op": "compute", "node": k, "no_grad": no_grad})
        for d in compute[k]["outputs"]:
            if kinds[d] not in ("param_grad",) and not (no_grad and kinds[d] == "saved"):
                resident.add(d)

    later: dict[int, list[tuple[str, int]]] = {}  # step -> chain tensors to offload after it
    for n, step in enumerate(program["steps"]):
        a = step["action"]
        act = a["action"]
        if act == "forward":
            i, mode = int(a["stage"]), a["mode"]
            for k in by_stage.get(("forward", i), []):
                run(k, mode != "all")
            if mode != "all":
                boundary = members.get(("activation", i + 1), set())
                for d in sorted(members.get(("saved", i + 1), set()) - boundary):
                    drop(d)
        elif act == "loss":
            for k in by_stage.get(("loss", int(program["ids"]["l"])), []):
                run(k, False)
        elif act == "backward":
            i = int(a["stage"])
            for k in by_stage.get(("backward", i), []):
                run(k, False)
            made = {d for k in by_stage.get(("backward", i), []) for d in compute[k]["outputs"]}
            for d in sorted(made - members.get(("grad", i), set())):
                if kinds[d] != "param_grad":
                    drop(d)
        elif act in ("offload", "prefetch", "free"):
            t = ids[int(a["tensor"])]
            if act == "free":
                release(t)
            elif act == "offload":  # the device copy stays readable until step `hold_until` ends
                held.discard(t)
                later.setdefault(a.get("hold_until") or n, []).append(t)
            else:
                for d in sorted(members.get(t, set())):
                    if d not in resident:
                        resident.add(d)
                        ops.append({"op": "prefetch", "tensor": {"data": d}})
                held.add(t)
        elif act == "cpu_update":
            raise PlanError("a chain plan that updates weights on the host CPU cannot run on a graph yet")
        if act not in ("offload", "prefetch", "free"):
            for c in step["creates"]:
                held.add(ids[c])
            for f in step["frees"]:
                release(ids[f])
        for t in later.pop(n, []):
            if t not in held:
                release(t, "offload")
    return ops


def graph_schedule(cap: Captured, chain_schedule: dict[str, Any]) -> dict[str, Any]:
    """The graph schedule that runs `chain_schedule` (planned on the graph's chain view)."""
    from . import _planner

    view = _planner.chain_view(cap.graph)
    if view is None:
        raise PlanError("the graph has no chain view (it is not a sequence of blocks)")
    if chain_schedule.get("periodic"):
        raise PlanError("a periodic chain schedule cannot run as one training step")
    program = _planner.lower({"graph": cap.graph}, chain_schedule)
    return {"version": chain_schedule.get("version", 2), "view": "graph",
            "ops": expand(cap, view["stages"], program)}
