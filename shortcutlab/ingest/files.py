"""A crop table from the files of a released folder whose paths match a pattern.

A pattern is a relative path with named fields, matched against every file's path relative
to the folder (``/`` separated, the whole path):

- ``{name}`` (letters, digits, ``_``) matches one or more characters other than ``/`` and
  becomes the column ``name``; ``{label}``, ``{parent}`` and ``{id}`` fill the crop table's
  roles, any other field (``{patient}``) is kept as a column of its own;
- ``{*}`` matches the same way and is not kept;
- everything else is literal (``.``, ``*``, ``(`` mean themselves); braces cannot be literal;
- a field named twice must match the same text both times (``{parent}/{parent}_{*}.png``);
- two fields may not touch (``{a}{b}``): put a literal separator between them;
- where a path could be cut in several ways, each field takes the shortest value that lets
  the rest match, left to right (``{parent}_{*}.bmp`` on ``001_02_03.bmp`` gives parent
  ``001``).

Where field numbers restart in each class folder (SIPaKMeD), a ``{parent}`` field would merge
fields of different classes: ``parent_from=("label", "field")`` makes the parent from several
fields joined with ``/`` instead (``Parabasal/001``).

Without an ``{id}`` field the id is the relative path without its extension
(``im_A/CROPPED/001_02``). Ids must be unique: two files with one id are an error naming both.

A labels CSV (``labels=``) adds columns by joining on its ``file`` column (the path relative
to the folder, as matched) or its ``id`` column; every other column it has (``label``,
``parent``, ``group``, ...) joins the table. A column may come from the pattern or from the
CSV, not both.

The table has the columns ``id``, ``path`` (relative to `relative_to`: the folder of the
table to be written, so that `CropTable.from_csv` and `load_crops` find the images), ``label``,
``parent``, the other fields and CSV columns, and ``w``, ``h`` (pixels, read from the image
headers with PIL, no decoding). Files that do not match are counted and the first five named
in the report; a crop left without a label or a parent is an error naming it.

Example:
    >>> frame, report = table_from_files("SIPaKMeD", "im_{label}/CROPPED/{field}_{*}.bmp",  # doctest: +SKIP
    ...                                  parent_from=("label", "field"), relative_to=".")
    >>> write_file_table(frame, report, "sipakmed.csv")                                       # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Sequence

import pandas as pd

from shortcutlab.data.table import CropTable
from shortcutlab.errors import TableError
from shortcutlab.io import atomic_files, to_json

#: columns the table computes itself; no field or labels column may take these names
RESERVED = ("path", "w", "h")
#: how many unmatched files (and unused labels rows) a report names
N_LISTED = 5
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FIELD_RE = r"[^/]+?"


class FileTableError(TableError):
    """A pattern, a labels CSV or a released folder cannot make a crop table."""


@dataclass(frozen=True)
class FilePattern:
    """A compiled pattern: its text, the regular expression and the kept fields in order."""

    text: str
    regex: re.Pattern
    fields: tuple[str, ...]

    def match(self, rel: str) -> dict[str, str] | None:
        """The fields of relative path `rel` (``/`` separated), or None when it does not match."""
        m = self.regex.fullmatch(rel)
        return None if m is None else {f: m.group(f) for f in self.fields}


def _tokens(text: str) -> list[tuple[str, str, int]]:
    """Split a pattern into ("lit", text, pos) and ("field", name, pos) tokens."""
    out, i = [], 0
    while i < len(text):
        open_, close = text.find("{", i), text.find("}", i)
        if close != -1 and (open_ == -1 or close < open_):
            raise FileTableError(f"pattern {text!r}: '}}' at character {close + 1} has no opening '{{'")
        if open_ == -1:
            out.append(("lit", text[i:], i))
            break
        if open_ > i:
            out.append(("lit", text[i:open_], i))
        end = text.find("}", open_)
        inner = text.find("{", open_ + 1)
        if end == -1 or (inner != -1 and inner < end):
            raise FileTableError(f"pattern {text!r}: '{{' at character {open_ + 1} has no closing '}}'")
        name = text[open_ + 1:end]
        if name != "*" and not _NAME.fullmatch(name):
            raise FileTableError(f"pattern {text!r}: field {{{name}}} at character {open_ + 1} is not a name "
                                 "(letters, digits and _, not starting with a digit) or *")
        out.append(("field", name, open_))
        i = end + 1
    return out


def compile_pattern(text: str) -> FilePattern:
    """Compile a pattern (see the module docstring).

    Raises:
        FileTableError: unbalanced braces, a field that is not a name, touching fields, a
            reserved name (path, w, h), an absolute pattern or one without fields.
    """
    if not isinstance(text, str) or not text.strip():
        raise FileTableError(f"pattern {text!r} is empty; expected a relative path with fields, e.g. "
                             "'{patient}/{parent}/{id}.png'")
    if text.startswith("/"):
        raise FileTableError(f"pattern {text!r} starts with '/'; it is matched against paths relative to the folder")
    parts, fields, previous, tokens = [], [], None, _tokens(text)
    for kind, value, pos in tokens:
        if kind == "lit":
            parts.append(re.escape(value))
        else:
            if previous == "field":
                raise FileTableError(f"pattern {text!r}: the field at character {pos + 1} touches the field before it; "
                                     "put a literal separator (_, -, /) between fields")
            if value in RESERVED + ("file",):
                raise FileTableError(f"pattern {text!r}: field {{{value}}} is a reserved name ({', '.join(RESERVED)}: "
                                     "columns the table computes; file: the labels CSV's join key); rename it")
            if value == "*":
                parts.append(_FIELD_RE)
            elif value in fields:
                parts.append(f"(?P={value})")
            else:
                fields.append(value)
                parts.append(f"(?P<{value}>{_FIELD_RE})")
        previous = kind
    if not any(kind == "field" for kind, _, _ in tokens):
        raise FileTableError(f"pattern {text!r} has no field; expected at least {{parent}} or {{label}}, "
                             "e.g. 'im_{label}/CROPPED/{parent}_{*}.bmp'")
    return FilePattern(text, re.compile("".join(parts)), tuple(fields))


def _walk(root: str) -> list[str]:
    """Every file under `root`, as sorted ``/`` paths: hidden files and symbolic links to files
    included (an unmatched one is counted like any other), symbolic links to folders not
    followed (a link loop cannot make the walk endless)."""
    out = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        rel = os.path.relpath(folder, root)
        for f in files:
            out.append(f if rel == "." else f"{rel}/{f}".replace(os.sep, "/"))
    return sorted(out)


def _read_labels(path: str, fields: tuple[str, ...]) -> tuple[str, pd.DataFrame]:
    """The labels CSV: its key column (``file`` or ``id``) and the frame, checked."""
    from shortcutlab.paths import need_file

    need_file(path, "labels CSV", FileTableError)
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    except pd.errors.EmptyDataError:
        raise FileTableError(f"labels CSV {path!r} is empty; expected the columns file,label or id,label") from None
    except (UnicodeDecodeError, pd.errors.ParserError) as e:
        raise FileTableError(f"labels CSV {path!r} is not a readable UTF-8 CSV file: {' '.join(str(e).split())}") from None
    df.columns = [str(c).strip() for c in df.columns]
    keys = [k for k in ("file", "id") if k in df.columns]
    if len(keys) != 1:
        what = "both" if keys else "neither"
        raise FileTableError(f"labels CSV {path!r} has {what} of the columns 'file' and 'id'; expected exactly one "
                             f"to join on; columns are: {', '.join(df.columns)}")
    key = keys[0]
    for col in df.columns:
        if col in RESERVED or (col in fields and col != key):
            why = "a column the table computes" if col in RESERVED else "also given by the pattern"
            raise FileTableError(f"labels CSV {path!r}: column {col!r} is {why}; a column comes from one place only")
    missing = df[key].isna().to_numpy()
    if missing.any():
        raise FileTableError(f"labels CSV {path!r}: column {key!r} is empty in data row {int(missing.argmax()) + 1}")
    df[key] = df[key].str.strip()
    dup = df[key].duplicated(keep=False).to_numpy()
    if dup.any():
        rows = [int(i) + 1 for i in dup.nonzero()[0][:2]]
        raise FileTableError(f"labels CSV {path!r}: {key} {df[key][dup].iloc[0]!r} appears twice (data rows {rows[0]} "
                             f"and {rows[1]}); expected one row per {'file' if key == 'file' else 'crop'}")
    return key, df


def _image_size(path: str, rel: str) -> tuple[int, int]:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return im.size
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError) as e:
        raise FileTableError(f"file {rel!r} matches the pattern but is not an image PIL can read "
                             f"({' '.join(str(e).split())})") from None


def _match_files(root: str, pattern: FilePattern) -> tuple[list[dict], list[str], int]:
    """The matched files (their fields, 'file' and 'id'), the unmatched ones and the count seen."""
    files = _walk(root)
    rows, unmatched, by_id = [], [], {}
    for rel in files:
        fields = pattern.match(rel)
        if fields is None:
            unmatched.append(rel)
            continue
        crop = fields.get("id", os.path.splitext(rel)[0])
        if crop in by_id:
            raise FileTableError(f"files {by_id[crop]!r} and {rel!r} under {root!r} have the same id {crop!r}; "
                                 "ids must be unique (add {id} to the pattern, or make it cover more of the path)")
        by_id[crop] = rel
        rows.append({**fields, "id": crop, "file": rel})
    if not rows:
        first = ", ".join(repr(u) for u in unmatched[:N_LISTED]) or "none"
        raise FileTableError(f"no file under {root!r} matches pattern {pattern.text!r}; {len(files)} files seen, "
                             f"the first: {first}")
    return rows, unmatched, len(files)


def _join_labels(frame: pd.DataFrame, labels: str, fields: tuple[str, ...]) -> tuple[pd.DataFrame, list[str]]:
    """`frame` with the labels CSV's columns joined; the keys of CSV rows no crop matched."""
    key, df = _read_labels(labels, fields)
    lookup = df.set_index(key)
    absent = ~frame[key].isin(lookup.index).to_numpy()
    if absent.any():
        which = frame["file"][absent].tolist()
        more = f" and {len(which) - 1} more have" if len(which) > 1 else " has"
        raise FileTableError(f"crop {which[0]!r}{more} no row in labels CSV {labels!r} (joined on column {key!r}); "
                             "every crop needs one")
    joined = lookup.loc[frame[key].to_numpy()].reset_index(drop=True)
    for col in joined.columns:
        frame[col] = joined[col].to_numpy()
    unused = sorted(set(df[key]) - set(frame[key]))
    return frame, unused


