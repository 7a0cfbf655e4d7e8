"""`shortcutlab.stats.power` and `shortcutlab power`: the simulated power against the test's size
and closed forms (the noncentral t, statsmodels' power functions), its monotonicity, and the
pilot route against components planted by a generator written here (not the module's own)."""

from __future__ import annotations

import json
import math
import os
import warnings

import numpy as np
import pandas as pd
import pytest

from shortcutlab.stats.power import (Design, LeakComponents, estimate_components, normal_power, simulate_cells,
                                     simulate_power, t_power, two_way_se)

ALPHA = 0.05


def _margin(p: float, n: int, k: float = 4.0) -> float:
    """k Monte Carlo standard errors of a proportion p from n data sets."""
    return k * math.sqrt(p * (1 - p) / n)


# ----------------------------------------------------------------------------- the generator
def test_simulate_cells_has_the_planted_mean_and_crop_variance():
    """A crop's difference D drawn by `simulate_cells` has the cell's mean and variance sd_crop^2:
    with every SD but the crop's 0 the cell mean is the effect, so over many crops
    mean(D) -> effect and var(D) -> sd_crop^2 (binomial counts give both)."""
    comp = LeakComponents(sd_crop=0.4)
    design = Design(n_seeds=4, n_archs=3, n_parents=50, crops_per_parent=20)
    plus, minus, clipped, _ = simulate_cells(comp, design, 0.03, 40, np.random.default_rng(0))
    n = plus.size * 20
    mean = (plus.sum() - minus.sum()) / n
    var = (plus.sum() + minus.sum()) / n - mean ** 2
    assert clipped == 0
    assert abs(mean - 0.03) < 4 * 0.4 / math.sqrt(n)
    assert abs(var - 0.16) < 0.004


# ----------------------------------------------------------------------------- closed forms
def test_t_power_matches_statsmodels_when_parents_do_not_vary():
    """With sd_parent 0 the per-seed effects are iid normal: `t_power` is the one-sample t power
    of statsmodels (standardised effect effect/tau, S observations)."""
    from statsmodels.stats.power import TTestPower

    comp = LeakComponents(sd_seed=0.004, sd_seed_parent=0.02, sd_seed_arch=0.005, sd_crop=0.35)
    for S, A, P, C, effect in [(5, 4, 50, 3, 0.008), (10, 12, 150, 3, 0.004), (20, 12, 150, 3, 0.008), (3, 1, 20, 2, 0.0)]:
        tau = math.sqrt(0.004 ** 2 + 0.02 ** 2 / P + 0.005 ** 2 / A + 0.35 ** 2 / (A * P * C))
        expected = TTestPower().power(effect_size=effect / tau, nobs=S, alpha=ALPHA, alternative="two-sided")
        assert t_power(comp, Design(S, A, P, C), effect) == pytest.approx(expected, abs=1e-6)


def test_normal_power_matches_statsmodels():
    from statsmodels.stats.power import normal_power as sm_normal_power

    for effect, se in [(0.0, 0.01), (0.008, 0.004), (-0.01, 0.003), (0.02, 0.002)]:
        assert normal_power(effect, se, ALPHA) == pytest.approx(sm_normal_power(effect / se, 1, ALPHA), abs=1e-12)


@pytest.mark.parametrize("pool", [None, 80, 400])
def test_two_way_se_is_the_monte_carlo_sd_of_the_pooled_effect(pool):
    """The SD over data sets of the pooled leak estimate (all crops) equals `two_way_se`, for
    the crossed design and for seeds drawing 40 parents from a pool of 80 or 400 (where a
    parent is tested by Binomial(S, 40/pool) seeds). The parent SD is large so that the pool
    changes the SE: 0.0207 crossed, 0.0180 and 0.0155 for the pools."""
    comp = LeakComponents(sd_seed=0.006, sd_parent=0.1, sd_seed_parent=0.02, sd_seed_arch=0.008, sd_crop=0.6)
    design = Design(6, 3, 40, 3, pool)
    plus, minus, _, parents = simulate_cells(comp, design, 0.0, 4000, np.random.default_rng(3))
    est = (plus - minus).sum(axis=(1, 2, 3)) / (6 * 3 * 40 * 3)
    assert (np.diff(parents, axis=2) > 0).all() and parents.max() < (pool or 40)
    assert est.std(ddof=1) == pytest.approx(two_way_se(comp, design), rel=0.05)   # SE of an SD from 4000 draws: 1.1%


