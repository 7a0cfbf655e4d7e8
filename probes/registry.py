"""The diagnostic registry: names to classes, open to plug-ins (entry-point group
``shortcutlab.diagnostics``), built on `shortcutlab.plugins.Registry`.

A plug-in's ``pyproject.toml``::

    [project.entry-points."shortcutlab.diagnostics"]
    my_probe = "my_package.probe:MyProbe"
"""

from __future__ import annotations

import inspect

from shortcutlab.plugins import Registry

from .base import QUANTITIES, Diagnostic
from .errors import DiagnosticError

ENTRY_POINT_GROUP = "shortcutlab.diagnostics"

REGISTRY = Registry("diagnostic", Diagnostic, ENTRY_POINT_GROUP, DiagnosticError)
register = REGISTRY.register
unregister = REGISTRY.unregister
get = REGISTRY.get
get_class = REGISTRY.get_class
load_entry_points = REGISTRY.load_entry_points


def available(needs: str | None = None) -> list[str]:
    """Sorted registered diagnostic names; with `needs`, only those that need it."""
    return sorted(n for n, c in REGISTRY.classes().items() if needs is None or needs in c.needs)


def suppliers(quantity: str) -> list[tuple[str, str]]:
    """Who supplies a named quantity (`probes.base.QUANTITIES`): ``(name, metric)`` of every
    registered diagnostic whose ``supplies`` maps `quantity` to the metric of its rows that
    carries it, sorted by name. The report finds its rows this way, never by a name.

    Raises:
        DiagnosticError: `quantity` is not one of `QUANTITIES`.

    Example:
        >>> import probes
        >>> probes.suppliers("recoverability")
        [('parent_probe', 'R')]
    """
    if quantity not in QUANTITIES:
        raise DiagnosticError(f"unknown quantity {quantity!r}; known quantities: {', '.join(sorted(QUANTITIES))}")
    return [(n, c.supplies[quantity]) for n, c in sorted(REGISTRY.classes().items()) if quantity in c.supplies]


def settings(name: str) -> dict:
    """The settings of the diagnostic registered as `name`: ``{argument: default}`` of its
    ``__init__`` (`inspect.Parameter.empty` for one without a default), in signature order."""
    cls = get_class(name)
    out = {}
    for p in inspect.signature(cls.__init__).parameters.values():
        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            out[p.name] = p.default
    return out


def describe() -> list[dict]:
    """One entry per registered diagnostic, sorted by name: ``name``, ``needs`` (sorted),
    ``summary`` (the first line of its docstring) and ``settings`` (`settings`)."""
    out = []
    for name in available():
        cls = get_class(name)
        doc = (cls.__doc__ or "").strip()
        out.append({"name": name, "needs": sorted(cls.needs), "summary": doc.splitlines()[0] if doc else "", "settings": settings(name)})
    return out