def _check_parent_from(pat: FilePattern, parent_from: Sequence[str] | None) -> tuple[str, ...]:
    """The fields a parent is made of, checked against the pattern (empty: none asked)."""
    if parent_from is None:
        return ()
    fields = tuple(str(f).strip() for f in ([parent_from] if isinstance(parent_from, str) else parent_from))
    if not fields:
        raise FileTableError("parent-from names no field; expected fields of the pattern, e.g. label,field")
    if "parent" in pat.fields:
        raise FileTableError(f"pattern {pat.text!r} has a {{parent}} field and parent-from {','.join(fields)} makes "
                             "another; give one of them")
    unknown = [f for f in fields if f not in pat.fields]
    if unknown:
        raise FileTableError(f"parent-from names {unknown[0]!r}, which is not a field of pattern {pat.text!r}; "
                             f"its fields are: {', '.join(pat.fields) or 'none'}")
    return fields


def _require_roles(frame: pd.DataFrame, pattern: FilePattern, labels: str | None) -> None:
    for role in ("label", "parent"):
        if role not in frame.columns:
            where = f" and labels CSV {labels!r} has no {role!r} column" if labels else " and no labels CSV gives one"
            raise FileTableError(f"pattern {pattern.text!r} has no {{{role}}} field{where}; every crop needs a {role}")
        empty = frame[role].isna().to_numpy() | (frame[role].astype(str).str.strip() == "").to_numpy()
        if empty.any():
            first = frame["file"][empty].iloc[0]
            raise FileTableError(f"crop {first!r} has no {role} (column {role!r} is empty"
                                 f"{' in labels CSV ' + repr(labels) if labels else ''}); {int(empty.sum())} crops lack one")


