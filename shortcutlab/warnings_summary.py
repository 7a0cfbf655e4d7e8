"""Repeated warnings, collapsed for a terminal: one line per kind of warning, with a count.

A sweep or a report over many models warns once per model about the same thing (an interval
with few clusters, a constant saliency map). Printed one by one, the same sentence fills the
screen and hides the one warning that says something else. Here warnings are grouped by their
category and their message with every value masked (`mask_values`: numbers, ids, quoted names
and the values of ``key=value`` pairs); each group is printed once, with its first message and
a count:

- ``(x N)``: N warnings with exactly this message;
- ``(and N similar)``: N more that differ from this one only in such values.

`collected` is the context manager the command line wraps every command in; commands that
catch their own warnings print them with `summary_lines`. Only the terminal is collapsed:
what a command records in its output files (notes, reasons, logs) is unchanged.

Example:
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     for n in (3, 3, 4):
    ...         warnings.warn(f"only {n} seeds: no interval")
    >>> summary_lines(caught)
    ['warning: UserWarning: only 3 seeds: no interval (and 2 similar)']
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import warnings
from dataclasses import dataclass
from typing import Iterable, Iterator, TextIO

#: the value of a ``key=value`` pair (up to a space, a comma, a bracket, or a colon that ends a
#: clause: ``low_pass:sigma=1.0`` is one value), a quoted name, an id (8 or more hex digits with
#: at least one digit: a task id, a hash prefix), then any number with its sign and decimals
_KEY_VALUE = re.compile(r"\b(\w+)=(?:'[^']*'|\"[^\"]*\"|(?:[^\s,;()\[\]:]|:(?!\s|$))+)")
_QUOTED = re.compile(r"'[^'\s]*'|\"[^\"\s]*\"")
_ID = re.compile(r"\b(?=[0-9a-f]*\d)[0-9a-f]{8,}\b")
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def mask_values(text: str) -> str:
    """`text` with the value of every ``key=value`` pair, every quoted word, id and number
    replaced by ``#`` and its spaces normalised, so that two messages about different models,
    conditions or counts but saying the same thing compare equal.

    >>> mask_values("leak condition=color, intervention=low_pass:sigma=1.0: 1 seed(s), fewer than 3")
    'leak condition=#, intervention=#: # seed(s), fewer than #'
    >>> mask_values("model 3f2a9c01d4e5b6a7: column 'R' does not vary (p = 0.031)")
    'model #: column # does not vary (p = #)'
    """
    text = _KEY_VALUE.sub(lambda m: m.group(1) + "=#", " ".join(str(text).split()))
    return _NUMBER.sub("#", _ID.sub("#", _QUOTED.sub("#", text)))


@dataclass(frozen=True)
class WarningGroup:
    """Warnings of one category whose messages are equal once numbers are masked.

    Attributes:
        category: the warning class (`StatsWarning`, `UserWarning`, ...).
        message: the first message of the group (spaces normalised).
        count: how many warnings the group holds (>= 1).
        identical: whether every message of the group is exactly `message`.
    """

    category: type
    message: str
    count: int
    identical: bool

    def line(self, prefix: str = "warning", category: bool = True) -> str:
        """One terminal line: ``prefix: Category: message (x N)`` or ``(and N-1 similar)``."""
        head = f"{prefix}: {self.category.__name__}: " if category else f"{prefix}: "
        if self.count == 1:
            tail = ""
        elif self.identical:
            tail = f" (x {self.count})"
        else:
            tail = f" (and {self.count - 1} similar)"
        return head + self.message + tail


def _parts(record) -> tuple[type, str]:
    """(category, message) of a `warnings.WarningMessage` or a ``(category, message)`` pair."""
    if isinstance(record, tuple):
        category, message = record
    else:
        category, message = record.category, record.message
    return category, " ".join(str(message).split())


def collapse(records: Iterable) -> list[WarningGroup]:
    """Group warnings by category and masked message, in the order each group first appears.

    Args:
        records: `warnings.WarningMessage` objects (as ``catch_warnings(record=True)`` gives)
            or ``(category, message)`` pairs.
    """
    groups: dict[tuple[type, str], list[str]] = {}
    for record in records:
        category, message = _parts(record)
        groups.setdefault((category, mask_values(message)), []).append(message)
    return [WarningGroup(category, msgs[0], len(msgs), all(m == msgs[0] for m in msgs)) for (category, _), msgs in groups.items()]


def summary_lines(records: Iterable, prefix: str = "warning", category: bool = True) -> list[str]:
    """The collapsed warnings as terminal lines (`WarningGroup.line`), one per group."""
    return [g.line(prefix, category) for g in collapse(records)]


@contextlib.contextmanager
def collected(stream: TextIO | None = None, prefix: str = "warning") -> Iterator[list]:
    """Record the warnings raised inside the block and print them collapsed when it ends.

    The warning filters in force still apply (a command that ignores a warning it prints
    itself still ignores it; ``-W error`` still raises). Unless the user gave ``-W`` options
    or PYTHONWARNINGS, every UserWarning is recorded each time it is raised rather than once
    per source line, so that the counts are true.

    Args:
        stream: where the lines go (default ``sys.stderr``, where Python prints warnings).
        prefix: the word each line starts with.

    Yields:
        The list the warnings are recorded in (`warnings.WarningMessage`).
    """
    caught: list = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            if not sys.warnoptions:
                warnings.filterwarnings("always", category=UserWarning)
            yield caught
    finally:  # also when the command fails: what it warned about before may explain why
        out = stream if stream is not None else sys.stderr
        for line in summary_lines(caught, prefix):
            print(line, file=out)


@contextlib.contextmanager
def quiet_logger(name: str, quiet: bool = True) -> Iterator[None]:
    """Within the block, the logger `name` prints only errors (when `quiet`); its level is
    restored after. For libraries (Ray) that log routine start-up lines at warning level."""
    logger = logging.getLogger(name)
    old = logger.level
    if quiet:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(old)
