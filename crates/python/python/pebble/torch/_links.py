"""Offloads and prefetches beside the compute, in the order pebble's simulator gives them.

A program's transfers run on the device's two links while the main thread computes, and
they are ordered against the compute by the simulator's timeline of the same program (the
`spans` of `pebble.simulate` with `timeline`), so that device memory never holds more than
the simulator counted at any compute step:

* a compute step first waits for every transfer the simulator ends before it starts (an
  offload's device copy is released when its transfer ends; a prefetch's data is ready);
* a prefetch allocates its device copy when the main thread reaches its *gate*: the compute
  step it overlaps in the simulator, or the one after the compute it follows. Offloads need
  no gate: starting one early only releases memory early.

`Timing` derives the waits and gates from the spans; `CpuLinks` and `CudaLinks` move the
bytes. On the CPU the host copy is a NumPy buffer (outside torch's allocator, as host memory
is outside the device's) and each link is one worker thread, throttled so that a transfer
takes at least the time the simulator gave it (the profile's link, which the CPU's own
memcpy outruns). On CUDA each link is a side stream, the host copy pinned, and the order
is kept with events.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

EPS = 1e-12


@dataclass
class Timing:
    """For each step of a program, from the simulator's spans: the transfers a compute step
    waits for, and the step at which each prefetch may allocate its device copy."""

    waits: dict[int, list[int]] = field(default_factory=dict)  # compute step -> transfer steps
    gates: dict[int, int] = field(default_factory=dict)  # prefetch step -> step index
    durations: dict[int, float] = field(default_factory=dict)  # transfer step -> seconds

    @staticmethod
    def in_order(steps: list[dict[str, Any]]) -> Timing:
        """No timeline: each transfer ends before the next compute step, and starts at its
        own step (no overlap, as a synchronous copy)."""
        timing, pending = Timing(), []
        for k, s in enumerate(steps):
            if s["action"] in ("offload", "prefetch"):
                pending.append(k)
            elif s["action"] == "compute" and pending:
                timing.waits[k], pending = pending, []
        return timing

    @staticmethod
    def of(steps: list[dict[str, Any]], spans: list[dict[str, Any]]) -> Timing:
        """The waits and gates the simulator's `spans` (of these steps) give."""
        at = {s["op"]: (s["lane"], float(s["start"]), float(s["end"])) for s in spans}
        moves = [k for k, s in enumerate(steps) if s["action"] in ("offload", "prefetch")]
        if not moves:
            return Timing()
        computes = [k for k, s in enumerate(steps) if s["action"] == "compute"]
        timing = Timing(durations={k: at[k][2] - at[k][1] for k in moves})
        done: set[int] = set()
        for c in computes:
            start = at[c][1]
            tol = EPS * max(1.0, abs(start))
            ready = [t for t in moves if t < c and t not in done and at[t][2] <= start + tol]
            done.update(ready)
            if ready:
                timing.waits[c] = ready
        for t in moves:
            if steps[t]["action"] == "prefetch":
                timing.gates[t] = Timing._gate(t, at[t][1], computes, at)
        return timing

    @staticmethod
    def _gate(t: int, start: float, computes: list[int], at: dict[int, tuple[str, float, float]]) -> int:
        """The step before which a transfer starting at `start` may allocate: the compute it
        overlaps, else the compute after the last one that ended by `start` (never before
        the transfer's own step)."""
        tol = EPS * max(1.0, abs(start))
        before = [c for c in computes if at[c][1] <= start + tol]
        if not before:
            return t
        last = before[-1]
        if start + tol < at[last][2]:
            return max(last, t)
        later = [c for c in computes if c > last]
        return max(later[0] if later else t, t)


class Held:
    """A transfer in flight: its future (CPU) or event (CUDA), what it yields, and the
    device copy an offload releases when it is waited for."""

    def __init__(self, future: Future[Any] | None = None, event: Any = None, value: Any = None,
                 source: torch.Tensor | None = None) -> None:
        self.future, self.event, self.value, self.source = future, event, value, source


