#!/usr/bin/env python3
"""The chains of Shilova's Ch. 4 experiment as PyTorch eager keeps them (issue 48, Deliver 3).

The thesis measured its chains in PyTorch: rotor's sequentialization of torchvision's
networks (for a ResNet: `conv1`, `bn1` with its in-place ReLU, `maxpool`, one stage per
residual block, the pooling, `fc`; for a DenseNet one stage per dense layer, its new
features concatenated onto the running tensor; for Inception-v3 the module children),
each stage's sizes read from the CUDA allocator while it ran. pebble's
zoo builds the same blocks out of place: every ReLU and every residual sum makes a new
tensor, which raises the temporaries (`ftmp`, `btmp`) and so recompute-all's peak, M^low.

This script measures each stage of torchvision's own model the way rotor does, with
PyTorch's `MemTracker` under `FakeTensorMode` (no arithmetic, no memory: the sizes of
what eager allocates, keeps and frees, in-place ops included), and writes a chain in
pebble's JSON format (`pebble graph --view chain`):

* `x[i+1]`: the stage's output; `xbar[i+1]`: what its forward with grad leaves allocated
  (the output included, the input not); `ftmp[i]`: its peak above that;
* `btmp[i]`: the backward's peak of new allocations above `δ_i` (the input's gradient);
  parameter gradients are static memory, as in pebble's chains, and left out;
* times, weights, the loss and `static_bytes`: pebble's own chain of the same model
  (`--zoo`, from `pebble graph --view chain`), stage for stage, with `bn1` and its ReLU
  merged as rotor merges them. Only the memory differs.

    target/torch-venv/bin/python scripts/ch4_eager_chains.py --out docs/data/ch4-eager

then `pebble reproduce ch4 --chains docs/data/ch4-eager/resnet50.json,...`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
import torchvision
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _ModState

# What a stage allocates for itself: activations, temporaries, and tensors MemTracker
# cannot attribute (parameters, buffers and their gradients are static memory).
COUNTED = (_MemRefType.ACT, _MemRefType.TEMP, _MemRefType.OTH)


def _bytes(snapshot) -> int:
    return sum(v for dev in snapshot.values() for k, v in dev.items() if k in COUNTED)


def resnet_stages(model: nn.Module) -> list[nn.Module]:
    """rotor's sequentialization of a torchvision ResNet (its `ReLUatEnd` for `bn1`)."""
    blocks = [b for layer in (model.layer1, model.layer2, model.layer3, model.layer4) for b in layer]
    return [model.conv1, nn.Sequential(model.bn1, model.relu), model.maxpool, *blocks,
            nn.Sequential(model.avgpool, nn.Flatten()), model.fc]


class DenseStage(nn.Module):
    """A torchvision dense layer as rotor's sequential DenseNet runs it: its new features
    concatenated onto the running tensor, so that one tensor crosses each cut."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.layer
        new = f.conv2(f.relu2(f.norm2(f.conv1(f.relu1(f.norm1(x))))))
        return torch.cat([x, new], 1)


def densenet_stages(model: nn.Module) -> list[nn.Module]:
    """The stem's convolution, norm with its in-place ReLU, and pool; every dense layer
    and transition; the final norm; ReLU (out of place: its input is the stage boundary)
    with the pool; the classifier."""
    f = model.features
    body = [DenseStage(m) if "denselayer" in n else m
            for block in list(f.children())[4:-1]
            for n, m in (block.named_children() if "DenseBlock" in type(block).__name__ else [("transition", block)])]
    return [f.conv0, nn.Sequential(f.norm0, f.relu0), f.pool0, *body, f.norm5,
            nn.Sequential(nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()), model.classifier]


def inception_stages(model: nn.Module) -> list[nn.Module]:
    """torchvision's module children (no auxiliary head), flatten with the dropout."""
    names = ["Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "maxpool1", "Conv2d_3b_1x1", "Conv2d_4a_3x3",
             "maxpool2", "Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d",
             "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c", "avgpool"]
    return [getattr(model, n) for n in names] + [nn.Sequential(model.dropout, nn.Flatten()), model.fc]


def stages_of(name: str) -> tuple[list[nn.Module], bool]:
    """The model's stages, and whether rotor merges pebble's stages 1 and 2 (a norm and
    its in-place ReLU, which cannot be a stage of its own)."""
    if name.startswith("resnet"):
        return resnet_stages(getattr(torchvision.models, name)()), True
    if name.startswith("densenet"):
        return densenet_stages(getattr(torchvision.models, name)()), True
    if name == "inception_v3":
        return inception_stages(torchvision.models.inception_v3(aux_logits=False, init_weights=False)), False
    sys.exit(f"{name}: no sequentialization (resnet*, densenet*, inception_v3)")