# ----------------------------------------------------------------------------- simulated power
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_t_power_at_effect_zero_is_the_size(seed):
    """Where the t test is exact (sd_parent 0: seeds independent, per-seed effects about
    normal) the simulated power at effect 0 is alpha, within 4 Monte Carlo SEs."""
    comp = LeakComponents(sd_seed=0.005, sd_seed_parent=0.02, sd_seed_arch=0.004, sd_crop=0.35)
    n_sim = 2000
    table = simulate_power(comp, [Design(5, 4, 50, 3), Design(10, 2, 30, 2)], [0.0], n_sim=n_sim, seed=seed)
    for power in table["power"]:
        assert abs(power - ALPHA) < _margin(ALPHA, n_sim)
    assert np.allclose(table["closed_form"], ALPHA, atol=1e-9)


@pytest.mark.filterwarnings("ignore:power.*clipped")    # a few cells of millions, far in the parents' tail
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_t_power_matches_the_closed_form(seed):
    """Simulated power of the paired t against `t_power` (noncentral t, averaged over the test
    parents' shared mean where sd_parent > 0: then the size exceeds alpha), within 4 MC SEs."""
    n_sim = 1500
    cases = [
        (LeakComponents(sd_seed=0.004, sd_seed_parent=0.01, sd_seed_arch=0.003, sd_crop=0.35), Design(10, 4, 50, 3),
         [0.004, 0.008]),
        (LeakComponents(sd_seed=0.002, sd_parent=0.04, sd_seed_parent=0.01, sd_crop=0.4), Design(8, 3, 40, 4),
         [0.0, 0.01]),
    ]
    for comp, design, effects in cases:
        table = simulate_power(comp, [design], effects, n_sim=n_sim, seed=seed)
        for _, row in table.iterrows():
            assert abs(row["power"] - row["closed_form"]) < _margin(row["closed_form"], n_sim) + 0.005, row.to_dict()
    # the t test ignores the parents' spread: its size exceeds alpha, by a computable amount
    assert table["closed_form"].iloc[0] > 0.1


def test_power_increases_with_seeds_and_effect():
    comp = LeakComponents(sd_seed=0.004, sd_seed_parent=0.01, sd_seed_arch=0.003, sd_crop=0.35)
    n_sim = 800
    table = simulate_power(comp, [Design(5, 4, 50, 3), Design(10, 4, 50, 3), Design(20, 4, 50, 3)],
                           [0.0, 0.008, 0.016], n_sim=n_sim, seed=5)
    grid = table.pivot(index="n_seeds", columns="effect", values="power")
    for effect in (0.008, 0.016):
        col = grid[effect].to_numpy()
        assert (np.diff(col) > _margin(0.5, n_sim, 1.0)).all(), grid
    for s in (5, 10, 20):
        row = grid.loc[s].to_numpy()
        assert (np.diff(row) > _margin(0.5, n_sim, 1.0)).all(), grid


def test_predictions_frame_holds_the_counts_and_the_pool_parents():
    """The predictions table the bootstrap route builds: its leak effect (by `leak_effect`) is
    the mean crop difference of the counts, its test parents those the seeds drew from the pool,
    and the clean accuracy about the baseline."""
    from shortcutlab.stats import leak_effect
    from shortcutlab.stats.power import predictions_frame

    comp = LeakComponents(baseline=0.7, sd_seed=0.01, sd_parent=0.02, sd_crop=0.4)
    design = Design(4, 2, 10, 5, 30)
    rng = np.random.default_rng(0)
    plus, minus, _, parents = simulate_cells(comp, design, 0.05, 1, rng)
    frame = predictions_frame(plus[0], minus[0], parents[0], comp, 5, rng)
    row = leak_effect(frame, n_boot=0).set_index("arch").loc["pooled"]
    assert row["estimate"] == pytest.approx((plus - minus).sum() / plus.size / 5)
    assert row["n_parents"] == len(np.unique(parents[0])) and row["n_seeds"] == 4
    clean = frame[frame["exposure"] == "clean"]["correct"].mean()
    assert abs(clean - 0.7) < 4 * math.sqrt(0.7 * 0.3 / (4 * 2 * 10 * 5))


def test_bootstrap_power_size_and_power():
    """The registered two-way bootstrap on simulated predictions tables: at effect 0 it rejects
    at most about alpha (the pigeonhole bootstrap is conservative), and at an effect of six
    true SEs nearly always (a z test with the true SE: power 0.9999; the pigeonhole bootstrap's
    wider intervals cost some of it)."""
    comp = LeakComponents(sd_seed=0.004, sd_parent=0.004, sd_seed_parent=0.01, sd_seed_arch=0.003, sd_crop=0.35)
    design = Design(6, 2, 30, 3)
    big = 6 * two_way_se(comp, design)
    n_sim = 60
    table = simulate_power(comp, [design], [0.0, big], test="bootstrap", n_sim=n_sim, n_boot=199, seed=0)
    assert table["power"].iloc[0] <= ALPHA + _margin(ALPHA, n_sim, 3)
    assert table["power"].iloc[1] >= 0.8
    assert table["closed_form"].isna().all() and table["normal_power"].iloc[1] > 0.999