class CpuLinks:
    """The CPU's links: one worker thread each, throttled to the simulated durations."""

    def __init__(self) -> None:
        self.d2h = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pebble-d2h")
        self.h2d = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pebble-h2d")

    @staticmethod
    def _throttled(work: Any, seconds: float) -> Any:
        t0 = time.perf_counter()
        out = work()
        left = seconds - (time.perf_counter() - t0)
        if left > 0:
            time.sleep(left)
        return out

    def offload(self, t: torch.Tensor, seconds: float) -> Held:
        """Copies `t` to a host buffer. `t` (the device copy) is released when the main
        thread waits for the copy: where the simulator ends it, not sooner, so that the
        memory follows the simulator's timeline whatever the threads' pace."""
        holder = [t.detach()]

        def copy() -> tuple[Any, torch.dtype, torch.Size, tuple[int, ...]]:
            src = holder.pop()
            return (src.contiguous().view(-1).view(torch.uint8).numpy().copy(), src.dtype, src.shape, src.stride())

        return Held(self.d2h.submit(self._throttled, copy, seconds), source=t)

    def prefetch(self, host: Held, into: torch.Tensor, seconds: float) -> Held:
        """Copies `host`'s bytes into `into` (allocated by the caller, on the main thread,
        where MemTracker sees it) once the offload that made them has ended."""

        def copy() -> None:
            raw, dtype, shape, _ = host.future.result()  # type: ignore[union-attr]
            into.copy_(torch.from_numpy(raw).view(dtype).view(shape))

        return Held(self.h2d.submit(self._throttled, copy, seconds), value=into)

    def let_go(self, offload: Held) -> None:
        """The device copy an offload moved is released: once the offload has ended (the
        link's thread holds the copy until then), as the simulator ends every offload
        before a prefetch of its data starts. Where the thread lags the simulated timeline,
        the main thread waits here rather than hold both copies."""
        assert offload.future is not None
        offload.future.result()
        offload.source = None

    def wait(self, held: Held) -> Any:
        """What the transfer yields, once it has ended; the handle lets go of it and of the
        device copy an offload moved."""
        assert held.future is not None
        out = held.future.result()
        held.source = None
        if held.value is not None:
            out, held.value = held.value, None
        return out


class CudaLinks:
    """CUDA's links: a side stream each, into pinned host memory, ordered with events."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.d2h = torch.cuda.Stream(device)
        self.h2d = torch.cuda.Stream(device)

    def offload(self, t: torch.Tensor, seconds: float) -> Held:
        main = torch.cuda.current_stream(self.device)
        self.d2h.wait_stream(main)  # `t` is computed
        with torch.cuda.stream(self.d2h):
            host = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu", pin_memory=True)
            host.copy_(t, non_blocking=True)
            t.record_stream(self.d2h)  # its memory is reused only once the copy ends
            event = torch.cuda.Event()
            event.record(self.d2h)
        return Held(event=event, value=host, source=t)  # `t` released when waited for, as on the CPU

    def prefetch(self, host: Held, into: torch.Tensor, seconds: float) -> Held:
        main = torch.cuda.current_stream(self.device)
        self.h2d.wait_stream(main)  # `into` is allocated
        assert host.event is not None
        self.h2d.wait_event(host.event)
        with torch.cuda.stream(self.h2d):
            into.copy_(host.value, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.h2d)
        into.record_stream(self.h2d)
        return Held(event=event, value=into)

    def let_go(self, offload: Held) -> None:
        """The device copy an offload moved is released: the allocator reuses it once the
        side stream's copy has ended (`record_stream`), without the host waiting."""
        offload.source = None

    def wait(self, held: Held) -> Any:
        torch.cuda.current_stream(self.device).wait_event(held.event)
        held.source = None
        if held.future is None and held.value is not None and held.value.device.type == "cpu":
            return held.value  # an offload's host copy: kept for its prefetch
        out, held.value = held.value, None
        return out


def links_for(device: torch.device) -> CpuLinks | CudaLinks:
    return CudaLinks(device) if device.type == "cuda" else CpuLinks()


def measure(device: torch.device, nbytes: int = 32 << 20, repeats: int = 5) -> dict[str, float]:
    """The links as this executor moves bytes on `device`: {"bandwidth" (bytes/s),
    "latency" (s)}, from offloads and prefetches of a small and a large tensor (medians of
    `repeats`), the hand-offs to the link included: what the planner should count for a
    transfer, where the profile names no link."""
    links = links_for(device)

    def round_trip(n: int) -> float:
        t = torch.ones(max(n // 4, 1), device=device)
        out = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            held = links.offload(t, 0.0)
            links.wait(held)
            back = links.prefetch(held, torch.empty_like(t), 0.0)
            links.wait(back)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            out.append((time.perf_counter() - t0) / 2)
        return sorted(out[1:])[repeats // 2]

    small, large = round_trip(4096), round_trip(nbytes)
    return {"bandwidth": nbytes / max(large - small, 1e-9), "latency": small}

