"""Capture an `nn.Module` as pebble's training graph.

How: AOTAutograd's `aot_function` over `functional_call(model, params, inputs)`, with a
`partition_fn` that keeps the joint forward+backward graph and stops there (nothing is
compiled or run by AOTAutograd). Why this entry point:

* the joint graph is functional aten ops with shapes (`meta["val"]`), parameters and
  inputs as `primals_*` placeholders, and the gradients of the model's outputs as
  `tangents_*` placeholders: exactly pebble's loss boundary, since the user computes the
  loss outside the model (`planned(x).sum().backward()`);
* `aot_export_module(trace_joint=True)` needs the model to return a scalar loss, and
  `torch.export` gives the forward alone;
* we choose the primals' order (parameters, buffers, then inputs), so no guessing which
  placeholder is which, as `torch.compile`'s lifted inputs would need.

Tracing runs under export's compiling flags (what `torch.export(strict=False)` sets), so
libraries such as `transformers` take their trace-friendly paths.

The graph is then run once on the sample inputs (with all-ones tangents), which gives the
storages: every FX value is assigned to the storage it lives in, and one pebble data node
is one storage (a view costs nothing and lives as long as its base). Views run in the
compute node that creates their storage; views of parameters and inputs run once per step
before the first compute node. Forward aten nodes are grouped by `meta["seq_nr"]` (the
autograd node they belong to); backward aten nodes by the forward group whose `seq_nr`
they carry. A node that reads a group begun after its own joins that group (a gradient
accumulation runs with its last contribution), so the groups never wait on each other.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

import torch
import torch.fx as fx
from torch.fx.node import map_arg
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

from . import _links, _planner, costs, executor
from ._fx import drops, lays_out
from ._grouping import FIXED, LOSS, Grouping, Key
from .errors import UnsupportedModel

RANDOM_OPS = ("native_dropout", "bernoulli", "rand", "randn", "randint", "normal", "uniform", "multinomial")


@dataclass
class Group:
    """The FX nodes of one pebble compute node, in graph order."""

    kind: str  # "forward" | "backward" | "loss"
    nodes: list[fx.Node]
    forward: int | None = None
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)


@dataclass
class Captured:
    """A captured model: the joint graph, pebble's graph, and how one maps to the other."""

    gm: fx.GraphModule
    graph: dict[str, Any]
    groups: list[Group]
    members: list[list[fx.Node]]  # data id -> the FX values in that storage
    kinds: list[str]  # data id -> pebble data kind
    params: list[tuple[fx.Node, str]]  # parameter and buffer placeholders, by name
    inputs: list[fx.Node]
    tangents: list[fx.Node]
    tangent_of: list[int]  # the output each tangent is the gradient of
    outputs: list[fx.Node]
    param_grads: dict[fx.Node, str]  # the joint's gradient output -> parameter name
    fixed: list[fx.Node]  # views of parameters and inputs, run once per step
    out_spec: TreeSpec
    in_spec: TreeSpec
    loss: int
    mutations: list[tuple[fx.Node, str]] = field(default_factory=list)  # a buffer's new value, its name
    link: dict[str, float] | None = None  # the links measured on the device ("profile" times)

    @property
    def fixed_bytes(self) -> int:
        """Parameters and the inputs: resident before the step starts (the parameters'
        gradients are made by the backward, as autograd makes `.grad`)."""
        return sum(d["size"] for d in self.graph["data"] if d["kind"] in ("parameter", "input"))


class _Grabbed(Exception):
    pass


