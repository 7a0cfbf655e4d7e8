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

from probes.base import DiagnosticError


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
import io as _io  # noqa: E402  (imports of this section, kept beside the cases that use them)

import numpy as _np  # noqa: E402
import pandas as _pd  # noqa: E402

from shortcutlab import CropTable, TableError  # noqa: E402
from shortcutlab.synth import SynthError  # noqa: E402

_LATIN1_TABLE = "id,label,parent\n1,a,p\n2,caf\u00e9,p\n".encode("latin-1")
_LATIN1_OFFSET = _LATIN1_TABLE.index(b"\xe9")  # where a UTF-8 decoder first fails
_NOISE = _np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=_np.uint8)  # a PNG whose pixels fill 200 bytes
TABLE_ARGS = ["--parent", "parent", "--label", "label", "--id", "id"]


def _frame(**cols) -> _pd.DataFrame:
    return _pd.DataFrame({"id": ["a", "b", "c"], "label": ["x", "y", "x"], "parent": ["p", "q", "q"], **cols})


def _table(frame, **kw) -> CropTable:
    return CropTable.from_frame(frame, id="id", **kw)


def _csv(tmp_path, data: bytes | str, name: str = "t.csv") -> str:
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


def _from_csv(path) -> CropTable:
    return CropTable.from_csv(path, id="id")


def _image_bytes(arr, fmt: str = "PNG") -> bytes:
    from PIL import Image

    buf = _io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt)
    return buf.getvalue()


def _crops(tmp_path, image: bytes | None = None, mask: bytes | None = None, name: str = "c1.png"):
    """Load two 8 x 8 crops: c0 is fine, c1 is written from `image` (its mask from `mask`)."""
    from shortcutlab.data import load_crops

    files = {"c0.png": _image_bytes(_np.full((8, 8, 3), 7, _np.uint8))}
    if image is not None:
        files[name] = image
    cols = {"image": ["c0.png", name]}
    if mask is not None:
        files.update({"m0.png": _image_bytes(_np.full((8, 8), 255, _np.uint8)), "m1.png": mask})
        cols["mask"] = ["m0.png", "m1.png"]
    for file, data in files.items():
        (tmp_path / file).write_bytes(data)
    if image is None and name == "c1.png":
        (tmp_path / name).write_bytes(files["c0.png"])
    df = _pd.DataFrame({"id": ["c0", "c1"], "label": "x", "parent": "p", **cols})
    table = _table(df, image="image", mask="mask" if mask is not None else None)
    return load_crops(table, root=str(tmp_path))


def _synth(out: str):
    from shortcutlab.synth import SynthConfig, synthesize, write_synth

    return write_synth(synthesize(SynthConfig(fields_per_class=1, crop_size=8)), out)


def _synth_into_a_folder_of_notes(tmp_path):
    _csv(tmp_path, "mine", name="notes.txt")
    return _synth(str(tmp_path))


TABLE_CASES: list[Case] = [
    Case("parent-column-misspelled", lambda t: _table(_frame(), parent="slide"), TableError,
         ("parent column 'slide' is missing", "id, label, parent")),
    Case("label-column-missing", lambda t: _table(_frame(), label="cls"), TableError, ("label column 'cls'", "columns are")),
    Case("id-column-missing", lambda t: _table(_frame().drop(columns="id")), TableError, ("id column 'id'",)),
    Case("nan-parent", lambda t: _table(_frame(parent=["p", None, "q"])), TableError, ("column 'parent'", "row 1", "'b'")),
    Case("empty-label-in-csv", lambda t: _from_csv(_csv(t, "id,label,parent\na,,p\nb,x,p\n")), TableError,
         ("column 'label'", "row 0", "'a'")),
    Case("whitespace-only-label", lambda t: _table(_frame(label=["x", "   ", "y"])), TableError,
         ("column 'label'", "row 1", "'b'")),
    Case("duplicate-ids", lambda t: _table(_frame(id=["a", "b", "a"])), TableError, ("id 'a'", "rows 0, 2")),
    Case("ids-equal-once-stripped", lambda t: _table(_frame(id=["a", "a ", "c"])), TableError, ("id 'a'", "rows 0, 1")),
    Case("table-file-missing", lambda t: _from_csv(t / "nope.csv"), TableError, ("nope.csv", "does not exist")),
    Case("table-file-empty", lambda t: _from_csv(_csv(t, "")), TableError, ("t.csv", "empty")),
    Case("table-path-is-a-folder", lambda t: _from_csv(t), TableError, ("is a folder",)),
    Case("table-not-utf8", lambda t: _from_csv(_csv(t, _LATIN1_TABLE)), TableError,
         ("t.csv", "not UTF-8", "0xe9", f"offset {_LATIN1_OFFSET}", "line 3")),
    Case("table-malformed-csv", lambda t: _from_csv(_csv(t, "id,label,parent\na,x,p\nb,x,p,extra\n")), TableError,
         ("t.csv", "expected 3 fields in line 3, saw 4")),
    Case("crop-image-missing", lambda t: _crops(t, name="gone.png"), TableError, ("gone.png", "id 'c1'", "does not exist")),
    Case("crop-image-corrupt", lambda t: _crops(t, image=b"\x89PNG garbage" * 5), TableError,
         ("c1.png", "id 'c1'", "cannot be read")),
    Case("crop-image-truncated", lambda t: _crops(t, image=_image_bytes(_NOISE)[:100]), TableError,
         ("c1.png", "id 'c1'", "cannot be read")),
    Case("crop-image-float", lambda t: _crops(t, image=_image_bytes(_np.zeros((8, 8), _np.float32), "TIFF"), name="c1.tif"),
         TableError, ("c1.tif", "id 'c1'", "mode 'F'", "8-bit or 16-bit")),
    Case("crop-of-another-size", lambda t: _crops(t, image=_image_bytes(_np.zeros((9, 8, 3), _np.uint8))), TableError,
         ("c1.png", "id 'c1'", "8 x 9", "8 x 8")),
    Case("mask-truncated", lambda t: _crops(t, mask=_image_bytes(_np.full((8, 8), 255, _np.uint8))[:50]), TableError,
         ("m1.png", "id 'c1'", "cannot be read")),
    Case("mask-of-another-size", lambda t: _crops(t, mask=_image_bytes(_np.full((4, 8), 255, _np.uint8))), TableError,
         ("m1.png", "id 'c1'", "8 x 4")),
    Case("mask-is-a-0-1-label-image", lambda t: _crops(t, mask=_image_bytes(_np.ones((8, 8), _np.uint8))), TableError,
         ("m1.png", "id 'c1'", "values up to 1 of 255", "0 and 255")),
    Case("synth-out-is-a-file", lambda t: _synth(_csv(t, "mine", name="notes.txt")), SynthError, ("notes.txt", "is a file")),
    Case("synth-out-holds-other-files", _synth_into_a_folder_of_notes, SynthError, ("not empty", "synth.json")),
]


@pytest.fixture
def table_csv(tmp_path) -> str:
    from shortcutlab.random_tables import random_table

    path = tmp_path / "t.csv"
    random_table(8, 3, 2, geometry=False, seed=0).to_csv(path, index=False)
    return str(path)


@pytest.fixture
def no_work(monkeypatch):
    """Every command's work fails loudly: output checks must come before it."""
    import shortcutlab.demo
    import shortcutlab.recipe
    import shortcutlab.synth

    def boom(*a, **k):
        raise AssertionError("the command started its work before checking its outputs")

    monkeypatch.setattr(CropTable, "from_csv", classmethod(boom))
    monkeypatch.setattr(shortcutlab.synth, "synthesize", boom)
    monkeypatch.setattr(shortcutlab.recipe, "load_manifest_table", boom)
    monkeypatch.setattr(shortcutlab.demo, "run_demo", boom)


def _fill(argv: list[str], **values: str) -> list[str]:
    for key, value in values.items():
        argv = [a.replace("{" + key + "}", value) for a in argv]
    return argv


