"""ParentProbe: R against scikit-learn with a hand-written fold loop, against the Bayes rate of
planted parent codes, the floor against a hand count, exclusions, folds, the interval, and the
registered diagnostic."""

from __future__ import annotations


import numpy as np
import pandas as pd
import pytest
import torch

from probes import ParentProbe, get, wilson_interval
from probes.base import DiagnosticContext
from probes.errors import DiagnosticError
from probes.parent_probe import sibling_folds
from shortcutlab import CropTable
from shortcutlab.data.images import CropImages


def planted(n_classes=3, parents_per_class=6, crops=60, dim=6, code_dim=2, strength=1.0, seed=0):
    """Parent means N(0, strength^2) on the first `code_dim` coordinates; unit noise on all."""
    rng = np.random.default_rng(seed)
    P = n_classes * parents_per_class
    parents = np.repeat(np.arange(P), crops)
    labels = parents % n_classes
    mu = np.zeros((P, dim))
    mu[:, :code_dim] = strength * rng.normal(size=(P, code_dim))
    X = mu[parents] + rng.normal(size=(len(parents), dim))
    return X, labels, parents, mu


def bayes_within_class(mu, n_classes, code_dim, n=200_000, seed=1):
    """Monte Carlo accuracy of the nearest true mean among the parents of the crop's class."""
    rng = np.random.default_rng(seed)
    P = len(mu)
    p = rng.integers(0, P, n)
    x = mu[p, :code_dim] + rng.normal(size=(n, code_dim))
    correct = 0
    for c in range(n_classes):
        cand = np.arange(c, P, n_classes)
        m = p % n_classes == c
        d = ((x[m, None, :] - mu[cand, None, :code_dim].transpose(1, 0, 2)) ** 2).sum(-1)
        correct += int((cand[d.argmin(1)] == p[m]).sum())
    return correct / n


# ------------------------------------------------------------------------------ references
@pytest.mark.parametrize("Cs", [0.5, (0.1, 1.0)], ids=["fixed-C", "inner-split"])
def test_matches_sklearn_with_a_hand_written_fold_loop(Cs) -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(3)
    parents = np.repeat(np.arange(10), [4, 5, 6, 4, 5, 6, 4, 5, 6, 5])
    labels = np.where(parents < 5, "a", "b")
    X = rng.normal(size=(10, 4))[parents] + rng.normal(size=(len(parents), 4))
    k = 4
    probe = ParentProbe(n_folds=k, Cs=Cs, tol=1e-6, max_iter=1000, random_state=0).fit(X, labels, parents)
    folds = probe.folds_
    Cs_list = [Cs] if np.isscalar(Cs) else sorted(Cs)

    def fit(rows, C):
        return make_pipeline(StandardScaler(), LogisticRegression(C=C, tol=1e-8, max_iter=10_000)).fit(X[rows], parents[rows])

    pred = np.full(len(parents), -1)
    with threadpool_limits(1):  # tiny fits: waking OpenMP threads costs more than the fit
        loop(X, labels, parents, folds, k, Cs_list, fit, pred)
    assert (folds >= 0).all()
    np.testing.assert_array_equal(probe.predicted_.astype(int), pred)
    assert probe.R_ == pytest.approx((pred == parents).mean(), abs=0)


