"""The sweep config: every key checked with a one-line error naming it, the grid it expands
to, and the task graph's sharing of common tasks."""

from __future__ import annotations

import copy
import os

import pytest

from shortcutlab.sweep.config import SweepConfigError, load_config, validate
from shortcutlab.sweep.plan import build_plan

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "sweep_minimal.yaml")

BASE = {
    "data": {"synthetic": {"mechanisms": ["color", "none"], "fields_per_class": 8, "crop_size": 16, "field_size": 64}},
    "split": {"protocol": "factorial", "params": {"test_parent_share": 0.3}},
    "seeds": [0, 1],
    "models": [{"arch": "test_resnet", "epochs": 1, "lr": 0.001}],
    "cells": ["leak-high", "clean-high"],
    "interventions": {"names": ["greyscale", "low_pass"], "params": {"low_pass": {"sigma": 2.0}}},
    "diagnostics": {"only": ["parent_probe"], "params": {"parent_probe": {"n_folds": 4}}},
    "device": "cpu",
}


def _with(path: str, value, base=None) -> dict:
    """BASE with the value at a dotted path replaced (a value of ... deletes the key)."""
    cfg = copy.deepcopy(base or BASE)
    *parents, last = path.split(".")
    d = cfg
    for p in parents:
        d = d[int(p)] if isinstance(d, list) else d[p]
    if value is ...:
        del d[last]
    elif isinstance(d, list):
        d[int(last)] = value
    else:
        d[last] = value
    return cfg


def test_the_example_config_loads_and_expands():
    cfg = load_config(EXAMPLE)
    plan = build_plan(cfg)
    # 2 conditions x 2 seeds: one benchmark and one split each; 2 cells -> 8 models
    assert plan.graph.counts() == {"synthesise": 4, "split": 4, "train": 8, "score": 8, "diagnose": 8}
    assert [c.name for c in cfg.conditions] == ["color", "none"]
    assert [s for s, _, _ in cfg.interventions] == ["greyscale", "low_pass:sigma=2.0"]


