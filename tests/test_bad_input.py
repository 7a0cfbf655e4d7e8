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

from probes.errors import DiagnosticError


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
    from shortcutlab.data.images import load_crops

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
    Case("synth-out-holds-other-files", _synth_into_a_folder_of_notes, __import__("shortcutlab.io").io.OutputError,
         ("notes.txt", "shortcutlab did not write", "new or empty folder")),
]


@pytest.fixture
def table_csv(tmp_path) -> str:
    from shortcutlab.data.random_tables import random_table

    path = tmp_path / "t.csv"
    random_table(8, 3, 2, geometry=False, seed=0).to_csv(path, index=False)
    return str(path)


@pytest.fixture
def no_work(monkeypatch):
    """Every command's work fails loudly: output checks must come before it."""
    import shortcutlab.data.images
    import shortcutlab.studies.demo
    import shortcutlab.synth

    def boom(*a, **k):
        raise AssertionError("the command started its work before checking its outputs")

    monkeypatch.setattr(CropTable, "from_csv", classmethod(boom))
    monkeypatch.setattr(shortcutlab.synth, "synthesize", boom)
    monkeypatch.setattr(shortcutlab.data.images, "load_manifest_table", boom)
    monkeypatch.setattr(shortcutlab.studies.demo, "run_demo", boom)


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
    from shortcutlab.data.images import load_manifest_table

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
    from shortcutlab.models.recipe import TrainConfig, train

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
    from shortcutlab.studies.demo import DemoConfig, run_demo

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
        from shortcutlab.models.adapter import wrap

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
    from shortcutlab.models.adapter import ModelError

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
from shortcutlab.sweep.executors.ray import RayExecutorError  # noqa: E402  (imports no Ray)


def _ray_executor(**kw):
    from shortcutlab.sweep.executors.ray import RayExecutor

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
    Case("report-out-foreign-folder", _report_out_foreign_folder, OutputError, ("mine", "notes.txt", "shortcutlab did not write")),
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
    Case("siblings-images-wrong-dtype", lambda t: __import__("shortcutlab.data.siblings").data.siblings.phash_images(_np.zeros((2, 8, 8, 3), _np.float32)), ShortcutlabError, ("uint8", "float32")),
    Case("siblings-images-wrong-shape", lambda t: __import__("shortcutlab.data.siblings").data.siblings.phash_images(_np.zeros((2, 8, 8, 5), _np.uint8)), ShortcutlabError, ("(N, H, W, 3)", "(2, 8, 8, 5)")),
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

    from shortcutlab.studies.control import delete_cell

    return delete_cell(torch.zeros(1, 3, 4, 4), torch.zeros(1, 1, 4, 4), fill=fill, dilate=dilate, noise=noise)


def _control_masks_bad(masks):
    import torch

    from shortcutlab.studies.control import deleted_signal_control
    from shortcutlab.data.images import CropImages
    from shortcutlab.data.manifest import SplitManifest

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


# --- issue 20: sweep processes and config limits ---
# Caps on a sweep config (YAML size, longest scalar, nesting depth, seeds, planned tasks), each
# refused in one line naming the number and the cap; and silent answers made loud (a key given
# twice, an empty intervention setting list, an out-of-range split parameter at load time).
# The caps must hit before the work they guard: the cases below make that work impossible
# (the parser or the grid expansion raises if reached), so a case that passes did none of it.
import yaml as _yaml  # noqa: E402

import shortcutlab.sweep.config as _sweep_config_module  # noqa: E402

_I20_YAML = """data:
  synthetic: {mechanisms: [color], fields_per_class: 4, crop_size: 16}
split: {protocol: crop, params: {test_fraction: 0.25}}
seeds: [0]
models:
  - {arch: test_resnet, epochs: 1}
"""


def _i20_dry_run(tmp_path, capsys, text: str, *extra: str) -> str:
    config = _sweep_config(tmp_path, text)
    return cli_error(["sweep", config, "--out", str(tmp_path / "out"), "--dry-run", *extra], capsys)


@pytest.fixture
def _no_parsing(monkeypatch):
    """The YAML parser and constructor raise if reached (the byte cap comes first)."""
    def refuse(*a, **k):
        raise AssertionError("the YAML was parsed")

    monkeypatch.setattr(_yaml, "parse", refuse)
    monkeypatch.setattr(_yaml, "load", refuse)


@pytest.fixture
def _no_objects(monkeypatch):
    """The YAML constructor raises if reached (depth and scalar caps are checked on the event stream)."""
    def refuse(*a, **k):
        raise AssertionError("the YAML was turned into objects")

    monkeypatch.setattr(_yaml, "load", refuse)


@pytest.fixture
def _no_grid(monkeypatch):
    """Expanding any part of the grid raises if reached (the seed and task caps come first)."""
    def refuse(*a, **k):
        raise AssertionError("the grid was expanded")

    monkeypatch.setattr(_sweep_config_module, "expand", refuse)


def test_i20_sweep_config_over_the_byte_cap_is_refused_unread(tmp_path, capsys, _no_parsing):
    text = _I20_YAML + "note: " + "a" * 2_000_001 + "\n"  # the 50 MB scalar of the issue, scaled down
    line = _i20_dry_run(tmp_path, capsys, text)
    size = len(text.encode())
    assert f"sweep.yaml: {size:,} bytes of YAML, over the cap of 2,000,000" in line and "--limit bytes=N" in line
    line = _i20_dry_run(tmp_path, capsys, text, "--limit", f"bytes={size - 1}")
    assert f"over the cap of {size - 1:,}" in line


def test_i20_sweep_config_scalar_over_the_cap_is_refused_before_building_objects(tmp_path, capsys, _no_objects):
    line = _i20_dry_run(tmp_path, capsys, _I20_YAML + "note: " + "a" * 100_001 + "\n")
    assert "sweep.yaml: line 7: 100,001 characters in one YAML scalar, over the cap of 100,000" in line
    assert "--limit scalar=N" in line


@pytest.mark.parametrize("style", ["flow", "block"])
def test_i20_sweep_config_nested_over_the_depth_cap_is_refused_before_building_objects(tmp_path, capsys, _no_objects, style):
    # 51 levels below `note` (52 with the top-level mapping): refused at the 51st level's line
    if style == "flow":
        text = _I20_YAML + "note: " + "[" * 51 + "]" * 51 + "\n"
        where = "line 7"
    else:
        text = _I20_YAML + "note:\n" + "".join("  " * i + "- \n" for i in range(1, 52))
        where = "line 57"  # the 50th nested sequence starts at the 50th '- ' line: 7 + 50
    line = _i20_dry_run(tmp_path, capsys, text)
    assert f"sweep.yaml: {where}: 51 levels of nesting, over the cap of 50" in line and "--limit depth=N" in line


def test_i20_sweep_config_thousands_of_levels_deep_is_one_line_not_a_recursion_error(tmp_path, capsys):
    line = _i20_dry_run(tmp_path, capsys, _I20_YAML + "note: " + "[" * 5000 + "]" * 5000 + "\n")
    assert "sweep.yaml: line 7:" in line and "levels of nesting, over the cap of 50" in line


def test_i20_sweep_seeds_over_the_cap_are_refused_before_the_grid(tmp_path, capsys, _no_grid):
    seeds = "seeds: [" + ", ".join(map(str, range(10_001))) + "]"
    line = _i20_dry_run(tmp_path, capsys, _I20_YAML.replace("seeds: [0]", seeds))
    assert "sweep.yaml: seeds: 10,001 seeds, over the cap of 10,000" in line
    assert "`limits: {seeds: N}` in the config or `--limit seeds=N`" in line
    line = _i20_dry_run(tmp_path, capsys, _I20_YAML.replace("seeds: [0]", "seeds: [0, 1, 2, 3]"), "--limit", "seeds=3")
    assert "4 seeds, over the cap of 3" in line


def test_i20_sweep_grid_over_the_task_cap_is_refused_before_the_grid(tmp_path, capsys, _no_grid):
    # by hand: 2 mechanisms x 50 fields_per_class = 100 conditions, 10 seeds; per condition and
    # seed 1 synthesise + 1 split setting x (1 split + 100 epochs recipes x 4 cells x 3 tasks)
    # = 100 * 10 * (1 + 1201) = 1,202,000
    text = _I20_YAML.replace("mechanisms: [color], fields_per_class: 4", f"mechanisms: [color, none], fields_per_class: {list(range(4, 54))}")
    text = text.replace("{protocol: crop, params: {test_fraction: 0.25}}", "{protocol: factorial}")
    text = text.replace("seeds: [0]", f"seeds: {list(range(10))}").replace("epochs: 1", f"epochs: {list(range(1, 101))}")
    line = _i20_dry_run(tmp_path, capsys, text)
    assert "sweep.yaml: the grid plans up to 1,202,000 tasks, over the cap of 100,000" in line
    assert "`limits: {tasks: N}` in the config or `--limit tasks=N`" in line


def test_i20_sweep_task_cap_is_settable_in_the_config_and_on_the_command_line(tmp_path, capsys):
    # _I20_YAML plans 1 synthesise + 1 split + train, score, diagnose = 5 tasks
    line = _i20_dry_run(tmp_path, capsys, _I20_YAML + "limits: {tasks: 4}\n")
    assert "5 tasks, over the cap of 4" in line
    line = _i20_dry_run(tmp_path, capsys, _I20_YAML + "limits: {tasks: 5}\n", "--limit", "tasks=4")  # the flag wins
    assert "5 tasks, over the cap of 4" in line
    from shortcutlab.cli import main

    assert main(["sweep", _sweep_config(tmp_path, _I20_YAML + "limits: {tasks: 4}\n"), "--out", str(tmp_path / "o"),
                 "--dry-run", "--limit", "tasks=5"]) == 0
    assert "5 in all" in capsys.readouterr().out


SWEEP_I20_CASES = [
    Case("sweep-duplicate-top-level-key", _load_sweep(_I20_YAML + "seeds: [1]\n"), SweepConfigError,
         ("sweep.yaml", "duplicate key 'seeds'", "lines 4 and 7")),
    Case("sweep-duplicate-nested-key", _load_sweep(_I20_YAML.replace("epochs: 1}", "epochs: 1,\n     epochs: 2}")), SweepConfigError,
         ("sweep.yaml", "duplicate key 'epochs'", "lines 6 and 7")),
    Case("sweep-intervention-empty-setting-list",
         _load_sweep(_I20_YAML + "interventions: {names: [greyscale, low_pass], params: {low_pass: []}}\n"), SweepConfigError,
         ("sweep.yaml: interventions.params.low_pass:", "empty list", "no setting")),
    Case("sweep-intervention-names-empty", _load_sweep(_I20_YAML + "interventions: {names: []}\n"), SweepConfigError,
         ("sweep.yaml: interventions.names:", "empty list", "interventions: none")),
    Case("sweep-interventions-empty-list", _load_sweep(_I20_YAML + "interventions: []\n"), SweepConfigError,
         ("sweep.yaml: interventions.names:", "empty list", "interventions: none")),
    Case("sweep-split-test-fraction-out-of-range", _load_sweep(_I20_YAML.replace("0.25", "1.5")), SweepConfigError,
         ("sweep.yaml: split.params.test_fraction:", "crop", "between 0 and 1", "1.5")),
    Case("sweep-split-test-fraction-out-of-range-in-a-list", _load_sweep(_I20_YAML.replace("0.25", "[0.25, 1.5]")), SweepConfigError,
         ("sweep.yaml: split.params.test_fraction[1]:", "1.5")),
    Case("sweep-split-val-fraction-leaves-no-train-side",
         _load_sweep(_I20_YAML.replace("{test_fraction: 0.25}", "{test_fraction: 0.5, val_fraction: 0.5}")), SweepConfigError,
         ("sweep.yaml: split.params", "val", "test + val < 1")),
    Case("sweep-factorial-share-out-of-range",
         _load_sweep(_I20_YAML.replace("{protocol: crop, params: {test_fraction: 0.25}}", "{protocol: factorial, params: {test_parent_share: 1.2}}")),
         SweepConfigError, ("sweep.yaml: split.params.test_parent_share:", "(0, 1)", "1.2")),
    Case("sweep-ladder-level-out-of-range",
         _load_sweep(_I20_YAML.replace("{protocol: crop, params: {test_fraction: 0.25}}", "{protocol: ladder, params: {levels: [0, 2]}}")),
         SweepConfigError, ("sweep.yaml: split.params.levels:", "[0, 1]", "2.0")),
    Case("sweep-dedup-distance-out-of-range",
         _load_sweep(_I20_YAML.replace("{protocol: crop, params: {test_fraction: 0.25}}", "{protocol: parent-dedup, params: {max_distance: 40}}")),
         SweepConfigError, ("sweep.yaml: split.params.max_distance:", "40")),
    Case("sweep-reading-limit-set-inside-the-config", _load_sweep(_I20_YAML + "limits: {depth: 100}\n"), SweepConfigError,
         ("sweep.yaml: limits.depth:", "--limit depth=N")),
    Case("sweep-unknown-limit", lambda t: _sweep_config_module.load_config(_sweep_config(t, _I20_YAML), limits={"taks": 5}),
         SweepConfigError, ("unknown limit 'taks'", "did you mean 'tasks'")),
    Case("sweep-limit-not-positive", _load_sweep(_I20_YAML + "limits: {tasks: 0}\n"), SweepConfigError,
         ("limits", "'tasks'", "positive integer", "0")),
]


@pytest.mark.parametrize("case", SWEEP_I20_CASES, ids=[c.id for c in SWEEP_I20_CASES])
def test_bad_input_sweep_i20(case: Case, tmp_path) -> None:
    check(case, tmp_path)


def test_i20_split_parameter_refused_at_load_with_the_split_functions_own_message(tmp_path):
    # the same check, the same words: the message of the split function itself, run on data
    from shortcutlab.errors import SplitError
    from shortcutlab.data.splits import crop_split, factorial_split

    table = CropTable.from_frame(_pd.DataFrame({"id": list("abcd"), "label": list("xyxy"), "parent": list("ppqq")}), id="id")
    for call, yaml_split in [(lambda: crop_split(table, test_fraction=1.5), "{protocol: crop, params: {test_fraction: 1.5}}"),
                             (lambda: factorial_split(table, n_per_class=0), "{protocol: factorial, params: {n_per_class: 0}}")]:
        with pytest.raises(SplitError) as at_run:
            call()
        with pytest.raises(SweepConfigError) as at_load:
            _sweep_config_module.load_config(_sweep_config(tmp_path, _I20_YAML.replace("{protocol: crop, params: {test_fraction: 0.25}}", yaml_split)))
        assert str(at_run.value) in str(at_load.value)


def test_i20_cli_bad_limit_flag_is_one_line(tmp_path, capsys):
    line = _i20_dry_run(tmp_path, capsys, _I20_YAML, "--limit", "tasks")
    assert "--limit takes NAME=N" in line and "'tasks'" in line
    line = _i20_dry_run(tmp_path, capsys, _I20_YAML, "--limit", "taks=5")
    assert "unknown limit 'taks'" in line and "did you mean 'tasks'" in line
# --- issue 20: library input checks and probe messages ----------------------------------------
import numpy as _lib_np  # noqa: E402  (imports of this section, kept beside the cases that use them)
import torch as _lib_torch  # noqa: E402

from shortcutlab.models.adapter import InputError as _LibInputError  # noqa: E402


def _lib_probe_data():
    """24 crops, 8 parents of 3 crops, 2 classes: a valid ParentProbe input to break one way."""
    X = _lib_np.random.default_rng(0).normal(size=(24, 3))
    parents = _lib_np.arange(24) // 3
    return X, parents % 2, parents


def _lib_parent_probe(labels=None, parents=None, drop=None):
    def call(tmp_path):
        from probes import ParentProbe

        X, lab, par = _lib_probe_data()
        lab = lab if labels is None else labels(lab)
        par = par if parents is None else parents(par)
        ParentProbe(n_folds=2, Cs=1.0).fit(X, None if drop == "labels" else lab, None if drop == "parents" else par)

    return call


def _lib_with(arr, row: int, value):
    out = arr.astype(object) if value is None or isinstance(value, str) else arr.astype(float)
    out[row] = value
    return out


def _lib_check(fn: str, train_idx=None, test=None):
    def call(tmp_path):
        import probes

        X, lab, par = _lib_probe_data()
        kw = dict(train_idx=_lib_np.arange(12) if train_idx is None else train_idx,
                  test_sets={"test": _lib_np.arange(12, 24) if test is None else test})
        if fn == "adversary_check":
            kw["adversary"] = probes.LinearAdversary(steps=1)
        getattr(probes, fn)(X, lab, par, **kw)

    return call


def _lib_saliency(fn: str, shape):
    def call(tmp_path):
        import probes

        getattr(probes, fn)(_saliency_net(), _lib_torch.rand(*shape))

    return call


def _lib_corrupt_cache(data: bytes):
    def call(tmp_path):
        from probes import extract_features
        from shortcutlab.models.adapter import wrap

        _lib_torch.manual_seed(0)
        net = _lib_torch.nn.Sequential(_lib_torch.nn.Conv2d(3, 4, 3), _lib_torch.nn.AdaptiveAvgPool2d(1), _lib_torch.nn.Flatten(), _lib_torch.nn.Linear(4, 2))
        adapter = wrap(net, head="3", mean=0.5, std=0.25)
        crops = _lib_torch.randint(0, 256, (4, 3, 8, 8), dtype=_lib_torch.uint8)
        cache = tmp_path / "feats"
        extract_features(adapter, crops, cache_dir=cache)
        (path,) = cache.iterdir()  # the one cache file just written
        path.write_bytes(data)
        extract_features(adapter, crops, cache_dir=cache)

    return call