@pytest.mark.parametrize(
    "argv, names",
    [
        (["audit", "{table}", *TABLE_ARGS, "--json", "{file}/a.json"], ("a.json", "is a file, not a folder")),
        (["audit", "{table}", *TABLE_ARGS, "--card", "{dir}"], ("out_dir", "is a folder")),
        (["audit", "{table}", *TABLE_ARGS, "--json", "{table}"], ("--json", "t.csv", "input table")),
        (["audit", "{table}", *TABLE_ARGS, "--json", "{dir}/r", "--card", "{dir}/r"], ("--card", "also the path of --json")),
        (["split", "{table}", *TABLE_ARGS, "--protocol", "crop", "--out", "{file}/m.csv"], ("m.csv", "is a file, not a folder")),
        (["split", "{table}", *TABLE_ARGS, "--protocol", "crop", "--out", "{dir}"], ("out_dir", "is a folder")),
        (["split", "{table}", *TABLE_ARGS, "--protocol", "crop", "--out", "{dir}/m.json"], ("m.json", "sidecar", "*.csv")),
        (["split", "{table}", *TABLE_ARGS, "--protocol", "crop", "--out", "{dir}/side.csv"], ("side.json", "is a folder")),
        (["synth", "--out", "{file}"], ("--out", "blocker", "is a file")),
        (["synth", "--out", "{file}/bench"], ("bench", "blocker", "is a file, not a folder")),
        (["train", "--manifest", "m.csv", "--split", "s.csv", "--out", "{file}"], ("--out", "blocker", "is a file")),
        (["demo", "--out", "{file}/demo"], ("demo", "blocker", "is a file, not a folder")),
    ],
    ids=["audit-json-under-a-file", "audit-card-is-a-folder", "audit-json-is-the-table", "audit-json-is-the-card",
         "split-out-under-a-file", "split-out-is-a-folder", "split-out-is-its-sidecar", "split-sidecar-is-a-folder",
         "synth-out-is-a-file", "synth-out-under-a-file", "train-out-is-a-file", "demo-out-under-a-file"],
)
def test_cli_outputs_that_cannot_be_written_are_refused_before_the_work(argv, names, tmp_path, table_csv, capsys, no_work):
    (tmp_path / "blocker").write_text("a file where a folder should be")
    (tmp_path / "out_dir" / "side.json").mkdir(parents=True)
    argv = _fill(argv, table=table_csv, file=str(tmp_path / "blocker"), dir=str(tmp_path / "out_dir"))
    line = cli_error(argv, capsys)
    assert line.startswith(f"shortcutlab {argv[0]}: error: ")
    for name in names:
        assert name.lower() in line.lower(), f"{line!r} does not name {name!r}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker", "out_dir", "t.csv"]
    assert [p.name for p in (tmp_path / "out_dir").iterdir()] == ["side.json"]


@pytest.mark.parametrize(
    "argv, names",
    [
        (["split", "{table}", *TABLE_ARGS, "--protocol", "ladder", "--levels", "0,abc", "--out", "{tmp}/m.csv"],
         ("--levels", "'abc'", "numbers")),
        (["split", "{table}", *TABLE_ARGS, "--protocol", "ladder", "--levels", "0,,1", "--out", "{tmp}/m.csv"],
         ("--levels", "''", "'0,,1'")),
        (["demo", "--seeds", "0,one", "--out", "{tmp}/demo"], ("--seeds", "'one'", "integers")),
        (["synth", "--illumination-shading", "-1", "--out", "{tmp}/bench"], ("illumination_shading", ">= 0", "-1")),
        (["audit", "{tmp}", *TABLE_ARGS], ("is a folder",)),
        (["split", "{latin1}", *TABLE_ARGS, "--protocol", "crop", "--out", "{tmp}/m.csv"], ("latin1.csv", "not UTF-8", "line 3")),
    ],
    ids=["levels-not-a-number", "levels-empty-part", "seeds-not-an-integer", "synth-negative-illumination-shading", "table-is-a-folder", "table-not-utf8"],
)
def test_cli_bad_values_and_tables_name_the_culprit(argv, names, tmp_path, table_csv, capsys):
    latin1 = _csv(tmp_path, _LATIN1_TABLE, name="latin1.csv")
    line = cli_error(_fill(argv, table=table_csv, tmp=str(tmp_path), latin1=latin1), capsys)
    for name in names:
        assert name.lower() in line.lower(), f"{line!r} does not name {name!r}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latin1.csv", "t.csv"]


def test_cli_train_names_a_corrupt_crop_and_its_id(tmp_path, capsys):
    from shortcutlab.cli import main

    _synth(str(tmp_path / "bench"))
    crops = sorted((tmp_path / "bench" / "crops").iterdir())
    victim = crops[3]
    victim.write_bytes(victim.read_bytes()[:40])  # truncated
    manifest, split = str(tmp_path / "bench" / "manifest.csv"), str(tmp_path / "s.csv")
    assert main(["split", manifest, *TABLE_ARGS, "--protocol", "crop", "--out", split]) == 0
    capsys.readouterr()
    line = cli_error(["train", "--manifest", manifest, "--split", split, "--out", str(tmp_path / "run"), "--epochs", "1", "--quiet"], capsys)
    assert victim.name in line and f"id '{victim.stem}'" in line and "cannot be read" in line
    assert not (tmp_path / "run" / "run.json").exists()


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
import numpy as _np  # noqa: E402  (imports of this section, kept beside the cases that use them)
import pandas as _pd  # noqa: E402
import torch  # noqa: E402

import interventions  # noqa: E402
from interventions import InterventionError, Reinhard, StainNormalize, field_target_tensors  # noqa: E402


def _iv_images(shape=(2, 3, 8, 8), fill: float | None = None) -> torch.Tensor:
    x = torch.rand(shape, generator=torch.Generator().manual_seed(0))
    return x if fill is None else x.fill_(fill)


def _iv_mask(shape=(2, 1, 8, 8), value: float = 1.0, dtype=torch.float32) -> torch.Tensor:
    return torch.full(shape, value, dtype=dtype)


def _iv_with(x: torch.Tensor, index, value) -> torch.Tensor:
    x[index] = value
    return x


def _iv_call(name: str, x, mask=None, **params):
    return interventions.get(name, **params)(x, mask)


def _iv_field_without_cell_pixels(tmp_path):
    columns = [f"{c}_{s}" for s in ("mean", "std") for c in "Lab"]
    stats = _pd.DataFrame([[60.0, 5.0, 0.0, 10.0, 4.0, 4.0], [_np.nan] * 6], index=_pd.Index(["p1", "p2"], name="parent"), columns=columns)
    return field_target_tensors(stats, ["p1", "p2"])


