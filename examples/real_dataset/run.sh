#!/usr/bin/env bash
# From a released folder (SIPaKMeD's layout: fields and crops, no table, no masks) and an
# ImageNet-shaped checkpoint to the report, with the commands of docs/real-datasets.md only.
#   bash examples/real_dataset/run.sh STUDY_DIR
# With your own download, skip the first step and point `table` and `locate` at it; with your
# own ImageNet file, skip make_checkpoint.py and give its path in sweep.yaml (weights:).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
study="${1:-real-dataset-study}"
mkdir "$study" && cd "$study"

# 0. the "download": a tiny SIPaKMeD-shaped folder (and, beside it, the truth a download lacks)
python "$here/make_sipakmed_like.py" released --fields-per-class 6

# 1. a crop table from the file names: class folder and field number
shortcutlab table released --pattern "im_{label}/CROPPED/{parent}_{*}.bmp" --out crops.csv

# 2. each crop found in the field images: parent = the field, x, y, w, h, match_score;
#    the filename's parent is kept as table_parent and their agreement printed
shortcutlab locate crops.csv --fields released --out located.csv

# 3. one estimated cell mask per crop (check masks/contact_sheet.png)
shortcutlab masks located.csv --out masks

# 4. audit the table: siblings, pixel overlap of the located boxes
shortcutlab audit masks/masks.csv --id id --label label --parent parent --box x,y,w,h

# 5. the leak/clean factorial, to look at (the sweep makes its own, per seed)
shortcutlab split masks/masks.csv --id id --label label --parent parent --protocol factorial \
    --reserve-parent-share 0.2 --allocation proportional --out split.csv

# 6. an ImageNet-shaped checkpoint (1000 classes), offline
python "$here/make_checkpoint.py" imagenet_like.safetensors

# 7. the sweep (fine-tuned from the checkpoint, scored, diagnosed) and its report
cp "$here/sweep.yaml" sweep.yaml
shortcutlab sweep sweep.yaml --out sweep --quiet
shortcutlab report sweep
echo "report: $(pwd)/sweep/report/report.html"