def _trace_joint(model: torch.nn.Module, flat: list[torch.Tensor], in_spec: TreeSpec) -> tuple[fx.GraphModule, int, TreeSpec, list[str], int, list[int]]:
    from torch._export.utils import _compiling_state_context
    from torch._functorch._aot_autograd.functional_utils import has_data_mutation, is_fun
    from torch._functorch.aot_autograd import aot_function
    from torch.func import functional_call

    state: dict[str, Any] = {}
    params = dict(model.named_parameters())
    names = list(params) + [n for n, _ in model.named_buffers()]
    tensors = list(params.values()) + [b for _, b in model.named_buffers()]

    def fn(*primals: torch.Tensor) -> list[torch.Tensor]:
        inputs = tree_unflatten(list(primals[len(names):]), in_spec)
        out = functional_call(model, dict(zip(names, primals[: len(names)])), tuple(inputs))
        leaves, state["spec"] = tree_flatten(out)
        state["leaves"] = len(leaves)
        # The primals the model mutates (BatchNorm's running statistics): AOTAutograd
        # returns their new values first among the forward outputs, in primal order.
        state["mutated"] = [i for i, p in enumerate(primals) if is_fun(p) and has_data_mutation(p)]
        bad = sorted({type(x).__name__ for x in leaves if not isinstance(x, torch.Tensor)})
        if bad:
            raise UnsupportedModel(f"the model's outputs must be tensors (in tuples, lists or dicts); found {', '.join(bad)}")
        return leaves

    def grab(joint: fx.GraphModule, _inputs: Any, *, num_fwd_outputs: int, **_kw: Any) -> Any:
        state["joint"], state["nfwd"] = joint, num_fwd_outputs
        raise _Grabbed

    def never(*_a: Any) -> Any:
        raise AssertionError("not compiled")

    try:
        with _compiling_state_context():
            aot_function(fn, fw_compiler=never, partition_fn=grab)(*tensors, *flat)
    except _Grabbed:
        pass
    except UnsupportedModel:
        raise
    except Exception as e:  # the tracer's own errors: data-dependent control flow, unknown ops
        raise UnsupportedModel(f"AOTAutograd could not trace the model: {type(e).__name__}: {e}") from e
    if "joint" not in state:
        raise UnsupportedModel("no joint graph: no parameter or input of the model requires grad")
    mutated = state["mutated"]
    if any(i >= len(names) for i in mutated):
        raise UnsupportedModel("the model mutates its inputs in place; only buffers (BatchNorm's statistics) may be")
    if state["nfwd"] != len(mutated) + state["leaves"]:
        raise UnsupportedModel(f"{state['nfwd']} forward outputs for {state['leaves']} outputs and "
                               f"{len(mutated)} mutated buffers (outputs that alias inputs?)")
    return state["joint"], state["nfwd"], state["spec"], names, len(params), mutated


def _storage_key(t: torch.Tensor) -> Hashable:
    st = t.untyped_storage()
    return (t.device, st.data_ptr()) if st.nbytes() > 0 else ("empty", id(t))


def _run(gm: fx.GraphModule, values: Sequence[Any]) -> dict[fx.Node, Any]:
    """Runs the joint graph on real values; keeps every value (their storages tell aliasing)."""
    env: dict[fx.Node, Any] = {}
    it = iter(values)
    with torch.no_grad():
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                env[n] = next(it)
            elif n.op == "get_attr":
                env[n] = operator.attrgetter(n.target)(gm)
            elif n.op == "call_function":
                env[n] = n.target(*map_arg(n.args, env.__getitem__), **map_arg(n.kwargs, env.__getitem__))
    return env


def _ancestors(outs: Sequence[fx.Node]) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = list(outs)
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return seen


def _storages(nodes: list[fx.Node], env: dict[fx.Node, Any]) -> tuple[dict[fx.Node, int], list[list[fx.Node]]]:
    """Each tensor value's storage (an index), and each storage's values, creator first."""
    cls: dict[fx.Node, int] = {}
    members: list[list[fx.Node]] = []
    by_key: dict[Hashable, int] = {}
    for n in nodes:
        v = env.get(n)
        if isinstance(v, torch.Tensor):
            c = by_key.setdefault(_storage_key(v), len(members))
            if c == len(members):
                members.append([])
            cls[n] = c
            members[c].append(n)
    return cls, members


