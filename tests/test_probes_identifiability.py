"""Group identifiability (`probes.identifiability`) against independent references: a Monte
Carlo of the Bayes rule from the true parent means, a scikit-learn-only fold loop, scipy's
binomial intervals, hand counts, and the synthetic benchmark's planted field signatures."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from scipy.stats import binomtest
from torch import nn

from interventions.background import background_removal
from probes import ROW_COLUMNS, available, get
from probes.base import DiagnosticContext
from probes.errors import DiagnosticError
from probes.identifiability import (
    GroupIdentifiability,
    GroupIdentifiabilityDiagnostic,
    binomial_interval,
    remove_cell,
    sibling_folds,
)
from shortcutlab.models.adapter import wrap
from shortcutlab.data.images import CropImages
from shortcutlab.synth import SynthConfig, synthesize


def gaussian_parents(n_parents: int, per_parent: int, dim: int, separation: float, seed: int):
    """Crops x = mu_parent + N(0, I), parent means mu ~ N(0, separation^2 I)."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(size=(n_parents, dim)) * separation
    parents = np.repeat(np.arange(n_parents), per_parent)
    return mu[parents] + rng.normal(size=(len(parents), dim)), parents, mu


def bayes_accuracy(mu: np.ndarray, draws: int = 100_000, seed: int = 99) -> float:
    """Monte Carlo accuracy of the nearest-true-mean rule (Bayes-optimal for equal priors)."""
    rng = np.random.default_rng(seed)
    k = rng.integers(0, len(mu), draws)
    z = mu[k] + rng.normal(size=(draws, mu.shape[1]))
    return float((((z[:, None, :] - mu[None]) ** 2).sum(-1).argmin(1) == k).mean())


# -- the folds ------------------------------------------------------------------------------
def test_sibling_folds_keep_a_sibling_in_every_training_set() -> None:
    rng = np.random.default_rng(0)
    parents = np.repeat(np.arange(50), rng.integers(1, 12, 50))
    fold = sibling_folds(parents, 5, seed=3)
    counts = np.bincount(parents)
    assert np.all((fold == -1) == (counts[parents] == 1))
    for p in np.flatnonzero(counts >= 2):
        f = fold[parents == p]
        for k in range(5):  # some crop of p is outside every fold
            assert (f != k).any()
        assert np.bincount(f, minlength=5).max() <= math.ceil(len(f) / 5)
    sizes = np.bincount(fold[fold >= 0], minlength=5)
    assert sizes.max() - sizes.min() <= 0.1 * sizes.mean()
    np.testing.assert_array_equal(fold, sibling_folds(parents, 5, seed=3))
    assert not np.array_equal(fold, sibling_folds(parents, 5, seed=4))


def test_sibling_folds_with_string_parents() -> None:
    fold = sibling_folds(np.array(["b", "a", "b", "c", "a", "a"]), 2, seed=0)
    assert fold[3] == -1 and set(fold[[0, 2]]) == {0, 1}


# -- accuracy against independent references ----------------------------------------------------
@pytest.mark.parametrize("separation", [0.7, 1.2])
def test_accuracy_near_the_bayes_rule_from_the_true_means(separation) -> None:
    """With 60 crops per parent in 3 dimensions the fitted linear rule nearly reaches the Bayes
    rule (nearest true mean, itself linear), whose accuracy a Monte Carlo gives independently."""
    X, parents, mu = gaussian_parents(8, 60, 3, separation, seed=0)
    gi = GroupIdentifiability(seed=0).fit_score(X, parents)
    bayes = bayes_accuracy(mu)
    assert abs(gi.accuracy_ - bayes) < 0.06, (gi.accuracy_, bayes)
    assert gi.ci_[0] < bayes + 0.02  # never clearly better than the optimum


def test_same_predictions_as_a_scikit_learn_fold_loop() -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    X, parents, _ = gaussian_parents(30, 5, 12, 0.6, seed=1)
    gi = GroupIdentifiability(folds=4, C=0.5, seed=2, tol=1e-8, max_iter=2000).fit_score(X, parents)
    pred = np.empty(len(parents), dtype=parents.dtype)
    for f in range(4):
        tr, te = gi.fold_ != f, gi.fold_ == f
        scaler = StandardScaler().fit(X[tr])
        clf = LogisticRegression(C=0.5, tol=1e-8, max_iter=2000).fit(scaler.transform(X[tr]), parents[tr])
        pred[te] = clf.predict(scaler.transform(X[te]))
    agree = (gi.parents_[gi.predicted_] == pred).mean()
    assert agree >= 0.99, agree
    assert abs(gi.accuracy_ - (pred == parents).mean()) <= 1 / len(parents) + 1e-12


