"""`shortcutlab report`: the readings' rules on hand-made estimates, the validity table on
hand-set results, and whole reports over fake sweep folders (from `stats.simulate_factorial`)
and, where the sweep runner is present, over a tiny real sweep."""

from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd
import pytest

from shortcutlab.report import build_report, leak_reading, removal_verdict, validity_table
from shortcutlab.report.readings import gradcam_reading, pp
from shortcutlab.stats import ESTIMATE_COLUMNS, simulate_factorial

SECTIONS = ("audit", "accuracy", "leak_effect", "validity", "dose_response", "gradcam", "examples")


# --- readings on hand-made estimates -----------------------------------------------------------------

def _est(rows) -> pd.DataFrame:
    base = dict(family="", condition="color", arch="r18", diversity="high", se=np.nan, p_value=np.nan, p_holm=np.nan,
                reject=False, n_seeds=5, n_parents=40, n_crops=400, n_boot=1000, reason="")
    out = pd.DataFrame([{**base, **r} for r in rows])
    for c in ESTIMATE_COLUMNS:
        if c not in out:
            out[c] = np.nan
    return out


def _intervention(name, cut, share, cost):
    return [dict(estimand="leak_cut", intervention=name, estimate=cut[0], ci_low=cut[1], ci_high=cut[2]),
            dict(estimand="share_removed", intervention=name, estimate=share[0], ci_low=share[1], ci_high=share[2]),
            dict(estimand="clean_cost", intervention=name, estimate=cost[0], ci_low=cost[1], ci_high=cost[2])]


HAND = _est([
    dict(estimand="leak", intervention="none", estimate=0.13, ci_low=0.091, ci_high=0.168),
    *_intervention("reinhard_unseen_field", (0.091, 0.05, 0.13), (0.70, 0.45, 0.95), (0.01, -0.01, 0.03)),
    *_intervention("background_removal", (0.005, -0.01, 0.02), (0.04, -0.08, 0.15), (0.02, 0.0, 0.04)),
    *_intervention("greyscale", (0.12, 0.08, 0.16), (0.92, 0.6, 1.2), (0.15, 0.12, 0.18)),
    *_intervention("low_pass:sigma=2.0", (0.03, 0.01, 0.05), (0.23, 0.08, 0.4), (0.0, -0.01, 0.01)),
])


def test_leak_reading_hand_made():
    text = leak_reading(HAND, "color", "high")
    assert text == (
        "color, high diversity, r18: the leak is +13.0 pp (95% CI +9.1 to +16.8 pp); "
        "background removal does not remove it (cut +0.5 pp, 95% CI -1.0 to +2.0 pp); "
        "greyscale is uninformative (it costs clean models 15.0 pp, more than the leak); "
        "low-pass blur (sigma=2.0) removes part of it (23%; +3.0 pp, 95% CI +1.0 to +5.0 pp); "
        "Reinhard transfer to an unseen field removes 70% of it (CI 45% to 95%).")


def test_leak_reading_no_leak_and_no_interval():
    est = _est([dict(estimand="leak", intervention="none", estimate=0.012, ci_low=-0.02, ci_high=0.04, arch="pooled"),
                *[dict(r, arch="pooled") for r in _intervention("greyscale", (0.01, -0.01, 0.03), (0.8, -1, 3), (0.0, -0.01, 0.01))]])
    assert leak_reading(est, "color", "high") == (
        "color, high diversity, pooled over architectures: the leak is +1.2 pp (95% CI -2.0 to +4.0 pp), not "
        "distinguishable from zero; the interventions are not read against it.")
    one = _est([dict(estimand="leak", intervention="none", estimate=0.1, ci_low=np.nan, ci_high=np.nan,
                     reason="1 seed(s): the seed-level variance cannot be estimated, no interval")])
    assert leak_reading(one, "color", "high") == ("color, high diversity, r18: the leak is +10.0 pp (no interval: 1 seed(s): "
                                                  "the seed-level variance cannot be estimated, no interval).")