def _check_ops(nodes: list[fx.Node], training: bool) -> None:
    for n in nodes:
        name = getattr(n.target, "__name__", str(n.target)).split(".")[0]
        if n.op == "call_function" and name in RANDOM_OPS and training:
            raise UnsupportedModel(
                f"`{n.target}` draws random numbers (dropout?): a recomputation would draw new ones; "
                "set the dropout probabilities to 0 or call model.eval()"
            )
        if n.op == "call_function" and not isinstance(n.target, (torch._ops.OpOverload, type(operator.getitem))):
            raise UnsupportedModel(f"`{n.format_node()}` is not an aten op")


_BATCH_NORM = ("_native_batch_norm_legit_functional", "native_batch_norm")


def _check_mutations(j: "_Joint") -> None:
    """The executor writes each mutated buffer's new value into it as soon as the forward
    first makes it (as eager does); a recomputation then reads the new value. That
    is exact only if nothing but the buffers' new values depends on the old ones: here
    BatchNorm in training mode (its output and batch statistics read the batch alone) and
    counters (`num_batches_tracked`). Anything else that reads a mutated buffer is refused."""
    news = {v for v, _ in j.mutations}
    node_of = {name: node for node, name in j.params}
    for name in {name for _, name in j.mutations}:
        depends: list[fx.Node] = []  # what reads the old value, BatchNorm's outputs aside
        seen, stack = set(), [node_of[name]]
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            for u in n.users:
                op = _op_name(u)
                if op in _BATCH_NORM and u.args[5] is True and n in u.args[3:5] and not any(a in seen for a in u.args[:3]):
                    # training: only the new running statistics (items 3 and 4) read them
                    stack.extend(w for w in u.users if w.target is operator.getitem and w.args[1] in (3, 4))
                elif op == "native_batch_norm_backward" and u.args[7] is True and n in u.args[3:5] \
                        and not any(a in seen for a in (*u.args[:3], *u.args[5:7])):
                    pass  # training: reads the saved batch statistics, not the running ones
                elif u.op != "output":
                    depends.append(u)
                    stack.append(u)
        bad = [n for n in depends if not _only_feeds(n, news)]
        if bad:
            raise UnsupportedModel(f"`{bad[0].format_node()}` reads buffer `{name}`, which the model updates in "
                                   "place: a recomputation would read the updated value")


def _only_feeds(n: fx.Node, news: set[fx.Node]) -> bool:
    """Whether everything `n` flows into is a buffer's new value."""
    stack, seen = [n], set()
    while stack:
        m = stack.pop()
        if m in seen:
            continue
        seen.add(m)
        if m in news:
            continue
        users = list(m.users)
        if not users or any(u.op == "output" for u in users):
            return False
        stack.extend(users)
    return True


