"""The deleted-signal control (reference 003): delete the real signal, retrain, compare splits.

Reference 003's check: "Delete the actual useful information from your data, leaving only the
parts that identify the group. Retrain. If the score stays high, the model was never using the
useful information. It was recognising the group." (its toy: 98.3% under a random split,
45.0% = chance under a group split). Here the recipe is retrained twice on crops whose label
signal is gone, once under the user's split and once under a parent-disjoint split of the
same table (protocol ``parent``, the user split's test fraction and seed), and the two test
accuracies are compared WITH EACH OTHER (`compare_splits`, `control_verdict`). A split that
lets siblings cross scores above a parent split when the acquisition is recognisable; each
split's accuracy against chance is kept as a supporting column.

The verdict (`control_verdict`), on the difference d = accuracy under the user's split minus
accuracy under the parent split, with two 95% intervals: Newcombe's hybrid score interval
(crops as independent trials, `stats.newcombe_interval`) and the parent-cluster bootstrap
(each side's test parents resampled, `stats.cluster_bootstrap_difference`; siblings are
answered together, so crops overstate the evidence). The lower end of d is the smaller of
the two lower ends, the upper end the larger of the two upper ends:

- ``split leaks``: the lower end is above 0: the user's split scores clearly above the parent
  split with the class signal deleted, so its score can come from recognising acquisitions
  (if the parent split is above chance too, the deletion also left some class signal);
- ``parent higher``: the upper end is below 0 (no sign of a leak);
- ``no difference``: the interval includes 0: the two splits score alike, so the split does
  not leak by this control; if either split is above chance (by its parent-cluster interval),
  the deleted region did not remove the class signal (check the mask and the fill), and if
  neither is, the acquisitions are not recognisable to this model;
- ``undetermined``: a split scored no crop.

Two accuracies that read "above chance" and "not above chance" (0.540 and 0.547 on 150 crops
each) are the same score: their difference's interval includes 0, and the verdict says so.
The difference is of plain accuracies; each split's chance level is shown beside it (they
differ only when the two test sides' class shares do).

Two ways to delete the signal:

- ``delete="cell"``: every crop's cells are removed, in training and scoring: the pixels under
  the cell mask (grown by ``dilate`` pixels) get the fill, the background is kept
  (`delete_cell`, the inverse of the recipe's ``mask_background``). ``fill="constant"`` paints
  the recipe's ``background_fill`` grey, which leaves the cell's silhouette; ``fill="mean"``
  the crop's own background mean colour, a flat patch whose outline a CNN still sees against
  the background's grain; ``fill="noise"`` (the default) that mean plus the background's SD
  times a standard normal draw fixed per crop (`crop_noise`), so the patch has the
  background's grain too. The silhouette's size and outline are cell morphology: on the
  synthetic benchmark a grey silhouette kept the class under a parent split (0.55-0.63
  against chance 0.33, docs/no-parent-labels.md), so the defaults are ``fill="noise"``, ``dilate=2`` (the
  anti-aliased rim of a synthetic cell lies outside its mask). The mask must cover EVERY cell
  in the crop, not only the centred one: the neighbours a crop cuts out of its field share,
  in single-class fields, the crop's class, and a mask of the centred cell alone left them
  (on the synthetic benchmark 39% of 32 px crops hold parts of other cells; the control
  scored 0.51 / 0.45 against chance 0.33 under a crop / parent split without any planted
  signature, docs/no-parent-labels.md). The synthetic benchmark gives such masks (`SynthData.all_cells`,
  manifest column ``all_cells_mask``); masks that look like one centred cell per crop
  (`centred_single_cell_share`) get a warning and a note.
- ``delete="labels"``: labels permuted within parent (`permute_labels_within_parent`): each
  parent draws its own random permutation of the class names and every crop of that parent is
  relabelled through it. Reference 003 randomises "the features that legitimately carry the
  label" while the group stays identifiable; relabelling per parent does that to the
  association: the label is still a function of the parent (and, in mixed parents, of which
  crops share a class: each parent's label partition is kept), but no longer of what the cell
  looks like across parents. Under a parent split the test parents' permutations were never
  seen, so any predictor scores 1/K in expectation. (Shuffling labels among a parent's crops
  instead would keep each parent's label multiset but change nothing at all for single-class
  parents, and keeps the link between cell morphology and label across parents: it deletes
  nothing there.)

Rows, one per split (``split`` = ``given`` or ``parent``): the fields of
`shortcutlab.studies.litmus.score_row` (accuracy, k, n, chance = largest class share of the scored
test labels, Wilson interval, above_chance, p_value, training accuracy) plus the split's
protocol and SHA-256. The comparison (`ControlResult.comparison`) holds d, both intervals, the
verdict and its sentence.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np
import torch

from shortcutlab.data.images import CropImages
from shortcutlab.studies.litmus import LitmusError, TransformedCrops, check_split_sides, one_class_note, retrain_and_score, score_row
from shortcutlab.data.manifest import SplitManifest
from shortcutlab.models.recipe import TrainConfig
from shortcutlab.data.table import CropTable

DELETIONS: tuple[str, ...] = ("cell", "labels")
VERDICTS: tuple[str, ...] = ("split leaks", "parent higher", "no difference", "undetermined")
FILLS: tuple[str, ...] = ("constant", "mean", "noise")


class ControlWarning(UserWarning):
    """A deleted-signal control that runs but may not delete what it should (recorded in its notes)."""


SINGLE_CELL_WARN_SHARE = 0.95
"""`deleted_signal_control` warns when at least this share of the masks is one centred cell."""


def centred_single_cell_share(masks: torch.Tensor) -> float:
    """Share of crops whose mask is exactly one 8-connected region that holds the crop's centre
    (one of the 2 x 2 central pixels for an even side): what a mask of the centred cell alone
    looks like. A mask of every cell in the crop is that only in crops holding no other cell.

    Args:
        masks: (N, 1, H, W) bool or 0/1 masks.

    Returns:
        The share in [0, 1] (nan for N = 0).
    """
    from scipy import ndimage

    m = masks.detach().to("cpu").numpy()[:, 0] > 0.5
    n, h, w = m.shape
    if n == 0:
        return float("nan")
    structure = np.zeros((3, 3, 3), dtype=bool)
    structure[1] = True  # 8-connected within a crop, never across crops
    lab, _ = ndimage.label(m, structure=structure)
    # Labels are numbered in scan order, so a crop's regions hold a contiguous range of labels.
    flat = lab.reshape(n, -1)
    top = flat.max(axis=1)
    low = np.where(flat > 0, flat, np.iinfo(flat.dtype).max).min(axis=1)
    regions = np.where(top > 0, top - low + 1, 0)
    ys, xs = sorted({(h - 1) // 2, h // 2}), sorted({(w - 1) // 2, w // 2})
    centre = m[:, ys][:, :, xs].reshape(n, -1).any(axis=1)
    return float(np.mean((regions == 1) & centre))


def delete_cell(x: torch.Tensor, mask: torch.Tensor, fill: Literal["constant", "mean", "noise"] = "constant", value: float = 0.5,
                dilate: int = 0, noise: torch.Tensor | None = None) -> torch.Tensor:
    """Remove the cell: ``y = (1 - m) x + m f`` with m the (dilated) cell mask, f the fill.

    The inverse of the recipe's ``mask_background`` (which keeps the cell and fills the
    background). Background pixels are returned bit-identical.

    Args:
        x: (B, 3, H, W) float images in [0, 1].
        mask: (B, 1, H, W) cell mask (1 = cell), bool or float in [0, 1].
        fill: "constant" (grey `value`), "mean" (the crop's own mean colour outside the
            dilated mask) or "noise" (that mean plus its per-channel SD times `noise`, clipped
            to [0, 1], so the filled region has the background's grain); a crop with no
            background pixel gets `value`.
        value: grey level in [0, 1] for ``fill="constant"``.
        dilate: grow the mask by this many pixels (a square structuring element) first, so
            that the cell's soft, anti-aliased edge goes too.
        noise: (B, 3, H, W) standard normal draws for ``fill="noise"``.

    Returns:
        (B, 3, H, W) tensor of x's dtype and device.
    """
    from interventions.background import background_stats
    from interventions.base import check_image, check_mask

    if fill not in FILLS:
        raise LitmusError(f"fill must be one of {', '.join(map(repr, FILLS))}; got {fill!r}")
    if isinstance(dilate, bool) or not isinstance(dilate, (int, np.integer)) or dilate < 0:
        raise LitmusError(f"dilate must be a whole number of pixels >= 0; got {dilate!r}")
    check_image(x)
    m = check_mask(mask, x)
    if dilate:
        m = torch.nn.functional.max_pool2d(m, kernel_size=2 * int(dilate) + 1, stride=1, padding=int(dilate))
    grey = torch.full_like(x[:, :, :1, :1], float(value))
    if fill == "constant":
        f = grey
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mean, sd, has_bg = background_stats(x, m)
        if fill == "noise":
            if noise is None or tuple(noise.shape) != tuple(x.shape):
                raise LitmusError(f"fill='noise' needs noise= of shape {tuple(x.shape)}; got {None if noise is None else tuple(noise.shape)}")
            mean = (mean + sd * noise.to(device=x.device, dtype=x.dtype)).clamp(0.0, 1.0)
        f = torch.where(has_bg, mean, grey)
    return (1.0 - m) * x + m * f


def crop_noise(index: torch.Tensor, shape: tuple, seed: int = 0) -> torch.Tensor:
    """(B, *shape) standard normal draws, each crop's from its own generator seeded by (seed,
    crop row), so a crop gets the same draw in every batch, epoch and at scoring."""
    out = torch.empty((len(index), *shape))
    for k, i in enumerate(index.tolist()):
        g = torch.Generator().manual_seed((int(seed) * 1_000_003 + int(i)) % (2**63 - 1))
        out[k] = torch.randn(shape, generator=g)
    return out


def permute_labels_within_parent(label_codes: np.ndarray, parent_codes: np.ndarray, n_classes: int, seed: int = 0) -> np.ndarray:
    """Relabel every parent's crops through its own random permutation of the classes.

    Args:
        label_codes: (N,) class codes in 0..K-1.
        parent_codes: (N,) parent codes in 0..P-1.
        n_classes: K.
        seed: seeds the P permutations (drawn in parent-code order).

    Returns:
        (N,) int64 new class codes: ``perm[parent][label]``. Crops of one parent with equal
        labels keep equal labels, unequal ones stay unequal.
    """
    y = np.asarray(label_codes, dtype=np.int64)
    p = np.asarray(parent_codes, dtype=np.int64)
    n_parents = int(p.max()) + 1 if len(p) else 0
    rng = np.random.default_rng(seed)
    perms = np.argsort(rng.random((n_parents, n_classes)), axis=1)
    return perms[p, y]


def relabelled_crops(crops: CropImages, seed: int = 0) -> CropImages:
    """The crops with their table's labels permuted within parent (same images, ids and order)."""
    t = crops.table
    new = permute_labels_within_parent(t.label_codes, t.parent_codes, t.n_classes, seed)
    frame = t.to_frame()
    frame["label"] = np.asarray(t.classes, dtype=object)[new]
    table = CropTable(frame, source=f"{t.source} (labels permuted within parent, seed {seed})")
    if not np.array_equal(table.ids, t.ids):  # the frame stays id-sorted; crops stay aligned
        raise AssertionError("relabelling changed the row order")
    return CropImages(crops.images, crops.masks, table)