def loop(X, labels, parents, folds, k, Cs_list, fit, pred) -> None:
    """The reference: per class and fold, C by the inner split of the docstring, then refit."""
    for c in np.unique(labels):
        in_c = labels == c
        for f in range(k):
            te = np.flatnonzero(in_c & (folds == f))
            tr = np.flatnonzero(in_c & (folds != f) & (folds >= 0))
            C = Cs_list[0]
            if len(Cs_list) > 1:
                g = (f + k // 2) % k
                inner_tr = np.flatnonzero(in_c & ~np.isin(folds, (f, g)) & (folds >= 0))
                va = np.flatnonzero(in_c & (folds == g) & np.isin(parents, parents[inner_tr]))
                accs = [(fit(inner_tr, C_).predict(X[va]) == parents[va]).mean() for C_ in Cs_list]
                C = Cs_list[int(np.argmax(accs))]
            pred[te] = fit(tr, C).predict(X[te])


@pytest.mark.parametrize("strength", [0.6, 1.5])
def test_R_matches_the_bayes_rate_of_a_planted_code(strength) -> None:
    X, labels, parents, mu = planted(strength=strength)
    bayes = bayes_within_class(mu, 3, 2)
    probe = ParentProbe(random_state=0).fit(X, labels, parents)
    # 1,080 scored crops: binomial SE about 1.5 pp; the probe estimates 6 means from 45 crops.
    assert probe.R_ == pytest.approx(bayes, abs=0.05)
    assert probe.R_ <= bayes + 0.03
    assert probe.floor_ == pytest.approx(1 / 6)


def test_random_features_stay_near_the_floor() -> None:
    rng = np.random.default_rng(0)
    parents = np.repeat(np.arange(40), 8)
    labels = parents % 4
    probe = ParentProbe(random_state=0).fit(rng.normal(size=(320, 16)), labels, parents)
    assert probe.floor_ == pytest.approx(0.1)
    assert abs(probe.above_floor_) < 0.07  # SE about 1.7 pp


# ------------------------------------------------------------------------------ floor and exclusions
def hand_table():
    #          class a: p1 x3, p2 x2, p9 x1 | class b: p3 x4, p4 x2, p5 x2 | class c: p6 x3, p7 x1
    parents = ["p1"] * 3 + ["p2"] * 2 + ["p9"] + ["p3"] * 4 + ["p4"] * 2 + ["p5"] * 2 + ["p6"] * 3 + ["p7"]
    labels = ["a"] * 6 + ["b"] * 8 + ["c"] * 4
    return np.array(labels), np.array(parents)


def test_floor_and_exclusions_match_a_hand_count() -> None:
    labels, parents = hand_table()
    X = np.random.default_rng(0).normal(size=(len(labels), 3))
    with pytest.warns(UserWarning, match="5 crop"):
        probe = ParentProbe(n_folds=2, Cs=1.0).fit(X, labels, parents)
    # The floor out of sample on the 2 folds, by hand, whatever the folds drawn: class a (p1 x3
    # split 2 + 1, p2 x2 split 1 + 1): scoring the fold with 2 p1, the other fold's tie p1 = p2 = 1
    # names either, expected (2 + 1) / 2 = 1.5 correct; scoring the other, p1 (2 in training) is
    # named, 1 correct. Class b (p3 x4, p4 x2, p5 x2, each split evenly): p3 is named, 2 + 2
    # correct. (1.5 + 1 + 4) / 13 = 0.5, where the in-sample floor was (3 + 4) / 13.
    assert probe.floor_ == pytest.approx(6.5 / 13)
    assert probe.n_scored_ == 13
    assert probe.n_singleton_parents_ == 2  # p9, p7
    assert probe.n_single_parent_classes_ == 1  # c: only p6 has two crops
    assert probe.n_excluded_ == 5
    assert probe.above_floor_ == pytest.approx(probe.R_ - 6.5 / 13)
    pc = probe.per_class_.set_index("class")
    assert pc.loc["a", ["n_scored", "n_parents", "n_excluded"]].tolist() == [5, 2, 1]
    assert pc.loc["b", ["n_scored", "n_parents", "n_excluded"]].tolist() == [8, 3, 0]
    assert pc.loc["a", "floor"] == pytest.approx(2.5 / 5) and pc.loc["b", "floor"] == pytest.approx(4 / 8)
    assert not pc.loc["c", "probed"] and pc.loc["c", "n_excluded"] == 4 and np.isnan(pc.loc["c", "R"])
    # R is the crop-weighted mean of the per-class accuracies.
    assert probe.R_ == pytest.approx((5 * pc.loc["a", "R"] + 8 * pc.loc["b", "R"]) / 13)
    excluded = probe.folds_ < 0
    assert set(parents[excluded]) == {"p9", "p6", "p7"}
    assert all(p is None for p in probe.predicted_[excluded]) and not probe.correct_[excluded].any()


def unequal_parents(seed=0, strength=3.0):
    """Two classes of four parents with 20, 13, 7 and 4 crops: no two parents tie in any
    training part of 4 sibling folds (15 / 10 / 5 / 3 crops, give or take one); a strong
    parent code on 4 of 8 coordinates."""
    rng = np.random.default_rng(seed)
    sizes = [20, 13, 7, 4]
    parents = np.concatenate([np.full(n, c * 4 + j) for c in range(2) for j, n in enumerate(sizes)])
    labels = parents // 4
    X = rng.normal(size=(len(parents), 8))
    X[:, :4] += strength * rng.normal(size=(8, 4))[parents]
    return X, labels, parents


def in_sample_floor(labels, parents) -> float:
    """The old floor, by hand: the largest parent's crops over all crops, per class."""
    df = pd.DataFrame({"c": labels, "p": parents})
    return df.groupby(["c", "p"]).size().groupby(level=0).max().sum() / len(df)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_floor_is_a_class_only_predictor_out_of_sample(seed) -> None:
    """scikit-learn's DummyClassifier(most_frequent), fitted on each class's training folds and
    scored on the held-out fold (the probe's own folds), gives the floor exactly; the in-sample
    floor is higher."""
    from sklearn.dummy import DummyClassifier

    X, labels, parents = unequal_parents(seed)
    probe = ParentProbe(n_folds=4, Cs=1.0, random_state=seed).fit(X, labels, parents)
    correct = 0
    for c in np.unique(labels):
        for f in range(4):
            tr, te = (labels == c) & (probe.folds_ != f), (labels == c) & (probe.folds_ == f)
            dummy = DummyClassifier(strategy="most_frequent").fit(np.zeros((tr.sum(), 1)), parents[tr])
            correct += int((dummy.predict(np.zeros((te.sum(), 1))) == parents[te]).sum())
    assert probe.floor_ == pytest.approx(correct / len(labels), abs=1e-12)
    # One parent far ahead: it is the largest in every training part, so here (and only where
    # no parent comes close) the out-of-sample floor equals the in-sample one.
    assert probe.floor_ == pytest.approx(in_sample_floor(labels, parents))


def equal_parents(seed=0, strength=3.0):
    """Two classes of 12 parents with 6 crops each and a strong parent code."""
    rng = np.random.default_rng(seed)
    parents = np.repeat(np.arange(24), 6)
    labels = parents % 2
    X = rng.normal(size=(144, 8))
    X[:, :4] += strength * rng.normal(size=(24, 4))[parents]
    return X, labels, parents


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_floor_of_equal_parents_by_hand(seed) -> None:
    """6 crops in 4 sibling folds: every parent has 1 crop in two folds and 2 in the other two.
    Scoring fold f, the parents with the most training crops (5) are exactly those with 1 crop
    in f: the class-only predictor names one of them and gets 1 crop right, per class and
    fold. Floor = 2 classes x 4 folds x 1 / 144 crops, where the in-sample floor is 1/12."""
    X, labels, parents = equal_parents(seed)
    probe = ParentProbe(n_folds=4, Cs=1.0, random_state=seed).fit(X, labels, parents)
    assert probe.floor_ == pytest.approx(8 / 144, abs=1e-12)
    assert probe.per_class_["floor"].tolist() == pytest.approx([4 / 72, 4 / 72])
    assert in_sample_floor(labels, parents) == pytest.approx(1 / 12)


def test_a_probe_that_learned_only_the_class_prior_sits_at_the_floor() -> None:
    """Features with the parent code erased entirely (constant): the probe keeps only its
    intercepts and names a largest training parent of the class (every one of them has 1 crop
    in the scored fold), so R is the out-of-sample floor and the removed share is 1, where the
    in-sample floor made it exceed 1."""
    from probes import DiagnosticWarning
    from probes.before_after import outcome

    X, labels, parents = equal_parents(0, strength=1.0)
    before = ParentProbe(n_folds=4, Cs=1.0).fit(X, labels, parents)
    with pytest.warns(DiagnosticWarning, match="constant"):
        after = ParentProbe(n_folds=4, Cs=1.0).fit(np.zeros_like(X), labels, parents)
    assert after.R_ == pytest.approx(after.floor_, abs=1e-12) and after.floor_ == before.floor_
    assert before.R_ > before.floor_ + 0.15
    out = outcome(before, after, {"t": 1.0}, {"t": 1.0}, "t", 0.25, 0.01)
    assert out["removed_share"] == pytest.approx(1.0, abs=1e-12)
    old = in_sample_floor(labels, parents)
    assert (before.R_ - after.R_) / (before.R_ - old) > 1.05  # what the in-sample floor reported (> 1)


def test_a_parent_split_across_classes_is_probed_per_class() -> None:
    # p1 holds crops of both classes: two cells, each probed in its own class.
    labels = np.array(["a"] * 4 + ["b"] * 4 + ["a"] * 2 + ["b"] * 2)
    parents = np.array(["p1"] * 4 + ["p1"] * 4 + ["p2"] * 2 + ["p3"] * 2)
    X = np.random.default_rng(0).normal(size=(12, 3))
    probe = ParentProbe(n_folds=2, Cs=1.0).fit(X, labels, parents)
    assert probe.n_excluded_ == 0 and probe.n_parents_ == 4
    assert probe.floor_ == pytest.approx(8 / 12)


def test_nothing_to_probe_is_an_error() -> None:
    X = np.zeros((4, 2))
    with pytest.raises(DiagnosticError, match="nothing to probe"):
        ParentProbe(Cs=1.0).fit(X, ["a", "a", "b", "b"], ["p", "q", "r", "s"])


# ------------------------------------------------------------------------------ folds, interval
def test_sibling_folds_keep_a_sibling_in_every_training_set() -> None:
    rng = np.random.default_rng(0)
    cells = rng.integers(0, 50, 400)
    for k in (2, 3, 4, 5):
        folds = sibling_folds(cells, k, 0)
        counts = np.bincount(cells, minlength=50)
        assert ((folds == -1) == (counts[cells] < 2)).all()
        for f in range(k):
            held = np.unique(cells[folds == f])
            kept = np.unique(cells[(folds != f) & (folds >= 0)])
            assert np.isin(held, kept).all()
        sizes = np.bincount(folds[folds >= 0], minlength=k)
        assert sizes.max() - sizes.min() <= 0.25 * sizes.mean()


def test_wilson_interval_matches_scipy() -> None:
    from scipy.stats import binomtest

    for k, n in [(0, 10), (3, 10), (250, 1000), (10, 10)]:
        ci = binomtest(k, n).proportion_ci(confidence_level=0.9, method="wilson")
        assert wilson_interval(k, n, 0.9) == pytest.approx((ci.low, ci.high), abs=1e-12)


def test_the_inner_split_never_sees_the_scored_fold() -> None:
    X, labels, parents, _ = planted(n_classes=2, parents_per_class=5, crops=8, dim=4)
    masks = []

    def cross_fit(mask):
        masks.append(mask.copy())
        return X

    probe = ParentProbe(n_folds=4, random_state=0).fit(X, labels, parents, cross_fit=cross_fit)
    folds = probe.folds_
    # 2 inner pairs ({0, 2}, {1, 3}), then 4 outer folds.
    assert len(masks) == 6
    for pair, mask in zip([(0, 2), (1, 3)], masks[:2]):
        assert not mask[np.isin(folds, pair)].any() and mask[~np.isin(folds, pair)].all()
    for f, mask in enumerate(masks[2:]):
        assert not mask[folds == f].any() and mask[folds != f].all()
    assert set(probe.C_["C"]) <= {0.01, 0.1, 1.0} and len(probe.C_) == 8


def test_torch_float32_features_give_the_same_R() -> None:
    X, labels, parents, _ = planted(n_classes=2, parents_per_class=5, crops=10, dim=4)
    a = ParentProbe(Cs=1.0).fit(X, labels, parents)
    b = ParentProbe(Cs=1.0).fit(torch.from_numpy(X.astype(np.float32)), labels, parents)
    assert a.R_ == pytest.approx(b.R_, abs=0.02)


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(n_folds=2), "n_folds"), (dict(Cs=()), "Cs"), (dict(Cs=-1.0), "Cs"), (dict(confidence=1.0), "confidence")],
)
def test_bad_settings_are_named(kwargs, match) -> None:
    with pytest.raises(DiagnosticError, match=match):
        ParentProbe(**kwargs).fit(np.zeros((4, 2)), [0, 0, 1, 1], [0, 0, 1, 1])


