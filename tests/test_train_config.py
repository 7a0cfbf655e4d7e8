"""Every TrainConfig field is reachable from `shortcutlab train`, from a sweep config and, where
declared, from `litmus` / `control`; a value given on the command line arrives in the config
that trains.

The flags and YAML values below are written by hand, not read from the fields' declarations,
so a declaration that names the wrong flag, type or key fails here."""

from __future__ import annotations

import dataclasses

import pytest

from shortcutlab import cli
from shortcutlab.models import recipe
from shortcutlab.models.train_config import TrainConfig, train_settings

# field -> (a value other than the default, the `shortcutlab train` flags that give it, the
# same value in a sweep config's YAML)
HAND = {
    "arch": ("resnet18", ["--arch", "resnet18"], "resnet18"),
    "epochs": (3, ["--epochs", "3"], 3),
    "batch_size": (7, ["--batch-size", "7"], 7),
    "lr": (0.003, ["--lr", "0.003"], 0.003),
    "weight_decay": (0.2, ["--weight-decay", "0.2"], 0.2),
    "seed": (5, ["--seed", "5"], None),  # a sweep's top-level seeds
    "weights": ("w.pt", ["--weights", "w.pt"], "w.pt"),
    "input_size": (48, ["--input-size", "48"], 48),
    "rrc_scale": ((0.25, 0.75), ["--rrc-scale", "0.25,0.75"], [0.25, 0.75]),
    "rrc_ratio": ((0.5, 2.0), ["--rrc-ratio", "0.5,2"], [0.5, 2.0]),
    "hflip": (False, ["--no-hflip"], False),
    "vflip": (False, ["--no-vflip"], False),
    "mask_background": (True, ["--mask-background"], True),
    "background_fill": (0.25, ["--background-fill", "0.25"], 0.25),
    "augment": ("hed_jitter", ["--augment", "hed_jitter"], "hed_jitter"),
    "augment_params": ({"sigma_alpha": 0.1, "sigma_beta": 0.02},
                       ["--augment-param", "sigma_alpha=0.1", "--augment-param", "sigma_beta=0.02"],
                       {"sigma_alpha": 0.1, "sigma_beta": 0.02}),
    "adversary_weight": (0.3, ["--adversary-weight", "0.3"], 0.3),
    "precise_bn": (True, ["--precise-bn"], True),
    "device": ("cpu:0", ["--device", "cpu:0"], None),  # a sweep's top-level device
}
# what `litmus` and `control` retrain with (docs/no-parent-labels.md: their training flags)
RETRAIN = {"arch", "epochs", "batch_size", "lr", "seed", "weights", "input_size", "precise_bn", "device"}
# settings a field needs beside it (augment_params are refused without augment)
NEEDS = {"augment_params": "augment"}


class _Stop(Exception):
    """Raised by the stand-ins once they have seen the config."""


def test_the_hand_table_covers_every_field_with_a_value_other_than_the_default():
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    assert sorted(HAND) == sorted(names)
    defaults = TrainConfig()
    for name in names:
        assert HAND[name][0] != getattr(defaults, name), name
    assert {s.name for s in train_settings() if s.retrain} == RETRAIN


def _expected(*names: str) -> TrainConfig:
    values = {n: HAND[n][0] for n in names}
    for n in names:
        if n in NEEDS:
            values[NEEDS[n]] = HAND[NEEDS[n]][0]
    return TrainConfig(**values)


def _flags(*names: str) -> list[str]:
    out = []
    for n in names:
        out += HAND[n][1] + (HAND[NEEDS[n]][1] if n in NEEDS else [])
    return out


@pytest.fixture
def trained_with(monkeypatch, tmp_path):
    """Run `shortcutlab train` with extra flags; return the TrainConfig `train` was called with."""
    seen = []

    def fake_train(table, split, out, config, **kw):
        seen.append(config)
        raise _Stop

    monkeypatch.setattr(recipe, "train", fake_train)
    # the table is read (no images are opened) before `train` is called
    manifest = tmp_path / "manifest.csv"
    manifest.write_text("id,path,label,parent\nc0,c0.png,a,p0\nc1,c1.png,b,p1\nc2,c2.png,a,p2\nc3,c3.png,b,p3\n")

    def run(flags: list[str]) -> TrainConfig:
        seen.clear()
        with pytest.raises(_Stop):
            cli.main(["train", "--manifest", str(manifest), "--split", "s.csv", "--out", str(tmp_path / "run"), *flags])
        return seen[0]

    return run


@pytest.mark.parametrize("name", sorted(HAND))
def test_every_field_is_reachable_from_shortcutlab_train(trained_with, name):
    # one field's flag changes that field (and what it needs) and nothing else
    assert trained_with(_flags(name)) == _expected(name)