@pytest.mark.parametrize("args,verdict", [
    # cut, cut_low, cut_high, share, leak, leak_low, leak_high, clean_cost
    ((0.09, 0.05, 0.13, 0.70, 0.13, 0.09, 0.17, 0.01), "removed"),
    ((0.03, 0.01, 0.05, 0.23, 0.13, 0.09, 0.17, 0.00), "partly removed"),
    ((0.005, -0.01, 0.02, 0.04, 0.13, 0.09, 0.17, 0.02), "not removed"),
    ((-0.05, -0.08, -0.02, -0.4, 0.13, 0.09, 0.17, 0.00), "increased"),
    ((0.12, 0.08, 0.16, 0.92, 0.13, 0.09, 0.17, 0.15), "uninformative"),      # cost 15 pp > leak 13 pp
    ((0.12, 0.08, 0.16, 0.92, 0.13, 0.09, 0.17, 0.13), "removed"),            # cost equal to the leak: not above it
    ((0.01, -0.01, 0.03, 0.8, 0.012, -0.02, 0.04, 0.0), "no leak"),
    ((0.05, np.nan, np.nan, 0.5, 0.1, 0.05, 0.15, 0.0), "unclear"),
    ((0.0, np.nan, np.nan, 0.0, 0.12, np.nan, np.nan, 0.0), "unclear"),    # one seed: a +12 pp leak is not "no leak"
    ((0.0, 0.0, 0.0, 0.0, 0.11, 0.03, 0.19, 0.0), "no change"),           # a no-op (background removal on masked backgrounds)
    ((0.0, 0.0, 0.0, 0.0, -0.02, -0.07, 0.03, 0.0), "no change"),         # ... not "uninformative" because the leak is negative
    ((0.0, -0.01, 0.01, 0.0, 0.11, 0.03, 0.19, 0.0), "not removed"),      # changes that cancel on average are not a no-op
])
def test_removal_verdict_rules(args, verdict):
    assert removal_verdict(*args) == verdict


def test_pp_and_gradcam_reading():
    assert pp(0.1304) == "+13.0 pp" and pp(-0.0004) == "+0.0 pp" and pp(-0.021) == "-2.1 pp"
    text = gradcam_reading({"outside_mass": {"leak": 0.84, "clean": 0.80}, "randomized_outside_mass": 0.86,
                            "randomized_head_spearman": 0.72, "random_pair_spearman": 0.1})
    assert text == ("Grad-CAM puts 84% of the attribution outside the cell in leak models and 80% in clean models; a "
                    "randomised head gives 86%; trained and randomised-head maps correlate at median rho 0.72 against "
                    "0.10 between random pairs of crops: the maps barely change when the head is randomised (the check "
                    "fails).")


# --- fake sweep folders --------------------------------------------------------------------------------

def _simulated(n_seeds=4, seed=1) -> pd.DataFrame:
    """Two conditions; under `color` three interventions with known effects on the leak."""
    color = simulate_factorial(n_seeds=n_seeds, n_parents=30, crops_per_parent=4, effect=1.2, condition="color", seed=seed)
    none = simulate_factorial(n_seeds=n_seeds, n_parents=30, crops_per_parent=4, effect=0.0, condition="none", seed=seed + 1)
    frames = [color, none]
    for c in ("model", "arch", "exposure", "id", "parent", "cell"):
        for f in frames:
            f[c] = f[c].astype(str)
    none["model"] = "none-" + none["model"]
    # reinhard: every leak model answers as its clean partner does (the leak is gone, exactly)
    rein = color.copy()
    key = ["seed", "id"]
    clean = color[color["exposure"] == "clean"].set_index(key)["correct"]
    leak = rein["exposure"] == "leak"
    rein.loc[leak, "correct"] = clean.reindex(pd.MultiIndex.from_frame(rein.loc[leak, key])).to_numpy()
    rein["intervention"] = "reinhard_unseen_field"
    # background removal: nothing changes
    back = color.assign(intervention="background_removal")
    # greyscale: every model wrong on every crop of even-numbered parents (costs clean models a lot)
    grey = color.assign(intervention="greyscale")
    even = grey["parent"].str[1:].astype(int) % 2 == 0
    grey.loc[even, "correct"] = False
    return pd.concat([color, none, rein, back, grey], ignore_index=True)


def _results(pred: pd.DataFrame) -> pd.DataFrame:
    """Hand-set diagnostic rows: leak R = clean R + 0.2 + 0.01 seed in `color` (+0.01 (seed - 1.5)
    in `none`, 0 on average),
    LEACE that removes the refitted heads' gap entirely in `color`, Grad-CAM mass of leak models
    off by 0.01 (seed - 1.5) (0 on average; the seeds' differences vary, so they have an
    interval: values equal in every seed would have none)."""
    models = pred.drop_duplicates("model")[["model", "condition", "arch", "seed", "protocol", "cell", "exposure", "diversity"]]
    rows = []
    for m in models.to_dict("records"):
        leak = m["exposure"] == "leak"
        up = 0.2 + 0.01 * m["seed"] if (leak and m["condition"] == "color") else 0.0
        r = 0.3 + 0.01 * m["seed"] + up + (0.01 * (m["seed"] - 1.5) if leak and m["condition"] == "none" else 0.0)
        off = 0.01 * (m["seed"] - 1.5) if leak else 0.0
        rows += [
            dict(m, diagnostic="parent_probe", setting="on=all", metric="R", value=r),
            dict(m, diagnostic="parent_probe", setting="on=all,class=0", metric="R", value=0.9),
            dict(m, diagnostic="leace", setting="rank=16", metric="R", value=r),
            dict(m, diagnostic="leace", setting="rank=16", metric="R_after", value=0.05),
            dict(m, diagnostic="leace", setting="rank=16,test_set=test", metric="accuracy_before", value=0.6 + up),
            dict(m, diagnostic="leace", setting="rank=16,test_set=test", metric="accuracy_after", value=0.6),
            dict(m, diagnostic="gradcam", setting="target=predicted", metric="outside_mass", value=0.4 + 0.01 * m["seed"] + off),
            dict(m, diagnostic="gradcam", setting="target=predicted", metric="random_pair_spearman", value=0.05),
            dict(m, diagnostic="gradcam", setting="target=predicted,cascade=0", metric="randomized_head_spearman", value=0.1),
            dict(m, diagnostic="gradcam", setting="target=predicted,cascade=0", metric="randomized_outside_mass", value=0.7),
        ]
    out = pd.DataFrame(rows)
    out["run_id"] = out["model"]
    out["ci_low"] = out["ci_high"] = np.nan
    out["n"] = 100
    return out


