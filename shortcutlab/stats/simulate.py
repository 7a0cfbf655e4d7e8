"""A predictions table with a known leak effect and cluster structure, and its true effect:
for checking the statistics and for power analyses."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

__all__ = ["simulate_factorial", "true_leak_effect"]


def simulate_factorial(*, n_seeds: int = 20, n_parents: int = 100, crops_per_parent: int = 5, archs: Sequence[str] = ("a",),
                       mu: float = 1.5, effect: float = 0.3, sd_seed: float = 0.3, sd_parent: float = 0.8,
                       sd_crop: float = 0.5, sd_model: float = 0.1, sd_seed_effect: float = 0.2,
                       sd_parent_effect: float = 0.4, test_fraction: float = 1.0, condition: str = "sim",
                       diversity: str = "high", seed: int = 0) -> pd.DataFrame:
    """A predictions table of one factorial cell with a known leak effect and cluster structure.

    For checking the statistics and for power analyses (the paper simulated its power). Model
    m of seed s with exposure e (1 leak, 0 clean) gets crop i of parent p right with probability
    ``expit(mu + a_s + b_p + g_i + u_m + e * (effect + c_s + d_p))``: a_s ~ N(0, sd_seed) is
    shared by every model of a seed, b_p ~ N(0, sd_parent) and g_i ~ N(0, sd_crop) by every
    model scoring the parent or crop, u_m ~ N(0, sd_model) is the model's own, and the leak's
    logit gain varies by seed (c_s ~ N(0, sd_seed_effect)) and parent (d_p ~
    N(0, sd_parent_effect)). `true_leak_effect` gives the population leak effect on the
    probability scale. Each seed tests a random `test_fraction` of the parents (all crops).

    Returns:
        The contract's predictions columns (protocol 'factorial', intervention 'none'; model,
        arch, exposure, id, parent and cell as categoricals of strings, for speed).
    """
    rng = np.random.default_rng(seed)
    A = len(archs)
    b, d = rng.normal(0, sd_parent, n_parents), rng.normal(0, sd_parent_effect, n_parents)
    parent = np.repeat(np.arange(n_parents), crops_per_parent)
    g = rng.normal(0, sd_crop, len(parent))
    n_test = max(1, int(round(test_fraction * n_parents)))
    cols = {k: [] for k in ("seed", "arch", "exposure", "crop", "correct")}
    for s in range(n_seeds):
        a_s, c_s = rng.normal(0, sd_seed), rng.normal(0, sd_seed_effect)
        test = np.sort(rng.choice(n_parents, n_test, replace=False)) if n_test < n_parents else np.arange(n_parents)
        crops = np.flatnonzero(np.isin(parent, test))
        base = mu + a_s + b[parent[crops]] + g[crops]
        leak = effect + c_s + d[parent[crops]]
        for arch in range(A):
            for e in (1, 0):
                eta = base + rng.normal(0, sd_model) + e * leak
                cols["correct"].append(rng.random(len(crops)) < 1 / (1 + np.exp(-eta)))
                cols["crop"].append(crops)
                n = len(crops)
                cols["seed"].append(np.full(n, s))
                cols["arch"].append(np.full(n, arch))
                cols["exposure"].append(np.full(n, e))
    seed_col, arch_col, exp_col = (np.concatenate(cols[k]) for k in ("seed", "arch", "exposure"))
    crop = np.concatenate(cols["crop"])
    # names of the few models, crops and parents, built once and indexed (string ops per row are slow)
    arch_names, exp_names = [str(a) for a in archs], ["clean", "leak"]
    models = [f"{a}-{e}-{s}" for a in archs for e in ("clean", "leak") for s in range(n_seeds)]
    crop_names = [f"c{i}" for i in range(len(parent))]
    parent_names = [f"p{j}" for j in range(n_parents)]
    cat = pd.Categorical.from_codes
    return pd.DataFrame({
        "model": cat((arch_col * 2 + exp_col) * n_seeds + seed_col, models), "condition": condition,
        "arch": cat(arch_col, arch_names), "seed": seed_col, "protocol": "factorial",
        "cell": cat(exp_col, [f"clean-{diversity}", f"leak-{diversity}"]), "exposure": cat(exp_col, exp_names),
        "diversity": diversity, "intervention": "none", "id": cat(crop, crop_names),
        "parent": cat(parent[crop], parent_names), "label": 0, "pred": 0,
        "correct": np.concatenate(cols["correct"]), "split_sha256": "",
    })


def true_leak_effect(*, mu: float = 1.5, effect: float = 0.3, sd_seed: float = 0.3, sd_parent: float = 0.8,
                     sd_crop: float = 0.5, sd_model: float = 0.1, sd_seed_effect: float = 0.2,
                     sd_parent_effect: float = 0.4, **_ignored) -> float:
    """Population leak effect of `simulate_factorial`'s model on the probability scale.

    E[expit(mu + effect + Z1)] - E[expit(mu + Z0)], with Z1, Z0 centred normals of the summed
    variances (leak: all six components; clean: the four without the leak's), by 200-point
    Gauss-Hermite quadrature (error far below 1e-10).
    """
    t, w = np.polynomial.hermite_e.hermegauss(200)
    w = w / w.sum()
    v0 = sd_seed ** 2 + sd_parent ** 2 + sd_crop ** 2 + sd_model ** 2
    v1 = v0 + sd_seed_effect ** 2 + sd_parent_effect ** 2

    def mean_expit(m, v):
        return float(np.sum(w / (1 + np.exp(-(m + math.sqrt(v) * t)))))

    return mean_expit(mu + effect, v1) - mean_expit(mu, v0)