# ----------------------------------------------------------------------------- the pilot route
SDS = dict(sd_seed=0.03, sd_parent=0.05, sd_seed_parent=0.05, sd_seed_arch=0.03)


def pilot_predictions(seed: int, S=8, A=4, P=40, C=6, pool=None, effect=0.02, sds=SDS) -> tuple[pd.DataFrame, float]:
    """A pilot's factorial predictions with planted components, drawn independently of the module:
    a linear probability model (clean p = 0.6 + a crop's difficulty, leak p = clean p + the cell's
    leak effect, each arch with its own offset), one Bernoulli draw per model and crop. Each seed
    tests P parents of a pool (all of them when pool is None). Returns the frame and the true
    crop variance (the mean of p_leak (1 - p_leak) + p_clean (1 - p_clean))."""
    rng = np.random.default_rng(seed)
    pool = pool or P
    v = rng.normal(0, sds["sd_parent"], pool)
    g = rng.uniform(-0.1, 0.1, (pool, C))
    frames, crop_var = [], []
    for s in range(S):
        u = rng.normal(0, sds["sd_seed"])
        parents = np.sort(rng.choice(pool, P, replace=False)) if pool > P else np.arange(P)
        w = rng.normal(0, sds["sd_seed_parent"], P)
        x = rng.normal(0, sds["sd_seed_arch"], A)
        m = effect + 0.01 * np.arange(A)[:, None] + u + v[parents][None, :] + w[None, :] + x[:, None]   # (A, P)
        pc = np.broadcast_to(0.6 + g[parents][None, :, :], (A, P, C))
        pl = pc + m[:, :, None]
        crop_var.append((pl * (1 - pl) + pc * (1 - pc)).ravel())
        a_idx, p_idx, c_idx = np.meshgrid(np.arange(A), parents, np.arange(C), indexing="ij")
        for e, p in (("leak", pl), ("clean", pc)):
            frames.append(pd.DataFrame({
                "model": [f"a{a}-{e}-{s}" for a in a_idx.ravel()], "condition": "pilot", "arch": [f"a{a}" for a in a_idx.ravel()],
                "seed": s, "protocol": "factorial", "cell": f"{e}-high", "exposure": e, "diversity": "high",
                "intervention": "none", "id": [f"p{p}c{c}" for p, c in zip(p_idx.ravel(), c_idx.ravel())],
                "parent": [f"p{p}" for p in p_idx.ravel()], "label": 0, "pred": 0,
                "correct": rng.random(p.size) < p.ravel(), "split_sha256": ""}))
    return pd.concat(frames, ignore_index=True), float(np.mean(np.concatenate(crop_var)))


@pytest.mark.parametrize("pool", [None, 60])
def test_estimate_components_recovers_planted_variances(pool):
    """Over 12 independent pilots (8 seeds, 4 archs, 40 parents, 6 crops; parents crossed, or each
    seed testing 40 of 60), the mean of each estimated variance lies within 4.5 standard errors
    (their spread / sqrt(12); variance estimates are skewed, so the t of 12 has heavy tails: tried
    on 7 sets of 12 pilots each, |t| reached 3.7) of the planted one, and the crop variance within 3%."""
    est, crop = [], []
    for seed in range(12):
        pred, crop_var = pilot_predictions(100 + seed, pool=pool)
        c = estimate_components(pred)
        est.append([getattr(c, k) ** 2 for k in SDS] + [c.sd_crop ** 2])
        crop.append(crop_var)
    est = np.array(est)
    # truncation at 0 makes single estimates >= 0; the means are of the truncated values, so
    # allow for it with the planted variances far above their SEs
    for i, k in enumerate(SDS):
        mean, se = est[:, i].mean(), est[:, i].std(ddof=1) / math.sqrt(len(est))
        assert abs(mean - SDS[k] ** 2) < 4.5 * se + 1e-5, (k, mean, se, SDS[k] ** 2)
    assert est[:, 4].mean() == pytest.approx(np.mean(crop), rel=0.03)


def test_estimate_components_baseline_and_pilot_effect():
    pred, _ = pilot_predictions(7, S=4, A=2, P=20, C=4)
    c = estimate_components(pred)
    clean = pred[pred["exposure"] == "clean"]["correct"].mean()
    leak = pred[pred["exposure"] == "leak"]["correct"].mean()
    assert c.baseline == pytest.approx(clean)
    assert c.pilot_effect == pytest.approx(leak - clean)