# (id, config, strings the one-line message must hold)
BAD = [
    ("top-level-unknown-key", _with("seed", [0]), ("seed", "did you mean 'seeds'")),
    ("missing-data", _with("data", ...), ("data", "missing required key")),
    ("missing-models", _with("models", ...), ("models", "missing required key")),
    ("missing-seeds", _with("seeds", ...), ("seeds", "missing required key")),
    ("missing-split", _with("split", ...), ("split", "missing required key")),
    ("both-data-kinds", _with("data.manifest", {"path": "x.csv"}), ("data", "exactly one", "synthetic, manifest")),
    ("no-data-kind", _with("data", {}), ("data", "exactly one", "neither")),
    ("data-unknown-kind", _with("data", {"synthetc": {}}), ("data.synthetc", "did you mean 'synthetic'")),
    ("data-not-a-mapping", _with("data", "synthetic"), ("data", "expected a mapping", "'synthetic'")),
    ("unknown-mechanism", _with("data.synthetic.mechanisms", ["colour", "none"]), ("data.synthetic.mechanisms[0]", "'colour'", "did you mean 'color'")),
    ("unknown-mechanism-in-a-set", _with("data.synthetic.mechanisms", [["color", "nosie"]]), ("mechanisms[0][1]", "'nosie'", "'noise'")),
    ("mechanism-wrong-type", _with("data.synthetic.mechanisms", [3]), ("data.synthetic.mechanisms[0]", "a mechanism name", "3")),
    ("synthetic-unknown-key", _with("data.synthetic.fields_per_clas", 5), ("data.synthetic.fields_per_clas", "'fields_per_class'")),
    ("synthetic-seed", _with("data.synthetic.seed", 1), ("data.synthetic.seed", "unknown key")),
    ("synthetic-bad-value", _with("data.synthetic.crop_size", 4), ("data.synthetic.crop_size", "crop_size", "4")),
    ("synthetic-wrong-type", _with("data.synthetic.strength", "strong"), ("data.synthetic.strength", "'strong'")),
    ("synthetic-empty-list", _with("data.synthetic.strength", []), ("data.synthetic.strength", "empty list")),
    ("unknown-protocol", _with("split.protocol", "factorail"), ("split.protocol", "'factorail'", "did you mean 'factorial'")),
    ("protocol-list-unknown", _with("split", {"protocol": ["crop", "parnet"]}), ("split.protocol[1]", "'parnet'", "did you mean 'parent'")),
    ("protocol-list-two-multi-cell", _with("split", {"protocol": ["factorial", "ladder"]}), ("split.protocol", "at most one multi-cell", "factorial, ladder")),
    ("protocol-list-param-of-none", _with("split", {"protocol": ["crop", "parent"], "params": {"test_parent_share": 0.3}}),
     ("split.params.test_parent_share", "unknown key", "test_fraction, val_fraction, unit")),
    ("protocol-wrong-type", _with("split.protocol", 3), ("split.protocol", "3")),
    ("split-unknown-param", _with("split.params.test_parent_shar", 0.2), ("split.params.test_parent_shar", "'test_parent_share'")),
    ("split-seed-param", _with("split.params.seed", 1), ("split.params.seed", "unknown key")),
    ("split-param-wrong-type", _with("split.params.test_parent_share", "a third"), ("split.params.test_parent_share", "a number", "'a third'")),
    ("split-param-wrong-choice", _with("split.params.allocation", "balance"), ("split.params.allocation", "'balance'", "'balanced'")),
    ("split-unknown-key", _with("split.protocl", "crop"), ("split.protocl", "'protocol'")),
    ("seeds-wrong-type", _with("seeds", ["zero"]), ("seeds[0]", "non-negative integer", "'zero'")),
    ("seeds-negative", _with("seeds", [0, -1]), ("seeds[1]", "-1")),
    ("seeds-twice", _with("seeds", [1, 1]), ("seeds", "seed 1 is listed twice")),
    ("seeds-empty", _with("seeds", []), ("seeds", "non-empty")),
    ("model-unknown-key", _with("models.0.epoch", 3), ("models[0].epoch", "did you mean 'epochs'")),
    ("model-wrong-type", _with("models.0.epochs", "ten"), ("models[0].epochs", "a positive integer", "'ten'")),
    ("model-wrong-type-in-list", _with("models.0.lr", [0.001, "fast"]), ("models[0].lr[1]", "a positive number", "'fast'")),
    ("model-bad-value", _with("models.0.epochs", 0), ("models[0].epochs", "epochs", "0")),
    ("model-unknown-arch", _with("models.0.arch", "resnet_18"), ("models[0].arch", "'resnet_18'", "resnet18")),
    ("model-seed", _with("models.0.seed", 3), ("models[0].seed", "seeds")),
    ("model-unknown-augment", _with("models.0.augment", "hed_jiter"), ("models[0].augment", "'hed_jiter'", "'hed_jitter'")),
    ("model-bad-augment-param", _with("models.0", {"arch": "test_resnet", "augment": "hed_jitter", "augment_params": {"sigma": 1}}),
     ("models[0].augment_params", "sigma")),
    ("model-rrc-scale", _with("models.0.rrc_scale", [0.5]), ("models[0].rrc_scale", "two numbers")),
    ("model-checkpoint-not-a-run", _with("models.0", {"checkpoint": "no_such_run"}), ("models[0].checkpoint", "run.json")),
    ("models-empty", _with("models", []), ("models", "non-empty")),
    ("unknown-cell", _with("cells", ["leak-hihg"]), ("cells[0]", "'leak-hihg'", "'leak-high'")),
    ("cells-wrong-type", _with("cells", [1]), ("cells[0]", "a cell name", "1")),
    ("unknown-intervention", _with("interventions.names", ["greyscal"]), ("interventions.names[0]", "'greyscal'", "'greyscale'")),
    ("intervention-bad-param", _with("interventions.params.low_pass", {"sigm": 2}), ("interventions.params.low_pass.sigm:", "sigma")),
    ("intervention-param-not-named", _with("interventions.params.greyscal", {}), ("interventions.params.greyscal", "'greyscale'")),
    ("interventions-unknown-key", _with("interventions.name", ["greyscale"]), ("interventions.name", "'names'")),
    ("interventions-wrong-type", _with("interventions.names", "greyscale"), ("interventions.names", "a list")),
    ("unknown-diagnostic", _with("diagnostics.only", ["parent_prob"]), ("diagnostics.only[0]", "'parent_prob'", "'parent_probe'")),
    ("diagnostic-bad-param", _with("diagnostics.params.parent_probe", {"folds": 3}), ("diagnostics.params.parent_probe.folds:", "no parameter 'folds'", "n_folds")),
    # every diagnostic is built with its parameters at load time: settings checked only when a
    # diagnostic ran (fit) are errors here, with the parameter in the key path
    ("diagnostic-parent-probe-folds", _with("diagnostics.params.parent_probe", {"n_folds": 2}),
     ("diagnostics.params.parent_probe.n_folds:", "integer >= 3", "Got 2")),
    ("diagnostic-parent-probe-folds-one-C", _with("diagnostics.params.parent_probe", {"n_folds": 1, "Cs": 1.0}),
     ("diagnostics.params.parent_probe.n_folds:", "integer >= 2", "Got 1")),
    ("diagnostic-parent-probe-side", _with("diagnostics.params.parent_probe", {"on": "tset"}),
     ("diagnostics.params.parent_probe.on:", "'tset'", "'test'")),
    ("diagnostic-parent-probe-Cs", _with("diagnostics.params.parent_probe", {"Cs": [0.1, -1]}),
     ("diagnostics.params.parent_probe.Cs:", "> 0", "-1")),
    ("diagnostic-leace-rank", _with("diagnostics", {"only": ["leace"], "params": {"leace": {"ranks": [8, 0]}}}),
     ("diagnostics.params.leace.ranks:", "integers >= 1", "[8, 0]")),
    ("diagnostic-leace-unknown-param", _with("diagnostics", {"only": ["leace"], "params": {"leace": {"rank": 8}}}),
     ("diagnostics.params.leace.rank:", "no parameter 'rank'", "ranks")),
    ("diagnostic-leace-check-on", _with("diagnostics", {"only": ["leace"], "params": {"leace": {"check_on": "p1"}}}),
     ("diagnostics.params.leace.check_on:", "'p1'", "'test'")),
    ("diagnostic-gradcam-target", _with("diagnostics", {"only": ["gradcam"], "params": {"gradcam": {"target": "truth"}}}),
     ("diagnostics.params.gradcam.target:", "'truth'", "'predicted' or 'label'")),
    ("diagnostic-adversary-steps", _with("diagnostics", {"only": ["linear_adversary"], "params": {"linear_adversary": {"steps": 0}}}),
     ("diagnostics.params.linear_adversary.steps:", "integer >= 1", "Got 0")),
    ("diagnostic-identifiability-fill", _with("diagnostics", {"only": ["group_identifiability"], "params": {"group_identifiability": {"fill": "zero"}}}),
     ("diagnostics.params.group_identifiability.fill:", "'zero'", "'mean'")),
    ("diagnostic-interventions-param", _with("diagnostics", {"only": ["interventions"], "params": {"interventions": {"names": ["low_pass"], "params": {"low_pass": {"sigma": -1}}}}}),
     ("diagnostics.params.interventions.params:", "low_pass", "sigma", "-1")),
    ("diagnostic-interventions-name", _with("diagnostics", {"only": ["interventions"], "params": {"interventions": {"names": ["greyscal"]}}}),
     ("diagnostics.params.interventions.names:", "'greyscal'", "'greyscale'")),
    ("intervention-param-value", _with("interventions.params.low_pass", {"sigma": -1}), ("interventions.params.low_pass.sigma:", "positive", "-1")),
    ("intervention-param-value-in-a-list", _with("interventions.params.low_pass", [{"sigma": 1.0}, {"sigma": 0}]),
     ("interventions.params.low_pass[1].sigma:", "positive", "0")),
    ("model-augment-param-value", _with("models.0", {"arch": "test_resnet", "augment": "low_pass", "augment_params": {"sigma": 0}}),
     ("models[0].augment_params.sigma:", "positive", "0")),
    ("diagnostics-unknown-key", _with("diagnostics.onli", ["leace"]), ("diagnostics.onli", "'only'")),
    ("diagnostic-param-not-run", _with("diagnostics.params.leace", {}), ("diagnostics.params.leace", "not among")),
    ("device-wrong-type", _with("device", 0), ("device", "a device name", "0")),
    ("device-missing", _with("device", "cuda:7"), ("device", "cuda:7")),
    ("threads-zero", _with("threads", 0), ("threads", "positive integer", "0")),
    ("empty-config", None, ("empty",)),
]


