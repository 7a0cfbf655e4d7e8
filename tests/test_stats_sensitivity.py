"""shortcutlab.stats.sensitivity against independent references: a brute-force enumeration of
sign patterns written here, scipy's one-sample and paired t, a Monte Carlo estimate of the
Satterthwaite df, the primary estimates of `leak_effect`, `intervention_effect` and
`protocol_effect`, rejection rates under a planted null, and a planted logit effect."""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from shortcutlab.stats import StatsWarning, intervention_effect, leak_effect, protocol_effect, simulate_factorial
from shortcutlab.stats.sensitivity import (
    SENSITIVITY_COLUMNS,
    binomial_glmm,
    primary_contrasts,
    seed_differences,
    sensitivity_table,
    sign_flip_test,
    weighted_t,
)
from shortcutlab.stats.predictions import check_predictions


#: Seeds of the Monte Carlo tests: the first in the default suite, the rest (each margin held
#: for all of them) marked slow.
SEEDS = [0] + [pytest.param(s, marks=pytest.mark.slow) for s in range(1, 6)]


def crossed(rng, n_seeds=10, n_parents=30, crops=4, archs=2, effect=0.0, sd_parent=0.8, sd_seed=0.3, sd_model=0.2,
            mu=1.0) -> pd.DataFrame:
    """A contrast frame (seed, parent, correct, unit, term, sign) from a logit model with crossed
    parent and seed effects, a model effect per (seed, arch, exposure), and a leak effect
    `effect` on the logit scale; every seed scores every crop (a balanced design)."""
    b = rng.normal(0, sd_parent, n_parents)
    parent = np.repeat(np.arange(n_parents), crops)
    m = len(parent)
    S = np.repeat(np.arange(n_seeds), archs * 2 * m)
    A = np.tile(np.repeat(np.arange(archs), 2 * m), n_seeds)
    E = np.tile(np.repeat([1, 0], m), n_seeds * archs)
    eta = (np.tile(mu + b[parent], n_seeds * archs * 2) + np.repeat(rng.normal(0, sd_model, n_seeds * archs * 2), m)
           + rng.normal(0, sd_seed, n_seeds)[S] + effect * E)
    y = (rng.random(len(eta)) < 1 / (1 + np.exp(-eta))).astype(float)
    P = np.tile(parent, n_seeds * archs * 2)
    return pd.DataFrame({"seed": S, "parent": P, "correct": y, "unit": A, "term": E, "sign": 2.0 * E - 1})


def brute_sign_flip(d, w) -> float:
    """Two-sided sign-flip p by enumerating every pattern with itertools (the reference)."""
    t = abs(sum(wi * di for wi, di in zip(w, d)))
    hits = total = 0
    for signs in itertools.product((1, -1), repeat=len(d)):
        total += 1
        hits += abs(sum(s * wi * di for s, wi, di in zip(signs, w, d))) >= t - 1e-12
    return hits / total


# --- the sign-flip test -------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_sign_flip_exact_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    d = rng.normal(0.01, 0.02, 6)
    w = rng.uniform(0.5, 2, 6)
    w /= w.sum()
    for weights in (w, np.full(6, 1 / 6)):
        got = sign_flip_test(d, weights)
        assert got["exact"] and got["n_patterns"] == 64
        assert got["p_value"] == pytest.approx(brute_sign_flip(d, weights), abs=1e-12)


def test_sign_flip_ties_and_extremes_by_hand():
    # all positive: only the identity and the all-flipped pattern reach |T|: p = 2 / 2^S
    assert sign_flip_test([0.1, 0.2, 0.3, 0.4])["p_value"] == pytest.approx(2 / 16)
    # d = (1, -1): T = 0, every pattern has |T_e| >= 0: p = 1
    assert sign_flip_test([1.0, -1.0])["p_value"] == 1.0
    # equal differences tie in |T_e| (float sums in any order): (1, 1, 1) -> patterns +++ and --- only
    assert sign_flip_test([0.1, 0.1, 0.1])["p_value"] == pytest.approx(2 / 8)