def test_estimate_components_averages_diversity_levels():
    """Two diversity levels (models of their own) give the mean of the two levels' variances."""
    high, _ = pilot_predictions(11, S=4, A=2, P=20, C=4)
    low, _ = pilot_predictions(12, S=4, A=2, P=20, C=4)
    low = low.assign(diversity="low", model=low["model"] + "-low", cell=low["cell"].str.replace("high", "low"))
    both = estimate_components(pd.concat([high, low], ignore_index=True))
    one = [estimate_components(f) for f in (high, low)]
    assert any("averaged over 2 diversity levels" in n for n in both.notes)
    assert both.sd_crop ** 2 == pytest.approx(np.mean([c.sd_crop ** 2 for c in one]))
    assert both.baseline == pytest.approx(np.mean([high[high["exposure"] == "clean"]["correct"].mean(),
                                                   low[low["exposure"] == "clean"]["correct"].mean()]))


def test_estimate_components_nested_parents_fold_into_sd_parent():
    """Where no parent is tested in two seeds, parent and seed x parent go to sd_parent, noted."""
    pred, _ = pilot_predictions(9, S=4, A=2, P=20, C=4)
    pred["parent"] = pred["parent"] + "-s" + pred["seed"].astype(str)
    pred["id"] = pred["id"] + "-s" + pred["seed"].astype(str)
    c = estimate_components(pred)
    assert c.sd_seed_parent == 0 and any("cannot be told apart" in n for n in c.notes)


def _write_pilot(folder, pred: pd.DataFrame) -> str:
    from shortcutlab.sweep.folder import SweepLayout

    os.makedirs(folder, exist_ok=True)
    pred.to_parquet(SweepLayout(str(folder)).table("predictions"), index=False)
    return str(folder)


def test_cli_power_from_a_pilot_folder(tmp_path, capsys):
    """`shortcutlab power --pilot` on a sweep-shaped folder: the components it records are those
    `estimate_components` finds on the same predictions, the SE they imply is within 35% of the
    planted design's, and the table, figure and marker are written."""
    from shortcutlab.cli import main
    from shortcutlab.io import read_marker

    pred, crop_var = pilot_predictions(21, S=10, A=3, P=40, C=6)
    pilot = _write_pilot(tmp_path / "pilot", pred)
    out = tmp_path / "power"
    rc = main(["power", "--pilot", pilot, "--seeds", "4,8", "--archs", "3", "--parents", "40", "--effects", "0,0.02",
               "--n-sim", "100", "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0 and "power of the paired t" in printed
    table = pd.read_csv(out / "power.csv")
    assert len(table) == 4 and set(table["crops_per_parent"]) == {6}
    assert (table["n_sim"] == 100).all() and table["mc_se"].between(0, 0.05).all()
    record = json.loads((out / "components.json").read_text())
    direct = estimate_components(pred)
    assert record["components"]["sd_seed"] == pytest.approx(direct.sd_seed)
    planted = LeakComponents(sd_crop=math.sqrt(crop_var), **SDS)
    design = Design(10, 3, 40, 6)
    assert two_way_se(direct, design) == pytest.approx(two_way_se(planted, design), rel=0.35)
    assert (out / "power.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert read_marker(str(out))["kind"] == "power"


def test_cli_power_with_params_reproduces_a_stated_design(tmp_path, capsys):
    """`--params` with components under which twelve architectures and twenty seeds have a
    0.8-pp power near the paper's 0.977: the simulated value agrees with the closed form."""
    from shortcutlab.cli import main

    out = tmp_path / "p"
    rc = main(["power", "--params", "sd_seed=0.007,sd_parent=0,sd_seed_parent=0.01,sd_seed_arch=0.003,sd_crop=0.35",
               "--seeds", "20", "--archs", "12", "--parents", "150", "--effects", "0.008", "--n-sim", "400",
               "--out", str(out)])
    assert rc == 0
    row = pd.read_csv(out / "power.csv").iloc[0]
    assert abs(row["power"] - row["closed_form"]) < _margin(row["closed_form"], 400) + 0.005
    assert 0.95 < row["closed_form"] < 0.995
    capsys.readouterr()


def test_power_warns_when_cells_are_clipped():
    comp = LeakComponents(sd_seed=0.2, sd_crop=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        simulate_power(comp, [Design(3, 1, 5, 2)], [0.0], n_sim=20)
    assert any("clipped" in str(w.message) for w in caught)