# ------------------------------------------------------------------------------ diagnostic
def context_with_features(X, labels, parents, side=None) -> DiagnosticContext:
    n = len(labels)
    df = pd.DataFrame({"id": [f"c{i:05d}" for i in range(n)], "label": [str(v) for v in labels], "parent": [f"p{v}" for v in parents]})
    table = CropTable.from_frame(df, id="id", label="label", parent="parent")
    crops = CropImages(torch.zeros(n, 3, 4, 4, dtype=torch.uint8), None, table)
    ctx = DiagnosticContext(adapter=None, crops=crops, side=np.zeros(n, dtype=int) if side is None else side)
    ctx._features[""] = np.asarray(X, dtype=np.float32)  # the feature cache, filled as extract_features would
    return ctx


def test_registered_diagnostic_emits_tidy_rows() -> None:
    from probes import ROW_COLUMNS

    X, labels, parents, _ = planted(n_classes=2, parents_per_class=5, crops=8, dim=4, strength=2.0)
    ctx = context_with_features(X, labels, parents)
    diag = get("parent_probe", Cs=1.0)
    assert diag.needs == frozenset({"features"}) and diag.missing(ctx) is None
    rows = diag.run(ctx)
    by = {(r["metric"], r["setting"]): r for r in rows}
    probe = ParentProbe(Cs=1.0, random_state=0).fit(X, labels, parents)
    assert by[("R", "on=all")]["value"] == pytest.approx(probe.R_)
    assert (by[("R", "on=all")]["ci_low"], by[("R", "on=all")]["ci_high"]) == pytest.approx(probe.ci_)
    assert by[("floor", "on=all")]["value"] == pytest.approx(0.2)
    assert by[("above_floor", "on=all")]["n"] == 80
    assert ("R", "on=all,class=0") in by and ("floor", "on=all,class=1") in by
    assert all(set(ROW_COLUMNS) <= set(r) for r in rows)


