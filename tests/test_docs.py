"""Docs that run: every shell and Python block of README.md and docs/*.md, in order per page.

One test per page, in an empty folder of its own, on tiny data (each page's `docs-test:`
comments shrink its arguments; tests/docs_blocks.py describes them). A failure names the page,
the block, its first line and the tail of its output. No test reads a printed figure: a block
passes when it exits 0 and writes the files its `creates` names. Pages that train many models
are marked slow by a `<!-- docs-test: page slow -->` comment.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from docs_blocks import RUN_LANGS, ROOT, Block, pages

PAGES = pages()
MAX_SKIPS = 8            # skips stay rare: a block that cannot run here says why
BLOCK_TIMEOUT_S = 600
SUMMARY: dict[str, dict] = {}   # page -> ran, skipped (reasons), seconds; printed by conftest
_FIRST_BLOCKS: dict[str, Path] = {}   # a page's first block's script -> a copy of what it wrote
_LINKS = ("examples", "benchmarks", "tests")


def _env() -> dict:
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["MPLBACKEND"] = "Agg"
    return env


def _run(block: Block, cwd: Path, env: dict) -> None:
    script = block.script()
    if RUN_LANGS[block.lang] == "python":
        argv = [sys.executable, "-c", script]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-c", script]
    where = f"{block.page} block {block.index} (line {block.line}) `{block.first_line}`"
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        done = None
    if done is None:
        pytest.fail(f"{where}: ran past {BLOCK_TIMEOUT_S} s", pytrace=False)
    if done.returncode != 0:
        tail = (done.stdout[-1500:] + "\n--- stderr ---\n" + done.stderr[-3000:]).strip()
        pytest.fail(f"{where}: exit {done.returncode}\n{tail}", pytrace=False)
    missing = [p for p in block.creates if not (cwd / p).exists()]
    if missing:
        pytest.fail(f"{where}: did not write {', '.join(missing)}", pytrace=False)


def _copy(src: Path, dst: Path) -> None:
    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dst, symlinks=True)
    else:
        shutil.copy2(src, dst, follow_symlinks=False)


def _first_block(block: Block, cwd: Path, env: dict, factory) -> None:
    """A page's first block runs in an empty folder, so one that another page's first block
    already ran, character for character (the tiny sweep that Sweeps, Statistics and Report
    start from), runs once per session: the later page starts from a copy of what it wrote."""
    script = block.script()
    done = _FIRST_BLOCKS.get(script)
    if done is None:
        _run(block, cwd, env)
        done = factory.mktemp("first-block")
        for entry in cwd.iterdir():
            if entry.name not in _LINKS:
                _copy(entry, done / entry.name)
        _FIRST_BLOCKS[script] = done
        return
    for entry in done.iterdir():
        _copy(entry, cwd / entry.name)
    missing = [p for p in block.creates if not (cwd / p).exists()]
    assert not missing, missing


def _params():
    for page in PAGES:
        if any(b.lang in RUN_LANGS for b in page.blocks):
            yield pytest.param(page, id=page.name, marks=[pytest.mark.slow] if page.slow else [])


@pytest.mark.parametrize("page", list(_params()))
def test_page_runs(page, tmp_path, tmp_path_factory):
    """Each runnable block of the page exits 0, in order, in one fresh folder."""
    for name in _LINKS:
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    env = _env()
    t0 = time.perf_counter()
    ran, skipped = 0, []
    for block in page.blocks:
        if block.lang not in RUN_LANGS:
            continue
        if block.skip is not None:
            skipped.append(f"block {block.index}: {block.skip}")
            continue
        if ran == 0:
            _first_block(block, tmp_path, env, tmp_path_factory)
        else:
            _run(block, tmp_path, env)
        ran += 1
    SUMMARY[page.name] = {"ran": ran, "skipped": skipped, "seconds": time.perf_counter() - t0}
    print(f"{page.name}: {ran} blocks ran, {len(skipped)} skipped, {time.perf_counter() - t0:.1f} s")


def test_skips_are_few_and_say_why():
    skipped = [(b.page, b.index, b.skip) for p in PAGES for b in p.blocks if b.skip is not None]
    assert all(reason.strip() for _, _, reason in skipped)
    assert len(skipped) <= MAX_SKIPS, skipped


def test_runnable_blocks_use_a_known_tag():
    """A block meant to run but tagged `shell` or `py` would silently not run."""
    tags = {b.lang for p in PAGES for b in p.blocks}
    assert tags <= set(RUN_LANGS) | {"text", "yaml", "toml", ""}, tags


def test_readme_test_command_is_what_ci_runs():
    """README's test command is, character for character, a line of .ci/run (which CI runs)."""
    readme = next(p for p in PAGES if p.name == "README.md")
    commands = [b.text.strip() for b in readme.blocks if "pytest" in b.text and "pip install" in b.text]
    assert len(commands) == 1, commands
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert commands[0] in ci


def test_readme_is_a_front_page_that_maps_every_docs_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 150
    linked = set(re.findall(r"\(docs/([\w.-]+\.md)", readme))
    assert {p.name for p in (ROOT / "docs").glob("*.md")} <= linked


def test_relative_links_resolve():
    """Every relative Markdown link in README.md and docs/*.md names a file that exists."""
    broken = []
    for page in PAGES:
        text = page.path.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (page.path.parent / target.split("#")[0]).exists():
                broken.append(f"{page.name}: {target}")
    assert not broken, broken
