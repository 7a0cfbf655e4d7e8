"""Errors raised for bad user input.

Every error says what was expected and what came, so that a user can fix the table, the
manifest or the option without reading the source.
"""

from __future__ import annotations


class ShortcutlabError(ValueError):
    """Base class of every error shortcutlab raises for bad input."""


class TableError(ShortcutlabError):
    """A crop table is missing a column or holds values that cannot be used."""


class SplitError(ShortcutlabError):
    """A split cannot be built with the requested parameters, or a manifest is invalid."""


class ManifestHashError(ShortcutlabError):
    """A manifest's content hash does not match the registered hash."""


def first_rows(mask_or_index, ids=None, limit: int = 5) -> str:
    """Describe the first offending rows as 'rows 3, 17 (ids a, b)' for an error message.

    Args:
        mask_or_index: boolean mask over rows or an array of row positions (0-based, data rows).
        ids: optional sequence of crop ids aligned with the rows.
        limit: how many rows to name.
    """
    import numpy as np

    arr = np.asarray(mask_or_index)
    rows = np.flatnonzero(arr) if arr.dtype == bool else arr.astype(int)
    n = len(rows)
    shown = rows[:limit]
    text = "row" + ("s " if len(shown) > 1 else " ") + ", ".join(str(int(r)) for r in shown)
    if ids is not None:
        text += " (id " + ", ".join(repr(str(ids[int(r)])) for r in shown) + ")"
    if n > limit:
        text += f" and {n - limit} more"
    return text


class SplitWarning(UserWarning):
    """A split was built but leaves something out that its user should know about (a class
    with no crops on one side)."""
