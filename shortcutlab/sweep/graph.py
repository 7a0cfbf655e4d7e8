"""The task graph of a sweep: content-addressed tasks and their dependencies.

A task's id is a hash of its kind, its parameters and the ids of the tasks it depends on, so
two grid points that need the same benchmark, split or model name the same task, and the graph
holds it once. Parameters must be JSON-serialisable; their key order does not matter.

Example:
    >>> from shortcutlab.sweep.graph import Task, TaskGraph
    >>> g = TaskGraph()
    >>> a = g.add("synthesise", {"seed": 0})
    >>> b = g.add("split", {"protocol": "factorial", "seed": 0}, deps=[a])
    >>> g.add("synthesise", {"seed": 0}) == a     # the same task, added once
    True
    >>> [t.kind for t in g.ordered()]
    ['synthesise', 'split']
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from shortcutlab.errors import ShortcutlabError


class GraphError(ShortcutlabError):
    """A task graph is malformed (an unknown dependency, a cycle)."""


def _canonical(obj: Any) -> str:
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise GraphError(f"task parameters must be JSON values (str, number, bool, None, list, dict); {e}") from None


def task_id(kind: str, params: Mapping[str, Any], deps: Iterable[str] = ()) -> str:
    """The content address of a task: the first 16 hex digits of a SHA-256 over its kind,
    its canonical JSON parameters and its dependencies' ids (order kept: deps are positional)."""
    text = _canonical({"kind": kind, "params": dict(params), "deps": list(deps)})
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class Task:
    """One unit of work of a sweep.

    Attributes:
        id: content address (`task_id`).
        kind: what the task does ('synthesise', 'split', 'train', 'diagnose', ...).
        params: its JSON parameters.
        deps: ids of the tasks whose outputs it reads, in a fixed order.
        resources: what an executor must reserve for it: {"cpu": float, "gpu": float}.
    """

    id: str
    kind: str
    params: dict = field(hash=False, compare=False)
    deps: tuple[str, ...] = ()
    resources: dict = field(default_factory=lambda: {"cpu": 1, "gpu": 0}, hash=False, compare=False)


class TaskGraph:
    """Tasks keyed by id, added dependencies first; `ordered()` is a topological order."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}

    def add(self, kind: str, params: Mapping[str, Any], deps: Iterable[str] = (), resources: Mapping[str, float] | None = None) -> str:
        """Add a task (or find the identical one already there) and return its id."""
        deps = tuple(deps)
        missing = [d for d in deps if d not in self._tasks]
        if missing:
            raise GraphError(f"task {kind!r} depends on {missing[0]!r}, which is not in the graph (add dependencies first)")
        tid = task_id(kind, params, deps)
        if tid not in self._tasks:
            res = {"cpu": 1, "gpu": 0, **(dict(resources) if resources else {})}
            self._tasks[tid] = Task(tid, kind, json.loads(_canonical(dict(params))), deps, res)
        return tid

    def __getitem__(self, tid: str) -> Task:
        return self._tasks[tid]

    def __contains__(self, tid: str) -> bool:
        return tid in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def ordered(self) -> list[Task]:
        """All tasks, each after its dependencies (insertion order already is one)."""
        return list(self._tasks.values())

    def counts(self) -> dict[str, int]:
        """Tasks per kind, in order of first appearance."""
        out: dict[str, int] = {}
        for t in self._tasks.values():
            out[t.kind] = out.get(t.kind, 0) + 1
        return out

    def subgraph(self, keep: Iterable[str]) -> list[Task]:
        """The tasks in `keep`, in order, with dependencies outside `keep` dropped (they are done)."""
        keep = set(keep)
        return [Task(t.id, t.kind, t.params, tuple(d for d in t.deps if d in keep), t.resources) for t in self._tasks.values() if t.id in keep]