def table_from_files(root: str | os.PathLike, pattern: str, labels: str | os.PathLike | None = None,
                     relative_to: str | os.PathLike | None = None,
                     parent_from: Sequence[str] | None = None) -> tuple[pd.DataFrame, dict]:
    """A crop table of the files under `root` whose relative paths match `pattern`.

    Args:
        root: the released folder.
        pattern: see the module docstring, e.g. ``"im_{label}/CROPPED/{parent}_{*}.bmp"``.
        labels: optional CSV with a ``file`` (path relative to `root`) or ``id`` column and the
            columns to join (``label``, ``parent``, ...).
        relative_to: the folder the ``path`` column is relative to (default `root`); give the
            folder of the table to be written.
        parent_from: fields of the pattern whose values, joined with ``/``, make the parent
            (``("label", "field")`` when field numbers restart in each class folder); the
            pattern then has no ``{parent}``.

    Returns:
        The table (columns id, path, label, parent, other fields, w, h; sorted by id) and the
        report: files seen, matched, unmatched (count and the first `N_LISTED`), crops, classes,
        parents, unused labels rows.

    Raises:
        FileTableError: a bad pattern, no matching file, a duplicate id, a crop without label or
            parent, a matched file that is not an image, a bad labels CSV.
    """
    root = os.fspath(root)
    from shortcutlab.paths import need_folder

    need_folder(root, "folder", FileTableError)
    pat = compile_pattern(pattern)
    parent_from = _check_parent_from(pat, parent_from)
    rows, unmatched, n_files = _match_files(root, pat)
    frame = pd.DataFrame(rows)
    if parent_from:
        frame["parent"] = ["/".join(parts) for parts in zip(*(frame[f] for f in parent_from))]
    unused: list[str] = []
    if labels is not None:
        frame, unused = _join_labels(frame, os.fspath(labels), pat.fields + (("parent",) if parent_from else ()))
    _require_roles(frame, pat, None if labels is None else os.fspath(labels))
    base = os.path.abspath(os.fspath(relative_to) if relative_to is not None else root)
    sizes = [_image_size(os.path.join(root, f), f) for f in frame["file"]]
    frame["path"] = [os.path.relpath(os.path.join(os.path.abspath(root), f), base).replace(os.sep, "/") for f in frame["file"]]
    frame["w"] = [s[0] for s in sizes]
    frame["h"] = [s[1] for s in sizes]
    extra = [c for c in frame.columns if c not in ("id", "path", "label", "parent", "file", "w", "h")]
    frame = frame[["id", "path", "label", "parent", *extra, "w", "h"]].sort_values("id", kind="stable").reset_index(drop=True)
    report = {**_report(root, pat, labels, n_files, unmatched, frame, unused), "parent_from": list(parent_from) or None}
    return frame, report


