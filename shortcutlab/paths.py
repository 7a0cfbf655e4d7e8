"""Paths built from what a user or a record gives: checked before anything is opened.

Three checks, one wording each, for every module that turns a name into a path:

- `check_id`: an id read from a record (a task id in ``sweep.json``, say) must have the
  tool's own id format before a path is built from it, so that ``../../elsewhere`` never
  becomes a folder to open;
- `inside`: a path a record names (a run's weights file) must stay inside its folder once
  symbolic links and ``..`` are resolved;
- `need_file` / `need_folder`: a path of the wrong kind is named as such ("is a folder,
  expected a file"), not as missing.

Example:
    >>> from shortcutlab.paths import TASK_ID, check_id
    >>> check_id("0123456789abcdef", TASK_ID, "model id", "sweep.json")
    '0123456789abcdef'
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from shortcutlab.errors import ShortcutlabError


@dataclass(frozen=True)
class IdFormat:
    """The form an id must have: a regular expression (matched in full) and its description."""

    pattern: re.Pattern
    description: str


#: A sweep task's id (`shortcutlab.sweep.graph.task_id`): the first 16 hex digits of a SHA-256.
TASK_ID = IdFormat(re.compile(r"[0-9a-f]{16}"), "a task id (16 hex digits)")


def check_id(value, form: IdFormat, what: str, where: str, error: type[ShortcutlabError] = ShortcutlabError) -> str:
    """`value`, after checking that it is a string of the form `form` (before it becomes a path).

    Args:
        value: the id as read from the record.
        form: the id format, e.g. `TASK_ID`.
        what: what the id is, for the message ("model id").
        where: the record it came from, for the message (a file path and entry).
        error: the error class to raise.

    Raises:
        error: `value` is not a string of that form.
    """
    if not isinstance(value, str) or not form.pattern.fullmatch(value):
        raise error(f"{where}: {what} {value!r} is not {form.description}; the record was not written by shortcutlab "
                    "or was edited, and no path is built from it")
    return value


def inside(folder: str | os.PathLike, path: str | os.PathLike, what: str, error: type[ShortcutlabError] = ShortcutlabError) -> str:
    """The resolved path of `path` (relative to `folder`), after checking it stays inside `folder`.

    Symbolic links and ``..`` are resolved (`os.path.realpath`) on both sides before comparing.

    Raises:
        error: `path` resolves to a place outside `folder`.
    """
    root = os.path.realpath(os.fspath(folder))
    full = os.path.realpath(os.path.join(root, os.fspath(path)))
    if os.path.commonpath([root, full]) != root:
        raise error(f"{what} {os.fspath(path)!r} leaves the folder {os.fspath(folder)!r} (it resolves to {full!r}); "
                    "only files inside the folder are read")
    return full


def wrong_kind(path: str | os.PathLike, want: str) -> str | None:
    """Why `path` is not a `want` ("file" or "folder"): "does not exist", "is a folder, expected
    a file", "is a file, expected a folder"; None when it is one."""
    path = os.fspath(path)
    if want == "file":
        if os.path.isfile(path):
            return None
        return "is a folder, expected a file" if os.path.isdir(path) else "does not exist"
    if os.path.isdir(path):
        return None
    return "is a file, expected a folder" if os.path.exists(path) else "does not exist"


def need_file(path: str | os.PathLike, what: str, error: type[ShortcutlabError] = ShortcutlabError, hint: str = "") -> str:
    """`path`, after checking it is an existing file ("{what} {path!r} does not exist" otherwise)."""
    why = wrong_kind(path, "file")
    if why:
        raise error(f"{what} {os.fspath(path)!r} {why}{hint}")
    return os.fspath(path)


def need_folder(path: str | os.PathLike, what: str, error: type[ShortcutlabError] = ShortcutlabError, hint: str = "") -> str:
    """`path`, after checking it is an existing folder ("{what} {path!r} does not exist" otherwise)."""
    why = wrong_kind(path, "folder")
    if why:
        raise error(f"{what} {os.fspath(path)!r} {why}{hint}")
    return os.fspath(path)


_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9._-]")


def file_names(ids, suffix: str = ".png") -> list[str]:
    """One file name per id, safe in any folder and distinct also on case-insensitive disks:
    the id with characters other than letters, digits, '.', '_' and '-' replaced by '_', and
    the row number added where that changed the id or where two names would clash, ignoring
    case ('a/1' and 'a_1', or 'A' and 'a'). Crops and masks are written under these names.

    Example:
        >>> file_names(["a", "b/1", "b_1", "B"])
        ['a.png', 'b_1-1.png', 'b_1-2.png', 'B.png']
    """
    ids = [str(i) for i in ids]
    safe = [_NOT_IN_A_NAME.sub("_", i) for i in ids]
    folded = [s.lower() for s in safe]
    counts: dict[str, int] = {}
    for s in folded:
        counts[s] = counts.get(s, 0) + 1
    return [f"{s}{suffix}" if s == i and counts[f] == 1 and s not in (".", "..") else f"{s}-{k}{suffix}"
            for k, (s, f, i) in enumerate(zip(safe, folded, ids))]