def test_diagnostic_on_a_missing_side_names_it() -> None:
    X, labels, parents, _ = planted(n_classes=2, parents_per_class=5, crops=4, dim=3)
    ctx = context_with_features(X, labels, parents)
    with pytest.raises(DiagnosticError, match="no test crops"):
        get("parent_probe", on="test").run(ctx)


# ------------------------------------------------------------------------------ constant features
def test_constant_features_are_warned_and_counted() -> None:
    """All columns constant: the features carry nothing. Standardised to zero, the probe keeps its
    intercept only and names each class's largest training parent: by hand, with 3 folds each
    training set holds 4 crops of p1 (p3) and 2 of p2 (p4), so every crop is called p1 (p3) and
    R = 12 / 18 = the floor. The warning says so and the record counts the columns."""
    import warnings

    from probes import DiagnosticWarning
    from probes.parent_probe import probe_rows

    parents = np.array(["p1"] * 6 + ["p2"] * 3 + ["p3"] * 6 + ["p4"] * 3)
    labels = np.array(["a"] * 9 + ["b"] * 9)
    X = np.full((18, 2), 3.5)
    with pytest.warns(DiagnosticWarning, match="all 2 feature column"):
        probe = ParentProbe(n_folds=3, Cs=1.0).fit(X, labels, parents)
    assert probe.n_constant_features_ == 2
    assert probe.R_ == pytest.approx(12 / 18) and probe.floor_ == pytest.approx(12 / 18)
    rows = {r["metric"]: r["value"] for r in probe_rows(None, "parent_probe", probe, per_class=False)}
    assert rows["n_constant_features"] == 2
    # One constant column among three: counted, not warned (dead channels are common).
    X2 = np.random.default_rng(0).normal(size=(18, 3))
    X2[:, 1] = -1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiagnosticWarning)
        probe2 = ParentProbe(n_folds=3, Cs=1.0).fit(X2, labels, parents)
    assert probe2.n_constant_features_ == 1
