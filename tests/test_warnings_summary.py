"""Repeated warnings collapse to one line with a count (`shortcutlab.warnings_summary`), in
every command (`cli.main` wraps them all). The expected lines are written out by hand."""

from __future__ import annotations

import warnings

import pytest

from shortcutlab.warnings_summary import collapse, collected, mask_values, summary_lines


class _Quiet(UserWarning):
    pass


def _warn_five() -> None:
    """3 identical warnings, 2 that differ from them in one number, then one of another kind."""
    for _ in range(3):
        warnings.warn("only 3 seeds: the interval of leak (color) is not shown", _Quiet)
    for n in (4, 5):
        warnings.warn(f"only {n} seeds: the interval of leak (color) is not shown", _Quiet)
    warnings.warn("51 of 80 maps are constant", UserWarning)


def test_three_identical_and_two_differing_in_a_number_are_one_line_of_five():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _warn_five()
    groups = collapse(caught)
    assert [(g.category, g.count, g.identical) for g in groups] == [(_Quiet, 5, False), (UserWarning, 1, True)]
    assert summary_lines(caught) == [
        "warning: _Quiet: only 3 seeds: the interval of leak (color) is not shown (and 4 similar)",
        "warning: UserWarning: 51 of 80 maps are constant",
    ]


def test_identical_warnings_print_a_count_and_categories_stay_apart():
    records = [(_Quiet, "bootstrap   with 2 clusters")] * 3 + [(UserWarning, "bootstrap with 2 clusters")]
    assert summary_lines(records, prefix="note", category=False) == [
        "note: bootstrap with 2 clusters (x 3)", "note: bootstrap with 2 clusters"]


@pytest.mark.parametrize("a, b, same", [
    ("p = 0.031 on 12 parents", "p = -1.5e-05 on 7 parents", True),
    ("task 3f2a9c01d4e5b6a7 failed", "task 00aa11bb22cc33dd failed", True),
    ("leak-high cell", "clean-high cell", False),          # words are not masked
    ("the deadbeef model", "the cafebabe model", False),   # hex-looking words without a digit are words
    ("leak condition=color, intervention=none: 1 seed(s)", "leak condition=none, intervention=low_pass:sigma=1.0: 2 seed(s)", True),
    ("leak condition=color: no interval", "leak_cut condition=color: no interval", False),   # the subject is a word
    ("column 'R' does not vary", "column 'floor' does not vary", True),
    ("column 'R' does not vary", "column R does not vary", False),
])
def test_masking_equates_numbers_and_ids_only(a, b, same):
    assert (mask_values(a) == mask_values(b)) is same


def test_the_demos_notes_collapse_to_one_line_per_estimand_and_reason():
    """The notes `results` printed for a one-seed demo, one per estimand, condition and
    intervention: 2 estimands x 2 conditions x 2 interventions give 2 lines of 4."""
    reason = "1 seed(s), fewer than 3: the seed-level variance cannot be estimated, no interval"
    records = [(UserWarning, f"{est} condition={cond}, arch=test_resnet, diversity=high, intervention={iv}: {reason}")
               for est in ("leak", "leak_cut") for cond in ("color", "none") for iv in ("none", "low_pass:sigma=1.0")]
    assert summary_lines(records, prefix="note", category=False) == [
        f"note: leak condition=color, arch=test_resnet, diversity=high, intervention=none: {reason} (and 3 similar)",
        f"note: leak_cut condition=color, arch=test_resnet, diversity=high, intervention=none: {reason} (and 3 similar)",
    ]


def test_collected_prints_each_group_once_at_the_end_also_for_a_warning_repeated_on_one_line(capsys):
    with collected():
        for _ in range(4):  # one source line: Python's default filter would show it once
            warnings.warn("constant map", _Quiet)
        print("the command's own output")
    out, err = capsys.readouterr()
    assert out == "the command's own output\n"
    assert err == "warning: _Quiet: constant map (x 4)\n"


def test_collected_still_prints_when_the_command_fails_and_keeps_ignore_filters(capsys):
    with pytest.raises(RuntimeError):
        with collected():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", _Quiet)   # a command that prints these itself
                warnings.warn("printed by the command", _Quiet)
            warnings.warn("before the failure")
            raise RuntimeError("boom")
    assert capsys.readouterr().err == "warning: UserWarning: before the failure\n"


def test_every_command_collapses_its_warnings(monkeypatch, capsys):
    """`main` wraps the command: a command raising 70 near-identical warnings prints one line."""
    from shortcutlab import cli

    def noisy(args):
        for k in range(70):
            warnings.warn(f"model {k}: 2 seeds, no interval", _Quiet)
        return 0

    monkeypatch.setattr(cli, "cmd_verify", noisy)  # build_parser binds it when main runs
    assert cli.main(["verify", "x.csv", "--hash", "0"]) == 0
    assert capsys.readouterr().err == "warning: _Quiet: model 0: 2 seeds, no interval (and 69 similar)\n"