def _report(root, pat: FilePattern, labels, n_files: int, unmatched: list[str], frame: pd.DataFrame,
            unused: list[str]) -> dict:
    # A parent under several labels is normal for mixed fields, but is also what a dataset whose
    # field numbers restart in each class folder looks like: recorded, for the user to judge.
    n_labels = frame.groupby("parent")["label"].nunique()
    mixed = sorted(str(p) for p in n_labels.index[n_labels.to_numpy() > 1])
    return {
        "root": os.path.abspath(root),
        "pattern": pat.text,
        "fields": list(pat.fields),
        "labels": None if labels is None else os.path.abspath(os.fspath(labels)),
        "n_files": n_files,
        "n_matched": len(frame),
        "n_unmatched": len(unmatched),
        "unmatched_first": unmatched[:N_LISTED],
        "n_labels_unused": len(unused),
        "labels_unused_first": unused[:N_LISTED],
        "n_crops": len(frame),
        "n_parents": int(frame["parent"].nunique()),
        "classes": {str(k): int(v) for k, v in frame["label"].value_counts().sort_index().items()},
        "n_parents_with_several_labels": len(mixed),
        "parents_with_several_labels_first": mixed[:N_LISTED],
        "columns": list(frame.columns),
    }


def summary_path(table_path: str | os.PathLike) -> str:
    """The JSON sidecar of a table written by `write_file_table`: ``TABLE.csv`` -> ``TABLE.json``."""
    return os.path.splitext(os.fspath(table_path))[0] + ".json"


def write_file_table(frame: pd.DataFrame, report: dict, path: str | os.PathLike) -> tuple[str, str]:
    """Write the table to `path` and its report to `summary_path(path)`, both or neither.

    The table is checked as a `CropTable` (ids unique, label and parent present) first. The
    ``path`` column must already be relative to the folder of `path` (`table_from_files`'s
    `relative_to`).

    Returns:
        The table's path and the sidecar's.
    """
    path = os.fspath(path)
    side = summary_path(path)
    if side == path:
        raise FileTableError(f"table path {path!r} would be overwritten by its JSON summary; name the table *.csv")
    CropTable.from_frame(frame, id="id", image="path", source=path)
    with atomic_files() as stage:
        frame.to_csv(stage.path(path), index=False)
        with open(stage.path(side), "w", encoding="utf-8") as f:
            f.write(to_json({**report, "table": os.path.abspath(path)}))
    return path, side
