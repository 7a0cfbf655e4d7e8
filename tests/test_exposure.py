"""Closed forms against exact small cases, brute force and a Monte Carlo of the split process."""

import numpy as np
import pytest

from shortcutlab import ShortcutlabError, diversity_ratio, exposure, pixel_overlap, sibling_share, summarize
from shortcutlab.data.overlap import has_overlapping_partner, overlap_counts, overlapping_pairs
from shortcutlab.data.random_tables import random_table
from conftest import table_from


def test_exact_small_cases():
    assert exposure(np.array([2, 2]), 0.5) == pytest.approx(0.5)
    assert exposure(np.array([1, 1, 1]), 0.3) == 0.0
    assert sibling_share(np.array([1, 3])) == pytest.approx(0.75)
    # All singletons: a crop-level split holds as many parents as a parent-level one.
    assert diversity_ratio(np.array([1] * 10), 0.2) == pytest.approx(1.0)
    # One parent of k crops: 1 - q^(k-1) of test crops see a sibling.
    assert exposure(np.array([5]), 0.2) == pytest.approx(1 - 0.2**4)


@pytest.mark.parametrize("q", [0.0, 1.0, -0.1, "a"])
def test_bad_test_fraction(q):
    with pytest.raises(ShortcutlabError, match="test fraction"):
        exposure(np.array([2, 3]), q)


def _brute_force_counts(parent, boxes):
    x0, y0 = boxes[:, 0], boxes[:, 1]
    x1, y1 = x0 + boxes[:, 2], y0 + boxes[:, 3]
    inter = (np.maximum(x0[:, None], x0[None]) < np.minimum(x1[:, None], x1[None])) & (
        np.maximum(y0[:, None], y0[None]) < np.minimum(y1[:, None], y1[None])
    )
    same = parent[:, None] == parent[None]
    np.fill_diagonal(inter, False)
    return (inter & same).sum(1)


@pytest.mark.parametrize("chunk", [1, 7, 4_000_000])
def test_overlap_counts_match_brute_force(chunk):
    df = random_table(60, 6, 2, image_size=(400, 300), crop_size=90, seed=5)
    t = table_from(df)
    pairs = overlapping_pairs(t.parent_codes, t.boxes, chunk_pairs=chunk)
    np.testing.assert_array_equal(overlap_counts(t.n_crops, pairs), _brute_force_counts(t.parent_codes, t.boxes))


def test_touching_boxes_share_no_pixel():
    parent = np.array([0, 0, 0, 1])
    boxes = np.array([[0, 0, 10, 10], [10, 0, 10, 10], [9.5, 9.5, 1, 1], [0, 0, 10, 10]], dtype=float)
    # Box 1 only touches box 0 along x = 10; box 2 overlaps both; box 3 is in another parent.
    np.testing.assert_array_equal(overlap_counts(4, overlapping_pairs(parent, boxes)), [1, 1, 2, 0])
    hit = has_overlapping_partner(overlapping_pairs(parent, boxes), np.array([1, 1, 0, 1], bool), np.array([0, 0, 1, 0], bool))
    np.testing.assert_array_equal(hit, [True, True, False, False])


def _simulate(t, q, reps, seed=0):
    """Independent crop-level assignment; per replicate the numerators and denominators."""
    rng = np.random.default_rng(seed)
    pc = t.parent_codes
    pairs = t.overlap_pairs if t.has_geometry else None
    rows = []
    for _ in range(reps):
        test = rng.random(t.n_crops) < q
        train = ~test
        has_train = np.zeros(t.n_parents, bool)
        has_train[pc[train]] = True
        sib = has_train[pc[test]].sum()
        pix = has_overlapping_partner(pairs, test, train)[test].sum() if pairs is not None else 0
        distinct = len(np.unique(pc[train]))
        rows.append((test.sum(), sib, pix, distinct))
    return np.array(rows, dtype=float)


@pytest.mark.parametrize("mixed", [False, True])
def test_closed_forms_match_monte_carlo(mixed):
    df = random_table(300, 4, 3, mixed=mixed, image_size=(500, 400), crop_size=100, seed=11)
    t = table_from(df)
    q = 0.3
    sim = _simulate(t, q, reps=400)
    n_test, sib, pix, distinct = sim.T

    def within(closed, num, den):
        # The closed form is E[num] / E[den]; num - closed * den has mean zero.
        d = num - closed * den
        se = d.std(ddof=1) / np.sqrt(len(d))
        assert abs(d.mean()) < 4 * se + 1e-12, (closed, (num.sum() / den.sum()))

    within(exposure(t, q), sib, n_test)
    within(pixel_overlap(t, q), pix, n_test)
    # Diversity: distinct training parents over (1 - q) P.
    within(diversity_ratio(t, q), distinct, np.full_like(distinct, (1 - q) * t.n_parents))


def test_monte_carlo_would_catch_a_wrong_formula():
    df = random_table(300, 4, 3, seed=11, geometry=False)
    t = table_from(df)
    q = 0.3
    n_test, sib, _, _ = _simulate(t, q, reps=400).T
    wrong = float(np.sum(t.parent_sizes * (1 - q ** t.parent_sizes)) / t.n_crops)  # k instead of k - 1
    d = sib - wrong * n_test
    assert abs(d.mean()) > 4 * d.std(ddof=1) / np.sqrt(len(d))


def test_summary_on_cric(cric):
    s = summarize(cric, 0.2)
    assert s.n_crops == 11534 and s.n_parents == 400
    assert s.sibling_share == 1.0  # every CRIC image holds at least two annotated cells
    assert s.diversity_ratio == pytest.approx(1.25, abs=0.005)  # the main paper's CRIC figure
    assert 0.6 < s.pixel_overlap < 0.8
    m = np.zeros(cric.n_crops, dtype=np.int64)
    for p in range(cric.n_parents):  # brute force within each parent
        idx = np.flatnonzero(cric.parent_codes == p)
        m[idx] = _brute_force_counts(cric.parent_codes[idx], cric.boxes[idx])
    assert s.pixel_overlap == pytest.approx(np.mean(1 - 0.2**m))