@pytest.mark.parametrize("cfg, names", [(c[1], c[2]) for c in BAD], ids=[c[0] for c in BAD])
def test_every_config_error_names_the_key_the_value_and_what_is_allowed(cfg, names):
    with pytest.raises(SweepConfigError) as info:
        validate(cfg, source="sweep.yaml")
    message = str(info.value)
    assert "\n" not in message and message.startswith("sweep.yaml: "), message
    for n in names:
        assert n.lower() in message.lower(), f"{message!r} does not name {n!r}"


def test_manifest_data_checks_the_file_and_its_columns(tmp_path):
    (tmp_path / "crops.csv").write_text("cell,label,parent,path\na,x,p,a.png\n")
    base = _with("data", {"manifest": {"path": "crops.csv", "id": "cell"}})
    cfg = validate(_with("interventions", {"names": ["greyscale"]}, base), source="s.yaml", base_dir=str(tmp_path))
    assert cfg.conditions[0].name == "crops" and cfg.conditions[0].params["path"] == str(tmp_path / "crops.csv")
    assert cfg.conditions[0].params["mask"] is None  # no mask column: none used
    with pytest.raises(SweepConfigError, match=r"data.manifest.id: column 'id' is not in"):
        validate(_with("data", {"manifest": {"path": "crops.csv"}}), base_dir=str(tmp_path))
    with pytest.raises(SweepConfigError, match=r"data.manifest.path: crop manifest 'nope.csv' does not exist"):
        validate(_with("data", {"manifest": {"path": "nope.csv"}}), base_dir=str(tmp_path))
    # an intervention that needs masks, named explicitly, on crops without masks
    with pytest.raises(SweepConfigError, match=r"interventions.names\[0\]: intervention 'background_removal' needs cell masks"):
        validate(_with("interventions", {"names": ["background_removal"]}, base), base_dir=str(tmp_path))


