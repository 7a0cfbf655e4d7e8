"""benchmarks/gpu_check.py: what can be checked without a GPU (its no-CUDA exit, its parser, its training part on the CPU)."""

import argparse
import contextlib
import io
import os
import subprocess
import sys

import pytest
import torch

BENCH = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")


@pytest.fixture
def gpu_check(monkeypatch):
    monkeypatch.syspath_prepend(BENCH)
    import gpu_check

    return gpu_check


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")
def test_without_cuda_it_says_so_and_runs_nothing(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(BENCH, os.pardir), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_check.py")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device is available" in lines[0] and "nothing was run" in lines[0]
    assert os.listdir(tmp_path) == []


def test_the_summary_parser_reads_the_benchmark_tables(gpu_check, monkeypatch):
    monkeypatch.syspath_prepend(BENCH)
    import bench_interventions

    # Known timings: 256 crops in 0.5 s -> 512 crops/s; 256 in 0.02 s -> 12,800/s.
    mine = {"reinhard": (0.5, 0.9, 256), "hed_jitter": (0.02, 0.02, 256), "reinhard twin": (0.4, 0.8, 256)}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bench_interventions.report(64, "cpu", mine, {})
        bench_interventions.report(224, "cuda", {"stain_normalize": (0.25, 0.3, 256)}, {})
    table = gpu_check.parse_bench(out.getvalue())
    assert table == {(64, "cpu"): {"reinhard": 512.0, "hed_jitter": 12800.0}, (224, "cuda"): {"stain_normalize": 1024.0}}


def test_the_training_part_runs_on_the_cpu(gpu_check):
    args = argparse.Namespace(arch="test_resnet", fields_per_class=2, crop_size=16)
    ok, lines = gpu_check.run_training(args, "cpu")
    assert ok and len(lines) == 1
    assert "test_resnet, 1 epoch on" in lines[0] and "same seed twice: identical logits" in lines[0]


def test_the_gradcam_part_runs_on_the_cpu(gpu_check):
    # the maps of the timed check must match captum's LayerGradCam (the part's own verdict)
    args = argparse.Namespace(arch="test_resnet", crop_size=64, gradcam_crops=6, repeats=1)
    ok, lines = gpu_check.run_gradcam(args, "cpu")
    assert ok and len(lines) == 1
    assert "Grad-CAM: test_resnet, 6 crops of 64 px on cpu" in lines[0] and "(ok)" in lines[0]
    assert "forward pass: twin" in lines[0] or "forward pass: plain" in lines[0]