_LIB_BAD_CACHES = {"truncated": b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (4, 4), }" + b" " * 45 + b"\n\x00\x00",
                   "not-npy": b"hello, not an array"}


def _lib_int_cache(tmp_path):
    import io

    buf = io.BytesIO()
    _lib_np.save(buf, _lib_np.arange(4))
    _lib_corrupt_cache(buf.getvalue())(tmp_path)


LIB_CASES: list[Case] = [
    Case("lib-parent-probe-none-parent", _lib_parent_probe(parents=lambda p: _lib_with(p, 5, None)), DiagnosticError, ("ParentProbe", "parents", "rows [5]", "None")),
    Case("lib-parent-probe-nan-parent", _lib_parent_probe(parents=lambda p: _lib_with(p, 7, float("nan"))), DiagnosticError, ("parents", "rows [7]", "NaN")),
    Case("lib-parent-probe-none-label", _lib_parent_probe(labels=lambda l: _lib_with(l, 2, None)), DiagnosticError, ("labels", "rows [2]", "None")),
    Case("lib-parent-probe-mixed-parent-types", _lib_parent_probe(parents=lambda p: _lib_with(p, 0, "0")), DiagnosticError, ("parents", "one type", "int", "str")),
    Case("lib-parent-probe-parents-none", _lib_parent_probe(drop="parents"), DiagnosticError, ("ParentProbe.fit needs parents", "got None")),
    Case("lib-leace-parents-none", lambda t: __import__("probes").LeaceErasure().fit(_lib_probe_data()[0], None), DiagnosticError,
         ("LeaceErasure.fit needs parents", "got None")),
    Case("lib-adversary-parents-none", lambda t: __import__("probes").LinearAdversary(steps=1).fit(_lib_probe_data()[0], _lib_probe_data()[1], None),
         DiagnosticError, ("LinearAdversary.fit needs parents", "got None")),
    Case("lib-erasure-check-labels-none", lambda t: __import__("probes").erasure_check(_lib_probe_data()[0], None, _lib_probe_data()[2],
         train_idx=_lib_np.arange(12), test_sets={"test": _lib_np.arange(12, 24)}), DiagnosticError, ("erasure_check needs labels", "got None")),
    Case("lib-erasure-check-train-idx-minus-one", _lib_check("erasure_check", train_idx=_lib_np.array([-1, 0, 1, 2, 3])), DiagnosticError,
         ("erasure_check", "train_idx", "[0, 24)", "got -1")),
    Case("lib-erasure-check-train-idx-floats", _lib_check("erasure_check", train_idx=_lib_np.arange(12) + 0.5), DiagnosticError,
         ("erasure_check", "train_idx", "integer row positions", "float64", "0.5")),
    Case("lib-erasure-check-train-idx-whole-floats", _lib_check("erasure_check", train_idx=_lib_np.arange(12.0)), DiagnosticError,
         ("train_idx", "integer row positions", "float64")),
    Case("lib-erasure-check-train-idx-mask", _lib_check("erasure_check", train_idx=_lib_np.arange(24) < 12), DiagnosticError,
         ("train_idx", "boolean mask", "np.flatnonzero")),
    Case("lib-erasure-check-train-idx-out-of-range", _lib_check("erasure_check", train_idx=_lib_np.arange(20, 30)), DiagnosticError,
         ("train_idx", "[0, 24)", "got 24", "6 of 10")),
    Case("lib-erasure-check-test-rows-out-of-range", _lib_check("erasure_check", test=_lib_np.array([12, 40])), DiagnosticError,
         ("test_sets['test']", "[0, 24)", "got 40")),
    Case("lib-adversary-check-train-idx-minus-one", _lib_check("adversary_check", train_idx=_lib_np.array([0, 1, -1])), DiagnosticError,
         ("adversary_check", "train_idx", "got -1")),
    Case("lib-gradcam-empty-batch", _lib_saliency("gradcam", (0, 3, 16, 16)), DiagnosticError, ("gradcam", "at least one crop", "(0, 3, 16, 16)")),
    Case("lib-gradcam-one-crop-without-batch-dim", _lib_saliency("gradcam", (3, 16, 16)), _LibInputError, ("(B, 3, H, W)", "(3, 16, 16)", "unsqueeze(0)")),
    Case("lib-head-check-empty-batch", _lib_saliency("randomized_head_check", (0, 3, 16, 16)), DiagnosticError,
         ("randomized_head_check", "at least one crop", "(0, 3, 16, 16)")),
    Case("lib-head-check-one-crop-without-batch-dim", _lib_saliency("randomized_head_check", (3, 16, 16)), _LibInputError, ("(B, 3, H, W)", "(3, 16, 16)")),
    Case("lib-feature-cache-truncated", _lib_corrupt_cache(_LIB_BAD_CACHES["truncated"]), DiagnosticError, ("feature cache file", ".npy", "corrupt", "--no-cache", "delete it")),
    Case("lib-feature-cache-not-npy", _lib_corrupt_cache(_LIB_BAD_CACHES["not-npy"]), DiagnosticError, ("feature cache file", ".npy", "--no-cache")),
    Case("lib-feature-cache-not-features", _lib_int_cache, DiagnosticError, ("feature cache file", "int64", "(4,)", "--no-cache")),
]


@pytest.mark.parametrize("case", LIB_CASES, ids=[c.id for c in LIB_CASES])
def test_bad_input_lib(case: Case, tmp_path) -> None:
    check(case, tmp_path)


def test_lib_gradcam_empty_batch_is_refused_before_targets(tmp_path) -> None:
    """The batch is checked first: bad targets for an empty batch name the batch, not the targets."""
    from probes import gradcam

    with pytest.raises(DiagnosticError, match="at least one crop"):
        gradcam(_saliency_net(), _lib_torch.rand(0, 3, 16, 16), targets=[0, 1])


def test_lib_cli_diagnose_without_a_run_names_list(tmp_path, capsys) -> None:
    line = cli_error(["diagnose"], capsys)
    assert "RUN folder" in line and "--list" in line
# --- issue 20: records, paths and one-line errors ---------------------------------------------
# Ids read from a record become paths only in the tool's own format, paths a record names stay
# inside their folder, a refused pickle is explained without unsafe advice, records of the wrong
# type and a path of the wrong kind give one line.
import json as _json20  # noqa: E402
import os as _os20  # noqa: E402

from shortcutlab.models.adapter import ModelError as _ModelError20  # noqa: E402
from shortcutlab.paths import TASK_ID as _TASK_ID20  # noqa: E402
from shortcutlab.models.runs import RunError as _RunError20  # noqa: E402

_HEX20 = "0123456789abcdef"  # a well-formed task id


def _weights20(path) -> str:
    """A real test_resnet state dict (2 classes) as safetensors, without training."""
    from safetensors.torch import save_file

    from shortcutlab.models.adapter import create_model

    _os20.makedirs(_os20.path.dirname(str(path)), exist_ok=True)
    save_file(create_model("test_resnet", num_classes=2).state_dict(), str(path))
    return str(path)


def _run20(folder, **change) -> str:
    """A valid-looking run folder (run.json + model.safetensors) with run.json entries changed."""
    _weights20(folder / "model.safetensors")
    record = {"config": {"arch": "test_resnet"}, "classes": ["a", "b"], "files": {"weights": "model.safetensors"}}
    for key, value in change.items():
        if key == "arch":
            record["config"]["arch"] = value
        else:
            record[key] = value
    (folder / "run.json").write_text(_json20.dumps(record))
    return str(folder)


def _sweep20(tmp_path, models=None, predictions=None) -> str:
    """A sweep folder: predictions.parquet and, when `models` is given, sweep.json listing them."""
    d = tmp_path / "sweep"
    d.mkdir()
    (predictions if predictions is not None else _predictions()).to_parquet(d / "predictions.parquet", index=False)
    if models is not None:
        (d / "sweep.json").write_text(_json20.dumps({"config": {}, "models": models}))
    return str(d)


def _entry20(**change) -> dict:
    entry = {"model": _HEX20, "condition": "color", "arch": "test_resnet", "seed": 0, "exposure": "leak", "cell": "leak-high",
             "split_id": ""}
    entry.update(change)
    return entry


def _refuse_run_loading20(monkeypatch):
    """From now on, fail the test if anything opens a run folder or builds a model."""
    import shortcutlab.models.adapter
    import shortcutlab.models.runs

    def refuse(*a, **k):
        raise AssertionError(f"a run folder or weights file was opened: {a}")

    for mod, name in ((shortcutlab.models.runs, "load_run"), (shortcutlab.models.runs, "read_record"), (shortcutlab.models.adapter, "create_model")):
        monkeypatch.setattr(mod, name, refuse)


def test_task_id_format_is_the_sweeps_own():
    from shortcutlab.sweep.graph import task_id

    assert _TASK_ID20.pattern.fullmatch(task_id("train", {"a": 1}))
    for bad in ("../../../../outside/evilrun", _HEX20.upper(), _HEX20 + "0", _HEX20[:-1] + "/", ""):
        assert not _TASK_ID20.pattern.fullmatch(bad), bad


def test_report_refuses_a_model_id_that_leaves_the_sweep(tmp_path, capsys, monkeypatch):
    # a run folder outside the sweep that a report would load, were the id turned into a path
    outside = tmp_path / "outside" / "evilrun"
    outside.mkdir(parents=True)
    _run20(outside)
    evil = "../../../outside/evilrun"  # tasks/train/<id> -> tmp_path/outside/evilrun
    d = _sweep20(tmp_path, [_entry20(model=evil)])
    assert _os20.path.isfile(_os20.path.normpath(_os20.path.join(d, "tasks", "train", evil, "run.json")))
    _refuse_run_loading20(monkeypatch)  # the error must come before that folder is opened
    line = cli_error(["report", d, "--n-boot", "10"], capsys)
    for name in ("sweep.json", "models[0]", evil, "task id (16 hex digits)"):
        assert name in line, line
    assert not _os20.path.exists(_os20.path.join(d, "report"))


def _report_folder20(models=None, link=False):
    def call(tmp_path):
        from shortcutlab.report import SweepFolder

        d = _sweep20(tmp_path, models)
        if link:  # a task folder that is a link to a run folder outside the sweep
            outside = tmp_path / "outside"
            outside.mkdir()
            _run20(outside)
            _os20.makedirs(_os20.path.join(d, "tasks", "train"))
            _os20.symlink(outside, _os20.path.join(d, "tasks", "train", _HEX20))
        SweepFolder(d).models()

    return call


def _run_weights_elsewhere20(absolute: bool):
    def call(tmp_path):
        from shortcutlab.models.runs import load_run

        target = _weights20(tmp_path / "outside" / "model.safetensors")
        (tmp_path / "run").mkdir()
        name = target if absolute else "../outside/model.safetensors"
        load_run(_run20(tmp_path / "run", files={"weights": name}))

    return call


def _pickle_checkpoint20(tmp_path) -> str:
    import torch

    from shortcutlab.models.adapter import create_model

    path = tmp_path / "whole_model.pt"
    torch.save(create_model("test_resnet", num_classes=2), path)  # the module object, pickled
    return str(path)


def _create_from20(make):
    def call(tmp_path):
        from shortcutlab.models.adapter import create_model

        create_model("test_resnet", num_classes=2, pretrained=make(tmp_path))

    return call


def _read_record20(**change):
    def call(tmp_path):
        from shortcutlab.models.runs import read_record

        (tmp_path / "run").mkdir()
        read_record(_run20(tmp_path / "run", **change))

    return call


def _folder20(tmp_path) -> str:
    (tmp_path / "afolder").mkdir()
    return str(tmp_path / "afolder")


def _file20(tmp_path) -> str:
    (tmp_path / "afile.csv").write_text("id,path,label,parent\n")
    return str(tmp_path / "afile.csv")


def _crop_is_folder20(tmp_path):
    from shortcutlab.data.images import load_crops

    (tmp_path / "c0.png").mkdir()
    load_crops(CropTable.from_frame(_pd.DataFrame({"id": ["a"], "label": ["x"], "parent": ["p"], "path": [str(tmp_path / "c0.png")]}),
                                    id="id", image="path"))


def _sweep_config_is_folder20(tmp_path):
    from shortcutlab.sweep.config import load_config

    load_config(_folder20(tmp_path))


def _image_folder_is_file20(tmp_path):
    from shortcutlab.data.siblings import images_in_folder

    images_in_folder(_file20(tmp_path))


def _synth_manifest_is_folder20(tmp_path):
    from shortcutlab.synth import load_synth

    (tmp_path / "synth.json").write_text("{}")
    (tmp_path / "manifest.csv").mkdir()
    load_synth(str(tmp_path))


def _sweep_checkpoint_weights_elsewhere20(tmp_path):
    from shortcutlab.sweep.config import validate
    from shortcutlab.sweep.runner import run_sweep

    _weights20(tmp_path / "w.safetensors")
    (tmp_path / "run").mkdir()
    run = _run20(tmp_path / "run", files={"weights": "../w.safetensors"})
    cfg = {"data": {"synthetic": {"mechanisms": ["color"], "fields_per_class": 4, "crop_size": 16}}, "split": {"protocol": "factorial"},
           "seeds": [0], "models": [{"checkpoint": run}], "diagnostics": "none"}
    run_sweep(validate(cfg, base_dir=str(tmp_path)), str(tmp_path / "out"), dry_run=True)


def _report_split_manifest_elsewhere20(tmp_path):
    from shortcutlab.report import SweepFolder

    d = _sweep20(tmp_path, [_entry20(split_id=_HEX20)])
    task = _os20.path.join(d, "tasks", "split", _HEX20)
    _os20.makedirs(task)
    with open(_os20.path.join(task, "result.json"), "w") as f:
        _json20.dump({"result": {"manifest": "../elsewhere/manifest.csv"}}, f)
    SweepFolder(d).models()


def _synth_crop_path_elsewhere20(tmp_path):
    from shortcutlab.synth import load_synth

    out = _synth16(str(tmp_path / "bench"))["out_dir"]
    man = _pd.read_csv(_os20.path.join(out, "manifest.csv"), dtype=str, keep_default_na=False)
    _np.save(tmp_path / "elsewhere.npy", _np.zeros(1))  # a file outside the benchmark folder
    man.loc[1, "path"] = "../elsewhere.npy"
    man.to_csv(_os20.path.join(out, "manifest.csv"), index=False)
    load_synth(out)


RECORD_CASES = [
    # item 2: ids and paths from records
    Case("report-split-id-leaves-the-sweep", _report_folder20([_entry20(split_id="../../../outside")]), ReportError,
         ("sweep.json", "models[0]", "split_id", "'../../../outside'", "16 hex digits")),
    Case("report-model-id-not-a-string", _report_folder20([_entry20(model=7)]), ReportError, ("models[0]", "model id 7", "task id")),
    Case("report-task-folder-links-outside", _report_folder20([_entry20()], link=True), ReportError,
         ("train task", _HEX20, "leaves the folder", "outside")),
    Case("run-weights-path-leaves-the-run", _run_weights_elsewhere20(False), _RunError20,
         ("run.json", "weights file", "'../outside/model.safetensors'", "leaves the folder")),
    Case("run-weights-absolute-path-elsewhere", _run_weights_elsewhere20(True), _RunError20,
         ("run.json", "outside/model.safetensors", "leaves the folder")),
    Case("sweep-checkpoint-weights-leave-the-run", _sweep_checkpoint_weights_elsewhere20, _RunError20,
         ("run.json", "'../w.safetensors'", "leaves the folder")),
    Case("report-split-manifest-leaves-the-sweep", _report_split_manifest_elsewhere20, ReportError,
         ("result.json", "crop manifest", "'../elsewhere/manifest.csv'", "leaves the folder")),
    Case("sweep-split-result-manifest-leaves-the-sweep",
         lambda t: __import__("shortcutlab.sweep.tasks").sweep.tasks._manifest_path(str(t), {"manifest": "../../crops.csv"}),
         ShortcutlabError, ("split result", "crop manifest", "'../../crops.csv'", "leaves the folder")),
    Case("synth-manifest-path-leaves-the-benchmark", _synth_crop_path_elsewhere20, SynthError,
         ("manifest.csv", "row 1 (path)", "'../elsewhere.npy'", "leaves the folder")),
    # item 9: records of the wrong type
    Case("run-json-seed-not-a-number", _read_record20(config={"arch": "test_resnet", "seed": "abc"}), _RunError20,
         ("run.json", "config.seed is 'abc'", "whole number")),
    Case("run-json-arch-not-a-string", _read_record20(arch=5), _RunError20, ("run.json", "config.arch is 5", "timm model name")),
    Case("run-json-files-not-an-object", _read_record20(files="x"), _RunError20, ("run.json", "'files' is 'x'", "JSON object")),
    Case("run-json-classes-empty", _read_record20(classes=[]), _RunError20, ("run.json", "'classes' is []", "non-empty list")),
    Case("sweep-json-seed-not-a-number", _report_folder20([_entry20(seed="abc")]), ReportError,
         ("sweep.json", "models[0]", "seed is 'abc'", "whole number")),
    Case("sweep-json-models-not-entries", _report_folder20([1, 2]), ReportError, ("sweep.json", "models[0] is 1", "model entry")),
    Case("sweep-json-models-not-a-list", _report_folder20({"a": 1}), ReportError, ("sweep.json", "'models'", "a list")),
    # item 10: a path of the wrong kind is not called missing
    Case("weights-file-is-a-folder", _create_from20(_folder20), _ModelError20, ("afolder", "is a folder, expected a file")),
    Case("crop-image-is-a-folder", _crop_is_folder20, TableError, ("c0.png", "id 'a'", "is a folder, expected a file")),
    Case("sweep-config-is-a-folder", _sweep_config_is_folder20, SweepConfigError, ("afolder", "is a folder, expected a file")),
    Case("image-folder-is-a-file", _image_folder_is_file20, __import__("shortcutlab.data.siblings").data.siblings.SiblingError,
         ("afile.csv", "is a file, expected a folder")),
    Case("synth-manifest-is-a-folder", _synth_manifest_is_folder20, SynthError, ("manifest.csv", "is a folder, expected a file")),
    Case("run-folder-is-a-file", lambda t: __import__("shortcutlab.models.runs").models.runs.read_record(_file20(t)), _RunError20,
         ("afile.csv", "is a file, expected a folder")),
]