def test_same_fit_as_scikit_learn_at_its_default_tolerance() -> None:
    """The stopping rule is scikit-learn's too: same accuracy at tol=1e-4, max_iter=100."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    X, parents, _ = gaussian_parents(40, 6, 32, 0.3, seed=5)
    gi = GroupIdentifiability(seed=1).fit_score(X, parents)
    correct = 0
    for f in range(5):
        tr, te = gi.fold_ != f, gi.fold_ == f
        scaler = StandardScaler().fit(X[tr])
        clf = LogisticRegression().fit(scaler.transform(X[tr]), parents[tr])
        correct += int((clf.predict(scaler.transform(X[te])) == parents[te]).sum())
    assert abs(gi.n_correct_ - correct) <= 2


def test_random_features_score_near_chance() -> None:
    parents = np.repeat(np.arange(25), 6)
    X = np.random.default_rng(3).normal(size=(len(parents), 20))
    gi = GroupIdentifiability(seed=0).fit_score(X, parents)
    assert gi.chance_ == pytest.approx(1 / 25)
    assert gi.ci_[0] <= gi.chance_ <= gi.ci_[1]


def test_the_scored_crop_is_never_in_its_own_training_set() -> None:
    """Each parent is a pair of identical crops plus unrelated noise crops elsewhere: a fit
    that saw the held-out crop would name it; held out, its twin still names it, which is the
    point of folds inside parents. Then make the twins differ: accuracy falls to chance."""
    rng = np.random.default_rng(0)
    parents = np.repeat(np.arange(40), 2)
    base = rng.normal(size=(40, 30))
    twins = base[parents]
    assert GroupIdentifiability(folds=2, seed=0).fit_score(twins, parents).accuracy_ == 1.0
    strangers = rng.normal(size=(80, 30))
    gi = GroupIdentifiability(folds=2, seed=0).fit_score(strangers, parents)
    assert gi.accuracy_ <= 0.1


# -- chance, interval, counts -------------------------------------------------------------------
def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


@pytest.mark.parametrize("k, n", [(0, 20), (3, 40), (17, 60), (40, 40), (250, 1000)])
def test_binomial_interval_against_scipy_and_the_closed_form(k, n) -> None:
    lo, hi = binomial_interval(k, n)
    ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert (lo, hi) == pytest.approx((ref.low, ref.high), abs=1e-12)
    assert (lo, hi) == pytest.approx(wilson(k, n), abs=1e-9)
    ex = binomtest(k, n).proportion_ci(confidence_level=0.9, method="exact")
    assert binomial_interval(k, n, 0.9, "exact") == pytest.approx((ex.low, ex.high), abs=1e-12)


def test_fitted_interval_is_the_binomial_interval_of_the_counts() -> None:
    X, parents, _ = gaussian_parents(12, 5, 6, 0.8, seed=2)
    for method in ("wilson", "exact"):
        gi = GroupIdentifiability(interval=method, confidence=0.9).fit_score(X, parents)
        ref = binomtest(gi.n_correct_, gi.n_).proportion_ci(confidence_level=0.9, method=method)
        assert gi.ci_ == pytest.approx((ref.low, ref.high), abs=1e-12)
        assert gi.accuracy_ == gi.n_correct_ / gi.n_ == gi.correct_.mean()


def test_singletons_counted_excluded_and_warned() -> None:
    X, parents, _ = gaussian_parents(10, 4, 5, 1.0, seed=0)
    X = np.vstack([X, np.zeros((3, 5))])
    parents = np.concatenate([parents, [100, 101, 102]])
    with pytest.warns(UserWarning, match="3 parent"):
        gi = GroupIdentifiability().fit_score(X, parents)
    assert (gi.n_, gi.n_parents_, gi.n_singletons_, gi.n_excluded_) == (40, 10, 3, 3)
    assert gi.chance_ == pytest.approx(0.1)
    assert np.all(gi.fold_[-3:] == -1) and np.all(gi.predicted_[-3:] == -1) and not gi.correct_[-3:].any()
    assert list(gi.parents_) == list(range(10))


def test_no_warning_without_singletons() -> None:
    X, parents, _ = gaussian_parents(5, 3, 4, 1.0, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gi = GroupIdentifiability(folds=3).fit_score(X, parents)
    assert gi.n_singletons_ == 0 and gi.n_ == 15


def test_majority_and_class_chance_by_hand() -> None:
    # parents a, b (class x), c (class y), d (class x and y); sizes 2, 3, 4, 3 = 12 crops
    parents = np.array(list("aabbbccccddd"))
    labels = np.array(list("xxxxxyyyyxyy"))
    X = np.random.default_rng(0).normal(size=(12, 3))
    gi = GroupIdentifiability(folds=2).fit_score(X, parents, labels)
    assert gi.majority_ == pytest.approx(4 / 12)
    # class x is held by parents a, b, d (3), class y by c, d (2); 6 crops of x, 6 of y
    assert gi.class_chance_ == pytest.approx((6 / 3 + 6 / 2) / 12)
    assert math.isnan(GroupIdentifiability(folds=2).fit_score(X, parents).class_chance_)


def test_accepts_torch_float32_and_integer_features() -> None:
    X, parents, _ = gaussian_parents(6, 4, 3, 1.0, seed=0)
    a = GroupIdentifiability(folds=2).fit_score(X, parents)
    b = GroupIdentifiability(folds=2).fit_score(torch.from_numpy(X).float(), parents)
    assert abs(a.accuracy_ - b.accuracy_) <= 1 / len(parents)
    c = GroupIdentifiability(folds=2).fit_score(np.round(X * 10).astype(np.int64), parents)
    assert c.n_ == 24


def test_constant_feature_columns_are_harmless() -> None:
    X, parents, _ = gaussian_parents(6, 5, 3, 2.0, seed=0)
    X = np.hstack([X, np.full((len(X), 2), 7.0)])
    gi = GroupIdentifiability().fit_score(X, parents)
    assert np.isfinite(gi.accuracy_) and gi.accuracy_ > 0.5


def test_invariant_to_feature_offset_and_scale() -> None:
    """Standardisation inside each fold: shifting and scaling every column changes nothing."""
    X, parents, _ = gaussian_parents(10, 5, 6, 0.8, seed=4)
    a = GroupIdentifiability().fit_score(X, parents)
    b = GroupIdentifiability().fit_score(1e4 + 1e-3 * X * np.arange(1, 7), parents)
    assert (a.predicted_ == b.predicted_).mean() >= 0.98


# -- bad input (the catalogue in test_bad_input.py has the one-line message checks) --------------
@pytest.mark.parametrize(
    "kwargs, word",
    [({"folds": 1}, "folds"), ({"C": 0}, "C"), ({"C": float("nan")}, "C"), ({"max_iter": 0}, "max_iter"),
     ({"interval": "wald"}, "interval"), ({"confidence": 1.0}, "confidence"), ({"seed": -1}, "seed")],
)
def test_bad_settings(kwargs, word) -> None:
    X, parents, _ = gaussian_parents(4, 3, 2, 1.0, seed=0)
    with pytest.raises(DiagnosticError, match=f"'{word}' parameter"):
        GroupIdentifiability(**kwargs).fit_score(X, parents)


def test_bad_data() -> None:
    X, parents, _ = gaussian_parents(4, 3, 2, 1.0, seed=0)
    with pytest.raises(DiagnosticError, match="12 rows but parents has 11"):
        GroupIdentifiability().fit_score(X, parents[:-1])
    X2 = X.copy()
    X2[5, 1] = np.nan
    with pytest.raises(DiagnosticError, match=r"rows \[5\]"):
        GroupIdentifiability().fit_score(X2, parents)
    with pytest.raises(DiagnosticError, match="labels"):
        GroupIdentifiability().fit_score(X, parents, labels=np.zeros(3))
    with pytest.raises(DiagnosticError, match=r"\(N, D\)"):
        GroupIdentifiability().fit_score(X[:, 0], parents)


# -- cell-free backgrounds ----------------------------------------------------------------------
def test_remove_cell_fills_the_cell_and_keeps_the_background() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 3, 12, 12, generator=g)
    m = torch.zeros(3, 1, 12, 12)
    m[:, :, 3:8, 4:9] = 1
    m[2] = 1  # no background at all
    cell = m.bool().expand_as(x)
    y = remove_cell(x, m, fill="mean")
    assert torch.equal(y[~cell], x[~cell])
    bg_mean = torch.stack([x[0, c][m[0, 0] == 0].mean() for c in range(3)])
    assert torch.allclose(y[0, :, 5, 5], bg_mean, atol=1e-6)
    assert torch.all(y[2] == 0.5)
    z = remove_cell(x, m, fill="constant", value=0.25)
    assert torch.equal(z, background_removal(x, 1 - m, fill="constant", value=0.25))
    assert torch.all(z[cell] == 0.25)
    with pytest.raises(DiagnosticError, match="fill"):
        remove_cell(x, m, fill="noise")


# -- the registered diagnostic on the synthetic benchmark ---------------------------------------
class PixelStats(nn.Module):
    """12 features: per-channel mean, std and log high-frequency (Laplacian) energy, and the
    high-frequency correlations between channels: where the `noise` mechanism's fixed-pattern
    noise shows (amplitude and channel correlation per field)."""

    def forward(self, x):
        lap = 4 * x[..., 1:-1, 1:-1] - x[..., :-2, 1:-1] - x[..., 2:, 1:-1] - x[..., 1:-1, :-2] - x[..., 1:-1, 2:]
        hf = lap.flatten(2)
        cov = torch.einsum("ncp,ndp->ncd", hf, hf) / hf.shape[-1]
        energy = cov.diagonal(dim1=1, dim2=2) + 1e-8
        corr = cov / (energy[:, :, None] * energy[:, None, :]).sqrt()
        return torch.cat([x.mean((2, 3)), x.std((2, 3)), energy.log(), corr[:, [0, 0, 1], [1, 2, 2]]], dim=1)


class StatsNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stats = PixelStats()
        self.fc = nn.Linear(12, 3)

    def forward(self, x):
        return self.fc(self.stats(x))


def synth_context(mechanism: str, with_masks: bool = True, **kw) -> DiagnosticContext:
    """Sparse fields (3 cells in 512 px for 32 px crops) without class signal: siblings rarely
    share pixels, and a cell's outline says nothing of its field (see test_..._near_chance)."""
    cfg = dict(fields_per_class=20, crop_size=32, field_size=512, mean_cells_per_field=3, class_signal=0.0, seed=0)
    data = synthesize(SynthConfig(mechanisms=mechanism, **{**cfg, **kw}), workers=1)
    crops = CropImages(data.images, data.masks if with_masks else None, data.crop_table())
    adapter = wrap(StatsNet().eval(), head="fc", mean=0.0, std=1.0)
    side = np.where(np.arange(len(data)) % 3 == 0, 2, 0)
    return DiagnosticContext(adapter, crops, side=side)