_IE = InterventionError
INTERVENTION_CASES: list[Case] = [
    Case("interv-uint8-images", lambda p: _iv_call("greyscale", (_iv_images() * 255).byte()), _IE, ("dtype torch.uint8", "float", "divide uint8 images by 255")),
    Case("interv-values-above-one", lambda p: _iv_call("low_pass", _iv_with(_iv_images(), (0, 0, 0, 0), 1.5)), _IE, ("[0, 1]", "max 1.5")),
    Case("interv-negative-values", lambda p: _iv_call("hed_jitter", _iv_with(_iv_images(), (1, 2, 3, 3), -0.25)), _IE, ("[0, 1]", "min -0.25")),
    Case("interv-nan", lambda p: _iv_call("greyscale", _iv_with(_iv_images(), (0, 0, 0, 0), float("nan"))), _IE, ("[0, 1]", "nan")),
    Case("interv-rank-3", lambda p: _iv_call("greyscale", _iv_images((3, 8, 8))), _IE, ("(B, 3, H, W)", "(3, 8, 8)")),
    Case("interv-two-channels", lambda p: _iv_call("reinhard", _iv_images((2, 2, 8, 8)), target_mean=(50, 0, 0), target_std=(10, 5, 5)), _IE, ("(B, 3, H, W)", "(2, 2, 8, 8)")),
    Case("interv-zero-height", lambda p: _iv_call("stain_normalize", _iv_images((2, 3, 0, 8))), _IE, ("at least 1 x 1 pixel", "(2, 3, 0, 8)")),
    Case("interv-mask-wrong-size", lambda p: _iv_call("background_removal", _iv_images(), _iv_mask((2, 1, 7, 8))), _IE, ("(2, 1, 8, 8)", "(2, 1, 7, 8)")),
    Case("interv-mask-wrong-batch", lambda p: _iv_call("illumination_flattening", _iv_images(), _iv_mask((3, 1, 8, 8))), _IE, ("(2, 1, 8, 8)", "(3, 1, 8, 8)")),
    Case("interv-mask-above-one", lambda p: _iv_call("background_noise", _iv_images(), _iv_mask(value=2.0)), _IE, ("mask", "[0, 1]", "max 2")),
    Case("interv-mask-integers", lambda p: _iv_call("background_removal", _iv_images(), _iv_with(_iv_mask(value=0, dtype=torch.long), (0, 0, 0, 0), 3)), _IE, ("0/1", "[0, 3]")),
    Case("interv-mask-missing", lambda p: _iv_call("background_transplant", _iv_images()), _IE, ("background_transplant needs a cell mask", "(B, 1, H, W)")),
    Case("interv-unknown-name", lambda p: _iv_call("grayscale", _iv_images()), _IE, ("unknown intervention 'grayscale'", "did you mean 'greyscale'")),
    Case("interv-unknown-parameter", lambda p: _iv_call("low_pass", _iv_images(), sigmma=2.0), _IE, ("'sigmma'", "takes: sigma")),
    Case("interv-sigma-not-a-number", lambda p: _iv_call("low_pass", _iv_images(), sigma=True), _IE, ("low_pass sigma", "positive number of pixels", "True")),
    Case("interv-params-to-deterministic", lambda p: interventions.get("greyscale")(_iv_images(), params={}), _IE, ("greyscale is deterministic",)),
    Case("interv-transplant-one-crop", lambda p: _iv_call("background_transplant", _iv_images((1, 3, 8, 8)), _iv_mask((1, 1, 8, 8), 0.0)), _IE, ("only one crop", "donors=")),
    Case("interv-patch-too-large", lambda p: _iv_call("corner_patches", _iv_images(), size=20), _IE, ("size 20", "8 x 8", "size <= 8")),
    Case("interv-reinhard-target-shape", lambda p: _iv_call("reinhard", _iv_images(), target_mean=(50, 0), target_std=(10, 5, 5)), _IE, ("target_mean", "3 LAB values", "(2,)")),
    Case("interv-reinhard-zero-std", lambda p: _iv_call("reinhard", _iv_images(), target_mean=(50, 0, 0), target_std=(10, 0, 5)), _IE, ("target_std must be positive", "0.0")),
    Case("interv-reinhard-fit-mask-count", lambda p: Reinhard().fit(_iv_images((3, 3, 8, 8)), _iv_mask()), _IE, ("one mask per image (N = 3)", "(2, 1, 8, 8)")),
    Case("interv-reinhard-fit-all-masks-empty", lambda p: Reinhard().fit(_iv_images(), _iv_mask(value=0.0)), _IE, ("all 2 crop(s) have an empty cell mask", "no cell pixel")),
    Case("interv-field-without-cell-pixels", _iv_field_without_cell_pixels, _IE, ("['p2']", "mask is empty")),
    Case("interv-flattening-level-out-of-range", lambda p: _iv_call("illumination_flattening", _iv_images(), level=1.5), _IE,
         ("illumination_flattening level", "(0, 1]", "1.5")),
    Case("interv-stain-fit-no-images", lambda p: StainNormalize().fit(_iv_images((0, 3, 8, 8))), _IE, ("at least one target image", "(0, 3, 8, 8)")),
    Case("interv-stain-fit-no-tissue", lambda p: StainNormalize().fit(_iv_images(fill=0.97)), _IE, ("no stain estimate", "0 tissue pixels")),
]


# --- training ------------------------------------------------------------------------------
from shortcutlab.errors import ShortcutlabError  # noqa: E402
from shortcutlab.io import OutputError  # noqa: E402


def _train_inputs(tmp_path):
    """A 16-crop manifest (8 parents, 2 classes, 12 x 12 crops with masks) and a parent split."""
    import os

    import numpy as np
    import pandas as pd
    from PIL import Image

    from shortcutlab import parent_split
    from shortcutlab.recipe import load_manifest_table

    os.makedirs(tmp_path / "crops", exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(16):
        Image.fromarray((rng.random((12, 12, 3)) * 255).astype(np.uint8)).save(tmp_path / "crops" / f"c{i}.png")
        mask = np.zeros((12, 12), np.uint8)
        mask[3:9, 3:9] = 255
        Image.fromarray(mask).save(tmp_path / "crops" / f"m{i}.png")
        rows.append({"id": f"c{i}", "path": f"crops/c{i}.png", "mask": f"crops/m{i}.png", "label": f"k{i % 2}", "parent": f"f{i // 2}"})
    man = str(tmp_path / "manifest.csv")
    pd.DataFrame(rows).to_csv(man, index=False)
    split = str(tmp_path / "split.csv")
    parent_split(load_manifest_table(man), 0.25, seed=0).to_csv(split)
    return man, split


def _train(tmp_path, out="run", **config):
    from shortcutlab.recipe import TrainConfig, train

    man, split = _train_inputs(tmp_path)
    return train(man, split, str(tmp_path / out), TrainConfig(arch="test_resnet", epochs=1, batch_size=8, **config), progress=False)


def _train_without_cuda(tmp_path, device):
    from unittest import mock

    import torch

    with mock.patch.object(torch.cuda, "is_available", lambda: False):
        return _train(tmp_path, device=device)


def _train_into_a_file(tmp_path, out):
    (tmp_path / "afile").write_text("not a folder")
    return _train(tmp_path, out=out)


def _demo_into_a_file(tmp_path):
    from shortcutlab.demo import DemoConfig, run_demo

    (tmp_path / "afile").write_text("not a folder")
    return run_demo(str(tmp_path / "afile"), DemoConfig(fields_per_class=4, epochs=1, crop_size=16, progress=False))


TRAINING_CASES: list[Case] = [
    Case("train-device-cuda-without-gpu", lambda p: _train_without_cuda(p, "cuda"), ShortcutlabError, ("'cuda'", "no CUDA GPU", "available here: cpu")),
    Case("train-device-cuda-index-beyond", lambda p: _train_without_cuda(p, "cuda:99"), ShortcutlabError, ("'cuda:99'", "available here: cpu")),
    Case("train-device-unknown", lambda p: _train(p, device="tpu"), ShortcutlabError, ("'tpu'", "not a torch device", "available here: ")),
    Case("train-out-dir-is-a-file", lambda p: _train_into_a_file(p, "afile"), OutputError, ("afile", "is a file, not a folder")),
    Case("train-out-dir-parent-is-a-file", lambda p: _train_into_a_file(p, "afile/run"), OutputError, ("afile/run", "'", "is a file, not a folder")),
    Case("demo-out-dir-is-a-file", _demo_into_a_file, OutputError, ("afile", "not a folder")),
]


@pytest.mark.parametrize("device", ["tpu", "cuda:99"])
def test_cli_train_refuses_a_missing_device_in_one_line(device, tmp_path, capsys):
    man, split = _train_inputs(tmp_path)
    line = cli_error(["train", "--manifest", man, "--split", split, "--epochs", "1", "--device", device, "--out", str(tmp_path / "run"), "--quiet"], capsys)
    assert f"'{device}'" in line and "available here: " in line
    assert not (tmp_path / "run").exists()


def test_cli_train_refuses_a_run_folder_inside_a_file(tmp_path, capsys):
    man, split = _train_inputs(tmp_path)
    (tmp_path / "afile").write_text("x")
    line = cli_error(["train", "--manifest", man, "--split", split, "--epochs", "1", "--out", str(tmp_path / "afile" / "run"), "--quiet"], capsys)
    assert "afile" in line and "is a file, not a folder" in line


# --- diagnose (run folders and the command line) -------------------------------------------
def _bare_run(tmp_path, with_weights=False):
    import json as _json

    d = tmp_path / "run"
    d.mkdir()
    (d / "run.json").write_text(_json.dumps({"config": {"arch": "test_resnet"}, "classes": ["a", "b"]}))
    return str(d)


DIAGNOSE_CLI_CASES = [
    ("folder-without-run-json", lambda t: ["diagnose", str(t)], "has no run.json"),
    ("run-without-weights", lambda t: ["diagnose", _bare_run(t)], "has no model weights"),
    ("run-folder-missing", lambda t: ["diagnose", str(t / "nope")], "does not exist"),
    ("unknown-diagnostic", lambda t: ["diagnose", _bare_run(t), "--only", "interventoins"], "did you mean 'interventions'"),
    ("unknown-diagnostic-in-param", lambda t: ["diagnose", _bare_run(t), "--param", "leaec.rank=8"], "unknown diagnostic 'leaec'"),
    ("param-without-diagnostic", lambda t: ["diagnose", _bare_run(t), "--param", "ranks=[8]"], "ranks"),
    ("arch-without-weights", lambda t: ["diagnose", str(t), "--arch", "test_resnet"], "--weights"),
]


@pytest.mark.parametrize("argv, expected", [(c[1], c[2]) for c in DIAGNOSE_CLI_CASES], ids=[c[0] for c in DIAGNOSE_CLI_CASES])
def test_cli_diagnose_names_the_culprit(argv, expected, tmp_path, capsys) -> None:
    line = cli_error(argv(tmp_path), capsys)
    assert expected.lower() in line.lower(), line


# --- group identifiability and feature extraction ----------------------------------------------
from probes.base import DiagnosticError  # noqa: E402


def _ident(X_rows: int, parents) -> Callable:
    def call(tmp_path):
        import numpy as np

        from probes import GroupIdentifiability

        GroupIdentifiability().fit_score(np.random.default_rng(0).normal(size=(X_rows, 4)), np.asarray(parents))

    return call


def _extract(images) -> Callable:
    def call(tmp_path):
        import torch

        from probes import extract_features
        from shortcutlab.adapter import wrap

        net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 2))
        extract_features(wrap(net, head="3", mean=0.5, std=0.25), images())

    return call