@pytest.mark.parametrize("case", RECORD_CASES, ids=[c.id for c in RECORD_CASES])
def test_bad_input_records(case: Case, tmp_path) -> None:
    check(case, tmp_path)


def test_pickle_checkpoint_is_refused_without_unsafe_advice(tmp_path, capsys):
    path = _pickle_checkpoint20(tmp_path)
    with pytest.raises(_ModelError20) as info:
        _create_from20(lambda t: path)(tmp_path)
    for message in (str(info.value),
                    cli_error(["diagnose", str(tmp_path), "--arch", "test_resnet", "--weights", path, "--classes", "a,b",
                               "--out", str(tmp_path / "out")], capsys)):
        assert "whole_model.pt" in message and "is not a weights-only checkpoint" in message, message
        assert "safetensors" in message and "\n" not in message
        assert "weights_only=False" not in message and "weights_only` set to `False" not in message, message
    assert not (tmp_path / "out").exists()
    # a file that is no pickle at all is not called a pickle of objects
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(_ModelError20, match="is not a torch state dict file") as info:
        _create_from20(lambda t: str(t / "junk.pt"))(tmp_path)
    assert "weights_only" not in str(info.value)


def _empty20(tmp_path) -> str:
    (tmp_path / "empty.csv").write_bytes(b"")
    return str(tmp_path / "empty.csv")


RECORD_CLI_CASES = [
    ("run-json-arch-not-a-string", lambda t: ["diagnose", _run20(t, arch=5)], ("run.json", "config.arch is 5")),
    ("run-json-files-not-an-object", lambda t: ["diagnose", _run20(t, files="x")], ("run.json", "'files' is 'x'")),
    ("run-weights-leave-the-run", lambda t: ["diagnose", _run20(t, files={"weights": "../w.safetensors"})], ("'../w.safetensors'", "leaves the folder")),
    ("run-folder-is-a-file", lambda t: ["diagnose", _file20(t)], ("afile.csv", "is a file, expected a folder")),
    ("results-dir-is-a-file", lambda t: ["results", _file20(t)], ("afile.csv", "is a file, expected a folder")),
    ("litmus-manifest-is-a-folder", lambda t: ["litmus", _folder20(t), _file20(t), "--out", str(t / "out")], ("crop manifest", "afolder", "is a folder, expected a file")),
    ("litmus-manifest-is-empty", lambda t: ["litmus", _empty20(t), _file20(t), "--out", str(t / "out")],
     ("crop manifest", "empty.csv", "is empty", "header row")),
    ("results-correct-holds-strings",
     lambda t: ["results", _sweep20(t, predictions=_predictions().assign(correct=lambda f: f["correct"].map({True: "yes", False: "no"})))],
     ("predictions.parquet", "'correct'", "'no'", "rows 0, 1", "True/False")),
    ("results-zero-rows", lambda t: ["results", _sweep20(t, predictions=_predictions().iloc[:0])], ("predictions.parquet", "holds no rows")),
    ("report-zero-rows", lambda t: ["report", _sweep20(t, predictions=_predictions().iloc[:0]), "--n-boot", "10"],
     ("predictions", "holds no rows")),
    ("report-sweep-json-seed-not-a-number", lambda t: ["report", _sweep20(t, [_entry20(seed="abc")]), "--n-boot", "10"],
     ("models[0]", "seed is 'abc'")),
    ("report-sweep-json-models-not-entries", lambda t: ["report", _sweep20(t, [1, 2]), "--n-boot", "10"], ("models[0] is 1",)),
]


@pytest.mark.parametrize("argv, names", [(c[1], c[2]) for c in RECORD_CLI_CASES], ids=[c[0] for c in RECORD_CLI_CASES])
def test_cli_records_name_the_culprit(argv, names, tmp_path, capsys) -> None:
    before = set(_os20.listdir(tmp_path))
    args = argv(tmp_path)
    made = set(_os20.listdir(tmp_path)) - before
    line = cli_error(args, capsys)
    for name in names:
        assert name.lower() in line.lower(), line
    assert set(_os20.listdir(tmp_path)) - before == made, "the failed command wrote something"
    if args[0] == "report":
        assert not _os20.path.exists(_os20.path.join(args[1], "report"))


