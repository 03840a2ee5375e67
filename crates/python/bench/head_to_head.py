"""pebble (`auto`) against PyTorch's own ways to save activation memory, on one model.

    target/torch-venv/bin/python crates/python/bench/head_to_head.py --model gpt2 --out docs/head_to_head_gpt2.json

Each method trains the same randomly initialised model on the same batch; for each, the
step's peak memory (MemTracker on the CPU, `torch.cuda.max_memory_allocated` on CUDA, both
PyTorch's, fed nothing by pebble) and its step time (the median of `--steps` steps after a
warm-up) beside eager's:

- `eager`: plain autograd;
- `checkpoint`: `torch.utils.checkpoint` (`use_reentrant=False`) around every block, and
  around every other block;
- `sac`: selective activation checkpointing (`create_selective_checkpoint_contexts`)
  around every block, saving the matmuls' and convolutions' outputs;
- `compile`: `torch.compile` with `torch._functorch.config.activation_memory_budget` from
  0.1 to 0.9 (CUDA only: inductor's CPU buffers are allocated past the dispatcher, so
  MemTracker would not see them);
- `pebble`: `pt.wrap(..., activation_budget=P%, solver="auto")` for P from 10 to 100.

Each step of a method is timed beside one of eager's, and the overhead is the median of
the ratios: on a shared machine, whose speed drifts, only a comparison made at the same
moment means anything.

A block is a GPT-2 layer (`transformer.h[i]`) or a ResNet bottleneck (`layer1..4[j]`).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from typing import Any, Callable

import torch
import torch.utils.checkpoint as ckpt

import pebble.torch as pt


def gpt2(device: torch.device) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(n_layer=6, n_embd=256, n_head=4, vocab_size=2000, n_positions=256,
                                  bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0, use_cache=False)
    model = transformers.GPT2LMHeadModel(cfg).to(device)
    return model, (torch.randint(0, 2000, (4, 256), device=device),)


def resnet50(device: torch.device) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    import torchvision

    model = torchvision.models.resnet50(num_classes=10).to(device)
    return model, (torch.randn(4, 3, 128, 128, device=device),)


MODELS = {"gpt2": gpt2, "resnet50": resnet50}
SAVED = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
         torch.ops.aten.convolution.default}


def _loss(out: Any) -> torch.Tensor:
    return (out.logits if hasattr(out, "logits") else out).float().square().mean()


def _checkpointed(block: torch.nn.Module, context_fn: Callable[[], Any] | None) -> None:
    forward = block.forward

    def run(*args: Any, **kwargs: Any) -> Any:
        extra = {"context_fn": context_fn} if context_fn is not None else {}
        return ckpt.checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)

    block.forward = run  # type: ignore[method-assign]


def _sac_context() -> Any:
    policy = lambda ctx, op, *a, **k: (ckpt.CheckpointPolicy.MUST_SAVE if op in SAVED  # noqa: E731
                                       else ckpt.CheckpointPolicy.PREFER_RECOMPUTE)
    return ckpt.create_selective_checkpoint_contexts(policy)


def stepper(model: torch.nn.Module, fwd: Callable[..., Any], args: tuple[torch.Tensor, ...]) -> Callable[[], float]:
    """One training step of `fwd` (`.grad` reset, the loss's backward), timed in seconds."""
    cuda = args[0].device.type == "cuda"

    def step() -> float:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        _loss(fwd(*args)).backward()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    return step


def measure(model: torch.nn.Module, fwd: Callable[..., Any], args: tuple[torch.Tensor, ...], steps: int,
            eager: Callable[[], float]) -> dict[str, float]:
    """The step's peak bytes above what the model holds before it, its median time, and
    its overhead over eager: the median of `steps` ratios, each of a step of this method
    and a step of eager's just before it (a shared machine's speed drifts by tens of
    percent over seconds, which one eager measurement at the start would count as
    overhead)."""
    device = args[0].device
    step = stepper(model, fwd, args)
    step()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        from torch.distributed._tools.mem_tracker import MemTracker

        mt = MemTracker()
        mt.track_external(model, *args)
        with mt:
            step()
        peak = int(mt.get_tracker_snapshot("peak")[device]["Total"])
    pairs = [(eager(), step()) for _ in range(steps)]
    return {"peak_bytes": peak, "step_seconds": statistics.median(t for _, t in pairs),
            "eager_seconds": statistics.median(e for e, _ in pairs),
            "overhead": statistics.median(t / e for e, t in pairs) - 1}


def methods(name: str, device: torch.device, quick: bool) -> Any:
    """(method, setting, model, forward, args) for each point."""
    base, args = MODELS[name](device)
    yield "eager", "", base, base, args
    for every in (1, 2):
        model = copy.deepcopy(base)
        for block in _blocks(name, model)[::every]:
            _checkpointed(block, None)
        yield "checkpoint", f"every {every}", model, model, args
    model = copy.deepcopy(base)
    for block in _blocks(name, model):
        _checkpointed(block, _sac_context)
    yield "sac", "mm/conv saved", model, model, args
    if device.type == "cuda":
        import torch._functorch.config as fconfig

        for budget in ([0.5] if quick else [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]):
            torch._dynamo.reset()
            fconfig.activation_memory_budget = budget
            model = copy.deepcopy(base)
            yield "compile", f"{budget:.1f}", model, torch.compile(model), args
        fconfig.activation_memory_budget = 1.0
    for share in ([50] if quick else range(10, 101, 10)):
        model = copy.deepcopy(base)
        try:
            planned = pt.wrap(model, args, activation_budget=f"{share}%", solver="auto")
        except pt.BudgetTooSmall as e:
            print(f"pebble {share}%: no plan ({e})", flush=True)
            continue
        yield "pebble", f"{share}% ({planned.report['solver']})", model, planned, args


def _blocks(name: str, model: torch.nn.Module) -> list[torch.nn.Module]:
    if name == "gpt2":
        return list(model.transformer.h)  # type: ignore[union-attr]
    return [b for layer in (model.layer1, model.layer2, model.layer3, model.layer4) for b in layer]  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="one setting per method (a smoke run)")
    ap.add_argument("--out", help="write the points as JSON here (refused if it exists)")
    a = ap.parse_args()
    torch.manual_seed(0)
    device = torch.device(a.device)
    rows: list[dict[str, Any]] = []
    eager: Callable[[], float] | None = None
    for method, setting, model, fwd, args in methods(a.model, device, a.quick):
        eager = eager or stepper(model, fwd, args)  # the first method is eager itself
        r = measure(model, fwd, args, a.steps, eager) | {"method": method, "setting": setting}
        rows.append(r)
        print(f"{method:10} {setting:24} peak {r['peak_bytes'] / 2**20:8.1f} MiB "
              f"({r['peak_bytes'] / rows[0]['peak_bytes']:.2f}x)  step {r['step_seconds'] * 1e3:8.1f} ms "
              f"({100 * r['overhead']:+.1f}% over eager's {r['eager_seconds'] * 1e3:.1f} ms beside it)", flush=True)
    if a.out:
        with open(a.out, "x") as f:
            json.dump({"model": a.model, "device": str(device), "torch": torch.__version__, "points": rows}, f, indent=1)


if __name__ == "__main__":
    main()
