"""LeaceErasure against concept-erasure's own eraser, rank-r erasure, float64 fitting, an
independent scikit-learn probe after erasure, class information within class, cross-fitting
(R after erasure at the floor, not under it), the refitted head and the check."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from probes import LeaceErasure, ParentProbe, erasure_check, get, refit_head
from probes.parent_probe import sibling_folds
from test_probes_parent_probe import context_with_features


@pytest.fixture(autouse=True)
def _one_blas_thread():
    """Tiny fits: waking BLAS / OpenMP threads on a loaded machine costs more than the fit."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        yield


def planted(n_classes=3, ppc=6, crops=20, dim=32, code_dim=2, strength=2.0, class_strength=3.0, seed=0):
    """Parent code N(0, strength^2) on coordinates [0, code_dim); class code on the next
    n_classes coordinates (orthogonal to it); unit noise everywhere."""
    rng = np.random.default_rng(seed)
    P = n_classes * ppc
    parents = np.repeat(np.arange(P), crops)
    labels = parents % n_classes
    mu = np.zeros((P, dim))
    mu[:, :code_dim] = strength * rng.normal(size=(P, code_dim))
    cc = np.zeros((n_classes, dim))
    cc[:, code_dim : code_dim + n_classes] = class_strength * np.eye(n_classes)
    X = mu[parents] + cc[labels] + rng.normal(size=(len(parents), dim))
    return X, labels, parents


def library_eraser(X, parents, labels=None, svd_tol=1e-6):
    """concept-erasure's own eraser on an independently built concept (pandas one-hot)."""
    from concept_erasure import LeaceFitter

    z = np.array(pd.get_dummies(pd.Series(parents)).to_numpy(dtype=np.float64))
    if labels is not None:
        z = z - pd.DataFrame(z).groupby(np.asarray(labels)).transform("mean").to_numpy()
    fitter = LeaceFitter.fit(torch.from_numpy(np.array(X, dtype=np.float64)), torch.from_numpy(z), svd_tol=svd_tol)
    return fitter.eraser


# ------------------------------------------------------------------------------ the eraser
@pytest.mark.parametrize("within_class", [False, True])
@pytest.mark.parametrize("svd_tol", [1e-6, 0.01])
def test_full_rank_equals_concept_erasures_eraser(within_class, svd_tol) -> None:
    X, labels, parents = planted(ppc=4, crops=10, dim=40)
    ours = LeaceErasure(within_class=within_class, svd_tol=svd_tol).fit(X, parents, labels)
    lib = library_eraser(X, parents, labels if within_class else None, svd_tol=svd_tol)
    ref = lib(torch.from_numpy(X)).numpy()
    np.testing.assert_allclose(ours.transform(X), ref, atol=1e-6, rtol=0)
    np.testing.assert_allclose(ours.eraser_.P.numpy(), lib.P.numpy(), atol=1e-6, rtol=0)
    assert ours.rank_ == int((ours.singular_values_ > svd_tol).sum())


@pytest.mark.parametrize("rank", [1, 2, 5])
def test_rank_r_changes_exactly_r_directions(rank) -> None:
    X, labels, parents = planted(ppc=4, crops=10, dim=24)
    er = LeaceErasure(rank=rank, within_class=True).fit(X, parents, labels)
    delta = X - er.transform(X)
    s = np.linalg.svd(delta, compute_uv=False)
    assert er.rank_ == rank
    assert int((s > 1e-8 * s[0]).sum()) == rank
    # The kept directions are the top ones: rank = all available equals full erasure.
    full = LeaceErasure(within_class=True).fit(X, parents, labels)
    top = LeaceErasure(rank=full.rank_, within_class=True).fit(X, parents, labels)
    np.testing.assert_allclose(top.transform(X), full.transform(X), atol=1e-10)


def test_float32_input_is_fitted_in_float64() -> None:
    X, labels, parents = planted(ppc=4, crops=10, dim=24)
    X32 = X.astype(np.float32)
    a = LeaceErasure(rank=3).fit(X32, parents)
    b = LeaceErasure(rank=3).fit(X32.astype(np.float64), parents)
    assert a.fitter_.sigma_xx_.dtype == torch.float64 and a.eraser_.proj_left.dtype == torch.float64
    np.testing.assert_array_equal(a.eraser_.P.numpy(), b.eraser_.P.numpy())
    out = a.transform(X32)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, b.transform(X32.astype(np.float64)), atol=1e-5)
    t = a.transform(torch.from_numpy(X32))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32


