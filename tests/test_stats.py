"""shortcutlab.stats against independent references: pandas groupby means, a closed-form
bootstrap variance, a brute-force resampling loop, statsmodels' Holm, numpy's polyfit, and a
simulation with a known effect and a known cluster structure (coverage of the intervals)."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pandas as pd
import pytest

from shortcutlab.stats import (
    ESTIMATE_COLUMNS,
    StatsWarning,
    add_holm,
    dose_points,
    dose_response,
    estimates,
    holm,
    intervention_effect,
    leak_effect,
    protocol_effect,
    simulate_factorial,
    true_leak_effect,
)


def grid(n_seeds=4, n_parents=6, crops=3, archs=("r18", "vit"), diversities=("high", "low"),
         interventions=("none", "gray"), seed=0, p_leak=0.8, p_clean=0.7) -> pd.DataFrame:
    """A factorial predictions table with random `correct` (no structure: for point estimates)."""
    rng = np.random.default_rng(seed)
    rows = []
    for s, arch, div, exp, inter in itertools.product(range(n_seeds), archs, diversities, ("leak", "clean"),
                                                       interventions):
        for p in range(n_parents):
            for c in range(crops):
                rows.append((f"{arch}-{div}-{exp}-{s}", "color", arch, s, "factorial", f"{exp}-{div}", exp, div, inter,
                             f"s{s}p{p}c{c}", f"p{p}", 0, 0,
                             bool(rng.random() < (p_leak if exp == "leak" else p_clean)), ""))
    cols = ["model", "condition", "arch", "seed", "protocol", "cell", "exposure", "diversity", "intervention", "id",
            "parent", "label", "pred", "correct", "split_sha256"]
    return pd.DataFrame(rows, columns=cols)


# --- point estimates against pandas ---------------------------------------------------------------

def test_leak_point_estimates_match_a_groupby():
    pred = grid()
    got = leak_effect(pred, n_boot=0).set_index(["arch", "diversity", "intervention"])["estimate"]
    acc = pred.groupby(["arch", "diversity", "intervention", "exposure"])["correct"].mean().unstack()
    want = acc["leak"] - acc["clean"]
    for key, value in want.items():
        assert got[key] == pytest.approx(value, abs=1e-12)
    pooled = want.groupby(level=["diversity", "intervention"]).mean()
    for (div, inter), value in pooled.items():
        assert got[("pooled", div, inter)] == pytest.approx(value, abs=1e-12)
    assert len(got) == 3 * 2 * 2


def test_leak_uses_common_test_crops_only():
    pred = grid(archs=("r18",), diversities=("high",), interventions=("none",))
    drop = (pred["exposure"] == "clean") & (pred["id"].isin(["s0p0c0", "s1p2c1"]))
    with pytest.warns(StatsWarning, match="2 of .* left out"):
        got = leak_effect(pred[~drop], n_boot=0)["estimate"].iloc[0]
    common = pred[~pred["id"].isin(["s0p0c0", "s1p2c1"])]
    acc = common.groupby("exposure")["correct"].mean()
    assert got == pytest.approx(acc["leak"] - acc["clean"], abs=1e-12)


def test_intervention_point_estimates_match_a_groupby():
    pred = grid(interventions=("none", "gray", "blur"), seed=3)
    got = intervention_effect(pred, n_boot=0).set_index(["estimand", "arch", "diversity", "intervention"])
    acc = pred.groupby(["arch", "diversity", "intervention", "exposure"])["correct"].mean().unstack()
    leak = acc["leak"] - acc["clean"]
    for arch, div, inter in itertools.product(("r18", "vit"), ("high", "low"), ("gray", "blur")):
        cut = leak[(arch, div, "none")] - leak[(arch, div, inter)]
        cost = acc.loc[(arch, div, "none"), "clean"] - acc.loc[(arch, div, inter), "clean"]
        assert got.loc[("leak_cut", arch, div, inter), "estimate"] == pytest.approx(cut, abs=1e-12)
        assert got.loc[("share_removed", arch, div, inter), "estimate"] == pytest.approx(cut / leak[(arch, div, "none")])
        assert got.loc[("clean_cost", arch, div, inter), "estimate"] == pytest.approx(cost, abs=1e-12)
        assert got.loc[("leak_cut", arch, div, inter), "cost_exceeds_leak"] == bool(cost > leak[(arch, div, "none")])
    pooled_cut = np.mean([leak[(a, "low", "none")] - leak[(a, "low", "gray")] for a in ("r18", "vit")])
    assert got.loc[("leak_cut", "pooled", "low", "gray"), "estimate"] == pytest.approx(pooled_cut, abs=1e-12)


def test_intervention_cut_is_paired_tighter_than_independent():
    """The cut uses the same draws for both leak effects: with the interventions a no-op (same
    crops, same correctness) the cut is exactly 0 in every resample, under either interval
    method; resamples that do not vary give no interval (NaN and the reason), never [0, 0]."""
    pred = grid(interventions=("none",), seed=5)
    pred = pd.concat([pred, pred.assign(intervention="noop")], ignore_index=True)
    for interval in ("cgm", "pigeonhole"):
        with pytest.warns(StatsWarning, match="do not vary"):
            got = intervention_effect(pred, n_boot=300, interval=interval)
        cut = got[got["estimand"] == "leak_cut"]
        assert (cut["estimate"].abs() < 1e-15).all() and cut["se"].isna().all() and cut["ci_low"].isna().all()
        assert cut["reason"].str.contains("do not vary").all()


def protocols(n_seeds=4, archs=("r18", "vit"), seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for s, arch, proto in itertools.product(range(n_seeds), archs, ("crop", "parent")):
        parents = range(8) if proto == "crop" else range(8, 12)       # different test sets
        for p in parents:
            for c in range(3):
                rows.append(dict(model=f"{arch}-{proto}-{s}", condition="sipakmed", arch=arch, seed=s,
                                 protocol=proto, cell="", exposure="", diversity="", intervention="none",
                                 id=f"s{s}p{p}c{c}", parent=f"p{p}", label=0, pred=0,
                                 correct=bool(rng.random() < (0.9 if proto == "crop" else 0.8)), split_sha256=""))
    return pd.DataFrame(rows)


def test_protocol_point_estimates_match_a_groupby():
    pred = protocols()
    got = protocol_effect(pred, n_boot=200).set_index("arch")
    acc = pred.groupby(["arch", "protocol"])["correct"].mean().unstack()
    want = acc["crop"] - acc["parent"]
    for arch, value in want.items():
        assert got.loc[arch, "estimate"] == pytest.approx(value, abs=1e-12)
    assert got.loc["pooled", "estimate"] == pytest.approx(want.mean(), abs=1e-12)
    assert (got["ci_low"] <= got["estimate"]).all() and (got["estimate"] <= got["ci_high"]).all()
    assert got.loc["r18", "n_parents"] == 12 and got.loc["r18", "n_seeds"] == 4


# --- the bootstrap's variance against a closed form and a brute-force loop -------------------------

def test_bootstrap_variance_matches_the_closed_form():
    """The pigeonhole method (its CGM counterpart: tests/test_stats_calibration.py). Balanced design (n crops in every seed x parent cell): the resampled effect is
    sum_sp w_s v_p X_sp with X = (S_leak - S_clean) / (R C n), w ~ Mult(R, 1/R) and
    v ~ Mult(C, 1/C) independent, so E[w w'] = I + (1 - 1/R) J (and likewise for v) and
    Var = trace(X' A X B) - (sum X)^2 exactly."""
    R, C, n = 6, 9, 4
    pred = grid(n_seeds=R, n_parents=C, crops=n, archs=("r18",), diversities=("high",), interventions=("none",),
                seed=11, p_leak=0.6, p_clean=0.5)
    got = leak_effect(pred, n_boot=40_000, seed=2, interval="pigeonhole").iloc[0]
    sums = pred.groupby(["exposure", "seed", "parent"])["correct"].sum()
    X = (sums["leak"] - sums["clean"]).unstack().to_numpy() / (R * C * n)
    A = np.eye(R) + (1 - 1 / R) * np.ones((R, R))
    B = np.eye(C) + (1 - 1 / C) * np.ones((C, C))
    var = np.trace(X.T @ A @ X @ B) - X.sum() ** 2
    # sd of a variance estimate from 40k resamples is about sqrt(2 / 40k) = 0.7% of it
    assert got["se"] ** 2 == pytest.approx(var, rel=0.04)


def brute_force_boot(pred: pd.DataFrame, n_boot: int, seed: int) -> np.ndarray:
    """The two-way bootstrap as a plain loop: draw seeds and parents, stack copies of the rows."""
    rng = np.random.default_rng(seed)
    seeds, parents = np.sort(pred["seed"].unique()), np.sort(pred["parent"].unique())
    out = []
    for _ in range(n_boot):
        s = pd.Series(rng.choice(seeds, len(seeds))).value_counts()
        p = pd.Series(rng.choice(parents, len(parents))).value_counts()
        w = pred["seed"].map(s).fillna(0) * pred["parent"].map(p).fillna(0)
        m = (pred["correct"] * w).groupby(pred["exposure"]).sum() / w.groupby(pred["exposure"]).sum()
        out.append(m["leak"] - m["clean"])
    return np.asarray(out)


def test_bootstrap_se_matches_a_brute_force_loop_on_an_unbalanced_design():
    """The pigeonhole method against the same draws made as a plain loop."""
    pred = simulate_factorial(n_seeds=6, n_parents=30, crops_per_parent=2, test_fraction=0.6, seed=4)
    pred["correct"] = pred["correct"].astype(bool)
    ours = leak_effect(pred, n_boot=20_000, seed=1, interval="pigeonhole").iloc[0]
    ref = brute_force_boot(pred.astype({"parent": str, "exposure": str}), 600, seed=9)
    # sd of an SE from 600 resamples is about 1/sqrt(2 * 600) = 3%
    assert ours["se"] == pytest.approx(ref.std(ddof=1), rel=0.12)
    assert ours["ci_low"] == pytest.approx(np.quantile(ref, 0.025), abs=0.35 * ours["se"])


# --- coverage: the point of the method -------------------------------------------------------------

def naive_crop_boot(pred: pd.DataFrame, n_boot: int, rng) -> tuple[float, float]:
    """Percentile interval of the naive bootstrap that resamples scored crops as if independent.

    Resampling n rows with replacement from rows with k correct gives Binomial(n, k / n)
    correct: the exact naive bootstrap, drawn in one call per exposure."""
    g = pred.groupby(pred["exposure"].astype(str))["correct"].agg(["sum", "size"])
    (kl, nl), (kc, nc) = g.loc["leak"], g.loc["clean"]
    reps = rng.binomial(nl, kl / nl, n_boot) / nl - rng.binomial(nc, kc / nc, n_boot) / nc
    return tuple(np.quantile(reps, [0.025, 0.975]))


@pytest.mark.slow
def test_two_way_interval_covers_and_the_naive_one_does_not():
    """500 simulated factorials (20 seeds, 100 parents of 5 crops, the leak's logit gain varying
    by seed, sd 0.4, and parent, sd 0.6): the two-way interval must cover the population effect
    92-98% of the time; the naive crop-level interval clearly less. (The two-way bootstrap is
    conservative where crop noise dominates: docs/statistics.md gives the coverage in such a design.)"""
    design = dict(n_seeds=20, n_parents=100, crops_per_parent=5, sd_seed_effect=0.4, sd_parent_effect=0.6)
    truth = true_leak_effect(**design)
    rng = np.random.default_rng(0)
    n_sets, two_way, naive = 500, 0, 0
    for i in range(n_sets):
        pred = simulate_factorial(**design, seed=10_000 + i)
        row = leak_effect(pred, n_boot=500, seed=i).iloc[0]
        two_way += row["ci_low"] <= truth <= row["ci_high"]
        lo, hi = naive_crop_boot(pred, 500, rng)
        naive += lo <= truth <= hi
    print(f"\ncoverage of the 95% interval over {n_sets} sets: two-way {two_way / n_sets:.3f}, "
          f"naive crop-level {naive / n_sets:.3f}")
    assert 0.92 <= two_way / n_sets <= 0.98
    assert naive / n_sets < 0.85


@pytest.mark.slow
def test_null_rejection_rate_is_near_alpha():
    """mu = 0 and no mean leak gain: by symmetry the population effect is exactly 0 (the seed
    and parent variation of the gain stays). The p-value must reject about 5% of the time, and
    agree with the interval (p <= 0.05 exactly when 0 lies outside the 95% interval, up to
    resamples on the boundary)."""
    design = dict(n_seeds=20, n_parents=60, crops_per_parent=4, mu=0.0, effect=0.0)
    assert true_leak_effect(mu=0.0, effect=0.0) == pytest.approx(0.0, abs=1e-12)
    n_sets, rejected, agree = 300, 0, 0
    for i in range(n_sets):
        row = leak_effect(simulate_factorial(**design, seed=20_000 + i), n_boot=400, seed=i).iloc[0]
        rejected += row["p_value"] <= 0.05
        agree += (row["p_value"] <= 0.05) == (not row["ci_low"] <= 0 <= row["ci_high"])
    print(f"\nrejection rate at 0.05 under the null over {n_sets} sets: {rejected / n_sets:.3f}")
    assert 0.01 <= rejected / n_sets <= 0.10
    assert agree >= n_sets - 3


def test_true_leak_effect_matches_monte_carlo():
    rng = np.random.default_rng(0)
    kw = dict(mu=1.0, effect=0.5, sd_seed=0.3, sd_parent=0.6, sd_crop=0.4, sd_model=0.2, sd_seed_effect=0.3,
              sd_parent_effect=0.5)
    n = 2_000_000
    z0 = rng.normal(0, np.sqrt(0.3 ** 2 + 0.6 ** 2 + 0.4 ** 2 + 0.2 ** 2), n)
    z1 = z0 + rng.normal(0, np.sqrt(0.3 ** 2 + 0.5 ** 2), n)
    mc = np.mean(1 / (1 + np.exp(-(1.5 + z1))) - 1 / (1 + np.exp(-(1.0 + z0))))
    assert true_leak_effect(**kw) == pytest.approx(mc, abs=1e-3)


# --- Holm -----------------------------------------------------------------------------------------

def test_holm_by_hand():
    # p = (0.01, 0.04, 0.03, 0.005), m = 4, sorted 0.005, 0.01, 0.03, 0.04:
    #   0.005 * 4 = 0.02; 0.01 * 3 = 0.03; 0.03 * 2 = 0.06; 0.04 * 1 = 0.04 -> max(0.06, 0.04) = 0.06
    # in input order: 0.03, 0.06, 0.06, 0.02; at alpha 0.05 reject the first and the last.
    adj, rej = holm([0.01, 0.04, 0.03, 0.005])
    assert adj == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert rej.tolist() == [True, False, False, True]
    # NaN is no test: it stays NaN and does not count in m (here m = 2: 0.02 * 2, 0.04 * 1 -> 0.04)
    adj, rej = holm([0.02, np.nan, 0.04])
    assert adj[0] == pytest.approx(0.04) and np.isnan(adj[1]) and adj[2] == pytest.approx(0.04)
    assert rej.tolist() == [True, False, True]
    assert holm([0.6, 0.7])[0] == pytest.approx([1.0, 1.0])


def test_holm_matches_statsmodels():
    multipletests = pytest.importorskip("statsmodels.stats.multitest").multipletests
    rng = np.random.default_rng(0)
    for m in (1, 2, 5, 17, 60):
        for _ in range(4):                      # multipletests takes ~40 ms a call
            p = rng.beta(0.4, 1.5, m)
            p[rng.random(m) < 0.2] = p[0]       # ties
            reject, adj, _, _ = multipletests(p, alpha=0.05, method="holm")
            ours, ours_rej = holm(p, alpha=0.05)
            np.testing.assert_allclose(ours, adj, rtol=0, atol=1e-12)
            assert (ours_rej == reject).all()


def test_add_holm_works_within_families():
    frame = pd.DataFrame({"family": ["a", "a", "b", "b", "b", ""], "p_value": [0.01, 0.04, 0.01, 0.04, 0.03, 0.001]})
    out = add_holm(frame)
    # family a: 0.01 * 2 = 0.02, 0.04 * 1 -> 0.04; family b as in the hand example without 0.005:
    # 0.01 * 3 = 0.03, 0.03 * 2 = 0.06, 0.04 -> 0.06; '' is no family.
    assert out["p_holm"].iloc[:5].tolist() == pytest.approx([0.02, 0.04, 0.03, 0.06, 0.06])
    assert np.isnan(out["p_holm"].iloc[5])
    assert out["reject"].tolist() == [True, True, True, False, False, False]


# --- dose-response --------------------------------------------------------------------------------

def test_dose_response_slope_matches_polyfit_and_its_interval_covers():
    rng = np.random.default_rng(0)
    seeds = np.repeat(np.arange(15), 4)
    R = rng.uniform(0.05, 0.5, len(seeds))
    gap = 0.01 + 0.08 * R + rng.normal(0, 0.01, 15)[seeds] + rng.normal(0, 0.005, len(seeds))
    frame = pd.DataFrame({"seed": seeds, "R": R, "gap": gap, "arch": np.where(seeds % 2, "a", "b")})
    got = dose_response(frame, n_boot=4000).iloc[0]
    slope, intercept = np.polyfit(R, gap, 1)
    assert got["estimate"] == pytest.approx(slope, abs=1e-10)
    assert got["intercept"] == pytest.approx(intercept, abs=1e-10)
    assert got["ci_low"] < 0.08 < got["ci_high"] and got["p_value"] < 0.01
    assert got["n_points"] == 60 and got["n_clusters"] == 15
    per = dose_response(frame, by=["arch"], n_boot=500).set_index("arch")
    for arch, sub in frame.groupby("arch"):
        assert per.loc[arch, "estimate"] == pytest.approx(np.polyfit(sub["R"], sub["gap"], 1)[0], abs=1e-10)


def test_dose_response_cluster_se_matches_a_loop():
    rng = np.random.default_rng(1)
    seeds = np.repeat(np.arange(10), 3)
    frame = pd.DataFrame({"seed": seeds, "R": rng.uniform(0, 1, 30), "gap": rng.normal(0, 1, 30)})
    ours = dose_response(frame, n_boot=20_000, seed=3).iloc[0]["se"]
    ref = []
    for _ in range(1500):
        pick = rng.choice(10, 10)
        sub = pd.concat([frame[frame["seed"] == s] for s in pick])
        if sub["R"].nunique() > 1:
            ref.append(np.polyfit(sub["R"], sub["gap"], 1)[0])
    assert ours == pytest.approx(np.std(ref, ddof=1), rel=0.1)


def test_dose_response_without_spread_warns_and_gives_nan():
    frame = pd.DataFrame({"seed": [0, 1, 2], "R": [0.2, 0.2, 0.2], "gap": [0.1, 0.2, 0.3]})
    with pytest.warns(StatsWarning, match="does not vary"):
        row = dose_response(frame, n_boot=100).iloc[0]
    assert np.isnan(row["estimate"]) and np.isnan(row["ci_low"]) and "does not vary" in row["reason"]


# --- the one table, and degenerate designs ---------------------------------------------------------

def test_estimates_table_families_and_holm():
    fac = grid(interventions=("none", "gray"), seed=2)
    prot = protocols()
    pred = pd.concat([fac, prot], ignore_index=True)
    leak_models = fac.loc[fac["exposure"] == "leak", "model"].unique()
    results = pd.DataFrame({"model": leak_models, "diagnostic": "parent_probe", "metric": "R", "setting": "",
                            "value": np.linspace(0.1, 0.5, len(leak_models))})
    with warnings.catch_warnings():
        warnings.simplefilter("error", StatsWarning)
        table = estimates(pred, results, n_boot=300, hypotheses={})   # {}: the descriptive families only
    assert list(table.columns[: len(ESTIMATE_COLUMNS)]) == ESTIMATE_COLUMNS
    fams = set(table["family"])
    assert {"leak", "leak:color", "leak_under:color", "leak_cut:color", "clean_cost:color", "diversity:color",
            "protocol", "protocol:sipakmed", "dose"} <= fams
    head = table[table["family"] == "leak"]
    assert set(head["arch"]) == {"pooled"} and set(head["diversity"]) == {"high", "low"}
    # Holm within each family, checked against holm() on the family's p-values
    for fam, sub in table[table["family"] != ""].groupby("family"):
        np.testing.assert_allclose(sub["p_holm"], holm(sub["p_value"])[0])
    assert table.loc[table["estimand"] == "share_removed", "p_holm"].isna().all()
    assert (table.loc[table["estimand"] == "slope", "n_seeds"] == 4).all()


def test_dose_points_read_the_probes_overall_R_among_per_class_rows():
    # a sweep's parent_probe rows carry setting "on=all" for the overall R and "on=all,class=k"
    # per class; the dose-response must use the overall one, whatever the names
    fac = grid(interventions=("none",), seed=3)
    leak_models = fac.loc[fac["exposure"] == "leak", "model"].unique()
    overall = np.linspace(0.1, 0.5, len(leak_models))
    rows = [pd.DataFrame({"model": leak_models, "diagnostic": "parent_probe", "metric": "R", "setting": "on=all", "value": overall}),
            pd.DataFrame({"model": leak_models, "diagnostic": "parent_probe", "metric": "R", "setting": "on=all,class=0", "value": 0.99})]
    pts = dose_points(fac, pd.concat(rows, ignore_index=True))
    by_model = dict(zip(leak_models, overall))
    leak_model = fac[fac["exposure"] == "leak"].groupby(["condition", "arch", "diversity", "seed"])["model"].first()
    expected = [by_model[m] for m in leak_model.loc[list(pts[["condition", "arch", "diversity", "seed"]].itertuples(index=False))]]
    assert len(pts) == len(leak_model) and np.allclose(pts["R"], expected)


def test_one_seed_warns_and_gives_nan_intervals():
    pred = grid(n_seeds=1, archs=("r18",), diversities=("high",), interventions=("none",))
    with pytest.warns(StatsWarning, match="seed-level variance"):
        row = leak_effect(pred, n_boot=200).iloc[0]
    assert np.isfinite(row["estimate"]) and np.isnan(row["ci_low"]) and np.isnan(row["p_value"])
    assert "1 seed" in row["reason"]


def test_cell_without_clean_model_is_recorded_not_dropped():
    pred = grid(archs=("r18", "vit"), diversities=("high",), interventions=("none",))
    pred = pred[~((pred["arch"] == "vit") & (pred["exposure"] == "clean"))]
    with pytest.warns(StatsWarning, match="no clean model"):
        out = leak_effect(pred, n_boot=100)
    vit = out[out["arch"] == "vit"].iloc[0]
    assert np.isnan(vit["estimate"]) and vit["reason"] == "no clean model in this cell"
    assert np.isfinite(out.loc[out["arch"] == "r18", "ci_low"]).all()


def test_no_factorial_warns_and_records():
    with pytest.warns(StatsWarning, match="no factorial"):
        table = estimates(protocols(), n_boot=100)
    leak = table[table["estimand"] == "leak"]
    assert len(leak) == 1 and np.isnan(leak["estimate"].iloc[0]) and "no factorial" in leak["reason"].iloc[0]
    assert np.isfinite(table.loc[table["estimand"] == "protocol", "estimate"]).all()


# --- issue 21: estimands are registered functions with a unit and a reading ------------------------

@pytest.fixture
def toy_estimand():
    """`leak_accuracy`: the leak models' accuracy per condition on the unaltered crops, with
    hand-set p-values (0.01, 0.04) in one Holm family; unregistered after the test."""
    from shortcutlab.stats import register_estimand, unregister_estimand

    @register_estimand("leak_accuracy", unit="share", reading="leak models score {estimate} on their test crops")
    def leak_accuracy(ctx):
        leak = ctx.pred[(ctx.pred["exposure"] == "leak") & (ctx.pred["intervention"] == ctx.baseline)]
        acc = leak.groupby("condition")["correct"].mean()
        return pd.DataFrame({"condition": acc.index, "family": "toy", "estimate": acc.to_numpy(),
                             "p_value": [0.01, 0.04][:len(acc)]})

    try:
        yield "leak_accuracy"
    finally:
        unregister_estimand("leak_accuracy")


def _two_conditions() -> pd.DataFrame:
    a = simulate_factorial(n_seeds=3, n_parents=12, crops_per_parent=2, condition="a", seed=3)
    b = simulate_factorial(n_seeds=3, n_parents=12, crops_per_parent=2, effect=1.0, condition="b", seed=4)
    frames = [f.astype({c: str for c in ("model", "arch", "exposure", "id", "parent", "cell")}) for f in (a, b)]
    frames[1]["model"] = "b-" + frames[1]["model"]
    return pd.concat(frames, ignore_index=True)


def test_a_registered_estimand_joins_the_table_with_its_unit_and_reading(toy_estimand):
    from shortcutlab.stats import estimand_units, read_row, unregister_estimand

    pred = _two_conditions()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = estimates(pred, n_boot=0)
    toy = table[table["estimand"] == toy_estimand].set_index("condition")
    # the leak models' accuracy, counted by hand from the raw frame
    for cond in ("a", "b"):
        leak = pred[(pred["condition"] == cond) & (pred["exposure"] == "leak")]
        assert toy.loc[cond, "estimate"] == pytest.approx(leak["correct"].sum() / len(leak), abs=1e-12)
    # Holm within the toy family by hand: 0.01 * 2 = 0.02, then max(0.02, 0.04 * 1) = 0.04
    assert toy.loc["a", "p_holm"] == pytest.approx(0.02) and toy.loc["b", "p_holm"] == pytest.approx(0.04)
    assert toy["reject"].tolist() == [True, True]
    assert set(table["estimand"]) == {"leak", "leak_accuracy"}
    assert estimand_units(table) == {"leak": "pp", "leak_accuracy": "share"}
    row = toy.reset_index().iloc[0].to_dict()
    assert read_row(row) == f"leak models score {100 * row['estimate']:.0f}% on their test crops"
    # the built-in rows do not move: the table without the toy is the table minus its rows
    unregister_estimand(toy_estimand)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        without = estimates(pred, n_boot=0)
    # (n_seeds is float beside the toy's NaN, int without it)
    pd.testing.assert_frame_equal(table[table["estimand"] != toy_estimand].reset_index(drop=True), without,
                                  check_dtype=False)


def test_jointly_computed_estimands_keep_their_interleaved_order():
    """leak_cut, share_removed and clean_cost are three registered estimands from one pass:
    the table keeps intervention_effect's row order (three rows per setting and architecture)."""
    pred = grid(n_seeds=2, diversities=("high",))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = estimates(pred, n_boot=0)
        inter = intervention_effect(pred, n_boot=0)
    got = table[table["estimand"].isin(["leak_cut", "share_removed", "clean_cost"])]
    assert got["estimand"].tolist() == inter["estimand"].tolist() == ["leak_cut", "share_removed", "clean_cost"] * 3
    assert np.allclose(got["estimate"].to_numpy(float), inter["estimate"].to_numpy(float), equal_nan=True)
    # the first row by hand: r18's leak effect on unaltered crops minus under 'gray'
    acc = pred[pred["arch"] == "r18"].groupby(["intervention", "exposure"])["correct"].mean()
    cut = (acc["none", "leak"] - acc["none", "clean"]) - (acc["gray", "leak"] - acc["gray", "clean"])
    assert got.iloc[0][["arch", "intervention"]].tolist() == ["r18", "gray"]
    assert got.iloc[0]["estimate"] == pytest.approx(cut, abs=1e-12)
