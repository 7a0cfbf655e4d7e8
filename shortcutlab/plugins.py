"""A name -> class registry open to third-party plug-ins through an entry-point group.

Interventions (`interventions.registry`), diagnostics (`probes.registry`) and sweep executors
(`shortcutlab.sweep.executors.registry`) all use it:
built-ins register with a decorator when their package is imported; other packages join
through an entry-point group whose entries name a class (registered under the entry point's
name) or a module whose import registers its classes.
A broken plug-in is skipped with a warning naming it, a duplicate name is an error naming both
sources, and an unknown name lists the close matches.

Example:
    >>> from shortcutlab.plugins import Registry
    >>> class Base: name = ""
    >>> reg = Registry("widget", Base, "my.widgets", ValueError)
    >>> @reg.register("spinner")
    ... class Spinner(Base): pass
    >>> reg.get("spinner").name
    'spinner'
"""

from __future__ import annotations

import difflib
import inspect
import warnings
from importlib import metadata
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def _source(obj) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _a(word: str) -> str:
    """The word with its indefinite article: 'a diagnostic', 'an intervention'."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


class Registry:
    """Registered classes of one kind.

    Args:
        kind: how messages call an entry ('intervention', 'diagnostic').
        base: the class every entry must subclass.
        group: the entry-point group plug-ins join through.
        error: the exception type raised for bad names and parameters.
        protocol: `base` is a `typing.Protocol`: a class joins when it has every public method
            the protocol declares (duck typing: an executor needs no base class), instead of
            subclassing `base`.
    """

    def __init__(self, kind: str, base: type, group: str, error: type[Exception], *, protocol: bool = False) -> None:
        self.kind, self.base, self.group, self.error = kind, base, group, error
        self.protocol = protocol
        self._classes: dict[str, type] = {}
        self._sources: dict[str, str] = {}
        self._entry_points_loaded = False

    def register(self, name: str | None = None) -> Callable[[T], T]:
        """Class decorator: register a subclass of `base` under `name` (default: its `name`)."""

        def deco(cls: T) -> T:
            self.add(name or getattr(cls, "name", ""), cls)
            return cls

        return deco

    def _methods(self) -> list[str]:
        """The public methods a class must have to follow the protocol `base`."""
        return sorted(n for n, v in vars(self.base).items() if callable(v) and not n.startswith("_"))

    def add(self, name: str, cls) -> None:
        """Register `cls` under `name` (what `register` does); see `register` for the errors."""
        if self.protocol:
            missing = [m for m in self._methods() if not callable(getattr(cls, m, None))] if inspect.isclass(cls) else self._methods()
            if missing:
                raise self.error(f"only classes with the methods of {self.base.__name__} ({', '.join(self._methods())}) can be registered; "
                                 f"{name!r} is {cls!r}, which lacks {', '.join(missing)}")
        elif not (inspect.isclass(cls) and issubclass(cls, self.base)):
            raise self.error(f"only {self.base.__name__} subclasses can be registered; {name!r} is {cls!r}")
        if not name or not name.isidentifier():
            raise self.error(f"{_a(self.kind)} name must be a non-empty identifier; got {name!r} for {_source(cls)}")
        if name in self._classes and self._classes[name] is not cls:
            raise self.error(f"{self.kind} name {name!r} is already registered by {self._sources[name]}; {_source(cls)} cannot take it too")
        cls.name = name
        self._classes[name] = cls
        self._sources[name] = _source(cls)

    def unregister(self, name: str) -> None:
        """Remove a registered name (for tests and interactive work)."""
        self._classes.pop(name, None)
        self._sources.pop(name, None)

    def load_entry_points(self, force: bool = False) -> list[str]:
        """Import the plug-ins of the entry-point group once; returns the names loaded now."""
        if self._entry_points_loaded and not force:
            return []
        self._entry_points_loaded = True
        loaded = []
        for ep in metadata.entry_points(group=self.group):
            try:
                obj = ep.load()
            except Exception as err:  # a broken plug-in must not hide the built-ins
                warnings.warn(f"shortcutlab {self.kind} plug-in {ep.name!r} ({ep.value}) failed to load: {err!r}", stacklevel=3)
                continue
            if inspect.isclass(obj):
                self.add(ep.name, obj)
            loaded.append(ep.name)
        return loaded

    def classes(self) -> dict[str, type]:
        """Every registered name and class (plug-ins loaded)."""
        self.load_entry_points()
        return dict(self._classes)

    def get_class(self, name: str) -> type:
        """The class registered under `name`; an unknown name lists the close matches."""
        self.load_entry_points()
        try:
            return self._classes[name]
        except KeyError:
            close = difflib.get_close_matches(str(name), list(self._classes), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else "."
            raise self.error(f"unknown {self.kind} {name!r}{hint} Available: {', '.join(sorted(self._classes))}") from None

    def get(self, name: str, **params: Any):
        """Instantiate the class registered under `name` with `params` (unknown ones refused)."""
        cls = self.get_class(name)
        sig = inspect.signature(cls.__init__)
        takes_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
        unknown = [k for k in params if k not in sig.parameters or k == "self"]
        if unknown and not takes_any:
            accepted = [p for p in sig.parameters if p != "self"]
            raise self.error(f"{self.kind} {name!r} takes no parameter {', '.join(map(repr, unknown))}; it takes: {', '.join(accepted) or 'none'}")
        return cls(**params)
