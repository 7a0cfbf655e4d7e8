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

import difflib
import inspect
import warnings
from importlib import metadata
from typing import Callable, TypeVar

from .base import Intervention, InterventionError

ENTRY_POINT_GROUP = "shortcutlab.interventions"

_REGISTRY: dict[str, type[Intervention]] = {}
_SOURCES: dict[str, str] = {}
_entry_points_loaded = False

T = TypeVar("T", bound=type[Intervention])


def _source(obj) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def register(name: str | None = None) -> Callable[[T], T]:
    """Class decorator: register an `Intervention` subclass under `name` (default: its `name`).

    Raises:
        InterventionError: the name is taken (the message names both sources), empty, or the
            class is not an `Intervention`.
    """

    def deco(cls: T) -> T:
        _add(name or getattr(cls, "name", ""), cls)
        return cls

    return deco


def _add(name: str, cls) -> None:
    if not (inspect.isclass(cls) and issubclass(cls, Intervention)):
        raise InterventionError(f"only Intervention subclasses can be registered; {name!r} is {cls!r}")
    if not name or not name.isidentifier():
        raise InterventionError(f"an intervention name must be a non-empty identifier; got {name!r} for {_source(cls)}")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise InterventionError(f"intervention name {name!r} is already registered by {_SOURCES[name]}; {_source(cls)} cannot take it too")
    cls.name = name
    _REGISTRY[name] = cls
    _SOURCES[name] = _source(cls)


def unregister(name: str) -> None:
    """Remove a registered name (for tests and interactive work)."""
    _REGISTRY.pop(name, None)
    _SOURCES.pop(name, None)


def load_entry_points(force: bool = False) -> list[str]:
    """Import the plug-ins of the ``shortcutlab.interventions`` entry-point group.

    A plug-in that fails to import is skipped with a warning naming it, so one broken
    package does not take the built-ins down; a plug-in that takes a registered name raises.

    Returns:
        The names of the entry points loaded in this call.
    """
    global _entry_points_loaded
    if _entry_points_loaded and not force:
        return []
    _entry_points_loaded = True
    loaded = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as err:  # a broken plug-in must not hide the built-ins
            warnings.warn(f"shortcutlab intervention plug-in {ep.name!r} ({ep.value}) failed to load: {err!r}", stacklevel=2)
            continue
        if inspect.isclass(obj):
            _add(ep.name, obj)
        loaded.append(ep.name)
    return loaded


def available(requires_mask: bool | None = None, stochastic: bool | None = None, label_conditioned: bool | None = None) -> list[str]:
    """Sorted registered names, optionally filtered by the metadata class attributes."""
    load_entry_points()
    out = []
    for name, cls in _REGISTRY.items():
        if requires_mask is not None and cls.requires_mask != requires_mask:
            continue
        if stochastic is not None and cls.stochastic != stochastic:
            continue
        if label_conditioned is not None and cls.label_conditioned != label_conditioned:
            continue
        out.append(name)
    return sorted(out)


def get_class(name: str) -> type[Intervention]:
    """The class registered under `name`; unknown names list the close matches."""
    load_entry_points()
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise InterventionError(f"unknown intervention {name!r}{hint} Available: {', '.join(sorted(_REGISTRY))}") from None


def get(name: str, **params) -> Intervention:
    """Instantiate the intervention registered under `name` with `params`.

    Raises:
        InterventionError: unknown name, or a parameter the intervention does not take.
    """
    cls = get_class(name)
    sig = inspect.signature(cls.__init__)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    unknown = [k for k in params if k not in sig.parameters or k == "self"]
    if unknown and not takes_any:
        accepted = [p for p in sig.parameters if p != "self"]
        raise InterventionError(f"intervention {name!r} takes no parameter {', '.join(map(repr, unknown))}; it takes: {', '.join(accepted) or 'none'}")
    return cls(**params)
