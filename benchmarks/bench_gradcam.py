"""Benchmark Grad-CAM + outside mass + the randomised-head check against pytorch-grad-cam and captum.

Over 1,000 crops of 64 x 64 on resnet18 (random weights, eval mode, CPU): the whole of ours
(the Grad-CAM maps of the predicted classes, their outside-the-cell mass on centred disc
masks, and the randomised-head check: re-initialised head, maps again, per-crop Spearman and
the random-pair baseline) against pytorch-grad-cam's ``GradCAM`` and captum computing the
maps alone. Issue 9's goal of 5x pytorch-grad-cam is retired on CPU (issue 25: the whole
check costs about one forward pass, which bounds it). The same run times, on the same crops
and batches:

- ours, all of the above (``probes.randomized_head_check``; the fast path, since resnet18
  pools its last stage globally into one linear head);
- ours, the same through the autograd path (``path="autograd"``), for any other head;
- ours, the maps alone (``probes.gradcam``);
- a bare forward pass of the model without autograd, the floor of any Grad-CAM, and the same
  on the BN-folded, channels-last inference twin (``forward_choice`` says which of the two
  our fast path runs on this machine: the twin only where it measured faster);
- pytorch-grad-cam ``GradCAM(model, target_layers=[layer4])`` with ``targets=None`` (the
  predicted classes), maps alone;
- captum ``LayerGradCam(model, layer4).attribute(x, target, relu_attributions=True)`` with
  ``LayerAttribution.interpolate(..., "bilinear")``, maps alone, given the predicted classes
  (their forward pass is not timed: this favours captum).

The anchors are skipped with a message when not installed (``pip install -e .[bench]``).
Each method runs over all crops in batches of --batch, best of --repeats, methods interleaved
so that a busy neighbour slows all alike; crops/s are reported from wall time and from this
process's CPU time (steadier on a shared machine). The maps are compared too: ours against
captum (max relative difference) and, after pytorch-grad-cam's per-map min-max scaling,
against pytorch-grad-cam. Timings are reported, never asserted.

    python benchmarks/bench_gradcam.py                  # 1,000 crops, 64 px, resnet18
    python benchmarks/bench_gradcam.py --threads 1      # steadier on a shared machine
    python benchmarks/bench_gradcam.py --quick          # 250 crops, one repeat
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable

import numpy as np
import torch

from _machine import numpy_reference_ms  # benchmarks/ is on sys.path when a script runs

try:
    import probes
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    import probes

from probes.saliency import forward_choice, gradcam, randomized_head_check
from shortcutlab.models.adapter import create_model, wrap



def disc_masks(n: int, size: int) -> torch.Tensor:
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    c = (size - 1) / 2
    disc = ((yy - c) ** 2 + (xx - c) ** 2 <= (size / 3) ** 2).float()
    return disc.expand(n, 1, size, size).clone()


def batches(n: int, b: int) -> list[slice]:
    return [slice(s, min(s + b, n)) for s in range(0, n, b)]


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--crops", type=int, default=1000)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=250, help="crops per call (every method)")
    ap.add_argument("--arch", default="resnet18")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--quick", action="store_true", help="250 crops, one repeat")
    args = ap.parse_args()
    if args.quick:
        args.crops, args.repeats = 250, 1
    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"bench_gradcam: {args.crops} crops of {args.size} x {args.size}, {args.arch} (random weights), batches of {args.batch}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, machine reference {numpy_reference_ms():.1f} ms")
    torch.manual_seed(0)
    adapter = wrap(create_model(args.arch, num_classes=5)).eval()
    g = torch.Generator().manual_seed(0)
    x = torch.rand(args.crops, 3, args.size, args.size, generator=g)
    masks = disc_masks(args.crops, args.size)
    parts = batches(args.crops, args.batch)
    with torch.no_grad():
        preds = torch.cat([adapter.logits(x[p]).argmax(1) for p in parts])
    layer = adapter.cam_layer
    print(f"  cam_layer={adapter.cam_layer_name!r}, head={adapter.head_name!r}, fast path: "
          f"{probes.saliency.fast_path_reason(adapter, x[:8]) or 'applies'}")

    methods: dict[str, Callable[[], object]] = {}
    results: dict[str, list] = {}

    def ours_all(path: str):
        def run():
            out = [randomized_head_check(adapter, x[p], None, masks[p], seed=0, path=path) for p in parts]
            results[f"check_{path}"] = out
        return run

    methods["ours: maps + outside mass + randomised head (fast)"] = ours_all("auto")
    methods["ours: the same, autograd path"] = ours_all("autograd")

    def ours_maps():
        results["ours_maps"] = torch.cat([gradcam(adapter, x[p], None) for p in parts])

    methods["ours: maps alone"] = ours_maps

    def bare_forward():  # the floor for any Grad-CAM: one forward pass without autograd
        with torch.no_grad():
            for p in parts:
                adapter.logits(x[p])

    bare = "a bare forward pass (no grad), for scale"
    methods[bare] = bare_forward
    twin = probes.saliency._inference_twin(adapter, x[:16])

    def twin_forward():  # the floor of ours: the BN-folded, channels-last twin's forward pass
        with torch.no_grad():
            for p in parts:
                twin.logits(x[p].contiguous(memory_format=torch.channels_last))

    if twin is not None:
        methods["the same on ours' BN-folded channels-last twin"] = twin_forward
    print(f"  forward pass ours runs on: {forward_choice(adapter, x[: args.batch])} (timed once at first use; "
          "'twin' only where it measured faster)")

    anchors: list[str] = []
    try:
        from pytorch_grad_cam import GradCAM

        def pgc():
            with GradCAM(model=adapter, target_layers=[layer]) as cam:
                results["pgc"] = np.concatenate([cam(input_tensor=x[p], targets=None) for p in parts])

        methods["pytorch-grad-cam GradCAM: maps alone"] = pgc
        anchors.append("pytorch-grad-cam GradCAM: maps alone")
    except ImportError:
        print("  pytorch-grad-cam is not installed (pip install grad-cam, or the [bench] extra): its row is skipped")
    try:
        from captum.attr import LayerAttribution, LayerGradCam

        lgc = LayerGradCam(adapter, layer)

        def cap():
            out = []
            for p in parts:
                a = lgc.attribute(x[p], target=preds[p], relu_attributions=True)
                out.append(LayerAttribution.interpolate(a, (args.size, args.size), interpolate_mode="bilinear")[:, 0].detach())
            results["captum"] = torch.cat(out)

        methods["captum LayerGradCam: maps alone"] = cap
        anchors.append("captum LayerGradCam: maps alone")
    except ImportError:
        print("  captum is not installed: its row is skipped")

    randomized_head_check(adapter, x[:8], None, masks[:8])  # warm-up (later repeats warm the anchors)
    best = {k: (float("inf"), float("inf")) for k in methods}
    for _ in range(args.repeats):
        for name, fn in methods.items():
            w, c = timed(fn)
            best[name] = (min(best[name][0], w), min(best[name][1], c))
    for p in adapter.parameters():
        p.grad = None

    print(f"\n  {'method':54s} {'crops/s':>9s} {'(cpu)':>9s}")
    for name, (w, c) in best.items():
        print(f"  {name:54s} {args.crops / w:9.1f} {args.crops / c:9.1f}")
    print("\n  speed ratios, the anchor's time over ours (> 1: ours is faster; wall, cpu):")
    for a in [*anchors, bare]:
        aw, ac = best[a]
        for ours_name in ("ours: maps + outside mass + randomised head (fast)", "ours: the same, autograd path", "ours: maps alone"):
            ow, oc = best[ours_name]
            print(f"    {ours_name:52s} vs {a:40s} {aw / ow:6.2f}x {ac / oc:6.2f}x")
    if twin is not None:
        (bw, bc), (tw, tc) = best[bare], best["the same on ours' BN-folded channels-last twin"]
        print(f"    {'the BN-folded twin forward':52s} vs {bare:40s} {bw / tw:6.2f}x {bc / tc:6.2f}x")

    # agreement of the maps
    ours_maps_t = results["ours_maps"]
    checks = results["check_auto"]
    fast_maps = torch.cat([c.maps for c in checks])
    print("\n  agreement:")
    print(f"    fast check maps vs gradcam maps:          max abs diff {float((fast_maps - ours_maps_t).abs().max()):.3g}")
    auto_maps = torch.cat([c.maps for c in results["check_autograd"]])
    scale = float(ours_maps_t.abs().max())
    print(f"    fast vs autograd path (relative to max):  {float((fast_maps - auto_maps).abs().max()) / scale:.3g}")
    if "captum" in results:
        print(f"    ours vs captum (relative to max):         {float((ours_maps_t - results['captum']).abs().max()) / scale:.3g}")
    if "pgc" in results:
        m = ours_maps_t.numpy()
        lo = m.reshape(len(m), -1).min(1)[:, None, None]
        hi = m.reshape(len(m), -1).max(1)[:, None, None]
        norm = (m - lo) / np.maximum(hi - lo, 1e-7)
        print(f"    ours (min-max scaled) vs pytorch-grad-cam: max abs diff {float(np.abs(norm - results['pgc']).max()):.3g}")
    om = torch.cat([c.outside_mass for c in checks]).numpy()
    rho = torch.cat([c.spearman for c in checks]).numpy()
    pair = torch.cat([c.random_pair_spearman for c in checks]).numpy()
    print(f"\n  results: outside mass mean {np.nanmean(om):.3f} ({np.isnan(om).sum()} NaN), randomised-head median rho "
          f"{np.nanmedian(rho):.3f} ({np.isnan(rho).sum()} NaN), random-pair median rho {np.nanmedian(pair):.3f}")


if __name__ == "__main__":
    main()
