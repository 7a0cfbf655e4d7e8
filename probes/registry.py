"""The diagnostic registry: names to classes, open to plug-ins (entry-point group
``shortcutlab.diagnostics``), built on `shortcutlab.plugins.Registry`.

A plug-in's ``pyproject.toml``::

    [project.entry-points."shortcutlab.diagnostics"]
    my_probe = "my_package.probe:MyProbe"
"""

from __future__ import annotations

from shortcutlab.plugins import Registry

from .base import Diagnostic, DiagnosticError

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
