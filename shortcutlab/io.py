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
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Iterable, Iterator

from shortcutlab.errors import ShortcutlabError


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
    """Check, before any work, that a file can be written at `path`. Nothing is created: a
    missing folder is made when the file is written (`make_folder`), so a command refused
    later leaves no empty folder behind.

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
    probe = probe or "."
    if not os.path.isdir(probe):
        raise OutputError(f"cannot write {path!r}: {probe!r} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        what = "folder" if probe == folder else "folder (where the missing folders would be made)"
        raise OutputError(f"cannot write {path!r}: {what} {probe!r} is not writable")
    return path


def make_folder(folder: str, path: str | None = None) -> None:
    """Create `folder` (and its parents) for an output about to be written at `path`."""
    try:
        os.makedirs(folder or ".", exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot write {path or folder!r}: cannot create folder {folder!r} ({_reason(e)})") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temp_prefix(name: str) -> str:
    # The writer's PID is part of every temporary name, so that a later run can tell the
    # temporaries of a killed writer (stale: removed) from those of a live one (kept).
    return f".{name}.p{os.getpid()}."


def _temp_name(path: str) -> str:
    folder, name = os.path.split(path)
    make_folder(folder, path)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(name), suffix=".tmp", dir=folder or ".")
    # mkstemp makes the file private (0600); an output gets the mode an ordinary open() gives.
    os.fchmod(fd, 0o666 & ~_umask())
    os.close(fd)
    return tmp


def _publish(tmp: str, path: str) -> None:
    """Rename a finished temporary file to `path`, with the mode an ordinary open() gives
    (some writers, safetensors' among them, replace the file with a private 0600 one)."""
    with contextlib.suppress(OSError):
        os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """Yield a temporary path beside `path`; on success it is renamed to `path`, else removed.

    For writers that take a path (``DataFrame.to_csv``, ``safetensors.torch.save_file``).
    """
    path = check_writable(path)
    tmp = _temp_name(path)
    try:
        yield tmp
        _publish(tmp, path)
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
            _publish(tmp, final)
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


# ------------------------------------------------------------------ output folders
#: the marker a folder output carries: its kind and every file the tool wrote there
MARKER = ".shortcutlab-output.json"
MARKER_SCHEMA = "shortcutlab.output/1"
#: a temporary made by this module: ``.NAME.p<PID>.<8 random>.tmp`` (or ``.old``); before
#: the PID was part of the name: ``.NAME.<8 random>.tmp``
_TEMP = re.compile(r"^\.(?P<name>.+)\.p(?P<pid>\d+)\.[a-z0-9_]{8}\.(tmp|old)$")
_LEGACY_TEMP = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}\.(tmp|old)$")
#: an unmarked temporary (from a version before the PID was in the name) is stale once it
#: has not changed for this long
LEGACY_TEMP_AGE_S = 3600.0


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


def _stale(folder: str, entry: str, names: Iterable[str] | None = None) -> bool:
    """Whether `entry` of `folder` is a temporary of a writer that is gone (of one of
    `names` only, when given)."""
    m = _TEMP.match(entry)
    if m:
        return (names is None or m["name"] in names) and not _alive(int(m["pid"]))
    m = _LEGACY_TEMP.match(entry)
    if m and (names is None or m["name"] in names):
        try:
            return time.time() - os.lstat(os.path.join(folder, entry)).st_mtime > LEGACY_TEMP_AGE_S
        except OSError:
            return False
    return False


def _is_temporary(entry: str) -> bool:
    return bool(_TEMP.match(entry) or _LEGACY_TEMP.match(entry))


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.remove(path)


def clean_stale(out_dir: str | os.PathLike, names: Iterable[str] = ()) -> list[str]:
    """Remove the temporaries that a killed writer of `out_dir` left behind: the folders built
    beside it (``.NAME.p<PID>.*.tmp``) and the files staged inside it (``.FILE.p<PID>.*.tmp``),
    for `names` (the files of the output) only. A temporary whose writer is still running is
    kept, so two runs never delete each other's work. Says on stderr what it removed.

    Returns:
        The removed paths.
    """
    out = os.path.abspath(os.fspath(out_dir))
    parent, name = os.path.split(out)
    gone = []
    places = [(parent, {name})]
    if os.path.isdir(out):
        places.append((out, set(names) | {MARKER}))
    for folder, which in places:
        try:
            entries = sorted(os.listdir(folder))
        except OSError:
            continue
        for e in entries:
            if _stale(folder, e, which):
                _remove(os.path.join(folder, e))
                gone.append(os.path.join(folder, e))
    if gone:
        print(f"shortcutlab: removed {len(gone)} stale temporar{'y' if len(gone) == 1 else 'ies'} left by a "
              f"killed run in {out!r}: {', '.join(os.path.basename(g) for g in gone[:3])}"
              f"{' ...' if len(gone) > 3 else ''}", file=sys.stderr)
    return gone


