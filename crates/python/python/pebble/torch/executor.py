"""Run a lowered graph program in PyTorch: an interpreter inside a `torch.autograd.Function`.

Its forward runs the program's steps up to the loss and returns the model's outputs; its
backward receives the outputs' gradients (pebble's loss node produces them) and runs the
rest, recomputations included. `Compute` runs the compute node's FX nodes on an
environment (FX node -> value) and drops what the node does not keep; `Free` deletes every
value in that storage; `Offload`/`Prefetch` move the storage to a host copy and back,
beside the compute (`_links`).

Parameter gradients are made by their backward nodes (the graph's
`param_grads_from_backward`, as autograd makes `.grad`): where a `.grad` is None, the
produced gradient becomes it as soon as its compute node makes it (eager keeps the first
gradient it gets too); a `.grad` the user kept (`zero_grad(set_to_none=False)`, or
accumulation over micro-batches) is added to, as eager accumulates. The Function returns
None for the parameters, so autograd's own accumulation (and its hooks on parameters) does
not run.

Buffers the model updates in place (BatchNorm's running statistics) are written once per
step, in place, when the forward first computes their new values (a temporary of that
compute node); the capture makes sure nothing else depends on their old values, so a
recomputation, which reads the updated buffer, gives the same results.

Recomputation gives the same values because the capture refuses random ops in training
mode (dropout must be off: p=0 or eval()); RNG is not replayed.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.fx as fx

from ._fx import drops, lays_out, run_node
from ._links import CpuLinks, CudaLinks, Held, Timing, links_for
from .errors import PlanError

if TYPE_CHECKING:
    from .capture import Captured


class Program:
    """A lowered program bound to a captured graph: what each step touches."""

    def __init__(self, cap: Captured, steps: list[dict[str, Any]], spans: list[dict[str, Any]] | None = None) -> None:
        """`spans`: the simulator's timeline of these steps, which orders the transfers
        against the compute (`_links`); without it each transfer ends before the next
        compute step."""
        self.cap, self.steps = cap, steps
        self.timing = Timing.of(steps, spans) if spans is not None else Timing.in_order(steps)
        self._links: dict[torch.device, CpuLinks | CudaLinks] = {}
        losses = [k for k, s in enumerate(steps) if s["action"] == "compute" and s["node"] == cap.loss]
        if len(losses) != 1:
            raise PlanError(f"the program runs the loss {len(losses)} times")
        self.loss_at = losses[0]
        self.param_of = cap.param_grads
        self.grad_data = {n: d for d, ms in enumerate(cap.members) for n in ms if n in cap.param_grads}
        self._drops: dict[tuple[int, bool], list[list[fx.Node]]] = {}

    def links(self, device: torch.device) -> CpuLinks | CudaLinks:
        if device not in self._links:
            self._links[device] = links_for(device)
        return self._links[device]

    def drops(self, node: int, no_grad: bool) -> list[list[fx.Node]]:
        key = (node, no_grad)
        if key not in self._drops:
            self._drops[key] = drops(self.cap.groups[node].nodes, self.kept(node, no_grad))
        return self._drops[key]

    def kept(self, node: int, no_grad: bool) -> set[fx.Node]:
        out: set[fx.Node] = set()
        for d in self.cap.groups[node].outputs:
            if not (no_grad and self.cap.kinds[d] == "saved"):
                out.update(self.cap.members[d])
        return out


class Run:
    """One training step of a program: its environment, host copies and gradients."""

    def __init__(self, program: Program, params: dict[str, torch.Tensor]) -> None:
        self.p, self.cap = program, program.cap
        self.params = params
        self.env: dict[fx.Node, Any] = {}
        self.timing = program.timing
        self.k = 0  # the step running
        self.host: dict[int, tuple[Held, torch.Size, tuple[int, ...], torch.dtype, torch.device]] = {}
        self.gated: dict[int, list[tuple[int, int]]] = {}  # gate step -> (prefetch step, data)
        self.inflight: dict[int, tuple[int, Held, torch.device]] = {}  # prefetch step -> (data, copy)
        self.outbound: dict[int, tuple[Held, torch.device]] = {}  # offload step -> copy, not waited for
        self.pending = {node: name for node, name in program.cap.mutations}  # buffers not updated yet

    def forward(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        cap, env = self.cap, self.env
        for node, name in cap.params:
            env[node] = self.params[name]
        env.update(zip(cap.inputs, inputs))
        for n in cap.gm.graph.nodes:
            if n.op == "get_attr":
                env[n] = getattr(cap.gm, n.target)
        for n in cap.fixed:
            env[n] = run_node(n, env.__getitem__)
        self._steps(0, self.p.loss_at)
        if self.pending:
            names = ", ".join(sorted(self.pending.values()))
            raise PlanError(f"the plan's forward never makes the new values of buffers {names}")
        outs = [env[o] for o in cap.outputs]
        # The Function's outputs get its backward as their grad_fn, which holds this run:
        # the environment keeps aliases without it, or a forward whose backward never runs
        # would keep every tensor of the step until the garbage collector found the cycle.
        env.update((o, env[o].detach()) for o in cap.outputs)
        return outs

    def backward(self, grads: Sequence[torch.Tensor | None]) -> None:
        cap, env = self.cap, self.env
        self.k = self.p.loss_at
        self._before_compute(self.k, cap.loss)  # the transfers ended before the loss, first
        for t, k in zip(cap.tangents, cap.tangent_of):  # (the loss node's outputs)
            g = grads[k]
            env[t] = g.contiguous() if g is not None else torch.zeros_like(env[cap.outputs[k]])
        self._compute(cap.loss, False)
        self._steps(self.p.loss_at + 1, len(self.p.steps))
        self._drain()
        env.clear()
        self.host.clear()

    def _steps(self, start: int, end: int) -> None:
        for self.k in range(start, end):
            s = self.p.steps[self.k]
            act = s["action"]
            if act == "compute":
                if self.timing.waits or self.gated or self.inflight:
                    self._before_compute(self.k, s["node"])
                self._compute(s["node"], bool(s.get("no_grad", False)))
            elif act == "free":
                self._free(s["data"])
            elif act == "offload":
                self._offload(s["data"])
            elif act == "prefetch":
                self._prefetch(s["data"])
            else:
                raise PlanError(f"unknown step {s}")

    def _compute(self, node: int, no_grad: bool) -> None:
        """Runs a compute node's FX nodes. Values already resident (a saved tensor kept while
        its forward reruns without grad) are neither recomputed nor dropped."""
        env, grads = self.env, self.p.param_of
        nodes = self.cap.groups[node].nodes
        resident = {n for n in nodes if n in env}
        landed = []
        for n, after in zip(nodes, self.p.drops(node, no_grad)):
            if n not in resident:
                try:
                    env[n] = run_node(n, env.__getitem__)
                except KeyError as e:
                    raise PlanError(self._missing(node, e.args[0])) from None
                if n in grads:
                    self._accumulate(grads[n], env[n])
                    landed.append(n)
                elif n in self.pending:  # BatchNorm's running statistics: in place, once, as eager
                    self.params[self.pending.pop(n)].copy_(env[n])
            for m in after:
                if m not in resident:
                    del env[m]
        for n in landed:  # the `.grad` holds the gradient now (nothing reads it here)
            for m in self.cap.members[self.p.grad_data[n]] if n in self.p.grad_data else [n]:
                env.pop(m, None)

    def _missing(self, node: int, value: Any) -> str:
        d = next((d for d, m in enumerate(self.cap.members) if value in m), None)
        what = f"data node {d} `{self.cap.graph['data'][d]['name']}`" if d is not None else f"`{value}`"
        name = self.cap.graph["compute"][node]["name"]
        return f"compute node {node} `{name}` reads {what}, which is not resident (the executor and the lowering disagree)"

    def _accumulate(self, name: str, g: torch.Tensor) -> None:
        """A parameter's gradient as its backward node makes it: the `.grad` itself where
        there is none yet (as eager keeps the first gradient it gets; copied into the
        parameter's layout where it is a view or laid out otherwise: the capture counts that
        copy as the node's temporary), added into the `.grad` there is (the user's, or a
        tied parameter's earlier producer)."""
        p = self.params[name]
        if p.grad is not None:
            p.grad.add_(g)
        elif lays_out(g, p):
            p.grad = g.detach()
        else:  # in the parameter's layout (a transposed product, say), as eager does
            p.grad = torch.empty_like(p).copy_(g)

    def _free(self, d: int) -> None:
        for m in self.cap.members[d]:
            self.env.pop(m, None)

    def _offload(self, d: int) -> None:
        t = self.env[self.cap.members[d][0]]
        held = self.p.links(t.device).offload(t, self.timing.durations.get(self.k, 0.0))
        self.host[d] = (held, t.shape, t.stride(), t.dtype, t.device)
        self.outbound[self.k] = (held, t.device)
        del t
        self._free(d)

    def _prefetch(self, d: int) -> None:
        """Starts the copy back at its gate (now, or at a later step: see `_links`)."""
        gate = self.timing.gates.get(self.k, self.k)
        if gate <= self.k:
            self._start_prefetch(self.k, d)
        else:
            self.gated.setdefault(gate, []).append((self.k, d))

    def _start_prefetch(self, k: int, d: int) -> None:
        host, shape, stride, dtype, device = self.host.pop(d)
        self.p.links(device).let_go(host)  # the simulator starts a prefetch after the offload's end
        into = torch.empty_strided(shape, stride, dtype=dtype, device=device)
        held = self.p.links(device).prefetch(host, into, self.timing.durations.get(k, 0.0))
        self.inflight[k] = (d, held, device)

    def _arrive(self, k: int) -> None:
        """Prefetch step `k` has ended: its storage, and the views of it, are resident."""
        d, held, device = self.inflight.pop(k)
        members = self.cap.members[d]
        root = members[0]
        self.env[root] = self.p.links(device).wait(held)
        wanted = set(members)
        made: list[fx.Node] = []
        source = {root}
        for n in self._producer_nodes(d):  # views of the storage (and their splits), re-made on the copy
            if n is root or not any(m in source for m in n.all_input_nodes):
                continue  # not derived from the storage (a multi-output op's other results)
            if n in wanted or any(u in wanted for u in n.users):
                self.env[n] = run_node(n, self.env.__getitem__)
                source.add(n)
                made.append(n)
        for n in made:  # (only what this prefetch made: the group's other outputs stay)
            if n not in wanted:
                self.env.pop(n, None)

    def _before_compute(self, k: int, node: int) -> None:
        """Starts the prefetches gated at step `k`; waits for the transfers the simulator
        ends before it, and for any prefetch of what it reads."""
        for pk, d in self.gated.pop(k, []):
            self._start_prefetch(pk, d)
        for t in self.timing.waits.get(k, []):
            if t in self.inflight:
                self._arrive(t)
            elif t in self.outbound:
                held, device = self.outbound.pop(t)
                self.p.links(device).wait(held)
        reads = set(self.cap.graph["compute"][node]["inputs"])
        for gate, moves in list(self.gated.items()):  # (the timeline's rounding aside: none)
            for pk, d in [m for m in moves if m[1] in reads]:
                moves.remove((pk, d))
                self._start_prefetch(pk, d)
            if not moves:
                del self.gated[gate]
        for t in [t for t, (d, _, _) in self.inflight.items() if d in reads]:
            self._arrive(t)

    def _drain(self) -> None:
        """Every transfer of the step has ended (errors raised here)."""
        for moves in self.gated.values():
            for pk, d in moves:
                self._start_prefetch(pk, d)
        self.gated.clear()
        for k in list(self.inflight):
            self._arrive(k)
        for held, device in self.outbound.values():
            self.p.links(device).wait(held)
            if held.event is not None:
                held.event.synchronize()
        self.outbound.clear()

    def _producer_nodes(self, d: int) -> list[fx.Node]:
        root = self.cap.members[d][0]
        for grp in self.cap.groups:
            if root in grp.nodes:
                return grp.nodes
        return []


class _Step(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, run: Run, n_inputs: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        outs = run.forward(tensors[:n_inputs])
        ctx.run, ctx.count = run, len(tensors)
        ctx.mark_non_differentiable(*[o for o in outs if not o.is_floating_point()])
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[None, ...]:  # type: ignore[override]
        run, ctx.run = ctx.run, None
        with torch.no_grad():
            run.backward(grads)
        return (None,) * (2 + ctx.count)


class _TimedRun(Run):
    """A run that adds each compute step's wall time (device synchronized) to `times`."""

    def __init__(self, program: Program, params: dict[str, torch.Tensor], times: list[float]) -> None:
        super().__init__(program, params)
        self.times = times
        self.device = next((t.device for t in params.values()), torch.device("cpu"))

    def _compute(self, node: int, no_grad: bool) -> None:
        _sync(self.device)
        t0 = time.perf_counter()
        super()._compute(node, no_grad)
        _sync(self.device)
        self.times[node] += time.perf_counter() - t0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile(program: Program, model: torch.nn.Module, inputs: Sequence[torch.Tensor], repeats: int = 3) -> list[float]:
    """Each compute node's time as this executor runs `program` (store-all's: one run of
    each node) in a step as the user runs it (`sum(outputs).backward()`): the median over
    `repeats` steps after a warm-up, interpretation and the gradients' landing included.
    What the step takes beyond its compute steps (the forward's set-up, the frees,
    autograd's hand-over) is the loss node's, which every plan runs once. Runs on aliases
    of the parameters (the model's `.grad` untouched) and copies of the buffers: the
    model is left as it was."""
    named = dict(model.named_parameters())
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    samples: list[list[float]] = []
    for k in range(repeats + 1):
        times = [0.0] * len(program.cap.groups)
        params = {n: p.detach().requires_grad_(p.requires_grad) for n, p in named.items()} | buffers
        run = _TimedRun(program, params, times)
        _sync(run.device)
        t0 = time.perf_counter()
        outs = _launch(run, inputs)
        sum(o.sum() for o in outs if o.is_floating_point()).backward()
        _sync(run.device)
        times[program.cap.loss] += max(time.perf_counter() - t0 - sum(times), 0.0)
        if k:
            samples.append(times)
    return [statistics.median(s) for s in zip(*samples)]


def execute(program: Program, params: dict[str, torch.Tensor], inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """One step's forward; its backward runs when autograd reaches the outputs."""
    return _launch(Run(program, params), inputs)


def _launch(run: Run, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """`run`'s forward inside the autograd Function, whose backward runs the rest."""
    trainable = [run.params[name] for name in run.cap.param_grads.values()]
    return _Step.apply(run, len(inputs), *inputs, *trainable)
