"""The code blocks of README.md and docs/*.md, read as tests/test_docs.py runs them.

A page's fenced blocks tagged ``bash``, ``sh``, ``console`` or ``python`` are run in order, in
one empty folder per page (with ``examples/`` and ``benchmarks/`` linked in, as a reader runs
them from the repository root). Blocks tagged ``text`` (output, synopses), ``yaml``, ``toml``
or untagged are not run.

An HTML comment right before a block (blank lines between are allowed) says how to run it::

    <!-- docs-test: replace "--epochs 30" "--epochs 1"; replace "--seeds 0,1,2,3" "--seeds 0" -->
    <!-- docs-test: skip "needs a Ray cluster" -->
    <!-- docs-test: creates "runs/leak-high/run.json" "bench/manifest.csv" -->

``replace OLD NEW`` makes the block tiny before it runs (the page shows the real arguments);
``skip REASON`` leaves it out, with a reason the test prints; ``creates PATH...`` checks files
the block must have written. One comment anywhere on a page, ``<!-- docs-test: page slow -->``,
marks the whole page slow (``pytest -m slow``). A ``pip install`` chain (the README's set-up
commands) runs only after its last ``pip install`` step: the test runs in the installed venv.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_LANGS = {"bash": "bash", "sh": "bash", "console": "bash", "python": "python"}
_FENCE = re.compile(r"^```([\w+-]*)\s*$")
_DIRECTIVE = re.compile(r"<!--\s*docs-test:(.*?)-->", re.S)


class DocsDirectiveError(ValueError):
    """A `docs-test:` comment the runner does not understand (a typo must not silently skip)."""


@dataclass(frozen=True)
class Block:
    """One fenced block of a page, with what its `docs-test:` comment asked."""
    page: str
    index: int            # 0-based among the page's fenced blocks
    line: int             # 1-based line of the opening fence
    lang: str
    text: str
    replace: tuple[tuple[str, str], ...] = ()
    skip: str | None = None
    creates: tuple[str, ...] = ()

    @property
    def runs(self) -> bool:
        return self.lang in RUN_LANGS and self.skip is None

    @property
    def first_line(self) -> str:
        return next((ln for ln in self.text.splitlines() if ln.strip()), "")

    def script(self) -> str:
        """The text that runs: replacements applied, a `pip install` chain cut after its install."""
        text = self.text
        for old, new in self.replace:
            if old not in text:
                raise DocsDirectiveError(f"{self.page} block {self.index} (line {self.line}): replace {old!r}: not in the block")
            text = text.replace(old, new)
        if self.lang != "python":
            text = "\n".join(_after_install(ln) for ln in text.splitlines())
        return text


@dataclass
class Page:
    path: Path
    blocks: list[Block] = field(default_factory=list)
    slow: bool = False

    @property
    def name(self) -> str:
        return str(self.path.relative_to(ROOT))


def _after_install(line: str) -> str:
    """`python3 -m venv .venv && ... && pip install -e . && CMD` -> `CMD` (the venv is the test's)."""
    if "pip install" not in line:
        return line
    steps = line.split(" && ")
    last = max(i for i, s in enumerate(steps) if "pip install" in s)
    return " && ".join(steps[last + 1:]) if last + 1 < len(steps) else ":"


def _parts(body: str) -> list[str]:
    """The directive's `;`-separated parts; a `;` inside double quotes belongs to its text."""
    parts, cur, quoted = [], [], False
    for ch in body:
        if ch == '"':
            quoted = not quoted
        if ch == ";" and not quoted:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    return [p.strip() for p in [*parts, "".join(cur)] if p.strip()]


def _parse_directive(body: str, where: str) -> dict:
    out: dict = {"replace": [], "skip": None, "creates": [], "page_slow": False}
    for part in _parts(body):
        try:
            words = shlex.split(part)
        except ValueError as e:
            raise DocsDirectiveError(f"{where}: docs-test directive {part!r}: {e}") from None
        verb, args = words[0], words[1:]
        if verb == "replace" and len(args) == 2:
            out["replace"].append((args[0], args[1]))
        elif verb == "skip" and len(args) == 1 and args[0].strip():
            out["skip"] = args[0]
        elif verb == "creates" and args:
            out["creates"].extend(args)
        elif verb == "page" and args == ["slow"]:
            out["page_slow"] = True
        else:
            raise DocsDirectiveError(f"{where}: docs-test directive {part!r}: expected replace OLD NEW, "
                                     f"skip REASON, creates PATH..., or page slow")
    return out


def read_page(path: Path) -> Page:
    """Every fenced block of one Markdown page, with its directives."""
    page = Page(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    pending: dict | None = None
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            stripped = lines[i].strip()
            if stripped.startswith("<!--"):
                j = i
                while "-->" not in lines[j]:
                    j += 1
                found = _DIRECTIVE.search("\n".join(lines[i:j + 1]))
                if found:
                    d = _parse_directive(found.group(1), f"{page.name}:{i + 1}")
                    page.slow |= d.pop("page_slow")
                    if d["replace"] or d["skip"] or d["creates"]:
                        pending = d
                i = j + 1
                continue
            if stripped and pending is not None:
                raise DocsDirectiveError(f"{page.name}:{i + 1}: a docs-test comment must come right before its block")
            i += 1
            continue
        start, j = i, i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        d = pending or {"replace": [], "skip": None, "creates": []}
        page.blocks.append(Block(page.name, len(page.blocks), start + 1, m.group(1) or "", "\n".join(lines[start + 1:j]),
                                 tuple(d["replace"]), d["skip"], tuple(d["creates"])))
        pending = None
        i = j + 1
    return page


def pages() -> list[Page]:
    """README.md, then docs/*.md by name."""
    return [read_page(p) for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]]
