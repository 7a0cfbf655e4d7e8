"""Atomic output files: written to a temporary name in the same folder, renamed into place.

Every file shortcutlab writes goes through here, so that a command that fails (bad input, a
full disk, Ctrl-C) leaves the previous outputs or nothing, never half a file. Outputs made of
several files are staged together and renamed only once all of them are complete
(`atomic_files`); outputs that are whole folders are built beside the target and swapped in
(`atomic_dir`).

A path that cannot be written (its parent is a file, it is a folder, no permission) raises
`OutputError` naming the path and the reason, before any work is lost.

Example:
    >>> from shortcutlab.io import atomic_files, write_json     # doctest: +SKIP
    >>> write_json("out/result.json", {"a": 1})                 # doctest: +SKIP
    >>> with atomic_files() as stage:                           # doctest: +SKIP
    ...     frame.to_csv(stage.path("out/split.csv"), index=False)
    ...     write_json(stage.path("out/split.json"), meta)     # both appear, or neither
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from typing import Any, Iterator

from .errors import ShortcutlabError


class OutputError(ShortcutlabError):
    """An output path cannot be written."""


def _reason(e: OSError) -> str:
    return {
        errno.ENOTDIR: "a part of the path is a file, not a folder",
        errno.EISDIR: "it is a folder, not a file",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.EROFS: "the file system is read-only",
        errno.ENOSPC: "no space left on the device",
        errno.ENAMETOOLONG: "the name is too long",
    }.get(e.errno, e.strerror or str(e))


def check_writable(path: str | os.PathLike) -> str:
    """Make `path`'s folder (if missing) and check that a file can be written at `path`.

    Returns:
        The path as a string.

    Raises:
        OutputError: naming the path and the reason (parent is a file, path is a folder, ...).
    """
    path = os.fspath(path)
    if not path:
        raise OutputError("output path is empty")
    if os.path.isdir(path):
        raise OutputError(f"cannot write {path!r}: it is a folder, not a file")
    folder = os.path.dirname(path) or "."
    probe = folder
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if probe and os.path.exists(probe) and not os.path.isdir(probe):
        raise OutputError(f"cannot write {path!r}: {probe!r} is a file, not a folder")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot write {path!r}: cannot create folder {folder!r} ({_reason(e)})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {path!r}: folder {folder!r} is not writable")
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temp_name(path: str) -> str:
    folder, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder or ".")
    # mkstemp makes the file private (0600); an output gets the mode an ordinary open() gives.
    os.fchmod(fd, 0o666 & ~_umask())
    os.close(fd)
    return tmp


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """Yield a temporary path beside `path`; on success it is renamed to `path`, else removed.

    For writers that take a path (``DataFrame.to_csv``, ``safetensors.torch.save_file``).
    """
    path = check_writable(path)
    tmp = _temp_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def _json_default(o: Any):
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def to_json(obj: Any, **kw) -> str:
    """JSON text with numpy scalars and arrays turned into plain values, ending in a newline."""
    kw.setdefault("indent", 2)
    return json.dumps(obj, default=_json_default, **kw) + "\n"


def write_json(path: str | os.PathLike, obj: Any, **kw) -> None:
    """Write `obj` as indented JSON to `path` atomically (numpy values allowed)."""
    write_text(path, to_json(obj, **kw))


def write_csv(path: str | os.PathLike, frame, **kw) -> None:
    """Write a DataFrame to `path` atomically (``index=False`` unless given)."""
    kw.setdefault("index", False)
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, **kw)


class Stage:
    """Temporary paths for several output files that must appear together (`atomic_files`)."""

    def __init__(self) -> None:
        self._pending: list[tuple[str, str]] = []

    def path(self, final: str | os.PathLike) -> str:
        """A temporary path to write instead of `final`; renamed to `final` on commit."""
        final = check_writable(final)
        tmp = _temp_name(final)
        self._pending.append((tmp, final))
        return tmp

    def _commit(self) -> None:
        for tmp, final in self._pending:
            os.replace(tmp, final)
        self._pending.clear()

    def _discard(self) -> None:
        for tmp, _ in self._pending:
            with contextlib.suppress(OSError):
                os.remove(tmp)
        self._pending.clear()


@contextlib.contextmanager
def atomic_files() -> Iterator[Stage]:
    """Stage several output files; all are renamed into place at the end, or none on failure.

    The renames happen in the order the paths were requested: request the file that marks a
    complete output (run.json, a sidecar) last.
    """
    stage = Stage()
    try:
        yield stage
        stage._commit()
    except BaseException:
        stage._discard()
        raise


@contextlib.contextmanager
def atomic_dir(out_dir: str | os.PathLike) -> Iterator[str]:
    """Build a folder under a temporary name beside `out_dir`, then swap it in.

    On success any existing `out_dir` is replaced whole (it is moved aside, the new folder is
    renamed into place, and the old one removed); on failure the temporary folder is removed
    and `out_dir` is left as it was.
    """
    out = os.fspath(out_dir).rstrip(os.sep) or os.sep
    if os.path.exists(out) and not os.path.isdir(out):
        raise OutputError(f"cannot write folder {out!r}: it is a file")
    parent = os.path.dirname(os.path.abspath(out))
    check_writable(os.path.join(parent, ".probe"))
    name = os.path.basename(os.path.abspath(out))
    tmp = tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=parent)
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private (0700)
    try:
        yield tmp
        old = None
        if os.path.exists(out):
            old = tempfile.mkdtemp(prefix=f".{name}.", suffix=".old", dir=parent)
            os.rmdir(old)
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
