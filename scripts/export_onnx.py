"""Exports the three graphs issue 15 names that no ONNX zoo ships (U-Net, the
encoder-decoder Transformer, Inception-v3) from PyTorch, in training mode, so that
`pebble plan --onnx` sees what a PyTorch training step runs.

* `unet.onnx`: milesial/Pytorch-UNet's `UNet(3, 2, bilinear=False)`, the zoo's `unet`.
* `inception_v3.onnx`: torchvision's `inception_v3(aux_logits=False)` at 299 × 299.
* `transformer.onnx`: the zoo's `transformer` (torch.nn.Transformer base, post-LN, shared
  37000-token embedding tied to the output) written with plain tensor ops, so that the
  export is MatMul, Softmax, LayerNormalization and friends rather than a fused kernel.
  Two liberties keep it within what pebble's importer reads: the 1/sqrt(d) scaling of
  the scores is left out (an element-wise op whose backward saves nothing), and the
  causal mask is a graph input (`causal_mask`, [S, S]) added to the scores, where PyTorch
  keeps it as a buffer.

Run through scripts/export-onnx-models.sh, which makes the PyTorch venv. Usage:
    python scripts/export_onnx.py OUT_DIR [--layers N] [--seq S] [--image PX]
"""

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class DoubleConv(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.double_conv = nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    def forward(self, x):
        return self.double_conv(x)


class Down(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.maxpool_conv = nn.Sequential(nn.MaxPool2d(2), DoubleConv(cin, cout))

    def forward(self, x):
        return self.maxpool_conv(x)


class Up(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cin // 2, kernel_size=2, stride=2)
        self.conv = DoubleConv(cin, cout)

    def forward(self, x1, x2):
        return self.conv(torch.cat([x2, self.up(x1)], dim=1))


class UNet(nn.Module):
    """milesial's UNet(3, 2, bilinear=False), without the padding of odd sizes."""

    def __init__(self, channels=3, classes=2):
        super().__init__()
        self.inc = DoubleConv(channels, 64)
        self.down1, self.down2 = Down(64, 128), Down(128, 256)
        self.down3, self.down4 = Down(256, 512), Down(512, 1024)
        self.up1, self.up2 = Up(1024, 512), Up(512, 256)
        self.up3, self.up4 = Up(256, 128), Up(128, 64)
        self.outc = nn.Conv2d(64, classes, 1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x4 = self.down3(x3)
        x = self.up1(self.down4(x4), x4)
        x = self.up2(x, x3)
        x = self.up3(x, x2)
        return self.outc(self.up4(x, x1))


WIDTH, HEADS, FFN, VOCAB, P = 512, 8, 2048, 37000, 0.1


def attention(q, k, v, causal_mask):
    """Scaled dot-product attention over heads, as plain ops: [B, S, E] in and out."""
    b, s, _ = q.shape
    t = k.shape[1]
    d = WIDTH // HEADS
    q = q.reshape(b, s, HEADS, d).transpose(1, 2)
    k = k.reshape(b, t, HEADS, d).permute(0, 2, 3, 1)
    v = v.reshape(b, t, HEADS, d).transpose(1, 2)
    scores = torch.matmul(q, k)
    if causal_mask is not None:
        scores = scores + causal_mask
    a = F.dropout(F.softmax(scores, dim=-1), P, training=True)
    return torch.matmul(a, v).transpose(1, 2).reshape(b, s, WIDTH)


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.in_proj = nn.Linear(WIDTH, 3 * WIDTH)
        self.out_proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, mask):
        q, k, v = self.in_proj(x).split(WIDTH, dim=-1)
        return self.out_proj(attention(q, k, v, mask))


class CrossAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(WIDTH, WIDTH)
        self.kv_proj = nn.Linear(WIDTH, 2 * WIDTH)
        self.out_proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, memory):
        k, v = self.kv_proj(memory).split(WIDTH, dim=-1)
        return self.out_proj(attention(self.q_proj(x), k, v, None))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(WIDTH, FFN)
        self.linear2 = nn.Linear(FFN, WIDTH)

    def forward(self, x):
        return self.linear2(F.dropout(F.relu(self.linear1(x)), P, training=True))


def residual(norm, x, y):
    return norm(x + F.dropout(y, P, training=True))


class EncoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn, self.ff = SelfAttention(), FeedForward()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)

    def forward(self, x):
        x = residual(self.norm1, x, self.self_attn(x, None))
        return residual(self.norm2, x, self.ff(x))


class DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn, self.multihead_attn, self.ff = SelfAttention(), CrossAttention(), FeedForward()
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)

    def forward(self, x, memory, mask):
        x = residual(self.norm1, x, self.self_attn(x, mask))
        x = residual(self.norm2, x, self.multihead_attn(x, memory))
        return residual(self.norm3, x, self.ff(x))


class Transformer(nn.Module):
    """The zoo's `transformer`: nn.Transformer base with a shared, tied embedding."""

    def __init__(self, layers):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.encoder = nn.ModuleList(EncoderLayer() for _ in range(layers))
        self.decoder = nn.ModuleList(DecoderLayer() for _ in range(layers))
        self.encoder_norm, self.decoder_norm = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)

    def forward(self, src, tgt, mask):
        h = F.dropout(self.embed(src), P, training=True)
        for layer in self.encoder:
            h = layer(h)
        memory = self.encoder_norm(h)
        h = F.dropout(self.embed(tgt), P, training=True)
        for layer in self.decoder:
            h = layer(h, memory, mask)
        return torch.matmul(self.decoder_norm(h), self.embed.weight.t())


def export(model, args, path, names):
    model.train()
    torch.onnx.export(model, args, path, input_names=names, output_names=["logits"],
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      opset_version=17, dynamo=False)
    print(f"export_onnx: wrote {path} ({os.path.getsize(path)} bytes)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--image", type=int, default=256)
    ap.add_argument("--models", default="unet,inception_v3,transformer")
    a = ap.parse_args()
    models = a.models.split(",")
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    if "unet" in models:
        export(UNet(), (torch.randn(1, 3, a.image, a.image),), os.path.join(a.out, "unet.onnx"), ["images"])
    if "inception_v3" in models:
        import torchvision
        inception = torchvision.models.inception_v3(weights=None, aux_logits=False, init_weights=False)
        export(inception, (torch.randn(1, 3, 299, 299),), os.path.join(a.out, "inception_v3.onnx"), ["images"])
    if "transformer" in models:
        tokens = torch.zeros(1, a.seq, dtype=torch.long)
        mask = torch.triu(torch.full((a.seq, a.seq), -1e9), diagonal=1)
        export(Transformer(a.layers), (tokens, tokens, mask), os.path.join(a.out, "transformer.onnx"),
               ["src_tokens", "tgt_tokens", "causal_mask"])


if __name__ == "__main__":
    main()