def test_yaml_errors_name_the_file_and_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("data:\n  synthetic: {mechanisms: [color\nseeds: [0]\n")
    with pytest.raises(SweepConfigError, match=r"bad.yaml: not valid YAML at line \d+ column \d+"):
        load_config(str(p))
    with pytest.raises(SweepConfigError, match="does not exist"):
        load_config(str(tmp_path / "none.yaml"))


def test_lists_expand_to_the_grid():
    cfg = _with("data.synthetic.mechanisms", ["color", ["noise", "color"], "none"])
    cfg = _with("data.synthetic.strength", [1.0, 2.0], cfg)
    cfg = _with("split.params.test_parent_share", [0.3, 0.4], cfg)
    cfg = _with("models", [{"arch": "test_resnet", "epochs": [1, 2], "lr": [0.001, 0.0001]}, {"arch": "test_vit", "epochs": 1}], cfg)
    cfg = _with("cells", ["leak-high", "clean-high", "leak-low"], cfg)
    c = validate(cfg)
    # mechanism sets in canonical order; a varying setting is named in the condition
    assert [x.name for x in c.conditions] == ["color,strength=1.0", "color,strength=2.0", "color+noise,strength=1.0",
                                             "color+noise,strength=2.0", "none,strength=1.0", "none,strength=2.0"]
    plan = build_plan(c)
    n_bench = 6 * 2  # conditions x seeds
    n_split = n_bench * 2
    n_models = n_split * (4 + 1) * 3  # splits x model specs x cells
    assert plan.graph.counts() == {"synthesise": n_bench, "split": n_split, "train": n_models, "score": n_models, "diagnose": n_models}
    assert len(plan.models) == n_models
    assert {m["recipe"] for m in plan.models} == {"arch=test_resnet,epochs=1,lr=0.001", "arch=test_resnet,epochs=1,lr=0.0001",
                                                  "arch=test_resnet,epochs=2,lr=0.001", "arch=test_resnet,epochs=2,lr=0.0001",
                                                  "arch=test_vit,epochs=1,lr=0.0001"}
    # a list-valued setting: a flat list is one value, a list of lists expands
    assert len(validate(_with("models.0.rrc_scale", [0.5, 1.0])).models) == 1
    assert len(validate(_with("models.0.rrc_scale", [[0.5, 1.0], [0.8, 1.0]])).models) == 2