def _fake_sweep(tmp_path, pred, results=None, name="sweep") -> str:
    d = tmp_path / name
    d.mkdir()
    pred.to_parquet(d / "predictions.parquet", index=False)
    if results is not None:
        results.to_parquet(d / "results.parquet", index=False)
    return str(d)


def _section(html: str, key: str) -> str:
    start = html.index(f'<h2 id="{key}">')
    nxt = html.find("<h2 ", start + 1)
    return html[start: nxt if nxt > 0 else len(html)]


@pytest.fixture(scope="module")
def simulated_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    pred = _simulated()
    d = _fake_sweep(tmp, pred, _results(pred))
    paths = build_report(d, n_boot=400)
    with open(paths["html"], encoding="utf-8") as f:
        html = f.read()
    with open(paths["markdown"], encoding="utf-8") as f:
        md = f.read()
    return pred, paths, html, md


def test_report_is_self_contained(simulated_report):
    _, paths, html, _ = simulated_report
    assert paths["dir"].endswith(os.path.join("sweep", "report"))
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "<script" not in html and "<link" not in html
    imgs = re.findall(r"<img [^>]*src=\"([^\"]+)\"", html)
    assert len(imgs) == 4          # accuracy, leak effect, R vs gap, Grad-CAM (no run folders: no examples)
    assert all(s.startswith("data:image/png;base64,") for s in imgs)
    for key in SECTIONS:
        assert f'<h2 id="{key}">' in html