def test_cli_diagnose_on_cuda_without_a_gpu_is_one_line(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run = _run20(tmp_path)
    line = cli_error(["diagnose", run, "--device", "cuda", "--out", str(tmp_path / "out")], capsys)
    assert "device 'cuda' is not available" in line and "available here: cpu" in line, line
    assert not (tmp_path / "out").exists()
# --- issue 20: output ownership and leftovers ------------------------------------------------
# An output folder is new, empty, or one shortcutlab wrote (its marker); anything else is
# refused in one line naming the folder and its first foreign file, and the foreign file is
# left as it was. A killed run's temporaries are removed by the next run on the same --out.
import os as _os  # noqa: E402
import subprocess as _subprocess  # noqa: E402
import sys as _sys  # noqa: E402

from shortcutlab.io import MARKER as _MARKER  # noqa: E402

_SYNTH_SMALL = ["--fields-per-class", "1", "--crop-size", "16", "--field-size", "64"]


def _precious(folder, name="precious.txt", text="the user's own notes"):
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


def _dead_pid() -> int:
    p = _subprocess.Popen([_sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _temp_dir(parent, name, pid, rand="abcd1234", suffix="tmp"):
    d = parent / f".{name}.p{pid}.{rand}.{suffix}"
    d.mkdir()
    (d / "half.png").write_bytes(b"half a crop")
    return d


def test_report_cli_never_deletes_a_foreign_file(tmp_path, capsys):
    d = _report_sweep(tmp_path, predictions_parquet=b"")
    _predictions().to_parquet(_os.path.join(d, "predictions.parquet"), index=False)
    out = tmp_path / "D"
    args = ["report", d, "--out", str(out), "--n-boot", "10", "--no-examples"]
    from shortcutlab.cli import main

    assert main(args) == 0 and main(args) == 0  # a report re-run over its own report
    capsys.readouterr()
    precious = _precious(out)
    line = cli_error(args, capsys)
    assert "D'" in line and "'precious.txt'" in line and "did not write" in line
    assert precious.read_text() == "the user's own notes" and (out / "report.html").is_file()
    # the same for a report folder of an earlier version (no marker): recognised, still refused
    _os.remove(out / _MARKER)
    line = cli_error(args, capsys)
    assert "'precious.txt'" in line and precious.read_text() == "the user's own notes"
    _os.remove(precious)
    assert main(args) == 0 and (out / _MARKER).is_file()  # an earlier report alone is replaced


def test_synth_cli_never_deletes_a_foreign_file(tmp_path, capsys):
    out = tmp_path / "D"
    precious = _precious(out)
    (out / "synth.json").write_text("{}")
    line = cli_error(["synth", *_SYNTH_SMALL, "--out", str(out)], capsys)
    assert line.startswith("shortcutlab synth: error: output folder ") and "D'" in line and "'precious.txt'" in line
    assert sorted(_os.listdir(out)) == ["precious.txt", "synth.json"] and precious.read_text() == "the user's own notes"
    # a synth.json that is not a benchmark's does not make the folder a benchmark's
    _os.remove(precious)
    line = cli_error(["synth", *_SYNTH_SMALL, "--out", str(out)], capsys)
    assert "'synth.json'" in line and (out / "synth.json").read_text() == "{}"


def test_synth_cli_rewrites_its_own_folder_and_an_earlier_versions(tmp_path, capsys):
    from shortcutlab.cli import main

    out = tmp_path / "D"
    assert main(["synth", *_SYNTH_SMALL, "--fields-per-class", "3", "--out", str(out)]) == 0  # more crops than the next
    _os.remove(out / _MARKER)  # as written before markers existed
    assert main(["synth", *_SYNTH_SMALL, "--seed", "1", "--out", str(out)]) == 0
    # the earlier benchmark's crops are all gone: one crop per row of the new manifest
    assert sorted(_os.listdir(out / "crops")) == sorted(f"{i}.png" for i in _pd.read_csv(out / "manifest.csv", dtype=str)["id"])
    assert (out / _MARKER).is_file()
    (out / "crops" / "mine.png").write_bytes(b"not the tool's")  # a foreign file deep inside is found too
    capsys.readouterr()
    line = cli_error(["synth", *_SYNTH_SMALL, "--out", str(out)], capsys)
    assert "'crops/mine.png'" in line and (out / "crops" / "mine.png").read_bytes() == b"not the tool's"


def test_sweep_cli_never_overwrites_a_foreign_file(tmp_path, capsys):
    out = tmp_path / "D"
    _precious(out, "predictions.csv", "my,predictions\n")
    _precious(out, "sweep.json", '{"mine": true}')
    line = cli_error(["sweep", _sweep_config(tmp_path, _SWEEP_YAML), "--out", str(out)], capsys)
    assert line.startswith("shortcutlab sweep: error: output folder ") and "'predictions.csv'" in line
    assert sorted(_os.listdir(out)) == ["predictions.csv", "sweep.json"]  # no marker, no lock, no task
    assert (out / "predictions.csv").read_text() == "my,predictions\n" and (out / "sweep.json").read_text() == '{"mine": true}'


def test_a_sweep_folder_is_marked_before_any_task_and_stays_claimable(tmp_path):
    from shortcutlab.io import read_marker
    from shortcutlab.sweep.folder import claim_sweep_dir

    out = tmp_path / "S"
    claim_sweep_dir(str(out))  # what run_sweep does before the lock and the first task
    assert read_marker(out)["kind"] == "sweep" and _os.listdir(out) == [_MARKER]
    (out / "tasks" / "train" / "abc").mkdir(parents=True)  # a task folder, and a resumed sweep's tables
    (out / "predictions.csv").write_text("x\n")
    claim_sweep_dir(str(out))
    # a sweep folder of an earlier version (no marker) is recognised by its sweep.json
    old = tmp_path / "old"
    old.mkdir()
    (old / "sweep.json").write_text('{"config": {}, "tasks": []}')
    (old / "results.csv").write_text("x\n")
    claim_sweep_dir(str(old))
    assert read_marker(old)["kind"] == "sweep"
    # another tool's folder is refused by kind
    with pytest.raises(OutputError, match="holds a shortcutlab sweep output, not a synth one"):
        from shortcutlab.synth import claim_synth_dir

        claim_synth_dir(str(out))


def _train_into(tmp_path):
    from shortcutlab.models.recipe import TrainConfig, train

    _precious(tmp_path / "run", "run.json", '{"mine": 1}')
    train(str(tmp_path / "missing.csv"), str(tmp_path / "split.csv"), str(tmp_path / "run"), TrainConfig(arch="test_resnet"))


def _demo_into(tmp_path):
    from shortcutlab.studies.demo import DemoConfig, run_demo

    _precious(tmp_path / "demo", "results.csv")
    run_demo(str(tmp_path / "demo"), DemoConfig(progress=False, report=False))


OWNERSHIP_CASES: list[Case] = [
    Case("train-into-a-folder-of-other-files", _train_into, OutputError, ("run'", "'run.json'", "did not write", "new or empty")),
    Case("demo-into-a-folder-of-other-files", _demo_into, OutputError, ("demo'", "'results.csv'", "did not write")),
    Case("output-marker-of-another-schema", lambda t: (_precious(t / "r", _MARKER, '{"schema": "x"}'),
                                                       __import__("shortcutlab.report.build").report.build._check_out(str(t / "r"))),
         OutputError, ("r'", _MARKER, "cannot read")),
]


@pytest.mark.parametrize("case", OWNERSHIP_CASES, ids=[c.id for c in OWNERSHIP_CASES])
def test_bad_input_output_ownership(case: Case, tmp_path) -> None:
    check(case, tmp_path)
    for f in tmp_path.rglob("*"):
        if f.is_file() and f.name != "split.csv":
            assert f.read_text() in ("the user's own notes", '{"mine": 1}', '{"schema": "x"}'), f  # untouched, nothing added


def test_a_killed_runs_temporaries_are_removed_and_a_live_runs_kept(tmp_path, capsys):
    from shortcutlab.cli import main

    dead = _dead_pid()
    live = _subprocess.Popen([_sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = _temp_dir(tmp_path, "D", dead)
        stale_old = _temp_dir(tmp_path, "D", dead, "zz99yy88", "old")
        running = _temp_dir(tmp_path, "D", live.pid)
        other = _temp_dir(tmp_path, "E", dead)  # another output's: not this run's to remove
        assert main(["synth", *_SYNTH_SMALL, "--out", str(tmp_path / "D")]) == 0
        err = capsys.readouterr().err
        assert not stale.exists() and not stale_old.exists() and running.exists() and other.exists()
        assert "removed 2 stale temporaries" in err and stale.name in err
        # a killed file write inside a sweep folder: its staged file is removed, a live one kept
        from shortcutlab.sweep.folder import claim_sweep_dir

        s = tmp_path / "S"
        claim_sweep_dir(str(s))
        (s / f".predictions.csv.p{dead}.abcd1234.tmp").write_text("half")
        (s / f".predictions.csv.p{live.pid}.abcd1234.tmp").write_text("live")
        claim_sweep_dir(str(s))
        assert sorted(_os.listdir(s)) == [f".predictions.csv.p{live.pid}.abcd1234.tmp", _MARKER]
    finally:
        live.kill()
        live.wait()


def test_temporaries_of_an_earlier_version_are_removed_once_an_hour_old(tmp_path, capsys):
    import time

    from shortcutlab.io import LEGACY_TEMP_AGE_S, clean_stale

    old, recent = tmp_path / ".D.a1b2c3d4.tmp", tmp_path / ".D.e5f6g7h8.tmp"
    old.mkdir()
    recent.mkdir()
    t = time.time() - LEGACY_TEMP_AGE_S - 60
    _os.utime(old, (t, t))
    assert clean_stale(str(tmp_path / "D")) == [str(old)]
    assert recent.exists() and "removed 1 stale temporary" in capsys.readouterr().err


@pytest.mark.slow
def test_a_synth_killed_mid_write_leaves_a_temporary_that_the_next_run_removes(tmp_path, capsys):
    import signal
    import time

    from shortcutlab.cli import main

    out = tmp_path / "D"
    env = {**_os.environ, "PYTHONPATH": _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))}
    proc = _subprocess.Popen([_sys.executable, "-m", "shortcutlab", "synth", "--fields-per-class", "60", "--out", str(out)],
                             env=env, stdout=_subprocess.DEVNULL, stderr=_subprocess.DEVNULL)
    temps = []
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        temps = [e for e in _os.listdir(tmp_path) if e.startswith(f".D.p{proc.pid}.")]
        if temps and _os.path.isdir(tmp_path / temps[0] / "crops") and len(_os.listdir(tmp_path / temps[0] / "crops")) > 10:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert temps and (tmp_path / temps[0]).is_dir() and not out.exists(), "the synth finished before it could be killed"
    assert main(["synth", *_SYNTH_SMALL, "--out", str(out)]) == 0
    assert _os.listdir(tmp_path) == ["D"] and "removed 1 stale temporary" in capsys.readouterr().err


def test_a_run_folder_with_its_diagnostics_can_be_trained_again(tmp_path):
    from shortcutlab.io import write_marker
    from shortcutlab.models.recipe import _check_out_dir

    run = tmp_path / "run"
    run.mkdir()
    for f in ("model.safetensors", "logits.csv", "run.json"):
        (run / f).write_text("x")
    write_marker(run, "run", ["model.safetensors", "logits.csv", "run.json"])  # as train leaves it
    (run / "diagnostics.csv").write_text("x")  # then `shortcutlab diagnose RUN`
    _check_out_dir(str(run))
    (run / "my_notes.md").write_text("mine")
    with pytest.raises(OutputError, match="holds 'my_notes.md'"):
        _check_out_dir(str(run))


def test_siblings_cli_never_overwrites_a_foreign_file(tmp_path, capsys):
    out = tmp_path / "sib"
    mine = _precious(out, "siblings.csv", "my own table")
    line = cli_error(["siblings", str(tmp_path / "train"), str(tmp_path / "test"), "--out", str(out)], capsys)
    assert line.startswith("shortcutlab siblings: error: output folder ") and "'siblings.csv'" in line
    assert _os.listdir(out) == ["siblings.csv"] and mine.read_text() == "my own table"


@pytest.mark.parametrize("cmd", ["litmus", "control"])
def test_litmus_and_control_never_overwrite_a_users_table(cmd, tmp_path, capsys):
    out = tmp_path / "shared"
    mine = _precious(out, f"{cmd}.csv", "my own table")
    extra = ["--delete", "labels"] if cmd == "control" else ["--size", "4"]
    line = cli_error([cmd, *_litmus_inputs(tmp_path), *extra, "--out", str(out), "--epochs", "1", "--quiet"], capsys)
    assert f"shared' holds '{cmd}.csv', which shortcutlab did not write there" in line
    assert _os.listdir(out) == [f"{cmd}.csv"] and mine.read_text() == "my own table"


def test_diagnose_never_overwrites_a_users_table(tmp_path, capsys):
    out = tmp_path / "elsewhere"
    mine = _precious(out, "diagnostics.json", '{"mine": 1}')
    run = _bare_run(tmp_path)
    _precious(tmp_path / "run", "model.safetensors", "refused before it is read")
    line = cli_error(["diagnose", run, "--out", str(out)], capsys)
    assert "elsewhere' holds 'diagnostics.json'" in line and mine.read_text() == '{"mine": 1}'


def test_a_shared_out_folder_takes_the_tables_of_several_commands(tmp_path):
    from shortcutlab.io import claim_output_files, read_marker, register_output_files

    out = tmp_path / "results"
    _precious(out, "notes.md")  # the user's, beside the tables: left alone, not refused
    claim_output_files(out, ["litmus.csv", "litmus.json"])
    for f in ("litmus.csv", "litmus.json"):
        (out / f).write_text("x")
    register_output_files(out, ["litmus.csv", "litmus.json"])
    claim_output_files(out, ["litmus.csv", "litmus.json"])  # a re-run replaces its own tables
    claim_output_files(out, ["control.csv", "control.json"])
    assert read_marker(out)["files"] == ["litmus.csv", "litmus.json"] and (out / "notes.md").is_file()
    # tables of an earlier version (no marker) are recognised by their JSON
    old = tmp_path / "old"
    _precious(old, "control.json", '{"rows": []}')
    (old / "control.csv").write_text("x")
    from shortcutlab.cli import _json_of

    claim_output_files(old, ["control.csv", "control.json"], _json_of("control.json"))


# --- issue 20: a damaged synthetic benchmark read back (load_synth) ---------------------------


def _damaged_synth20(tmp_path, damage):
    """A real 16-crop benchmark, damaged by `damage(out_dir)`, then read back."""
    from shortcutlab.synth import load_synth

    out = _synth16(str(tmp_path / "bench"))["out_dir"]
    damage(out)
    load_synth(out)


def _write20(name, text):
    def damage(out):
        with open(_os20.path.join(out, name), "w") as f:
            f.write(text)
    return damage


def _drop_column20(col):
    def damage(out):
        man = _pd.read_csv(_os20.path.join(out, "manifest.csv"), dtype=str, keep_default_na=False)
        man.drop(columns=[col]).to_csv(_os20.path.join(out, "manifest.csv"), index=False)
    return damage


def _crop_not_image20(out):
    man = _pd.read_csv(_os20.path.join(out, "manifest.csv"), dtype=str, keep_default_na=False)
    with open(_os20.path.join(out, man.loc[2, "path"]), "wb") as f:
        f.write(b"not a png")


DAMAGED_SYNTH_CASES = [
    Case("synth-json-not-json", lambda p: _damaged_synth20(p, _write20("synth.json", "{ not json")), SynthError,
         ("synth.json", "not valid JSON")),
    Case("synth-json-a-list", lambda p: _damaged_synth20(p, _write20("synth.json", "[1, 2]")), SynthError,
         ("synth.json", "list", "not a shortcutlab synthetic benchmark")),
    Case("synth-manifest-empty", lambda p: _damaged_synth20(p, _write20("manifest.csv", "")), SynthError,
         ("manifest.csv", "not a readable CSV")),
    Case("synth-manifest-lacks-parent", lambda p: _damaged_synth20(p, _drop_column20("parent")), SynthError,
         ("manifest.csv", "lacks column(s) parent")),
    Case("synth-crop-not-an-image", lambda p: _damaged_synth20(p, _crop_not_image20), SynthError,
         ("manifest.csv", "row 2 (path)", "cannot be read as an image")),
]


@pytest.mark.parametrize("case", DAMAGED_SYNTH_CASES, ids=[c.id for c in DAMAGED_SYNTH_CASES])
def test_bad_input_damaged_synth(case: Case, tmp_path) -> None:
    check(case, tmp_path)
# --- issue 20: studies: silent answers and report escaping ------------------------------------
import warnings as _warnings  # noqa: E402  (imports of this section, kept beside the cases that use them)

from shortcutlab.studies.litmus import LitmusError as _LitmusError  # noqa: E402
from shortcutlab.errors import SplitWarning as _SplitWarning  # noqa: E402


def _studies_crops(labels="xyxyxyxy", masks=None, size=16):
    """8 crops of 8 parents (random pixels), their masks (default: a centred 6 x 6 square each)
    and a parent split: crops 0-5 train, 6-7 test."""
    import torch

    from shortcutlab.data.images import CropImages

    n = len(labels)
    t = CropTable.from_frame(_pd.DataFrame({"id": [f"c{k}" for k in range(n)], "label": list(labels),
                                            "parent": [f"p{k}" for k in range(n)]}), id="id")
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)
    if masks is None:
        masks = torch.zeros(n, 1, size, size, dtype=torch.bool)
        masks[:, :, 5:11, 5:11] = True
    from shortcutlab.data.manifest import SplitManifest

    split = SplitManifest(_pd.DataFrame({"id": t.ids, "split": ["train"] * (n - 2) + ["test"] * 2}))
    return CropImages(images, masks, t), split


def _studies_tiny():
    from shortcutlab.models.recipe import TrainConfig

    return TrainConfig(arch="test_resnet", epochs=1, batch_size=8)


def _control_every_mask_empty(tmp_path):
    import torch

    from shortcutlab.studies.control import deleted_signal_control

    crops, split = _studies_crops(masks=torch.zeros(8, 1, 16, 16, dtype=torch.bool))
    return deleted_signal_control(crops, split, delete="cell", config=_studies_tiny(), mask_name="mask")


STUDIES_CASES: list[Case] = [
    # every mask empty: nothing would be deleted, the control must not report a deletion
    Case("control-every-mask-empty", _control_every_mask_empty, _LitmusError, ("masks (mask)", "empty in all 8 crops", "--delete labels")),
    Case("siblings-negative-pairs-api", lambda t: __import__("shortcutlab.data.siblings").data.siblings.run(
        _sib_folder(t), _sib_folder(t, "b"), str(t / "out"), n_sheet=-3), ShortcutlabError, ("--pairs", "-3", ">= 0")),
    Case("siblings-confirm-out-of-range", lambda t: __import__("shortcutlab.data.siblings").data.siblings.find_siblings(
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
    from shortcutlab.studies.control import ControlWarning, deleted_signal_control

    crops, split = _studies_crops()
    crops.masks[[1, 6]] = False  # one training and one test crop without a cell
    with pytest.warns(ControlWarning, match=r"empty in 2 of the split's 8 crops \(e\.g\. 'c1'\)"):
        res = deleted_signal_control(crops, split, delete="cell", config=_studies_tiny(), mask_name="mask")
    assert res.settings["n_empty_masks"] == 2
    assert any("empty in 2 of" in n for n in res.notes)


def test_one_class_table_warns_and_is_recorded_in_audit_litmus_and_control(tmp_path):
    from shortcutlab.data.audit import audit
    from shortcutlab.data.card import reporting_card
    from shortcutlab.studies.control import ControlWarning, deleted_signal_control
    from shortcutlab.studies.litmus import litmus

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
    from shortcutlab.data.audit import audit
    from shortcutlab.data.manifest import SplitManifest

    crops, _ = _studies_crops()
    split = SplitManifest(_pd.DataFrame({"id": crops.table.ids, "split": ["train"] * 8}))
    with pytest.warns(_SplitWarning, match="has no test crops"):
        r = audit(crops.table, split=split)
    assert "test" not in r["measured"] and r["measured"]["train"]["n_crops"] == 8
    assert r["warnings"] == [w for w in r["warnings"] if "no test crops" in w] and len(r["warnings"]) == 1


def test_siblings_with_train_equal_to_test_warns_and_records_it(tmp_path):
    from shortcutlab.data.siblings import run

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


# --- issue 20: a refused command leaves no folder behind ---------------------------------------


@pytest.mark.parametrize("argv", [
    ["split", "{cric}", "--parent", "nope", "--label", "bethesda_system", "--id", "cell_id", "--protocol", "parent", "--out", "{tmp}/a/b/split.csv"],
    ["audit", "{cric}", "--parent", "nope", "--label", "bethesda_system", "--id", "cell_id", "--json", "{tmp}/j/x.json", "--card", "{tmp}/k/c.md"],
], ids=["split", "audit"])
def test_a_refused_command_creates_no_output_folder(argv, tmp_path, capsys):
    import os as _os

    cric = _os.path.join(_os.path.dirname(__file__), "..", "examples", "data", "cric_classifications.csv")
    line = cli_error([a.format(cric=cric, tmp=tmp_path) for a in argv], capsys)
    assert "'nope'" in line
    assert sorted(_os.listdir(tmp_path)) == []  # the missing output folders were not made


# --- issue 21: interventions declare what they need (targets_for, check_split, label) ---------
import interventions as _interventions  # noqa: E402  (imports of this section)
import torch as _torch  # noqa: E402

from interventions import InterventionError as _InterventionError  # noqa: E402


def _tiny_crops():
    from shortcutlab.studies.demo import _crops_from_synth
    from shortcutlab.synth import SynthConfig as _SynthConfig, synthesize as _synthesize

    return _crops_from_synth(_synthesize(_SynthConfig(fields_per_class=4, crop_size=16, field_size=64, seed=0)))


class _BadTargets(_interventions.Intervention):
    """A plug-in whose targets_for breaks its promise (`result` is what it returns)."""

    label_conditioned = True
    result = None

    @classmethod
    def targets_for(cls, crops, split, seed=0):
        return cls.result(crops) if callable(cls.result) else cls.result

    def apply(self, x, mask, params, **context):
        return x


def _targets_of(result):
    def call(tmp_path):
        import probes

        _BadTargets.result = result
        _interventions.register("toy_bad_targets")(_BadTargets)
        try:
            probes.intervention_targets(_tiny_crops(), None, names=["toy_bad_targets"])
        finally:
            _interventions.unregister("toy_bad_targets")
    return call


def _ask_targets(names):
    def call(tmp_path):
        import probes

        probes.intervention_targets(_tiny_crops(), None, names=names)
    return call


I21_D_CASES = [
    Case("targets-of-an-unknown-intervention", _ask_targets(["reinhard_unseen_feild"]), _InterventionError,
         ("'reinhard_unseen_feild'", "reinhard_unseen_field")),
    Case("targets-for-returns-a-list", _targets_of([1, 2]), _InterventionError,
         ("'toy_bad_targets'", "targets_for must return None or a dict", "got list")),
    Case("targets-for-one-row-short", _targets_of(lambda crops: {"row": _torch.zeros(crops.table.n_crops - 1)}), _InterventionError,
         ("'toy_bad_targets'", "'row'", "one row per crop")),
    Case("targets-for-a-scalar", _targets_of({"level": 0.5}), _InterventionError,
         ("'toy_bad_targets'", "'level'", "shape ()", "one row per crop")),
]


@pytest.mark.parametrize("case", I21_D_CASES, ids=[c.id for c in I21_D_CASES])
def test_bad_input_i21_intervention_needs(case: Case, tmp_path) -> None:
    check(case, tmp_path)
# --- issue 21: A, how a run is loaded and scored ---------------------------------------------
def test_loading_a_run_on_a_device_that_is_not_here_is_one_line(tmp_path, monkeypatch):
    import os

    import torch

    from shortcutlab.errors import ShortcutlabError
    from shortcutlab.models.runs import Run, load_run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run = _run20(tmp_path / "run")
    weights = os.path.join(run, "model.safetensors")
    for load in (lambda: load_run(run, device="cuda:1"), lambda: Run.from_weights("test_resnet", weights, ["a", "b"], device="cuda:1")):
        with pytest.raises(ShortcutlabError) as e:
            load()
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("device 'cuda:1' is not available: torch sees no CUDA GPU") and msg.endswith("available here: cpu")


def test_weights_from_elsewhere_with_other_classes_than_the_data_name_both(tmp_path):
    from shortcutlab.models.runs import Run, RunError

    weights = _weights20(tmp_path / "ext.safetensors")
    with pytest.raises(RunError, match=r"^the model's classes \['a', 'b'\] differ from the data's \['a', 'c'\]$"):
        Run.from_weights("test_resnet", weights, ["a", "b"], order=["a", "c"])
# --- issue 21: training settings declared once (TrainConfig) ---------------------------------


@pytest.mark.parametrize("flags, expected", [
    (["--rrc-scale", "0.5"], ("--rrc-scale takes two comma-separated numbers LOW,HIGH", "'0.5'")),
    (["--rrc-ratio", "x,1"], ("--rrc-ratio takes comma-separated numbers", "'x' is not one")),
    (["--rrc-scale", "0.8,0.4"], ("rrc_scale must satisfy 0 < low <= high <= 1", "(0.8, 0.4)")),
    (["--rrc-ratio", "0,1"], ("rrc_ratio must satisfy 0 < low <= high", "(0.0, 1.0)")),
    (["--rrc-ratio", "1,inf"], ("rrc_ratio must satisfy", "inf")),
    (["--weight-decay", "-0.1"], ("weight_decay must be >= 0", "-0.1")),
    (["--adversary-weight", "nan"], ("adversary_weight must be >= 0", "nan")),
    (["--background-fill", "2"], ("background_fill must lie in [0, 1]", "2.0")),
], ids=["scale-one-number", "ratio-not-a-number", "scale-reversed", "ratio-zero", "ratio-infinite", "weight-decay-negative",
        "adversary-nan", "fill-above-one"])
def test_bad_training_flags_are_one_line_naming_the_value(tmp_path, capsys, flags, expected):
    line = cli_error(["train", "--manifest", str(tmp_path / "m.csv"), "--split", str(tmp_path / "s.csv"),
                      "--out", str(tmp_path / "run"), *flags], capsys)
    assert line.startswith("shortcutlab train: error: ")
    for text in expected:
        assert text in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("key, value, expected", [
    ("rrc_ratio", [0, 1], "rrc_ratio must satisfy 0 < low <= high"),
    ("weight_decay", -1, "weight_decay must be >= 0"),
])
def test_bad_training_settings_in_a_sweep_config_name_their_key(key, value, expected):
    from shortcutlab.sweep.config import SweepConfigError, validate

    raw = {"data": {"synthetic": {"mechanisms": ["color"], "fields_per_class": 8, "crop_size": 16, "field_size": 64}},
           "split": {"protocol": "parent"}, "seeds": [0], "models": [{"arch": "test_resnet", key: value}]}
    with pytest.raises(SweepConfigError) as e:
        validate(raw)
    msg = str(e.value)
    assert f"models[0].{key}" in msg and expected in msg and "\n" not in msg, msg
# --- issue 21: F, registered estimands and diagnostic labels ----------------------------------------

def test_a_second_estimand_cannot_take_a_registered_name():
    from shortcutlab.stats import StatsError, register_estimand

    with pytest.raises(StatsError, match=r"estimand name 'leak' is already registered by shortcutlab\.stats\.estimands\.") as e:
        register_estimand("leak", unit="pp", reading="x")(lambda ctx: None)
    assert "\n" not in str(e.value) and "cannot take it too" in str(e.value)


def test_an_estimand_name_must_be_an_identifier():
    from shortcutlab.stats import StatsError, register_estimand

    with pytest.raises(StatsError, match=r"an estimand name must be a non-empty identifier; got 'leak cut'"):
        register_estimand("leak cut", unit="pp", reading="x")(lambda ctx: None)


def test_an_unknown_estimand_lists_the_close_names():
    from shortcutlab.stats import StatsError, get_estimand

    with pytest.raises(StatsError, match=r"unknown estimand 'leak_cutt'; did you mean 'leak_cut'"):
        get_estimand("leak_cutt")


def test_an_estimand_returning_no_frame_is_named():
    from shortcutlab.stats import StatsError, estimates, register_estimand, simulate_factorial, unregister_estimand

    register_estimand("listed", unit="pp", reading="x")(lambda ctx: [1, 2])
    try:
        with pytest.raises(StatsError, match=r"estimand 'listed' \(.*\) returned list; expected a pandas DataFrame of rows") as e:
            estimates(simulate_factorial(n_seeds=2, n_parents=4, crops_per_parent=1), n_boot=0)
        assert "\n" not in str(e.value)
    finally:
        unregister_estimand("listed")


def test_a_diagnostic_leak_metric_must_be_a_fraction():
    from probes import Diagnostic

    with pytest.raises(TypeError, match=r"Odd\.leak_metrics holds 'spread' with unit 'pixels'; the report reads leak metrics as fractions"):
        class Odd(Diagnostic):
            metric_units = {"spread": "pixels"}
            leak_metrics = ("spread",)

            def run(self, ctx):
                return []
# --- issue 21: executors on the plug-in registry, contract checks (shortcutlab.testing) ---------
from shortcutlab.sweep.executors import ExecutorError as _ExecutorError  # noqa: E402
from shortcutlab.sweep.executors import get_executor as _get_executor  # noqa: E402
from shortcutlab.sweep.executors import register as _register_executor  # noqa: E402


def _executor_without_run(tmp_path):
    _register_executor("idle")(type("Idle", (), {}))


I21_EXECUTOR_CASES = [
    Case("i21-executor-unknown", lambda p: _get_executor("dask"), _ExecutorError, ("unknown executor 'dask'", "available: local, ray")),
    Case("i21-executor-close-match", lambda p: _get_executor("locl"), _ExecutorError, ("'locl'", "did you mean 'local'")),
    Case("i21-executor-option-not-taken", lambda p: _get_executor("local", address="auto"), _ExecutorError, ("'local'", "'address'", "it takes: workers")),
    Case("i21-executor-without-run", _executor_without_run, _ExecutorError, ("'idle'", "lacks run")),
]


@pytest.mark.parametrize("case", I21_EXECUTOR_CASES, ids=[c.id for c in I21_EXECUTOR_CASES])
def test_i21_executor_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)


@pytest.mark.parametrize("argv, expected", [
    (["--executor", "ray", "--workers", "2"], "--workers is for --executor local"),
    (["--executor", "local", "--address", "auto"], "--address is for --executor ray"),
], ids=["workers-for-ray", "address-for-local"])
def test_i21_cli_sweep_executor_options_are_checked_before_any_work(argv, expected, tmp_path, capsys):
    line = cli_error(["sweep", _sweep_config(tmp_path, _SWEEP_YAML), "--out", str(tmp_path / "out"), *argv], capsys)
    assert line.startswith("shortcutlab sweep: error: ") and line.endswith(expected), line
    assert not (tmp_path / "out").exists()  # nothing run, nothing written


# --- issue 21: run and sweep records that are not JSON objects (io.load_json_object) ---
def _record21(tmp_path, text: str, name: str = "run.json"):
    folder = tmp_path / "rec"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text)
    return folder


def _load_run21(tmp_path, text):
    from shortcutlab.models.runs import load_run

    load_run(_record21(tmp_path, text))


def _sweep_meta21(tmp_path, text):
    from shortcutlab.report.folder import SweepFolder

    SweepFolder(str(_record21(tmp_path, text, "sweep.json"))).models()


from shortcutlab.models.runs import RunError as _RunError21  # noqa: E402
from shortcutlab.report.folder import ReportError as _ReportError21  # noqa: E402

I21_RECORD_CASES = [
    Case("i21-run-record-not-json", lambda p: _load_run21(p, "{oops"), _RunError21, ("run record", "run.json", "is not valid JSON")),
    Case("i21-run-record-a-list", lambda p: _load_run21(p, "[1, 2]"), _RunError21,
         ("run record", "run.json", "holds a list", "expected a JSON object written by `shortcutlab train`")),
    Case("i21-sweep-record-not-json", lambda p: _sweep_meta21(p, "{oops"), _ReportError21, ("sweep.json", "is not valid JSON")),
    Case("i21-sweep-record-a-number", lambda p: _sweep_meta21(p, "3"), _ReportError21,
         ("sweep.json", "holds a int", "expected the sweep's record (a JSON object)")),
]


@pytest.mark.parametrize("case", I21_RECORD_CASES, ids=[c.id for c in I21_RECORD_CASES])
def test_i21_records_that_are_not_json_objects(case: Case, tmp_path) -> None:
    check(case, tmp_path)


# --- issue 21: R, diagnostics declare the quantities they supply (Diagnostic.supplies) ---
def _undeclared_quantity21(tmp_path):
    from probes import Diagnostic

    class Recover(Diagnostic):
        supplies = {"recoverabilty": "R"}      # misspelt

        def run(self, ctx):
            return []


def _metric_not_a_string21(tmp_path):
    from probes import Diagnostic

    class Recover(Diagnostic):
        supplies = {"recoverability": 1}

        def run(self, ctx):
            return []


def _suppliers21(quantity):
    import probes

    return lambda tmp_path: probes.suppliers(quantity)


from probes import DiagnosticError as _DiagnosticError21  # noqa: E402

I21_SUPPLIES_CASES = [
    Case("i21-supplies-unknown-quantity", _undeclared_quantity21, TypeError,
         ("Recover.supplies has unknown quantities ['recoverabilty']", "known:", "'recoverability'")),
    Case("i21-supplies-metric-not-a-string", _metric_not_a_string21, TypeError,
         ("Recover.supplies['recoverability']", "must name a metric of its rows", "got 1")),
    Case("i21-suppliers-unknown-quantity", _suppliers21("R"), _DiagnosticError21,
         ("unknown quantity 'R'", "known quantities:", "recoverability, recoverability_after_erasure")),
]


@pytest.mark.parametrize("case", I21_SUPPLIES_CASES, ids=[c.id for c in I21_SUPPLIES_CASES])
def test_i21_diagnostic_supplies_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)


# --- issue 22: P1, `shortcutlab table` (a crop table from a released folder) ---
import os as _os22  # noqa: E402

from shortcutlab.ingest.files import FileTableError as _FileTableError22  # noqa: E402
from shortcutlab.ingest.files import compile_pattern as _compile22  # noqa: E402
from shortcutlab.ingest.files import table_from_files as _table22  # noqa: E402


def _folder22(tmp_path, files=("A/f1_1.png", "A/f1_2.png", "B/f2_1.png")) -> str:
    """A released folder of tiny crops (class folder / field_n.png)."""
    from PIL import Image

    root = tmp_path / "rel"
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(_np.zeros((4, 5, 3), dtype=_np.uint8)).save(root / rel)
    return str(root)


def _labels22(tmp_path, text: str) -> str:
    path = tmp_path / "labels.csv"
    path.write_text(text)
    return str(path)


def _not_an_image22(tmp_path):
    root = _folder22(tmp_path)
    with open(_os22.path.join(root, "A", "f1_3.png"), "w") as f:
        f.write("not a png")
    return _table22(root, "{label}/{parent}_{*}.png")


I22_P1_CASES = [
    Case("i22-table-unclosed-brace", lambda p: _compile22("im_{label/{parent}.bmp"), _FileTableError22,
         ("pattern 'im_{label/{parent}.bmp'", "'{' at character 4", "no closing '}'")),
    Case("i22-table-stray-closing-brace", lambda p: _compile22("im_label}/{parent}.bmp"), _FileTableError22,
         ("'}' at character 9", "no opening '{'")),
    Case("i22-table-field-not-a-name", lambda p: _compile22("{la bel}/{parent}.bmp"), _FileTableError22,
         ("field {la bel}", "character 1", "is not a name")),
    Case("i22-table-touching-fields", lambda p: _compile22("{parent}{id}.bmp"), _FileTableError22,
         ("character 9", "touches the field before it", "literal separator")),
    Case("i22-table-reserved-field", lambda p: _compile22("{parent}/{w}.png"), _FileTableError22,
         ("field {w}", "reserved name")),
    Case("i22-table-no-field", lambda p: _compile22("a/b.png"), _FileTableError22, ("pattern 'a/b.png' has no field",)),
    Case("i22-table-no-parent", lambda p: _table22(_folder22(p), "{label}/{*}.png"), _FileTableError22,
         ("pattern '{label}/{*}.png' has no {parent} field", "no labels CSV", "every crop needs a parent")),
    Case("i22-table-crop-not-in-labels", lambda p: _table22(_folder22(p), "{*}/{parent}_{*}.png",
                                                            labels=_labels22(p, "file,label\nA/f1_1.png,x\nA/f1_2.png,x\n")),
         _FileTableError22, ("crop 'B/f2_1.png' has no row in labels CSV", "labels.csv", "column 'file'")),
    Case("i22-table-empty-label", lambda p: _table22(_folder22(p), "{*}/{parent}_{*}.png",
                                                     labels=_labels22(p, "id,label\nA/f1_1,x\nA/f1_2,\nB/f2_1,y\n")),
         _FileTableError22, ("crop 'A/f1_2.png' has no label", "column 'label' is empty", "labels.csv")),
    Case("i22-table-labels-no-key", lambda p: _table22(_folder22(p), "{*}/{parent}_{*}.png",
                                                       labels=_labels22(p, "name,label\nA/f1_1,x\n")),
         _FileTableError22, ("labels.csv", "neither of the columns 'file' and 'id'", "columns are: name, label")),
    Case("i22-table-labels-duplicate-key", lambda p: _table22(_folder22(p), "{*}/{parent}_{*}.png",
                                                              labels=_labels22(p, "id,label\nA/f1_1,x\nA/f1_1,y\n")),
         _FileTableError22, ("labels.csv", "id 'A/f1_1' appears twice", "data rows 1 and 2")),
    Case("i22-table-labels-column-twice", lambda p: _table22(_folder22(p), "{label}/{parent}_{*}.png",
                                                             labels=_labels22(p, "id,label\nA/f1_1,x\n")),
         _FileTableError22, ("labels.csv", "column 'label' is also given by the pattern")),
    Case("i22-table-duplicate-id", lambda p: _table22(_folder22(p, ("A/f1_1.png", "A/f1_1.bmp")), "{label}/{parent}_{*}.{*}"),
         _FileTableError22, ("files 'A/f1_1.bmp' and 'A/f1_1.png'", "same id 'A/f1_1'", "unique")),
    Case("i22-table-not-an-image", _not_an_image22, _FileTableError22,
         ("file 'A/f1_3.png' matches the pattern", "not an image")),
    Case("i22-table-nothing-matches", lambda p: _table22(_folder22(p), "{label}/{parent}.bmp"), _FileTableError22,
         ("no file under", "matches pattern '{label}/{parent}.bmp'", "3 files seen", "'A/f1_1.png'")),
    Case("i22-table-parent-from-and-parent", lambda p: _table22(_folder22(p), "{label}/{parent}_{*}.png", parent_from=["label"]),
         _FileTableError22, ("has a {parent} field", "parent-from label", "give one of them")),
    Case("i22-table-parent-from-unknown", lambda p: _table22(_folder22(p), "{label}/{f}_{*}.png", parent_from=["label", "field"]),
         _FileTableError22, ("parent-from names 'field'", "not a field of pattern", "its fields are: label, f")),
    Case("i22-table-parent-from-and-labels-parent",
         lambda p: _table22(_folder22(p), "{label}/{f}_{*}.png", parent_from=["label", "f"],
                            labels=_labels22(p, "id,parent\nA/f1_1,x\n")),
         _FileTableError22, ("labels.csv", "column 'parent' is also given by the pattern")),
    Case("i22-table-folder-missing", lambda p: _table22(p / "nowhere", "{label}/{parent}.bmp"), _FileTableError22,
         ("folder", "nowhere", "does not exist")),
]


@pytest.mark.parametrize("case", I22_P1_CASES, ids=[c.id for c in I22_P1_CASES])
def test_i22_table_from_files_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)


@pytest.mark.parametrize("argv, names", [
    (["--pattern", "{label}/{*}.png"], ("shortcutlab table: error:", "no {parent} field")),
    (["--pattern", "{label/{parent}_{*}.png"], ("'{' at character 1", "no closing '}'")),
    (["--pattern", "{label}/{parent}_{*}.png", "--labels", "missing.csv"], ("labels CSV", "missing.csv", "does not exist")),
], ids=["no-parent", "unbalanced", "labels-missing"])
def test_i22_table_cli_errors_leave_no_output(argv, names, tmp_path, capsys) -> None:
    out = tmp_path / "out" / "t.csv"
    line = cli_error(["table", _folder22(tmp_path), *argv, "--out", str(out)], capsys)
    for name in names:
        assert name in line, line
    assert not (tmp_path / "out").exists()


def test_i22_table_cli_refuses_a_json_table_path(tmp_path, capsys) -> None:
    line = cli_error(["table", _folder22(tmp_path), "--pattern", "{label}/{parent}_{*}.png", "--out", str(tmp_path / "t.json")], capsys)
    assert "--out" in line and "t.json" in line and "name the table *.csv" in line
    assert not (tmp_path / "t.json").exists()
# --- issue 22: P3, shortcutlab crops (windows cut from parent images) ---
import numpy as _np22w  # noqa: E402
import pandas as _pd22w  # noqa: E402

from shortcutlab.errors import ShortcutlabError as _ShortcutlabError22w  # noqa: E402
from shortcutlab.errors import TableError as _TableError22w  # noqa: E402
from shortcutlab.ingest.windows import WindowError as _WindowError22w  # noqa: E402


def _study22w(tmp_path, **change) -> str:
    """fields/a.png (40 x 30 px) and t.csv: ids c1, c2 with centres (20, 15), (22, 15)."""
    from PIL import Image

    (tmp_path / "fields").mkdir(exist_ok=True)
    Image.fromarray(_np22w.zeros((30, 40, 3), dtype=_np22w.uint8)).save(tmp_path / "fields" / "a.png")
    cols = {"id": ["c1", "c2"], "label": ["a", "b"], "parent": ["A", "A"], "image": ["fields/a.png"] * 2,
            "cx": ["20", "22"], "cy": ["15", "15"], **change}
    _pd22w.DataFrame({k: v for k, v in cols.items() if v is not None}).to_csv(tmp_path / "t.csv", index=False)
    return str(tmp_path / "t.csv")


def _cut22w(size=10, border="refuse", box=None, **change):
    def call(tmp_path):
        from shortcutlab.ingest.windows import cut_crops

        table = _study22w(tmp_path, **change)
        geometry = {"box": box} if box else {"center": "cx,cy", "size": size}
        return cut_crops(table, "image", str(tmp_path / "out"), border=border, **geometry)

    return call


# --- issue 22: P5, fine-tuning from pretrained weights and --input-size ---
def _imagenet22(tmp_path, arch: str = "test_resnet", edit=None) -> str:
    """A 1000-class random-init state dict of `arch` (one key replaced by `edit`), saved."""
    import torch
    from safetensors.torch import save_file

    from shortcutlab.models.adapter import create_model

    torch.manual_seed(0)
    state = create_model(arch, num_classes=1000).state_dict()
    if edit is not None:
        state = edit(state)
    path = str(tmp_path / f"{arch}_in1k.safetensors")
    save_file({k: v.contiguous() for k, v in state.items()}, path)
    return path


def _wrong_backbone_shape22(state):
    import torch

    return dict(state, **{"conv1.0.weight": torch.zeros(state["conv1.0.weight"].shape[0], 3, 1, 1)})


def _create22(arch, edit=None, **kw):
    def call(tmp_path):
        from shortcutlab.models.adapter import create_model

        create_model(arch, num_classes=4, pretrained=_imagenet22(tmp_path, "test_resnet", edit), **kw)

    return call


def _cut22w_columns(tmp_path):
    from shortcutlab.ingest.windows import cut_crops

    return cut_crops(_study22w(tmp_path), "field_path", str(tmp_path / "out"), center="cx,cy", size=10)


def _not_an_image22w(tmp_path):
    from shortcutlab.ingest.windows import cut_crops

    table = _study22w(tmp_path)
    (tmp_path / "fields" / "a.png").write_text("not a png")
    return cut_crops(table, "image", str(tmp_path / "out"), center="cx,cy", size=10)


I22_WINDOWS_CASES = [
    Case("i22-crops-missing-centre-column", _cut22w(cy=None), _TableError22w,
         ("center column 'cy' is missing", "t.csv", "columns are:")),
    Case("i22-crops-missing-parent-image-column", _cut22w_columns, _TableError22w,
         ("parent image column 'field_path' is missing", "t.csv", "columns are: id, label, parent, image")),
    Case("i22-crops-non-numeric-coordinate", _cut22w(cx=["20", "twelve"]), _TableError22w,
         ("t.csv", "center column 'cx'", "finite numbers", "row 1", "'twelve'")),
    Case("i22-crops-missing-image-file", _cut22w(image=["fields/a.png", "fields/b.png"]), _WindowError22w,
         ("parent image", "fields/b.png", "does not exist", "column 'image'", "crop 'c2'")),
    Case("i22-crops-image-not-decodable", _not_an_image22w, _WindowError22w,
         ("parent image", "a.png", "cannot be read as an image")),
    Case("i22-crops-size-zero", _cut22w(size=0), _ShortcutlabError22w, ("window size", "whole number of pixels > 0", "got 0")),
    Case("i22-crops-size-fraction", _cut22w(size=2.5), _ShortcutlabError22w, ("window size", "whole number", "got 2.5")),
    Case("i22-crops-unknown-border", _cut22w(border="wrap"), _ShortcutlabError22w, ("border must be one of", "reflect", "'wrap'")),
    Case("i22-crops-box-under-a-pixel", _cut22w(box="cx,cy,w,h", w=["5", "0.2"], h=["5", "5"]), _TableError22w,
         ("t.csv", "crop 'c2'", "box of 0.2 x 5 px", "at least 1 pixel")),
    Case("i22-crops-window-past-border", _cut22w(size=36), _WindowError22w,
         ("crop 'c1'", "a.png", "reaches past the 40 x 30 px image", "--border")),
]


@pytest.mark.parametrize("case", I22_WINDOWS_CASES, ids=[c.id for c in I22_WINDOWS_CASES])
def test_i22_crops_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, names", [
    (["--center", "cx,cy", "--size", "0"], ("crops: error:", "window size", "got 0")),
    (["--center", "cx,cy"], ("needs a window size (--size N)",)),
    (["--size", "10"], ("--center X,Y with --size N, or as --box X,Y,W,H",)),
    (["--center", "cx,cy", "--size", "36"], ("crop 'c1'", "reaches past", "--border")),
    (["--center", "cx,cy", "--size", "10", "--parent", "field"], ("parent column 'field' is missing", "t.csv")),
], ids=["size-zero", "centre-without-size", "no-geometry", "border-refused", "missing-parent-column"])
def test_i22_crops_cli_bad_input(argv, names, tmp_path, capsys) -> None:
    table = _study22w(tmp_path)
    line = cli_error(["crops", table, "--parent-image", "image", "--out", str(tmp_path / "out"), *argv], capsys)
    for name in names:
        assert name in line, line
    assert not (tmp_path / "out").exists()
