"""Write an ImageNet-shaped checkpoint (a 1000-class classifier) for the example, offline.

A real study fine-tunes a backbone from a local ImageNet file (timm's or torchvision's, see
docs/train.md, "Fine-tune a pretrained backbone"). The example cannot download one, so this writes a
randomly initialised timm model of the same shape: its 1000-class head does not fit the
task, which is exactly what `--weights` must handle (the head is dropped and re-initialised,
and run.json records it).

Usage:
    python examples/real_dataset/make_checkpoint.py OUT.safetensors [--arch test_resnet]
"""

from __future__ import annotations

import argparse
import sys

import timm
import torch
from safetensors.torch import save_file


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the .safetensors file to write")
    p.add_argument("--arch", default="test_resnet", help="a timm architecture name (default test_resnet, a tiny ResNet)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    model = timm.create_model(args.arch, num_classes=1000, pretrained=False)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, args.out)
    print(f"wrote {args.out}: {args.arch} with a 1000-class classifier ({sum(v.numel() for v in model.state_dict().values()):,} values)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
