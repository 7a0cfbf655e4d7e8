"""The engine registry: built-ins register on import, third-party engines join through the
``shortcutlab.engines`` entry-point group."""

from __future__ import annotations

from shortcutlab.plugins import Registry
from shortcutlab.data.engines.base import Engine, EngineError

ENTRY_POINT_GROUP = "shortcutlab.engines"
DEFAULT_ENGINE = "memory"

_REGISTRY = Registry("engine", Engine, ENTRY_POINT_GROUP, EngineError)
register = _REGISTRY.register
unregister = _REGISTRY.unregister


def available() -> tuple[str, ...]:
    """Registered engine names, sorted."""
    return tuple(sorted(_REGISTRY.classes()))


def get_engine(name: str = DEFAULT_ENGINE, **options) -> Engine:
    """An engine by name, made with `options` (unknown ones refused, naming what it takes)."""
    return _REGISTRY.get(name, **options)


def engines_running(protocol: str) -> list[str]:
    """Names of the engines that run split `protocol`."""
    return [n for n, cls in sorted(_REGISTRY.classes().items()) if protocol in cls.protocols]


def check_protocol(engine: Engine, protocol: str) -> None:
    """Refuse a split protocol `engine` does not run, naming the engines that do."""
    if protocol not in engine.protocols:
        others = engines_running(protocol)
        where = f"use --engine {' or '.join(others)}" if others else "no engine runs it"
        raise EngineError(f"the {engine.name} engine runs the {', '.join(engine.protocols)} split protocol(s), not {protocol!r}; {where}")