def measure(stage: nn.Module, a: torch.Tensor) -> tuple[torch.Tensor, dict[str, int]]:
    """One stage's sizes under eager PyTorch, on fake tensors: its output and the
    chain's `x`, `xbar`, `ftmp`, `btmp` for it, from MemTracker's snapshots of the stage
    around its forward and its backward. MemTracker counts the input once an op reads
    it, so it is taken out of `xbar`; the input's gradient `δ_i` is taken out of `btmp`."""
    a = a.detach().requires_grad_()
    tracker = MemTracker()
    tracker.track_external(stage)
    with tracker:
        y = stage(a)
        y.backward(torch.ones_like(y))
    snaps = {state: _bytes(s[-1]) for state, s in tracker.memory_tracking[stage].snapshots.items()}
    size = lambda t: t.numel() * t.element_size()  # noqa: E731
    post_fw = snaps[_ModState.POST_FW]
    xbar = post_fw - size(a)
    if xbar < size(y):
        sys.exit(f"{type(stage).__name__}: {xbar} bytes kept, less than its output {size(y)}: input not counted?")
    sizes = {
        "x": size(y),
        "xbar": xbar,
        "ftmp": snaps[_ModState.PEAK_FW] - post_fw,
        "btmp": max(snaps[_ModState.PEAK_BW] - snaps[_ModState.PRE_BW] - size(a), 0),
    }
    return y.detach(), sizes


def merged(zoo: dict, groups: list[list[int]]) -> dict:
    """pebble's chain with its stages merged as `groups` says (sums of times and
    parameters); the memory fields are left to the measurement."""
    out = {"name": zoo["name"], "static_bytes": zoo["static_bytes"]}
    for key in ("ftime", "w", "g", "o", "utmp"):
        if zoo.get(key) is not None:
            out[key] = [sum(zoo[key][i] for i in grp) for grp in groups]
    out["btime"] = [sum(zoo["btime"][i] for i in grp) for grp in groups] + [zoo["btime"][-1]]
    return out


def eager_chain(name: str, image: int, batch: int, zoo: dict) -> dict:
    with FakeTensorMode():
        stages, merge_stem = stages_of(name)
        for stage in stages:
            stage.train()
        a = torch.randn(batch, 3, image, image)
        x0 = a.numel() * a.element_size()
        chain_x, xbar, ftmp, btmp = [x0], [zoo["xbar"][0]], [], []
        for stage in stages:
            a, s = measure(stage, a)
            chain_x.append(s["x"])
            xbar.append(s["xbar"])
            ftmp.append(s["ftmp"])
            btmp.append(s["btmp"])
    # pebble's stages, with its norm and ReLU stages 1 and 2 merged where rotor merges them.
    n = len(zoo["ftime"])
    if n != len(stages) + merge_stem:
        sys.exit(f"{name}: pebble's chain has {n} stages, the sequentialization {len(stages)} (+1 merged)")
    groups = [[0], [1, 2]] + [[i] for i in range(3, n)] if merge_stem else [[i] for i in range(n)]
    chain = merged(zoo, groups)
    chain["name"] = f"{name} (eager)"
    chain.update(x=chain_x, xbar=xbar, ftmp=ftmp, btmp=btmp + [zoo["btmp"][-1]])
    return chain


def zoo_chain(pebble: str, name: str, image: int, batch: int) -> dict:
    cmd = [pebble, "graph", "--model", name, "--image", str(image), "--batch", str(batch), "--view", "chain"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet50,resnet101,resnet152,densenet121,densenet169,inception_v3")
    p.add_argument("--image", type=int, default=500)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--pebble", default="target/release/pebble")
    p.add_argument("--out", type=Path, default=Path("docs/data/ch4-eager"))
    p.add_argument("--backward-ratio", type=float, default=None,
                   help="scale every stage's backward time to this multiple of its forward, in total (a sensitivity)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        zoo = zoo_chain(args.pebble, name, args.image, args.batch)
        chain = eager_chain(name, args.image, args.batch, zoo)
        if args.backward_ratio:
            k = args.backward_ratio * sum(chain["ftime"]) / sum(chain["btime"][:-1])
            chain["btime"] = [t * k for t in chain["btime"][:-1]] + chain["btime"][-1:]
            chain["name"] = f"{name} (eager, B = {args.backward_ratio:g} F)"
        path = args.out / f"{name}.json"
        path.write_text(json.dumps(chain, indent=1) + "\n")
        print(f"wrote {path}: {len(chain['ftime'])} stages, Σ xbar {sum(chain['xbar']) / 1e9:.3f} GB "
              f"(pebble's zoo: {sum(zoo['xbar']) / 1e9:.3f} GB)")


if __name__ == "__main__":
    main()
