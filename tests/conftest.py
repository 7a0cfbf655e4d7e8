import os
import sys

import pandas as pd
import pytest
from hypothesis import settings

from shortcutlab import CropTable
from shortcutlab.data.random_tables import random_table

settings.register_profile("ci", max_examples=25, deadline=None)
settings.load_profile("ci")

CRIC = os.path.join(os.path.dirname(__file__), "..", "examples", "data", "cric_classifications.csv")
CRIC_COLUMNS = dict(id="cell_id", label="bethesda_system", parent="image_id", center="nucleus_x,nucleus_y", crop_size=100)


@pytest.fixture(scope="session")
def cric() -> CropTable:
    return CropTable.from_csv(CRIC, **CRIC_COLUMNS)


@pytest.fixture
def small_df() -> pd.DataFrame:
    return random_table(n_parents=40, mean_crops=5, n_classes=3, geometry=True, image_size=(300, 300), crop_size=80, seed=3)


def table_from(df: pd.DataFrame, **kw) -> CropTable:
    cols = dict(id="id", label="label", parent="parent")
    if "x" in df.columns:
        cols["box"] = "x,y,w,h"
    cols.update(kw)
    return CropTable.from_frame(df, **cols)


def shuffled(df: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    return df.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def pytest_collection_modifyitems(config, items):
    """Leave the tests marked `slow` (or `calibration`) out of a run that selects no markers (the README's
    `python -m pytest -q`, which must finish in minutes on 2 cores). `-m slow` runs them
    (`.ci/run` does, as its second step), `-m "slow or not slow"` runs everything, and a test
    named by its node id (`tests/test_x.py::test_y`) runs whatever its marks."""
    if config.getoption("markexpr"):
        return
    named = tuple(a.replace(os.sep, "/") for a in config.args if "::" in a)

    def left_out(item) -> bool:
        long = item.get_closest_marker("slow") is not None or item.get_closest_marker("calibration") is not None
        return long and not any(
            item.nodeid == n or item.nodeid.startswith(n + "[") or item.nodeid.endswith("/" + n) for n in named)

    slow = [item for item in items if left_out(item)]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not left_out(item)]


def pytest_terminal_summary(terminalreporter):
    """One line for tests/test_docs.py: how many doc blocks ran, and which were skipped and why."""
    docs = sys.modules.get("test_docs")
    if docs is None or not docs.SUMMARY:
        return
    runs = docs.SUMMARY.values()
    skipped = [f"{page} {s}" for page, r in docs.SUMMARY.items() for s in r["skipped"]]
    terminalreporter.write_line(
        f"docs: {sum(r['ran'] for r in runs)} blocks ran on {len(docs.SUMMARY)} pages in "
        f"{sum(r['seconds'] for r in runs):.0f} s; {len(skipped)} skipped" + ("".join(f"\n  {s}" for s in skipped)))
