"""Shared fixtures of pebble.torch's tests: the models (random init, dropout off) and a
cache of their captures (capturing profiles every compute node: once per session)."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any, Callable

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "python"
try:
    import pebble._core  # noqa: F401  (the built extension)
except ImportError:
    # TEMPORARY, with _planner's CLI fallback: the package from source without pebble._core
    # (pebble/__init__.py needs the extension).
    sys.path.insert(0, str(SOURCE))
    try:
        import pebble._core  # noqa: F401,F811
    except ImportError:
        for name in [k for k in sys.modules if k == "pebble" or k.startswith("pebble.")]:
            del sys.modules[name]
        shim = types.ModuleType("pebble")
        shim.__path__ = [str(SOURCE / "pebble")]  # type: ignore[attr-defined]
        sys.modules["pebble"] = shim

torch = pytest.importorskip("torch")
import pebble.torch as pt  # noqa: E402


def mlp(layers: int = 12, width: int = 64, batch: int = 256) -> tuple[Any, tuple[Any, ...]]:
    torch.manual_seed(0)
    mods: list[Any] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*mods, torch.nn.Linear(width, 8))
    return model, (torch.randn(batch, width),)


def gpt2() -> tuple[Any, tuple[Any, ...]]:
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=32,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                                  bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg)
    return model, (torch.randint(0, 100, (4, 32)),)


MODELS: dict[str, Callable[[], tuple[Any, tuple[Any, ...]]]] = {
    "mlp": mlp,
    "mlp4": lambda: mlp(layers=4),
    "gpt2": gpt2,
}

_captures: dict[str, Any] = {}


@pytest.fixture
def captured() -> Callable[[str], tuple[Any, tuple[Any, ...], Any]]:
    """`captured(name)`: a fresh model, its inputs, and the session's capture of it."""

    def get(name: str) -> tuple[Any, tuple[Any, ...], Any]:
        model, args = MODELS[name]()
        if name not in _captures:
            _captures[name] = pt.capture(model, args)
        return model, args, _captures[name]

    return get