def _tensor(shape, dtype_name: str) -> Callable:
    return lambda: __import__("torch").zeros(shape, dtype=getattr(__import__("torch"), dtype_name))


IDENT_CASES: list[Case] = [
    Case("ident-lengths-differ", _ident(12, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5]), DiagnosticError, ("12 rows", "parents has 11")),
    Case("ident-single-parent", _ident(6, ["slide7"] * 6), DiagnosticError, ("two parents", "'slide7'")),
    Case("ident-all-singletons", _ident(5, [0, 1, 2, 3, 4]), DiagnosticError, ("two or more crops", "5 parents", "5 of them with one crop")),
    Case("features-crops-wrong-shape", _extract(_tensor((4, 1, 16, 16), "uint8")), DiagnosticError, ("(N, 3, H, W)", "(4, 1, 16, 16)")),
    Case("features-crops-channels-last", _extract(_tensor((4, 16, 16, 3), "uint8")), DiagnosticError, ("(N, 3, H, W)", "(4, 16, 16, 3)", "permute(0, 3, 1, 2)")),
    Case("features-crops-wrong-dtype", _extract(_tensor((4, 3, 16, 16), "int32")), DiagnosticError, ("uint8", "torch.int32")),
    Case("features-crops-not-a-tensor", _extract(lambda: [[0.0]]), DiagnosticError, ("(N, 3, H, W) tensor", "list")),
]


# --- saliency (probes.saliency) ----------------------------------------------------------------
def _saliency_net(cam: bool = True):
    import torch
    from torch import nn

    from shortcutlab import wrap

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)).eval()
    return wrap(model, head="4", mean=0.5, std=0.25, **({"cam_layer": "1"} if cam else {}))


def _saliency_crops(n: int = 2, size: int = 16):
    import torch

    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(0))


def _mask_wrong_size(tmp_path):
    import torch

    from probes import randomized_head_check

    randomized_head_check(_saliency_net(), _saliency_crops(), None, masks=torch.ones(2, 1, 8, 8))


def _outside_mask_wrong_size(tmp_path):
    import torch

    from probes import outside_mass

    outside_mass(torch.rand(2, 16, 16), torch.ones(2, 1, 16, 12))


def _targets_wrong_length(tmp_path):
    from probes import gradcam

    gradcam(_saliency_net(), _saliency_crops(), targets=[0, 1, 2])


def _target_out_of_range(tmp_path):
    from probes import gradcam

    gradcam(_saliency_net(), _saliency_crops(), targets=[0, 7])


def _no_cam_layer(tmp_path):
    from probes import gradcam

    gradcam(_saliency_net(cam=False), _saliency_crops(), targets=None)


def _cascade_too_deep(tmp_path):
    from probes import randomized_head_check

    randomized_head_check(_saliency_net(), _saliency_crops(), None, cascade=5)


def _saliency_cases() -> list[Case]:
    from probes import DiagnosticError
    from shortcutlab.adapter import ModelError

    return [
        Case("saliency-mask-wrong-size", _mask_wrong_size, DiagnosticError, ("masks", "(2, 1, 16, 16)", "(2, 1, 8, 8)")),
        Case("saliency-outside-mass-mask-wrong-size", _outside_mask_wrong_size, DiagnosticError, ("masks", "(2, 1, 16, 16)", "(2, 1, 16, 12)")),
        Case("saliency-targets-wrong-length", _targets_wrong_length, DiagnosticError, ("targets", "(2,)", "(3,)")),
        Case("saliency-target-out-of-range", _target_out_of_range, DiagnosticError, ("targets", "[0, 3)", "7")),
        Case("saliency-no-cam-layer", _no_cam_layer, ModelError, ("cam_layer=", "Sequential")),
        Case("saliency-cascade-too-deep", _cascade_too_deep, DiagnosticError, ("cascade=5", "1 ('0'")),
    ]


SALIENCY_CASES: list[Case] = _saliency_cases()


# --- probes ---------------------------------------------------------------------------------
PROBE_CASES: list[Case] = []


def _probe_data(n=12, d=3, n_classes=2, crops_per_parent=3):
    import numpy as np

    X = np.random.default_rng(0).normal(size=(n, d))
    parents = np.arange(n) // crops_per_parent
    labels = parents % n_classes
    return X, labels, parents


def _parent_probe(X, labels, parents):
    from probes import ParentProbe

    return ParentProbe(n_folds=2, Cs=1.0).fit(X, labels, parents)


def _probe_singletons(tmp_path):
    X, labels, parents = _probe_data(crops_per_parent=1)
    _parent_probe(X, labels, parents)


def _probe_lengths(tmp_path):
    X, labels, parents = _probe_data()
    _parent_probe(X, labels[:-1], parents)


def _probe_nan(tmp_path):
    X, labels, parents = _probe_data()
    X[4, 1] = float("nan")
    _parent_probe(X, labels, parents)


def _leace_lengths(tmp_path):
    from probes import LeaceErasure

    X, labels, parents = _probe_data()
    LeaceErasure().fit(X[:-2], parents)


def _leace_nan(tmp_path):
    from probes import LeaceErasure

    X, labels, parents = _probe_data()
    X[7, 0] = float("inf")
    LeaceErasure(within_class=True).fit(X, parents, labels)


def _refit_head_single_class(tmp_path):
    import numpy as np

    from probes import refit_head

    X, _, _ = _probe_data()
    refit_head(None, X, np.zeros(len(X), dtype=int))


def _adversary_single_class(tmp_path):
    import numpy as np

    from probes import LinearAdversary

    X, _, parents = _probe_data()
    LinearAdversary(steps=1).fit(X, np.zeros(len(X), dtype=int), parents)


PROBE_CASES += [
    Case("probe-parent-probe-parents-with-one-crop-only", _probe_singletons, DiagnosticError, ("ParentProbe", "one crop")),
    Case("probe-parent-probe-labels-length", _probe_lengths, DiagnosticError, ("labels", "12 rows", "11")),
    Case("probe-parent-probe-nan-features", _probe_nan, DiagnosticError, ("finite", "rows [4]")),
    Case("probe-leace-parents-length", _leace_lengths, DiagnosticError, ("LeaceErasure", "parents", "10 rows", "12")),
    Case("probe-leace-inf-features", _leace_nan, DiagnosticError, ("LeaceErasure", "finite", "rows [7]")),
    Case("probe-refit-head-single-class", _refit_head_single_class, DiagnosticError, ("refit_head", "two classes", "1 class")),
    Case("probe-linear-adversary-single-class", _adversary_single_class, DiagnosticError, ("LinearAdversary", "two classes", "1 class")),
]


# --- STATS (shortcutlab.stats) --------------------------------------------------------------------
from shortcutlab.stats import StatsError  # noqa: E402

STATS_CASES: list[Case] = []


