"""pebble.torch's capture: a valid training graph, and one clear error per bad input."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import pebble.torch as pt
from pebble.torch import _planner


def test_graph_has_one_loss_and_every_parameter_gradient(captured: Any) -> None:
    model, _, cap = captured("gpt2")
    g = cap.graph
    assert [c["kind"] for c in g["compute"]].count("loss") == 1
    grads = {d["name"] for d in g["data"] if d["kind"] == "param_grad"}
    assert grads == {f"{n}.grad" for n, p in model.named_parameters() if p.requires_grad}
    assert all(c.get("forward") is not None for c in g["compute"] if c["kind"] == "backward")
    assert _planner.store_all_peak(g) > cap.fixed_bytes  # the planner reads and simulates it


def test_saved_tensors_are_read_by_their_own_backward(captured: Any) -> None:
    _, _, cap = captured("gpt2")
    compute = cap.graph["compute"]
    for d, data in enumerate(cap.graph["data"]):
        if data["kind"] == "saved":
            producer = next(i for i, c in enumerate(compute) if d in c["outputs"])
            readers = [c for c in compute if d in c["inputs"]]
            assert all(c["kind"] == "backward" and c["forward"] == producer for c in readers), data


class _Pair(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> Any:
        return self.lin(x), "not a tensor"


def test_non_tensor_outputs_are_refused() -> None:
    with pytest.raises(pt.UnsupportedModel, match="outputs must be tensors"):
        pt.wrap(_Pair(), (torch.randn(2, 4),), activation_budget="50%", solver="dtr")


def test_dropout_in_training_is_refused() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    with pytest.raises(pt.UnsupportedModel, match="random"):
        pt.wrap(model, (torch.randn(2, 4),), activation_budget="50%", solver="dtr")


def test_other_input_shapes_are_refused() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    planned = pt.wrap(model, (torch.randn(8, 4),), activation_budget="100%", solver="store-all")
    with pytest.raises(pt.PebbleError, match="shapes"):
        planned(torch.randn(3, 4))


def test_budget_arguments() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    with pytest.raises(ValueError, match="exactly one"):
        pt.wrap(model, (torch.randn(8, 4),), solver="dtr")
    planned = pt.wrap(model, (torch.randn(8, 4),), budget="1MiB", solver="store-all")
    assert planned.report["budget_bytes"] == 1 << 20
