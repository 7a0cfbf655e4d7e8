"""The house rules of ARCHITECTURE.md, read from the source: imports point down the layers,
no two modules import each other (directly or round a longer circle), no module takes a
private name from another, and no module imports the package facade `shortcutlab/__init__.py`.

The imports are read with `ast` from the files (every import, also those inside functions),
so the test does not depend on what happens to be imported at run time.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("shortcutlab", "interventions", "probes")

#: Bottom to top. A module may import its own layer or any layer below; the list is the
#: one in ARCHITECTURE.md. A prefix names a module or a whole subpackage.
LAYERS: list[tuple[str, ...]] = [
    ("shortcutlab.errors", "shortcutlab.version", "shortcutlab.markdown", "shortcutlab.warnings_summary", "shortcutlab.environ"),
    ("shortcutlab.io", "shortcutlab.paths", "shortcutlab.plugins", "shortcutlab.stats"),
    ("shortcutlab.data", "shortcutlab.ingest"),
    ("shortcutlab.synth",),
    ("interventions",),
    ("shortcutlab.models",),
    ("probes",),
    ("shortcutlab.sweep",),
    ("shortcutlab.report",),
    ("shortcutlab.studies",),
    ("shortcutlab.testing", "shortcutlab.cli", "shortcutlab.__main__"),
]


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imports(name: str, path: pathlib.Path) -> list[tuple[str, str, int]]:
    """(imported module, imported name or '', line) for every import of the project's packages."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] in PACKAGES:
                out.extend((mod, a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.Import):
            out.extend((a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] in PACKAGES)
    return out


def _resolve(mod: str, name: str, modules: dict) -> str:
    """`from pkg import sub` names the submodule `pkg.sub` when there is one."""
    return f"{mod}.{name}" if f"{mod}.{name}" in modules else mod


def _layer(module: str) -> int:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"module {module} belongs to no layer: add it to LAYERS and to ARCHITECTURE.md")


MODULES = _modules()
EDGES = {m: [(_resolve(mod, n, MODULES), n, line) for mod, n, line in _imports(m, p)] for m, p in MODULES.items()}


def test_the_reader_sees_known_imports():
    # The reader itself: an absolute import, a relative one, one inside a function and a
    # submodule named by `from package import module` are all seen.
    def targets(m):
        return {(t, n) for t, n, _ in EDGES[m]}

    assert ("shortcutlab.errors", "TableError") in targets("shortcutlab.data.table")
    assert ("probes.validation", "as_numpy") in targets("probes.adversary")
    assert ("shortcutlab.data.dedup", "dedup") in targets("shortcutlab.data.splits")  # inside a function
    assert _layer("shortcutlab.cli") > _layer("probes.base") > _layer("shortcutlab.data.table") > _layer("shortcutlab.errors")


def test_every_module_has_a_layer():
    for m in MODULES:
        if m != "shortcutlab":
            _layer(m)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "shortcutlab"))
def test_imports_point_down(module):
    own = _layer(module)
    up = [f"{module}:{line} imports {target} (layer {_layer(target)} > {own})"
          for target, _, line in EDGES[module] if target != "shortcutlab" and _layer(target) > own]
    assert not up, "; ".join(up)


def test_no_module_imports_the_package_facade():
    # `shortcutlab/__init__.py` imports the data layer; a module importing it (say for
    # __version__) would point up from wherever it sits.
    bad = [f"{m}:{line} imports {n!r} from the package" for m, edges in EDGES.items() if m != "shortcutlab"
           for target, n, line in edges if target == "shortcutlab"]
    assert not bad, "; ".join(bad)


def test_no_private_name_crosses_a_module_line():
    bad = [f"{m}:{line} imports {n} from {target}" for m, edges in EDGES.items()
           for target, n, line in edges
           if n.startswith("_") and not n.startswith("__") and target != m]
    private_modules = [f"{m}:{line} imports the private module {target}" for m, edges in EDGES.items()
                       for target, _, line in edges if any(part.startswith("_") and not part.startswith("__")
                                                           for part in target.split("."))]
    assert not bad + private_modules, "; ".join(bad + private_modules)


def find_circles(edges: dict[str, list]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph = {m: sorted({t for t, _, _ in es if t in edges and t != m}) for m, es in edges.items()}
    index, low, on, stack, comps = {}, {}, set(), [], []

    def push(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        return (v, iter(graph[v]))

    for root in graph:
        if root in index:
            continue
        work = [push(root)]
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    work.append(push(w))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        comps.append(sorted(comp))
    return comps


def test_no_import_circles():
    assert not find_circles(EDGES), f"import circles: {find_circles(EDGES)}"


def test_the_circle_finder_finds_planted_circles():
    # Not vacuous: a two-module circle and a three-module one are found, a chain is not.
    e = lambda *ts: [(t, "x", 1) for t in ts]  # noqa: E731
    assert find_circles({"a": e("b"), "b": e("a"), "c": e("a")}) == [["a", "b"]]
    assert find_circles({"a": e("b"), "b": e("c"), "c": e("a"), "d": e()}) == [["a", "b", "c"]]
    assert find_circles({"a": e("b"), "b": e("c"), "c": e()}) == []
    planted = dict(EDGES, **{"shortcutlab.errors": EDGES["shortcutlab.errors"] + e("shortcutlab.io")})
    assert any("shortcutlab.errors" in c and "shortcutlab.io" in c for c in find_circles(planted))


#: A function longer than this is split into named steps, or says in its docstring why it
#: stays whole (the phrase "stays whole").
MAX_LINES = 80


def long_functions(source: str, name: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_LINES and "stays whole" not in (ast.get_docstring(node) or ""):
                out.append(f"{name}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_functions_are_short_or_say_why():
    too_long = [f for m, p in MODULES.items() for f in long_functions(p.read_text(), m)]
    assert not too_long, "; ".join(too_long)


def test_the_length_rule_sees_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    assert long_functions(f"def f():\n{body}\n", "m") == [f"m:1 f ({MAX_LINES + 1} lines)"]
    assert long_functions(f'def f():\n    """It stays whole: one kernel."""\n{body}\n', "m") == []
    assert long_functions(f"def f():\n{body[: body.rindex(chr(10))]}\n", "m") == []