def _predictions(**change):
    import pandas as pd

    rows = [dict(model=f"m-{e}-{s}", condition="color", arch="r18", seed=s, protocol="factorial", cell=f"{e}-high",
                 exposure=e, diversity="high", intervention="none", id=f"c{c}", parent=f"p{c // 2}", label=0, pred=0,
                 correct=bool((c + s) % 3), split_sha256="") for s in range(2) for e in ("leak", "clean") for c in range(4)]
    frame = pd.DataFrame(rows)
    for col, (row, value) in change.items():
        frame[col] = frame[col].astype(object)
        frame.loc[row, col] = value
    return frame


def _stats_missing_column(tmp_path):
    from shortcutlab.stats import leak_effect

    leak_effect(_predictions().drop(columns=["parent"]), n_boot=10)


def _stats_bad_exposure(tmp_path):
    from shortcutlab.stats import leak_effect

    leak_effect(_predictions(exposure=(5, "leaky")), n_boot=10)


def _stats_bad_correct(tmp_path):
    from shortcutlab.stats import estimates

    estimates(_predictions(correct=(3, 2)), n_boot=10)


def _stats_bad_seed(tmp_path):
    from shortcutlab.stats import protocol_effect

    protocol_effect(_predictions(seed=(6, "s1")), n_boot=10)


def _stats_duplicate_crop(tmp_path):
    import pandas as pd

    from shortcutlab.stats import intervention_effect

    frame = _predictions()
    intervention_effect(pd.concat([frame, frame.iloc[[2]]], ignore_index=True), n_boot=10)


def _stats_empty_parent(tmp_path):
    from shortcutlab.stats import leak_effect

    leak_effect(_predictions(parent=(4, None)), n_boot=10)


def _stats_holm_p_out_of_range(tmp_path):
    from shortcutlab.stats import holm

    holm([0.01, 1.5])


def _stats_dose_nan(tmp_path):
    import pandas as pd

    from shortcutlab.stats import dose_response

    dose_response(pd.DataFrame({"seed": [0, 1, 2], "R": [0.1, float("nan"), 0.3], "gap": [0.0, 0.1, 0.2]}))


def _stats_dose_missing_cluster(tmp_path):
    import pandas as pd

    from shortcutlab.stats import dose_response

    dose_response(pd.DataFrame({"R": [0.1, 0.2], "gap": [0.0, 0.1]}), cluster="seed")


def _stats_not_a_frame(tmp_path):
    from shortcutlab.stats import leak_effect

    leak_effect([{"model": "m"}])


def _stats_results_missing_metric(tmp_path):
    import pandas as pd

    from shortcutlab.stats import estimates

    estimates(_predictions(), pd.DataFrame({"model": ["m-leak-0"], "diagnostic": ["parent_probe"], "value": [0.2],
                                            "setting": [""]}), n_boot=10)


STATS_CASES += [
    Case("stats-predictions-missing-column", _stats_missing_column, StatsError, ("predictions", "'parent'", "missing")),
    Case("stats-exposure-value", _stats_bad_exposure, StatsError, ("exposure", "'leaky'", "row 5", "'leak', 'clean'")),
    Case("stats-correct-value", _stats_bad_correct, StatsError, ("correct", "row 3", "True/False")),
    Case("stats-seed-not-integer", _stats_bad_seed, StatsError, ("seed", "'s1'", "row 6", "integer")),
    Case("stats-crop-scored-twice", _stats_duplicate_crop, StatsError, ("'c2'", "m-leak-0", "twice", "one row per")),
    Case("stats-empty-parent", _stats_empty_parent, StatsError, ("parent", "row 4", "string")),
    Case("stats-holm-p-outside-0-1", _stats_holm_p_out_of_range, StatsError, ("holm", "1.5", "[0, 1]")),
    Case("stats-dose-response-nan", _stats_dose_nan, StatsError, ("'R'", "row 1", "finite")),
    Case("stats-dose-response-missing-cluster", _stats_dose_missing_cluster, StatsError, ("'seed'", "missing")),
    Case("stats-predictions-not-a-frame", _stats_not_a_frame, StatsError, ("predictions", "DataFrame", "list")),
    Case("stats-results-missing-metric", _stats_results_missing_metric, StatsError, ("results", "'metric'", "missing")),
]


# --- sweep executors (Ray) -----------------------------------------------------------------------
from shortcutlab.sweep.ray_executor import RayExecutorError  # noqa: E402  (imports no Ray)


def _ray_executor(**kw):
    from shortcutlab.sweep.ray_executor import RayExecutor

    return RayExecutor(**kw)


def _ray_executor_without_ray(tmp_path):
    import sys
    from unittest import mock

    from shortcutlab.sweep import get_executor

    with mock.patch.dict(sys.modules, {"ray": None}):  # as if Ray were not installed
        get_executor("ray", address="auto")


def _ray_unreachable(tmp_path):
    with _ray_executor(address="127.0.0.1:1"):  # nothing listens on port 1: refused at once
        pass


EXECUTOR_CASES: list[Case] = [
    Case("ray-not-installed", _ray_executor_without_ray, RayExecutorError, ("needs Ray", 'pip install "shortcutlab[ray]"')),
    Case("ray-negative-retries", lambda p: _ray_executor(max_retries=-1), RayExecutorError, ("max_retries", "integer >= 0", "-1")),
    Case("ray-zero-cpus", lambda p: _ray_executor(num_cpus=0), RayExecutorError, ("num_cpus", "positive number", "0")),
    Case("ray-cpus-with-address", lambda p: _ray_executor(address="auto", num_cpus=4), RayExecutorError, ("num_cpus", "local Ray only", "'auto'")),
    Case("ray-empty-address", lambda p: _ray_executor(address=" "), RayExecutorError, ("address", "'auto'", "HOST:PORT", "' '")),
    Case("ray-runtime-env-not-a-dict", lambda p: _ray_executor(runtime_env="./code"), RayExecutorError, ("runtime_env must be a dict", "str")),
    Case("ray-unreachable-address", _ray_unreachable, RayExecutorError, ("cannot reach", "'127.0.0.1:1'", "ray start --head")),
]


# --- sweeps (config files, sweep folders) ----------------------------------------------------
from shortcutlab.sweep.config import SweepConfigError  # noqa: E402
from shortcutlab.sweep.runner import SweepError  # noqa: E402

_SWEEP_YAML = """data:
  synthetic: {mechanisms: [color], fields_per_class: 4, crop_size: 16}
split: {protocol: factorial}
seeds: [0]
models:
  - {arch: test_resnet, epochs: 1}
"""


def _sweep_config(tmp_path, text: str) -> str:
    p = tmp_path / "sweep.yaml"
    p.write_text(text)
    return str(p)


def _load_sweep(text: str):
    def call(tmp_path):
        from shortcutlab.sweep.config import load_config

        load_config(_sweep_config(tmp_path, text))

    return call


def _results_of(make):
    def call(tmp_path):
        from shortcutlab.sweep.runner import results_table

        results_table(make(tmp_path))

    return call


def _corrupt_sweep_folder(tmp_path):
    (tmp_path / "predictions.parquet").write_bytes(b"PAR1 not really")
    return str(tmp_path)