def test_all_train_flags_together_arrive_in_the_config_that_trains(trained_with):
    config = trained_with(_flags(*HAND))
    assert config == TrainConfig(**{n: v for n, (v, _, _) in HAND.items()})
    assert config.rrc_scale == (0.25, 0.75) and config.augment_params == {"sigma_alpha": 0.1, "sigma_beta": 0.02}
    # and without flags, the recipe's defaults
    assert trained_with([]) == TrainConfig()


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    """A crop manifest of 16 crops (8 parents, 2 classes) and a parent split with a test side."""
    import numpy as np
    import pandas as pd
    from PIL import Image

    from shortcutlab import parent_split
    from shortcutlab.data.table import CropTable

    root = tmp_path_factory.mktemp("tiny")
    rng = np.random.default_rng(0)
    rows = []
    for i in range(16):
        Image.fromarray(rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)).save(root / f"c{i}.png")
        rows.append({"id": f"c{i}", "path": f"c{i}.png", "label": f"k{i % 2}", "parent": f"p{i // 2}"})
    pd.DataFrame(rows).to_csv(root / "manifest.csv", index=False)
    parent_split(CropTable.from_csv(str(root / "manifest.csv"), id="id", label="label", parent="parent"), 0.25, seed=0).to_csv(root / "split.csv")
    return str(root / "manifest.csv"), str(root / "split.csv")


def _retrained_with(monkeypatch, tmp_path, data, command: list[str], flags: list[str]) -> TrainConfig:
    """The TrainConfig that `litmus` / `control` hand to the study (stopped there: nothing trains)."""
    import shortcutlab.studies.control as control
    import shortcutlab.studies.litmus as litmus

    seen = []

    def study(*args, config, **kw):
        seen.append(config)
        raise _Stop

    monkeypatch.setattr(litmus, "litmus", study)
    monkeypatch.setattr(control, "deleted_signal_control", study)
    out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
    with pytest.raises(_Stop):
        cli.main([*command, *data, "--out", str(out), *flags])
    return seen[0]


@pytest.mark.parametrize("command", [["litmus"], ["control", "--delete", "labels"]], ids=["litmus", "control"])
def test_litmus_and_control_reach_the_fields_they_declare_and_refuse_the_others(monkeypatch, tmp_path, capsys, tiny_data, command):
    for name in sorted(RETRAIN):
        assert _retrained_with(monkeypatch, tmp_path, tiny_data, command, _flags(name)) == _expected(name), name
    together = _retrained_with(monkeypatch, tmp_path, tiny_data, command, _flags(*RETRAIN))
    assert together == TrainConfig(**{n: HAND[n][0] for n in RETRAIN})
    for name in sorted(set(HAND) - RETRAIN):
        with pytest.raises(SystemExit) as e:
            cli.main([*command, *tiny_data, "--out", str(tmp_path / "refused"), *HAND[name][1]])
        assert e.value.code == 2
        assert "unrecognized arguments" in capsys.readouterr().err


def test_every_field_is_reachable_from_a_sweep_config(tmp_path):
    from shortcutlab.sweep.config import validate
    from shortcutlab.sweep.plan import build_plan

    (tmp_path / "w.pt").write_bytes(b"")
    model = {n: y for n, (_, _, y) in HAND.items() if y is not None}
    model["weights"] = str(tmp_path / "w.pt")
    raw = {
        "data": {"synthetic": {"mechanisms": ["color"], "fields_per_class": 8, "crop_size": 16, "field_size": 64}},
        "split": {"protocol": "parent"},
        "seeds": [HAND["seed"][0]],
        "device": HAND["device"][0],
        "models": [model],
    }
    plan = build_plan(validate(raw, base_dir=str(tmp_path)))
    (task,) = [t for t in plan.graph.ordered() if t.kind == "train"]
    used = task.params["train"]
    assert sorted(used) == sorted(HAND)
    for name, (value, _, yaml_value) in HAND.items():
        want = str(tmp_path / "w.pt") if name == "weights" else yaml_value if yaml_value is not None else value
        assert used[name] == want, name


def test_the_json_form_has_pairs_as_lists_and_reads_back():
    import json

    config = TrainConfig(**{n: v for n, (v, _, _) in HAND.items()})
    as_json = json.loads(json.dumps(config.to_dict()))
    assert as_json["rrc_scale"] == [0.25, 0.75] and as_json["rrc_ratio"] == [0.5, 2.0]
    assert as_json["augment_params"] == {"sigma_alpha": 0.1, "sigma_beta": 0.02} and as_json["hflip"] is False
    back = TrainConfig.from_dict(as_json)
    assert back == config and back.rrc_scale == (0.25, 0.75)
    with pytest.raises(TypeError):
        TrainConfig.from_dict({"nope": 1})


def test_a_setting_added_later_leaves_the_task_ids_of_earlier_sweeps_alone(tmp_path):
    # A sweep written before `input_size` existed planned its train tasks from the other
    # settings; at its default the new setting must not enter the params (and so the content
    # hash), or resuming that sweep would retrain every model. Given, it does enter them.
    from shortcutlab.sweep.config import validate
    from shortcutlab.sweep.graph import task_id
    from shortcutlab.sweep.plan import build_plan

    def train_task(model):
        raw = {"data": {"synthetic": {"mechanisms": ["color"], "fields_per_class": 8, "crop_size": 16, "field_size": 64}},
               "split": {"protocol": "parent"}, "seeds": [0], "models": [model]}
        (task,) = [t for t in build_plan(validate(raw, base_dir=str(tmp_path))).graph.ordered() if t.kind == "train"]
        return task

    plain = train_task({"arch": "test_resnet", "epochs": 1})
    assert "input_size" not in plain.params["train"]
    assert plain.id == task_id("train", plain.params, list(plain.deps))  # the id is the hash of exactly these params
    sized = train_task({"arch": "test_resnet", "epochs": 1, "input_size": 32})
    assert sized.params["train"]["input_size"] == 32 and sized.id != plain.id
    assert TrainConfig.from_dict(plain.params["train"] | {"seed": 0}).input_size is None