# --- issue 22: masks (shortcutlab masks, shortcutlab.ingest.masks) ---
import os as _os22  # noqa: E402

import numpy as _np22  # noqa: E402

from shortcutlab.ingest.masks import MaskError as _MaskError22, estimate_mask as _estimate_mask22  # noqa: E402

_IMG22 = _np22.full((16, 16, 3), 200, _np22.uint8)

I22_MASK_API_CASES = [
    Case("i22-masks-grey-image", lambda p: _estimate_mask22(_IMG22[..., 0]), _MaskError22,
         ("(H, W, 3) RGB image", "got shape (16, 16)")),
    Case("i22-masks-float-image", lambda p: _estimate_mask22(_IMG22 / 255.0), _MaskError22, ("uint8", "got dtype float64")),
    Case("i22-masks-unknown-method", lambda p: _estimate_mask22(_IMG22, method="otsu2"), _MaskError22,
         ("unknown threshold method 'otsu2'", "multiotsu, otsu, li")),
    Case("i22-masks-unknown-channel", lambda p: _estimate_mask22(_IMG22, channel="eosin"), _MaskError22,
         ("unknown channel 'eosin'", "od, hematoxylin, gray")),
]


@pytest.mark.parametrize("case", I22_MASK_API_CASES, ids=[c.id for c in I22_MASK_API_CASES])
def test_i22_estimate_mask_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)


