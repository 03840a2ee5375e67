"""scripts/ch4_eager_chains.py measures rotor's stages of a torchvision ResNet as eager
PyTorch keeps them (issue 48, Deliver 3). Each figure below is derived by hand from what
the ops save, for ResNet-18 on 2 images of 64² pixels (fp32)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "ch4_eager_chains.py"


def _script():
    spec = importlib.util.spec_from_file_location("ch4_eager_chains", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stages_keep_what_their_ops_save():
    ec = _script()
    from torch._subclasses.fake_tensor import FakeTensorMode

    c64 = 2 * 64 * 32 * 32 * 4  # a 64-channel map at 32², fp32: 524,288 bytes
    q64 = c64 // 4  # the same at 16² (after the max-pool): 131,072
    stats = 2 * 64 * 4  # BatchNorm's saved mean and inverse deviation: 512
    with FakeTensorMode():
        stages = ec.resnet_stages(torchvision.models.resnet18())
        a = torch.randn(2, 3, 64, 64)
        sizes = []
        for stage in stages[:4]:
            a, s = ec.measure(stage, a)
            sizes.append(s)
    conv1, bn1_relu, maxpool, block = sizes
    # conv1 saves its input (the stage's own input, not counted) and makes its output.
    assert (conv1["x"], conv1["xbar"], conv1["ftmp"]) == (c64, c64, 0)
    # BatchNorm saves its input (the stage's input) and its statistics; the in-place ReLU
    # overwrites BatchNorm's output and saves it: one map, not two.
    assert (bn1_relu["x"], bn1_relu["xbar"], bn1_relu["ftmp"]) == (c64, c64 + stats, 0)
    # The max-pool keeps its output and its int64 indices (twice the output's bytes).
    assert (maxpool["x"], maxpool["xbar"]) == (q64, q64 + 2 * q64)
    # A BasicBlock: conv1's output, the in-place ReLU's, conv2's, and the block's output
    # (bn2's output, summed with the identity and rectified in place), with two
    # BatchNorms' statistics; nothing made in the forward outlives it uncounted.
    assert (block["x"], block["xbar"], block["ftmp"]) == (q64, 4 * q64 + 2 * stats, 0)
    # Its backward holds at least the ReLU's and a BatchNorm's input gradients beside the
    # block's input gradient.
    assert block["btmp"] >= 2 * q64
