"""Training throughput (crops/s) of timm backbones on CPU, as reference figures for sweeps.

Random weights, batch 64, 64 x 64 crops (change with --size), the recipe's augmentation
(batched random resized crop and flips) and an AdamW step, timed after a warm-up. The issue's
reference on 2 cores: resnet18 about 160 crops/s, resnet10t about 230, test_resnet about 880.

    python benchmarks/bench_training.py [--archs test_resnet,resnet10t,resnet18] [--size 64] [--steps 6]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from shortcutlab.models.adapter import create_model, wrap
from shortcutlab.models.recipe import _flip, random_resized_crop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", default="test_resnet,resnet10t,resnet18")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.size} x {args.size}, batch {args.batch}")
    g = torch.Generator().manual_seed(0)
    x_all = torch.rand(args.batch, 3, args.size, args.size, generator=g)
    y = torch.randint(0, 3, (args.batch,), generator=g)
    for arch in args.archs.split(","):
        torch.manual_seed(0)
        model = create_model(arch, num_classes=3)
        adapter = wrap(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model.train()

        def step():
            x = random_resized_crop(x_all, (0.5, 1.0), (3 / 4, 4 / 3), g)
            x = _flip(_flip(x, -1, g), -2, g)
            loss = F.cross_entropy(adapter.logits(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

        step()  # warm-up
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        dt = time.perf_counter() - t0
        print(f"  {arch:<14} {args.steps * args.batch / dt:8.0f} crops/s")


if __name__ == "__main__":
    main()
