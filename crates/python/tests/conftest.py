"""Shared fixtures of pebble.torch's tests: the models (random init, dropout off) and a
cache of their captures (capturing profiles every compute node: once per session)."""

from __future__ import annotations

from typing import Any, Callable

import pytest

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


def resnet50(size: int = 64) -> tuple[Any, tuple[Any, ...]]:
    """torchvision's ResNet-50 in training mode (BatchNorm updates its running statistics)
    on 2 images of `size`² pixels: at 32² the weight gradients' temporaries (9.4 MB for
    layer4's 3x3 convolutions) leave no plan below 72% of the activations; at 64², 42%."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    return torchvision.models.resnet50(num_classes=10), (torch.randn(2, 3, size, size),)


class UNet(torch.nn.Module):
    """A small U-Net: two levels down, two up, skip connections concatenated (not a chain)."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()

        def block(i: int, o: int) -> torch.nn.Module:
            return torch.nn.Sequential(torch.nn.Conv2d(i, o, 3, padding=1), torch.nn.BatchNorm2d(o), torch.nn.ReLU(),
                                       torch.nn.Conv2d(o, o, 3, padding=1), torch.nn.ReLU())

        self.down1, self.down2, self.mid = block(3, c), block(c, 2 * c), block(2 * c, 4 * c)
        self.up2 = torch.nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2)
        self.dec2 = block(4 * c, 2 * c)
        self.up1 = torch.nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.dec1 = block(2 * c, c)
        self.head = torch.nn.Conv2d(c, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d1 = self.down1(x)
        d2 = self.down2(torch.nn.functional.max_pool2d(d1, 2))
        m = self.mid(torch.nn.functional.max_pool2d(d2, 2))
        u2 = self.dec2(torch.cat([self.up2(m), d2], dim=1))
        u1 = self.dec1(torch.cat([self.up1(u2), d1], dim=1))
        return self.head(u1)


def unet() -> tuple[Any, tuple[Any, ...]]:
    torch.manual_seed(0)
    return UNet(), (torch.randn(2, 3, 32, 32),)


MODELS: dict[str, Callable[[], tuple[Any, tuple[Any, ...]]]] = {
    "mlp": mlp,
    "mlp4": lambda: mlp(layers=4),
    "gpt2": gpt2,
    "resnet50": resnet50,
    "unet": unet,
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