def _masks_table22(folder, text: str | None = None) -> str:
    """crops/a.png, crops/b.png (a dark disc each) and table.csv (`text`, or a good table)."""
    from PIL import Image

    (folder / "crops").mkdir()
    yy, xx = _np22.mgrid[:24, :24]
    img = _np22.full((24, 24, 3), 220, _np22.uint8)
    img[(yy - 12) ** 2 + (xx - 12) ** 2 < 36] = (90, 70, 140)
    for name in ("a", "b"):
        Image.fromarray(img).save(folder / "crops" / f"{name}.png")
    (folder / "table.csv").write_text(text if text is not None else "id,file\na,crops/a.png\nb,crops/b.png\n")
    return str(folder / "table.csv")


I22_MASK_CLI_CASES = [
    ("missing-table", None, ["--table", "nothere.csv"], ("crop table", "nothere.csv", "does not exist")),
    ("empty-table", "", [], ("crop table", "is empty", "header row")),
    ("header-only", "id,file\n", [], ("crop table", "no rows", "id, file", "one row per crop")),
    ("no-image-column", None, ["--image", "path"], ("has no column 'path' (--image)", "columns are: id, file")),
    ("no-id-column", None, ["--id", "crop"], ("has no column 'crop' (--id)", "columns are: id, file")),
    ("duplicate-ids", "id,file\na,crops/a.png\na,crops/b.png\n", [], ("column 'id'", "must be unique", "rows 0, 1")),
    ("mask-column-there", "id,file,mask\na,crops/a.png,m.png\n", [], ("already has a column 'mask'", "--column")),
    ("quality-column-there", "id,file,degenerate\na,crops/a.png,\n", [], ("already has a column 'degenerate'",)),
    ("no-image-path", "id,file\na,crops/a.png\nb,\n", [], ("column 'file'", "no image path", "row 1", "'b'")),
    ("image-missing", "id,file\na,crops/a.png\nb,crops/c.png\n", [],
     ("row 1", "column 'file'", "(id 'b')", "c.png", "does not exist")),
    ("image-not-an-image", "id,file\na,crops/a.png\nb,table.csv\n", [],
     ("row 1", "column 'file'", "table.csv", "id 'b'", "cannot be read as an image")),
    ("negative-sheet", None, ["--sheet", "-1"], ("contact sheet (--sheet)", "got -1")),
    ("nan-smooth", None, ["--smooth", "nan"], ("--smooth", "finite", "got nan")),
    ("out-is-a-file", None, ["--out", "{tmp}/crops/a.png"], ("--out", "a.png", "is a file")),
]


@pytest.mark.parametrize("name,text,extra,names", I22_MASK_CLI_CASES, ids=[c[0] for c in I22_MASK_CLI_CASES])
def test_i22_cli_masks_bad_input_names_the_culprit(name, text, extra, names, tmp_path, capsys) -> None:
    table = _masks_table22(tmp_path, text)
    extra = [e.replace("{tmp}", str(tmp_path)) for e in extra]
    if "--table" in extra:
        table = str(tmp_path / extra.pop(extra.index("--table") + 1))
        extra.remove("--table")
    before = sorted(p.name for p in tmp_path.iterdir())
    line = cli_error(["masks", table, "--image", "file", "--out", str(tmp_path / "out"), *extra], capsys)
    assert line.startswith("shortcutlab masks: error: ")
    for n in names:
        assert n.lower() in line.lower(), f"{line!r} does not name {n!r}"
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no output folder, no temporary left


def test_i22_cli_masks_leaves_a_foreign_folder_alone(tmp_path, capsys) -> None:
    table = _masks_table22(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    (tmp_path / "out" / "masks.json").write_text("{}")
    line = cli_error(["masks", table, "--image", "file", "--out", str(tmp_path / "out")], capsys)
    assert "masks.json" in line and "did not write" in line
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["masks.json", "notes.txt"]


def test_i22_cli_masks_refuses_the_working_directory_as_out(tmp_path, capsys, monkeypatch) -> None:
    table = _masks_table22(tmp_path)
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path / "out")
    line = cli_error(["masks", table, "--image", "file", "--out", "."], capsys)
    assert "holds the working directory" in line and "choose a subfolder" in line
    assert _os22.listdir(tmp_path / "out") == []
from shortcutlab.errors import ShortcutlabError as _ShortcutlabError22  # noqa: E402
from shortcutlab.models.adapter import ModelError as _ModelError22  # noqa: E402

I22_P5_CASES = [
    Case("i22-p5-backbone-key-wrong-shape", _create22("test_resnet", _wrong_backbone_shape22), _ModelError22,
         ("test_resnet_in1k.safetensors", "conv1.0.weight has shape (16, 3, 1, 1) in the file but (16, 3, 3, 3)", "in the model", "only the classifier is replaced")),
    Case("i22-p5-another-architecture", _create22("test_vit"), _ModelError22,
         ("test_resnet_in1k.safetensors", "'test_vit'", "keys of the model are missing from the file", "another architecture")),
    Case("i22-p5-a-trained-model-keeps-its-head", _create22("test_resnet", new_head=False), _ModelError22,
         ("fc.weight has shape (1000, 96) in the file but (4, 96) in the model",)),
    Case("i22-p5-input-size-zero", lambda p: __import__("shortcutlab.models.train_config", fromlist=["TrainConfig"]).TrainConfig(input_size=0),
         _ShortcutlabError22, ("input_size must be a positive integer", "got 0")),
]


@pytest.mark.parametrize("case", I22_P5_CASES, ids=[c.id for c in I22_P5_CASES])
def test_i22_p5_pretrained_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)


def test_i22_p5_train_with_a_misfitting_file_is_one_line_and_leaves_no_run(tmp_path, capsys):
    import os

    import numpy as np
    import pandas as pd
    from PIL import Image

    from shortcutlab import parent_split
    from shortcutlab.data.images import load_manifest_table

    rows = []
    for i in range(16):
        Image.fromarray(np.full((16, 16, 3), 40 * (i % 2) + 60, np.uint8)).save(tmp_path / f"c{i}.png")
        rows.append({"id": f"c{i}", "path": f"c{i}.png", "label": f"k{i % 2}", "parent": f"f{i // 2}"})
    manifest = str(tmp_path / "manifest.csv")
    pd.DataFrame(rows).to_csv(manifest, index=False)
    parent_split(load_manifest_table(manifest), 0.25, seed=0).to_csv(tmp_path / "split.csv")
    path = _imagenet22(tmp_path, "test_resnet", _wrong_backbone_shape22)
    base = ["train", "--manifest", manifest, "--split", str(tmp_path / "split.csv"), "--out", str(tmp_path / "run"), "--quiet"]
    line = cli_error([*base, "--epochs", "1", "--weights", path], capsys)
    assert line.startswith("shortcutlab train: error: ") and "conv1.0.weight has shape" in line and path in line
    assert not os.path.exists(tmp_path / "run")
    line = cli_error([*base, "--input-size", "-3"], capsys)
    assert "input_size must be a positive integer" in line and "-3" in line
# --- issue 22: P2 locate -----------------------------------------------------------------------
import numpy as _np22  # noqa: E402
from PIL import Image as _Image22  # noqa: E402

from shortcutlab.errors import TableError as _TableError22  # noqa: E402
from shortcutlab.ingest.locate import LocateError as _LocateError22, locate as _locate22  # noqa: E402


def _release22(tmp_path, rows=("crops/c.png",), header="id,path\n"):
    """Two textured 96 x 64 fields, a crop cut from the first, and a table of `rows`."""
    rng = _np22.random.default_rng(0)
    (tmp_path / "fields").mkdir(exist_ok=True)
    (tmp_path / "crops").mkdir(exist_ok=True)
    for name in ("a", "b"):
        f = rng.integers(0, 256, size=(64, 96, 3), dtype=_np22.uint8)
        _Image22.fromarray(f).save(tmp_path / "fields" / f"{name}.png")
        if name == "a":
            _Image22.fromarray(f[10:42, 20:52]).save(tmp_path / "crops" / "c.png")
    _Image22.fromarray(rng.integers(0, 256, size=(32, 32, 3), dtype=_np22.uint8)).save(tmp_path / "crops" / "stray.png")
    (tmp_path / "crops" / "bad.png").write_bytes(b"not a png")
    text = header + "".join(f"k{i},{r}\n" for i, r in enumerate(rows))
    (tmp_path / "t.csv").write_text(text)
    return str(tmp_path / "t.csv"), str(tmp_path / "fields")


def _locate_call22(rows=("crops/c.png",), header="id,path\n", fields=None, **kw):
    def call(tmp_path):
        table, fdir = _release22(tmp_path, rows, header)
        return _locate22(table, fdir if fields is None else str(tmp_path / fields), **kw)
    return call


def _empty_fields22(tmp_path):
    table, _ = _release22(tmp_path)
    (tmp_path / "nofields").mkdir()
    return _locate22(table, str(tmp_path / "nofields"))


I22_LOCATE_CASES = [
    Case("i22-locate-no-image-column", _locate_call22(header="id,file\n"), _LocateError22,
         ("no image column 'path'", "--image", "columns are: id, file")),
    Case("i22-locate-missing-crop", _locate_call22(rows=("crops/c.png", "crops/gone.png")), _LocateError22,
         ("row 1", "id 'k1'", "column 'path'", "'crops/gone.png'", "does not exist")),
    Case("i22-locate-empty-path", _locate_call22(rows=("crops/c.png", " ")), _LocateError22,
         ("row 1", "column 'path'", "empty value", "expected a crop image path")),
    Case("i22-locate-corrupt-crop", _locate_call22(rows=("crops/bad.png",)), _TableError22,
         ("bad.png", "id 'k0'", "cannot be read as an image")),
    Case("i22-locate-fields-missing", _locate_call22(fields="nowhere"), _LocateError22,
         ("--fields folder", "nowhere", "does not exist")),
    Case("i22-locate-fields-empty", _empty_fields22, _LocateError22,
         ("--fields folder", "nofields", "holds no image files")),
    Case("i22-locate-min-score-out-of-range", _locate_call22(min_score=1.5), _LocateError22,
         ("--min-score", "(0, 1]", "got 1.5")),
    Case("i22-locate-no-parent-column", _locate_call22(parent="field"), _LocateError22,
         ("no parent column 'field'", "--parent", "columns are: id, path")),
    Case("i22-locate-unmatched-crop", _locate_call22(rows=("crops/c.png", "crops/stray.png")), _LocateError22,
         ("row 1", "id 'k1'", "column 'path'", "'crops/stray.png'", "matched no field at NCC >= 0.9", "--allow-unmatched")),
]


@pytest.mark.parametrize("case", I22_LOCATE_CASES, ids=[c.id for c in I22_LOCATE_CASES])
def test_i22_locate_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)


def test_i22_locate_cli_unmatched_leaves_no_output(tmp_path, capsys) -> None:
    table, fields = _release22(tmp_path, ("crops/c.png", "crops/stray.png"))
    out = tmp_path / "out" / "located.csv"
    line = cli_error(["locate", table, "--fields", fields, "--out", str(out)], capsys)
    assert line.startswith("shortcutlab locate: error:") and "'crops/stray.png'" in line
    assert not out.exists() and not (tmp_path / "out" / "located.json").exists()


def test_i22_locate_cli_refuses_a_json_out(tmp_path, capsys) -> None:
    table, fields = _release22(tmp_path)
    line = cli_error(["locate", table, "--fields", fields, "--out", str(tmp_path / "t.json")], capsys)
    assert "would be overwritten by its JSON sidecar" in line


# --- issue 23, sensitivity analyses (shortcutlab.stats.sensitivity) -----------------------------------

def _sens23_table(**kw):
    def call(tmp_path):
        from shortcutlab.stats import simulate_factorial
        from shortcutlab.stats.sensitivity import sensitivity_table

        pred = simulate_factorial(n_seeds=2, n_parents=4, crops_per_parent=2, seed=0)
        return sensitivity_table(pred.drop(columns=kw.pop("drop")) if "drop" in kw else pred, mixed_model=False, **kw)
    return call


def _sens23_call(fn, *args, **kw):
    def call(tmp_path):
        from shortcutlab.stats import sensitivity as sens

        return getattr(sens, fn)(*args, **kw)
    return call


def _sens23_error():
    from shortcutlab.stats import StatsError

    return StatsError


SENS23_CASES = [
    Case("sens23-max-exact-too-large", _sens23_table(max_exact=30), _sens23_error(), ("max_exact", "0 to 20", "30")),
    Case("sens23-n-flips-zero", _sens23_table(n_flips=0), _sens23_error(), ("n_flips", ">= 1", "got 0")),
    Case("sens23-max-iter-zero", _sens23_table(max_iter=0), _sens23_error(), ("max_iter", ">= 1", "got 0")),
    Case("sens23-no-parent-column", _sens23_table(drop="parent"), _sens23_error(), ("'parent'", "is missing")),
    Case("sens23-lengths-differ", _sens23_call("weighted_t", [0.1, 0.2, 0.3], [1, 1]), _sens23_error(),
         ("weighted_t", "shape (3,)", "shape (2,)", "one value per seed")),
    Case("sens23-nan-difference", _sens23_call("sign_flip_test", [0.1, float("nan")]), _sens23_error(),
         ("sign_flip_test", "d[1]", "nan", "finite difference")),
    Case("sens23-negative-weight", _sens23_call("weighted_t", [0.1, 0.2], [1, -1]), _sens23_error(),
         ("w[1]", "-1", "weight >= 0")),
]


@pytest.mark.parametrize("case", SENS23_CASES, ids=[c.id for c in SENS23_CASES])
def test_sens23_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)


def test_sens23_one_seed_is_a_warning_and_a_record() -> None:
    from shortcutlab.stats import StatsWarning, simulate_factorial
    from shortcutlab.stats.sensitivity import sensitivity_table

    with pytest.warns(StatsWarning, match="1 seed"):
        table = sensitivity_table(simulate_factorial(n_seeds=1, n_parents=4, seed=0), mixed_model=False)
    assert table["reason"].str.contains("1 seed").all() and table["p_value"].isna().all()
# --- registration and the sweep config's analysis: (issue 23, item 5; slice "registration") ---
from shortcutlab.sweep.registration import RegistrationError as _RegistrationErrorReg  # noqa: E402


def _analysis_reg(text: str):
    return _load_sweep(_SWEEP_YAML + "analysis: " + text + "\n")


