"""The data layer: crop tables, splits and their audits. Nothing here knows about models.

Modules, one idea each:

- `table`: `CropTable`, the validated crop -> parent table;
- `manifest`: `SplitManifest`, a split's sides with its content hash and sidecar;
- `exposure`: closed forms of sibling exposure (share, exposure, diversity, pixel overlap);
- `overlap`: pixel overlap of crop boxes within a parent;
- `splits`: the split protocols (crop, parent, dedup, factorial, ladder) and `make_split`;
- `dedup`: near-duplicate parents merged before a split;
- `siblings`: perceptual-hash search for sibling crops across a split's sides;
- `audit`: measured exposure of an existing split;
- `card`: the reporting card of an audit;
- `image_files`: one image file read as 8-bit pixels (`read_crop`, `read_grey`), without torch;
- `images`: a crop manifest read (`load_manifest_table`) and its crops loaded as tensors (`load_crops`, `CropImages`);
- `random_tables`: random crop tables with a known structure, for tests and benchmarks.

`images` imports torch; the rest needs only numpy and pandas, so table work stays light.
"""