def by(rows, setting, metric):
    (r,) = [r for r in rows if r["setting"] == setting and r["metric"] == metric]
    return r


@pytest.fixture(scope="module")
def noise_rows():
    ctx = synth_context("noise")
    return ctx, GroupIdentifiabilityDiagnostic().run(ctx)


def test_registered() -> None:
    assert "group_identifiability" in available()
    assert "group_identifiability" in available(needs="features")
    assert isinstance(get("group_identifiability"), GroupIdentifiabilityDiagnostic)


def test_rows_follow_the_schema(noise_rows) -> None:
    ctx, rows = noise_rows
    assert {(r["setting"], r["metric"]) for r in rows} == {
        (s, m) for s in ("input=crops", "input=background") for m in ("accuracy", "chance", "class_chance", "majority")
    }
    for r in rows:
        assert list(r)[: len(ROW_COLUMNS)] == list(ROW_COLUMNS)
        assert r["diagnostic"] == "group_identifiability" and r["note"] == ""
        assert r["n"] == len(ctx.parents) - r["n_singletons"]
    acc = by(rows, "input=crops", "accuracy")
    assert acc["ci_low"] <= acc["value"] <= acc["ci_high"]
    assert by(rows, "input=crops", "chance")["value"] == pytest.approx(1 / acc["n_parents"])
    assert math.isnan(by(rows, "input=crops", "chance")["ci_low"])


