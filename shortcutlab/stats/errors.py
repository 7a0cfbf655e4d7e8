"""The errors and warnings of `shortcutlab.stats`."""

from __future__ import annotations

from shortcutlab.errors import ShortcutlabError

__all__ = ["StatsError", "StatsWarning"]


class StatsError(ShortcutlabError):
    """A predictions or results frame lacks a column or holds values the statistics cannot use."""


class StatsWarning(UserWarning):
    """An estimate was computed on a degenerate design (one seed, a missing model, ...): its
    interval is NaN and the row's `reason` says why."""