SWEEP_CASES = [
    Case("sweep-epochs-wrong-type", _load_sweep(_SWEEP_YAML.replace("epochs: 1", "epochs: one")), SweepConfigError,
         ("sweep.yaml", "models[0].epochs", "a positive integer", "'one'")),
    Case("sweep-unknown-top-level-key", _load_sweep(_SWEEP_YAML + "diagnostic: none\n"), SweepConfigError,
         ("sweep.yaml", "diagnostic", "did you mean 'diagnostics'")),
    Case("sweep-unknown-arch", _load_sweep(_SWEEP_YAML.replace("test_resnet", "resnet_181")), SweepConfigError,
         ("models[0].arch", "'resnet_181'", "resnet18")),
    Case("sweep-both-data-kinds", _load_sweep(_SWEEP_YAML.replace("data:\n", "data:\n  manifest: {path: crops.csv}\n")), SweepConfigError,
         ("data", "exactly one", "'synthetic' or 'manifest'", "got manifest, synthetic")),
    Case("sweep-negative-illumination-shading", _load_sweep(_SWEEP_YAML.replace("crop_size: 16", "crop_size: 16, illumination_shading: -1")),
         SweepConfigError, ("sweep.yaml", "data.synthetic", "illumination_shading", ">= 0", "-1")),
    Case("sweep-not-yaml", _load_sweep("data: [\n"), SweepConfigError, ("sweep.yaml", "not valid YAML", "line")),
    Case("sweep-diagnostic-param-checked-at-load", _load_sweep(_SWEEP_YAML + "diagnostics: {only: [parent_probe], params: {parent_probe: {n_folds: 2}}}\n"),
         SweepConfigError, ("sweep.yaml: diagnostics.params.parent_probe.n_folds:", "integer >= 3", "Got 2")),
    Case("sweep-unseen-field-reinhard-without-reserved-fields",
         _load_sweep(_SWEEP_YAML + "interventions: [reinhard_unseen_field]\n"), SweepConfigError,
         ("sweep.yaml", "split.params.reserve_parent_share", "reinhard_unseen_field", "got reserve_parent_share 0", "> 0")),
    Case("sweep-unseen-field-reinhard-on-a-parent-split",
         _load_sweep(_SWEEP_YAML.replace("protocol: factorial", "protocol: parent") + "interventions: [reinhard_unseen_field]\n"),
         SweepConfigError, ("sweep.yaml", "interventions.names", "'parent' split leaves none", "reserve_parent_share")),
    Case("sweep-strength-of-a-mechanism-planted-nowhere",
         _load_sweep(_SWEEP_YAML.replace("crop_size: 16}", "crop_size: 16, strengths: {noise: 2}}")), SweepConfigError,
         ("sweep.yaml", "data.synthetic.strengths.noise", "planted in no condition", "color")),
    Case("sweep-results-missing-folder", _results_of(lambda t: str(t / "nope")), SweepError, ("nope", "does not exist")),
    Case("sweep-results-unfinished-folder", _results_of(str), SweepError, ("no predictions.parquet", "shortcutlab sweep")),
    Case("sweep-results-corrupt-table", _results_of(_corrupt_sweep_folder), SweepError, ("predictions.parquet", "not a readable Parquet")),
]


def test_cli_sweep_config_error_is_one_line_before_any_work(tmp_path, capsys):
    config = _sweep_config(tmp_path, _SWEEP_YAML.replace("epochs: 1", "epochs: 0"))
    line = cli_error(["sweep", config, "--out", str(tmp_path / "out")], capsys)
    assert "sweep.yaml: models[0].epochs:" in line and "0" in line
    assert not (tmp_path / "out").exists()  # nothing written
    line = cli_error(["results", str(tmp_path / "out")], capsys)
    assert "does not exist" in line


# --- REPORT (shortcutlab report) ---------------------------------------------------------------------
from shortcutlab.io import OutputError  # noqa: E402
from shortcutlab.report import ReportError  # noqa: E402

REPORT_CASES: list[Case] = []


def _report_sweep(tmp_path, **files):
    d = tmp_path / "sweep"
    d.mkdir()
    for name, data in files.items():
        (d / name.replace("_", ".")).write_bytes(data)
    return str(d)


def _report_missing_dir(tmp_path):
    from shortcutlab.report import build_report

    build_report(str(tmp_path / "nowhere"))


def _report_dir_is_file(tmp_path):
    from shortcutlab.report import build_report

    (tmp_path / "sweep").write_text("x")
    build_report(str(tmp_path / "sweep"))


def _report_no_predictions(tmp_path):
    from shortcutlab.report import build_report

    build_report(_report_sweep(tmp_path, **{"sweep_json": b"{}"}))


def _report_corrupt_parquet(tmp_path):
    from shortcutlab.report import build_report

    build_report(_report_sweep(tmp_path, predictions_parquet=b"PAR1 this is not parquet"))


def _report_corrupt_results(tmp_path):
    from shortcutlab.report import build_report

    good = _predictions().to_csv(index=False).encode()
    build_report(_report_sweep(tmp_path, predictions_csv=good, results_parquet=b"garbage"))


def _report_missing_column(tmp_path):
    from shortcutlab.report import build_report

    build_report(_report_sweep(tmp_path, predictions_csv=_predictions().drop(columns=["correct"]).to_csv(index=False).encode()))


def _report_corrupt_sweep_json(tmp_path):
    from shortcutlab.report import build_report

    good = _predictions().to_csv(index=False).encode()
    build_report(_report_sweep(tmp_path, predictions_csv=good, sweep_json=b"{not json"))


def _report_bad_correct(tmp_path):
    from shortcutlab.report import build_report

    build_report(_report_sweep(tmp_path, predictions_csv=_predictions(correct=(3, 7)).to_csv(index=False).encode()), n_boot=10)


def _report_out_is_file(tmp_path):
    from shortcutlab.report import build_report

    d = _report_sweep(tmp_path, predictions_csv=_predictions().to_csv(index=False).encode())
    (tmp_path / "out.html").write_text("x")
    build_report(d, str(tmp_path / "out.html"), n_boot=10)


def _report_out_foreign_folder(tmp_path):
    from shortcutlab.report import build_report

    d = _report_sweep(tmp_path, predictions_csv=_predictions().to_csv(index=False).encode())
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    build_report(d, str(tmp_path / "mine"), n_boot=10)


REPORT_CASES += [
    Case("report-folder-missing", _report_missing_dir, ReportError, ("nowhere", "does not exist")),
    Case("report-folder-is-a-file", _report_dir_is_file, ReportError, ("sweep", "is a file")),
    Case("report-no-predictions", _report_no_predictions, ReportError, ("predictions.parquet", "not a finished sweep")),
    Case("report-corrupt-predictions-parquet", _report_corrupt_parquet, ReportError, ("predictions.parquet", "not a readable Parquet")),
    Case("report-corrupt-results-parquet", _report_corrupt_results, ReportError, ("results.parquet", "not a readable Parquet")),
    Case("report-predictions-missing-column", _report_missing_column, ReportError, ("'correct'", "shortcutlab sweep")),
    Case("report-corrupt-sweep-json", _report_corrupt_sweep_json, ReportError, ("sweep.json", "not valid JSON")),
    Case("report-correct-not-boolean", _report_bad_correct, StatsError, ("correct", "row 3", "True/False")),
    Case("report-out-is-a-file", _report_out_is_file, OutputError, ("out.html", "is a file")),
    Case("report-out-foreign-folder", _report_out_foreign_folder, OutputError, ("mine", "other than a report")),
]


def test_report_cli_bad_input(tmp_path, capsys):
    import os

    line = cli_error(["report", str(tmp_path / "nowhere")], capsys)
    assert line.startswith("shortcutlab report: error: ") and "nowhere" in line and "does not exist" in line
    d = _report_sweep(tmp_path, predictions_parquet=b"PAR1 nope")
    line = cli_error(["report", d], capsys)
    assert "predictions.parquet" in line and "Parquet" in line
    assert not os.path.exists(os.path.join(d, "report"))
    line = cli_error(["report", d, "--n-boot", "-1"], capsys)
    assert "--n-boot" in line


ALL_CASES = TABLE_CASES + SPLIT_CASES + INTERVENTION_CASES + TRAINING_CASES + IDENT_CASES + SALIENCY_CASES + PROBE_CASES + STATS_CASES + EXECUTOR_CASES + SWEEP_CASES + REPORT_CASES


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
def test_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)


# --- SIBLINGS: the pixel-sibling check ----------------------------------------------------------
def _sib_folder(tmp_path, name="imgs", n=2, bad: bytes | None = None):
    folder = tmp_path / name
    folder.mkdir()
    for k in range(n):
        (folder / f"i{k}.png").write_bytes(_image_bytes(_np.full((8, 8, 3), 40 * k, _np.uint8)))
    if bad is not None:
        (folder / "broken.png").write_bytes(bad)
    return str(folder)


def _sib_split(tmp_path, sides):
    _sib_folder(tmp_path)
    _pd.DataFrame({"id": ["a", "b"], "path": ["imgs/i0.png", "imgs/i1.png"]}).to_csv(tmp_path / "crops.csv", index=False)
    _pd.DataFrame({"id": ["a", "b"], "split": sides}).to_csv(tmp_path / "split.csv", index=False)
    return [str(tmp_path / "split.csv"), str(tmp_path / "crops.csv")]