# ------------------------------------------------------------------------------ after erasure
def halves(parents):
    """Each parent's crops split in two halves: fit on A, score on B."""
    return sibling_folds(parents, 2, 0) == 0


def within_class_accuracy(Xa, Xb, labels_a, labels_b, parents_a, parents_b) -> float:
    from sklearn.linear_model import LogisticRegression

    correct = 0
    for c in np.unique(labels_a):
        a, b = labels_a == c, labels_b == c
        clf = LogisticRegression(C=1.0, max_iter=2000).fit(Xa[a], parents_a[a])
        correct += int((clf.predict(Xb[b]) == parents_b[b]).sum())
    return correct / len(labels_b)


def test_no_linear_probe_beats_the_floor_and_the_class_code_survives() -> None:
    from sklearn.linear_model import LogisticRegression

    X, labels, parents = planted(seed=1)
    A = halves(parents)
    B = ~A
    floor = 1 / 6
    se = np.sqrt(floor * (1 - floor) / B.sum())
    before = within_class_accuracy(X[A], X[B], labels[A], labels[B], parents[A], parents[B])
    assert before > floor + 5 * se  # the planted code is there to remove
    cls_before = LogisticRegression(max_iter=2000).fit(X[A], labels[A]).score(X[B], labels[B])
    assert cls_before > 0.9

    # Full erasure within class, and erasure of the top 2 directions (the planted code's).
    for rank in (None, 2):
        er = LeaceErasure(rank=rank, within_class=True).fit(X[A], parents[A], labels[A])
        XA, XB = er.transform(X[A]), er.transform(X[B])
        after = within_class_accuracy(XA, XB, labels[A], labels[B], parents[A], parents[B])
        assert after <= floor + 3 * se, rank
        if rank == 2:
            # The class code, orthogonal to the parent code, survives. (Full erasure of an
            # 18-parent concept also removes 13 sampling-noise directions of the 32, which
            # overlap the class code: it costs class accuracy, as on real features.)
            cls_after = LogisticRegression(max_iter=2000).fit(XA, labels[A]).score(XB, labels[B])
            assert cls_after >= cls_before - 0.02
    # Without the residualisation the class means are parent-mean differences: erased too.
    er_all = LeaceErasure(within_class=False).fit(X[A], parents[A], labels[A])
    cls_lost = LogisticRegression(max_iter=2000).fit(er_all.transform(X[A]), labels[A]).score(er_all.transform(X[B]), labels[B])
    assert cls_lost < 0.5


def test_cross_fitted_R_lands_at_the_floor_not_under_it() -> None:
    X, labels, parents = planted(seed=2)
    probe = ParentProbe(random_state=0)
    before = ParentProbe(random_state=0).fit(X, labels, parents)
    se = np.sqrt(before.floor_ * (1 - before.floor_) / before.n_scored_)

    def erased(mask):
        return LeaceErasure(within_class=True).fit(X[mask], parents[mask], labels[mask]).transform(X)

    after = ParentProbe(random_state=0).fit(X, labels, parents, cross_fit=erased)
    assert before.R_ > before.floor_ + 5 * se
    assert before.floor_ - 2 * se <= after.R_ <= before.floor_ + 3 * se
    # The artefact the cross-fitting avoids: an eraser fitted on the scored crops themselves.
    in_sample = probe.fit(LeaceErasure(within_class=True).fit(X, parents, labels).transform(X), labels, parents)
    assert in_sample.R_ < before.floor_ - 3 * se


# ------------------------------------------------------------------------------ refitted head
def test_refit_head_folds_eraser_standardisation_and_head() -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    X, labels, parents = planted(seed=3)
    A = halves(parents)
    er = LeaceErasure(rank=2, within_class=True).fit(X[A], parents[A], labels[A])
    res = refit_head(None, X[A], labels[A], {"B": (X[~A], labels[~A])}, eraser=er, C=0.5, tol=1e-8)
    sc = StandardScaler().fit(er.transform(X[A]))
    ref = LogisticRegression(C=0.5, tol=1e-10, max_iter=10_000).fit(sc.transform(er.transform(X[A])), labels[A])
    expect = ref.decision_function(sc.transform(er.transform(X[~A])))
    with torch.no_grad():
        got = res.head(torch.from_numpy(X[~A].astype(np.float32))).numpy()
    np.testing.assert_allclose(got, expect, atol=2e-3)
    assert res.accuracy["B"] == pytest.approx(ref.score(sc.transform(er.transform(X[~A])), labels[~A]))
    assert res.n == {"B": int((~A).sum())}


