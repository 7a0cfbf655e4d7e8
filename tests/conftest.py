import os

import numpy as np
import pandas as pd
import pytest
from hypothesis import settings

from shortcutlab import CropTable
from shortcutlab.random_tables import random_table

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
