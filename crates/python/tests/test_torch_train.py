"""pebble.torch trains as eager does, within the budget, at the predicted peak.

For each model and graph solver at 40/60/80% of the activation memory (where the solver
has a plan; else the test is skipped with the least budget): three SGD steps of the planned
model and of an eager copy give the same outputs (step 0), losses and parameter gradients
bit for bit; PyTorch's MemTracker measures the planned step's peak, which must be at most
the budget and within 5% of pebble's predicted peak, once the user's loss (two scalars,
outside the model) is taken off.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker

import pebble.torch as pt

# The user's loss, outside the model and so outside pebble's graph: the scalar `.sum()`
# returns and its gradient (autograd's ones), 4 bytes each in fp32.
USER_LOSS_BYTES = 8
TIME_LIMIT = {"hiremate": 2.0, "rockmate": 0.3, "checkmate": 10.0, "auto": 5.0}
SHARES = ["40%", "60%", "80%"]
# No plan there, and the search for the least budget that the refusal names takes longer
# than a plan would (seconds of the Python tests on 2026-12-06): HiRemate's time-limited
# ILPs on mlp (266) and unet (85), auto's candidates on gpt2 (41), unet (31) and mlp (12),
# Checkmate's ILP on unet (20) and mlp4 (17 and 15); HiRemate on gpt2 at 40%, below what one
# node alone needs, whose least budget (1,546,240 B) takes 80 s to find (2026-12-07). Cheaper
# refusals stay in, skipped with the least budget they name.
TOO_SLOW_TO_REFUSE = {("mlp", "hiremate", "40%"), ("unet", "hiremate", "40%"), ("gpt2", "auto", "40%"),
                      ("unet", "auto", "40%"), ("mlp", "auto", "40%"), ("unet", "checkmate", "40%"),
                      ("mlp4", "checkmate", "40%"), ("mlp4", "checkmate", "60%"), ("gpt2", "hiremate", "40%")}
CASES = [
    *[("mlp4", "checkmate", s) for s in SHARES],
    *[(m, solver, s) for m in ("mlp", "gpt2") for solver in ("rockmate", "hiremate", "dtr") for s in SHARES],
    *[(m, "pytorch-mincut", s) for m in ("mlp", "gpt2") for s in [*SHARES, "100%"]],
    *[(m, "store-all", "100%") for m in ("mlp", "gpt2")],
    *[(m, "auto", s) for m in ("mlp", "gpt2") for s in SHARES],
    # Models no one here wrote or shaped for pebble: torchvision's ResNet-50 (BatchNorm in
    # training mode) and a U-Net (skip connections). No plan below 42% on ResNet-50 at 64².
    *[(m, solver, s) for m in ("resnet50", "unet") for solver in ("dtr", "pytorch-mincut") for s in SHARES],
    *[("unet", solver, s) for solver in ("rockmate", "hiremate", "checkmate", "auto") for s in SHARES],
    # Chain solvers, on the graph's chain view, their plans expanded to graph ops (chain.py).
    *[(m, solver, s) for m in ("mlp", "gpt2", "resnet50") for solver in ("rotor", "pofo", "offload-dp") for s in SHARES],
]
CASES = [c for c in CASES if c not in TOO_SLOW_TO_REFUSE]


def tensor_of(out: Any) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out


def measured_peak(model: torch.nn.Module, opt: torch.optim.Optimizer, args: tuple[Any, ...], step: Any) -> int:
    mt = MemTracker()
    mt.track_external(model, opt, *args)
    with mt:
        step()
    return int(mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])


def plan_or_skip(model: torch.nn.Module, args: tuple[Any, ...], cap: Any, solver: str, share: str) -> pt.Planned:
    try:
        return pt.wrap(model, args, activation_budget=share, solver=solver, captured=cap,
                       time_limit=TIME_LIMIT.get(solver))
    except pt.BudgetTooSmall as e:
        pytest.skip(f"{solver} has no plan at {share}: {e}")
    except pt.PlanError as e:
        pytest.xfail(f"{solver} at {share}: {e}")


@pytest.mark.parametrize("name,solver,share", CASES)
def test_trains_as_eager_within_budget(captured: Any, name: str, solver: str, share: str) -> None:
    model, args, cap = captured(name)
    eager = copy.deepcopy(model)
    planned = plan_or_skip(model, args, cap, solver, share)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.01)
    assert torch.equal(tensor_of(planned(*args)), tensor_of(eager(*args)))
    peaks = []
    for _ in range(3):
        opt.zero_grad()
        eager_opt.zero_grad()
        losses: list[torch.Tensor] = []

        def step() -> None:
            loss = tensor_of(planned(*args)).sum()
            loss.backward()
            losses.append(loss.detach())

        peaks.append(measured_peak(model, opt, args, step))
        eager_loss = tensor_of(eager(*args)).sum()
        eager_loss.backward()
        assert torch.equal(losses[0], eager_loss.detach())
        differ = [n for (n, p), q in zip(model.named_parameters(), eager.parameters()) if not torch.equal(p.grad, q.grad)]
        assert not differ, f"gradients differ from eager's: {differ}"
        stale = [n for (n, b), c in zip(model.named_buffers(), eager.buffers()) if not torch.equal(b, c)]
        assert not stale, f"buffers (BatchNorm's running statistics) differ from eager's: {stale}"
        opt.step()
        eager_opt.step()
    report = planned.report
    peak = max(peaks) - USER_LOSS_BYTES
    budget, predicted = report["budget_bytes"], report["predicted_peak_bytes"]
    print(f"\n{name} {solver} {share}: measured {peak} B, budget {budget} B, predicted {predicted} B, "
          f"planned by {report['solver']} in {report['solve_seconds']:.2f} s")
    assert peak <= budget, f"measured {peak} B > budget {budget} B"
    assert abs(peak - predicted) <= 0.05 * predicted, f"measured {peak} B, predicted {predicted} B"


def test_budget_below_least_names_the_least(captured: Any) -> None:
    model, args, cap = captured("mlp")
    with pytest.raises(pt.BudgetTooSmall) as info:
        pt.wrap(model, args, activation_budget="1%", solver="dtr", captured=cap)
    least = info.value.least_budget
    assert least is not None and least > info.value.budget
    assert str(least) in str(info.value)


def test_a_rerun_without_grad_keeps_the_saved_tensors(captured: Any) -> None:
    """A forward node rerun without grad while its saved tensors are resident (Rockmate's
    fast forward) recreates its activation and leaves the saved tensors as they are."""
    from pebble.torch import _planner
    from pebble.torch.executor import Program

    model, args, cap = captured("gpt2")
    eager = copy.deepcopy(model)
    planned = pt.wrap(model, args, activation_budget="100%", solver="store-all", captured=cap)
    steps, compute, kinds = planned.program.steps, cap.graph["compute"], cap.kinds
    k, node = next((k, s["node"]) for k, s in enumerate(steps) if s["action"] == "compute"
                   and compute[s["node"]]["kind"] == "forward"
                   and any(kinds[d] == "saved" for d in compute[s["node"]]["outputs"])
                   and any(kinds[d] == "activation" for d in compute[s["node"]]["outputs"]))
    rerun = [{"action": "free", "data": d} for d in compute[node]["outputs"] if kinds[d] == "activation"]
    rerun.append({"action": "compute", "node": node, "no_grad": True})
    ops = [{"op": "free", "tensor": {"data": s["data"]}} if s["action"] == "free" else
           {"op": "compute", "node": s["node"], "no_grad": s["no_grad"]} for s in [*steps[: k + 1], *rerun, *steps[k + 1:]]]
    schedule = {"version": 2, "view": "graph", "ops": ops}
    planned.program = Program(cap, _planner.program(cap.graph, schedule))  # lowered: no fault
    tensor_of(planned(*args)).sum().backward()
    tensor_of(eager(*args)).sum().backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), eager.parameters()))


def test_auto_reports_its_candidates(captured: Any) -> None:
    """`solver="auto"`: the report names the winner, and each candidate's predicted time
    and peak, or why it has none; the winner is the fastest candidate with a plan."""
    model, args, cap = captured("mlp4")
    report = pt.wrap(model, args, activation_budget="80%", solver="auto", captured=cap, time_limit=3.0).report
    cands = report["candidates"]
    planned = [c for c in cands if c["error"] is None]
    assert report["asked"] == "auto" and planned
    winner = next(c for c in planned if c["solver"] == report["solver"])
    assert winner["predicted_time"] <= min(c["predicted_time"] for c in planned) * (1 + 1e-12)
    assert all(c["predicted_peak_bytes"] <= report["budget_bytes"] for c in planned)
    assert all(c["predicted_time"] is None and c["error"] for c in cands if c not in planned)


@pytest.mark.parametrize("name,solver,share", [
    # Recomputing plans where each has one on all three models (the shares are of the
    # activations store-all keeps, its gradients made by the backward included).
    *[(m, solver, share) for m in ("mlp", "gpt2", "resnet50")
      for solver, share in (("store-all", "100%"), ("rockmate", "90%"), ("dtr", "95%"))],
    # Offloading plans: their transfers on the link threads, beside the compute, on the
    # links the capture measured.
    pytest.param("mlp", "pofo", "60%", marks=pytest.mark.xfail(reason=(
        "1.5-2.5x on 2026-12-07 when its plan offloads (42 transfers of 64 KB a step; half the captures plan "
        "none): each takes 0.22-0.27 ms on its link thread against the 0.16 ms the idle capture measured, "
        "back to back, as the thread shares 2 cores with torch's 2 compute threads"), strict=False)),
    pytest.param("gpt2", "delta", "60%", marks=pytest.mark.xfail(reason=(
        "measured 1.94-2.07x the predicted step on 2026-12-06, 1.5-2.0x on 2026-12-07. Its compute steps "
        "take what the capture profiled (4.19 ms against 4.34, its 13 reruns included), but its 22 transfers "
        "cost the main thread about 1 ms a step that the simulator does not count (issuing each, re-making "
        "the views at arrival: cProfile) and it waits 0.5-2 ms for them (0.2-0.4 without the links' "
        "throttle, where the step is still 1.5x store-all's); the rest is not attributed yet"), strict=False)),
])
def test_step_time_as_predicted(captured: Any, name: str, solver: str, share: str) -> None:
    """On the times the capture profiled on this CPU, a step (the planned forward, the
    user's `.sum()` and its backward) takes the predicted time within 15%: the median of 5
    steps after a warm-up, on op times profiled as the median of 7 steps.

    This shared 2-core machine's speed drifts by 20-50% over seconds with nothing beside it
    (a 256x256 matmul's median over 200 runs: 249-436 us from one half-second to the next,
    2026-12-07). A plan's steps alternate with store-all's steps on the same capture, and
    its measured time is scaled to the speed the capture saw: by store-all's predicted over
    its measured median (store-all is checked unscaled). A miss is retried four times, each
    with a fresh capture: a plan whose time the model gets wrong misses all five."""
    import statistics
    import time

    model, args, _ = captured(name)

    def step(run: Any) -> float:  # as a training loop runs it: `.grad` reset (to None) by zero_grad
        model.zero_grad()
        t0 = time.perf_counter()
        tensor_of(run(*args)).sum().backward()
        return time.perf_counter() - t0

    ratios = []
    for _ in range(5):
        cap = pt.capture(model, args, repeats=7)  # profiled now, under the load the steps will run under
        planned = plan_or_skip(model, args, cap, solver, share)
        store_all = pt.wrap(model, args, activation_budget="100%", solver="store-all", captured=cap)
        step(planned), step(store_all)
        pairs = [(step(planned), step(store_all)) for _ in range(5)]
        measured = statistics.median(p for p, _ in pairs)
        slower = 1.0 if solver == "store-all" else statistics.median(s for _, s in pairs) / store_all.report[
            "predicted_time"]
        predicted = planned.report["predicted_time"]
        ratios.append(measured / slower / predicted)
        print(f"\n{name} {solver} {share}: measured {measured * 1e3:.2f} ms on a machine {slower:.3f}x as slow as "
              f"predicted for store-all, predicted {predicted * 1e3:.2f} ms ({ratios[-1]:.3f}x)")
        if abs(ratios[-1] - 1) <= 0.15:
            break
    assert abs(ratios[-1] - 1) <= 0.15, f"measured / predicted: {', '.join(f'{r:.3f}' for r in ratios)}"


def test_a_lagging_link_never_raises_the_peak(captured: Any, monkeypatch: Any) -> None:
    """An offload's device copy is released once its transfer has ended, before a prefetch
    of the same data allocates its copy back, however far the link's thread lags the
    simulated timeline: here each offload takes 20 ms more than the simulator gave it. When
    a prefetch released the offload's copy without waiting, both copies were resident: on
    the U-Net at 51-55% (4 of 5 captures on 2026-12-07), 8-89 KB over the prediction and
    up to 12% over the budget; with this lag, LRU's plan measured 792,240 B against 710,192
    predicted and a 716,746 budget."""
    from pebble.torch import _links

    solver = "lru"
    model, args, cap = captured("unet")
    planned = pt.wrap(model, args, activation_budget="55%", solver=solver, captured=cap)
    prefetched = {s["data"] for s in planned.program.steps if s["action"] == "prefetch"}
    assert prefetched, f"{solver}'s plan at 55% moves nothing"
    slow = _links.CpuLinks.offload

    def lagging(self: Any, t: torch.Tensor, seconds: float) -> Any:
        return slow(self, t, seconds + 0.02)

    monkeypatch.setattr(_links.CpuLinks, "offload", lagging)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    peak = measured_peak(model, opt, args, lambda: planned(*args).sum().backward()) - USER_LOSS_BYTES
    report = planned.report
    assert peak <= report["predicted_peak_bytes"] <= report["budget_bytes"], (
        f"measured {peak} B, predicted {report['predicted_peak_bytes']} B, budget {report['budget_bytes']} B")


def test_a_forward_without_backward_keeps_nothing(captured: Any) -> None:
    """A planned forward whose backward never runs (a loss computed for logging with grad
    on) frees its tensors as soon as its outputs go, as eager's do: before, the outputs'
    grad_fn held the run and the run held the outputs, so every activation of the step
    stayed until the garbage collector found the cycle: 763,136 B here, 73% of what eager
    keeps for the backward."""
    import gc

    model, args, cap = captured("unet")
    planned = pt.wrap(model, args, activation_budget="80%", solver="dtr", captured=cap)
    mt = MemTracker()
    mt.track_external(model, torch.optim.SGD(model.parameters(), lr=0.0), *args)

    def current() -> int:
        return int(mt.get_tracker_snapshot("current").get(torch.device("cpu"), {}).get("Total", 0))

    gc.disable()
    try:
        with mt:
            before = current()
            planned(*args)
            left = current() - before
    finally:
        gc.enable()
    assert left == 0, f"{left} B still allocated after the outputs went"