@pytest.mark.parametrize("seed", range(3))
def test_sign_flip_monte_carlo_agrees_with_enumeration(seed):
    rng = np.random.default_rng(100 + seed)
    d = rng.normal(0.004, 0.01, 12)
    exact = brute_sign_flip(d, np.full(12, 1 / 12))
    mc = sign_flip_test(d, max_exact=10, n_flips=20_000, seed=seed)
    assert not mc["exact"] and mc["n_patterns"] == 20_000
    se = np.sqrt(exact * (1 - exact) / 20_000)
    assert abs(mc["p_value"] - exact) < 5 * se + 1e-4


# --- the t-test ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_balanced_t_equals_scipy_ttest_1samp(seed):
    d = np.random.default_rng(seed).normal(0.01, 0.02, 7)
    got = weighted_t(d)
    ref = sps.ttest_1samp(d, 0.0)
    assert got["statistic"] == pytest.approx(ref.statistic, rel=1e-10)
    assert got["p_value"] == pytest.approx(ref.pvalue, rel=1e-9)
    assert got["df"] == pytest.approx(6.0, abs=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
def test_unbalanced_df_matches_monte_carlo_satterthwaite_and_rejects_at_alpha(seed):
    """With unequal weights (a seed at half weight, the others within 20%: unequal crop counts,
    a seed missing one architecture's cell) the variance estimate is unbiased for Var(m), its df
    equal 2 E[V]^2 / Var[V] by simulation (iid normal seeds), and the t rejects a true null at
    about 5%. With 8-fold weight ratios it stays valid but is conservative (measured 2.7%)."""
    rng = np.random.default_rng(seed)
    for w, lo, hi in ((np.array([1, 1.2, 0.9, 1.1, 1, 1, 0.8, 0.5]), 0.035, 0.065),
                      (np.array([1, 1, 1, 2, 2, 3, 4, 0.5]), 0.01, 0.06)):
        w = w / w.sum()
        df = weighted_t(rng.normal(size=8), w)["df"]
        assert 2.5 < df < 7.0 - 0.1             # below S - 1 = 7
        draws = rng.normal(0.0, 1.0, (6000, 8))
        res = [weighted_t(x, w) for x in draws]
        V = np.array([r["se"] ** 2 for r in res])
        assert V.mean() == pytest.approx(np.sum(w ** 2), rel=0.05)       # unbiased for Var(sum w d)
        assert 2 * V.mean() ** 2 / V.var() == pytest.approx(df, rel=0.12)
        rej = np.mean([r["p_value"] <= 0.05 for r in res])
        assert lo < rej < hi, (w, rej)


# --- per-seed differences against the primary estimates and scipy ---------------------------------

def _two_arch(effect=0.5, seed=1, n_seeds=8, n_parents=40, **kw):
    return simulate_factorial(n_seeds=n_seeds, n_parents=n_parents, archs=("a", "b"), effect=effect, seed=seed, **kw)


def test_leak_t_equals_scipy_on_per_seed_differences_computed_here():
    pred = _two_arch()
    acc = pred.assign(correct=pred["correct"].astype(float)).groupby(
        ["seed", "arch", "exposure"], observed=True)["correct"].mean().unstack("exposure")
    per_seed = (acc["leak"] - acc["clean"]).groupby("seed").mean()
    leak_seed = acc["leak"].groupby("seed").mean()
    clean_seed = acc["clean"].groupby("seed").mean()
    table = sensitivity_table(pred, mixed_model=False)
    t = table[table["analysis"] == "paired_t"].iloc[0]
    ref = sps.ttest_1samp(per_seed.to_numpy(), 0.0)
    rel = sps.ttest_rel(leak_seed.to_numpy(), clean_seed.to_numpy())
    assert t["statistic"] == pytest.approx(ref.statistic, rel=1e-9) == pytest.approx(rel.statistic, rel=1e-9)
    assert t["p_value"] == pytest.approx(rel.pvalue, rel=1e-8) and t["df"] == 7
    flip = table[table["analysis"] == "sign_flip"].iloc[0]
    assert flip["p_value"] == pytest.approx(brute_sign_flip(per_seed.to_numpy(), np.full(8, 1 / 8)))
    primary = leak_effect(pred, n_boot=0)
    assert t["estimate"] == pytest.approx(primary.loc[primary["arch"] == "pooled", "estimate"].iloc[0], abs=1e-12)
    assert "Satterthwaite and Kenward-Roger give S - 1" in t["method"]


def test_unbalanced_estimate_equals_the_primary_and_df_drops():
    """Unequal crops per seed (seed 0 loses half its test crops) and a seed missing a cell
    (seed 1 has no clean model of arch b): the crop-weighted per-seed mean is still the
    primary pooled estimate, and the df fall below S - 1."""
    pred = _two_arch(n_seeds=6)
    crops = pred["id"].astype(str).str[1:].astype(int)
    pred = pred[~((pred["seed"] == 0) & (crops % 2 == 0))]
    pred = pred[~((pred["seed"] == 1) & (pred["arch"] == "b") & (pred["exposure"] == "clean"))]
    with pytest.warns(Warning):
        primary = leak_effect(pred, n_boot=0)
    table = sensitivity_table(pred, mixed_model=False)
    t = table[table["analysis"] == "paired_t"].iloc[0]
    assert t["estimate"] == pytest.approx(primary.loc[primary["arch"] == "pooled", "estimate"].iloc[0], abs=1e-12)
    assert 2.0 < t["df"] < 5.0 and "Satterthwaite df" in t["method"]


def _with_intervention_and_protocol(pred: pd.DataFrame) -> pd.DataFrame:
    """pred plus an intervention 'blur' under which the leak model scores as its clean twin
    (the cut is the whole leak) and a P1/P2 pair copied from the leak/clean models."""
    pred = pred.assign(correct=pred["correct"].astype(bool))
    for col in ("model", "arch", "exposure", "id", "parent", "cell"):
        pred[col] = pred[col].astype(str)
    blur = pred.copy()
    blur["intervention"] = "blur"
    clean = blur[blur["exposure"] == "clean"].set_index(["seed", "arch", "id"])["correct"]
    is_leak = blur["exposure"] == "leak"
    blur.loc[is_leak, "correct"] = clean.reindex(pd.MultiIndex.from_frame(blur.loc[is_leak, ["seed", "arch", "id"]])).to_numpy()
    prot = pred.copy()
    prot["protocol"] = np.where(prot["exposure"] == "leak", "crop", "parent")
    prot["model"] = "p-" + prot["model"]
    prot["exposure"] = ""
    return pd.concat([pred, blur, prot], ignore_index=True)


def test_strong_effect_every_analysis_rejects_and_estimates_match_the_primary():
    pred = _with_intervention_and_protocol(_two_arch(effect=1.5, seed=3, n_seeds=6, n_parents=20,
                                                     sd_seed_effect=0.1, sd_parent_effect=0.1))
    table = sensitivity_table(pred)
    assert set(table["estimand"]) == {"leak", "leak_cut", "protocol"}
    assert (table["reason"] == "").all(), table["reason"].tolist()
    assert (table["estimate"] > 0).all()
    flips = table[table["analysis"] == "sign_flip"]
    assert np.allclose(flips["p_value"], 2 / 2 ** 6)           # every seed positive: the smallest exact p
    others = table[table["analysis"] != "sign_flip"]
    assert (others["p_value"] < 0.01).all(), others[["estimand", "analysis", "p_value"]]
    acc = table[table["scale"] == "accuracy"].groupby("estimand")["estimate"].first()
    cut = intervention_effect(pred[pred["exposure"] != ""], baseline="none", n_boot=0)
    prot = protocol_effect(pred, n_boot=0)
    assert acc["leak_cut"] == pytest.approx(cut.query("estimand == 'leak_cut' and arch == 'pooled'")["estimate"].iloc[0])
    assert acc["protocol"] == pytest.approx(prot.query("arch == 'pooled'")["estimate"].iloc[0])
    assert list(table.columns) == SENSITIVITY_COLUMNS


def test_pooled_over_diversity_is_the_mean_of_the_levels():
    """Two diversity levels and an intervention: the rows pooled over levels are keyed as
    `estimates`' leak_pooled and leak_cut_pooled rows and equal their estimates, and the
    leak_pooled one is the mean of the levels' pooled leaks computed by `leak_effect`."""
    from shortcutlab.stats import estimates

    hi = _with_intervention_and_protocol(_two_arch(seed=4, n_seeds=5, n_parents=20))
    lo = _with_intervention_and_protocol(_two_arch(seed=5, n_seeds=5, n_parents=20)).assign(diversity="low")
    lo["model"] = lo["model"] + "-low"
    pred = pd.concat([hi, lo], ignore_index=True)
    table = sensitivity_table(pred, mixed_model=False)
    t = table[table["analysis"] == "paired_t"]
    assert set(zip(t["estimand"], t["diversity"])) >= {("leak", "high"), ("leak", "low"), ("leak_pooled", "pooled"),
                                                      ("leak_cut", "high"), ("leak_cut_pooled", "pooled")}
    primary = leak_effect(pred[pred["exposure"] != ""], n_boot=0).query("arch == 'pooled' and intervention == 'none'")
    by_div = primary.set_index("diversity")["estimate"]
    pooled = t.set_index("estimand").loc["leak_pooled", "estimate"]
    assert pooled == pytest.approx((by_div["high"] + by_div["low"]) / 2, abs=1e-12)
    est = estimates(pred, n_boot=0)
    keys = ["estimand", "condition", "arch", "diversity", "intervention"]
    both = t.merge(est[keys + ["estimate"]].astype({k: str for k in keys}), on=keys, suffixes=("", "_est"))
    assert {"leak_pooled", "leak_cut_pooled", "leak", "leak_cut", "protocol"} <= set(both["estimand"])
    assert np.allclose(both["estimate"], both["estimate_est"], atol=1e-12), both[keys + ["estimate", "estimate_est"]]


# --- under the null -------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_null_rejection_near_alpha(seed):
    """No leak effect (exchangeable leak and clean models): over 800 data sets the sign-flip
    test (10 seeds: exact, size 25/512) and the t reject at 0.05 about 5% of the time."""
    rng = np.random.default_rng(seed)
    rej = np.zeros(2)
    n = 800
    for _ in range(n):
        sd = seed_differences(crossed(rng))
        rej += [sign_flip_test(sd.d, sd.w)["p_value"] <= 0.05, weighted_t(sd.d, sd.w)["p_value"] <= 0.05]
    rate = rej / n
    assert np.all((rate > 0.025) & (rate < 0.08)), rate


# --- the binomial mixed model ---------------------------------------------------------------------

@pytest.mark.parametrize("effect,seed", [(0.8, 0), (-0.6, 1), (0.8, 2)])
def test_glmm_recovers_a_planted_logit_effect(effect, seed):
    """With seed and parent random intercepts and no variation of the effect, the model's
    conditional log-odds ratio is the planted `effect`."""
    frame = crossed(np.random.default_rng(seed), n_seeds=6, n_parents=60, crops=3, effect=effect, sd_model=0.0)
    g = binomial_glmm(frame, seed=seed)
    assert g["reason"] == ""
    assert np.sign(g["estimate"]) == np.sign(effect)
    assert abs(g["estimate"] - effect) < max(0.15, 4 * g["se"])
    assert 0.02 < g["se"] < 0.2 and g["p_value"] < 1e-6


def test_glmm_non_convergence_is_recorded_not_raised():
    pred = _two_arch(n_seeds=4)
    with pytest.warns(StatsWarning, match="did not converge"):
        table = sensitivity_table(pred, max_iter=1)
    g = table[table["analysis"] == "binomial_glmm"].iloc[0]
    assert np.isnan(g["estimate"]) and np.isnan(g["p_value"])
    assert "did not converge after 1 BFGS iterations" in g["reason"]
    assert table.loc[table["analysis"] == "paired_t", "reason"].iloc[0] == ""


def test_glmm_without_statsmodels_is_recorded(monkeypatch):
    monkeypatch.setitem(sys.modules, "statsmodels.genmod.bayes_mixed_glm", None)
    g = binomial_glmm(crossed(np.random.default_rng(0), n_seeds=3))
    assert np.isnan(g["estimate"]) and "statsmodels is not installed" in g["reason"]


def test_one_seed_is_recorded_with_a_reason():
    pred = _two_arch(n_seeds=1)
    with pytest.warns(StatsWarning, match="1 seed"):
        table = sensitivity_table(pred, mixed_model=False)
    assert len(table) == 2 and table["p_value"].isna().all()
    assert table["reason"].str.contains("1 seed").all()


def test_contrast_keys_match_the_estimates_rows():
    pred = _with_intervention_and_protocol(_two_arch(n_seeds=3))
    keys = [k for k, _ in primary_contrasts(check_predictions(pred))]
    assert keys == [dict(estimand="leak", condition="sim", arch="pooled", diversity="high", intervention="none"),
                    dict(estimand="leak_cut", condition="sim", arch="pooled", diversity="high", intervention="blur"),
                    dict(estimand="protocol", condition="sim", arch="pooled", diversity="", intervention="none")]


# --- `shortcutlab results` ------------------------------------------------------------------------

def test_results_command_prints_the_sensitivity_table(tmp_path, capsys):
    """A sweep folder holding a simulated factorial: the sensitivity row of the leak shows the
    primary estimate in pp, the exact sign-flip p (every seed positive: 2 / 2^6) and the t of
    scipy on per-seed differences computed here; --no-mixed-model leaves the GLMM columns out."""
    from shortcutlab.cli import main

    pred = simulate_factorial(n_seeds=6, n_parents=30, crops_per_parent=3, effect=1.5, seed=4)
    for c in pred.columns:
        if isinstance(pred[c].dtype, pd.CategoricalDtype):
            pred[c] = pred[c].astype(str)
    pred.to_parquet(tmp_path / "predictions.parquet", index=False)
    acc = pred.groupby(["seed", "exposure"])["correct"].mean().unstack("exposure")
    ref = sps.ttest_rel(acc["leak"], acc["clean"])
    assert (acc["leak"] > acc["clean"]).all()
    assert main(["results", str(tmp_path), "--n-boot", "200"]) == 0
    out = capsys.readouterr().out
    assert "sensitivity analyses" in out
    line = out[out.index("sensitivity analyses"):].splitlines()[2].split()
    assert line[:5] == ["leak", "sim", "a", "high", "none"]
    hand = 100 * (acc["leak"] - acc["clean"]).mean()
    assert float(line[5]) == pytest.approx(hand, abs=0.006)
    assert float(line[7]) == pytest.approx(2 / 64, abs=1e-4)
    assert float(line[8]) == pytest.approx(ref.statistic, abs=0.006) and float(line[9]) == 5.0
    assert float(line[11]) > 0 and float(line[12]) < 0.001           # the GLMM's log-odds and p
    assert main(["results", str(tmp_path), "--n-boot", "0", "--no-mixed-model"]) == 0
    out = capsys.readouterr().out
    assert "glmm_log_odds" not in out and "p_sign_flip" in out


# --- the report -----------------------------------------------------------------------------------

def test_report_has_the_sensitivity_section(tmp_path):
    """The report's 'Sensitivity analyses' table shows, for the leak of a simulated factorial,
    the exact sign-flip p computed here by enumeration (2 / 2^5: every seed positive)."""
    from shortcutlab.report import build_report

    pred = simulate_factorial(n_seeds=5, n_parents=20, crops_per_parent=3, effect=1.5, seed=2)
    d = tmp_path / "sweep"
    d.mkdir()
    pred.to_parquet(d / "predictions.parquet", index=False)
    acc = pred.groupby(["seed", "exposure"], observed=True)["correct"].mean().unstack("exposure")
    want = brute_sign_flip((acc["leak"] - acc["clean"]).to_numpy(), np.full(5, 0.2))
    paths = build_report(str(d), n_boot=100, examples=False)
    md = open(paths["markdown"], encoding="utf-8").read()
    part = md[md.index("Sensitivity analyses"):]
    row = next(line for line in part.splitlines() if line.startswith("| leak"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5] == f"{want:.4f}" == "0.0625"
    assert "Satterthwaite and Kenward-Roger" in part


def test_glmm_over_max_rows_is_recorded_not_fitted():
    frame = crossed(np.random.default_rng(0), n_seeds=3)
    g = binomial_glmm(frame, max_rows=len(frame) - 1)
    assert np.isnan(g["estimate"]) and f"{len(frame)} crop-level rows exceed max_rows={len(frame) - 1}" in g["reason"]
