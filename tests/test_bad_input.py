"""The bad-input catalogue: every user mistake we know of, one case each.

Each case builds the bad input, calls the public API (or the CLI's `main`), and checks the
error type and that the one-line message names the culprit (the file, row, column, value or
shape) and what was expected. CLI cases also check that no traceback reaches the user and that
a failed command leaves no half-written output.

The catalogue grows with every feature: add a case to the section of the module you touch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest


@dataclass(frozen=True)
class Case:
    """One bad input: `call(tmp_path)` must raise `error` with every string of `names` in it."""

    id: str
    call: Callable
    error: type
    names: tuple[str, ...]


def check(case: Case, tmp_path) -> None:
    with pytest.raises(case.error) as info:
        case.call(tmp_path)
    message = str(info.value)
    assert "\n" not in message.strip(), f"message is not one line: {message!r}"
    for name in case.names:
        assert name.lower() in message.lower(), f"message {message!r} does not name {name!r}"


def cli_error(argv: list[str], capsys) -> str:
    """Run the CLI; it must exit 2 with one 'shortcutlab CMD: error: ...' line and no traceback."""
    from shortcutlab.cli import main

    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, f"exit code {rc}, stderr {err!r}"
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and ": error: " in lines[0], err
    return lines[0]


# --- tables, crop images and the CLI's table loading ----------------------------------------
TABLE_CASES: list[Case] = []


# --- splits, near-duplicate linking and manifests ---------------------------------------------
def _split_table(n_parents=12, crops=3, phash=None):
    """A two-class table with string ids listed out of sorted order (and a phash column)."""
    import pandas as pd

    from shortcutlab import CropTable

    n = n_parents * crops
    df = pd.DataFrame(
        {
            "id": [f"c{(7 * k) % n:03d}" for k in range(n)],
            "label": ["a" if (k // crops) % 2 else "b" for k in range(n)],
            "parent": [f"p{k // crops:02d}" for k in range(n)],
        }
    )
    if phash is not None:
        df["phash"] = phash(df)
    return df, CropTable.from_frame(df, id="id", phash="phash" if phash is not None else None)


def _hex(df):
    return [f"{(k * 0x9E3779B97F4A7C15) % 2**64:016x}" for k in range(len(df))]


def _split(protocol, **kw):
    from shortcutlab import make_split

    return lambda tmp: make_split(_split_table()[1], protocol, **kw)


def _dedup(hashes_of, **kw):
    from shortcutlab import dedup_split

    def call(tmp):
        df, t = _split_table()
        return dedup_split(t, hashes=hashes_of(df), **kw)

    return call


def _bad_phash_column(tmp):
    from shortcutlab import dedup_split

    def col(df):
        h = _hex(df)
        h[5] = "12345"  # row 5 is crop c035, at position 35 once the table sorts its rows by id
        return h

    return dedup_split(_split_table(phash=col)[1])


def _manifest_files(tmp, sidecar: bytes | None = None, csv: bytes | None = None):
    from shortcutlab import crop_split

    path = tmp / "m.csv"
    crop_split(_split_table()[1], 0.25, seed=0).to_csv(path)
    if sidecar is not None:
        (tmp / "m.json").write_bytes(sidecar)
    if csv is not None:
        path.write_bytes(csv)
    return path


def _read(**files):
    from shortcutlab import SplitManifest

    return lambda tmp: SplitManifest.read(_manifest_files(tmp, **files))


def _verify(**files):
    from shortcutlab import verify

    return lambda tmp: verify(_manifest_files(tmp, **files))


def _to_csv_under_a_file(tmp):
    from shortcutlab import crop_split

    (tmp / "taken").write_text("a file")
    crop_split(_split_table()[1], 0.25).to_csv(tmp / "taken" / "m.csv")


def _all_merged(tmp):
    from shortcutlab import dedup_split

    return dedup_split(_split_table(phash=lambda df: ["00000000000000ff"] * len(df))[1], 0.25)


def _errors():
    from shortcutlab import ShortcutlabError, SplitError, TableError
    from shortcutlab.io import OutputError

    return ShortcutlabError, SplitError, TableError, OutputError


ShortcutlabError, SplitError, TableError, OutputError = _errors()

SPLIT_CASES: list[Case] = [
    Case("test-fraction-above-1", _split("crop", test_fraction=1.2), SplitError, ("1.2", "between 0 and 1")),
    Case("val-fraction-too-large", _split("parent", test_fraction=0.5, val_fraction=0.6), SplitError, ("val 0.6", "test + val < 1")),
    Case("val-fraction-negative", _split("crop", val_fraction=-0.1), SplitError, ("-0.1", "[0, 1)")),
    Case("negative-seed", _split("crop", seed=-1), SplitError, ("-1", "non-negative integer")),
    Case("unknown-protocol", _split("parnet"), SplitError, ("'parnet'", "did you mean parent")),
    Case("unknown-protocol-parameter", _split("crop", unit="group"), SplitError, ("'unit'", "test_fraction")),
    Case("ladder-level-out-of-range", _split("ladder", levels=[0, 1.5]), SplitError, ("1.5", "[0, 1]")),
    Case("ladder-level-not-a-number", _split("ladder", levels=[0, "abc"]), SplitError, ("'abc'", "numbers in [0, 1]")),
    Case("ladder-levels-repeated", _split("ladder", levels=[0.5, 0.5]), SplitError, ("0.5", "distinct")),
    Case("factorial-test-parent-share", _split("factorial", test_parent_share=0), SplitError, ("test_parent_share", "(0, 1)")),
    Case("factorial-contrast-nan", _split("factorial", diversity_contrast=float("nan")), SplitError, ("nan", ">= 1")),
    Case("factorial-allocation", _split("factorial", allocation="equal"), SplitError, ("'equal'", "'balanced'")),
    Case("parent-split-unknown-unit", _split("parent", unit="slide"), TableError, ("'slide'", "'parent' or 'group'")),
    Case("dedup-unknown-unit", _split("parent-dedup", unit="slide", hashes="x"), SplitError, ("'slide'", "'parent' or 'group'")),
    Case("crop-split-empty-test", _split("crop", test_fraction=0.01), SplitError, ("0.01", "test side empty")),
    Case("parent-split-empty-val", _split("parent", test_fraction=0.3, val_fraction=0.01), SplitError, ("0.01", "val side empty")),
    Case("dedup-all-parents-merged", _all_merged, SplitError, ("side empty", "12 parents became 1")),
    Case("dedup-no-hashes", _split("parent-dedup"), SplitError, ("needs perceptual hashes", "--hash-column")),
    Case("dedup-bare-array", _dedup(lambda df: _hex(df)), SplitError, ("list", "keyed by crop id")),
    Case("dedup-range-index-series", _dedup(lambda df: df.assign(h=_hex(df))["h"]), SplitError, ("RangeIndex", "crop id")),
    Case("dedup-hash-id-missing", _dedup(lambda df: dict(zip(df["id"][1:], _hex(df)[1:]))), SplitError, ("lack 1 crop id", "'c000'")),
    Case("dedup-hash-id-unknown", _dedup(lambda df: {**dict(zip(df["id"], _hex(df))), "zz9": "00000000000000ff"}), SplitError, ("'zz9'", "not crops of the table")),
    Case("dedup-hash-column-unknown", _dedup(lambda df: "hashes"), SplitError, ("'hashes'", "--hash-column")),
    Case("dedup-bad-hex-in-phash-column", _bad_phash_column, TableError, ("crop id 'c035'", "'12345'", "16 hexadecimal digits")),
    Case("dedup-hash-out-of-range", _dedup(lambda df: dict(zip(df["id"], [2**64] + [1] * (len(df) - 1)))), TableError, ("crop id 'c000'", str(2**64))),
    Case("dedup-max-distance", _dedup(lambda df: dict(zip(df["id"], _hex(df))), max_distance=40), ShortcutlabError, ("max_distance", "40")),
    Case("manifest-file-missing", lambda tmp: __import__("shortcutlab").SplitManifest.read(tmp / "none.csv"), SplitError, ("none.csv", "does not exist")),
    Case("manifest-bad-side", _read(csv=b"id,split\nc000,train\nc001,holdout\n"), SplitError, ("m.csv", "'holdout'", "row 1")),
    Case("manifest-not-utf8", _read(csv=b"id,split\nc\xff00,train\n"), SplitError, ("m.csv", "not UTF-8")),
    Case("sidecar-corrupt-json-read", _read(sidecar=b'{"protocol": "crop",'), SplitError, ("m.json", "not valid JSON", "line 1")),
    Case("sidecar-corrupt-json-verify", _verify(sidecar=b"{oops}"), SplitError, ("m.json", "not valid JSON")),
    Case("sidecar-not-an-object", _verify(sidecar=b'"abc"'), SplitError, ("m.json", "JSON object", "str")),
    Case("to-csv-parent-is-a-file", _to_csv_under_a_file, OutputError, ("taken", "is a file, not a folder")),
]


# --- interventions ---------------------------------------------------------------------------
INTERVENTION_CASES: list[Case] = []


# --- training ------------------------------------------------------------------------------
TRAINING_CASES: list[Case] = []


ALL_CASES = TABLE_CASES + SPLIT_CASES + INTERVENTION_CASES + TRAINING_CASES


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
def test_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)
