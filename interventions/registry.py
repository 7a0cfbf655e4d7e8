"""The intervention registry: names to classes, open to third-party plug-ins.

Built-in interventions register with the `register` decorator when the package is imported.
Other packages join through the entry-point group ``shortcutlab.interventions``: each entry
point names either an `Intervention` subclass (registered under the entry point's name) or a
module whose import registers its classes with `register`. For example, in a plug-in's
``pyproject.toml``::

    [project.entry-points."shortcutlab.interventions"]
    my_blur = "my_package.blur:MyBlur"

Entry points are loaded once, on the first call to `get`, `get_class` or `available`.

Example:
    >>> import interventions
    >>> "greyscale" in interventions.available()
    True
    >>> interventions.get("low_pass", sigma=2.0).sigma
    2.0
"""

from __future__ import annotations

from shortcutlab.plugins import Registry

from .base import Intervention, InterventionError

ENTRY_POINT_GROUP = "shortcutlab.interventions"

#: The registered interventions (`shortcutlab.plugins.Registry`, as the diagnostics' registry).
REGISTRY = Registry("intervention", Intervention, ENTRY_POINT_GROUP, InterventionError)

#: Class decorator: register an `Intervention` subclass under a name (default: its `name`);
#: `InterventionError` when the name is taken (naming both sources) or empty, or the class is
#: not an `Intervention`.
register = REGISTRY.register
#: Remove a registered name (for tests and interactive work).
unregister = REGISTRY.unregister
#: The class registered under a name; an unknown name lists the close matches.
get_class = REGISTRY.get_class
#: Instantiate the intervention registered under a name with keyword parameters; an unknown
#: name or a parameter the intervention does not take is an `InterventionError`.
get = REGISTRY.get
#: Import the plug-ins of the entry-point group once (``force=True``: again); a plug-in that fails
#: to import is skipped with a warning naming it, one that takes a registered name raises.
#: Returns the names of the entry points loaded in this call.
load_entry_points = REGISTRY.load_entry_points


def available(requires_mask: bool | None = None, stochastic: bool | None = None, label_conditioned: bool | None = None) -> list[str]:
    """Sorted registered names, optionally filtered by the metadata class attributes."""
    out = []
    for name, cls in REGISTRY.classes().items():
        if requires_mask is not None and cls.requires_mask != requires_mask:
            continue
        if stochastic is not None and cls.stochastic != stochastic:
            continue
        if label_conditioned is not None and cls.label_conditioned != label_conditioned:
            continue
        out.append(name)
    return sorted(out)