def test_shared_tasks_are_planned_once_and_ids_follow_content():
    two_models = _with("models", [{"arch": "test_resnet", "epochs": 1}, {"arch": "test_resnet", "epochs": 2}])
    two_models = _with("data.synthetic.mechanisms", ["color"], two_models)
    two_models = _with("seeds", [0], two_models)
    plan = build_plan(validate(two_models))
    # two models x two cells share one benchmark and one split
    assert plan.graph.counts() == {"synthesise": 1, "split": 1, "train": 4, "score": 4, "diagnose": 4}
    split = [t for t in plan.graph.ordered() if t.kind == "split"][0]
    trains = [t for t in plan.graph.ordered() if t.kind == "train"]
    assert all(t.deps == (split.id,) for t in trains)
    # the same model listed twice is one task
    same = _with("models", [{"arch": "test_resnet", "epochs": 1}, {"epochs": 1, "arch": "test_resnet"}], two_models)
    assert build_plan(validate(same)).graph.counts()["train"] == 2
    # key order does not change ids; a parameter does, and only downstream of it
    reordered = {k: two_models[k] for k in reversed(list(two_models))}
    reordered["data"] = {"synthetic": dict(reversed(list(two_models["data"]["synthetic"].items())))}
    ids = [t.id for t in plan.graph.ordered()]
    assert [t.id for t in build_plan(validate(reordered)).graph.ordered()] == ids
    changed = build_plan(validate(_with("split.params.test_parent_share", 0.4, two_models))).graph.ordered()
    assert changed[0].id == ids[0] and changed[1].id != ids[1]
    assert not set(t.id for t in changed[1:]) & set(ids[1:])
    # a second sweep sharing the benchmark and split names the same tasks
    other = _with("models", [{"arch": "test_resnet", "epochs": 3}], two_models)
    other_ids = [t.id for t in build_plan(validate(other)).graph.ordered()]
    assert other_ids[:2] == ids[:2] and not set(other_ids[2:]) & set(ids)


def test_a_list_of_protocols_gives_each_its_own_parameters():
    cfg = _with("split", {"protocol": ["crop", "parent"], "params": {"test_fraction": [0.2, 0.3], "unit": "parent"}})
    cfg = _with("seeds", [0], _with("data.synthetic.mechanisms", ["color"], cfg))
    c = validate(cfg)
    # test_fraction is shared; unit is the parent protocol's only
    assert list(c.split_params) == [{"protocol": "crop", "test_fraction": 0.2}, {"protocol": "crop", "test_fraction": 0.3},
                                    {"protocol": "parent", "test_fraction": 0.2, "unit": "parent"},
                                    {"protocol": "parent", "test_fraction": 0.3, "unit": "parent"}]
    assert c.cells is None
    plan = build_plan(c)
    assert plan.graph.counts() == {"synthesise": 1, "split": 4, "train": 4, "score": 4, "diagnose": 4}
    assert sorted((m["protocol"], m["split_setting"]) for m in plan.models) == [
        ("crop", "test_fraction=0.2"), ("crop", "test_fraction=0.3"), ("parent", "test_fraction=0.2,unit=parent"),
        ("parent", "test_fraction=0.3,unit=parent")]


def test_one_strengths_mapping_gives_each_condition_its_own_mechanisms_strength():
    """`strengths` names mechanisms of several single-mechanism conditions; each benchmark
    plants its own at strength x multiplier (SynthConfig.effective_strengths), `none` none."""
    from shortcutlab.synth import SynthConfig

    cfg = validate(_with("data.synthetic", {"mechanisms": ["color", "illumination", "none"], "strength": 0.5,
                                             "strengths": {"color": 2.0, "illumination": 3.0}, "fields_per_class": 8}))
    got = {c.name: {k: v for k, v in SynthConfig.from_dict({**c.params, "seed": 0}).effective_strengths.items() if v}
           for c in cfg.conditions}
    assert got == {"color": {"color": 1.0}, "illumination": {"illumination": 1.5}, "none": {}}
    with pytest.raises(SweepConfigError, match=r"data\.synthetic\.strengths\.focus: 'focus' is planted in no condition"):
        validate(_with("data.synthetic", {"mechanisms": ["color", "none"], "strengths": {"focus": 2.0}}))