def test_markdown_twin_references_existing_files(simulated_report):
    _, paths, _, md = simulated_report
    refs = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert sorted(os.path.basename(r) for r in refs) == sorted(os.path.basename(p) for p in paths["figures"])
    for r in refs:
        with open(os.path.join(paths["dir"], r), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_report_readings_match_the_predictions(simulated_report):
    pred, _, html, _ = simulated_report
    c = pred[(pred["condition"] == "color") & (pred["intervention"] == "none")]
    acc = c.groupby("exposure")["correct"].mean()
    leak = acc["leak"] - acc["clean"]                       # every crop is scored by both models of its seed
    section = _section(html, "leak_effect")
    assert f"color, high diversity, a: the leak is {pp(leak)} (95% CI" in section
    # reinhard copies the clean answers onto the leak models: the whole leak is cut, in every
    # resample, so the share removed is 1 in every one: no interval, never "CI 100% to 100%" (issue 23)
    assert "Reinhard transfer to an unseen field removes 100% of it (no interval)" in section
    assert "<br>none, high diversity, a: the leak is" in section  # one line per condition
    # background removal: the predictions are the unaltered ones, so no accuracy changes
    assert "background removal changes no accuracy here (it leaves these crops as they were)" in section
    g = pred[(pred["condition"] == "color") & (pred["exposure"] == "clean")]
    cost = g[g["intervention"] == "none"]["correct"].mean() - g[g["intervention"] == "greyscale"]["correct"].mean()
    assert cost > leak
    assert f"greyscale is uninformative (it costs clean models {pp(cost, signed=False)}, more than the leak)" in section
    grad = _section(html, "gradcam")
    # per condition (color, then the none control): 0.4 + 0.01 seed, plus a leak offset that averages 0 over seeds
    assert ("Grad-CAM puts 42% (leak models) and 42% (clean models) of the attribution outside the cell under color, "
            "42% and 42% under none; against none: +0.0 pp and +0.0 pp under color") in grad
    assert "a randomised head gives 70%" in grad and "median rho 0.10 against 0.05" in grad
    # no run folders, no split tasks: the example crops and the audit card are left out, saying why
    assert "Left out because no leak model&#x27;s run folder is in the sweep folder" in _section(html, "examples")
    assert "Left out because no benchmark and split of the sweep are on disk" in _section(html, "audit")


def test_moves_verdict_needs_an_interval_off_zero_and_a_size():
    from shortcutlab.report.readings import moves_verdict
    assert moves_verdict(0.02, 0.05) == "moves"
    assert moves_verdict(-0.05, -0.005) == "moves"               # reaches 5 points
    assert moves_verdict(-0.000048, -0.000007) == "moves negligibly"  # the validity run's Grad-CAM row
    assert moves_verdict(-0.01, 0.02) == "does not move"
    assert moves_verdict(float("nan"), 0.1) == "n/a"


def test_validity_table_hand_set_results(simulated_report):
    pred, paths, html, _ = simulated_report
    v = pd.read_csv(paths["validity"], keep_default_na=False, na_values=[""])
    color = v[v["condition"] == "color"].set_index("kind")
    r = color.loc["R"]
    # leak - clean R per seed 0.20, 0.21, 0.22, 0.23: mean 0.215, a seed bootstrap within [0.20, 0.23]
    assert r["estimate"] == pytest.approx(0.215) and 0.2 - 1e-9 <= r["ci_low"] < 0.215 < r["ci_high"] <= 0.23 + 1e-9
    assert r["verdict"] == "moves"
    e = color.loc["erasure"]                                 # refitted heads: gap 0.215 before, 0 after
    assert e["estimate"] == pytest.approx(0.215) and e["share"] == pytest.approx(1.0) and e["verdict"] == "removed"
    g = color.loc["gradcam"]
    assert g["estimate"] == pytest.approx(0.0) and g["verdict"] == "does not move"
    inter = v[(v["condition"] == "color") & (v["kind"] == "intervention")].set_index("item")["verdict"].to_dict()
    assert inter == {"background_removal": "no change", "greyscale": "uninformative", "reinhard_unseen_field": "removed"}
    none = v[v["condition"] == "none"].set_index("kind")
    assert none.loc["R", "estimate"] == pytest.approx(0.0) and none.loc["R", "verdict"] == "does not move"
    assert "<td>uninformative</td>" in _section(html, "validity")


def test_dose_section_reads_r_and_erasure(simulated_report):
    _, _, html, _ = simulated_report
    sec = _section(html, "dose_response")
    # leak R = 0.3 + 0.01 seed + 0.2 + 0.01 seed (color) or + 0 (none), seeds 0..3: mean 0.4225 over 8
    # pairs; R_after 0.05; the refitted heads' gap 0.2 + 0.01 seed (color) or 0: 10.75 pp on average
    assert "Over 8 leak/clean pairs, the leak models&#x27; R averages 0.422 before and 0.050 after LEACE rank=16 erasure" in sec
    assert "the gap of refitted heads goes from +10.8 pp to +0.0 pp" in sec


def test_missing_inputs_are_left_out_with_reasons(tmp_path):
    pred = simulate_factorial(n_seeds=1, n_parents=20, crops_per_parent=3, condition="color", seed=3)
    d = _fake_sweep(tmp_path, pred)
    paths = build_report(d, n_boot=100)
    html = open(paths["html"], encoding="utf-8").read()
    assert "Left out because no leak estimate has an interval (1 seed(s)" in _section(html, "leak_effect")
    assert "the leak is" in _section(html, "leak_effect")          # the point estimate is still read
    for key in ("dose_response", "gradcam"):
        assert "Left out because the sweep folder holds no results table (no diagnostics were run)" in _section(html, key)
    assert [os.path.basename(p) for p in paths["figures"]] == ["accuracy.png"]
    assert "Warnings raised while estimating" in html and "1 seed(s)" in _section(html, "warnings")


def test_rebuild_replaces_the_report_and_refuses_foreign_folders(tmp_path):
    from shortcutlab.io import OutputError

    pred = simulate_factorial(n_seeds=2, n_parents=10, crops_per_parent=2, condition="c", seed=4)
    d = _fake_sweep(tmp_path, pred)
    first = build_report(d, n_boot=50, examples=False)
    again = build_report(d, n_boot=50, examples=False)  # a report replaces its own report
    assert again["dir"] == first["dir"] and os.path.isfile(again["html"])
    # a file the report did not write is never removed with it: the rebuild is refused
    with open(os.path.join(first["dir"], "stale.txt"), "w") as f:
        f.write("user notes")
    with pytest.raises(OutputError, match="holds 'stale.txt', which shortcutlab did not write"):
        build_report(d, n_boot=50, examples=False)
    with open(os.path.join(first["dir"], "stale.txt")) as f:
        assert f.read() == "user notes"
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("keep me")
    with pytest.raises(OutputError, match="notes' holds 'mine.txt', which shortcutlab did not write"):
        build_report(d, str(other), n_boot=50)
    assert (other / "mine.txt").read_text() == "keep me"


def test_cli_prints_the_html_path(tmp_path, capsys):
    from shortcutlab.cli import main

    pred = simulate_factorial(n_seeds=2, n_parents=10, crops_per_parent=2, condition="c", seed=5)
    d = _fake_sweep(tmp_path, pred)
    assert main(["report", d, "--n-boot", "50", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out.strip()
    assert out == str(tmp_path / "r" / "report.html") and os.path.isfile(out)


# --- a tiny real sweep ------------------------------------------------------------------------------

REAL_CONFIG = """
data:
  synthetic: {mechanisms: [color, none], fields_per_class: 12, crop_size: 32, field_size: 96, class_signal: 0.6}
split: {protocol: factorial, params: {test_parent_share: 0.3}}
seeds: [0, 1, 2]
models:
  - {arch: test_resnet, epochs: 1, lr: 0.001, batch_size: 64}
cells: [leak-high, clean-high]
interventions: {names: [greyscale, background_removal]}
diagnostics: {only: [parent_probe, gradcam], params: {parent_probe: {n_folds: 3}}}
device: cpu
"""


@pytest.mark.slow
def test_report_over_a_real_sweep(tmp_path):
    # 3 seeds: with 2 no leak estimate has an interval and the leak figure is left out (tested
    # with simulated predictions in test_missing_inputs_are_left_out_with_reasons)
    runner = pytest.importorskip("shortcutlab.sweep.runner", reason="the sweep runner (branch sweep) is not merged yet")
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(REAL_CONFIG)
    runner.run_sweep(str(cfg), str(tmp_path / "sweep"), progress=False)
    paths = build_report(str(tmp_path / "sweep"), n_boot=200)
    html = open(paths["html"], encoding="utf-8").read()
    names = sorted(os.path.basename(p) for p in paths["figures"])
    assert names == ["accuracy.png", "dose_response.png", "examples.png", "gradcam.png", "leak_effect.png"]
    audit = _section(html, "audit")
    assert "Left out" not in audit and "in leak cells 100% of test crops have a training sibling, in clean cells 0%" in audit
    # the two conditions share cells, layout and split, so their audits read the same: one sentence names both
    reading = audit.split('<p class="reading">', 1)[1].split("</p>", 1)[0]
    assert "color, none: " in reading and reading.count("crops from") == 1, reading
    examples = _section(html, "examples")
    assert "greyscale" in examples and "background removal" in examples and "Grad-CAM, clean model" in examples


def _chromium() -> str | None:
    import shutil

    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(_chromium() is None, reason="needs Debian's chromium (the README's test command installs it)")
def test_report_loads_in_headless_chromium(simulated_report, tmp_path):
    # the check: the report opens from disk in a real browser without console messages,
    # and what it shows is not blank (the figures render)
    import base64
    import io
    import subprocess

    from PIL import Image

    _, paths, html, _ = simulated_report
    for src in re.findall(r"<img [^>]*src=\"data:image/png;base64,([^\"]+)\"", html):
        Image.open(io.BytesIO(base64.b64decode(src))).verify()  # every embedded figure decodes
    shot = str(tmp_path / "shot.png")
    proc = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,3000",
         "--enable-logging=stderr", "--v=0", f"--screenshot={shot}", "file://" + os.path.abspath(paths["html"])],
        capture_output=True, text=True, timeout=120)
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    img = np.asarray(Image.open(shot).convert("RGB"), dtype=np.float64)
    assert img.shape[0] >= 2000 and img.shape[1] >= 1000
    ink = (img.min(axis=2) < 200).mean()            # share of pixels that are not near-white
    colour = (img.max(axis=2) - img.min(axis=2) > 60).mean()   # share of saturated (plotted) pixels
    assert ink > 0.02 and colour > 0.002, (ink, colour)


# --- user strings are escaped in both report files (issue 20) -------------------------------------

def test_labels_and_conditions_are_escaped_in_html_and_markdown(tmp_path):
    """Conditions, architectures, interventions and labels holding HTML, Markdown and TeX
    reach both files as typed text: no tag, no emphasis, no extra table cell, no mathtext."""
    from html.parser import HTMLParser

    evil, pipe, tex = "<script>alert(1)</script>", "*x*|y", r"*x*|y $\frac$"
    base = simulate_factorial(n_seeds=3, n_parents=10, crops_per_parent=2, effect=1.0, condition=evil, seed=4)
    pred = pd.concat([base, base.assign(intervention=pipe)], ignore_index=True)
    pred["arch"], pred["label"] = tex, evil
    paths = build_report(_fake_sweep(tmp_path, pred), n_boot=50, examples=False)
    html = open(paths["html"], encoding="utf-8").read()
    md = open(paths["markdown"], encoding="utf-8").read()
    assert "<script" not in html.lower() and "<script" not in md.lower()
    assert len(paths["figures"]) >= 2  # the accuracy and leak figures were drawn despite the '$'

    class Cells(HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.tags, self.rows, self.cell = [], [], None

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            if tag == "table":
                self.tables = getattr(self, "tables", 0) + 1
            if tag == "tr":
                self.rows.append([])
                self.table_of = getattr(self, "table_of", []) + [self.tables]
            if tag in ("td", "th"):
                self.cell = ""

        def handle_endtag(self, tag):
            if tag in ("td", "th"):
                self.rows[-1].append(self.cell)
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell += data

    parsed = Cells()
    parsed.feed(html)
    assert "script" not in parsed.tags
    for t in set(parsed.table_of):   # every row as wide as its table's header (the sensitivity section adds a table)
        widths = {len(r) for r, k in zip(parsed.rows, parsed.table_of) if k == t}
        assert len(widths) == 1, (t, widths)
    cells = {c for r in parsed.rows for c in r}
    assert evil in cells and tex in cells and pipe in cells  # shown as typed once the entities are read

    # Markdown: the validity table keeps its columns; the strings appear escaped by hand's rule
    rows = [line for line in md.splitlines() if line.startswith("|")]
    split = [re.split(r"(?<!\\)\|", line)[1:-1] for line in rows]
    assert rows
    blocks = "\n".join(line if line.startswith("|") else "" for line in md.splitlines()).split("\n\n")
    for block in filter(str.strip, blocks):    # each table keeps its columns (the sensitivity section adds one)
        assert len({len(re.split(r"(?<!\\)\|", line)) for line in block.strip().splitlines()}) == 1, block
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in md
    assert r"\*x\*\|y" in md and "*x*|y" not in md.replace(r"\*x\*\|y", "")
    assert any(c.strip() == r"\*x\*\|y $\\frac$" for s in split for c in s)


def test_md_escape_by_hand():
    from shortcutlab.markdown import md_escape

    assert md_escape("<script>alert(1)</script>") == "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert md_escape("*x*|y") == r"\*x\*\|y"
    assert md_escape("a_b [c](d) `e` #f !g ~h & i") == r"a\_b \[c\](d) \`e\` \#f \!g \~h &amp; i"
    # line starts that would open a list, a rule or a setext heading; plain dashes and numbers stay
    assert md_escape("- x\n3. y\n---\n===\n12) z") == "\\- x\n3\\. y\n--\\-\n==\\=\n12\\) z"
    assert md_escape("13.0 pp (95% CI -1.2 to +3.4); P1 - P2") == "13.0 pp (95% CI -1.2 to +3.4); P1 - P2"


# --- issue 21: the report names interventions by their class's label --------------------------
def test_readings_name_a_plug_in_by_its_label():
    from shortcutlab.report.readings import intervention_label
    from test_interventions_hooks import RowTag, registered

    est = _est([dict(estimand="leak", intervention="none", estimate=0.13, ci_low=0.091, ci_high=0.168),
                *_intervention("toy_row_tag:k=2", (0.091, 0.05, 0.13), (0.70, 0.45, 0.95), (0.01, -0.01, 0.03))])
    with registered("toy_row_tag", RowTag):
        assert intervention_label("toy_row_tag:k=2") == "row tags of the crop table (k=2)"
        assert leak_reading(est, "color", "high") == (
            "color, high diversity, r18: the leak is +13.0 pp (95% CI +9.1 to +16.8 pp); "
            "row tags of the crop table (k=2) removes 70% of it (CI 45% to 95%).")
    # once unregistered, the name itself is shown
    assert intervention_label("toy_row_tag:k=2") == "toy row tag (k=2)"
    assert intervention_label("none") == "the unaltered crops"


# --- issue 21: the report asks diagnostics and estimands for their labels and readings -------------

@pytest.fixture
def toy_plugins():
    """A toy diagnostic with a leak metric and a toy estimand no figure reads, registered for
    one test."""
    import probes
    from shortcutlab.stats import register_estimand, unregister_estimand

    @probes.register("toy_spread")
    class ToySpread(probes.Diagnostic):
        label = "toy saliency"
        metric_labels = {"cell_spread": "cell spread"}
        metric_units = {"cell_spread": "fraction"}
        leak_metrics = ("cell_spread",)

        def run(self, ctx):
            return []

    @register_estimand("leak_accuracy", unit="share", reading="leak models score {estimate} on their test crops")
    def leak_accuracy(ctx):
        leak = ctx.pred[(ctx.pred["exposure"] == "leak") & (ctx.pred["intervention"] == ctx.baseline)]
        acc = leak.groupby("condition")["correct"].mean()
        return pd.DataFrame({"condition": acc.index, "estimate": acc.to_numpy()})

    try:
        yield
    finally:
        probes.unregister("toy_spread")
        unregister_estimand("leak_accuracy")


def test_a_plugin_diagnostic_and_estimand_show_under_their_own_labels(toy_plugins, tmp_path):
    pred = simulate_factorial(n_seeds=3, n_parents=12, crops_per_parent=2, effect=1.5, condition="sim", seed=2)
    pred = pred.astype({c: str for c in ("model", "arch", "exposure", "id", "parent", "cell")})
    models = pred.drop_duplicates("model")[["model", "condition", "arch", "seed", "protocol", "cell", "exposure", "diversity"]]
    rows = []
    for m in models.to_dict("records"):
        # leak = clean + 4, 5, 6 points in seeds 0, 1, 2 (values equal in every seed would have no interval)
        value = 0.5 + 0.01 * m["seed"] + (0.05 + 0.01 * (m["seed"] - 1) if m["exposure"] == "leak" else 0.0)
        rows += [dict(m, diagnostic="toy_spread", setting="", metric="cell_spread", value=value),
                 dict(m, diagnostic="toy_spread", setting="class=0", metric="cell_spread", value=0.9)]
    results = pd.DataFrame(rows).assign(run_id=lambda r: r["model"], ci_low=np.nan, ci_high=np.nan, n=10)
    paths = build_report(_fake_sweep(tmp_path, pred, results), n_boot=50, examples=False)
    validity = pd.read_csv(paths["validity"], keep_default_na=False)
    toy = validity[validity["kind"] == "toy_spread"]
    assert toy["item"].tolist() == ["toy saliency cell spread"]
    assert float(toy["estimate"].iloc[0]) == pytest.approx(0.05) and toy["verdict"].tolist() == ["moves"]
    with open(paths["html"], encoding="utf-8") as f:
        html = f.read()
    section = _section(html, "validity")
    assert "<td>toy saliency cell spread</td>" in section
    assert "the toy saliency cell spread: sim (high) moves" in section
    # the estimand no figure reads: its own reading, its value counted by hand, its unit
    leak = pred[pred["exposure"] == "leak"]
    share = f"{100 * leak['correct'].sum() / len(leak):.0f}%"
    further = _section(html, "further_estimates")
    assert f"sim: leak models score {share} on their test crops" in further
    assert "<td>share</td>" in further and f"<td>{share}</td>" in further


def test_the_built_in_diagnostics_name_themselves_for_the_report():
    from shortcutlab.report.readings import diagnostic_label

    assert diagnostic_label("parent_probe", "R") == "parent probe R"
    assert diagnostic_label("gradcam", "outside_mass") == "Grad-CAM outside mass"
    assert diagnostic_label("leace") == "LEACE"
    assert diagnostic_label("not_registered", "some_metric") == "not registered some metric"


# --- issue 21: the report finds its rows by the quantity a diagnostic supplies, never by a name ---

@pytest.fixture
def toy_recoverability():
    """A toy diagnostic that supplies "recoverability" under its own name and metric, registered
    for one test."""
    import probes

    @probes.register("toy_recover")
    class ToyRecover(probes.Diagnostic):
        label = "toy recovery"
        metric_labels = {"recovered": "R*"}
        metric_units = {"recovered": "fraction"}
        supplies = {"recoverability": "recovered"}

        def run(self, ctx):
            return []

    try:
        yield ToyRecover
    finally:
        probes.unregister("toy_recover")


def _toy_pred_and_results(metric="recovered", diagnostic="toy_recover"):
    """A simulated factorial (3 seeds) and one result row per model: R = 0.30 + 0.01 * seed,
    plus 0.20 + 0.01 (seed - 1) for leak models (0.2 on average; the seeds' differences vary, so
    they have an interval); rows with a class or a longer setting are not the overall R."""
    pred = simulate_factorial(n_seeds=3, n_parents=12, crops_per_parent=2, effect=1.5, condition="sim", seed=2)
    pred = pred.astype({c: str for c in ("model", "arch", "exposure", "id", "parent", "cell")})
    models = pred.drop_duplicates("model")[["model", "condition", "arch", "seed", "protocol", "cell", "exposure", "diversity"]]
    rows = []
    for m in models.to_dict("records"):
        r = 0.3 + 0.01 * m["seed"] + (0.2 + 0.01 * (m["seed"] - 1) if m["exposure"] == "leak" else 0.0)
        rows += [dict(m, diagnostic=diagnostic, setting="fold=all", metric=metric, value=r),
                 dict(m, diagnostic=diagnostic, setting="fold=all,class=0", metric=metric, value=0.9),
                 dict(m, diagnostic=diagnostic, setting="fold=all,repeat=2", metric=metric, value=0.8)]
    results = pd.DataFrame(rows).assign(run_id=lambda r: r["model"], ci_low=np.nan, ci_high=np.nan, n=10)
    return pred, results


def test_a_plug_in_supplying_recoverability_is_the_reports_r(toy_recoverability, tmp_path):
    import probes
    from shortcutlab.report.tables import dose_pairs, r_source

    assert probes.suppliers("recoverability") == [("parent_probe", "R"), ("toy_recover", "recovered")]
    pred, results = _toy_pred_and_results()
    src = r_source(results)
    assert (src.quantity, src.diagnostic, src.metric, src.setting) == ("recoverability", "toy_recover", "recovered", "fold=all")
    pairs = dose_pairs(pred, results)
    # by hand: the leak model's R of each seed, and its accuracy minus its clean partner's
    acc = {(int(s), e): g["correct"].mean() for (s, e), g in pred.groupby(["seed", "exposure"])}
    assert pairs["seed"].tolist() == [0, 1, 2]
    assert pairs["R"].tolist() == pytest.approx([0.49, 0.51, 0.53])
    assert pairs["gap"].tolist() == pytest.approx([acc[s, "leak"] - acc[s, "clean"] for s in (0, 1, 2)])
    assert pairs[["R_after", "gap_before", "gap_after"]].isna().all().all()     # no erasure rows
    paths = build_report(_fake_sweep(tmp_path, pred, results), n_boot=50, examples=False)
    validity = pd.read_csv(paths["validity"], keep_default_na=False)
    r = validity[validity["kind"] == "R"]
    assert r["item"].tolist() == ["toy recovery R* (fold=all)"]
    assert float(r["estimate"].iloc[0]) == pytest.approx(0.2) and r["verdict"].tolist() == ["moves"]
    with open(paths["html"], encoding="utf-8") as f:
        html = f.read()
    assert "R*: sim (high) moves" in _section(html, "validity")
    assert "the leak models&#x27; R averages 0.510" in _section(html, "dose_response")    # (0.50 + 0.51 + 0.52) / 3


def test_without_a_supplier_the_r_sections_are_left_out(tmp_path):
    import probes
    from shortcutlab.report.tables import dose_pairs, r_source

    # the rows of a diagnostic no registered class supplies "recoverability" with are not R
    pred, results = _toy_pred_and_results()
    assert "toy_recover" not in probes.available()
    assert r_source(results) is None and dose_pairs(pred, results).empty
    paths = build_report(_fake_sweep(tmp_path, pred, results), n_boot=50, examples=False)
    validity = pd.read_csv(paths["validity"], keep_default_na=False)
    assert not validity["kind"].isin(["R", "erasure"]).any()
    with open(paths["html"], encoding="utf-8") as f:
        dose = _section(f.read(), "dose_response")
    assert "the results hold no parent-recoverability R (run the parent_probe or leace diagnostic)" in dose


def test_the_report_names_no_built_in_diagnostic():
    """No built-in diagnostic's name is a string literal in shortcutlab/report/*.py: the report
    asks for quantities (`probes.suppliers`). Two literals that are not diagnostics are named."""
    import ast
    import glob

    import probes

    not_diagnostics = {("figures.py", "gradcam"),        # the figure's file stem, figures/gradcam.png (a file name)
                       ("folder.py", "interventions")}   # the key of sweep.json's config that lists the interventions
    names = set(probes.available())
    here = os.path.join(os.path.dirname(__file__), "..", "shortcutlab", "report", "*.py")
    found = set()
    for path in sorted(glob.glob(here)):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        found |= {(os.path.basename(path), n.value) for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names}
    assert {"gradcam", "leace", "parent_probe", "interventions"} <= names
    assert found - not_diagnostics == set()


def test_the_report_tests_f8_from_the_results_as_results_does(simulated_report):
    """The report's estimates read the results too: the slope of the leak gap on R (F8) is in
    estimates.csv and in the registered tests, its estimate the least-squares slope (numpy's
    polyfit) of the leak models' gap on their R over the dose pairs of each condition."""
    from shortcutlab.report.tables import dose_pairs
    from shortcutlab.sweep.runner import read_predictions

    pred, paths, html, _ = simulated_report
    est = pd.read_csv(paths["estimates"], keep_default_na=False, na_values=[""])
    slope = est[est["estimand"] == "slope"].set_index("condition")
    assert set(slope["hypothesis"]) == {"F8"} and set(slope["family"]) == {"follow_up"}
    results = pd.read_parquet(os.path.join(os.path.dirname(paths["dir"]), "results.parquet"))
    pairs = dose_pairs(read_predictions(os.path.dirname(paths["dir"])), results)
    for condition, sub in pairs.groupby("condition"):
        assert slope.loc[condition, "estimate"] == pytest.approx(np.polyfit(sub["R"], sub["gap"], 1)[0], rel=1e-9)
    assert "F8 (color)" in _section(html, "registered_tests")