def _check_against_reg(content: bytes | None):
    """`check_registration` of the small config against a registration file holding `content`
    (None: no file)."""
    def call(tmp_path):
        from shortcutlab.sweep.config import load_config
        from shortcutlab.sweep.registration import check_registration

        reg = tmp_path / "registration.json"
        if content is not None:
            reg.write_bytes(content)
        check_registration(load_config(_sweep_config(tmp_path, _SWEEP_YAML)), str(reg))

    return call


REG_CASES = [
    Case("reg-analysis-not-a-mapping", _analysis_reg("10000"), SweepConfigError,
         ("sweep.yaml", "analysis", "expected a mapping", "10000")),
    Case("reg-analysis-unknown-key", _analysis_reg("{nboot: 100}"), SweepConfigError,
         ("sweep.yaml", "analysis.nboot", "unknown key", "did you mean 'n_boot'")),
    Case("reg-analysis-negative-n-boot", _analysis_reg("{n_boot: -1}"), SweepConfigError,
         ("sweep.yaml", "analysis.n_boot", "integer >= 0", "-1")),
    Case("reg-analysis-n-boot-a-string", _analysis_reg("{n_boot: many}"), SweepConfigError,
         ("analysis.n_boot", "an integer >= 0", "'many'")),
    Case("reg-analysis-level-out-of-range", _analysis_reg("{level: 95}"), SweepConfigError,
         ("analysis.level", "strictly between 0 and 1", "95")),
    Case("reg-analysis-alpha-zero", _analysis_reg("{alpha: 0}"), SweepConfigError,
         ("analysis.alpha", "strictly between 0 and 1", "0")),
    Case("reg-analysis-interval-not-a-string", _analysis_reg("{interval: 3}"), SweepConfigError,
         ("analysis.interval", "name of an interval method", "3")),
    Case("reg-analysis-family-not-a-list", _analysis_reg("{families: {primary: H1}}"), SweepConfigError,
         ("analysis.families.primary", "list of hypothesis labels", "'H1'")),
    Case("reg-analysis-label-in-two-families", _analysis_reg("{families: {a: [H1, H2], b: [H2]}}"), SweepConfigError,
         ("analysis.families.b[0]", "'H2'", "already in family 'a'")),
    Case("reg-analysis-empty-family", _analysis_reg("{families: {a: []}}"), SweepConfigError,
         ("analysis.families.a", "non-empty list", "[]")),
    Case("reg-analysis-hypotheses-not-a-mapping", _analysis_reg("{hypotheses: [H3]}"), SweepConfigError,
         ("analysis.hypotheses", "a mapping hypothesis label -> selector")),
    Case("reg-analysis-hypothesis-unknown-column", _analysis_reg("{hypotheses: {G1: {estimator: leak}}}"), SweepConfigError,
         ("analysis.hypotheses.G1", "unknown column(s) 'estimator'")),
    Case("reg-analysis-unknown-estimand", _analysis_reg("{estimands: [leak, leek_cut]}"), SweepConfigError,
         ("analysis.estimands[1]", "unknown estimand 'leek_cut'", "did you mean 'leak_cut'")),
    Case("reg-analysis-estimand-twice", _analysis_reg("{estimands: [leak, leak]}"), SweepConfigError,
         ("analysis.estimands", "'leak' is listed twice")),
    Case("reg-registration-missing", _check_against_reg(None), _RegistrationErrorReg,
         ("registration file", "registration.json", "does not exist")),
    Case("reg-registration-not-json", _check_against_reg(b"{not json"), _RegistrationErrorReg,
         ("registration file", "registration.json", "is not JSON", "shortcutlab register")),
    Case("reg-registration-not-an-object", _check_against_reg(b"[1, 2]"), _RegistrationErrorReg,
         ("registration.json", "holds a JSON list, not an object")),
    Case("reg-registration-no-splits", _check_against_reg(b'{"config": {}, "design": {}, "analysis": {}, "code": {}}'),
         _RegistrationErrorReg, ("registration.json", "no 'splits' list", "not written by `shortcutlab register`")),
]


@pytest.mark.parametrize("case", REG_CASES, ids=[c.id for c in REG_CASES])
def test_reg_registration_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)


def test_reg_cli_sweep_with_a_missing_registration_writes_nothing(tmp_path, capsys) -> None:
    config = _sweep_config(tmp_path, _SWEEP_YAML)
    line = cli_error(["sweep", config, "--out", str(tmp_path / "out"), "--registration", str(tmp_path / "nope.json")], capsys)
    assert line.startswith("shortcutlab sweep: error: registration file") and "nope.json" in line
    assert not (tmp_path / "out").exists()


def test_reg_cli_register_a_bad_config_writes_nothing(tmp_path, capsys) -> None:
    config = _sweep_config(tmp_path, _SWEEP_YAML + "analysis: {level: 2}\n")
    line = cli_error(["register", config, "--out", str(tmp_path / "reg.json")], capsys)
    assert line.startswith("shortcutlab register: error:") and "analysis.level" in line
    assert not (tmp_path / "reg.json").exists()
# --- issue 23, the paper's tests (slice "tests"): hypotheses and Holm families in `estimates` ---

def _i23t_estimates(**kw):
    from shortcutlab.stats import estimates, simulate_factorial

    def call(tmp_path):
        import warnings as _w

        with _w.catch_warnings():
            _w.simplefilter("ignore")
            estimates(simulate_factorial(n_seeds=2, n_parents=4, crops_per_parent=1), n_boot=0, **kw)
    return call


def _i23t_cases():
    from shortcutlab.stats import StatsError

    return [
        Case("i23t-unknown-family-labels", _i23t_estimates(families={"primary": ["H1", "H9"], "x": ["Q"]}), StatsError,
             ("families", "unknown hypothesis label(s) 'H9', 'Q'", "known: H1", "F8")),
        Case("i23t-label-in-two-families", _i23t_estimates(families={"a": ["H3"], "b": ["H2", "H3"]}), StatsError,
             ("'H3' is in two families", "'a'", "'b'")),
        Case("i23t-family-not-a-list", _i23t_estimates(families={"study": "H3"}), StatsError,
             ("families.study", "expected a list of hypothesis labels", "'H3'")),
        Case("i23t-families-not-a-mapping", _i23t_estimates(families=["H1"]), StatsError,
             ("families", "expected a mapping", "got list")),
        Case("i23t-selector-unknown-column", _i23t_estimates(hypotheses={"H3": {"estimand": "leak", "seed": 1}}),
             StatsError, ("hypotheses.H3", "unknown column(s) 'seed'", "estimand, condition")),
        Case("i23t-selector-not-a-mapping", _i23t_estimates(hypotheses={"H3": "leak"}), StatsError,
             ("hypotheses.H3", "non-empty mapping of column", "'leak'")),
        Case("i23t-two-labels-one-row", _i23t_estimates(hypotheses={"H3": {"estimand": "leak"}, "F3": {"estimand": "leak"}}),
             StatsError, ("'F3' and 'H3' select the same row", "estimand=leak", "condition=sim")),
    ]


@pytest.mark.parametrize("case", _i23t_cases(), ids=lambda c: c.id)
def test_i23t_hypotheses_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)


# --- power (issue 23, item 4): `shortcutlab power` and shortcutlab.stats.power --------------------
from shortcutlab.stats.power import Design as _DesignPw, LeakComponents as _LeakComponentsPw  # noqa: E402
from shortcutlab.stats.power import PowerError as _PowerErrorPw, parse_params as _parse_params_pw  # noqa: E402
from shortcutlab.stats.power import simulate_power as _simulate_power_pw  # noqa: E402
from shortcutlab.sweep.runner import SweepError as _SweepErrorPw  # noqa: E402


def _pw_pilot(tmp_path, *, conditions=("pilot",), seeds=(0, 1), exposures=("leak", "clean")) -> str:
    """A tiny sweep-shaped folder: predictions.parquet of a factorial (2 archs, 3 parents x 2 crops)."""
    import os

    from shortcutlab.sweep.folder import SweepLayout

    rows = []
    for cond in conditions:
        for s in seeds:
            for a in ("a0", "a1"):
                for e in exposures:
                    for p in range(3):
                        for c in range(2):
                            rows.append(dict(model=f"{cond}-{a}-{e}-{s}", condition=cond, arch=a, seed=s, protocol="factorial",
                                             cell=f"{e}-high", exposure=e, diversity="high", intervention="none",
                                             id=f"p{p}c{c}", parent=f"p{p}", label=0, pred=0, correct=(p + c + s) % 2 == 0,
                                             split_sha256=""))
    folder = tmp_path / "pilot"
    os.makedirs(folder, exist_ok=True)
    _pd.DataFrame(rows).to_parquet(SweepLayout(str(folder)).table("predictions"), index=False)
    return str(folder)


def _pw_cli(*extra, pilot=None):
    """A call of `cmd_power` through the parser (errors raise, as in `main` before it prints them)."""
    def call(tmp_path):
        from shortcutlab.cli import build_parser

        src = ["--pilot", pilot(tmp_path)] if pilot else ["--params", "sd_seed=0.004"]
        argv = ["power", *src, "--seeds", "3", "--archs", "1", "--parents", "4", "--n-sim", "2", "--effects", "0",
                "--out", str(tmp_path / "out"), *extra]
        args = build_parser().parse_args(argv)
        return args.func(args)

    return call


I23PW_CASES = [
    Case("i23pw-params-unknown-name", lambda t: _parse_params_pw("sd_seeds=0.01"), _PowerErrorPw,
         ("'sd_seeds'", "unknown", "sd_seed, sd_parent")),
    Case("i23pw-params-no-equals", lambda t: _parse_params_pw("sd_seed"), _PowerErrorPw, ("'sd_seed'", "name=value")),
    Case("i23pw-params-not-a-number", lambda t: _parse_params_pw("sd_crop=big"), _PowerErrorPw,
         ("sd_crop", "'big'", "not a number")),
    Case("i23pw-params-twice", lambda t: _parse_params_pw("sd_seed=0.1,sd_seed=0.2"), _PowerErrorPw, ("'sd_seed'", "twice")),
    Case("i23pw-params-negative-sd", lambda t: _parse_params_pw("sd_parent=-0.01"), _PowerErrorPw,
         ("'sd_parent'", ">= 0", "-0.01")),
    Case("i23pw-params-baseline-out-of-range", lambda t: _parse_params_pw("baseline=85"), _PowerErrorPw,
         ("'baseline'", "(0, 1)", "85")),
    Case("i23pw-params-crop-sd-above-one", lambda t: _LeakComponentsPw(sd_crop=1.5), _PowerErrorPw, ("'sd_crop'", "at most 1")),
    Case("i23pw-design-one-seed", lambda t: _DesignPw(1, 4, 50, 3), _PowerErrorPw, ("n_seeds", ">= 2", "got 1")),
    Case("i23pw-design-pool-below-parents", lambda t: _DesignPw(3, 1, 50, 3, 20), _PowerErrorPw, ("n_pool", ">= 50", "20")),
    Case("i23pw-cli-pool-below-parents", _pw_cli("--pool", "3"), ShortcutlabError, ("--pool", "--parents 4", "got 3")),
    Case("i23pw-effect-in-pp", lambda t: _simulate_power_pw(_LeakComponentsPw(), [_DesignPw(3, 1, 4, 1)], [0.0, 1.5]),
         _PowerErrorPw, ("effect 1.5", "(-1, 1)", "0.8 pp")),
    Case("i23pw-unknown-test", lambda t: _simulate_power_pw(_LeakComponentsPw(), [_DesignPw(3, 1, 4, 1)], [0.0], test="z"),
         _PowerErrorPw, ("'z'", "t, bootstrap")),
    Case("i23pw-bootstrap-too-few-resamples",
         lambda t: _simulate_power_pw(_LeakComponentsPw(), [_DesignPw(3, 1, 4, 1)], [0.0], test="bootstrap", n_boot=5),
         _PowerErrorPw, ("n_boot", ">= 19", "5")),
    Case("i23pw-cli-seeds-below-two", _pw_cli("--seeds", "1,5"), ShortcutlabError, ("--seeds", ">= 2", "got 1", "'1,5'")),
    Case("i23pw-cli-effects-not-numbers", _pw_cli("--effects", "0,0.5pp"), ShortcutlabError, ("--effects", "'0.5pp'")),
    Case("i23pw-cli-effect-in-pp", _pw_cli("--effects", "0,8"), ShortcutlabError, ("--effects", "(-1, 1)", "8.0")),
    Case("i23pw-cli-n-sim-zero", _pw_cli("--n-sim", "0"), ShortcutlabError, ("--n-sim", ">= 1", "got 0")),
    Case("i23pw-cli-alpha", _pw_cli("--alpha", "5"), ShortcutlabError, ("--alpha", "(0, 1)", "5")),
    Case("i23pw-pilot-missing", _pw_cli(pilot=lambda t: str(t / "nowhere")), _SweepErrorPw, ("nowhere",)),
    Case("i23pw-pilot-no-factorial", _pw_cli(pilot=lambda t: _pw_pilot(t, exposures=("",))), _PowerErrorPw,
         ("pilot", "no factorial prediction", "'leak' or 'clean'")),
    Case("i23pw-pilot-two-conditions", _pw_cli(pilot=lambda t: _pw_pilot(t, conditions=("A", "B"))), _PowerErrorPw,
         ("2 factorial conditions", "A, B", "--condition")),
    Case("i23pw-pilot-unknown-condition", _pw_cli("--condition", "C", pilot=lambda t: _pw_pilot(t)), _PowerErrorPw,
         ("no factorial condition 'C'", "pilot")),
    Case("i23pw-pilot-one-seed", _pw_cli(pilot=lambda t: _pw_pilot(t, seeds=(0,))), _PowerErrorPw,
         ("diversity 'high'", "1 seed(s)", "at least 2")),
]


@pytest.mark.parametrize("case", I23PW_CASES, ids=[c.id for c in I23PW_CASES])
def test_i23pw_power_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)


def test_i23pw_cli_power_refuses_a_foreign_out_folder(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    line = cli_error(["power", "--params", "sd_seed=0.004", "--seeds", "3", "--archs", "1", "--parents", "4",
                      "--n-sim", "2", "--effects", "0", "--out", str(out)], capsys)
    assert line.startswith("shortcutlab power: error:") and "notes.txt" in line
    assert (out / "notes.txt").read_text() == "mine" and not (out / "power.csv").exists()


def test_i23pw_cli_power_unknown_param_is_one_line(tmp_path, capsys) -> None:
    line = cli_error(["power", "--params", "sd_sead=0.004", "--out", str(tmp_path / "o")], capsys)
    assert "'sd_sead'" in line and not (tmp_path / "o").exists()
# ------------------------------------------------------------------------------ issue 23 probes: reused probes of adversary_check
def _i23p_data():
    import numpy as _np23p

    rng = _np23p.random.default_rng(0)
    parents = _np23p.repeat(_np23p.arange(8), 4)
    labels = parents % 2
    X = rng.normal(size=(32, 4)) + 2.0 * rng.normal(size=(8, 4))[parents]
    return X, labels, parents, _np23p.arange(0, 32, 2), _np23p.arange(1, 32, 2)


def _i23p_check(**reuse):
    def call(tmp_path):
        from probes import LinearAdversary, ParentProbe, adversary_check

        X, labels, parents, tr, te = _i23p_data()
        got = {k: (ParentProbe(n_folds=2, Cs=1.0).fit(X[:24], labels[:24], parents[:24]) if v == "other rows" else v)
               for k, v in reuse.items()}
        return adversary_check(X, labels, parents, train_idx=tr, test_sets={"test": te}, probe=ParentProbe(n_folds=2, Cs=1.0),
                               adversary=LinearAdversary(weight=1.0, steps=2), cross_fit=False, **got)
    return call


I23P_CASES = [
    Case("i23p-adversary-probe-baseline-other-rows", _i23p_check(probe_baseline="other rows"), DiagnosticError,
         ("adversary_check", "probe_baseline", "fitted on 24 rows", "measures R on 16 rows", "same rows")),
    Case("i23p-adversary-probe-before-not-a-probe", _i23p_check(probe_before=0.4), DiagnosticError,
         ("adversary_check", "probe_before", "fitted ParentProbe", "float")),
]


@pytest.mark.parametrize("case", I23P_CASES, ids=[c.id for c in I23P_CASES])
def test_i23p_probes_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)


# --- I23-INTERVALS (issue 23, item 1: the interval method of the estimates) -----------------------


def _i23iv_call(fn_name: str, **kw):
    def call(tmp_path):
        import shortcutlab.stats as st

        getattr(st, fn_name)(_predictions(), n_boot=10, interval="wild", **kw)

    return call


I23IV_CASES = [
    Case(f"i23iv-{name}-unknown-interval", _i23iv_call(name), StatsError,
         ("interval method", "'wild'", "expected one of", "cgm", "pigeonhole"))
    for name in ("leak_effect", "intervention_effect", "protocol_effect", "estimates")
]


@pytest.mark.parametrize("case", I23IV_CASES, ids=[c.id for c in I23IV_CASES])
def test_i23iv_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)


def test_i23iv_cli_results_refuses_an_unknown_interval(tmp_path, capsys) -> None:
    from shortcutlab.cli import main

    with pytest.raises(SystemExit) as info:
        main(["results", str(tmp_path), "--interval", "wild"])
    assert info.value.code == 2
    assert "invalid choice: 'wild'" in capsys.readouterr().err


# --- I24-SALIENCY (issue 24, item 4: constant maps, the demo's model) ----------------------------


