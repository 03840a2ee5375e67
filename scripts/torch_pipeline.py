"""Runs pebble pipeline plans on PyTorch ranks, and checks them against PyTorch's own.

For each plan (pebble's schedule JSON, for the split) and its export (the CSV of
`pebble pipeline ... --export torch`, `crates/schedule/src/torch.rs`), it trains one
step of a small MLP (one Linear layer per chain stage, ReLU between them, MSE loss)
split into the plan's stages, on P CPU ranks with the gloo backend:

  A. each rank loads the exported actions into PyTorch's schedule runtime
     (`_PipelineScheduleRuntime._load_csv`) and runs one step;
  B. PyTorch's own schedule on the same split, micro-batches and seed: `Schedule1F1B`
     when rank i runs stage i alone, `ScheduleInterleaved1F1B` when stage s is on rank
     s mod P;
  C. one process, no pipeline: each micro-batch's loss, the gradients averaged.

It asserts that A's losses equal B's exactly, that A's gradients equal B's to 1e-6, and
that both agree with C, and prints them. Without arguments it runs the plans of
`scripts/fixtures/torch/` (which a unit test of torch.rs keeps equal to the export).

Usage: python scripts/torch_pipeline.py [PLAN.json ACTIONS.csv]...
       torchrun --nproc-per-node P scripts/torch_pipeline.py PLAN.json ACTIONS.csv
(scripts/torch_pipeline.sh sets up PyTorch and runs it.)
"""

import copy
import csv
import json
import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B
from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime

WIDTH = 16  # features of every layer
MICRO = 2  # samples per micro-batch
HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = ["1f1b-2", "1f1b-star-4", "interleaved-split-4"]


def load(plan_path, actions_path):
    with open(plan_path) as f:
        plan = json.load(f)
    if plan.get("view") != "pipeline":
        raise SystemExit(f"{plan_path}: not a pipeline plan")
    with open(actions_path, newline="") as f:
        rows = [[_Action.from_str(a) for a in row] for row in csv.reader(f)]
    micro = {a.microbatch_index for row in rows for a in row if a.computation_type.value == "F"}
    ranks = {a.stage_index: r for r, row in enumerate(rows) for a in row}
    planned = {i: st["device"] for i, st in enumerate(plan["stages"])}
    if ranks != planned or len(rows) != plan["devices"]:
        raise SystemExit(
            f"{actions_path} is not the export of {plan_path}: its stages run on ranks "
            f"{[ranks[i] for i in sorted(ranks)]}, the plan's on {[planned[i] for i in sorted(planned)]}"
        )
    return plan, rows, len(micro)


def model(layers):
    torch.manual_seed(0)
    mods = []
    for i in range(layers):
        mods.append(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) if i + 1 < layers else nn.Linear(WIDTH, WIDTH))
    return mods


def data(n_micro):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n_micro * MICRO, WIDTH, generator=g)
    y = torch.randn(n_micro * MICRO, WIDTH, generator=g)
    return x, y


def loss_fn(out, target):
    return nn.functional.mse_loss(out, target)


def stages_of(plan, layers, rank):
    """This rank's stages: (stage index, its layers as one module, fresh copies)."""
    out = []
    for i, st in enumerate(plan["stages"]):
        if st["device"] == rank:
            out.append((i, nn.Sequential(*[copy.deepcopy(layers[l]) for l in range(st["first"], st["last"] + 1)])))
    return out


def step(schedule, ranks_stages, n_stages, x, y):
    first = any(i == 0 for i, _ in ranks_stages)
    last = any(i == n_stages - 1 for i, _ in ranks_stages)
    losses = [] if last else None
    schedule.step(*((x,) if first else ()), target=y if last else None, losses=losses)
    return [l.detach() for l in losses] if last else None


def grads(ranks_stages):
    return {i: [p.grad.detach().clone() for p in mod.parameters()] for i, mod in ranks_stages}