SIBLINGS_CLI_CASES = [
    ("missing-folder", lambda t: [str(t / "nope"), _sib_folder(t)], "does not exist"),
    ("folder-without-images", lambda t: [_sib_folder(t), str((t / "empty").mkdir() or t / "empty")], "holds no image files"),
    ("unreadable-image", lambda t: [_sib_folder(t), _sib_folder(t, "test", bad=b"\x89PNG\r\n\x1a\nbroken")], "broken.png"),
    ("split-without-test-side", lambda t: _sib_split(t, ["train", "train"]), "has no test side"),
    ("split-without-train-side", lambda t: _sib_split(t, ["test", "val"]), "has no train side"),
    ("manifest-without-image-column", lambda t: [_csv(t, "id,file\na,x.png\n", "m.csv"), _sib_folder(t)], "no image column 'path'"),
    ("missing-image-in-manifest", lambda t: [_csv(t, "id,path\na,gone.png\n", "m.csv"), _sib_folder(t)], "gone.png"),
    ("threshold-out-of-range", lambda t: [_sib_folder(t), _sib_folder(t, "b"), "--threshold", "40"], "between 0 and 32"),
    ("ssim-out-of-range", lambda t: [_sib_folder(t), _sib_folder(t, "b"), "--ssim", "2"], "[-1, 1]"),
    ("only-one-input", lambda t: [_sib_folder(t)], "give TRAIN and TEST"),
]


@pytest.mark.parametrize("argv, expected", [(c[1], c[2]) for c in SIBLINGS_CLI_CASES], ids=[c[0] for c in SIBLINGS_CLI_CASES])
def test_cli_siblings_names_the_culprit(argv, expected, tmp_path, capsys) -> None:
    line = cli_error(["siblings", *argv(tmp_path), "--out", str(tmp_path / "out")], capsys)
    assert expected.lower() in line.lower(), line
    assert not (tmp_path / "out").exists()


def _sib_invariant_with_hashes(tmp):
    from shortcutlab import dedup_split

    df, t = _split_table(phash=_hex)
    return dedup_split(t, hashes="phash", invariant=True)


SIBLINGS_CASES: list[Case] = [
    Case("siblings-images-wrong-dtype", lambda t: __import__("shortcutlab.siblings").siblings.phash_images(_np.zeros((2, 8, 8, 3), _np.float32)), ShortcutlabError, ("uint8", "float32")),
    Case("siblings-images-wrong-shape", lambda t: __import__("shortcutlab.siblings").siblings.phash_images(_np.zeros((2, 8, 8, 5), _np.uint8)), ShortcutlabError, ("(N, H, W, 3)", "(2, 8, 8, 5)")),
    Case("dedup-invariant-needs-images", _sib_invariant_with_hashes, SplitError, ("--invariant", "--image")),
]


@pytest.mark.parametrize("case", SIBLINGS_CASES, ids=[c.id for c in SIBLINGS_CASES])
def test_bad_input_siblings(case: Case, tmp_path) -> None:
    check(case, tmp_path)


# --- LITMUS: the corner-patch litmus test -------------------------------------------------------
def _litmus_inputs(tmp_path, sides=None, masks=True):
    """A tiny synthetic benchmark (16 x 16 crops) on disk and a split manifest of it."""
    paths = _synth16(str(tmp_path / "bench"))
    man = _pd.read_csv(paths["manifest"])
    if not masks:
        man = man.drop(columns=["mask", "all_cells_mask"])
        man.to_csv(paths["manifest"], index=False)
    split = tmp_path / "split.csv"
    s = sides if sides is not None else ["test" if k % 3 == 0 else "train" for k in range(len(man))]
    _pd.DataFrame({"id": man["id"], "split": s if isinstance(s, list) else [s] * len(man)}).to_csv(split, index=False)
    return [paths["manifest"], str(split)]


def _synth16(out: str):
    from shortcutlab.synth import SynthConfig, synthesize, write_synth

    return write_synth(synthesize(SynthConfig(fields_per_class=2, crop_size=16)), out)


LITMUS_CLI_CASES = [
    ("unknown-position", lambda t: [*_litmus_inputs(t), "--positions", "top_left,middle"], "unknown patch position 'middle'"),
    ("patch-larger-than-crops", lambda t: [*_litmus_inputs(t), "--size", "40"], "patch size 40 does not fit inside the"),
    ("split-without-test-side", lambda t: [*_litmus_inputs(t, sides="train"), "--size", "8"], "has no test crops"),
    ("missing-manifest", lambda t: [str(t / "nope.csv"), str(t / "split.csv")], "nope.csv' does not exist"),
    ("zero-size", lambda t: [*_litmus_inputs(t), "--size", "0"], "positive whole number"),
]


@pytest.mark.parametrize("argv, expected", [(c[1], c[2]) for c in LITMUS_CLI_CASES], ids=[c[0] for c in LITMUS_CLI_CASES])
def test_cli_litmus_names_the_culprit(argv, expected, tmp_path, capsys) -> None:
    line = cli_error(["litmus", *argv(tmp_path), "--out", str(tmp_path / "out"), "--epochs", "1", "--quiet"], capsys)
    assert expected.lower() in line.lower(), line
    assert not (tmp_path / "out").exists()


# --- CONTROL: the deleted-signal control --------------------------------------------------------
CONTROL_CLI_CASES = [
    ("cell-without-masks", lambda t: [*_litmus_inputs(t, masks=False), "--delete", "cell"], "needs cell masks"),
    ("split-without-test-side", lambda t: [*_litmus_inputs(t, sides="train"), "--delete", "labels"], "has no test crops"),
    ("negative-dilate", lambda t: [*_litmus_inputs(t), "--delete", "cell", "--dilate", "-1"], ">= 0; got -1"),
    ("mask-column-that-does-not-exist", lambda t: [*_litmus_inputs(t), "--delete", "cell", "--mask", "cells"], "has no mask column 'cells'"),
]


@pytest.mark.parametrize("argv, expected", [(c[1], c[2]) for c in CONTROL_CLI_CASES], ids=[c[0] for c in CONTROL_CLI_CASES])
def test_cli_control_names_the_culprit(argv, expected, tmp_path, capsys) -> None:
    line = cli_error(["control", *argv(tmp_path), "--out", str(tmp_path / "out"), "--epochs", "1", "--quiet"], capsys)
    assert expected.lower() in line.lower(), line
    assert not (tmp_path / "out").exists()


def _delete_cell_bad(fill="constant", dilate=0, noise=None):
    import torch

    from shortcutlab.control import delete_cell

    return delete_cell(torch.zeros(1, 3, 4, 4), torch.zeros(1, 1, 4, 4), fill=fill, dilate=dilate, noise=noise)


def _control_masks_bad(masks):
    import torch

    from shortcutlab.control import deleted_signal_control
    from shortcutlab.data import CropImages
    from shortcutlab.manifest import SplitManifest

    t = CropTable.from_frame(_pd.DataFrame({"id": list("abcd"), "label": list("xyxy"), "parent": list("pqrs")}), id="id")
    crops = CropImages(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.ones(4, 1, 8, 8, dtype=torch.bool), t)
    split = SplitManifest(_pd.DataFrame({"id": list("abcd"), "split": ["train", "train", "test", "test"]}))
    return deleted_signal_control(crops, split, delete="cell", masks=masks)


CONTROL_CASES: list[Case] = [
    Case("control-masks-of-another-size", lambda t: _control_masks_bad(__import__("torch").ones(4, 1, 6, 8)), ShortcutlabError,
         ("masks=", "(4, 1, 8, 8)", "(4, 1, 6, 8)")),
    Case("control-masks-not-a-tensor", lambda t: _control_masks_bad(_np.ones((4, 1, 8, 8), bool)), ShortcutlabError, ("masks=", "ndarray")),
    Case("control-unknown-fill", lambda t: _delete_cell_bad(fill="blur"), ShortcutlabError, ("'blur'", "constant", "mean", "noise")),
    Case("control-fractional-dilate", lambda t: _delete_cell_bad(dilate=1.5), ShortcutlabError, ("dilate", "1.5")),
    Case("control-noise-fill-without-noise", lambda t: _delete_cell_bad(fill="noise"), ShortcutlabError, ("noise=", "(1, 3, 4, 4)")),
]


@pytest.mark.parametrize("case", CONTROL_CASES, ids=[c.id for c in CONTROL_CASES])
def test_bad_input_control(case: Case, tmp_path) -> None:
    check(case, tmp_path)