def test_background_features_cached_under_their_own_key(noise_rows) -> None:
    ctx, _ = noise_rows
    key = GroupIdentifiabilityDiagnostic().background_key
    assert set(ctx._features) == {"", key} and "background_removal" not in ctx._features
    assert not np.allclose(ctx._features[""], ctx._features[key])


def test_far_above_chance_under_the_noise_mechanism(noise_rows) -> None:
    _, rows = noise_rows
    for setting in ("input=crops", "input=background"):
        acc, chance = by(rows, setting, "accuracy"), by(rows, setting, "chance")["value"]
        assert acc["value"] > 6 * chance and acc["ci_low"] > 4 * chance, (setting, acc, chance)


def test_backgrounds_near_chance_under_none_with_a_plain_background() -> None:
    """`none` plants no signature and its background is plain (no tint, mottling or debris;
    i.i.d. sensor noise of one SD in every field). What remains are pixels shared by sibling
    crops (dense fields: 2-3x chance) and the cell outline left in the background, which
    carries the class (class_signal > 0: up to class chance); the sparse, class-free fields of
    `synth_context` remove both.

    One-sided (the property is "not above chance"; a draw below chance is no failure of it).
    Passes for 6 of 6 benchmark seeds tried (0-5): accuracy 0 to 1.9 x chance against the
    bound 2.5 x; interval lower end 0 to 0.0146 against chance 0.0167 (the binomial null puts
    it above chance in 2.5% of draws). The two-sided form also held, but seed 2 scored 0 of
    its crops (interval [0, 0.0211]): a hair from failing on the low side."""
    ctx = synth_context("none")
    rows = GroupIdentifiabilityDiagnostic(inputs=("background",)).run(ctx)
    acc, chance = by(rows, "input=background", "accuracy"), by(rows, "input=background", "chance")["value"]
    assert acc["ci_low"] < chance
    assert acc["value"] < 2.5 * chance