def test_the_validity_example_plants_one_mechanism_per_condition_and_reserves_fields():
    cfg = load_config(os.path.join(os.path.dirname(EXAMPLE), "validity.yaml"))
    assert [c.name for c in cfg.conditions] == ["color", "background", "illumination", "focus", "noise", "none"]
    assert all(p["reserve_parent_share"] > 0 for p in cfg.split_params)
    assert "reinhard_unseen_field" in [n for _, n, _ in cfg.interventions]


@pytest.mark.parametrize("changes", [
    {},                                                                                  # factorial, 2 cells, 2 conditions, 2 seeds
    {"cells": ...},                                                                      # all four cells
    {"models": [{"arch": "test_resnet", "epochs": [1, 2], "lr": [0.001, 0.01, 0.1]}]},     # six recipes
    {"split": {"protocol": ["crop", "parent"], "params": {"test_fraction": [0.2, 0.3], "unit": "parent"}}},
    {"split": {"protocol": "ladder", "params": {"levels": [[0.0, 1.0], [0.0, 0.5, 1.0]]}}, "cells": ...},
])
def test_the_task_cap_counts_exactly_the_tasks_the_plan_builds(changes):
    # the cap is checked arithmetically, before the grid is built: for configs without
    # duplicate grid points its count equals the built graph's (5 tasks x 2 conditions x 2
    # seeds, ... as the plan counts them)
    from shortcutlab.sweep.config import planned_tasks

    cfg = copy.deepcopy(BASE)
    for k, v in changes.items():
        cfg = _with(k, v, cfg)
    assert planned_tasks(cfg) == len(build_plan(validate(cfg)).graph)


def test_diagnostics_only_none_means_no_diagnostics_as_the_readme_says():
    cfg = validate(_with("diagnostics", {"only": "none"}))
    assert cfg.diagnostics == () and cfg.diagnostic_params == {}
    assert "diagnose" not in build_plan(cfg).graph.counts()
    assert cfg.diagnostics == validate(_with("diagnostics", "none")).diagnostics


# --- issue 21: the config asks each intervention class, never a name --------------------------
def test_the_config_asks_interventions_for_their_targets_and_split_needs():
    import interventions
    from interventions import Intervention, SplitRequirementError
    from test_interventions_hooks import RowTag, registered

    class NeedsBigTest(Intervention):
        """Toy: refuses splits whose test_fraction is below 0.5."""

        def apply(self, x, mask, params, **context):
            return x

        @classmethod
        def check_split(cls, protocol, params):
            if params.get("test_fraction", 0.2) < 0.5:
                raise SplitRequirementError(f"{cls.name!r} wants test_fraction >= 0.5; got {params.get('test_fraction', 0.2)!r}", param="test_fraction")

    class Blind(Intervention):
        """Toy: label-conditioned, but declares no targets."""

        label_conditioned = True

        def apply(self, x, mask, params, **context):
            return x

    parent = {"protocol": "parent", "params": {"test_fraction": [0.3, 0.6]}}
    with registered("toy_big_test", NeedsBigTest):
        with pytest.raises(SweepConfigError, match=r"^split\.params\.test_fraction: 'toy_big_test' wants test_fraction >= 0\.5; got 0\.3$"):
            validate(_with("cells", ..., _with("split", parent, _with("interventions", ["toy_big_test"]))))
        ok = {"protocol": "parent", "params": {"test_fraction": 0.6}}
        assert [n for _, n, _ in validate(_with("cells", ..., _with("split", ok, _with("interventions", ["toy_big_test"])))).interventions] == ["toy_big_test"]
    with registered("toy_blind", Blind):
        with pytest.raises(SweepConfigError, match=r"interventions\.names\[0\]: intervention 'toy_blind' is label-conditioned and the sweep cannot choose"):
            validate(_with("interventions", ["toy_blind"]))
    with registered("toy_row_tag", RowTag):  # label-conditioned, and declares its targets: accepted
        assert [n for _, n, _ in validate(_with("interventions", ["toy_row_tag"])).interventions] == ["toy_row_tag"]
        assert "toy_row_tag" not in [n for _, n, _ in validate(_with("interventions", "all")).interventions]  # as F2
    assert "toy_row_tag" not in interventions.available()