class _Joint:
    """The joint graph run once on the sample inputs: its nodes' roles and storages."""

    def __init__(self, gm: fx.GraphModule, env: dict[fx.Node, Any], nfwd: int, names: list[str], nparams: int,
                 mutated: list[int]):
        self.gm, self.env = gm, env
        self.nodes = list(gm.graph.nodes)
        holders = [n for n in self.nodes if n.op == "placeholder"]
        self.tangents = [n for n in holders if n.name.startswith("tangents")]
        primals = [n for n in holders if not n.name.startswith("tangents")]
        self.params = list(zip(primals[: len(names)], names))
        self.inputs = primals[len(names):]
        out = self.nodes[-1].args[0]
        self.mutations: list[tuple[fx.Node, str]] = [(v, names[i]) for v, i in zip(out, mutated)]
        self.outputs: list[fx.Node] = list(out[len(mutated):nfwd])
        grads = list(out[nfwd:])
        if any(g is not None for g in grads[len(names):]):
            raise UnsupportedModel("inputs that require grad are not supported yet")
        trainable = {p for p, _ in self.params[:nparams]}
        self.param_grads = {g: name for (p, name), g in zip(self.params, grads) if g is not None and p in trainable}
        self.cls, self.members = _storages(self.nodes, env)
        self.roots = [m[0] for m in self.members]

    def tangent_of(self) -> list[int]:
        """The output each tangent is the gradient of: AOTAutograd gives one per floating output."""
        floating = [k for k, o in enumerate(self.outputs) if self.env[o].is_floating_point()]
        if len(floating) != len(self.tangents):
            raise UnsupportedModel(f"{len(self.tangents)} output gradients for {len(floating)} floating outputs")
        return floating

    def nbytes(self, c: int) -> int:
        return int(self.env[self.roots[c]].untyped_storage().nbytes())

    def grad_copy_bytes(self, n: fx.Node) -> int:
        """The bytes of the `.grad` the executor copies gradient `n` into (the parameter's
        layout, as eager keeps it), or 0 where it keeps `n` itself (`executor.lays_out`)."""
        if n not in self.param_grads:
            return 0
        param = self.env[next(p for p, name in self.params if name == self.param_grads[n])]
        return 0 if lays_out(self.env[n], param) else param.numel() * param.element_size()

    def grouping(self) -> Grouping:
        forward = _ancestors([*self.outputs, *(v for v, _ in self.mutations)])
        g = Grouping(self.nodes, self.env, self.cls, self.roots, set(self.tangents), forward)
        g.assign()
        g.untangle("fwd")
        g.link_backward()
        g.untangle("bwd")
        return g


def _groups(j: _Joint, g: Grouping) -> tuple[list[Group], dict[Key, int]]:
    fwd, bwd = g.ordered("fwd"), g.ordered("bwd")
    byf, byb = g.keys("fwd"), g.keys("bwd")
    loss = [n for n in j.nodes if n.op == "call_function" and g.group(n) == LOSS]
    groups = [Group("forward", byf[k]) for k in fwd] + [Group("loss", loss)] + [Group("backward", byb[k]) for k in bwd]
    cid = {k: i for i, k in enumerate([*fwd, LOSS, *bwd])}
    for k in bwd:
        links = [cid[f] for f in g.forwards_of(k) if f in cid]
        groups[cid[k]].forward = max(links) if links else None
    return groups, cid