def test_without_masks_the_background_row_records_the_skip() -> None:
    ctx = synth_context("none", with_masks=False, fields_per_class=4)
    rows = GroupIdentifiabilityDiagnostic().run(ctx)
    bg = by(rows, "input=background", "accuracy")
    assert math.isnan(bg["value"]) and "no cell masks" in bg["note"] and bg["n"] == 0
    assert [r["setting"] for r in rows].count("input=background") == 1
    assert all(r["setting"] == "input=crops" for r in rows if r is not bg)


def test_subset_test_side_and_seed_from_the_context() -> None:
    ctx = synth_context("noise", fields_per_class=6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the test side leaves some parents with one crop
        rows = GroupIdentifiabilityDiagnostic(subset="test", inputs=("crops",)).run(ctx)
        gi = GroupIdentifiability(seed=ctx.seed).fit_score(ctx.features()[ctx.test_idx], ctx.parents[ctx.test_idx])
    acc = by(rows, "input=crops", "accuracy")
    assert acc["n"] == gi.n_ and acc["value"] == gi.accuracy_ and acc["n_singletons"] == gi.n_singletons_


@pytest.mark.parametrize(
    "kwargs, word",
    [({"inputs": ("cells",)}, "inputs"), ({"inputs": ()}, "inputs"), ({"fill": "noise"}, "fill"),
     ({"value": 2.0}, "value"), ({"subset": "val"}, "subset"), ({"folds": 1}, "folds")],
)
def test_diagnostic_bad_settings(kwargs, word) -> None:
    with pytest.raises(DiagnosticError, match=f"'{word}' parameter"):
        GroupIdentifiabilityDiagnostic(**kwargs)


@pytest.mark.slow
def test_random_init_cnn_features_under_noise_and_none() -> None:
    """A random-init timm test_resnet's pooled features also tell noise fields apart (less
    sharply than the pixel statistics)."""
    from shortcutlab.models.adapter import create_model

    rows = {}
    for mech in ("noise", "none"):
        ctx = synth_context(mech)
        torch.manual_seed(0)
        ctx.adapter = wrap(create_model("test_resnet", num_classes=3).eval())
        rows[mech] = GroupIdentifiabilityDiagnostic(inputs=("crops",)).run(ctx)
    noise, none = by(rows["noise"], "input=crops", "accuracy"), by(rows["none"], "input=crops", "accuracy")
    chance = by(rows["noise"], "input=crops", "chance")["value"]
    assert noise["ci_low"] > 2 * chance
    assert noise["value"] > 2 * none["value"]
