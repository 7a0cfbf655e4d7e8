"""`shortcutlab power`: components from a pilot sweep folder, the power table and its figure,
written atomically into an output folder.

The statistics are `shortcutlab.stats.power` (pure functions); this module reads the pilot's
predictions (`sweep.runner.read_predictions`), draws the figure and writes the files:

- ``power.csv``: one row per design x effect (`stats.power.POWER_COLUMNS`);
- ``power.png``: power against the effect, one line per design, 95% Monte Carlo error bars;
- ``components.json``: the variance components used, where they came from, and the settings.
"""

from __future__ import annotations

import io
import os
import numpy as np
import pandas as pd

from shortcutlab.io import atomic_files, claim_output_dir, to_json, write_marker
from shortcutlab.stats.power import LeakComponents, PowerError, estimate_components

__all__ = ["POWER_FILES", "pilot_components", "pilot_crops_per_parent", "power_figure", "power_png", "write_power"]

#: what `shortcutlab power` writes in its --out folder
POWER_FILES = ("power.csv", "power.png", "components.json")


def pilot_components(sweep_dir: str, *, condition: str | None = None,
                     baseline: str = "none") -> tuple[LeakComponents, int]:
    """Variance components of the leak effect from a pilot sweep folder (its predictions.parquet;
    `stats.power.estimate_components`), and its median number of test crops per parent and seed.

    Raises:
        SweepError: the folder is missing or holds no readable predictions table.
        PowerError: the pilot has no usable factorial (naming the folder and what is missing).
    """
    from shortcutlab.sweep.runner import read_predictions

    pred = read_predictions(sweep_dir)
    try:
        comp = estimate_components(pred, condition=condition, baseline=baseline)
    except PowerError as e:
        raise PowerError(f"pilot {os.fspath(sweep_dir)!r}: {e}") from None
    return comp, pilot_crops_per_parent(pred, baseline)


def pilot_crops_per_parent(pred: pd.DataFrame, baseline: str = "none") -> int:
    """The median number of crops a factorial model scores per test parent (at least 1)."""
    fac = pred[pred["exposure"].astype(str).isin(["leak", "clean"]).to_numpy()
               & (pred["intervention"].astype(str) == baseline).to_numpy()]
    if fac.empty:
        return 1
    counts = fac.groupby(["model", "parent"], observed=True).size()
    return max(1, int(round(float(np.median(counts.to_numpy())))))


def power_figure(table: pd.DataFrame):
    """Power against the effect (pp), one line per design, with 95% Monte Carlo error bars
    (1.96 mc_se), the test's level alpha (dotted) and power 0.8 (dashed), each named in the
    legend; power on its whole range (0 to 1), text in the report's sizes
    (`report.figures.STYLE`). Returns the Figure."""
    import matplotlib

    from shortcutlab.report.figures import MAX_WIDTH, STYLE, agg_pyplot

    plt = agg_pyplot()
    keys = ["n_seeds", "n_archs", "n_parents", "crops_per_parent", "n_pool"]
    with matplotlib.rc_context(STYLE):
        groups = list(table.groupby(keys, sort=True))
        fig, ax = plt.subplots(figsize=(min(MAX_WIDTH, 7.0), 4.4 + 0.2 * len(groups)))
        colors = plt.get_cmap("tab10" if len(groups) <= 10 else "tab20")
        for i, (design, sub) in enumerate(groups):
            sub = sub.sort_values("effect")
            pool = f" (of {design[4]})" if design[4] > design[2] else ""
            label = f"{design[0]} seeds, {design[1]} archs, {design[2]} parents{pool} x {design[3]} crops"
            ax.errorbar(100 * sub["effect"], sub["power"], yerr=1.96 * sub["mc_se"], marker="o", ms=3, capsize=2,
                        lw=1.2, label=label, color=colors(i % colors.N))
        alpha = float(table["alpha"].iloc[0]) if len(table) else 0.05
        ax.axhline(alpha, color="grey", ls=":", lw=1, label=f"test level alpha = {alpha:g} (power at no effect)")
        ax.axhline(0.8, color="grey", ls="--", lw=1, label="power 0.8")
        test = "paired t on per-seed effects" if (table["test"] == "t").all() else "two-way cluster bootstrap"
        n_sim = int(table["n_sim"].iloc[0]) if len(table) else 0
        ax.set(xlabel="leak effect (pp)", ylabel="power (share of data sets with the leak detected)", ylim=(-0.02, 1.02),
               title=f"Power of the leak test ({test}, alpha {alpha:g})\n{n_sim} simulated data sets per point, "
                     f"95% Monte Carlo error bars")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
    return fig


def power_png(table: pd.DataFrame) -> bytes:
    """`power_figure` as PNG bytes, deterministic (no timestamp)."""
    from shortcutlab.report.figures import agg_pyplot

    plt = agg_pyplot()
    fig = power_figure(table)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def write_power(out_dir: str, table: pd.DataFrame, comp: LeakComponents, settings: dict) -> dict[str, str]:
    """Write power.csv, power.png and components.json into `out_dir` together (each to a
    temporary name, all renamed at the end), after claiming the folder for a power output.

    Args:
        out_dir: the output folder (missing, empty, or an earlier power output).
        table: `stats.power.simulate_power`'s table.
        comp: the components used.
        settings: what produced them (source, test, n_sim, alpha, seed, ...), for the record.

    Returns:
        {file name: path}.

    Raises:
        OutputError: the folder holds files shortcutlab did not write.
    """
    claim_output_dir(out_dir, "power", POWER_FILES)
    os.makedirs(out_dir, exist_ok=True)
    paths = {name: os.path.join(out_dir, name) for name in POWER_FILES}
    png = power_png(table)
    with atomic_files() as stage:
        table.to_csv(stage.path(paths["power.csv"]), index=False)
        with open(stage.path(paths["power.png"]), "wb") as f:
            f.write(png)
        with open(stage.path(paths["components.json"]), "w", encoding="utf-8") as f:
            f.write(to_json({"components": comp.as_dict(), "settings": settings}))
    write_marker(out_dir, "power", POWER_FILES)
    return paths

