"""Studies: whole experiments built from the layers below.

- `demo`: the one-command demo on the synthetic benchmark (a sweep and its report);
- `litmus`: the corner-patch litmus (retrain with patches, score with them moved);
- `control`: the deleted-signal control (retrain with a signal removed from every crop);
- `sibling_calibration`: how the sibling search's Hamming threshold was chosen, on the
  synthetic benchmark's augmentations.
"""