def read_json_object(path: str | os.PathLike) -> dict | None:
    """The JSON object in the file `path`, or None when it is missing, unreadable, not JSON or
    not an object (for recognising outputs of earlier versions; never for user input, whose
    errors must be named)."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def load_json_object(path: str, what: str, error: type[Exception], expected: str) -> dict:
    """The JSON object in the file `path`, read as a user's input: a file that is not JSON, or
    holds something else than an object, is `error` in one line naming `what` (a prefix such
    as ``"run record "``), the path and what was `expected`."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{what}{path!r} is not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise error(f"{what}{path!r} holds a {type(d).__name__}; expected {expected}")
    return d


def read_marker(folder: str | os.PathLike) -> dict | None:
    """The output marker of `folder`, or None when it has none or not one of this schema."""
    path = os.path.join(os.fspath(folder), MARKER)
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict) or d.get("schema") != MARKER_SCHEMA or not isinstance(d.get("kind"), str) \
            or not isinstance(d.get("files"), list) or not all(isinstance(x, str) for x in d["files"]):
        return None
    return d


def _owned_by(entries: Iterable[str]) -> Callable[[str], bool]:
    """A test of relative paths: listed, or under a listed folder (``name/``)."""
    files = {e for e in entries if not e.endswith("/")}
    dirs = tuple(e for e in entries if e.endswith("/"))
    return lambda rel: rel in files or rel.startswith(dirs)


def _with_names(listed: list[str], names: Iterable[str]) -> list[str]:
    """A marker's files and the output's `names` (files it may add later: diagnostics in a run
    folder, a sweep's tables), except folders whose files the marker lists one by one (a
    foreign file in a benchmark's crops/ is found)."""
    return list(listed) + [n for n in names if not (n.endswith("/") and any(f.startswith(n) for f in listed))]


def _foreign(root: str, owned: Callable[[str], bool]) -> str | None:
    """The first (sorted) file or folder under `root` that is not owned: not listed, not a
    temporary of this module, not inside a nested output folder with its own marker."""

    def walk(rel: str) -> str | None:
        folder = os.path.join(root, rel)
        for e in sorted(os.listdir(folder)):
            r = f"{rel}{e}"
            if e == MARKER and rel == "" or _is_temporary(e) or owned(r):
                continue
            p = os.path.join(folder, e)
            if os.path.isdir(p) and not os.path.islink(p):
                if read_marker(p) is not None or owned(r + "/"):
                    continue
                found = walk(r + "/")
                if found is None and os.listdir(p):
                    continue
                return found or r + "/"
            return r
        return None

    return walk("")


def claim_output_dir(out_dir: str | os.PathLike, kind: str, names: Iterable[str],
                     legacy: Callable[[str], bool] | None = None) -> None:
    """Check that shortcutlab may write the output `kind` in `out_dir`, before any work.

    The folder must be missing, empty, or one this tool wrote: its marker (`MARKER`, schema
    `MARKER_SCHEMA`) names `kind`, and every file in it is listed there or in `names`, a
    temporary of this module, or inside a nested output folder with a marker of its own. A folder written before the
    marker existed is accepted when `legacy(folder)` recognises it and it holds only `names`
    (``"name/"`` is a folder the output owns whole). Stale temporaries of `out_dir` are removed
    first (`clean_stale`).

    Raises:
        OutputError: naming the folder and its first (sorted) file the tool did not write.
    """
    out = os.fspath(out_dir)
    names = list(names)
    if os.path.exists(out) and not os.path.isdir(out):
        raise OutputError(f"output folder {out!r} is a file, not a folder; give a folder")
    clean_stale(out, [n.rstrip("/") for n in names])
    if not os.path.isdir(out) or not os.listdir(out):
        return
    marker = read_marker(out)
    how = "give a new or empty folder, or move that away"
    if marker is not None:
        if marker["kind"] != kind:
            raise OutputError(f"output folder {out!r} holds a shortcutlab {marker['kind']} output, not a {kind} one; "
                              f"give a new or empty folder")
        first = _foreign(out, _owned_by(_with_names(marker["files"], names)))
    elif os.path.exists(os.path.join(out, MARKER)):
        raise OutputError(f"output folder {out!r} holds a {MARKER} that shortcutlab cannot read; {how}")
    elif legacy is not None and legacy(out):
        first = _foreign(out, _owned_by(names))
    else:
        first = _foreign(out, lambda rel: False)
    if first is not None:
        raise OutputError(f"output folder {out!r} holds {first!r}, which shortcutlab did not write as a {kind} output "
                          f"there; {how}")