def reference_split(table: CropTable, split: SplitManifest, cell: str | None = None, seed: int | None = None) -> SplitManifest:
    """A parent-disjoint split of the same table: the given split's test fraction (its
    ``test_fraction`` parameter, else its measured test share) and seed (else 0)."""
    from shortcutlab.data.audit import side_codes
    from shortcutlab.data.splits import make_split

    q = split.params.get("test_fraction") if split.protocol != "factorial" else None
    if not isinstance(q, (int, float)) or not 0 < q < 1:
        side = side_codes(table, split.cell(cell))
        q = float((side == 2).sum() / max((side >= 0).sum(), 1))
    if seed is None:
        seed = split.params.get("seed", 0) if isinstance(split.params.get("seed", 0), int) else 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # empty class sides are reported by the split itself
        return make_split(table, "parent", test_fraction=float(q), seed=int(seed))


def empty_masks(crops: CropImages, side: np.ndarray, mask_name: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(rows of the split's crops, (n,) bool: their mask is empty); every mask empty is refused.

    Raises:
        LitmusError: no crop of the split has a mask pixel: deleting the cell would delete
            nothing and the control would retrain on the unaltered crops.
    """
    used = np.flatnonzero(side >= 0)
    empty = ~crops.masks[torch.from_numpy(used)].flatten(1).bool().any(dim=1).numpy()
    if len(used) and empty.all():
        where = f"the cell masks{f' ({mask_name})' if mask_name else ''}"
        raise LitmusError(f"{where} are empty in all {len(used)} crops of the split: --delete cell would delete nothing "
                          "and retrain on the unaltered crops; give a mask column that marks the cells (--mask COL), "
                          "or use --delete labels")
    return used, empty


@dataclass(frozen=True)
class ControlResult:
    """Outcome of `deleted_signal_control`: one row per split (given, parent)."""

    rows: list
    delete: str
    config: dict
    settings: dict
    chance_rule: str = "largest class share of the scored test labels (1/K on a balanced test side, never below 1/K)"
    notes: list = field(default_factory=list)
    comparison: dict = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        """One of `VERDICTS` ('' when the comparison was not made)."""
        return self.comparison.get("verdict", "")

    def frame(self):
        """The rows, one per split, each with the comparison's verdict, difference (given minus
        parent) and its interval (the verdict's: spanning the two) beside it."""
        import pandas as pd

        out = pd.DataFrame(self.rows)
        if self.comparison:
            lo, hi = _ends(self.comparison)
            out = out.assign(verdict=self.verdict, difference=self.comparison["difference"], difference_ci_low=lo,
                             difference_ci_high=hi)
        return out

    def to_dict(self) -> dict:
        return asdict(self)


def deleted_signal_control(crops: CropImages, split: SplitManifest, delete: Literal["cell", "labels"] = "cell",
                           config: TrainConfig = TrainConfig(), cell: str | None = None, fill: str = "noise",
                           dilate: int = 2, seed: int | None = None, reference: SplitManifest | None = None,
                           progress: bool = False, masks: torch.Tensor | None = None, mask_name: str | None = None) -> ControlResult:
    """Retrain with the label signal deleted under the given split and a parent split.

    Args:
        crops: the crops (masks needed for ``delete="cell"``).
        split: the user's split manifest.
        delete: "cell" or "labels" (see the module docstring).
        config: the recipe's settings (``mask_background`` cannot be combined with deleting
            the cell: nothing would be left).
        cell: cell of a multi-cell manifest.
        fill, dilate: how the cell is deleted (`delete_cell`; the grey is
            ``config.background_fill``).
        seed: seed of the within-parent permutations and of the reference split (default:
            the given split's seed, else 0).
        reference: the parent split to compare with (default: `reference_split`).
        progress: tqdm bars.
        masks: (N, 1, H, W) masks of the cells to delete, in the rows of `crops` (default:
            ``crops.masks``); they should cover every cell in the crop (for the synthetic
            benchmark, `SynthData.all_cells`).
        mask_name: where the masks come from (a manifest column), recorded in the settings.

    Returns:
        A `ControlResult`.

    Raises:
        LitmusError: an unknown deletion or fill, a split without a training or test side,
            ``delete="cell"`` without masks or with every mask of the split's crops empty.

    Warns:
        ControlWarning: masks that look like one centred cell per crop; some crops' masks
            empty (counted in ``settings["n_empty_masks"]``); a training side of one class.
            Each also goes into ``notes``.
    """
    if delete not in DELETIONS:
        raise LitmusError(f"--delete must be one of {', '.join(DELETIONS)}; got {delete!r}")
    if fill not in FILLS:
        raise LitmusError(f"--fill must be one of {', '.join(FILLS)}; got {fill!r}")
    side = check_split_sides(crops, split, cell, "the deleted-signal control")
    if seed is None:
        s = split.params.get("seed", 0)
        seed = s if isinstance(s, int) else 0
    notes = []
    note = one_class_note(crops, side, cell)
    if note:
        warnings.warn(note, ControlWarning, stacklevel=2)
        notes.append(note)
    if delete == "cell":
        data, cell_settings = _cell_deleted(crops, side, config, fill, dilate, seed, masks, mask_name, notes)
    else:
        data, cell_settings = relabelled_crops(crops, seed), {}
    ref = reference if reference is not None else reference_split(crops.table, split, cell, seed)
    rows, fits = [], []
    for name, s, c in (("given", split, cell), ("parent", ref, None)):
        fit = retrain_and_score(data, s, config, cell=c, progress=progress)
        fits.append(fit)
        rows.append({"split": name, "protocol": s.protocol, "split_sha256": s.hash, "delete": delete, **score_row(fit)})
    correct = [(f["test_labels"] == f["test_pred"], f["test_parents"]) for f in fits]
    comparison = compare_splits(*correct[0], *correct[1])
    comparison.update(control_verdict(comparison, rows[0], rows[1]))
    settings = {"delete": delete, "seed": seed, "cell": cell, "given_split": {"protocol": split.protocol, "params": split.params, "sha256": split.hash},
                "reference_split": {"protocol": ref.protocol, "params": ref.params, "sha256": ref.hash}}
    settings.update(cell_settings)
    if delete == "labels":
        notes.append("labels permuted within parent: every parent's crops relabelled through that parent's own random permutation of the classes")
    return ControlResult(rows=rows, delete=delete, config=asdict(config), settings=settings, notes=notes, comparison=comparison)


def compare_splits(correct_given, parents_given, correct_parent, parents_parent, level: float = 0.95, n_boot: int = 2000,
                   seed: int = 0) -> dict:
    """The difference of the two splits' test accuracies, with both intervals of the verdict.

    Args:
        correct_given, parents_given: (n1,) correctness and parent of each test crop scored
            under the user's split.
        correct_parent, parents_parent: (n2,) under the parent split.
        level, n_boot, seed: the intervals' coverage, the bootstrap's draws and seed.

    Returns:
        dict: ``difference`` (fraction), ``newcombe_low``/``newcombe_high``
        (`stats.newcombe_interval`), ``cluster_low``/``cluster_high``
        (`stats.cluster_bootstrap_difference`), ``level``.
    """
    from shortcutlab.stats import cluster_bootstrap_difference, newcombe_interval

    g, p = np.asarray(correct_given, dtype=bool), np.asarray(correct_parent, dtype=bool)
    n1, n2 = len(g), len(p)
    d = float(g.mean() - p.mean()) if n1 and n2 else float("nan")
    lo, hi = newcombe_interval(int(g.sum()), n1, int(p.sum()), n2, level)
    clo, chi = cluster_bootstrap_difference(g, parents_given, p, parents_parent, level=level, n_boot=n_boot, seed=seed)
    return {"difference": d, "newcombe_low": lo, "newcombe_high": hi, "cluster_low": clo, "cluster_high": chi, "level": level}


def _shown(x: float) -> float:
    """A difference as the reading prints it, in pp (one decimal; nan stays nan)."""
    return float("nan") if x != x else float(f"{100 * x:+.1f}") / 100


def _ends(comparison: dict) -> tuple[float, float]:
    """The verdict's interval: the smaller lower end and the larger upper end of the two (nan
    where neither is there)."""
    lows = [v for v in (comparison.get("newcombe_low"), comparison.get("cluster_low")) if v == v and v is not None]
    highs = [v for v in (comparison.get("newcombe_high"), comparison.get("cluster_high")) if v == v and v is not None]
    return (min(lows) if lows else float("nan"), max(highs) if highs else float("nan"))


def control_verdict(comparison: dict, given: dict, parent: dict) -> dict:
    """The control's verdict from the two splits' comparison (see the module docstring).

    Args:
        comparison: `compare_splits`' dict (difference and the two intervals, fractions).
        given, parent: the two splits' score rows (``accuracy``, ``chance``, ``above_chance``).

    Returns:
        dict: ``verdict`` (one of `VERDICTS`), ``signal_left`` (bool: a split is above chance
        though the split does not leak, or the parent split is above chance), ``reading``
        (the sentence).

    Example:
        >>> c = {"difference": -0.007, "newcombe_low": -0.118, "newcombe_high": 0.105,
        ...      "cluster_low": -0.15, "cluster_high": 0.14}
        >>> control_verdict(c, dict(accuracy=0.540, chance=0.333, above_chance=True),
        ...                 dict(accuracy=0.547, chance=0.333, above_chance=False))["verdict"]
        'no difference'
    """
    lo, hi = (_shown(v) for v in _ends(comparison))   # decided on the numbers as printed (0.1 pp)
    d = comparison.get("difference", float("nan"))
    scores = (f"{given['accuracy']:.3f} under the given split and {parent['accuracy']:.3f} under the parent split "
              f"(chance {given['chance']:.3f} / {parent['chance']:.3f})")
    if d != d or lo != lo or hi != hi:
        return {"verdict": "undetermined", "signal_left": False,
                "reading": f"undetermined: a split scored no test crop ({scores})"}
    level = comparison.get("level", 0.95)
    diff = (f"difference {100 * d:+.1f} pp, {level:.0%} CI {100 * lo:+.1f} to {100 * hi:+.1f} pp "
            "(spanning Newcombe's and the parent-cluster bootstrap's intervals)")
    any_above = bool(given["above_chance"]) or bool(parent["above_chance"])
    if lo > 0:
        text = (f"the split leaks: with the class signal deleted the given split scores above the parent split, "
                f"{scores}; {diff}")
        if parent["above_chance"]:
            text += "; the parent split is above chance too, so the deletion also left some class signal"
        return {"verdict": "split leaks", "signal_left": bool(parent["above_chance"]), "reading": text}
    if hi < 0:
        return {"verdict": "parent higher", "signal_left": any_above,
                "reading": f"no sign that the split leaks: the parent split scores above the given split, {scores}; {diff}"}
    text = f"no sign that the split leaks: the two splits score alike, {scores}; {diff}"
    if any_above:
        which = ("both splits are" if given["above_chance"] and parent["above_chance"] else
                 f"the {'given' if given['above_chance'] else 'parent'} split is")
        text += (f"; {which} above chance, so the deleted region did not remove the class signal (check the mask and "
                 "the fill)")
    else:
        text += "; both are at chance: the acquisitions are not recognisable to this model"
    return {"verdict": "no difference", "signal_left": any_above, "reading": text}


def _cell_deleted(crops: CropImages, side: np.ndarray, config: TrainConfig, fill: str, dilate: int, seed: int,
                  masks: torch.Tensor | None, mask_name: str | None, notes: list) -> tuple[TransformedCrops, dict]:
    """The crops with their cells deleted (`delete_cell` on every batch) and the settings
    that record how; the `ControlWarning` of `deleted_signal_control` (empty masks, centred
    single-cell masks) are raised at its caller and appended to `notes`."""
    if masks is not None:
        want = (len(crops.images), 1, *crops.images.shape[2:])
        if not isinstance(masks, torch.Tensor) or tuple(masks.shape) != want:
            got = tuple(masks.shape) if isinstance(masks, torch.Tensor) else type(masks).__name__
            raise LitmusError(f"masks= must be a tensor of shape {want} (one mask per crop, in the crops' rows); got {got}")
        crops = CropImages(crops.images, masks, crops.table)
    if crops.masks is None:
        raise LitmusError("--delete cell needs cell masks, but the crop manifest has no mask column (--mask COL); or use --delete labels")
    if config.mask_background:
        raise LitmusError("--delete cell cannot be combined with --mask-background: the crops would hold nothing but the fill")
    used, empty = empty_masks(crops, side, mask_name)
    n_empty = int(empty.sum())
    where = f"the cell masks{f' ({mask_name})' if mask_name else ''}"
    if n_empty:
        msg = (f"{where} are empty in {n_empty} of the split's {len(used)} crops (e.g. {crops.table.ids[used[empty][0]]!r}): "
               "nothing is deleted there, so those crops keep their cells")
        warnings.warn(msg, ControlWarning, stacklevel=3)
        notes.append(msg)
    single = centred_single_cell_share(crops.masks)
    if single >= SINGLE_CELL_WARN_SHARE:
        msg = (f"the masks{f' ({mask_name})' if mask_name else ''} look like one centred cell per crop in {100 * single:.1f}% of crops: "
               "other cells in a crop are not deleted and can carry the class (on the synthetic benchmark they do); "
               "give --delete cell a mask of every cell in the crop (synthetic benchmark: column all_cells_mask)")
        warnings.warn(msg, ControlWarning, stacklevel=3)
        notes.append(msg)
    value = config.background_fill

    def transform(x, m, index):
        z = crop_noise(index, tuple(x.shape[1:]), seed).to(x.device) if fill == "noise" else None
        return delete_cell(x, m, fill=fill, value=value, dilate=dilate, noise=z)

    data = TransformedCrops(crops.images, crops.masks, crops.table, transform=transform)
    settings = dict(fill=fill, dilate=dilate, value=config.background_fill, mask=mask_name, mask_single_centred_share=single,
                    n_empty_masks=n_empty)
    return data, settings