class _Data:
    """Pebble's data nodes: one per storage that outlives its compute node, one per
    parameter gradient."""

    def __init__(self, j: _Joint, g: Grouping, groups: list[Group], cid: dict[Key, int]):
        self.j, self.groups = j, groups
        self.producer = [None if g.group(r) == FIXED else cid[g.group(r)] for r in j.roots]
        self.readers: list[set[int]] = [set() for _ in j.roots]
        for i, grp in enumerate(groups):
            for n in grp.nodes:
                for m in n.all_input_nodes:
                    c = j.cls.get(m)
                    if c is not None and self.producer[c] != i:
                        self.readers[c].add(i)
        self.loss = cid[LOSS]
        for o in j.outputs:  # (a buffer's new value is read by no one: the executor applies it when made)
            self.readers[j.cls[o]].add(self.loss)
        self.nodes: list[dict[str, Any]] = []
        self.members: list[list[fx.Node]] = []
        self.of_class: dict[int, int] = {}
        names = {p: name for p, name in j.params}
        for c, r in enumerate(j.roots):
            kind = self.kind(c)
            if kind is not None:
                self.of_class[c] = self.add(names.get(r, r.name), kind, j.nbytes(c), j.members[c])
        self.param_grad: dict[fx.Node, int] = {}
        params = {name: p for p, name in j.params}
        for gnode, name in j.param_grads.items():
            p = j.env[params[name]]
            self.param_grad[gnode] = self.add(f"{name}.grad", "param_grad", p.numel() * p.element_size(), [])

    def add(self, name: str, kind: str, size: int, members: list[fx.Node]) -> int:
        self.nodes.append({"name": name, "kind": kind, "size": size})
        self.members.append(members)
        return len(self.nodes) - 1

    def kind(self, c: int) -> str | None:
        r, p, readers = self.j.roots[c], self.producer[c], self.readers[c]
        if r.op == "get_attr":
            return None
        if r.op == "placeholder":
            return "gradient" if r in self.j.tangents else "input" if r in self.j.inputs else "parameter"
        if not readers:
            return None  # a temporary of its compute node
        if self.groups[p].kind != "forward":
            return "gradient"
        only_own_backward = all(self.groups[i].kind == "backward" and self.groups[i].forward == p for i in readers)
        return "saved" if only_own_backward else "activation"

    def wire(self) -> None:
        """Each compute node's inputs and outputs (data ids)."""
        for c, d in self.of_class.items():
            if self.producer[c] is not None:
                self.groups[self.producer[c]].outputs.append(d)
            for i in sorted(self.readers[c]):
                self.groups[i].inputs.append(d)
        for gnode, d in self.param_grad.items():
            self.groups[self._group_of(gnode)].outputs.append(d)

    def _group_of(self, n: fx.Node) -> int:
        if n.op == "placeholder":
            return self.loss  # the gradient of a parameter is an output's gradient as it is
        return next(i for i, grp in enumerate(self.groups) if n in grp.nodes)

    def kept(self, i: int, no_grad: bool) -> set[fx.Node]:
        """The values compute node `i` leaves in the environment."""
        out: set[fx.Node] = set()
        for d in self.groups[i].outputs:
            if not (no_grad and self.nodes[d]["kind"] == "saved"):
                out.update(self.members[d])
        return out


def _tmp(j: _Joint, nodes: list[fx.Node], kept: set[fx.Node]) -> int:
    """A compute node's temporary bytes as the simulator counts them: beside all its outputs,
    allocated at its start. So the most bytes alive at once (its own temporaries, and the
    outputs made so far) less the outputs' bytes: an output made last, beside temporaries
    already gone, costs no temporary memory."""
    live: dict[int, list[int]] = {}
    made: dict[int, int] = {}  # output class -> the index that makes it
    copies = {i: j.grad_copy_bytes(n) for i, n in enumerate(nodes)}  # a `.grad` in its parameter's layout
    for i, after in enumerate(drops(nodes, kept)):
        c = j.cls.get(nodes[i])
        if c is not None and j.roots[c] is nodes[i]:
            if nodes[i] in kept:
                made.setdefault(c, i)
            else:
                live.setdefault(c, [i, i])
        for n in after:
            c = j.cls.get(n)
            if c in live:
                live[c][1] = max(live[c][1], i)
    outputs = sum(j.nbytes(c) for c in made)
    peak = 0
    for i in range(len(nodes)):
        alive = sum(j.nbytes(c) for c, (a, b) in live.items() if a <= i <= b) + sum(copies[a] for a in range(i + 1))
        peak = max(peak, alive + sum(j.nbytes(c) for c, a in made.items() if a <= i))
    return max(peak - outputs, 0)


def _op_name(n: fx.Node) -> str:
    return str(getattr(n.target, "__name__", n.target)).split(".")[0]


def _main_node(grp: Group, g: Grouping) -> fx.Node | None:
    ops = [n for n in grp.nodes if not g.is_alias(n) and n.target is not operator.getitem]
    return ops[0] if ops else (grp.nodes[0] if grp.nodes else None)


def _compute_json(grp: Group, i: int, g: Grouping, groups: list[Group], time: float, tmp: int) -> dict[str, Any]:
    main = _main_node(grp, g)
    name = main.name if main is not None else f"node{i}"
    if grp.kind == "loss":
        name = "loss"
    elif grp.kind == "backward" and grp.forward is not None:
        name = f"{json_name(groups, grp.forward, g)}.bwd"
    node: dict[str, Any] = {"name": name, "kind": grp.kind, "time": time, "tmp": tmp,
                            "inputs": sorted(set(grp.inputs)), "outputs": sorted(set(grp.outputs))}
    if main is not None and grp.kind != "loss":
        node["op"] = _op_name(main)
    if grp.forward is not None:
        node["forward"] = grp.forward
    return node