def claim_output_files(out_dir: str | os.PathLike, names: Iterable[str], legacy: Callable[[str], bool] | None = None) -> None:
    """Check that the files `names` may be written in `out_dir`, a folder that other files may
    share (`--out` of litmus, control, diagnose): none of them exists, or each is listed by the
    folder's marker, or `legacy(out_dir)` recognises the existing ones as shortcutlab's (written
    before markers existed). Other files in the folder are left alone. Stale temporaries of
    these files are removed first.

    Raises:
        OutputError: naming the folder and the first (sorted) existing file of `names` that
            shortcutlab did not write.
    """
    out = os.fspath(out_dir)
    names = sorted(names)
    if os.path.exists(out) and not os.path.isdir(out):
        raise OutputError(f"output folder {out!r} is a file, not a folder; give a folder")
    if not os.path.isdir(out):
        return
    clean_stale(out, names)
    marker = read_marker(out)
    listed = _owned_by(marker["files"] if marker is not None else [])
    there = [n for n in names if os.path.lexists(os.path.join(out, n)) and not listed(n)]
    if there and not (marker is None and legacy is not None and legacy(out)):
        raise OutputError(f"output folder {out!r} holds {there[0]!r}, which shortcutlab did not write there and would "
                          f"overwrite; give another folder, or move that away")


def register_output_files(out_dir: str | os.PathLike, names: Iterable[str]) -> None:
    """Add `names` to the marker of `out_dir` (kind ``files`` for a folder without one), so that
    the next run may replace them (`claim_output_files`)."""
    out = os.fspath(out_dir)
    marker = read_marker(out)
    write_marker(out, marker["kind"] if marker is not None else "files", names)


def _listing(root: str) -> list[str]:
    out = []
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        for d in list(dirs):
            if read_marker(os.path.join(folder, d)) is not None:
                dirs.remove(d)  # a nested output lists its own files
        out += [rel + f for f in files if not (rel == "" and f == MARKER)]
    return sorted(out)


def write_marker(out_dir: str | os.PathLike, kind: str, files: Iterable[str] | None = None) -> None:
    """Write `out_dir`'s output marker (atomically): `kind`, the version and `files`, the
    relative paths the tool wrote there (``"name/"``: a folder it owns whole); by default
    every file now in the folder, merged with those the marker already lists."""
    from shortcutlab.version import __version__

    out = os.fspath(out_dir)
    files = set(_listing(out) if files is None else files)
    old = read_marker(out)
    if old is not None and old["kind"] == kind:
        files |= set(old["files"])
    write_json(os.path.join(out, MARKER), {"schema": MARKER_SCHEMA, "kind": kind, "version": __version__,
                                          "files": sorted(files)})


@contextlib.contextmanager
def atomic_dir(out_dir: str | os.PathLike, kind: str | None = None, names: Iterable[str] = (),
               legacy: Callable[[str], bool] | None = None) -> Iterator[str]:
    """Build a folder under a temporary name beside `out_dir`, then swap it in.

    With `kind`, `out_dir` is first claimed for that output (`claim_output_dir` with `names`
    and `legacy`: a folder holding files the tool did not write is refused, stale temporaries
    of a killed run are removed), and the new folder gets its marker (`write_marker`) last.
    On success the files of the existing `out_dir` are replaced by the new ones; anything in it
    the output does not own (a nested output folder) is carried over into the new folder, so
    that no file the tool did not write is removed. On failure the temporary folder is removed
    and `out_dir` is left as it was.
    """
    out = os.fspath(out_dir).rstrip(os.sep) or os.sep
    if os.path.exists(out) and not os.path.isdir(out):
        raise OutputError(f"cannot write folder {out!r}: it is a file")
    names = list(names)
    if kind is not None:
        claim_output_dir(out, kind, names, legacy)
    parent = os.path.dirname(os.path.abspath(out))
    check_writable(os.path.join(parent, ".probe"))
    make_folder(parent, out)
    name = os.path.basename(os.path.abspath(out))
    tmp = tempfile.mkdtemp(prefix=_temp_prefix(name), suffix=".tmp", dir=parent)
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private (0700)
    try:
        yield tmp
        if kind is not None:
            write_marker(tmp, kind)
        old, keep = None, []
        if os.path.exists(out):
            if kind is not None:
                keep = _not_owned(out, kind, names, tmp)
            old = tempfile.mkdtemp(prefix=_temp_prefix(name), suffix=".old", dir=parent)
            os.rmdir(old)
            os.replace(out, old)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        for e in keep:  # a nested output folder: moved into the new folder, never removed
            try:
                os.replace(os.path.join(old, e), os.path.join(out, e))
            except OSError as err:
                raise OutputError(f"could not move {e!r} into the new {out!r} ({_reason(err)}); it is in {old!r}") from None
        shutil.rmtree(old, ignore_errors=True)


def _not_owned(out: str, kind: str, names: list[str], new: str) -> list[str]:
    """The entries of `out` that its output does not own and the new folder `new` lacks."""
    marker = read_marker(out)
    marked = marker is not None and marker["kind"] == kind
    owned = _owned_by(_with_names(marker["files"], names) if marked else list(names))
    keep = []
    for e in sorted(os.listdir(out)):
        if e == MARKER or _is_temporary(e) or owned(e) or owned(e + "/") or os.path.lexists(os.path.join(new, e)):
            continue
        p = os.path.join(out, e)
        if os.path.isdir(p) and not os.path.islink(p) and read_marker(p) is None and _foreign(p, lambda r: owned(f"{e}/{r}")) is None:
            continue  # a folder of listed files
        keep.append(e)
    return keep


def file_sha256(path: str) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB chunks (hex digest)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