# --- issue 20: studies: silent answers and report escaping ------------------------------------
import warnings as _warnings  # noqa: E402  (imports of this section, kept beside the cases that use them)

from shortcutlab.litmus import LitmusError as _LitmusError  # noqa: E402
from shortcutlab.splits import SplitWarning as _SplitWarning  # noqa: E402


def _studies_crops(labels="xyxyxyxy", masks=None, size=16):
    """8 crops of 8 parents (random pixels), their masks (default: a centred 6 x 6 square each)
    and a parent split: crops 0-5 train, 6-7 test."""
    import torch

    from shortcutlab.data import CropImages

    n = len(labels)
    t = CropTable.from_frame(_pd.DataFrame({"id": [f"c{k}" for k in range(n)], "label": list(labels),
                                            "parent": [f"p{k}" for k in range(n)]}), id="id")
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)
    if masks is None:
        masks = torch.zeros(n, 1, size, size, dtype=torch.bool)
        masks[:, :, 5:11, 5:11] = True
    from shortcutlab.manifest import SplitManifest

    split = SplitManifest(_pd.DataFrame({"id": t.ids, "split": ["train"] * (n - 2) + ["test"] * 2}))
    return CropImages(images, masks, t), split


def _studies_tiny():
    from shortcutlab.recipe import TrainConfig

    return TrainConfig(arch="test_resnet", epochs=1, batch_size=8)


def _control_every_mask_empty(tmp_path):
    import torch

    from shortcutlab.control import deleted_signal_control

    crops, split = _studies_crops(masks=torch.zeros(8, 1, 16, 16, dtype=torch.bool))
    return deleted_signal_control(crops, split, delete="cell", config=_studies_tiny(), mask_name="mask")


STUDIES_CASES: list[Case] = [
    # every mask empty: nothing would be deleted, the control must not report a deletion
    Case("control-every-mask-empty", _control_every_mask_empty, _LitmusError, ("masks (mask)", "empty in all 8 crops", "--delete labels")),
    Case("siblings-negative-pairs-api", lambda t: __import__("shortcutlab.siblings").siblings.run(
        _sib_folder(t), _sib_folder(t, "b"), str(t / "out"), n_sheet=-3), ShortcutlabError, ("--pairs", "-3", ">= 0")),
    Case("siblings-confirm-out-of-range", lambda t: __import__("shortcutlab.siblings").siblings.find_siblings(
        _np.zeros((1, 8, 8, 3), _np.uint8), _np.zeros((1, 8, 8, 3), _np.uint8), confirm=1.5), ShortcutlabError, ("--confirm", "1.5", "[-1, 1]")),
]


@pytest.mark.parametrize("case", STUDIES_CASES, ids=[c.id for c in STUDIES_CASES])
def test_bad_input_studies(case: Case, tmp_path) -> None:
    check(case, tmp_path)


def _empty_mask_inputs(tmp_path):
    """The litmus benchmark on disk with every crop's mask column pointing at one blank PNG."""
    manifest, split = _litmus_inputs(tmp_path)
    (tmp_path / "bench" / "blank.png").write_bytes(_image_bytes(_np.zeros((16, 16), _np.uint8)))
    man = _pd.read_csv(manifest)
    man["mask"] = "blank.png"
    man.to_csv(manifest, index=False)
    return [manifest, split, "--delete", "cell", "--mask", "mask"]


STUDIES_CLI_CASES = [
    ("siblings", "siblings-negative-pairs", lambda t: [_sib_folder(t), _sib_folder(t, "b"), "--pairs", "-3"], "--pairs"),
    ("siblings", "siblings-confirm-and-no-confirm", lambda t: [_sib_folder(t), _sib_folder(t, "b"), "--confirm", "0.5", "--no-confirm"],
     "not both"),
    ("control", "control-every-mask-empty", _empty_mask_inputs, "empty in all"),
]


@pytest.mark.parametrize("command, argv, expected", [(c[0], c[2], c[3]) for c in STUDIES_CLI_CASES], ids=[c[1] for c in STUDIES_CLI_CASES])
def test_cli_studies_names_the_culprit(command, argv, expected, tmp_path, capsys) -> None:
    extra = ["--epochs", "1", "--quiet"] if command == "control" else []
    line = cli_error([command, *argv(tmp_path), "--out", str(tmp_path / "out"), *extra], capsys)
    assert expected.lower() in line.lower(), line
    if command == "siblings":
        assert "-3" in line or "not both" in line
    assert not (tmp_path / "out").exists()


def test_control_counts_crops_with_an_empty_mask(tmp_path):
    from shortcutlab.control import ControlWarning, deleted_signal_control

    crops, split = _studies_crops()
    crops.masks[[1, 6]] = False  # one training and one test crop without a cell
    with pytest.warns(ControlWarning, match=r"empty in 2 of the split's 8 crops \(e\.g\. 'c1'\)"):
        res = deleted_signal_control(crops, split, delete="cell", config=_studies_tiny(), mask_name="mask")
    assert res.settings["n_empty_masks"] == 2
    assert any("empty in 2 of" in n for n in res.notes)


def test_one_class_table_warns_and_is_recorded_in_audit_litmus_and_control(tmp_path):
    from shortcutlab.audit import audit
    from shortcutlab.card import reporting_card
    from shortcutlab.control import ControlWarning, deleted_signal_control
    from shortcutlab.litmus import litmus

    crops, split = _studies_crops(labels="a" * 8)
    with pytest.warns(_SplitWarning, match="one class \\('a'\\)"):
        r = audit(crops.table, split=split)
    assert r["n_classes"] == 1 and len(r["warnings"]) == 1 and "## Warnings" in reporting_card(r)
    with pytest.warns(_SplitWarning, match="the table holds one class \\('a'\\)"):
        lit = litmus(crops, split, positions=("top_left",), size=8, config=_studies_tiny())
    assert lit.notes and lit.rows[0]["accuracy"] == 1.0  # one class: every answer is right
    with pytest.warns(ControlWarning, match="the table holds one class"):
        ctl = deleted_signal_control(crops, split, delete="labels", config=_studies_tiny())
    assert any("one class" in n for n in ctl.notes)


def test_audit_of_an_all_train_split_warns_and_records_the_missing_test_side(tmp_path):
    from shortcutlab.audit import audit
    from shortcutlab.manifest import SplitManifest

    crops, _ = _studies_crops()
    split = SplitManifest(_pd.DataFrame({"id": crops.table.ids, "split": ["train"] * 8}))
    with pytest.warns(_SplitWarning, match="has no test crops"):
        r = audit(crops.table, split=split)
    assert "test" not in r["measured"] and r["measured"]["train"]["n_crops"] == 8
    assert r["warnings"] == [w for w in r["warnings"] if "no test crops" in w] and len(r["warnings"]) == 1


def test_siblings_with_train_equal_to_test_warns_and_records_it(tmp_path):
    from shortcutlab.siblings import run

    rng = _np.random.default_rng(3)
    folder = tmp_path / "same"
    folder.mkdir()
    for k in range(4):  # distinct random images: each one's only copy is itself
        (folder / f"i{k}.png").write_bytes(_image_bytes(rng.integers(0, 256, (16, 16, 3), dtype=_np.uint8)))
    with pytest.warns(_SplitWarning, match="the same 4 images"):
        s = run(str(folder), str(folder), str(tmp_path / "out"))
    assert s["same_images"] is True and s["n_with_sibling"] == 4 and s["share"] == 1.0
    rows = _pd.read_csv(tmp_path / "out" / "siblings.csv")
    assert (rows["test_id"] == rows["train_id"]).all()
    with _warnings.catch_warnings():
        _warnings.simplefilter("error", _SplitWarning)
        other = tmp_path / "other"
        other.mkdir()
        (other / "j.png").write_bytes(_image_bytes(rng.integers(0, 256, (16, 16, 3), dtype=_np.uint8)))
        assert run(str(folder), str(other), str(tmp_path / "out2"))["same_images"] is False


def test_cli_siblings_says_when_train_equals_test(tmp_path, capsys):
    from shortcutlab.cli import main

    folder = _sib_folder(tmp_path, n=3)
    assert main(["siblings", folder, folder, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "warning: the training and test images are the same 3 images" in out
    assert _pd.read_json(tmp_path / "out" / "siblings.json", typ="series")["same_images"]
