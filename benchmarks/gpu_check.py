"""The GPU check: intervention throughput, one deterministic training epoch and the device tests, on CUDA.

Run it whenever a CUDA GPU is at hand (issue 8, item 11) and put its summary in docs/benchmarks.md:

    python benchmarks/gpu_check.py                 # everything (a few minutes)
    python benchmarks/gpu_check.py --quick         # fewer repeats, a smaller benchmark
    python benchmarks/gpu_check.py --skip-bench    # training and device tests only

Four parts, each reported in one summary at the end:

1. ``benchmarks/bench_interventions.py --sizes 64,224``: the batched interventions on the CPU
   and on the GPU at 64 and 224 px, with the per-image CPU anchors; its full table is printed
   as it runs, the summary keeps the GPU crops/s of each intervention module.
2. One training epoch with the recipe on a synthetic benchmark (rendered with ``shortcutlab
   synth`` into a temporary folder, ``parent`` split), on CUDA with deterministic algorithms,
   PreciseBN and the parent adversary, run twice with the same seed: the two runs must give
   bit-identical logits. Reports crops/s.
3. The Grad-CAM check (``probes.randomized_head_check``: maps, outside mass, randomised head)
   on ``--arch`` at ``--crop-size`` over ``--gradcam-crops`` crops on CUDA, beside the maps
   alone and a bare forward pass, with the forward pass ``forward_choice`` picked (the
   BN-folded twin or the plain model); its maps must match captum's ``LayerGradCam`` to 1e-4.
4. ``pytest -m device``: the tests marked for an accelerator (the CUDA parameter of the
   intervention contract, CUDA training and PreciseBN).

Exit status: 0 when every part ran and passed, 1 when a part failed, 2 when no CUDA device is
available (nothing is run).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

# Deterministic cuBLAS needs this before CUDA starts; shortcutlab.models.recipe sets it too.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, ROOT)


def no_cuda_message() -> str | None:
    """None when CUDA is usable, else a one-line reason (nothing else is run then)."""
    import torch

    if torch.cuda.is_available():
        return None
    build = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
    return (
        f"gpu_check: no CUDA device is available (torch {torch.__version__}, {build}; "
        "torch.cuda.is_available() is False). Run it on a machine with an NVIDIA GPU; nothing was run."
    )


def parse_bench(text: str) -> dict[tuple[int, str], dict[str, float]]:
    """Crops/s (wall) of every intervention module in bench_interventions' output.

    Returns:
        {(size, device): {intervention: crops per second}}.
    """
    out: dict[tuple[int, str], dict[str, float]] = {}
    block = None
    for line in text.splitlines():
        head = re.match(r"^(\d+) x \d+ crops, interventions on (\w+)", line)
        if head:
            block = (int(head.group(1)), head.group(2))
            out[block] = {}
            continue
        row = re.match(r"^\s+(\w+) \(module\)\s+(\d+)\s+([\d.]+)\s", line)
        if row and block is not None:
            out[block][row.group(1)] = float(row.group(3))
    return out


def run_bench(args) -> tuple[bool, list[str]]:
    cmd = [sys.executable, os.path.join(HERE, "bench_interventions.py"), "--sizes", "64,224", "--repeats", str(args.repeats), "--anchor-crops", str(args.anchor_crops)]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    print(proc.stdout, end="")
    if proc.returncode != 0:
        print(proc.stderr, end="", file=sys.stderr)
        return False, [f"intervention benchmark FAILED (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'no message'}"]
    table = parse_bench(proc.stdout)
    lines = []
    for size in (64, 224):
        gpu, cpu = table.get((size, "cuda"), {}), table.get((size, "cpu"), {})
        if not gpu:
            return False, [f"intervention benchmark: no CUDA figures at {size} px in its output"]
        parts = [f"{name} {rate:,.0f}" + (f" ({rate / cpu[name]:.0f}x cpu)" if cpu.get(name) else "") for name, rate in gpu.items()]
        lines.append(f"interventions at {size} px, crops/s on cuda (batch 256): " + ", ".join(parts))
    return True, lines


def run_training(args, device: str) -> tuple[bool, list[str]]:
    import numpy as np
    import pandas as pd

    from shortcutlab.cli import main as cli
    from shortcutlab.data.images import load_manifest_table
    from shortcutlab.models.recipe import TrainConfig, train

    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        bench, split = os.path.join(tmp, "bench"), os.path.join(tmp, "split.csv")
        t = time.perf_counter()
        rc = cli(["synth", "--out", bench, "--fields-per-class", str(args.fields_per_class), "--crop-size", str(args.crop_size)])
        rc = rc or cli(["split", os.path.join(bench, "manifest.csv"), "--id", "id", "--label", "label", "--parent", "parent", "--protocol", "parent", "--test-fraction", "0.2", "--out", split])
        if rc:
            return False, [f"training: could not build the synthetic benchmark (exit {rc})"]
        print(f"synthetic benchmark and split in {time.perf_counter() - t:.1f} s", flush=True)
        table = load_manifest_table(os.path.join(bench, "manifest.csv"))
        cfg = TrainConfig(arch=args.arch, epochs=1, batch_size=64, lr=1e-3, precise_bn=True, adversary_weight=0.1, seed=0, device=device)
        records, logits = [], []
        for run in ("a", "b"):
            out = os.path.join(tmp, run)
            records.append(train(table, split, out, cfg, progress=False))
            logits.append(pd.read_csv(os.path.join(out, "logits.csv")).filter(like="logit_").to_numpy())
        same = np.array_equal(logits[0], logits[1]) and records[0].epoch_loss == records[1].epoch_loss
        rec = records[0]
        line = (
            f"training: {args.arch}, 1 epoch on {rec.n_crops['train']} crops of {args.crop_size} px on {device} "
            f"(deterministic algorithms, PreciseBN, adversary): {rec.durations_s['train_crops_per_s']:,.0f} crops/s; "
            f"same seed twice: {'identical logits' if same else 'DIFFERENT logits (max diff %.3g)' % float(np.abs(logits[0] - logits[1]).max())}"
        )
        return same, [line]


def run_gradcam(args, device: str) -> tuple[bool, list[str]]:
    """Time the whole Grad-CAM check (maps, outside mass, randomised head) on `device`, beside
    the maps alone and a bare forward pass of the model; check the maps against captum's."""
    import torch

    from probes.saliency import forward_choice, gradcam, randomized_head_check
    from shortcutlab.models.adapter import create_model, wrap

    torch.manual_seed(0)
    adapter = wrap(create_model(args.arch, num_classes=5)).to(device).eval()
    n, size, b = args.gradcam_crops, args.crop_size, min(250, args.gradcam_crops)
    x = torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(0)).to(device)
    masks = torch.zeros(n, 1, size, size, device=device)
    masks[..., size // 4 : 3 * size // 4, size // 4 : 3 * size // 4] = 1
    parts = [slice(s, min(s + b, n)) for s in range(0, n, b)]
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    choice = forward_choice(adapter, x[parts[0]])

    def check():
        return [randomized_head_check(adapter, x[p], None, masks[p], seed=0) for p in parts]

    def maps():
        return torch.cat([gradcam(adapter, x[p], None) for p in parts])

    def forward():
        with torch.no_grad():
            return [adapter.logits(x[p]) for p in parts]

    rates, out = {}, {}
    for name, fn in (("check", check), ("maps", maps), ("forward", forward)):
        fn()  # warm-up
        best = float("inf")
        for _ in range(args.repeats):
            sync()
            t = time.perf_counter()
            out[name] = fn()
            sync()
            best = min(best, time.perf_counter() - t)
        rates[name] = n / best
    line = (f"Grad-CAM: {args.arch}, {n} crops of {size} px on {device}, crops/s: whole check {rates['check']:,.0f}, "
            f"maps alone {rates['maps']:,.0f}, bare forward {rates['forward']:,.0f} "
            f"(check / forward {rates['check'] / rates['forward']:.2f}x); forward pass: {choice}")
    try:
        from captum.attr import LayerAttribution, LayerGradCam
    except ImportError:
        return True, [line + "; captum not installed, maps not compared"]
    p = parts[0]
    t = torch.cat([o.argmax(1) for o in out["forward"]])[p]
    ref = LayerGradCam(adapter, adapter.cam_layer).attribute(x[p], target=t, relu_attributions=True)
    ref = LayerAttribution.interpolate(ref, (size, size), interpolate_mode="bilinear")[:, 0].detach()
    ours = out["check"][0].maps
    rel = float((ours - ref).abs().max()) / max(float(ref.abs().max()), 1e-12)
    ok = rel <= 1e-4
    return ok, [line + f"; maps vs captum LayerGradCam: max relative difference {rel:.2g} ({'ok' if ok else 'OVER 1e-4'})"]


def run_device_tests() -> tuple[bool, list[str]]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "device", "tests"]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    print(proc.stdout[-4000:], end="")
    last = [line for line in proc.stdout.strip().splitlines() if line.strip()][-1:] or ["no output"]
    if proc.returncode == 5:
        return False, ["device tests: none were selected (pytest -m device)"]
    # On a GPU the device tests must run: all of them skipped means CUDA was not seen.
    ok = proc.returncode == 0 and " passed" in last[0]
    return ok, [f"device tests (pytest -m device): {last[0].strip('= ')}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="CUDA device to train on (default: cuda)")
    ap.add_argument("--arch", default="resnet18", help="timm model of the training epoch (random weights)")
    ap.add_argument("--fields-per-class", type=int, default=200, help="synthetic benchmark size (3 classes, ~6 crops per field)")
    ap.add_argument("--crop-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="intervention benchmark repeats")
    ap.add_argument("--anchor-crops", type=int, default=64, help="crops the per-image CPU anchors loop over")
    ap.add_argument("--quick", action="store_true", help="2 repeats, 16 anchor crops, 50 fields per class, 250 Grad-CAM crops")
    ap.add_argument("--gradcam-crops", type=int, default=1000, help="crops the Grad-CAM timing runs over")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--skip-gradcam", action="store_true")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--skip-tests", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats, args.anchor_crops, args.fields_per_class, args.gradcam_crops = 2, 16, 50, 250

    reason = no_cuda_message()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    import torch

    from shortcutlab.errors import ShortcutlabError
    from shortcutlab.models.devices import resolve_device

    try:
        device = resolve_device(args.device)
    except ShortcutlabError as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device)
    header = f"GPU check on {name} ({device}), torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
    print(header, flush=True)
    t0 = time.perf_counter()
    parts = []
    for skip, label, fn in (
        (args.skip_bench, "intervention benchmark", lambda: run_bench(args)),
        (args.skip_gradcam, "Grad-CAM", lambda: run_gradcam(args, str(device))),
        (args.skip_train, "training", lambda: run_training(args, str(device))),
        (args.skip_tests, "device tests", run_device_tests),
    ):
        if skip:
            parts.append((True, [f"{label}: skipped"]))
            continue
        print(f"\n== {label} ==", flush=True)
        try:
            parts.append(fn())
        except Exception as e:  # report every part, then fail
            parts.append((False, [f"{label} FAILED: {type(e).__name__}: {e}"]))
    ok = all(p[0] for p in parts)
    print(f"\n== summary ==\n{header}")
    for _, lines in parts:
        for line in lines:
            print(f"  {line}")
    print(f"  {'all checks passed' if ok else 'SOME CHECKS FAILED'} in {(time.perf_counter() - t0) / 60:.1f} min")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
