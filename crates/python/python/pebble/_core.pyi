"""Type stubs of `pebble._core`, the Rust extension (crates/python/src/lib.rs).

Every function takes and returns JSON text. Problems: `{"graph": <TrainingGraph>}`,
`{"chain": <Chain>}` or both (a graph and its chain view), in the serde formats of
`pebble_graph::TrainingGraph` (as `pebble graph` writes it) and `pebble_graph::Chain`
(rotor's `ftime, btime, x, xbar, ftmp, btmp`, optional `w, g, o, static_bytes, name`).
Schedules: as `pebble plan -o` writes them (`{"version", "view", "ops", ...}`).

Options (a JSON object, every field optional, an unknown one an error):
  "profile": str        a built-in profile (`profiles()`) or a JSON profile file: its machine
  "machine": {...}      a whole machine (`pebble_machine::Machine`), instead of a profile
  "time_limit": float   seconds: each MILP's limit; `auto`'s limit in all (default 60)
  "slots": int|"exact"  the DPs' memory discretization (default 500)
  "bandwidth": float    host<->device bytes per second, both directions
  "solvers": [str]      `auto` only: the solvers it may run
  "budget": int         `simulate` only: fail above this many bytes
  "timeline": bool      `simulate` only: record the memory timeline and spans
With neither profile nor machine: the abstract machine (no runtime reserve), as the CLI
plans a chain or graph file.

Budgets are bytes the plan may use, everything resident counted (what the simulator
checks); no runtime reserve is taken off.
"""

class PebbleError(ValueError):
    """Bad input (naming the argument and field), or pebble failed."""

    least_budget: int | None

class InfeasibleError(PebbleError):
    """No plan fits the budget; `least_budget`: the least budget that fits, or None."""

    least_budget: int | None

__version__: str

def solvers() -> str:
    """JSON list of {"name": str, "description": str, "views": ["chain" | "graph", ...]}."""

def profiles() -> str:
    """JSON list of the built-in profiles (each as `profile` gives it)."""

def profile(name: str) -> str:
    """A profile as JSON: {"name", "matmul_flops_f32", "matmul_flops_bf16", "vector_flops",
    "memory_bandwidth", "efficiency", "launch_seconds", "machine": {"device_memory",
    "host_memory", "d2h", "h2d", "devices", "interconnect", "cpu_optimizer_rate",
    "gpu_optimizer_rate", "runtime"}}. An unknown name raises PebbleError (did you mean)."""

def parse_size(size: str) -> int:
    """"6GiB", "512MB", "1.5GB", "1024" in bytes (binary units are powers of 1024)."""

def parse_budget(budget: str) -> str:
    """JSON {"bytes": int} or {"percent": float} ("50%")."""

def plan(problem: str, solver: str, budget: int, options: str = "{}") -> str:
    """Plans `problem` with `solver` within `budget` bytes.

    The view: the graph where the solver plans graphs and one is given, else the chain
    (given, or the graph's chain view, see `to_chain`). `auto` runs every applicable
    solver on every view the problem gives, within options.time_limit in all.

    Returns JSON {"solver": the solver asked, "winner": the solver whose plan it is (auto),
    "view": "chain" | "graph", "budget_bytes": int, "planned_at_bytes": int | None (a
    smaller budget the plan was made at, when the solver found none at the budget
    itself), "schedule": <Schedule>, "report": <SimReport: "makespan", "compute_time",
    "peak_bytes", "peak_host_bytes", "compute_ops", "d2h_busy", "h2d_busy", "cpu_busy",
    "compute_stall", "timeline", "spans", "periods">, "solve_seconds": float, "optimal":
    bool | None, "kept_from": str | None, "moves": {"offloads", "reloads", "recomputes"},
    "candidates": [] or, for auto, [{"solver", "view", "time": float | None,
    "peak_bytes": int | None, "solve_seconds", "optimal", "kept_from", "error": str |
    None}] in the order they ran}.

    Raises InfeasibleError (message and `least_budget`: the least feasible budget) when
    nothing fits, PebbleError on bad input or an unknown solver (naming it).
    """

def least_budget(problem: str, solver: str, options: str = "{}") -> int | None:
    """The least budget in bytes in which `solver` plans `problem` (bisection), or None."""

def lower(problem: str, schedule: str) -> str:
    """The program `schedule` means (pebble_schedule::lower), as JSON with "view".

    Graph: {"view": "graph", "steps": [{"op", "action": {"action": "compute", "node",
    "no_grad"} | {"action": "free" | "offload" | "prefetch", "data", "fraction"?},
    "reads", "creates", "accumulates", "fault": None | {"Missing": d} | {"Already": d}}],
    "ran": [bool per compute node]}.
    Chain: {"view": "chain", "ids": {"l", "weights", "grads", "states"}, "period_len",
    "periods", "on_cpu", "steps": [{"op", "action": {"action": "forward" | "loss" |
    "backward" | "cpu_update" | "free" | "offload" | "prefetch", ...}, "reads",
    "creates", "frees", "updates", "waits", "missing"}], "tensors": [{"tensor":
    {"activation": i} | ..., "bytes", "exists"} per id]}.
    An op the lowering refuses raises PebbleError naming it.
    """

def simulate(problem: str, schedule: str, options: str = "{}") -> str:
    """The simulator's report (as in `plan`'s "report"); a schedule it rejects (or one
    above options.budget) raises PebbleError saying why."""

def to_chain(graph: str) -> str | None:
    """The chain view of a training graph: JSON {"chain": <Chain>, "stages": [int per
    compute node: its block; the loss's is the chain length L]}, or None where the graph
    is not a sequence of blocks. A graph whose forward and backward nodes all carry a
    stage keeps its stages; any other is cut where a single activation crosses (each
    backward node joins the block of its `forward`)."""