def _i24s_constant_maps(maps):
    def call(tmp_path):
        from probes.saliency import constant_maps

        constant_maps(maps)

    return call


def _i24s_cam_cnn_fine_tune_mismatch(tmp_path):
    """A file from another variant (a 2-channel input) into cam_cnn with a new head."""
    from safetensors.torch import save_file

    from shortcutlab.models.adapter import create_model

    state = create_model("cam_cnn", num_classes=3, in_chans=2).state_dict()
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "w.safetensors"))
    create_model("cam_cnn", num_classes=4, pretrained=tmp_path / "w.safetensors")


I24S_CASES = [
    Case("i24s-constant-maps-1d", _i24s_constant_maps(torch.zeros(4)), DiagnosticError, ("maps", "(B, H, W)", "(4,)")),
    Case("i24s-constant-maps-not-a-tensor", _i24s_constant_maps([[0.0]]), DiagnosticError, ("maps", "(B, H, W)", "list")),
    Case("i24s-cam-cnn-other-variant", _i24s_cam_cnn_fine_tune_mismatch, ShortcutlabError,
         ("w.safetensors", "cam_cnn", "stages.0.conv.weight", "another architecture or variant")),
]


@pytest.mark.parametrize("case", I24S_CASES, ids=[c.id for c in I24S_CASES])
def test_i24s_saliency_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)
# --- I24-QUIET (issue 24, item 6: torch threads of sweeps and the demo) -------------------------


@pytest.mark.parametrize("value", ["0", "-3"])
def test_i24q_sweep_threads_must_be_a_positive_integer(tmp_path, capsys, value) -> None:
    out = tmp_path / "o"
    line = cli_error(["sweep", _sweep_config(tmp_path, _SWEEP_YAML), "--out", str(out), "--threads", value], capsys)
    assert line == f"shortcutlab sweep: error: --threads takes the number of torch threads, a positive integer; got {value}"
    assert not out.exists()  # refused before anything is written


def test_i24q_demo_threads_must_be_a_positive_integer(tmp_path, capsys) -> None:
    out = tmp_path / "demo"
    line = cli_error(["demo", "--quick", "--out", str(out), "--threads", "0"], capsys)
    assert line == "shortcutlab demo: error: --threads takes the number of torch threads, a positive integer; got 0"
    assert not out.exists()


def test_i24q_sweep_config_threads_must_be_an_integer(tmp_path) -> None:
    from shortcutlab.sweep.config import SweepConfigError, load_config

    check(Case("i24q-config-threads-float", lambda p: load_config(_sweep_config(p, _SWEEP_YAML + "threads: 2.5\n")),
               SweepConfigError, ("threads", "positive integer", "2.5")), tmp_path)
# --- I25-GRADCAM (issue 25, item 4: the timed choice of Grad-CAM's forward pass) -------------------


def test_i25g_forward_choice_needs_an_adapter_and_a_batch() -> None:
    import torch

    from probes.saliency import forward_choice
    from shortcutlab.models.adapter import create_model, wrap

    with pytest.raises(DiagnosticError, match="needs a shortcutlab ModelAdapter.*got Linear"):
        forward_choice(torch.nn.Linear(2, 2), torch.rand(1, 3, 8, 8))
    adapter = wrap(create_model("test_resnet", num_classes=3)).eval()
    with pytest.raises(DiagnosticError, match=r"forward_choice needs at least one crop; got a batch of shape \(0, 3, 32, 32\)"):
        forward_choice(adapter, torch.rand(0, 3, 32, 32))
# --- I25-LOADING (issue 25, item 1: tables read through Arrow, Parquet tables) ------------------


def _i25_parquet(p, df, name="t.parquet"):
    path = p / name
    df.to_parquet(path, index=False)
    return path


I25L_CASES = [
    Case("i25l-parquet-missing", lambda p: CropTable.from_parquet(p / "none.parquet", id="id"),
         TableError, ("none.parquet", "does not exist")),
    Case("i25l-parquet-not-parquet", lambda p: (p.joinpath("t.parquet").write_text("id,label,parent\n1,a,p\n"),
                                                CropTable.from_parquet(p / "t.parquet", id="id")),
         TableError, ("t.parquet", "not a readable Parquet file")),
    Case("i25l-parquet-null-label",
         lambda p: CropTable.from_parquet(_i25_parquet(p, _pd.DataFrame({"id": ["a", "b"], "label": ["x", None], "parent": "p"})), id="id"),
         TableError, ("'label'", "row 1", "'b'")),
    Case("i25l-parquet-duplicate-id",
         lambda p: CropTable.from_parquet(_i25_parquet(p, _pd.DataFrame({"id": ["a", "b", " a"], "label": "x", "parent": "p"})), id="id"),
         TableError, ("unique", "'a'", "rows 0, 2")),
    Case("i25l-parquet-missing-column",
         lambda p: CropTable.from_parquet(_i25_parquet(p, _pd.DataFrame({"id": ["a"], "label": "x", "parent": "p"})), id="id", group="pt"),
         TableError, ("group column 'pt'", "t.parquet", "id, label, parent")),
    Case("i25l-parquet-bad-box",
         lambda p: CropTable.from_parquet(_i25_parquet(p, _pd.DataFrame({"id": ["a", "b"], "label": "x", "parent": "p", "x": [0.0, float("nan")],
                                                                          "y": 0.0, "w": 5.0, "h": 5.0})), id="id", box="x,y,w,h"),
         TableError, ("'x'", "row 1")),
]


@pytest.mark.parametrize("case", I25L_CASES, ids=[c.id for c in I25L_CASES])
def test_i25l_loading_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)


def test_i25l_audit_of_a_bad_parquet_table_is_one_cli_line(tmp_path, capsys) -> None:
    path = _i25_parquet(tmp_path, _pd.DataFrame({"id": ["a", "b"], "label": ["x", ""], "parent": "p"}))
    line = cli_error(["audit", str(path), "--id", "id", "--label", "label", "--parent", "parent", "--test-fraction", "0.2"], capsys)
    assert line.startswith("shortcutlab audit: error: ") and "column 'label' is empty or NaN in row 1 (id 'b')" in line


# --- issue 25: the duckdb engine (out-of-core audit and split) -------------------------------
from shortcutlab.data.engines import EngineError as _EngineError  # noqa: E402
from shortcutlab.data.engines import TableSource as _TableSource  # noqa: E402
from shortcutlab.data.engines import get_engine as _get_engine  # noqa: E402


def _manifest_verify(path, expected):
    from shortcutlab.data.manifest import verify

    return verify(path, expected)


def _i25d_audit(path, **cols):
    pytest.importorskip("duckdb")
    return _get_engine("duckdb", threads=1).audit(_TableSource(str(path), **cols))


_I25D_ONE = _pd.DataFrame({"id": ["a"], "label": ["x"], "parent": ["p"]})

I25D_CASES = [
    Case("i25d-missing-column", lambda p: _i25d_audit(_i25_parquet(p, _I25D_ONE), id="id", group="pt"),
         TableError, ("group column 'pt'", "t.parquet", "id, label, parent")),
    Case("i25d-duplicate-id",
         lambda p: _i25d_audit(_i25_parquet(p, _pd.DataFrame({"id": ["a", "b", " a"], "label": "x", "parent": "p"})), id="id"),
         TableError, ("unique", "'a'", "row 0", "row 2")),
    Case("i25d-split-duplicate-id",  # the split finds it in its id-ordered hash stream, and writes nothing
         lambda p: _get_engine("duckdb", batch_rows=1).split(
             _TableSource(str(_i25_parquet(p, _pd.DataFrame({"id": ["a", "b", "c", " a"], "label": "x", "parent": ["p", "q", "r", "s"]}))),
                          id="id"), str(p / "m")),
         TableError, ("unique", "'a'", "2 times", "row 0", "row 3")),
    Case("i25d-box-not-numeric",
         lambda p: _i25d_audit(_i25_parquet(p, _pd.DataFrame({"id": ["a", "b"], "label": "x", "parent": "p", "x": ["1", "oops"],
                                                               "y": 0.0, "w": 5.0, "h": 5.0})), id="id", box="x,y,w,h"),
         TableError, ("'x'", "finite numbers", "row 1", "'b'", "'oops'")),
    Case("i25d-box-size-zero",
         lambda p: _i25d_audit(_i25_parquet(p, _pd.DataFrame({"id": ["a", "b"], "label": "x", "parent": "p", "x": 1.0, "y": 0.0,
                                                               "w": [5.0, 0.0], "h": 5.0})), id="id", box="x,y,w,h"),
         TableError, ("positive", "'w'", "row 1", "'b'")),
    Case("i25d-empty-parent",
         lambda p: _i25d_audit(_i25_parquet(p, _pd.DataFrame({"id": ["a", "b", "c"], "label": "x", "parent": ["p", "  ", None]})), id="id"),
         TableError, ("'parent'", "empty", "t.parquet row 1", "'b'", "2 row(s)")),
    Case("i25d-empty-parent-csv",
         lambda p: (p.joinpath("t.csv").write_text("id,label,parent\na,x,p\nb,x,\n"), _i25d_audit(p / "t.csv", id="id")),
         TableError, ("'parent'", "empty", "t.csv", "'b'")),
    Case("i25d-no-id", lambda p: _i25d_audit(_i25_parquet(p, _I25D_ONE)), TableError, ("needs --id", "t.parquet")),
    Case("i25d-parent-in-two-groups",
         lambda p: _i25d_audit(_i25_parquet(p, _pd.DataFrame({"id": ["a", "b"], "label": "x", "parent": "p", "pt": ["g1", "g2"]})),
                               id="id", group="pt"),
         TableError, ("parent 'p'", "2 different groups")),
    Case("i25d-folder-without-parquet", lambda p: (p.joinpath("d").mkdir(), _i25d_audit(p / "d", id="id")),
         TableError, ("/d'", "no .parquet files")),
    Case("i25d-not-parquet", lambda p: (p.joinpath("t.parquet").write_text("id\n1\n"), _i25d_audit(p / "t.parquet", id="id")),
         TableError, ("t.parquet", "not a readable Parquet file")),
    Case("i25d-crop-protocol",
         lambda p: _get_engine("duckdb").split(_TableSource(str(_i25_parquet(p, _I25D_ONE)), id="id"), str(p / "m"), protocol="crop"),
         _EngineError, ("duckdb engine runs the parent", "'crop'", "--engine memory")),
    Case("i25d-memory-limit", lambda p: _get_engine("duckdb", memory_limit="lots").audit(_TableSource(str(_i25_parquet(p, _I25D_ONE)), id="id")),
         _EngineError, ("memory limit 'lots'", "2GB")),
    Case("i25d-unknown-engine", lambda p: _get_engine("duckbd"), _EngineError, ("unknown engine 'duckbd'", "did you mean 'duckdb'")),
    Case("i25d-manifest-folder-repeats-an-id",
         lambda p: (p.joinpath("m", "split=train").mkdir(parents=True), p.joinpath("m", "split=test").mkdir(),
                    _pd.DataFrame({"id": ["a", "b"]}).to_parquet(p / "m" / "split=train" / "0.parquet"),
                    _pd.DataFrame({"id": ["b"]}).to_parquet(p / "m" / "split=test" / "0.parquet"),
                    _manifest_verify(p / "m", "0" * 64)),
         SplitError, ("/m", "assigns a crop twice", "'b'")),
]


@pytest.mark.parametrize("case", I25D_CASES, ids=[c.id for c in I25D_CASES])
def test_i25d_duckdb_engine_bad_input(case: Case, tmp_path) -> None:
    check(case, tmp_path)


def test_i25d_cli_engine_errors_are_one_line(tmp_path, capsys) -> None:
    pytest.importorskip("duckdb")
    path = _i25_parquet(tmp_path, _pd.DataFrame({"id": ["a", "b"], "label": "x", "parent": ["p", "q"]}))
    table = [str(path), "--id", "id", "--label", "label", "--parent", "parent"]
    line = cli_error(["split", *table, "--protocol", "parent", "--out", str(tmp_path / "m.csv"), "--engine", "duckdb"], capsys)
    assert "manifest folder" in line and "m.csv" in line
    line = cli_error(["audit", *table, "--engine", "duckdb", "--split", str(tmp_path / "m.csv")], capsys)
    assert "--split needs the table in memory" in line
    line = cli_error(["split", *table, "--protocol", "parent", "--out", str(tmp_path / "m"), "--engine", "memory", "--threads", "2"], capsys)
    assert "engine 'memory' takes no parameter 'threads'" in line
    line = cli_error(["audit", *table, "--engine", "duckdb", "--image", "id"], capsys)
    assert "--image is not used by --engine duckdb" in line
# --- issue 25: the ray engine (audit and split on a Ray cluster) -------------------------------


def _i25r_engine(**options):
    return _get_engine("ray", **options)


I25R_CASES = [
    Case("i25r-missing-column", lambda p: _i25r_engine().audit(_TableSource(str(_i25_parquet(p, _I25D_ONE)), id="id", group="pt")),
         TableError, ("group column 'pt'", "t.parquet", "id, label, parent")),
    Case("i25r-missing-file", lambda p: _i25r_engine().audit(_TableSource(str(p / "none.parquet"), id="id")),
         TableError, ("none.parquet", "does not exist")),
    Case("i25r-glob-matches-nothing", lambda p: _i25r_engine().audit(_TableSource(str(p / "*.parquet"), id="id")),
         TableError, ("*.parquet", "matches no file")),
    Case("i25r-csv", lambda p: (p.joinpath("t.csv").write_text("id,label,parent\na,x,p\n"), _i25r_engine().audit(_TableSource(str(p / "t.csv")))),
         TableError, ("t.csv", "reads Parquet", "not a .parquet file")),
    Case("i25r-not-parquet", lambda p: (p.joinpath("t.parquet").write_text("id\n1\n"), _i25r_engine().audit(_TableSource(str(p / "t.parquet")))),
         TableError, ("t.parquet", "not a readable Parquet")),
    Case("i25r-split-without-id", lambda p: _i25r_engine().split(_TableSource(str(_i25_parquet(p, _I25D_ONE))), str(p / "m")),
         TableError, ("split needs an id column", "--id")),
    Case("i25r-split-test-fraction",
         lambda p: _i25r_engine().split(_TableSource(str(_i25_parquet(p, _I25D_ONE)), id="id"), str(p / "m"), test_fraction=1.5),
         SplitError, ("test fraction", "1.5")),
    Case("i25r-crop-protocol",
         lambda p: _i25r_engine().split(_TableSource(str(_i25_parquet(p, _I25D_ONE)), id="id"), str(p / "m"), protocol="crop"),
         _EngineError, ("ray engine runs the parent", "'crop'", "--engine memory")),
    Case("i25r-threads", lambda p: _i25r_engine(threads=0), _EngineError, ("threads", "positive integer", "0")),
    Case("i25r-threads-on-a-cluster", lambda p: _i25r_engine(address="auto", threads=2), _EngineError, ("local Ray only", "'auto'")),
]


@pytest.mark.parametrize("case", I25R_CASES, ids=[c.id for c in I25R_CASES])
def test_i25r_ray_engine_bad_input(case: Case, tmp_path) -> None:
    """Every check here runs before Ray is started (no cluster needed)."""
    check(case, tmp_path)


def test_i25r_cli_ray_options_are_one_line(tmp_path, capsys) -> None:
    path = _i25_parquet(tmp_path, _pd.DataFrame({"id": ["a", "b"], "label": "x", "parent": ["p", "q"]}))
    table = [str(path), "--id", "id", "--label", "label", "--parent", "parent"]
    line = cli_error(["audit", *table, "--engine", "ray", "--memory-limit", "2GB"], capsys)
    assert "engine 'ray' takes no parameter 'memory_limit'" in line
    line = cli_error(["audit", *table, "--engine", "ray", "--ray-address", "auto", "--threads", "2"], capsys)
    assert "threads applies to a local Ray only" in line
    line = cli_error(["split", *table, "--protocol", "parent", "--out", str(tmp_path / "m"), "--engine", "duckdb",
                      "--ray-address", "auto"], capsys)
    assert "engine 'duckdb' takes no parameter 'address'" in line


@pytest.mark.slow
def test_i25r_ray_refuses_a_repeated_id_and_an_empty_label_in_one_cli_line(tmp_path, capsys) -> None:
    """Starts a local Ray per command (about 10 s each on 2 cores)."""
    pytest.importorskip("ray.data")
    path = _i25_parquet(tmp_path, _pd.DataFrame({"id": ["a", "b", " a"], "label": "x", "parent": ["p", "q", "r"]}))
    table = [str(path), "--id", "id", "--label", "label", "--parent", "parent", "--engine", "ray", "--threads", "1"]
    line = cli_error(["split", *table, "--protocol", "parent", "--out", str(tmp_path / "m")], capsys)
    assert "crop ids must be unique" in line and "'a'" in line
    assert not (tmp_path / "m").exists()
    path = _i25_parquet(tmp_path, _pd.DataFrame({"id": ["a", "b"], "label": ["x", " "], "parent": "p"}), name="u.parquet")
    line = cli_error(["audit", str(path), "--id", "id", "--label", "label", "--parent", "parent", "--engine", "ray", "--threads", "1"], capsys)
    assert "column 'label' is empty or NaN in row 1 (id 'b')" in line and "u.parquet" in line
