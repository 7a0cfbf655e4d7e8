"""The sweep's predictions table as the statistics read it: its columns and their checks."""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from .errors import StatsError

__all__ = ["EXPOSURES", "PREDICTION_COLUMNS", "as_str", "check_predictions", "check_unique", "correct_as_float",
           "group_codes", "need_columns"]

#: Columns of the sweep's predictions table (the contract) that the statistics read.
PREDICTION_COLUMNS = ("model", "condition", "arch", "seed", "protocol", "exposure", "diversity",
                      "intervention", "id", "parent", "correct")
#: Values of the `exposure` column: a factorial cell's leak or clean model, or '' (no cell).
EXPOSURES = ("leak", "clean", "")


def need_columns(frame, columns: Iterable[str], what: str) -> None:
    """Check that `frame` is a DataFrame holding `columns`.

    Args:
        frame: the frame to check.
        columns: the column names it needs.
        what: how the message names the frame ('predictions', 'holm frame').

    Raises:
        StatsError: not a DataFrame, or a column is missing (naming it, the needed ones and
            the columns present).
    """
    if not isinstance(frame, pd.DataFrame):
        raise StatsError(f"{what} must be a pandas DataFrame; got {type(frame).__name__}")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise StatsError(f"{what} column {missing[0]!r} is missing (needs {', '.join(columns)}); "
                         f"columns are: {', '.join(map(str, frame.columns))}")


def check_predictions(pred: pd.DataFrame, columns=PREDICTION_COLUMNS) -> pd.DataFrame:
    """Validate a predictions frame; return a copy with string keys and a 0/1 float `correct`."""
    need_columns(pred, columns, "predictions")
    out = pred.loc[:, [c for c in dict.fromkeys(columns)]].copy()
    for col in ("model", "condition", "arch", "protocol", "exposure", "diversity", "intervention", "id", "parent"):
        if col in out.columns:
            if out[col].isna().any():
                raise StatsError(f"predictions column {col!r} is empty in {_rows(out[col].isna())}; expected a string "
                                 f"('' where it does not apply)")
            out[col] = as_str(out[col])
    if "exposure" in out.columns:
        bad = ~out["exposure"].isin(EXPOSURES)
        if bad.any():
            value = out["exposure"][bad].iloc[0]
            raise StatsError(f"predictions column 'exposure' holds {value!r} in {_rows(bad)}; expected 'leak', 'clean' "
                             f"or '' (not a factorial cell)")
    num = pd.to_numeric(out["seed"], errors="coerce")
    bad = (num.isna() | (num % 1 != 0)).to_numpy()
    if bad.any():
        raise StatsError(f"predictions column 'seed' holds {out['seed'][bad].iloc[0]!r} in {_rows(bad)}; "
                         f"expected an integer seed")
    out["seed"] = num.astype(np.int64)
    out["correct"] = correct_as_float(out["correct"])
    return out


def correct_as_float(corr: pd.Series) -> pd.Series:
    """A predictions table's `correct` column as 0.0/1.0 floats.

    Raises:
        StatsError: a value other than True/False or 1/0, naming the first rows that hold one.
    """
    if pd.api.types.is_bool_dtype(corr):
        return corr.astype(np.float64)
    num = pd.to_numeric(corr, errors="coerce")
    bad = ~num.isin([0, 1])
    if bad.any():
        raise StatsError(f"predictions column 'correct' holds {corr[bad].iloc[0]!r} in {_rows(bad)}; "
                         f"expected True/False or 1/0")
    return num.astype(np.float64)


def as_str(col: pd.Series) -> pd.Series:
    """Strings as they are; categoricals keep their codes (string categories); the rest as str."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.cat.rename_categories([str(c) for c in col.cat.categories])
    if pd.api.types.is_string_dtype(col.dtype) and not pd.api.types.is_object_dtype(col.dtype):
        return col
    return col.astype(str)


def group_codes(frame: pd.DataFrame, columns: Sequence) -> np.ndarray:
    """One int64 group code per row for the combination of `columns` (names of frame's columns
    or arrays of its length; dense, unsorted)."""
    code = np.zeros(len(frame), dtype=np.int64)
    size = 1
    for col in columns:
        c, u = pd.factorize(frame[col] if isinstance(col, str) else col)
        if size * max(1, len(u)) >= 2 ** 62:
            code = np.unique(code, return_inverse=True)[1].astype(np.int64)
            size = int(code.max()) + 1 if len(code) else 1
        code = code * max(1, len(u)) + c
        size *= max(1, len(u))
    return np.unique(code, return_inverse=True)[1].astype(np.int64) if len(code) else code


def _rows(mask) -> str:
    from shortcutlab.errors import first_rows

    return first_rows(np.asarray(mask, dtype=bool))


def check_unique(pred: pd.DataFrame) -> None:
    """Check that a checked predictions frame holds each crop once per model and intervention.

    Raises:
        StatsError: a duplicate, naming the crop, the model, the intervention and the rows.
    """
    dup = pred.duplicated(["model", "intervention", "id"])
    if dup.any():
        r = pred[dup].iloc[0]
        raise StatsError(f"predictions hold crop {r['id']!r} twice for model {r['model']!r} under intervention "
                         f"{r['intervention']!r} ({_rows(dup)}); expected one row per model x intervention x crop")
