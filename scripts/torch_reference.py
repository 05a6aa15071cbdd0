#!/usr/bin/env python3
"""Writes tests/data/ml/torch_reference.bin: PyTorch forward/backward/optimizer reference values
for small models that copse::ml builds layer for layer (tests/ml/torch_reference_test.cc).

Needs PyTorch (Debian: apt-get install -y python3-torch; run with /usr/bin/python3). The test
itself only reads the file, so torch is needed only to regenerate it.

File format (little-endian): b"CPSREF01", u32 count, then count x (u32 name_len, name,
u32 ndim, i64 dims[ndim], f32 data[prod(dims)]).
"""
import argparse
import os
import struct

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "tests", "data", "ml", "torch_reference.bin")


def mlp():
    # copse: Flatten(0) Linear(784,16)+ReLU(1) Linear(16,32)(2) LayerNorm(32)(3) GELU(4)
    #        Linear(32,10)(5). Keys map torch module indices to copse layer indices.
    layers = nn.Sequential(nn.Flatten(), nn.Linear(784, 16), nn.ReLU(), nn.Linear(16, 32),
                           nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 10))
    with torch.no_grad():  # non-trivial LayerNorm affine parameters
        layers[4].weight.uniform_(0.5, 1.5)
        layers[4].bias.uniform_(-0.2, 0.2)
    names = {"1.weight": "1.weight", "1.bias": "1.bias", "3.weight": "2.weight",
             "3.bias": "2.bias", "4.weight": "3.weight", "4.bias": "3.bias",
             "6.weight": "5.weight", "6.bias": "5.bias"}
    return layers, names


def cnn():
    # copse: Conv(1,4,3,p1)+ReLU(0) MaxPool2(1) Conv(4,8,3,s1,p1)+ReLU(2) MaxPool2(3) Flatten(4)
    #        Linear(392,10)(5)
    layers = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                           nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                           nn.Flatten(), nn.Linear(8 * 7 * 7, 10))
    names = {"0.weight": "0.weight", "0.bias": "0.bias", "3.weight": "2.weight",
             "3.bias": "2.bias", "7.weight": "5.weight", "7.bias": "5.bias"}
    return layers, names


def forward_backward(model, x, y):
    x = x.clone().requires_grad_(True)
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, y)
    model.zero_grad()
    loss.backward()
    return logits.detach(), loss.detach(), x.grad.detach()


def run(prefix, model, names, x, y, out, optimizers):
    for tname, cname in names.items():
        out[f"{prefix}.param.{cname}"] = dict(model.named_parameters())[tname].detach().clone()
    out[f"{prefix}.input"] = x
    out[f"{prefix}.labels"] = y.float()
    logits, loss, dx = forward_backward(model, x, y)
    out[f"{prefix}.logits"] = logits
    out[f"{prefix}.loss"] = loss.reshape(1)
    out[f"{prefix}.dx"] = dx
    for tname, cname in names.items():
        out[f"{prefix}.grad.{cname}"] = dict(model.named_parameters())[tname].grad.detach().clone()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for opt_name, make in optimizers:
        model.load_state_dict(initial)
        opt = make(model.parameters())
        for _ in range(3):  # three steps on the same batch: exercises momentum/moment state
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        for tname, cname in names.items():
            out[f"{prefix}.{opt_name}.{cname}"] = dict(model.named_parameters())[tname].detach().clone()
    model.load_state_dict(initial)


def write(path, tensors):
    with open(path, "wb") as f:
        f.write(b"CPSREF01")
        f.write(struct.pack("<I", len(tensors)))
        for name, t in tensors.items():
            t = t.detach().contiguous().float()
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)))
            f.write(nb)
            f.write(struct.pack("<I", t.dim()))
            f.write(struct.pack(f"<{t.dim()}q", *t.shape))
            f.write(t.numpy().astype("<f4").tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=DEFAULT_OUT)
    args = ap.parse_args()
    torch.manual_seed(20240601)
    torch.set_num_threads(1)
    out = {}
    sgd = ("sgd", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-3))
    adam = ("adam", lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=1e-3))
    m, names = mlp()
    run("mlp", m, names, torch.rand(6, 1, 28, 28), torch.randint(0, 10, (6,)), out, [sgd, adam])
    c, names = cnn()
    run("cnn", c, names, torch.rand(4, 1, 28, 28), torch.randint(0, 10, (4,)), out, [sgd])
    # Standalone ops.
    s = torch.randn(5, 7) * 3
    out["op.softmax.input"] = s
    out["op.softmax.output"] = torch.softmax(s, dim=1)
    g = torch.randn(64) * 3
    out["op.gelu.input"] = g
    out["op.gelu.output"] = nn.functional.gelu(g)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    write(args.output, out)
    print(f"wrote {len(out)} tensors to {args.output} ({os.path.getsize(args.output)} bytes), "
          f"torch {torch.__version__}")


if __name__ == "__main__":
    main()