def worker(rank, world, init, plan_path, actions_path, result_path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=init)
    try:
        plan, rows, n_micro = load(plan_path, actions_path)
        n_stages = len(plan["stages"])
        layers = model(plan["stages"][-1]["last"] + 1)
        x, y = data(n_micro)
        device = torch.device("cpu")

        # A: the exported actions, in PyTorch's runtime.
        mine = stages_of(plan, layers, rank)
        pipe = [PipelineStage(mod, i, n_stages, device) for i, mod in mine]
        runtime = _PipelineScheduleRuntime(pipe, n_microbatches=n_micro, loss_fn=loss_fn)
        runtime._load_csv(actions_path)
        losses_a = step(runtime, mine, n_stages, x, y)
        grads_a = grads(mine)
        mapping = dict(runtime.stage_index_to_group_rank)
        dist.barrier()

        # B: PyTorch's own schedule on the same split.
        own = stages_of(plan, layers, rank)
        pipe = [PipelineStage(mod, i, n_stages, device) for i, mod in own]
        if n_stages == world and all(st["device"] == i for i, st in enumerate(plan["stages"])):
            theirs, name = Schedule1F1B(pipe[0], n_microbatches=n_micro, loss_fn=loss_fn), "Schedule1F1B"
        elif all(st["device"] == i % world for i, st in enumerate(plan["stages"])):
            theirs = ScheduleInterleaved1F1B(pipe, n_microbatches=n_micro, loss_fn=loss_fn)
            name = "ScheduleInterleaved1F1B"
        else:
            theirs, name = None, None
        losses_b = step(theirs, own, n_stages, x, y) if theirs else None
        grads_b = grads(own) if theirs else None
        dist.barrier()

        gathered = [None] * world if rank == 0 else None
        dist.gather_object((losses_a, grads_a, losses_b, grads_b), gathered, dst=0)
        if rank == 0:
            result = compare(plan, layers, x, y, n_micro, gathered, name)
            result["stage_to_rank"] = [mapping[s] for s in range(n_stages)]
            result["actions"] = [[str(a) for a in row] for row in rows]
            with open(result_path, "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


def compare(plan, layers, x, y, n_micro, gathered, name):
    n_stages = len(plan["stages"])
    losses_a = next(l for l, _, _, _ in gathered if l is not None)
    grads_a = {s: g for _, gs, _, _ in gathered for s, g in gs.items()}

    # C: one process, the whole model, the gradient of the mean of the micro-batch losses.
    ref = [copy.deepcopy(l) for l in layers]
    net = nn.Sequential(*ref)
    losses_c = []
    for m in range(n_micro):
        sl = slice(m * MICRO, (m + 1) * MICRO)
        loss = loss_fn(net(x[sl]), y[sl])
        (loss / n_micro).backward()
        losses_c.append(loss.detach())
    grads_c = {}
    for s, st in enumerate(plan["stages"]):
        grads_c[s] = [p.grad for l in range(st["first"], st["last"] + 1) for p in ref[l].parameters()]

    def max_diff(ga, gb):
        return max((a - b).abs().max().item() for s in range(n_stages) for a, b in zip(ga[s], gb[s]))

    result = {
        "stages": n_stages,
        "ranks": len(gathered),
        "microbatches": n_micro,
        "losses": [l.item() for l in losses_a],
        "loss_vs_reference": max(abs(a.item() - c.item()) for a, c in zip(losses_a, losses_c)),
        "grad_vs_reference": max_diff(grads_a, grads_c),
        "grad_norm": torch.sqrt(sum((g**2).sum() for gs in grads_a.values() for g in gs)).item(),
        "baseline": name,
    }
    assert result["loss_vs_reference"] <= 1e-6, result
    assert result["grad_vs_reference"] <= 1e-6, result
    if name is not None:
        losses_b = next(l for _, _, l, _ in gathered if l is not None)
        grads_b = {s: g for _, _, _, gs in gathered for s, g in gs.items()}
        result["baseline_losses"] = [l.item() for l in losses_b]
        result["losses_equal"] = bool(torch.equal(torch.stack(losses_a), torch.stack(losses_b)))
        result["grad_vs_baseline"] = max_diff(grads_a, grads_b)
        assert result["losses_equal"], result
        assert result["grad_vs_baseline"] <= 1e-6, result
    return result


def report(name, r):
    print(f"\n{name}: {r['stages']} stages on {r['ranks']} ranks (stage->rank {r['stage_to_rank']}), {r['microbatches']} micro-batches")
    for rank, row in enumerate(r["actions"]):
        print(f"  rank {rank}: {' '.join(row)}")
    print(f"  losses (exported actions):  {' '.join(f'{l:.9f}' for l in r['losses'])}")
    if r["baseline"]:
        print(f"  losses ({r['baseline']}): {' '.join(f'{l:.9f}' for l in r['baseline_losses'])}")
        print(f"  losses equal: {r['losses_equal']}; max |grad - {r['baseline']} grad| = {r['grad_vs_baseline']:.3g}")
    print(
        f"  against one process: max |loss diff| = {r['loss_vs_reference']:.3g}, max |grad diff| = {r['grad_vs_reference']:.3g}"
        f" (gradient norm {r['grad_norm']:.6g})"
    )


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv):
    if "RANK" in os.environ:  # under torchrun: this process is one rank
        plan_path, actions_path = argv[:2]
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        out = os.environ.get("TORCH_PIPELINE_RESULT", os.path.join(tempfile.gettempdir(), "torch_pipeline.json"))
        worker(rank, world, "env://", plan_path, actions_path, out)
        if rank == 0:
            with open(out) as f:
                report(os.path.splitext(os.path.basename(plan_path))[0], json.load(f))
        return
    if argv and len(argv) % 2:
        raise SystemExit("usage: torch_pipeline.py [PLAN.json ACTIONS.csv]...")
    pairs = list(zip(argv[::2], argv[1::2])) or [
        (os.path.join(HERE, "fixtures", "torch", f"{n}.json"), os.path.join(HERE, "fixtures", "torch", f"{n}.csv"))
        for n in FIXTURES
    ]
    print(f"torch {torch.__version__}, gloo on CPU, {WIDTH}-wide Linear layers, {MICRO} samples per micro-batch")
    failed = 0
    for plan_path, actions_path in pairs:
        plan, _, _ = load(plan_path, actions_path)
        world = plan["devices"]
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "result.json")
            init = f"tcp://127.0.0.1:{free_port()}"
            try:
                mp.spawn(worker, args=(world, init, plan_path, actions_path, out), nprocs=world, join=True)
            except Exception as e:  # a rank failed: its traceback is above
                print(f"FAIL {os.path.basename(plan_path)}: {e}")
                failed += 1
                continue
            with open(out) as f:
                r = json.load(f)
        report(os.path.splitext(os.path.basename(plan_path))[0], r)
    print(f"\n{len(pairs) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