def json_name(groups: list[Group], i: int, g: Grouping) -> str:
    main = _main_node(groups[i], g)
    return main.name if main is not None else f"node{i}"


def _tangents(gm: fx.GraphModule) -> list[torch.Tensor]:
    out = []
    for n in gm.graph.nodes:
        if n.op == "placeholder" and n.name.startswith("tangents"):
            v = n.meta["val"]
            out.append(torch.ones(v.shape, dtype=v.dtype, device=v.device))
    return out


def capture(model: torch.nn.Module, args: tuple[Any, ...], *, times: str = "profile", repeats: int = 3,
            rates: tuple[float, float] = (1e11, 1e10), name: str | None = None) -> Captured:
    """Captures one training step of `model` on `args` as pebble's training graph.

    `times`: "profile" (each compute node timed on the sample's device as pebble's
    executor runs plain autograd's schedule, median of `repeats` steps, and the links as
    its offloads and prefetches move bytes: `link`) or "flops" (a roofline at `rates` =
    (FLOP/s, bytes/s); the links then are the profile's, or the abstract machine's).
    """
    flat, in_spec = tree_flatten(args)
    bad = sorted({type(a).__name__ for a in flat if not isinstance(a, torch.Tensor)})
    if bad:
        raise UnsupportedModel(f"the sample inputs must be tensors; found {', '.join(bad)}")
    gm, nfwd, out_spec, names, nparams, mutated = _trace_joint(model, flat, in_spec)
    nodes = list(gm.graph.nodes)
    _check_ops(nodes, model.training)
    primals = [*dict(model.named_parameters()).values(), *[b for _, b in model.named_buffers()], *flat]
    env = _run(gm, [*primals, *_tangents(gm)])
    j = _Joint(gm, env, nfwd, names, nparams, mutated)
    _check_mutations(j)
    g = j.grouping()
    groups, cid = _groups(j, g)
    data = _Data(j, g, groups, cid)
    data.wire()
    if times == "flops":
        lists = [grp.nodes if grp.kind != "loss" else [] for grp in groups]
        secs = costs.roofline(lists, env, *rates)
    elif times == "profile":
        secs = [0.0] * len(groups)  # measured below, on the captured graph's store-all run
    else:
        raise ValueError(f"times must be 'profile' or 'flops', not {times!r}")
    compute = [_compute_json(grp, i, g, groups, secs[i], _tmp(j, grp.nodes, data.kept(i, False)))
               for i, grp in enumerate(groups)]
    graph = {"name": name or type(model).__name__, "compute": compute, "data": data.nodes,
             "param_grads_from_backward": True}
    fixed = [n for n in nodes if n.op == "call_function" and g.group(n) == FIXED]
    cap = Captured(gm=gm, graph=graph, groups=groups, members=data.members, kinds=[d["kind"] for d in data.nodes],
                   params=j.params, inputs=j.inputs, tangents=j.tangents, tangent_of=j.tangent_of(), outputs=j.outputs,
                   param_grads=j.param_grads, fixed=fixed, out_spec=out_spec, in_spec=in_spec, loss=cid[LOSS],
                   mutations=j.mutations)
    if times == "profile":
        program = executor.Program(cap, _planner.program(graph, _planner.store_all(graph).schedule))
        for node, secs_of in zip(graph["compute"], executor.profile(program, model, flat, repeats)):
            node["time"] = secs_of
        device = flat[0].device if flat else next((p.device for p in model.parameters()), torch.device("cpu"))
        cap.link = _links.measure(device, repeats=repeats)
    return cap
