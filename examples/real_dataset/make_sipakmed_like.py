"""Write a tiny folder shaped like the SIPaKMeD release, from the synthetic benchmark.

SIPaKMeD ships, per class, the full field images and the cell crops cut from them, with no
crop table and no masks:

    im_<Class>/<field>.bmp                 full field images
    im_<Class>/CROPPED/<field>_<n>.bmp     one crop per cell, named after its field

This script renders synthetic fields (single-class, as SIPaKMeD's are) with every planted
acquisition mechanism and writes them and their crops in that layout. It also writes
`truth.csv` (each crop's field and box) beside the folder, so the located boxes and fields
can be checked; a real download has no such file.

Usage:
    python examples/real_dataset/make_sipakmed_like.py OUT [--fields-per-class 6] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import pandas as pd
from PIL import Image

from shortcutlab.synth import SynthConfig, render_field, synthesize


def make(out: str, fields_per_class: int = 6, seed: int = 0, crop_size: int = 48) -> pd.DataFrame:
    """Write the folder `out` and return the truth table (file, label, field, x, y, w, h)."""
    config = SynthConfig(seed=seed, n_classes=3, fields_per_class=fields_per_class, crop_size=crop_size,
                         field_size=4 * crop_size, mean_cells_per_field=5.0)
    data = synthesize(config)
    names = {f"class{k}": f"Class{chr(ord('A') + k)}" for k in range(config.n_classes)}
    crops = data.images.permute(0, 2, 3, 1).numpy()
    rows = []
    for i, field in enumerate(data.fields):
        folder = os.path.join(out, f"im_{names[field['dominant']]}")
        os.makedirs(os.path.join(folder, "CROPPED"), exist_ok=True)
        image = render_field(config, i).image.permute(1, 2, 0).numpy()
        Image.fromarray(image).save(os.path.join(folder, f"{field['id']}.bmp"))
        members = np.flatnonzero(data.table["parent"].to_numpy() == field["id"])
        for n, j in enumerate(members, start=1):
            rec = data.table.iloc[j]
            name = os.path.join(f"im_{names[rec['label']]}", "CROPPED", f"{field['id']}_{n:02d}.bmp")
            Image.fromarray(crops[j]).save(os.path.join(out, name))
            rows.append({"file": name.replace(os.sep, "/"), "label": names[rec["label"]], "field": field["id"],
                         "x": int(rec["x"]), "y": int(rec["y"]), "w": int(rec["w"]), "h": int(rec["h"])})
    truth = pd.DataFrame(rows)
    truth.to_csv(os.path.join(os.path.dirname(os.path.abspath(out)), os.path.basename(os.path.abspath(out)) + "_truth.csv"),
                 index=False)
    return truth


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="folder to create (must not exist)")
    p.add_argument("--fields-per-class", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if os.path.exists(args.out):
        print(f"make_sipakmed_like: error: {args.out!r} exists; give a new folder", file=sys.stderr)
        return 2
    truth = make(args.out, args.fields_per_class, args.seed)
    print(f"wrote {len(truth)} crops of {truth['field'].nunique()} fields in {args.out} "
          f"(truth: {os.path.abspath(args.out)}_truth.csv)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
