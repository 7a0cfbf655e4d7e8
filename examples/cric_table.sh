#!/usr/bin/env bash
# CRIC, table only: no images ship with shortcutlab, so this audits the annotation table and
# builds the splits a CRIC study trains on; with the images, a sweep config's
# `data.manifest` (see sweep_manifest.yaml) takes the table and these splits' parameters.
#   bash examples/cric_table.sh [OUT]      # OUT defaults to cric-out; about 10 s
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
TABLE="$HERE/data/cric_classifications.csv"
OUT="${1:-cric-out}"
mkdir -p "$OUT"
COLS=(--parent image_id --label bethesda_system --id cell_id --center nucleus_x,nucleus_y --crop-size 100)

# 1. The audit: sibling share, exposure and pixel overlap of a crop-level split (closed forms),
#    as JSON and as a Markdown card.
shortcutlab audit "$TABLE" "${COLS[@]}" --json "$OUT/audit.json" --card "$OUT/card.md"

# 2. The protocols: P1 (crop-level), P2 (parent-disjoint), and the leak/clean factorial.
#    Parents mix classes in CRIC, so the factorial allocates crops in the table's class shares;
#    a fifth of the non-test images is kept out of every cell as targets of the unseen-field
#    Reinhard transfer (F2, `reinhard_unseen_field`).
shortcutlab split "$TABLE" "${COLS[@]}" --protocol crop --test-fraction 0.2 --seed 1 --out "$OUT/p1_crop.csv"
shortcutlab split "$TABLE" "${COLS[@]}" --protocol parent --test-fraction 0.2 --seed 1 --out "$OUT/p2_parent.csv"
shortcutlab split "$TABLE" "${COLS[@]}" --protocol factorial --allocation proportional --reserve-parent-share 0.2 \
    --seed 1 --out "$OUT/factorial.csv"

# 3. Each split's hash, for the methods section; `shortcutlab verify SPLIT --hash H` checks it later.
for s in p1_crop p2_parent factorial; do
    python3 -c "import json,sys; print(sys.argv[1], json.load(open(sys.argv[2]))['sha256'])" "$s" "$OUT/$s.json"
done