def test_refit_head_installs_into_an_adapter_and_restores_it() -> None:
    from shortcutlab.models.adapter import create_model, wrap

    torch.manual_seed(0)
    adapter = wrap(create_model("test_resnet", num_classes=3)).eval()
    D = adapter.num_features
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(2), 20)  # class 2 absent from training: never predicted
    F = rng.normal(size=(40, D)).astype(np.float32) + 2 * y[:, None]
    original = adapter.head
    state = {k: v.clone() for k, v in original.state_dict().items()}
    res = refit_head(adapter, F, y, {"train": (F, y)})
    assert res.head.out_features == 3 and res.accuracy["train"] == 1.0
    x = torch.rand(2, 3, 32, 32)
    with res.installed(adapter):
        assert adapter.head is res.head
        with torch.no_grad():
            logits = adapter.logits(x)
            np.testing.assert_allclose(logits.numpy(), res.head(adapter.features(x)).numpy(), atol=1e-5)
        assert (logits.argmax(1) != 2).all()
    assert adapter.head is original
    assert all(torch.equal(v, original.state_dict()[k]) for k, v in state.items())


# ------------------------------------------------------------------------------ the check
def test_erasure_check_reports_R_cost_and_the_verdict() -> None:
    X, labels, parents = planted(seed=4)
    rng = np.random.default_rng(0)
    test = rng.random(len(labels)) < 0.3
    idx = np.arange(len(labels))
    chk = erasure_check(X, labels, parents, train_idx=idx[~test], test_sets={"test": idx[test]}, rank=2, max_cost=0.05)
    assert chk.R_before > chk.floor + 0.1 and chk.floor == pytest.approx(1 / 6)
    assert chk.removed_share > 0.5
    assert chk.removed_share == pytest.approx((chk.above_floor_before - chk.above_floor_after) / chk.above_floor_before)
    assert chk.cost == pytest.approx(chk.accuracy_before["test"] - chk.accuracy_after["test"])
    assert chk.n_directions == 2 and chk.passed
    strict = erasure_check(X, labels, parents, train_idx=idx[~test], test_sets={"test": idx[test]}, rank=2, min_removed=0.99,
                           probe_before=chk.probe_before)
    assert not strict.passed and strict.R_before == chk.R_before


def test_erasure_check_with_nothing_above_the_floor_warns_and_fails() -> None:
    # Features that carry the class only: every probe predicts its training folds' largest
    # parent, so R sits on the (out-of-sample) class-only floor and there is nothing to erase.
    from probes.errors import DiagnosticWarning

    X, labels, parents = planted(strength=0.0, seed=2)
    X = np.eye(3)[labels] * 3.0
    rng = np.random.default_rng(0)
    test = rng.random(len(labels)) < 0.3
    idx = np.arange(len(labels))
    with pytest.warns(DiagnosticWarning, match="erasure_check: R .* is not above the class-only floor"):
        chk = erasure_check(X, labels, parents, train_idx=idx[~test], test_sets={"test": idx[test]}, rank=1,
                            max_cost=0.05)
    assert chk.above_floor_before <= 0
    assert np.isnan(chk.removed_share) and not chk.passed


def test_leace_diagnostic_rows() -> None:
    X, labels, parents = planted(ppc=4, crops=10, seed=5)
    side = np.where(np.random.default_rng(0).random(len(labels)) < 0.3, 2, 0)
    ctx = context_with_features(X, labels, parents, side=side)
    diag = get("leace", ranks=(2, None), Cs=1.0, max_cost=0.5)
    assert diag.needs == frozenset({"features", "split"})
    rows = diag.run(ctx)
    by = {(r["metric"], r["setting"]): r for r in rows}
    for s in ("rank=2", "rank=full"):
        for m in ("R", "R_after", "floor", "above_floor", "above_floor_after", "removed_share", "n_directions"):
            assert (m, s) in by, (m, s)
        for m in ("accuracy_before", "accuracy_after", "accuracy_cost"):
            assert (m, f"{s},test_set=test") in by
        assert by[("check_passed", f"{s},test_set=test")]["value"] in (0.0, 1.0)
    assert by[("n_directions", "rank=2")]["value"] == 2
    assert by[("R_after", "rank=full")]["value"] < by[("R", "rank=full")]["value"]
