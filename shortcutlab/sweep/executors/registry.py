"""The executor registry: names to classes, open to plug-ins (entry-point group
``shortcutlab.executors``), built on `shortcutlab.plugins.Registry` as the interventions' and
diagnostics' registries.

An executor follows the `Executor` protocol of `shortcutlab.sweep.executors.base` (a ``run``
method; no base class needed). Built-ins register when `shortcutlab.sweep.executors` is
imported: ``local`` (`LocalExecutor`) and ``ray`` (`RayExecutor`, whose module imports Ray only
when an executor is made). A plug-in's ``pyproject.toml``::

    [project.entry-points."shortcutlab.executors"]
    slurm = "my_package.slurm:SlurmExecutor"

`shortcutlab sweep --executor NAME` offers every registered name.

Example:
    >>> from shortcutlab.sweep.executors import available, get_executor
    >>> "local" in available()
    True
    >>> get_executor("local", workers=2).workers
    2
"""

from __future__ import annotations

import inspect
from typing import Any

from shortcutlab.plugins import Registry
from shortcutlab.sweep.executors.base import Executor, ExecutorError

ENTRY_POINT_GROUP = "shortcutlab.executors"

#: The executor a sweep uses unless told otherwise (in this process, or a local pool).
DEFAULT_EXECUTOR = "local"

#: The registered executors (classes with the methods of the `Executor` protocol).
REGISTRY = Registry("executor", Executor, ENTRY_POINT_GROUP, ExecutorError, protocol=True)

#: Class decorator: register an executor class under a name (default: its `name`);
#: `ExecutorError` when the name is taken (naming both sources) or empty, or the class has no
#: ``run`` method.
register = REGISTRY.register
#: Remove a registered name (for tests and interactive work).
unregister = REGISTRY.unregister
#: The class registered under a name; an unknown name is an `ExecutorError` listing the
#: registered ones.
get_class = REGISTRY.get_class
#: Import the plug-ins of the entry-point group once (``force=True``: again).
load_entry_points = REGISTRY.load_entry_points


def available() -> list[str]:
    """Sorted registered executor names (built-ins and plug-ins)."""
    return sorted(REGISTRY.classes())


def options(name: str) -> list[str]:
    """The keyword options the executor registered as `name` takes, in signature order."""
    sig = inspect.signature(get_class(name).__init__)
    return [p.name for p in sig.parameters.values() if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def get_executor(name: str = DEFAULT_EXECUTOR, **opts: Any) -> Executor:
    """An executor by registered name, made with `opts` ('local': workers; 'ray': address, ...).

    Raises:
        ExecutorError: an unknown name (the message lists the registered ones) or an option
            the executor does not take (the message lists those it takes).
    """
    return REGISTRY.get(name, **opts)
